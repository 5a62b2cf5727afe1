#!/usr/bin/env python3
"""Medians and ratios of bench/results/release_off/run*/ (run.sh): release / keep time per file
and search, and the memory each build holds -> table.md (BENCHMARKS.md includes it)."""
import glob
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = sorted(d for d in os.listdir(HERE) if d.startswith("run") and os.path.isdir(os.path.join(HERE, d)))
SEARCHES = (  # (jsonl, file, label)
    ("flat_off", "flat3.tqi", "flat, 3 bits"),
    ("flat_off", "flat4.tqi", "flat, 4 bits"),
    ("ivf_off_np4", "ivf256_3.tqi", "IVF-256, 3 bits, nprobe 4"),
    ("ivf_off_np16", "ivf256_3.tqi", "IVF-256, 3 bits, nprobe 16"),
    ("ivf_off_np4", "ivf256_4.tqi", "IVF-256, 4 bits, nprobe 4"),
    ("ivf_off_np16", "ivf256_4.tqi", "IVF-256, 4 bits, nprobe 16"),
    ("p256_off_np4", "p256_ivf256_4.tqi", "d = 256 IVF-256, 4 bits, nprobe 4"),
    ("p256_off_np16", "p256_ivf256_4.tqi", "d = 256 IVF-256, 4 bits, nprobe 16"),
    ("load_off", "flat3.tqi", "load (`load_s`), flat, 3 bits"),
    ("load_off", "ivf256_3.tqi", "load (`load_s`), IVF-256, 3 bits"),
)


def ratio(run, jsonl, fname):
    rows = [json.loads(x) for x in open(os.path.join(HERE, run, jsonl + ".jsonl"))]
    field = "load_s" if jsonl.startswith("load") else "search_s"
    m = {lib: statistics.median(r[field] for r in rows if r["file"] == fname and r["library"] == lib)
         for lib in ("keep", "release")}
    return m["release"] / m["keep"]


def memory(run):
    return {(r["file"], r["two_level"]): r["memory_bytes_per_vector"]
            for r in (json.loads(x) for x in open(os.path.join(HERE, run, "memory.jsonl")))}


def table():
    out = ["| index, search | " + " | ".join(RUNS) + " |", "|---|" + "---:|" * len(RUNS)]
    for jsonl, fname, label in SEARCHES:
        out.append(f"| {label} | " + " | ".join(f"{ratio(r, jsonl, fname):.2f}" for r in RUNS) + " |")
    mem = memory(RUNS[0])
    out += ["", "| index | memory, plane kept (B/vector) | freed |", "|---|---:|---:|"]
    for f, label in (("flat3", "flat, 3 bits"), ("flat4", "flat, 4 bits"), ("ivf256_3", "IVF-256, 3 bits"),
                     ("ivf256_4", "IVF-256, 4 bits"), ("p256_ivf256_4", "d = 256 IVF-256, 4 bits")):
        out.append(f"| {label} | {mem[(f, 'auto')]:.0f} | {mem[(f, 'off')]:.0f} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    open(os.path.join(HERE, "table.md"), "w").write(table())
    print(table())
