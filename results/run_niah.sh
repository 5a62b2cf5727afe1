#!/usr/bin/env bash
# Needle runs for BENCHMARKS.md: f16 vs tq4 at 2K/4K/8K, depth 0.5, 1 trial each.
set -u
cd "$(dirname "$0")"
for ctx in 2048 4096 8192; do
  for c in f16 tq4; do
    ./bin/tq-niah niah -m ../models/SmolLM2-135M-Instruct.Q4_1.gguf -f ../data/debian-reference.en.txt \
      --context $ctx --depths 0.5 --trials 1 -t 1 -ctk $c -ctv $c --json > niah_c${ctx}_${c}.json 2> niah_c${ctx}_${c}.err
  done
done
