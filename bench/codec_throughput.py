#!/usr/bin/env python3
"""Codec throughput table: `tq bench codec --json` for d in {64, 128, 1536}, b in {2, 3, 4}
and every rotation, one thread by default. Prints a Markdown table.

  python3 bench/codec_throughput.py --tq build/tq --threads 1 > bench/results/codec_throughput.md
"""
import argparse
import json
import subprocess

ROTATIONS = ["hadamard", "block32", "haar", "givens", "iso4"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tq", default="build/tq")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dims", default="64,128,1536")
    ap.add_argument("--bits", default="2,3,4")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    print(f"threads={a.threads}, median of {a.reps} runs, vectors per second (M = 10^6)\n")
    print("| d | bits | rotation | simd | encode | decode | score |")
    print("|---|---|---|---|---|---|---|")
    for d in [int(x) for x in a.dims.split(",")]:
        n = max(10000, 12_800_000 // d)
        for b in [int(x) for x in a.bits.split(",")]:
            for r in ROTATIONS:
                out = subprocess.run([a.tq, "bench", "codec", "-d", str(d), "-b", str(b), "-r", r, "-n", str(n),
                                      "-t", str(a.threads), "--reps", str(a.reps), "--json"],
                                     check=True, capture_output=True, text=True).stdout
                j = json.loads(out)
                f = lambda v: f"{v / 1e6:.2f} M"
                print(f"| {d} | {b} | {r} | {j['simd']} | {f(j['encode_vectors_per_s'])} | "
                      f"{f(j['decode_vectors_per_s'])} | {f(j['score_codes_per_s'])} |", flush=True)


if __name__ == "__main__":
    main()
