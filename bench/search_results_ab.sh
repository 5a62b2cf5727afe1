#!/usr/bin/env bash
# Do two tq builds return the same search results? Builds index files with TQ_A (Fashion-MNIST,
# the first 20,000 vectors: flat and IVF-64, 2 / 3 / 3.5 / 4 bits, the three metrics, second-stage
# codes), searches them with both builds (two-level on and off, float LUTs, nprobe 1 / 4 / 8,
# 1 and 2 threads, after removals and an add) and prints, per search whose results differ,
# how many ids differ and the largest score difference; then whether the files written after
# the removals and the add are byte-identical.
# Usage: bash bench/search_results_ab.sh TQ_A TQ_B [WORKDIR]
set -euo pipefail
A=$1; B=$2; W=${3:-$(mktemp -d)}
cd "$(dirname "$0")/.."
BASE=data/fashion-mnist/train.bvecs; MORE=data/fashion-mnist/test.bvecs; Q=data/bench/fashion_q200.fvecs
[ -f "$BASE" ] && [ -f "$Q" ] || { echo "search_results_ab: needs $BASE and $Q (scripts/fetch-fashion-mnist.sh)" >&2; exit 1; }
mkdir -p "$W/idx" "$W/a" "$W/b"
build() { local name=$1; shift; "$A" index build -i "$BASE" --max-n 20000 -o "$W/idx/$name.tqi" -t 2 "$@" >/dev/null 2>&1; }
build f4l2 -b 4 -m l2; build f3cos -b 3 -m cosine; build f35ip -b 3.5 -m ip; build f2l2 -b 2 -m l2
build i4l2 -b 4 -m l2 --ivf 64; build i3cos -b 3 -m cosine --ivf 64
build i4rr -b 4 -m l2 --ivf 64 --rerank-bits 4; build i4rb -b 4 -m ip --ivf 64 --rerank-bits 2
for side in a b; do
  T=$([ $side = a ] && echo "$A" || echo "$B"); O=$W/$side
  s() { local out=$1; shift; "$T" index search -q "$Q" -k 20 --json "$@" > "$O/$out.json"; }
  for n in f4l2 f3cos f35ip f2l2; do
    for tl in auto off; do s $n.$tl --index "$W/idx/$n.tqi" --two-level $tl -t 2; done
    s $n.floatlut --index "$W/idx/$n.tqi" --no-fast-scan -t 2
    s $n.off.r0 --index "$W/idx/$n.tqi" --two-level off --rerank 0 -t 2
  done
  for n in i4l2 i3cos i4rr i4rb; do
    for np in 1 8; do for tl in auto off; do for t in 1 2; do
      s $n.$np.$tl.t$t --index "$W/idx/$n.tqi" --nprobe $np --two-level $tl -t $t
    done; done; done
    s $n.4.off.r0 --index "$W/idx/$n.tqi" --nprobe 4 --two-level off --rerank 0 -t 2
    s $n.4.floatlut --index "$W/idx/$n.tqi" --nprobe 4 --no-fast-scan -t 2
  done
  for n in f4l2 i4l2; do
    cp "$W/idx/$n.tqi" "$O/$n.mod.tqi"
    "$T" index remove --index "$O/$n.mod.tqi" --ids 1,5,77,1000,19999 >/dev/null
    "$T" index add --index "$O/$n.mod.tqi" --input "$MORE" >/dev/null 2>&1
    s $n.mod --index "$O/$n.mod.tqi" -t 2
  done
done
python3 - "$W" <<'PY'
import glob, json, os, sys
w = sys.argv[1]
n = same = 0
for f in sorted(glob.glob(f"{w}/a/*.json")):
    a, b = json.load(open(f)), json.load(open(f"{w}/b/{os.path.basename(f)}"))
    n += 1
    if a["ids"] == b["ids"] and a["scores"] == b["scores"]:
        same += 1
        continue
    ids = sum(x != y for ra, rb in zip(a["ids"], b["ids"]) for x, y in zip(ra, rb))
    ds = max(abs(x - y) for ra, rb in zip(a["scores"], b["scores"]) for x, y in zip(ra, rb))
    print(f"{os.path.basename(f)[:-5]}: {ids} of {sum(map(len, a['ids']))} ids differ, largest score difference {ds:.3g}")
print(f"{same} of {n} searches identical (ids and scores)")
for m in ("f4l2", "i4l2"):
    same_file = open(f"{w}/a/{m}.mod.tqi", "rb").read() == open(f"{w}/b/{m}.mod.tqi", "rb").read()
    print(f"{m} after removals and an add: files {'identical' if same_file else 'DIFFER'}")
PY
