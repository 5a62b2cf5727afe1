#!/usr/bin/env bash
# One layer's attention call (Gemma 3 270M's shape) in CPU time, two builds of the library
# alternating (bench/attn_cpu_time.cpp built against each), ROUNDS rounds, 1 thread: windowed
# calls (sliding window 512: a prefill micro-batch of 128 queries at 16K, a decode step at 32K),
# a global decode step at 32K and global prefill micro-batches of 128 queries at 4K and 32K, for
# `auto`'s cache on Gemma 3 and f16; the 32K decode steps of `auto` on lut8 also cold (FLUSH_MB
# 64: a 64 MB buffer read before each call, so the codes come from memory as in a model's decode
# step).
# Usage: bash bench/attn_cpu_ab.sh BUILD_A BUILD_B OUT.jsonl   (build trees holding libturboquant.so)
# Env:   ROUNDS (3), NICE (5), LABEL_A (a), LABEL_B (b).
set -eu
cd "$(dirname "$0")/.."
A="$1"; B="$2"; OUT="$3"
ROUNDS="${ROUNDS:-3}"; NICE="${NICE:-5}"; LA="${LABEL_A:-a}"; LB="${LABEL_B:-b}"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for side in A B; do
  dir=$([ $side = A ] && echo "$A" || echo "$B")
  dir=$(cd "$dir" && pwd)
  g++ -std=c++20 -O2 -fopenmp -Iinclude -Isrc bench/attn_cpu_time.cpp -o "$TMP/act_$side" -L"$dir" -lturboquant \
    -Wl,-rpath,"$dir"
done
AUTO="k=tq4h6n8 v=tq3h6n8 sink=1 center=k,rope,512 scale-k"
: > "$OUT.tmp"
for round in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    label=$([ $side = A ] && echo "$LA" || echo "$LB")
    for args in "$AUTO|16384|128|7|lut8|1|512" "$AUTO|16384|128|7|fused|1|512" "f16|16384|128|7|fused|1|512" \
                "$AUTO|32768|1|41|lut8|1|512" "$AUTO|32768|1|41|fused|1|512" "f16|32768|1|41|fused|1|512" \
                "$AUTO|32768|1|21|lut8|1|0" "$AUTO|32768|1|41|lut8|1|512|64" "$AUTO|32768|1|21|lut8|1|0|64" \
                "$AUTO|4096|128|7|lut8|1|0" "f16|4096|128|7|fused|1|0" "$AUTO|32768|128|3|lut8|1|0" \
                "f16|32768|128|3|fused|1|0"; do
      IFS='|' read -r s n q st k t w f <<< "$args"
      j=$(nice -n "$NICE" "$TMP/act_$side" "$s" "$n" "$q" "$st" "$k" "$t" "$w" "${f:-0}")
      echo "{\"round\": $round, \"library\": \"$label\", \"loadavg_1min\": $(cut -d' ' -f1 /proc/loadavg), \"result\": $j}" >> "$OUT.tmp"
    done
  done
done
mv "$OUT.tmp" "$OUT"
python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = []
for r in rows:
    x = r["result"]
    k = (x["spec"][:9], x["context"], x["queries"], x["kernel"], x["sliding_window"], x.get("flush_mb", 0))
    if k not in keys: keys.append(k)
for k in keys:
    line = []
    for lib in dict.fromkeys(r["library"] for r in rows):
        v = [r["result"]["cpu_ms_median"] for r in rows if r["library"] == lib and
             (r["result"]["spec"][:9], r["result"]["context"], r["result"]["queries"], r["result"]["kernel"],
              r["result"]["sliding_window"], r["result"].get("flush_mb", 0)) == k]
        line.append(f"{lib} {statistics.median(v):.3f} ms")
    cold = " cold" if k[5] else ""
    print(f"{k[0]:<9} ctx {k[1]:>5} q {k[2]:>3} {k[3]:<5} window {k[4]:>3}{cold}: " + ", ".join(line) + " (CPU, median of rounds)")
PY
