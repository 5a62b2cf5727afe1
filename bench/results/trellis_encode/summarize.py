#!/usr/bin/env python3
"""After / before CPU time of the trellis encoder, bench/results/trellis_encode/ (run.sh): per
level, dim and bits, the rounds' ratios of the medians and their median -> table.md
(BENCHMARKS.md includes it)."""
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
LEVELS = (("avx512", "AVX-512 (the host's)"), ("avx2", "AVX2 (`TQ_SIMD=avx2`)"))


def medians(path):
    """{(dim, bits): median CPU ns per 256 vectors} of one run."""
    out = {}
    for b in json.load(open(path))["benchmarks"]:
        if b.get("aggregate_name") == "median":
            _, dim, bits = b["run_name"].split("/")
            out[(int(dim), int(bits))] = b["cpu_time"]
    return out


def rounds(level):
    n = sorted(int(f.split("_r")[1].split("_")[0]) for f in os.listdir(HERE)
               if f.startswith(level + "_r") and f.endswith("_before.json"))
    return [(medians(os.path.join(HERE, f"{level}_r{r}_before.json")),
             medians(os.path.join(HERE, f"{level}_r{r}_after.json"))) for r in n]


def ratios(level):
    """{(dim, bits): [after / before per round]} and the us per vector before / after (medians)."""
    rs = rounds(level)
    keys = sorted(rs[0][0], key=lambda k: (k[1], k[0]))
    return {k: ([a[k] / b[k] for b, a in rs], statistics.median(b[k] for b, _ in rs) / 256 / 1000,
                statistics.median(a[k] for _, a in rs) / 256 / 1000) for k in keys}


def table():
    out = ["| bits | dim | " + " | ".join(f"{name}: before, after (us a vector), after / before per round (median)"
                                          for _, name in LEVELS) + " |",
           "|---:|---:|" + "---|" * len(LEVELS)]
    per = {lv: ratios(lv) for lv, _ in LEVELS}
    for k in per["avx512"]:
        cells = []
        for lv, _ in LEVELS:
            rr, b, a = per[lv][k]
            cells.append(f"{b:.1f}, {a:.1f}, " + " / ".join(f"{x:.2f}" for x in rr) + f" ({statistics.median(rr):.2f})")
        out.append(f"| {k[1]} | {k[0]} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    open(os.path.join(HERE, "table.md"), "w").write(table())
    print(table())
