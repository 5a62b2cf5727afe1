"""Which OpenBLAS kernels to ask for, before an OpenBLAS library loads (pure Python, no import
of the extension): the rule of src/common/blas_core.h. OpenBLAS picks its kernels by CPU model
when it loads; on a model it does not know it falls back to its SSE3 "Prescott" kernels, several
times slower. ``choose`` asks a subprocess which kernels the library picks and, on that fallback
on a CPU with AVX-512 (F, BW, VL, DQ) or AVX2 with FMA, sets ``OPENBLAS_CORETYPE`` to SkylakeX or
Haswell. A value already set, or ``TQ_NO_REEXEC`` other than 0, is kept.

Used by the package (``import turboquant``, Debian's libopenblas) and by the benchmark scripts
(bench/blas_env.py: the OpenBLAS that FAISS's wheel bundles), which load this file by path.
"""

import os
import sys


def corename(lib):
    """The kernel set the OpenBLAS library `lib` (a name or path dlopen finds) runs, loading it
    into this process."""
    import ctypes

    f = ctypes.CDLL(lib).openblas_get_corename
    f.restype = ctypes.c_char_p
    return f().decode()


def choose(lib="libopenblas.so.0", probe_import=None):
    """Sets OPENBLAS_CORETYPE for `lib` (a name or path dlopen finds) where the rule says so and
    returns the value set, else None (nothing to do, or the library is loaded already).
    probe_import: a module the probe imports first, for a library that only loads with the
    dependencies that module brings (FAISS's bundled OpenBLAS needs its libgfortran)."""
    if os.environ.get("OPENBLAS_CORETYPE") or os.environ.get("TQ_NO_REEXEC", "0") not in ("", "0"):
        return None
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/maps") as f:
            if os.path.basename(lib).split(".so")[0] + ".so" in f.read():
                return None  # already loaded: the variable would not be read
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        return None
    has = set(flags)
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= has:
        want = "SkylakeX"
    elif {"avx2", "fma"} <= has:
        want = "Haswell"
    else:
        return None
    if not os.path.basename(sys.executable or "").startswith("python"):
        return None  # an embedding program: nothing to run the probe with
    import subprocess

    # corename(lib) in a fresh interpreter, where nothing has loaded an OpenBLAS yet.
    probe = f"import runpy; print(runpy.run_path({os.path.abspath(__file__)!r})['corename']({lib!r}))"
    if probe_import:
        probe = f"import {probe_import}; " + probe
    try:
        got = subprocess.run([sys.executable, "-I"] + ([] if probe_import else ["-S"]) + ["-c", probe],
                             capture_output=True, text=True,
                             timeout=60, env=dict(os.environ, OPENBLAS_NUM_THREADS="1")).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if got.lower() != "prescott":
        return None
    os.environ["OPENBLAS_CORETYPE"] = want
    return want
