#!/usr/bin/env bash
# `tq index search --two-level off` on indexes that keep a sign plane: TQ_A searching them in one
# level with the plane held (the vector layout widened per block), TQ_B freeing the plane after
# the load (the fast layout). Fashion-MNIST 60k (d = 784, 3 and 4 bits, flat and IVF-256) and
# its projection to d = 256 (IVF-256, 4 bits), l2, 1,000 queries, 1 thread, alternating rounds
# (bench/index_ab.sh); then the memory each build holds (search --json).
# Usage (repository root): bash bench/results/release_off/run.sh TQ_A TQ_B WORKDIR [OUTDIR]
# (OUTDIR: where the JSON lines go; default bench/results/release_off)
set -eu
A="$1"; B="$2"; W="$3"; R="${4:-bench/results/release_off}"
mkdir -p "$W" "$R"
b() { [ -f "$W/$1" ] || "$B" index build -o "$W/$1" -m l2 -t 2 "${@:2}" >/dev/null 2>&1; }
b flat3.tqi -i data/fashion-mnist/train.bvecs -b 3
b flat4.tqi -i data/fashion-mnist/train.bvecs -b 4
b ivf256_3.tqi -i data/fashion-mnist/train.bvecs -b 3 --ivf 256
b ivf256_4.tqi -i data/fashion-mnist/train.bvecs -b 4 --ivf 256
b p256_ivf256_4.tqi -i data/bench/fashion_p256_base.fvecs -b 4 --ivf 256
Q=data/bench/fashion_q1000.fvecs
ab() { LABEL_A=keep LABEL_B=release ROUNDS=3 bash bench/index_ab.sh "$A" "$B" "$@"; }
REPS=2 FIELD=search_s ARGS="-k 10 -t 1 --two-level off" ab $Q $R/flat_off.jsonl "$W/flat3.tqi" "$W/flat4.tqi"
for np in 4 16; do
  REPS=3 FIELD=search_s ARGS="-k 10 -t 1 --two-level off --nprobe $np" ab $Q $R/ivf_off_np$np.jsonl \
    "$W/ivf256_3.tqi" "$W/ivf256_4.tqi"
  REPS=3 FIELD=search_s ARGS="-k 10 -t 1 --two-level off --nprobe $np" ab data/bench/fashion_p256_q1000.fvecs \
    $R/p256_off_np$np.jsonl "$W/p256_ivf256_4.tqi"
done
REPS=3 ARGS="-k 1 -t 1 --two-level off" ab $Q $R/load_off.jsonl "$W/flat3.tqi" "$W/ivf256_3.tqi"
: > $R/memory.jsonl
for f in flat3 flat4 ivf256_3 ivf256_4 p256_ivf256_4; do
  q=$Q; [ $f = p256_ivf256_4 ] && q=data/bench/fashion_p256_q1000.fvecs
  for tl in auto off; do
    "$B" index search --index "$W/$f.tqi" -q $q --max-queries 1 -k 1 --two-level $tl --json |
      python3 -c "import json, sys; j = json.load(sys.stdin); print(json.dumps({'file': '$f', 'two_level': '$tl', 'index': j['index'], 'memory_bytes_per_vector': j['memory_bytes_per_vector']}))" >> $R/memory.jsonl
  done
done
