#!/usr/bin/env python3
"""Build a turboquant Index on GloVe-100 (100,000 base vectors, 10,000 queries, cosine) and
print recall and queries per second.

Usage: python python/examples/glove_search.py [--data DIR] [--bits 4] [--threads 2]
DIR holds glove100_base.fvecs, glove100_query.fvecs and glove100_gt100.ivecs (default: the
shared copy, ../shared/data/glove100 next to the repository, or $TQ_GLOVE_DIR).
"""
import argparse
import os
import pathlib
import statistics
import time

import numpy as np

import turboquant as tq


def default_dir():
    if os.environ.get("TQ_GLOVE_DIR"):
        return pathlib.Path(os.environ["TQ_GLOVE_DIR"])
    root = pathlib.Path(__file__).resolve().parents[2]
    for c in (root.parent / "shared" / "data" / "glove100", root.parents[1] / "shared" / "data" / "glove100"):
        if c.exists():
            return c
    return root.parent / "shared" / "data" / "glove100"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=pathlib.Path, default=default_dir())
    ap.add_argument("--bits", type=float, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()

    base = tq.read_vectors(str(a.data / "glove100_base.fvecs"))
    queries = tq.read_vectors(str(a.data / "glove100_query.fvecs"))
    gt = tq.read_ivecs(str(a.data / "glove100_gt100.ivecs"))

    index = tq.Index(base.shape[1], bits=a.bits, metric="cosine")
    t0 = time.perf_counter()
    index.add(base)
    build_s = time.perf_counter() - t0
    print(index)

    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        scores, ids = index.search(queries, a.k, threads=a.threads)
        times.append(time.perf_counter() - t0)
    qps = len(queries) / statistics.median(times)

    recall_1 = np.mean(np.any(ids == gt[:, :1], axis=1))  # true top-1 among the k returned
    recall_k = np.mean([len(np.intersect1d(ids[i], gt[i, : a.k])) / a.k for i in range(len(queries))])
    print(f"n={len(base)} nq={len(queries)} d={base.shape[1]} bits={a.bits} threads={a.threads} "
          f"bytes/vector={index.code_bytes} build={build_s:.2f}s")
    print(f"recall_1@{a.k}={recall_1:.4f} recall_{a.k}@{a.k}={recall_k:.4f} QPS={qps:.0f} "
          f"(median of {a.reps} searches)")


if __name__ == "__main__":
    main()
