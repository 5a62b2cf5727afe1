#!/usr/bin/env bash
# Build times of two tq builds, alternating, 5 rounds: `tq index build ... -t 2 --json` (build_s)
# on GloVe 100k (4 and 2 bits), Fashion-MNIST (4 bits, l2) and the 1M glove1m base, or the SETS
# given (one "name|input|build flags" per line).
# Usage (from the repository root): bash bench/results/flat_encode_ab/run.sh BEFORE/tq AFTER/tq OUT.jsonl
# (each tq with its libtq_cli.so and libturboquant.so beside it; data: ../shared/data/glove100,
# scripts/fetch-fashion-mnist.sh, data/bench/glove1m_base.fvecs from bench/search_vs_faiss.py).
set -eu
BEFORE="$1"; AFTER="$2"; out="$3"
G=../shared/data/glove100/glove100_base.fvecs; F=data/fashion-mnist/train.bvecs; M=data/bench/glove1m_base.fvecs
SETS="${SETS:-glove100k 4b|$G|--bits 4
glove100k 2b|$G|--bits 2
fashion 4b l2|$F|--bits 4 --metric l2
glove1m 4b|$M|--bits 4}"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
: > "$out"
for round in 1 2 3 4 5; do
  # SETS: one "name|input|build flags" per line (default: the four above).
  while IFS= read -r spec; do
    [ -n "$spec" ] || continue
    name=${spec%%|*}; rest=${spec#*|}; f=${rest%%|*}; a=${rest#*|}
    for side in before after; do
      b="$BEFORE"; [ $side = after ] && b="$AFTER"
      # shellcheck disable=SC2086
      s=$("$b" index build -i "$f" -o "$tmp/$side.tqi" $a -t 2 --json 2>/dev/null </dev/null |
          python3 -c "import json,sys; print(json.load(sys.stdin)['build_s'])")
      echo "{\"round\": $round, \"set\": \"$name\", \"build\": \"$side\", \"args\": \"$a\", \"threads\": 2, \"loadavg_1min\": $(cut -d' ' -f1 /proc/loadavg), \"build_s\": $s}" >> "$out"
    done
  done <<< "$SETS"
done
