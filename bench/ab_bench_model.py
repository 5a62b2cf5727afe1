#!/usr/bin/env python3
"""A/B speed of two tq builds: `tq bench model` with the same arguments, the two binaries
alternating (A, B, A, B, ...) for --rounds rounds, each run in its own process. Writes one JSON
object: every run (round, binary, context, prefill / decode tok/s, 1-minute load average
before it), the per-round B / A ratios and their medians, lowest and highest per context.

  python3 bench/ab_bench_model.py --a OLD/tq --b NEW/tq --rounds 3 --out FILE.json -- \
      -m models/gemma-3-270m-q4_k_m.gguf -t 2 --contexts 512,4096 --caches f16 --decode 8 --reps 1

Only the ratios of runs in the same round mean much on a shared host. With several caches in
--caches, `cache_ratios` also gives, per binary, each cache's prefill / decode against the first
cache of the same process (same round), per round and as medians.
`--summarize FILE.json` recomputes `ratios` and `cache_ratios` of an existing output from its runs.
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


def cache_ratios(runs, labels):
    """Per binary, context and cache: prefill / decode of the cache over the first cache of the
    same process (the same binary, round and context), per round, with medians."""
    out = []
    for label in labels:
        for ctx in sorted({r["context"] for r in runs if r["binary"] == label}):
            rows = [r for r in runs if r["binary"] == label and r["context"] == ctx]
            caches = list(dict.fromkeys(r["cache"] for r in rows))
            for cache in caches[1:]:
                per = []
                for rnd in sorted({r["round"] for r in rows}):
                    base = [r for r in rows if r["round"] == rnd and r["cache"] == caches[0]]
                    this = [r for r in rows if r["round"] == rnd and r["cache"] == cache]
                    if base and this:
                        per.append({"round": rnd, "prefill": this[0]["prefill_tok_s"] / base[0]["prefill_tok_s"],
                                    "decode": this[0]["decode_tok_s"] / base[0]["decode_tok_s"]})
                if per:
                    out.append({"binary": label, "context": ctx, "cache": cache, "vs": caches[0], "per_round": per,
                                "prefill_median": statistics.median(p["prefill"] for p in per),
                                "decode_median": statistics.median(p["decode"] for p in per)})
    return out


def summarize(path):
    res = json.load(open(path))
    la, lb = res["a"]["label"], res["b"]["label"]
    res["ratios"] = ab_ratios(res["runs"], la, lb)
    res["cache_ratios"] = cache_ratios(res["runs"], [la, lb])
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    report(res)


def report(res):
    la, lb = res["a"]["label"], res["b"]["label"]
    for r in res["ratios"]:
        print(f"ctx {r['context']} {r['cache']}: prefill {lb}/{la} median {r['prefill_ratio_median']:.3f} "
              f"({r['prefill_ratio_min']:.3f}-{r['prefill_ratio_max']:.3f}), decode median {r['decode_ratio_median']:.3f}",
              file=sys.stderr)
    for r in res.get("cache_ratios", []):
        print(f"{r['binary']} ctx {r['context']} {r['cache']} / {r['vs']}: prefill median {r['prefill_median']:.3f}, "
              f"decode median {r['decode_median']:.3f}", file=sys.stderr)


def ab_ratios(runs, label_a, label_b):
    ratios = []
    keys = sorted({(r["context"], r["cache"]) for r in runs})
    rounds = sorted({r["round"] for r in runs})
    for ctx, cache in keys:
        per = []
        for rnd in rounds:
            ra = [r for r in runs if r["round"] == rnd and r["binary"] == label_a and r["context"] == ctx and r["cache"] == cache]
            rb = [r for r in runs if r["round"] == rnd and r["binary"] == label_b and r["context"] == ctx and r["cache"] == cache]
            if ra and rb:
                per.append({"round": rnd, "prefill": rb[0]["prefill_tok_s"] / ra[0]["prefill_tok_s"],
                            "decode": rb[0]["decode_tok_s"] / ra[0]["decode_tok_s"]})
        if not per:
            continue
        pa = [r["prefill_tok_s"] for r in runs if r["binary"] == label_a and r["context"] == ctx and r["cache"] == cache]
        pb = [r["prefill_tok_s"] for r in runs if r["binary"] == label_b and r["context"] == ctx and r["cache"] == cache]
        ratios.append({
            "context": ctx, "cache": cache, "rounds": len(per), "per_round": per,
            "prefill_ratio_median": statistics.median(p["prefill"] for p in per),
            "prefill_ratio_min": min(p["prefill"] for p in per), "prefill_ratio_max": max(p["prefill"] for p in per),
            "decode_ratio_median": statistics.median(p["decode"] for p in per),
            "decode_ratio_min": min(p["decode"] for p in per), "decode_ratio_max": max(p["decode"] for p in per),
            "prefill_tok_s_median_" + label_a: statistics.median(pa),
            "prefill_tok_s_median_" + label_b: statistics.median(pb),
        })
    return ratios


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--summarize":
        return summarize(sys.argv[2])
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
    ratios = ab_ratios(runs, a.label_a, a.label_b)
    res = {"what": f"tq bench model A/B: {a.label_b} / {a.label_a}, binaries alternating, {a.rounds} rounds",
           "note": a.note, "command": "tq bench model " + " ".join(bargs) + " --json",
           "a": {"label": a.label_a, "binary": a.a}, "b": {"label": a.label_b, "binary": a.b},
           "ratios": ratios, "cache_ratios": cache_ratios(runs, [a.label_a, a.label_b]), "runs": runs}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    report(res)


if __name__ == "__main__":
    main()
