"""OpenBLAS kernels for the benchmark scripts' own process, so FAISS builds as fast as it can here.

FAISS's wheel bundles its own OpenBLAS (0.3.15 in faiss-cpu 1.15.1), which falls back to its
SSE3 "Prescott" kernels on CPU models it does not know, as Debian's does: on the Emerald Rapids
VM FAISS's k-means of Fashion-MNIST (256 lists) took 5.6 s on them and 1.4 s on its SkylakeX
kernels (medians of 3, bench/results/blas_core/faiss_kmeans.py). tq replaces that fallback (src/common/blas_core.h); the comparison scripts apply the
same rule (python/turboquant/_blas_env.py, loaded by path: no build needed) to FAISS's library
before anything loads an OpenBLAS, running the script again when they set the variable.
Call rerun_with_blas_kernels() before importing numpy or faiss. TQ_NO_REEXEC=1 keeps the
environment as given.
"""
import importlib.util
import glob
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rule():
    spec = importlib.util.spec_from_file_location("tq_blas_env", os.path.join(REPO, "python", "turboquant", "_blas_env.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def faiss_openblas():
    """The OpenBLAS library FAISS's wheel bundles (a path), or None."""
    spec = importlib.util.find_spec("faiss")
    if spec is None or not spec.origin:
        return None
    libs = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(spec.origin)), "faiss_cpu.libs", "libopenblas*.so*")))
    return libs[0] if libs else None


def rerun_with_blas_kernels():
    lib = faiss_openblas()
    if lib and _rule().choose(lib, probe_import="faiss"):
        print(f"{os.path.basename(sys.argv[0])}: FAISS's OpenBLAS falls back to Prescott here; running again with "
              f"OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']}", file=sys.stderr, flush=True)
        os.execv(sys.executable, [sys.executable] + sys.argv)


def faiss_blas_core():
    """The kernels FAISS's OpenBLAS runs (once faiss is imported), or None."""
    lib = faiss_openblas()
    if not lib:
        return None
    try:
        return _rule().corename(lib)
    except (OSError, AttributeError):
        return None
