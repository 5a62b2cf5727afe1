#!/usr/bin/env bash
# One layer's prefill attention call (a micro-batch of queries at the last positions of a 4K
# context, synthetic vectors, 1 thread) at the default model's shape (SmolLM2: head_dim 64, 9 query
# / 3 KV heads, 64 queries) and at Gemma 3's (head_dim 256, 4 query / 1 KV head, 128 queries):
# f16, tq3 / tq4 on the float kernel and on lut8, side by side in one process; two builds of tq
# alternating, ROUNDS rounds -> OUT/{smollm2,gemma}_{a,b}_rN.json.
# Usage: bash bench/results/gemma/f16_multiquery/run.sh TQ_A TQ_B [OUT]   (from the repository root)
set -eu
A="$1"; B="$2"
OUT="${3:-bench/results/gemma/f16_multiquery}"
ROUNDS="${ROUNDS:-3}"
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  for side in a b; do
    tq=$([ $side = a ] && echo "$A" || echo "$B")
    "$tq" bench attention --head-dim 64 --n-heads 9 --n-kv-heads 3 --context 4096 --queries 64 \
      --kv f16,tq3,tq3@lut8 --steps 9 --json > "$OUT/smollm2_${side}_r$r.json"
    "$tq" bench attention --head-dim 256 --n-heads 4 --n-kv-heads 1 --context 4096 --queries 128 \
      --kv f16,tq4,tq4@lut8 --steps 7 --json > "$OUT/gemma_${side}_r$r.json"
  done
done
