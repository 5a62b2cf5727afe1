#!/usr/bin/env python3
"""Index.search from Python against the CLI on the same data and threads (BENCHMARKS.md).

Alternates, --rounds times: `tq index eval ... --reps R --json` (its qps: the median of R
timed searches of all queries), then R timed Index.search calls on an index built here with
the same options (median). Prints each round and the medians over rounds of both, and their
ratio. Recall is checked to be identical (same codes, same search).

Usage: python python/examples/qps_vs_cli.py --tq build/tq [--data DIR] [--threads 2] [--k 10]
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import time

import numpy as np

import turboquant as tq
from glove_search import default_dir


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tq", type=pathlib.Path, required=True, help="the tq CLI binary")
    ap.add_argument("--data", type=pathlib.Path, default=default_dir())
    ap.add_argument("--bits", type=float, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--k", type=int, default=10, help=">= 10")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nq", type=int, default=0, help="use only the first NQ queries (0: all; CLI --max-queries)")
    a = ap.parse_args()
    base_f, q_f, gt_f = (a.data / n for n in ("glove100_base.fvecs", "glove100_query.fvecs", "glove100_gt100.ivecs"))
    base = tq.read_vectors(str(base_f))
    queries = tq.read_vectors(str(q_f))
    gt = tq.read_ivecs(str(gt_f))
    if a.nq:
        queries, gt = np.ascontiguousarray(queries[: a.nq]), np.ascontiguousarray(gt[: a.nq])
    index = tq.Index(base.shape[1], bits=a.bits, metric="cosine")
    index.add(base)
    cli_qps, py_qps = [], []
    for r in range(a.rounds):
        out = subprocess.run([str(a.tq), "index", "eval", "--base", str(base_f), "--queries", str(q_f), "--gt",
                              str(gt_f), "--bits", str(a.bits), "--metric", "cosine", "--threads", str(a.threads),
                              "--k-max", str(a.k), "--reps", str(a.reps), "--json"]
                             + (["--max-queries", str(a.nq)] if a.nq else []),
                             capture_output=True, text=True, check=True)
        cli = json.loads(out.stdout)
        times = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            _, ids = index.search(queries, a.k, threads=a.threads)
            times.append(time.perf_counter() - t0)
        py = len(queries) / statistics.median(times)
        # recall_10_at_10 as the CLI computes it: share of the true top 10 among the 10 returned
        r10 = float(np.mean([len(np.intersect1d(ids[i, :10], gt[i, :10])) / 10 for i in range(len(queries))]))
        cli_qps.append(cli["qps"])
        py_qps.append(py)
        print(f"round {r}: cli qps {cli['qps']:.0f}  python qps {py:.0f}  recall_10@10 python {r10:.4f} "
              f"cli {cli['recall_10_at_10']:.4f}")
    c, p = statistics.median(cli_qps), statistics.median(py_qps)
    print(f"median over {a.rounds} rounds: cli {c:.0f} QPS, python {p:.0f} QPS, python/cli = {p / c:.3f} "
          f"(n={len(base)} nq={len(queries)} d={base.shape[1]} bits={a.bits} k={a.k} threads={a.threads})")


if __name__ == "__main__":
    main()
