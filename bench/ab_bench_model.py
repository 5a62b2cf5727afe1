#!/usr/bin/env python3
"""A/B speed of two tq builds: `tq bench model` with the same arguments, the two binaries
alternating (A, B, A, B, ...) for --rounds rounds, each run in its own process. Writes one JSON
object: every run (round, binary, context, prefill / decode tok/s, 1-minute load average
before it), the per-round B / A ratios and their medians, lowest and highest per context.

  python3 bench/ab_bench_model.py --a OLD/tq --b NEW/tq --rounds 3 --out FILE.json -- \
      -m models/gemma-3-270m-q4_k_m.gguf -t 2 --contexts 512,4096 --caches f16 --decode 8 --reps 1

Only the ratios of runs in the same round mean much on a shared host.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run(binary, args):
    out = subprocess.run([binary, "bench", "model", *args, "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="baseline tq binary")
    ap.add_argument("--b", required=True, help="candidate tq binary")
    ap.add_argument("--label-a", default="a")
    ap.add_argument("--label-b", default="b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--note", default="")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: arguments of tq bench model")
    a = ap.parse_args()
    bargs = a.bench_args[1:] if a.bench_args[:1] == ["--"] else a.bench_args
    runs = []
    for rnd in range(1, a.rounds + 1):
        for label, binary in ((a.label_a, a.a), (a.label_b, a.b)):
            load = os.getloadavg()[0]
            d = run(binary, bargs)
            for row in d["rows"]:
                runs.append({"round": rnd, "binary": label, "context": row["context"], "cache": row["cache"],
                             "prefill_tok_s": row["prefill_tok_s"], "decode_tok_s": row["decode_tok_s"],
                             "loadavg_1min_before": round(load, 2), "blas_core": d.get("blas_core")})
                print(f"round {rnd} {label} ctx {row['context']} {row['cache']}: prefill {row['prefill_tok_s']:.1f} "
                      f"decode {row['decode_tok_s']:.2f} tok/s (load {load:.2f})", file=sys.stderr, flush=True)
    ratios = []
    keys = sorted({(r["context"], r["cache"]) for r in runs})
    for ctx, cache in keys:
        per = []
        for rnd in range(1, a.rounds + 1):
            ra = [r for r in runs if r["round"] == rnd and r["binary"] == a.label_a and r["context"] == ctx and r["cache"] == cache]
            rb = [r for r in runs if r["round"] == rnd and r["binary"] == a.label_b and r["context"] == ctx and r["cache"] == cache]
            if ra and rb:
                per.append({"round": rnd, "prefill": rb[0]["prefill_tok_s"] / ra[0]["prefill_tok_s"],
                            "decode": rb[0]["decode_tok_s"] / ra[0]["decode_tok_s"]})
        pa = [r["prefill_tok_s"] for r in runs if r["binary"] == a.label_a and r["context"] == ctx and r["cache"] == cache]
        pb = [r["prefill_tok_s"] for r in runs if r["binary"] == a.label_b and r["context"] == ctx and r["cache"] == cache]
        ratios.append({
            "context": ctx, "cache": cache, "rounds": len(per), "per_round": per,
            "prefill_ratio_median": statistics.median(p["prefill"] for p in per),
            "prefill_ratio_min": min(p["prefill"] for p in per), "prefill_ratio_max": max(p["prefill"] for p in per),
            "decode_ratio_median": statistics.median(p["decode"] for p in per),
            "decode_ratio_min": min(p["decode"] for p in per), "decode_ratio_max": max(p["decode"] for p in per),
            "prefill_tok_s_median_" + a.label_a: statistics.median(pa),
            "prefill_tok_s_median_" + a.label_b: statistics.median(pb),
        })
    res = {"what": f"tq bench model A/B: {a.label_b} / {a.label_a}, binaries alternating, {a.rounds} rounds",
           "note": a.note, "command": "tq bench model " + " ".join(bargs) + " --json",
           "a": {"label": a.label_a, "binary": a.a}, "b": {"label": a.label_b, "binary": a.b},
           "ratios": ratios, "runs": runs}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    for r in ratios:
        print(f"ctx {r['context']} {r['cache']}: prefill {a.label_b}/{a.label_a} median {r['prefill_ratio_median']:.3f} "
              f"({r['prefill_ratio_min']:.3f}-{r['prefill_ratio_max']:.3f}), decode median {r['decode_ratio_median']:.3f}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
