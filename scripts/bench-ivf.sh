#!/usr/bin/env bash
# IVF comparison (not in CI): tq IVF vs FAISS IVF-RaBitQ, IVF-PQ fast scan and HNSW, same run,
# same threads. Needs the bench venv (scripts/bench-search-setup.sh) and a Release build/tq.
# Usage: bash scripts/bench-ivf.sh [glove|glove1m|fashion|fashion1m] [out-dir] [extra args for bench/ivf_vs_faiss.py]
set -euo pipefail
cd "$(dirname "$0")/.."
DS=${1:-glove}
OUT=${2:-bench/results/ivf/$DS}
shift $(( $# > 2 ? 2 : $# ))
VENV=${TQ_BENCH_VENV:-.venv}
GLOVE=${TQ_GLOVE_DIR:-$(cd .. && pwd)/shared/data/glove100}
[ -d "$GLOVE" ] || GLOVE=/work/shared/data/glove100
exec nice "$VENV/bin/python" bench/ivf_vs_faiss.py --dataset "$DS" --glove-dir "$GLOVE" --threads "${TQ_THREADS:-2}" \
  --tq build/tq --out "$OUT" "$@"
