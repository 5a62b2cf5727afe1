#!/usr/bin/env bash
# Outside reference for the tokenizers (NOT part of CI): llama.cpp's token ids for fixed strings
# and a digest of the whole corpus, for SmolLM2 (BPE), Gemma 3 (SentencePiece) and the Qwen 2 /
# Llama 3 pre-tokenizers (test vocabularies from bench/make_tokenizer_vocabs.py), saved in
# bench/results/tokenizer_reference.json, which tests/test_tokenizer.cpp reads (make test never
# needs llama.cpp). With a tq binary, also compares tq's corpus ids and times both (1 thread).
#
# Usage: bash scripts/llama_cpp_tokenizer_reference.sh [build/tq] [extra args for the .py]
# Uses the llama.cpp venv of scripts/llama_cpp_reference.sh (TQ_REF_VENV, default .venv-ref);
# says so and stops when it is missing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TQ="${1:-build/tq}"
shift $(($# < 1 ? $# : 1))
VENV="${TQ_REF_VENV:-$ROOT/.venv-ref}"
bash scripts/fetch-model.sh
bash scripts/fetch-corpus.sh
[[ -f models/gemma-3-270m-q4_k_m.gguf ]] || bash scripts/fetch-model.sh gemma3-270m
if ! "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
  echo "llama_cpp_tokenizer_reference.sh: no llama-cpp-python in $VENV: run scripts/llama_cpp_reference.sh once" \
       "(it makes that venv, compiling llama.cpp: 20-40 minutes), or set TQ_REF_VENV" >&2
  exit 1
fi
# The test vocabularies, with the test venv's gguf (the llama.cpp venv may not have it).
[[ -x .venv/bin/python ]] || bash scripts/setup-venv.sh
.venv/bin/python bench/make_tokenizer_vocabs.py --out build/tokenizer-vocabs
ARGS=(--vocab-dir build/tokenizer-vocabs)
[[ -n "$TQ" && -x "$TQ" ]] && ARGS+=(--tq "$TQ")
"$VENV/bin/python" bench/llama_cpp_tokenizer_reference.py "${ARGS[@]}" \
  --out "${TQ_REF_OUT:-bench/results/tokenizer_reference.json}" "$@"
