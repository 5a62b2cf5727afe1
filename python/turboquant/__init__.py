"""TurboQuant: random rotation + Lloyd-Max codebook vector quantization.

Python bindings of the turboquant C++ library (nanobind): the codec (``Codebook``,
``Rotation``, ``Quantizer``), a compressed flat vector-search ``Index`` with a FAISS-like
surface, a quantized ``KVCache`` with fused attention, and a GGUF ``Model`` runner for
scripted evaluations (perplexity on any cache, generation). ``ShardedIndex`` splits an Index
into shards held by Ray actors (``pip install ray``; imported only when one is made) and returns
exactly the single Index's results.

Arrays go in as C-contiguous NumPy arrays of the documented dtype (float32 vectors, uint8
codes, int64 ids) and are read in place; a wrong dtype raises ``TypeError``, a wrong shape,
non-contiguous layout, NaN/Inf or any error of the library raises ``turboquant.Error`` (a
``ValueError``) carrying the library's message. Results are new NumPy arrays. Long calls
release the GIL.

OpenBLAS, which runs the float GEMMs (k-means of IVF builds, coarse IVF search, prefill),
picks its kernels by CPU model when it loads; on a model it does not know it falls back to
SSE3 kernels several times slower. Importing the package therefore asks a subprocess which
kernels OpenBLAS picks and, on that fallback on a CPU with AVX2, sets ``OPENBLAS_CORETYPE``
(SkylakeX or Haswell) before the library loads, as ``tq`` does; a value already set, or
``TQ_NO_REEXEC=1``, is kept. ``blas_core()`` names the kernels in use.
"""

import os
import sys


def _choose_blas_kernels():
    """Sets OPENBLAS_CORETYPE where OpenBLAS would fall back to Prescott on an AVX2 CPU; the same
    rule as src/common/blas_core.h (the launcher and the test binary)."""
    if os.environ.get("OPENBLAS_CORETYPE") or os.environ.get("TQ_NO_REEXEC", "0") not in ("", "0"):
        return
    if not sys.platform.startswith("linux"):
        return
    try:
        with open("/proc/self/maps") as f:
            if "libopenblas.so" in f.read():  # already loaded: the variable would not be read
                return
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        return
    has = set(flags)
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= has:
        want = "SkylakeX"
    elif {"avx2", "fma"} <= has:
        want = "Haswell"
    else:
        return
    if not os.path.basename(sys.executable or "").startswith("python"):
        return  # an embedding program: nothing to run the probe with
    import subprocess

    probe = ("import ctypes; f = ctypes.CDLL('libopenblas.so.0').openblas_get_corename; "
             "f.restype = ctypes.c_char_p; print(f().decode())")
    try:
        got = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True,
                             timeout=60, env=dict(os.environ, OPENBLAS_NUM_THREADS="1")).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return
    if got.lower() == "prescott":
        os.environ["OPENBLAS_CORETYPE"] = want


_choose_blas_kernels()

from ._turboquant import (  # noqa: E402, F401
    Codebook,
    Error,
    Index,
    KVCache,
    Model,
    Quantizer,
    Rotation,
    __version__,
    blas_core,
    exact_search,
    kv_types,
    read_ivecs,
    read_vectors,
    simd_level,
)
from .sharded import ShardedIndex  # noqa: E402, F401  (imports Ray only when one is made)

__all__ = [
    "Codebook",
    "Error",
    "Index",
    "KVCache",
    "Model",
    "Quantizer",
    "Rotation",
    "ShardedIndex",
    "__version__",
    "blas_core",
    "exact_search",
    "kv_types",
    "read_ivecs",
    "read_vectors",
    "simd_level",
]
