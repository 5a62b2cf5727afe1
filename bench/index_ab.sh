#!/usr/bin/env bash
# Two tq builds alternating on the same index files: a field of `tq index search --json`, by
# default load_s (the Index::load call alone, then one search at k = 1 on 1 thread), or search_s (one
# search of every query) with the search's flags in ARGS. ROUNDS rounds of REPS runs per build
# and file; one JSON line per run; then the median per build and file and the ratio B / A.
# Usage: bash bench/index_ab.sh TQ_A TQ_B QUERIES.fvecs OUT.jsonl INDEX.tqi...
# Env:   ROUNDS (4), REPS (3), NICE (5), LABEL_A (a), LABEL_B (b), FIELD (load_s),
#        ARGS (search flags; default "-k 1 -t 1"), e.g.
#        FIELD=search_s ARGS="-k 10 -t 1 --nprobe 4" for search time.
set -eu
A="$1"; B="$2"; Q="$3"; OUT="$4"; shift 4
ROUNDS="${ROUNDS:-4}"; REPS="${REPS:-3}"; NICE="${NICE:-5}"; LA="${LABEL_A:-a}"; LB="${LABEL_B:-b}"
FIELD="${FIELD:-load_s}"; ARGS="${ARGS:--k 1 -t 1}"
: > "$OUT.tmp"
for round in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    bin=$([ $side = A ] && echo "$A" || echo "$B")
    label=$([ $side = A ] && echo "$LA" || echo "$LB")
    for f in "$@"; do
      for rep in $(seq 1 "$REPS"); do
        load=$(cut -d' ' -f1 /proc/loadavg)
        # shellcheck disable=SC2086
        s=$(nice -n "$NICE" "$bin" index search --index "$f" -q "$Q" $ARGS --json |
            python3 -c "import json, sys; print(json.load(sys.stdin)['$FIELD'])")
        echo "{\"round\": $round, \"library\": \"$label\", \"file\": \"$(basename "$f")\", \"loadavg_1min\": $load, \"args\": \"$ARGS\", \"$FIELD\": $s}" >> "$OUT.tmp"
      done
    done
  done
done
mv "$OUT.tmp" "$OUT"
python3 - "$OUT" "$LA" "$LB" "$FIELD" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
a, b, field = sys.argv[2], sys.argv[3], sys.argv[4]
for f in dict.fromkeys(r["file"] for r in rows):
    m = {lib: statistics.median(r[field] for r in rows if r["file"] == f and r["library"] == lib) for lib in (a, b)}
    print(f"{f}: {a} {m[a] * 1000:.1f} ms, {b} {m[b] * 1000:.1f} ms, {b}/{a} {m[b] / m[a]:.3f} (medians)")
loads = [r["loadavg_1min"] for r in rows]
print(f"load average {min(loads)}-{max(loads)}")
PY
