#!/usr/bin/env bash
# The l2 IVF fast scan with one set of tables per query (Pi q plus each slot's list term) against
# the build before (a set of tables per probed list): `tq index eval --ivf 256 --bits 4 --metric
# l2 --two-level off` on Fashion-MNIST projected to d = 128 and 256 (bench/fashion_projections.py)
# and the original d = 784, nprobe 1, 4, 16, 64, the default re-rank (-1) and none (0), 1,000
# queries, 2 threads, --reps 3; both builds alternating, ROUNDS rounds (default 3). One JSON line
# per run and nprobe.
# Usage (repository root): bash bench/results/ivf_l2_tables/run.sh BEFORE/tq AFTER/tq OUT.jsonl
set -eu
BEFORE="$1"; AFTER="$2"; out="$3"; ROUNDS="${ROUNDS:-3}"
: > "$out.tmp"
for round in $(seq 1 "$ROUNDS"); do
  for d in 128 256 784; do
    if [ "$d" = 784 ]; then
      base=data/fashion-mnist/train.bvecs; q=data/bench/fashion_q1000.fvecs; gt=data/bench/fashion_gt1000.ivecs
    else
      base=data/bench/fashion_p${d}_base.fvecs; q=data/bench/fashion_p${d}_q1000.fvecs; gt=data/bench/fashion_p${d}_gt1000.ivecs
    fi
    for rerank in -1 0; do
      for side in before after; do
        b="$BEFORE"; [ $side = after ] && b="$AFTER"
        "$b" index eval --base "$base" --queries "$q" --gt "$gt" --bits 4 --metric l2 --threads 2 --ivf 256 \
            --nprobe 1,4,16,64 --rerank $rerank --two-level off --reps 3 --build-reps 1 --json 2>/dev/null </dev/null |
          python3 -c "
import json, sys
j = json.load(sys.stdin)
load = float(open('/proc/loadavg').read().split()[0])
for s in j['sweep']:
    print(json.dumps({'round': $round, 'd': $d, 'rerank': $rerank, 'build': '$side', 'nprobe': s['nprobe'],
                      'search_s': s['search_s'], 'recall_10_at_10': s['recall_10_at_10'],
                      'recall_1_at_1': s['recall_1_at_k']['1'], 'memory_bytes_per_vector': j['memory_bytes_per_vector'],
                      'loadavg_1min': load}))" >> "$out.tmp"
      done
    done
  done
done
mv "$out.tmp" "$out"
