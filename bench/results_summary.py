"""Writing a results directory's summary: summary.json (indented, one trailing newline) and the
markdown tables a BENCHMARKS.md section includes, by the summarize.py scripts under
bench/results/ (each recomputed by a test, so what they write is exactly what they compute)."""
import json
import os
import statistics


def write(here, summ, tables):
    """summary.json of summ in here, and each {file name: markdown} of tables beside it."""
    with open(os.path.join(here, "summary.json"), "w") as f:
        json.dump(summ, f, indent=1)
        f.write("\n")
    for name, text in tables.items():
        with open(os.path.join(here, name), "w") as f:
            f.write(text)


def index_ab(rows, field, a="before", b="after"):
    """Per index file of bench/index_ab.sh's JSON lines (rows), in first-seen order and keyed by
    its name without ".tqi": the runs of b, the median field of each build and b / a."""
    out = {}
    for f in dict.fromkeys(r["file"] for r in rows):
        med = {lib: statistics.median(r[field] for r in rows if r["file"] == f and r["library"] == lib) for lib in (a, b)}
        out[f.removesuffix(".tqi")] = {"runs_each": sum(r["file"] == f and r["library"] == b for r in rows),
                                       f"{a}_s": med[a], f"{b}_s": med[b], "ratio": med[b] / med[a]}
    return out


def fmt_name(n):
    """bench_qmatvec's run_fmt/simd/Q8_0/640x2048 -> Q8_0_640x2048 (a bench_ab key)."""
    return n.replace("run_fmt/simd/", "").replace("/", "_")


def bench_ab(here, field, unit, name, runs=3, builds=("old", "new")):
    """Per benchmark of Google Benchmark JSON runs bq_{build}_{i}.json (i = 1..runs, the builds
    alternating) in here, keyed by name(benchmark name): the runs each build had, the median
    field ("cpu_time" or "real_time", in the files' time unit, named by unit in the keys) of each
    build's iterations (repetitions pooled; aggregates left out) and new / old."""
    res = {}
    for b in builds:
        for i in range(1, runs + 1):
            with open(os.path.join(here, f"bq_{b}_{i}.json")) as f:
                for r in json.load(f)["benchmarks"]:
                    if r.get("run_type", "iteration") == "iteration":
                        res.setdefault(name(r["name"]), {}).setdefault(b, []).append(r[field])
    a, b = builds
    return {k: {"runs_each": runs, f"{a}_{unit}": statistics.median(v[a]), f"{b}_{unit}": statistics.median(v[b]),
                "ratio": statistics.median(v[b]) / statistics.median(v[a])} for k, v in sorted(res.items())}
