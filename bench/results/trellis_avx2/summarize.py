#!/usr/bin/env python3
"""summary.json and ab.md of the trellis scan's A/B on an AVX2 host (BENCHMARKS.md "Trellis scan
without VBMI" reads them; tests/test_flat_bench_results.py recomputes them): per index file of
bench/index_ab.sh's search_ab_*.jsonl, the median search time of each build and after / before.
Usage: python3 bench/results/trellis_avx2/summarize.py"""
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import results_summary  # noqa: E402

NAMES = {"g100k_tc4": "GloVe 100k, d = 100, 4 bits", "g100k_tc2": "GloVe 100k, d = 100, 2 bits",
         "fashion_tc4": "Fashion-MNIST, d = 784, 4 bits", "fashion_tc2": "Fashion-MNIST, d = 784, 2 bits"}


def summarize():
    rows = []
    for path in sorted(glob.glob(os.path.join(HERE, "search_ab_*.jsonl"))):
        rows += [json.loads(line) for line in open(path)]
    out = results_summary.index_ab(rows, "search_s")
    for e in out.values():
        e["args"] = rows[0]["args"]
    return out


def table(summ):
    lines = ["| index (trellis codes, flat) | before | after | after / before |", "|---|---:|---:|---:|"]
    for key, e in summ.items():
        lines.append(f"| {NAMES.get(key, key)} | {e['before_s']:.2f} s | {e['after_s']:.2f} s | {e['ratio']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    summ = summarize()
    results_summary.write(HERE, summ, {"ab.md": table(summ)})
    print(table(summ))
