#!/usr/bin/env bash
# Index load time of two tq builds alternating: `tq index search --json`'s load_s (the
# Index::load call alone) for each index file, ROUNDS rounds of REPS loads per build and file,
# 1 thread, one 1-query search. One JSON line per load; then the median per build and file and
# the ratio B / A.
# Usage: bash bench/index_load_ab.sh TQ_A TQ_B QUERIES.fvecs OUT.jsonl INDEX.tqi...
# Env:   ROUNDS (4), REPS (3), NICE (5), LABEL_A (a), LABEL_B (b).
set -eu
A="$1"; B="$2"; Q="$3"; OUT="$4"; shift 4
ROUNDS="${ROUNDS:-4}"; REPS="${REPS:-3}"; NICE="${NICE:-5}"; LA="${LABEL_A:-a}"; LB="${LABEL_B:-b}"
: > "$OUT.tmp"
for round in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    bin=$([ $side = A ] && echo "$A" || echo "$B")
    label=$([ $side = A ] && echo "$LA" || echo "$LB")
    for f in "$@"; do
      for rep in $(seq 1 "$REPS"); do
        load=$(cut -d' ' -f1 /proc/loadavg)
        s=$(nice -n "$NICE" "$bin" index search --index "$f" -q "$Q" -k 1 -t 1 --json |
            python3 -c 'import json, sys; print(json.load(sys.stdin)["load_s"])')
        echo "{\"round\": $round, \"library\": \"$label\", \"file\": \"$(basename "$f")\", \"loadavg_1min\": $load, \"load_s\": $s}" >> "$OUT.tmp"
      done
    done
  done
done
mv "$OUT.tmp" "$OUT"
python3 - "$OUT" "$LA" "$LB" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
a, b = sys.argv[2], sys.argv[3]
for f in dict.fromkeys(r["file"] for r in rows):
    m = {lib: statistics.median(r["load_s"] for r in rows if r["file"] == f and r["library"] == lib) for lib in (a, b)}
    print(f"{f}: {a} {m[a] * 1000:.1f} ms, {b} {m[b] * 1000:.1f} ms, {b}/{a} {m[b] / m[a]:.3f} (medians)")
loads = [r["loadavg_1min"] for r in rows]
print(f"load average {min(loads)}-{max(loads)}")
PY
