#!/usr/bin/env python3
"""Medians of bench/results/speed_recommended/ (run.sh): per context and cache, the median over
the rounds of tok/s and of the ratio to f16 in the same process -> table.md (BENCHMARKS.md
includes it)."""
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
KINDS = (("lut8", "lookup-table kernel (`--attn-lut8`)"), ("float", "default float kernel"))
NAMES = {"f16": "f16", "@configs/smollm2-135m-kv4.25.kv": "4.25-bit file", "auto": "`auto`"}


def rounds(kind):
    files = sorted(f for f in os.listdir(HERE) if f.startswith(kind + "_r") and f.endswith(".json"))
    return [json.load(open(os.path.join(HERE, f))) for f in files]


def table():
    out = ["| context | cache | kernel | prefill tok/s | decode tok/s | prefill vs f16, per round (median) "
           "| decode vs f16, per round (median) | KV MiB |", "|---:|---|---|---:|---:|---|---|---:|"]
    lines = []
    for kind, kernel in KINDS:
        rs = rounds(kind)
        for i, row in enumerate(rs[0]["rows"]):
            kern = "its own" if row["cache"] == "f16" else kernel
            got = [r["rows"][i] for r in rs]
            assert all(g["cache"] == row["cache"] and g["context"] == row["context"] for g in got)

            def med(key):
                return statistics.median(g[key] for g in got)

            def per(key):
                return ", ".join(f"{g[key]:.2f}" for g in got) + f" ({med(key):.2f})"
            cells = [str(row["context"]), NAMES[row["cache"]] + ("" if row["cache"] != "f16" else f" ({kind} run)"),
                     kern, f"{med('prefill_tok_s'):.0f}", f"{med('decode_tok_s'):.1f}",
                     "1" if row["cache"] == "f16" else per("prefill_vs_first"),
                     "1" if row["cache"] == "f16" else per("decode_vs_first"), f"{row['kv_bytes'] / 2**20:.2f}"]
            lines.append((row["context"], kind != "lut8", i, "| " + " | ".join(cells) + " |"))
    out += [l for *_, l in sorted(lines)]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    open(os.path.join(HERE, "table.md"), "w").write(table())
    print(table())
