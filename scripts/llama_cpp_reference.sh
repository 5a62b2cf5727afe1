#!/usr/bin/env bash
# Outside reference (NOT part of CI): installs llama-cpp-python from PyPI into a virtual
# environment (it compiles llama.cpp from source: slow on 2 cores) and compares it with `tq`
# on the same model and text: token ids, top-1 agreement of next-token predictions,
# perplexity with the f16 cache, llama.cpp's q8_0 / q4_0 KV perplexity and tok/s.
# Usage: bash scripts/llama_cpp_reference.sh [build/tq] [ctx] [chunks] [threads]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TQ="${1:-build/tq}"
CTX="${2:-512}"
CHUNKS="${3:-8}"
THREADS="${4:-2}"
VENV="${TQ_REF_VENV:-$ROOT/.venv-ref}"

bash scripts/fetch-model.sh
bash scripts/fetch-corpus.sh
if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import llama_cpp, numpy, tokenizers" 2>/dev/null; then
  echo "llama_cpp_reference.sh: installing llama-cpp-python (builds llama.cpp; this takes a while)" >&2
  CMAKE_BUILD_PARALLEL_LEVEL="$THREADS" "$VENV/bin/pip" install --quiet llama-cpp-python numpy tokenizers
fi
mkdir -p results
"$VENV/bin/python" bench/llama_cpp_reference.py --tq "$TQ" --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
  --corpus data/debian-reference.en.txt --ctx "$CTX" --chunks "$CHUNKS" --threads "$THREADS" \
  --out "results/llama_cpp_reference_c${CTX}.json"
