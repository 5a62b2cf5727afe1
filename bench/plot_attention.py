#!/usr/bin/env python3
"""Context sweep of decode attention per KV cache type: runs `tq bench attention --json` once
per context length (all types side by side in each run), writes the raw JSON, a markdown
table and a PNG plot of ms/step vs context.

  python3 bench/plot_attention.py --tq build/tq --out bench/results/kv/kv_sweep \\
      --contexts 1024,2048,4096,8192,16384,32768,65536,131072 \\
      --kv f16,q8_0,q4_0,q4_0h,tq3,tq4 --threads 1,2 --steps 5

Outputs <out>.json, <out>.md and <out>.png (matplotlib needed only for the PNG).
"""
import argparse
import datetime
import json
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tq", default="build/tq")
    ap.add_argument("--out", default="bench/results/kv/kv_sweep")
    ap.add_argument("--contexts", default="1024,2048,4096,8192,16384,32768,65536,131072")
    ap.add_argument("--kv", default="f16,q8_0,q4_0,q4_0h,tq3,tq4")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--n-heads", type=int, default=32)
    ap.add_argument("--n-kv-heads", type=int, default=8)
    ap.add_argument("--from-json", help="re-plot an existing <out>.json without running")
    a = ap.parse_args()

    if a.from_json:
        with open(a.from_json) as f:
            runs = json.load(f)["runs"]
    else:
        runs = []
        for n in [int(x) for x in a.contexts.split(",")]:
            cmd = [a.tq, "bench", "attention", "--context", str(n), "--kv", a.kv, "--threads", a.threads,
                   "--steps", str(a.steps), "--head-dim", str(a.head_dim), "--n-heads", str(a.n_heads),
                   "--n-kv-heads", str(a.n_kv_heads), "--no-ref", "--err-queries", "1", "--json"]
            print(" ".join(cmd), file=sys.stderr, flush=True)
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs.append(json.loads(out))
        with open(a.out + ".json", "w") as f:
            json.dump({"date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), "runs": runs}, f, indent=1)

    types = [r["kv"] for r in runs[0]["results"] if r["threads"] == runs[0]["results"][0]["threads"]]
    threads = sorted({r["threads"] for r in runs[0]["results"]})
    lines = []
    for stat, label in (("ms_per_step", "median"), ("ms_min", "best of the steps")):
        for t in threads:
            lines.append(f"ms per decode step ({label}), {t} thread(s); in brackets: f16 time / type time, same run\n")
            lines.append("| context | " + " | ".join(types) + " |")
            lines.append("|---:|" + "---:|" * len(types))
            for run in runs:
                res = {r["kv"]: r for r in run["results"] if r["threads"] == t}
                f16 = res.get("f16", {}).get(stat)
                cells = []
                for k in types:
                    v = res[k][stat]
                    cells.append(f"{v:.2f}" + (f" ({f16 / v:.2f}x)" if f16 and k != "f16" else ""))
                lines.append(f"| {run['context']} | " + " | ".join(cells) + " |")
            lines.append("")
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG", file=sys.stderr)
        return
    for stat, suffix, label in (("ms_per_step", "", "median"), ("ms_min", "_min", "best of steps")):
        fig, axes = plt.subplots(1, len(threads), figsize=(6 * len(threads), 4.5), squeeze=False)
        for ax, t in zip(axes[0], threads):
            for k in types:
                xs = [run["context"] for run in runs]
                ys = [next(r[stat] for r in run["results"] if r["kv"] == k and r["threads"] == t) for run in runs]
                ax.plot(xs, ys, marker="o", label=k)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("context (tokens)")
            ax.set_ylabel(f"ms per decode step ({label})")
            r0 = runs[0]
            ax.set_title(f"decode attention D={r0['head_dim']}, {r0['n_heads']}q/{r0['n_kv_heads']}kv heads, {t} thr")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        fig.tight_layout()
        fig.savefig(a.out + suffix + ".png", dpi=100)
        print("wrote", a.out + suffix + ".png", file=sys.stderr)


if __name__ == "__main__":
    main()
