#!/usr/bin/env bash
# SmolLM2-135M: prefill and decode tok/s of the recommended caches beside f16 (2 threads, ctx 512 /
# 4096 / 8192: a prefill of that many corpus tokens, then 32 greedy decode steps). Each round is
# two processes: f16, the 4.25-bit file and `auto` on the lookup-table kernel (--attn-lut8, what
# `make demo` runs), then f16 and `auto` on the default float kernel. ROUNDS rounds -> OUT/lut8_rN.json,
# OUT/float_rN.json; summarize.py takes the per-round ratios' medians -> table.md.
# Usage: bash bench/results/speed_recommended/run.sh [TQ] [OUT]   (from the repository root)
set -eu
TQ="${1:-build/tq}"
OUT="${2:-bench/results/speed_recommended}"
ROUNDS="${ROUNDS:-3}"
M="-m models/SmolLM2-135M-Instruct.Q4_1.gguf -f data/debian-reference.en.txt -t 2 --contexts 512,4096,8192 --decode 32 --reps 1 --json"
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  "$TQ" bench model $M --caches "f16;@configs/smollm2-135m-kv4.25.kv;auto" --attn-lut8 > "$OUT/lut8_r$r.json"
  "$TQ" bench model $M --caches "f16;auto" > "$OUT/float_r$r.json"
done
