#!/usr/bin/env python3
"""summary.json of the two-level scan's measurements in this directory (BENCHMARKS.md "Two-level
flat scan" reads it; tests/test_flat_bench_results.py recomputes it from the raw files):
search_ab_*.jsonl (bench/index_ab.sh: median search time per build and file, and the ratio),
crossover*.jsonl (crossover.sh: per d and bits the median over rounds of eval's search time with
--two-level on and off, and on / off), build_ab.jsonl and ivf_build_ab.jsonl (build times of the
binaries before and after, medians), ivf_load_ab.jsonl (bench/index_ab.sh load_s, medians), the Fashion-MNIST comparison runs (../fashion/results.json, run2/, run3/) and
ivf_fashion_{l2,cosine}.jsonl (ivf.sh: per metric, d, bits and nprobe the median over rounds of
eval's search time with --two-level on and off, on / off, and the recall both ways) and
ivf_fashion_{l2,cosine}_lowd.jsonl (the same at d = 256 and 320, a build with the gate lowered)
and ivf_fashion_{l2,cosine}_n1024.jsonl (nlist 1024, d = 784, 4 bits).
Usage: python3 bench/results/two_level/summarize.py"""
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import results_summary  # noqa: E402


def jsonl(name):
    return [json.loads(line) for line in open(os.path.join(HERE, name))]


