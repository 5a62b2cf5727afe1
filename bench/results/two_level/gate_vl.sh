#!/usr/bin/env bash
# Where the two-level scan pays with the vector layout: the default build (TQ_A: below d = 384
# its search is the single-level scan of the fast layout) against a build whose gate is lowered
# (TQ_B: kTwoLevelMinDim 2 in src/search/index_internal.h, so every 3-4 bit index keeps a sign
# plane and searches in two levels), on the same index files (built by TQ_A; the file does not
# depend on the gate), Fashion-MNIST projected to d = DIMS (bench/fashion_projections.py), L2,
# 3 and 4 bits, flat and IVF-256 (nprobe 4 and 16), k = 10, 1,000 queries, 2 threads, alternating
# runs (bench/index_ab.sh: ROUNDS rounds of REPS runs). Then each build's R10@10 on each search.
# Usage (repository root): bash bench/results/two_level/gate_vl.sh TQ_A TQ_B OUTDIR
set -eu
PY="${TQ_BENCH_VENV:-.venv}/bin/python"  # numpy
A="$1"; B="$2"; O="$3"; DIMS="${DIMS:-192 256 320}"; W=$(mktemp -d)
mkdir -p "$O"
for d in $DIMS; do
  base=data/bench/fashion_p${d}_base.fvecs; q=data/bench/fashion_p${d}_q1000.fvecs; gt=data/bench/fashion_p${d}_gt1000.ivecs
  for bits in 3 4; do
    "$A" index build -i "$base" -o "$W/f_${d}_$bits.tqi" -b $bits -m l2 -t 2 >/dev/null 2>&1
    "$A" index build -i "$base" -o "$W/i_${d}_$bits.tqi" -b $bits -m l2 --ivf 256 -t 2 >/dev/null 2>&1
    for side in A B; do
      T=$([ $side = A ] && echo "$A" || echo "$B")
      printf '{"d": %s, "bits": %s, "build": "%s", "memory_bytes_per_vector": {"flat": %s, "ivf256": %s}}\n' $d $bits $side \
        "$("$T" index info --index "$W/f_${d}_$bits.tqi" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["memory_bytes_per_vector"])')" \
        "$("$T" index info --index "$W/i_${d}_$bits.tqi" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["memory_bytes_per_vector"])')" \
        >> "$O/memory.jsonl"
      for f in f i; do
        for np in $([ $f = f ] && echo 1 || echo "4 16"); do
          "$T" index search --index "$W/${f}_${d}_$bits.tqi" -q "$q" -k 10 -t 2 --nprobe $np --json |
            "$PY" -c "
import json, sys, numpy as np
ids = np.array(json.load(sys.stdin)['ids'])
a = np.fromfile('$gt', dtype=np.int32); k = a[0]; gt = a.reshape(-1, k + 1)[:, 1:11]
r = np.mean([len(set(ids[i]) & set(gt[i])) / 10 for i in range(len(ids))])
print(json.dumps({'d': $d, 'bits': $bits, 'index': '$f', 'nprobe': $np, 'build': '$side', 'recall_10_at_10': round(float(r), 4)}))" >> "$O/recall.jsonl"
        done
      done
    done
    ROUNDS=${ROUNDS:-3} REPS=${REPS:-2} FIELD=search_s ARGS="-k 10 -t 2" LABEL_A=single LABEL_B=two \
      bash bench/index_ab.sh "$A" "$B" "$q" "$O/flat_${d}_$bits.jsonl" "$W/f_${d}_$bits.tqi"
    for np in 4 16; do
      ROUNDS=${ROUNDS:-3} REPS=${REPS:-2} FIELD=search_s ARGS="-k 10 -t 2 --nprobe $np" LABEL_A=single LABEL_B=two \
        bash bench/index_ab.sh "$A" "$B" "$q" "$O/ivf256_np${np}_${d}_$bits.jsonl" "$W/i_${d}_$bits.tqi"
    done
  done
done
rm -rf "$W"
