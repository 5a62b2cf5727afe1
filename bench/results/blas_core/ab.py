#!/usr/bin/env python3
"""OpenBLAS kernel set A/B for the index commands: `tq index eval` (IVF build, then searches at
several nprobe) run alternately with OpenBLAS's own pick (TQ_NO_REEXEC=1: on a CPU model it does
not know, its SSE3 Prescott kernels, as tq ran index commands before the launcher set
OPENBLAS_CORETYPE for every command) and with tq's default (the launcher's choice). Each run's
JSON names the kernels it ran (blas_core).

Usage: python3 bench/results/blas_core/ab.py --tq build/tq --rounds 3 --out DIR -- <tq index eval args>
Writes DIR/runs.jsonl (one line per run) and DIR/summary.json (medians per side, ratios).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tq", default="build/tq")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    args = [x for x in a.args if x != "--"]
    os.makedirs(a.out, exist_ok=True)
    sides = {"openblas_own": {"TQ_NO_REEXEC": "1"}, "tq_default": {}}
    runs = []
    for r in range(a.rounds):
        for side, env in (sides.items() if r % 2 == 0 else reversed(list(sides.items()))):
            e = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "TQ_NO_REEXEC")}
            e.update(env)
            e["TQ_PROGRESS"] = "0"
            out = subprocess.run([a.tq, "index", "eval", *args, "--json"], env=e, check=True,
                                 capture_output=True, text=True).stdout
            j = json.loads(out)
            row = dict(round=r, side=side, blas_core=j["blas_core"], build_s=j["build_s"],
                       qps={str(s["nprobe"]): s["qps"] for s in j["sweep"]},
                       recall_10_at_10={str(s["nprobe"]): s["recall_10_at_10"] for s in j["sweep"]},
                       loadavg=os.getloadavg()[0])
            runs.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    with open(os.path.join(a.out, "runs.jsonl"), "w") as f:
        for row in runs:
            f.write(json.dumps(row) + "\n")
    med = {}
    for side in sides:
        rs = [x for x in runs if x["side"] == side]
        med[side] = dict(blas_core=sorted({x["blas_core"] for x in rs}),
                         build_s=statistics.median(x["build_s"] for x in rs),
                         qps={p: statistics.median(x["qps"][p] for x in rs) for p in rs[0]["qps"]},
                         recall_10_at_10=rs[0]["recall_10_at_10"])
    o, d = med["openblas_own"], med["tq_default"]
    summary = dict(command=" ".join([a.tq, "index", "eval", *args, "--json"]), rounds=a.rounds, medians=med,
                   build_time_default_over_own=d["build_s"] / o["build_s"],
                   qps_default_over_own={p: d["qps"][p] / o["qps"][p] for p in o["qps"]},
                   cpu=next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), ""))
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
