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

from . import _blas_env

_blas_env.choose()

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
