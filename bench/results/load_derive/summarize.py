#!/usr/bin/env python3
"""Medians and ratios of bench/results/load_derive/run*/ (run.sh): after / before load_s per
file and build_s per set -> table.md; of avx2_run*/ (run.sh with TQ_SIMD=avx2) -> table_avx2.md
(BENCHMARKS.md includes both)."""
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = sorted(d for d in os.listdir(HERE) if d.startswith("run") and os.path.isdir(os.path.join(HERE, d)))
AVX2_RUNS = sorted(d for d in os.listdir(HERE) if d.startswith("avx2_run") and os.path.isdir(os.path.join(HERE, d)))
LOADS = (("load_60k", "flat3.tqi", "load, flat 3 bits (60k)"), ("load_60k", "flat4.tqi", "load, flat 4 bits (60k)"),
         ("load_60k", "ivf256_3.tqi", "load, IVF-256 3 bits (60k)"),
         ("load_60k", "ivf256_4.tqi", "load, IVF-256 4 bits (60k)"),
         ("load_1m", "f1m_ivf2048_4.tqi", "load, IVF-2048 4 bits (1M)"))
BUILDS = (("fashion flat 3b", "build, flat 3 bits (60k)"), ("fashion flat 4b", "build, flat 4 bits (60k)"),
          ("fashion ivf256 3b", "build, IVF-256 3 bits (60k)"), ("fashion ivf256 4b", "build, IVF-256 4 bits (60k)"))


def rows(run, name):
    return [json.loads(x) for x in open(os.path.join(HERE, run, name + ".jsonl"))]


def load_medians(run, jsonl, fname):
    r = rows(run, jsonl)
    return {lib: statistics.median(x["load_s"] for x in r if x["file"] == fname and x["library"] == lib)
            for lib in ("before", "after")}


def build_medians(run, name):
    r = rows(run, "build_60k")
    return {b: statistics.median(x["build_s"] for x in r if x["set"] == name and x["build"] == b)
            for b in ("before", "after")}


def table(runs=RUNS):
    out = ["| | " + " | ".join(f"{r}: before, after, ratio" for r in runs) + " |", "|---|" + "---:|" * len(runs)]
    for jsonl, fname, label in LOADS:
        cells = []
        for r in runs:
            m = load_medians(r, jsonl, fname)
            cells.append(f"{m['before'] * 1000:.0f} ms, {m['after'] * 1000:.0f} ms, {m['after'] / m['before']:.2f}")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    for name, label in BUILDS:
        cells = []
        for r in runs:
            m = build_medians(r, name)
            cells.append(f"{m['before']:.2f} s, {m['after']:.2f} s, {m['after'] / m['before']:.2f}")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    open(os.path.join(HERE, "table.md"), "w").write(table())
    print(table())
    if AVX2_RUNS:
        open(os.path.join(HERE, "table_avx2.md"), "w").write(table(AVX2_RUNS))
        print(table(AVX2_RUNS))
