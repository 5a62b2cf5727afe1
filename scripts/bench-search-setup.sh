#!/usr/bin/env bash
# Creates the Python venv for bench/search_vs_faiss.py (NOT a build dependency, not in CI):
#   .venv/ in the repository root (git-ignored), with pinned faiss-cpu, rabitqlib, numpy,
#   matplotlib from PyPI. Idempotent: re-running only installs what is missing.
# Usage: bash scripts/bench-search-setup.sh   then   .venv/bin/python bench/search_vs_faiss.py --help
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TQ_BENCH_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# Pinned versions (the ones the figures in BENCHMARKS.md were measured with).
"$VENV/bin/python" -m pip install --quiet \
  "faiss-cpu==${FAISS_VERSION:-1.15.1}" \
  "numpy==${NUMPY_VERSION:-2.3.5}" \
  "matplotlib==${MPL_VERSION:-3.10.7}"
# rabitqlib is optional: if pip cannot install it, the benchmark falls back to FAISS IndexRaBitQ.
if ! "$VENV/bin/python" -m pip install --quiet "rabitqlib==${RABITQLIB_VERSION:-0.7.1}"; then
  echo "bench-search-setup: rabitqlib not installable here; FAISS IndexRaBitQ will be used" >&2
fi
"$VENV/bin/python" - <<'PY'
import importlib
for m in ("faiss", "numpy", "matplotlib"):
    mod = importlib.import_module(m)
    print(m, getattr(mod, "__version__", "?"))
try:
    import rabitqlib
    print("rabitqlib", getattr(rabitqlib, "__version__", "installed"))
except Exception as e:
    print("rabitqlib unavailable:", e)
PY
