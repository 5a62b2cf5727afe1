#!/usr/bin/env python3
"""summary.json and ab.md of run.sh's A/B (BENCHMARKS.md "One set of uint8 tables per query for
l2 IVF" reads them; tests/test_flat_bench_results.py recomputes them): per d, re-rank and nprobe,
the median over rounds of each build's search time, after / before, and the recall both ways;
and under "load_ab", per index file of bench/index_ab.sh's load_ab.jsonl, the median load_s of
each build and after / before (the list terms computed at load).
Usage: python3 bench/results/ivf_l2_tables/summarize.py"""
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import results_summary  # noqa: E402


def summarize():
    rows = [json.loads(line) for line in open(os.path.join(HERE, "ab.jsonl"))]
    out = {}
    for d, rr, npr in sorted({(r["d"], r["rerank"], r["nprobe"]) for r in rows}):
        sel = [r for r in rows if (r["d"], r["rerank"], r["nprobe"]) == (d, rr, npr)]
        by = {b: [r for r in sel if r["build"] == b] for b in ("before", "after")}
        med = {b: statistics.median(r["search_s"] for r in by[b]) for b in by}
        out[f"d{d}_rerank{rr}_np{npr}"] = {
            "d": d, "rerank": rr, "nprobe": npr, "rounds": len(by["after"]), "before_s": med["before"],
            "after_s": med["after"], "ratio": med["after"] / med["before"],
            "r10_before": by["before"][0]["recall_10_at_10"], "r10_after": by["after"][0]["recall_10_at_10"],
            "r1_before": by["before"][0]["recall_1_at_1"], "r1_after": by["after"][0]["recall_1_at_1"],
            "mem_before": by["before"][0]["memory_bytes_per_vector"], "mem_after": by["after"][0]["memory_bytes_per_vector"]}
    loads = [json.loads(line) for line in open(os.path.join(HERE, "load_ab.jsonl"))]
    out["load_ab"] = results_summary.index_ab(loads, "load_s")
    return out


def points(summ):
    """The search A/B's entries of summ (without load_ab)."""
    return {k: e for k, e in summ.items() if k != "load_ab"}


def table(summ):
    """Markdown: one row per d and re-rank, after / before search time at each nprobe, and the
    recall before -> after at nprobe 64."""
    summ = points(summ)
    nps = sorted({e["nprobe"] for e in summ.values()})
    lines = ["| d | re-rank | " + " | ".join(f"nprobe {n}" for n in nps) +
             " | R10@10 at nprobe 64, before -> after | R@1@1 at nprobe 64 |",
             "|---:|---|" + "---:|" * len(nps) + "---|---|"]
    for d, rr in sorted({(e["d"], e["rerank"]) for e in summ.values()}, key=lambda t: (t[0], -t[1])):
        es = [summ[f"d{d}_rerank{rr}_np{n}"] for n in nps]
        last = es[-1]
        lines.append(f"| {d} | {'k + 16' if rr < 0 else 'none'} | " + " | ".join(f"{e['ratio']:.2f}" for e in es) +
                     f" | {last['r10_before']:.4f} -> {last['r10_after']:.4f} | {last['r1_before']:.3f} -> {last['r1_after']:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    summ = summarize()
    results_summary.write(HERE, summ, {"ab.md": table(summ)})
    print(table(summ))
