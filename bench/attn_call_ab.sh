#!/usr/bin/env bash
# One decode attention call at Gemma 3 270M's shape (head dim 256, 4 query heads over 1 KV head),
# `tq bench attention` of two tq binaries alternating, ROUNDS rounds, f16 and `auto`'s types on
# the lookup-table kernel, wall time at 1 and 2 threads. One JSON line per run: round, binary,
# 1-minute load average before it, the bench's JSON.
# Usage: bash bench/attn_call_ab.sh TQ_A TQ_B OUT.jsonl   Env: ROUNDS (3), CONTEXT (32768),
#        STEPS (21), NICE (5), LABEL_A (a), LABEL_B (b).
set -eu
A="$1"; B="$2"; OUT="$3"
ROUNDS="${ROUNDS:-3}"; CONTEXT="${CONTEXT:-32768}"; STEPS="${STEPS:-21}"; NICE="${NICE:-5}"
LA="${LABEL_A:-a}"; LB="${LABEL_B:-b}"
: > "$OUT.tmp"
for round in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    bin=$([ $side = A ] && echo "$A" || echo "$B")
    label=$([ $side = A ] && echo "$LA" || echo "$LB")
    load=$(cut -d' ' -f1 /proc/loadavg)
    j=$(nice -n "$NICE" "$bin" bench attention --head-dim 256 --n-heads 4 --n-kv-heads 1 --context "$CONTEXT" \
          --kv "f16,tq4h6n8:tq3h6n8@auto@lut8" --threads 1,2 --steps "$STEPS" --json |
          python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)))')
    echo "{\"round\": $round, \"binary\": \"$label\", \"loadavg_1min\": $load, \"result\": $j}" >> "$OUT.tmp"
  done
done
mv "$OUT.tmp" "$OUT"
python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = {}
for r in rows:
    for x in r["result"]["results"]:
        med.setdefault((x["kv"], x["threads"], r["binary"]), []).append(x["ms_per_step"])
for k, v in sorted(med.items()):
    print(f"{k[0]:28s} thr {k[1]} {k[2]:8s}: median {statistics.median(v):.3f} ms over {len(v)} rounds "
          f"({', '.join(f'{t:.3f}' for t in v)})")
PY
