#!/usr/bin/env bash
# Needle runs for BENCHMARKS.md: f16 vs the recommended cache tq5/tq3 (K tq5, V tq3) at
# 2K / 4K / 8K context, depths 0.1, 0.5, 0.9, exact (float) attention, 1 thread.
# Both caches get the same trials: the seed fixes every passphrase and haystack offset, and
# each (context, seed) runs f16 then tq5/tq3 back to back, so a stop leaves complete pairs.
#   2K, 4K: runs of 3 trials per depth (seeds 42, 43, ... N2 of them): 9 needles per run.
#   8K:     one trial per depth per run (seeds 42, 43, ... N8 of them): 3 needles per run.
# Finished files are skipped, so the script can be re-run to resume.
# Usage: bash bench/results/run_niah.sh [context ...]    (default: 2048 4096 8192)
# Env:   TQ (binary, default ../../build/tq), N8 (number of 8K seeds, default 3), S8 (first 8K seed,
#        default 42), N2 / S2 (the same for 2K and 4K, defaults 1 / 42), DEPTHS (default 0.1,0.5,0.9; other values add _d<DEPTHS> to the file name),
#        NICE (default 10), CACHES (';'-separated "tag|flags" entries, default
#        "f16|-ctk f16 -ctv f16;tq5tq3|-ctk tq5 -ctv tq3 --kv-plain", the bare tq5/tq3 these runs
#        measured before tq K types were protected by default; the tag names the output files).
# The runs in BENCHMARKS.md: `bash bench/results/run_niah.sh 2048 4096`, `N8=1 bash bench/results/run_niah.sh 8192`,
# `DEPTHS=0.5 S8=43 N8=5 bash bench/results/run_niah.sh 8192`, and (2026-11-30)
# `DEPTHS=0.25,0.5,0.75 S8=48 N8=5 bash bench/results/run_niah.sh 8192`, `... S8=53 N8=6 ...`, and the
# tq4/tq4 and tq4/tq4n8 (sink 1, K centring) runs over the same trials with CACHES set
# (BENCHMARKS.md, "41 trials at 8K").
set -u
cd "$(dirname "$0")"
source ../../scripts/niah-lib.sh
TQ="${TQ:-../../build/tq}"
N8="${N8:-3}"
NICE="${NICE:-10}"
S8="${S8:-42}"
N2="${N2:-1}"
S2="${S2:-42}"
DEPTHS="${DEPTHS:-0.1,0.5,0.9}"
CACHES="${CACHES:-f16|-ctk f16 -ctv f16;tq5tq3|-ctk tq5 -ctv tq3 --kv-plain}"
DTAG=""
[[ $DEPTHS != 0.1,0.5,0.9 ]] && DTAG="_d${DEPTHS//,/-}"
MODEL=../../models/SmolLM2-135M-Instruct.Q4_1.gguf
CORPUS=../../data/debian-reference.en.txt

run() {  # context trials seed
  local ctx=$1 trials=$2 seed=$3 entry tag flags
  local -a entries
  IFS=';' read -r -a entries <<< "$CACHES"
  for entry in "${entries[@]}"; do
    tag=${entry%%|*}
    flags=${entry#*|}
    # shellcheck disable=SC2086
    niah_one "niah_c${ctx}_${tag}_s${seed}${DTAG}.json" "$NICE" "$TQ" -m "$MODEL" -f "$CORPUS" --context "$ctx" \
      --depths "$DEPTHS" --trials "$trials" --seed "$seed" -t 1 --exact-attention $flags
  done
}

contexts=("$@")
[[ ${#contexts[@]} -eq 0 ]] && contexts=(2048 4096 8192)
for ctx in "${contexts[@]}"; do
  if [[ $ctx -ge 8192 ]]; then
    for ((s = S8; s < S8 + N8; s++)); do run "$ctx" 1 "$s"; done
  else
    for ((s = S2; s < S2 + N2; s++)); do run "$ctx" 3 "$s"; done
  fi
done
