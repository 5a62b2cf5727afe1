#!/usr/bin/env bash
# Loading and building indexes that keep a sign plane or l2 IVF list terms, two builds
# alternating: load_s of `tq index search` (bench/index_ab.sh: the load, then one search at k = 1)
# on Fashion-MNIST 60k files (d = 784, 3 and 4 bits, flat and IVF-256, l2) and a 1M x 784 IVF-2048
# 4-bit file; build_s of `tq index build -t 2` (bench/results/flat_encode_ab/run.sh, 5 rounds) of
# the 60k indexes.
# With TQ_SIMD=avx2 in the environment both builds run their AVX2 kernels (an AVX2 host's path).
# Usage (repository root): bash bench/results/load_derive/run.sh BEFORE/tq AFTER/tq WORKDIR [OUTDIR]
# (data: scripts/fetch-fashion-mnist.sh; the 1M base, data/bench/fashion1m_base.fvecs, from
# bench/search_vs_faiss.py --dataset fashion1m; its index is built once into WORKDIR)
set -eu
A="$1"; B="$2"; W="$3"; R="${4:-bench/results/load_derive}"
mkdir -p "$W" "$R"
F=data/fashion-mnist/train.bvecs
b() { [ -f "$W/$1" ] || "$B" index build -o "$W/$1" -m l2 -t 2 "${@:2}" >/dev/null 2>&1; }
b flat3.tqi -i $F -b 3
b flat4.tqi -i $F -b 4
b ivf256_3.tqi -i $F -b 3 --ivf 256
b ivf256_4.tqi -i $F -b 4 --ivf 256
b f1m_ivf2048_4.tqi -i data/bench/fashion1m_base.fvecs -b 4 --ivf 2048
ROUNDS=4 REPS=3 LABEL_A=before LABEL_B=after bash bench/index_ab.sh "$A" "$B" data/bench/fashion_q1000.fvecs \
  $R/load_60k.jsonl "$W/flat3.tqi" "$W/flat4.tqi" "$W/ivf256_3.tqi" "$W/ivf256_4.tqi"
ROUNDS=3 REPS=2 LABEL_A=before LABEL_B=after bash bench/index_ab.sh "$A" "$B" data/bench/fashion1m_q1000.fvecs \
  $R/load_1m.jsonl "$W/f1m_ivf2048_4.tqi"
SETS="fashion flat 3b|$F|--bits 3 --metric l2
fashion flat 4b|$F|--bits 4 --metric l2
fashion ivf256 3b|$F|--bits 3 --metric l2 --ivf 256
fashion ivf256 4b|$F|--bits 4 --metric l2 --ivf 256" \
  bash bench/results/flat_encode_ab/run.sh "$A" "$B" $R/build_60k.jsonl
