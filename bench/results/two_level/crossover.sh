#!/usr/bin/env bash
# Where the two-level scan pays: `tq index eval` with --two-level on and off, alternating, on
# Fashion-MNIST projected to lower d (bench/fashion_projections.py) and the original 784 (DIMS,
# default "128 192 256 384 512 784"),
# at 2, 3 and 4 bits, L2, k = 64 (eval's recall lists), 2 threads, ROUNDS rounds (default 2) of
# --reps 3 (median). One JSON line per run.
# TQ: a build with kTwoLevelMinDim and kTwoLevelMinBits set to 2 in src/search/index_internal.h
# (the default gate refuses --two-level on below d = 384 and at 2 bits; its searches are
# otherwise the same code).
# Usage (repository root): bash bench/results/two_level/crossover.sh TQ OUT.jsonl
set -eu
TQ="$1"; out="$2"; ROUNDS="${ROUNDS:-2}"; DIMS="${DIMS:-128 192 256 384 512 784}"
: > "$out.tmp"
for round in $(seq 1 "$ROUNDS"); do
  for d in $DIMS; do
    if [ $d = 784 ]; then
      base=data/fashion-mnist/train.bvecs; q=data/bench/fashion_q1000.fvecs; gt=data/bench/fashion_gt1000.ivecs
    else
      base=data/bench/fashion_p${d}_base.fvecs; q=data/bench/fashion_p${d}_q1000.fvecs; gt=data/bench/fashion_p${d}_gt1000.ivecs
    fi
    for bits in 2 3 4; do
      for tl in off on; do
        "$TQ" index eval --base "$base" --queries "$q" --gt "$gt" --bits $bits --metric l2 --threads 2 \
            --reps 3 --two-level $tl --json 2>/dev/null |
          python3 -c "import json, sys; j = json.load(sys.stdin); print(json.dumps({'round': $round, 'd': $d, 'bits': $bits, 'two_level': '$tl', 'index': j['index'], 'search_s': j['search_s'], 'qps': j['qps'], 'recall_1_at_1': j['recall_1_at_k']['1'], 'recall_10_at_10': j['recall_10_at_10'], 'loadavg_1min': float(open('/proc/loadavg').read().split()[0])}))" >> "$out.tmp"
      done
    done
  done
done
mv "$out.tmp" "$out"