def summarize():
    out = {"search_ab": {}, "crossover": {}, "build_ab": {}, "fashion_runs": [], "ivf": {}, "ivf_lowd": {},
           "ivf_n1024": {}}
    for name in sorted(os.listdir(HERE)):
        if not (name.startswith("search_ab_") and name.endswith(".jsonl")):
            continue
        rows = jsonl(name)
        libs = list(dict.fromkeys(r["library"] for r in rows))
        for f in dict.fromkeys(r["file"] for r in rows):
            med = {lib: statistics.median(r["search_s"] for r in rows if r["file"] == f and r["library"] == lib)
                   for lib in libs}
            n = {lib: sum(1 for r in rows if r["file"] == f and r["library"] == lib) for lib in libs}
            out["search_ab"][f"{name[len('search_ab_'):-len('.jsonl')]}/{os.path.splitext(f)[0]}"] = {
                "args": rows[0]["args"], "a": libs[0], "b": libs[1], "a_s": med[libs[0]], "b_s": med[libs[1]],
                "runs_each": n[libs[0]], "ratio": med[libs[1]] / med[libs[0]]}
    rows = [r for name in sorted(os.listdir(HERE)) if name.startswith("crossover") and name.endswith(".jsonl")
            for r in jsonl(name)]
    for d in sorted({r["d"] for r in rows}):
        for bits in sorted({r["bits"] for r in rows}):
            sel = [r for r in rows if r["d"] == d and r["bits"] == bits]
            on = statistics.median(r["search_s"] for r in sel if r["two_level"] == "on")
            off = statistics.median(r["search_s"] for r in sel if r["two_level"] == "off")
            r10 = {tl: [r["recall_10_at_10"] for r in sel if r["two_level"] == tl] for tl in ("on", "off")}
            out["crossover"][f"d{d}_{bits}b"] = {"d": d, "bits": bits, "on_s": on, "off_s": off, "ratio": on / off,
                                                 "rounds": len(r10["on"]), "r10_on": r10["on"][0],
                                                 "r10_off": r10["off"][0]}
    rows = jsonl("build_ab.jsonl") + jsonl("ivf_build_ab.jsonl")
    for s in dict.fromkeys(r["set"] for r in rows):
        med = {b: statistics.median(r["build_s"] for r in rows if r["set"] == s and r["build"] == b)
               for b in ("before", "after")}
        out["build_ab"][s] = {"before_s": med["before"], "after_s": med["after"], "ratio": med["after"] / med["before"]}
    rows = jsonl("ivf_load_ab.jsonl")
    med = {b: statistics.median(r["load_s"] for r in rows if r["library"] == b) for b in ("before", "after")}
    out["ivf_load_ab"] = {"file": rows[0]["file"], "before_s": med["before"], "after_s": med["after"],
                          "ratio": med["after"] / med["before"], "runs_each": len(rows) // 2}
    fash = os.path.join(HERE, "..", "fashion")
    for rel in ("results.json", "run2/results.json", "run3/results.json"):
        j = json.load(open(os.path.join(fash, rel)))
        by = {r["method"]: r for r in j["results"]}
        two, off = by["tq mse 4b corrected+fit+center two-level"], by["tq mse 4b corrected+fit+center two-level=off"]
        rq4, rq2 = by["rabitqlib 4b (1 cluster)"], by["rabitqlib 2b (1 cluster)"]
        tq2 = by["tq mse 2b corrected+fit+center"]
        out["fashion_runs"].append({"file": "bench/results/fashion/" + rel, "two_level_over_single": two["qps"] / off["qps"],
                                    "two_level_over_rabitqlib_4b": two["qps"] / rq4["qps"],
                                    "rabitqlib_2b_over_tq_2b": rq2["qps"] / tq2["qps"]})
    for key in ("two_level_over_single", "two_level_over_rabitqlib_4b", "rabitqlib_2b_over_tq_2b"):
        xs = [r[key] for r in out["fashion_runs"]]
        out[f"fashion_{key}_min"], out[f"fashion_{key}_max"] = min(xs), max(xs)
    for key, suffix in (("ivf", ""), ("ivf_lowd", "_lowd"), ("ivf_n1024", "_n1024")):
        for metric in ("l2", "cosine"):
            rows = jsonl(f"ivf_fashion_{metric}{suffix}.jsonl")
            for d, bits, npr in sorted({(r["d"], r["bits"], r["nprobe"]) for r in rows}):
                sel = [r for r in rows if (r["d"], r["bits"], r["nprobe"]) == (d, bits, npr)]
                by = {tl: [r for r in sel if r["two_level"] == tl] for tl in ("on", "off")}
                on = statistics.median(r["search_s"] for r in by["on"])
                off = statistics.median(r["search_s"] for r in by["off"])
                out[key][f"{metric}_d{d}_{bits}b_np{npr}"] = {
                    "metric": metric, "d": d, "bits": bits, "nprobe": npr, "nlist": sel[0]["nlist"], "on_s": on,
                    "off_s": off, "ratio": on / off, "rounds": len(by["on"]), "r10_on": by["on"][0]["recall_10_at_10"],
                    "r10_off": by["off"][0]["recall_10_at_10"], "mem_b": by["on"][0]["memory_bytes_per_vector"]}
    return out


def crossover_table(summ):
    """Markdown: per d, each width's search time with the two-level scan over the single-level one."""
    cx = summ["crossover"]
    dims = sorted({e["d"] for e in cx.values()})
    bits = sorted({e["bits"] for e in cx.values()})
    lines = ["| d | " + " | ".join(f"{b} bits: two-level / single-level time (R10@10 single -> two-level)" for b in bits) + " |",
             "|---:|" + "---|" * len(bits)]
    for d in dims:
        cells = []
        for b in bits:
            e = cx[f"d{d}_{b}b"]
            cells.append(f"{e['ratio']:.2f} ({e['r10_off']:.4f} -> {e['r10_on']:.4f})")
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def ivf_table(summ, key="ivf"):
    """Markdown: per metric, d and width, the two-level / single-level search time at each nprobe,
    and the R10@10 range both ways (key "ivf_lowd": the runs at d < 384; "ivf_n1024": nlist 1024)."""
    iv = summ[key]
    nps = sorted({e["nprobe"] for e in iv.values()})
    lines = ["| metric | d | bits | " + " | ".join(f"nprobe {n}" for n in nps) + " | R10@10 single-level | two-level |",
             "|---|---:|---:|" + "---:|" * len(nps) + "---|---|"]
    for metric in ("l2", "cosine"):
        for d, bits in sorted({(e["d"], e["bits"]) for e in iv.values() if e["metric"] == metric}):
            es = [iv[f"{metric}_d{d}_{bits}b_np{n}"] for n in nps]
            rng = lambda key: f"{min(e[key] for e in es):.4f}-{max(e[key] for e in es):.4f}"
            lines.append(f"| {metric} | {d} | {bits} | " + " | ".join(f"{e['ratio']:.2f}" for e in es) +
                         f" | {rng('r10_off')} | {rng('r10_on')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    summ = summarize()
    results_summary.write(HERE, summ, {"crossover.md": crossover_table(summ), "ivf.md": ivf_table(summ),
                                       "ivf_lowd.md": ivf_table(summ, "ivf_lowd"),
                                       "ivf_n1024.md": ivf_table(summ, "ivf_n1024")})
    print(json.dumps(summ, indent=1))
