#!/usr/bin/env bash
# The trellis encoder's speed, two builds alternating: `bench_codec --benchmark_filter=TrellisEncode`
# (256 random unit vectors of dim 64 / 128 / 256 at 2-4 bits, two Viterbi passes each, 1 thread,
# CPU time; medians of 3 repetitions a run), ROUNDS rounds of BEFORE then AFTER at the host's
# SIMD level and with TQ_SIMD=avx2 -> OUT/{avx512,avx2}_rN_{before,after}.json. summarize.py
# takes the after / before medians -> table.md.
# Usage: bash bench/results/trellis_encode/run.sh BEFORE/bench_codec AFTER/bench_codec [OUT]
set -eu
BEFORE="$1"
AFTER="$2"
OUT="${3:-bench/results/trellis_encode}"
ROUNDS="${ROUNDS:-3}"
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  for level in avx512 avx2; do
    for side in before after; do
      bin="$BEFORE"; [ "$side" = after ] && bin="$AFTER"
      env_simd=""; [ "$level" = avx2 ] && env_simd="avx2"
      TQ_SIMD="$env_simd" "$bin" --benchmark_filter=TrellisEncode --benchmark_repetitions=3 \
        --benchmark_report_aggregates_only=true --benchmark_format=json > "$OUT/${level}_r${r}_${side}.json"
    done
  done
done
