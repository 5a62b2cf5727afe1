#!/usr/bin/env python3
"""Measured TurboQuant-mse distortion vs bits for every rotation, against the paper's bounds.

Runs `tq distortion --json` (plain norm, as in the paper, and norm-corrected) for d=128,
b=1..8 and writes a Markdown table (stdout) and a PNG plot.

  .venv-plot/bin/python bench/codec_distortion.py --tq build/tq --n 20000 --png docs/img/distortion.png
"""
import argparse
import json
import math
import subprocess

ROTATIONS = ["haar", "hadamard", "block32", "givens", "iso4"]
EXACT = {1: 0.3609, 2: 0.1160, 3: 0.0340, 4: 0.0093}


def run(tq, d, b, rot, n, corr, data="unit"):
    cmd = [tq, "distortion", "-d", str(d), "-b", str(b), "-r", rot, "-n", str(n), "--data", data, "--json"]
    if not corr:
        cmd.append("--no-norm-correction")
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tq", default="build/tq")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--bits", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--png", default="")
    ap.add_argument("--data", default="unit", choices=["unit", "outlier"])
    a = ap.parse_args()
    bits = [int(x) for x in a.bits.split(",")]
    res = {r: {b: run(a.tq, a.dim, b, r, a.n, False, a.data) for b in bits} for r in ROTATIONS}
    corr = {b: run(a.tq, a.dim, b, "hadamard", a.n, True, a.data) for b in bits}
    print(f"d={a.dim}, n={a.n} {a.data} vectors, mse = mean ||u - u_hat||^2 (plain norm)\n")
    print("| bits | " + " | ".join(ROTATIONS) + " | hadamard, norm-corrected | exact (Beta law) | upper bound | lower bound |")
    print("|---" * (len(ROTATIONS) + 5) + "|")
    for b in bits:
        row = [f"{res[r][b]['mse']:.3g}" for r in ROTATIONS]
        up = math.sqrt(3) * math.pi / 2 * 4 ** -b
        ex = f"{EXACT[b]:.4f}" if b in EXACT else ""
        print(f"| {b} | " + " | ".join(row) + f" | {corr[b]['mse']:.3g} | {ex} | {up:.3g} | {4 ** -b:.3g} |")
    if a.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in ROTATIONS:
            ax.semilogy(bits, [res[r][b]["mse"] for b in bits], marker="o", label=r)
        ax.semilogy(bits, [corr[b]["mse"] for b in bits], ls=":", marker="x", label="hadamard, norm-corrected")
        ax.semilogy(bits, [math.sqrt(3) * math.pi / 2 * 4 ** -b for b in bits], "k--", label="paper upper bound")
        ax.semilogy(bits, [4 ** -b for b in bits], "k-.", label="lower bound 4^-b")
        ax.set_xlabel("bits per coordinate")
        ax.set_ylabel("MSE  E||u - u_hat||^2")
        ax.set_title(f"TurboQuant-mse distortion, d={a.dim}, {a.n} {a.data} vectors")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(a.png, dpi=110)


if __name__ == "__main__":
    main()
