#!/usr/bin/env python3
"""Markdown tables for BENCHMARKS.md from the JSON written by `tq perplexity --sweep
--json`, `tq niah --json` and `tq bench model --json` (files under bench/results/)."""
import glob
import json
import os
import re
import sys


def short_label(label):
    """A per-head allocation's label (a `--kv-config` file's, hundreds of characters) as its
    base types and the number of its L entries."""
    if len(label) <= 80:
        return label
    toks = label.split()
    rule = lambda t: (t.startswith("L") or t.startswith("layers=")) and ":" in t
    entries = sum(rule(t) for t in toks)
    return " ".join(t for t in toks if not rule(t)) + f" + {entries} L entries"


def ppl_table(path):
    j = json.load(open(path))
    rows = j["results"]
    ppl_f16 = rows[0]["ppl_f16"]
    f16_bytes = rows[0].get("kv_bytes_per_token_f16", 23040)  # older SmolLM2 runs lack it
    out = [f"ctx {j['ctx']}, {j['chunks']} windows, {j['scored_tokens']} scored tokens, "
           f"{j['threads']} thread(s); f16 perplexity **{ppl_f16:.4f}** ({f16_bytes:.0f} B/token, 16 bits/value)", ""]
    if all("bits_per_value_all" in r for r in rows):
        # Newer runs: bits/value with everything counted (f16 sinks and window rows, means)
        # for a cache holding one full window of ctx tokens. Runs whose JSON carries the spec as
        # asked (kv.spec: model-fitted defaults, `auto`) show it beside what was applied.
        asked = all("spec" in r["kv"] for r in rows)
        first = "| asked | applied on this model (K/V, window, sinks, centring, boundary) " if asked else \
            "| cache (K/V, window, sinks, centring, boundary) "
        out += [first + "| bits/value all counted | bits/value per quantized token | ppl | delta vs f16 | KLD mean | KLD p99 | top-1 agree |",
                "|---" * (2 if asked else 1) + "|---:|---:|---:|---:|---:|---:|---:|"]
        for r in sorted(rows, key=lambda r: (-r["bits_per_value_all"], r["ppl"])):
            cell = f"| {short_label(r['kv']['spec'])} " if asked else ""
            out.append(f"{cell}| {short_label(r['kv']['label'])} | {r['bits_per_value_all']:.3f} | {r['bits_per_value']:.3f} | "
                       f"{r['ppl']:.4f} | {r['ppl_delta_pct']:+.2f}% | {r['kld_mean']:.4f} | {r['kld_p99']:.3f} | "
                       f"{100 * r['top1_agreement']:.2f}% |")
        return "\n".join(out)
    out += ["| cache (K/V, window, boundary) | bits/value | bytes/token | ppl | delta vs f16 | KLD mean | KLD p99 | top-1 agree |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (-r["bits_per_value"], r["ppl"])):
        out.append(f"| {r['kv']['label']} | {r['bits_per_value']:.3f} | {r['kv_bytes_per_token']:.0f} | "
                   f"{r['ppl']:.4f} | {r['ppl_delta_pct']:+.2f}% | {r['kld_mean']:.4f} | {r['kld_p99']:.3f} | "
                   f"{100 * r['top1_agreement']:.2f}% |")
    return "\n".join(out)


def niah_table(paths):
    """One row per `tq niah --json` file: its run tag (the file name between niah_c<ctx>_ and
    _s<seed>.json), the cache, passes, answers, the smallest per-trial margin (logit lead of the
    answer's token over the best other; runs before tq niah reported it: "-") and seconds."""
    out = ["| context | run | cache | passed / trials | answers | least margin | seconds |",
           "|---:|---|---|---:|---|---:|---:|"]
    rows = []
    for p in paths:
        try:
            j = json.load(open(p))
        except Exception:  # run not finished
            continue
        m = re.match(r"niah_c\d+_(.*)_s\d+\.json$", os.path.basename(p))
        rows.append((m.group(1) if m else os.path.basename(p), j))
    for tag, j in sorted(rows, key=lambda r: (r[1]["context"], r[0])):
        ans = "; ".join(f"d{d['depth']}: {d['answer'].strip()!r}" for d in j["details"])
        margins = [(d["margin"], d["depth"]) for d in j["details"] if d.get("margin") is not None]
        least = "-" if not margins else "{:.3f} (d{})".format(*min(margins))
        out.append(f"| {j['context']} | {tag} | {j['kv']['label']} | {j['passed']} / {j['trials']} | {ans} | {least} | "
                   f"{j['seconds']:.0f} |")
    return "\n".join(out)


def speed_table(path):
    j = json.load(open(path))
    out = [f"{j['threads']} threads", "", "| context | cache | prefill tok/s | decode tok/s | prefill vs f16 | decode vs f16 | KV MiB |",
           "|---:|---|---:|---:|---:|---:|---:|"]
    for r in j["rows"]:
        out.append(f"| {r['context']} | {r['cache']} | {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.2f} | "
                   f"{r['prefill_vs_first']:.2f} | {r['decode_vs_first']:.2f} | {r['kv_bytes'] / 2**20:.2f} |")
    return "\n".join(out)


def kv_bytes_table(path):
    """KV bytes a cache holds at the end of each run of a `tq bench model --json` file
    (KvCache::bytes_used), beside a cache that keeps every token of every layer
    (bytes_per_token x tokens appended)."""
    j = json.load(open(path))
    out = ["| tokens | cache | bytes held (MiB) | keeping every token (MiB) | held / every token |",
           "|---:|---|---:|---:|---:|"]
    for r in j["rows"]:
        full = r["kv_bytes_per_token"] * r["kv_tokens"]
        out.append(f"| {r['kv_tokens']} | {r['cache']} | {r['kv_bytes'] / 2**20:.2f} | {full / 2**20:.2f} | "
                   f"{r['kv_bytes'] / full:.4f} |")
    return "\n".join(out)


if __name__ == "__main__":
    d = sys.argv[1] if len(sys.argv) > 1 else "bench/results"
    for p in sorted(glob.glob(f"{d}/ppl_c*.json")):
        try:
            print(f"### {p}\n\n{ppl_table(p)}\n")
        except Exception as e:  # incomplete run
            print(f"### {p}: not readable ({e})\n")
    n = sorted(glob.glob(f"{d}/niah_c*.json"))
    if n:
        print(f"### needle\n\n{niah_table(n)}\n")
    for p in sorted(glob.glob(f"{d}/speed*.json")):
        try:
            print(f"### {p}\n\n{speed_table(p)}\n")
        except Exception as e:
            print(f"### {p}: not readable ({e})\n")
