#!/usr/bin/env bash
# The two-level scan in IVF lists: `tq index eval --ivf NLIST` with --two-level on and off,
# alternating, on Fashion-MNIST (d = 784) and its projection to d = 384
# (bench/fashion_projections.py --cosine 128 192 256 384 512), at 3 and 4 bits, k = 10,
# --nprobe 1..64, 2 threads, ROUNDS rounds (default 2) of --reps 3 (median). One JSON line per
# run and nprobe.
# Usage (repository root): bash bench/results/two_level/ivf.sh TQ OUT.jsonl
# Env: METRIC (l2 | cosine: the cosine ground truth), NLIST (256), DIMS ("384 784"),
#      BITS ("3 4"), ROUNDS (2).
set -eu
TQ="$1"; out="$2"; ROUNDS="${ROUNDS:-2}"; DIMS="${DIMS:-384 784}"; BITS="${BITS:-3 4}"; NLIST="${NLIST:-256}"
METRIC="${METRIC:-l2}"; g=$([ "$METRIC" = cosine ] && echo cosgt1000 || echo gt1000)
: > "$out.tmp"
for round in $(seq 1 "$ROUNDS"); do
  for d in $DIMS; do
    if [ "$d" = 784 ]; then
      base=data/fashion-mnist/train.bvecs; q=data/bench/fashion_q1000.fvecs; gt=data/bench/fashion_$g.ivecs
    else
      base=data/bench/fashion_p${d}_base.fvecs; q=data/bench/fashion_p${d}_q1000.fvecs; gt=data/bench/fashion_p${d}_$g.ivecs
    fi
    for bits in $BITS; do
      for tl in off on; do
        "$TQ" index eval --base "$base" --queries "$q" --gt "$gt" --bits "$bits" --metric "$METRIC" --threads 2 \
            --ivf "$NLIST" --nprobe 1,2,4,8,16,32,64 --reps 3 --build-reps 1 --two-level $tl --json 2>/dev/null |
          python3 -c "
import json, sys
j = json.load(sys.stdin)
load = float(open('/proc/loadavg').read().split()[0])
for s in j['sweep']:
    print(json.dumps({'round': $round, 'metric': '$METRIC', 'd': $d, 'bits': $bits, 'nlist': $NLIST, 'two_level': '$tl', 'nprobe': s['nprobe'],
                      'search': s['search'], 'search_s': s['search_s'], 'qps': s['qps'],
                      'recall_10_at_10': s['recall_10_at_10'], 'recall_1_at_1': s['recall_1_at_k']['1'],
                      'memory_bytes_per_vector': j['memory_bytes_per_vector'], 'loadavg_1min': load}))" >> "$out.tmp"
      done
    done
  done
done
mv "$out.tmp" "$out"
