#!/usr/bin/env bash
# Needle in a haystack on Gemma 3 270M at long context: f16 against the recommended caches, the
# same trials for every cache (the seed fixes each passphrase and haystack offset). One JSON per
# (context, cache, seed) under bench/results/gemma/niah/; finished files are skipped, so the
# script resumes where it stopped. Runs one job at a time.
# Usage: bash scripts/niah-gemma-long.sh [context ...]        (default: 4096 8192 16384 32768)
# Env:   TQ (binary, default build/tq), THREADS (default 2), SEED (default 42),
#        DEPTHS (default 0.1,0.3,0.5,0.7,0.9), TRIALS (per depth, default 2: 10 needles a run),
#        NICE (default 5), CACHES (';'-separated "tag|flags" entries; default below).
set -u
cd "$(dirname "$0")/.."
source scripts/niah-lib.sh
TQ="${TQ:-build/tq}"
THREADS="${THREADS:-2}"
SEED="${SEED:-42}"
DEPTHS="${DEPTHS:-0.1,0.3,0.5,0.7,0.9}"
TRIALS="${TRIALS:-2}"
NICE="${NICE:-5}"
CACHES="${CACHES:-f16|-ctk f16 -ctv f16;auto|-ctk auto;kv4.25|--kv-config configs/gemma3-270m-kv4.25.kv}"
OUT=bench/results/gemma/niah
MODEL=models/gemma-3-270m-q4_k_m.gguf
CORPUS=data/debian-reference.en.txt
mkdir -p "$OUT"
contexts=("$@")
[[ ${#contexts[@]} -eq 0 ]] && contexts=(4096 8192 16384 32768)
IFS=';' read -r -a entries <<< "$CACHES"
for ctx in "${contexts[@]}"; do
  for entry in "${entries[@]}"; do
    tag=${entry%%|*}
    flags=${entry#*|}
    # shellcheck disable=SC2086
    niah_one "$OUT/niah_c${ctx}_${tag}_s${SEED}.json" "$NICE" "$TQ" -m "$MODEL" -f "$CORPUS" --context "$ctx" \
      --depths "$DEPTHS" --trials "$TRIALS" --seed "$SEED" -t "$THREADS" $flags
  done
done
