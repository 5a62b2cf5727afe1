#!/usr/bin/env python3
"""Fashion-MNIST projected to lower dimensions, for measuring where a search method's speed
changes with d on one data set: base and queries times one seeded Gaussian matrix (784 x d,
entries N(0, 1/d)), exact L2 ground truth (top 100).

Writes data/bench/fashion_p{D}_base.fvecs, _q1000.fvecs and _gt1000.ivecs for each D.
Usage: python bench/fashion_projections.py 128 192 256 384 512
(needs scripts/fetch-fashion-mnist.sh and data/bench/fashion_q1000.fvecs, which
bench/search_vs_faiss.py --dataset fashion writes)."""
import argparse
import os

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_vecs(path, dtype):
    a = np.fromfile(path, dtype=np.uint8)
    d = int(np.frombuffer(a[:4].tobytes(), dtype=np.int32)[0])
    width = np.dtype(dtype).itemsize
    rows = a.reshape(-1, 4 + d * width)[:, 4:]
    return np.ascontiguousarray(rows).view(dtype).astype(np.float32)


def write_vecs(path, x, dtype):
    n, d = x.shape
    out = np.empty((n, d + 1), dtype=dtype)
    out.view(np.int32)[:, 0] = d
    out[:, 1:] = x
    tmp = path + ".tmp"
    out.tofile(tmp)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dims", type=int, nargs="+")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    xb = read_vecs(os.path.join(REPO, "data", "fashion-mnist", "train.bvecs"), np.uint8)
    xq = read_vecs(os.path.join(REPO, "data", "bench", "fashion_q1000.fvecs"), np.float32)
    rng = np.random.default_rng(args.seed)
    for d in args.dims:
        if not 2 <= d <= xb.shape[1]:
            raise SystemExit(f"dimension {d} outside [2, {xb.shape[1]}]")
        p = (rng.standard_normal((xb.shape[1], d)) / np.sqrt(d)).astype(np.float32)
        b, q = xb @ p, xq @ p
        bn = (b.astype(np.float64) ** 2).sum(1)
        gt = np.empty((len(q), 100), dtype=np.int32)
        for i in range(0, len(q), 100):
            dist = bn[None, :] - 2 * (q[i:i + 100].astype(np.float64) @ b.T.astype(np.float64))
            gt[i:i + 100] = np.argsort(dist, axis=1, kind="stable")[:, :100]
        stem = os.path.join(REPO, "data", "bench", f"fashion_p{d}")
        write_vecs(stem + "_base.fvecs", b, np.float32)
        write_vecs(stem + "_q1000.fvecs", q, np.float32)
        write_vecs(stem + "_gt1000.ivecs", gt, np.int32)
        print(f"d={d}: {stem}_{{base,q1000,gt1000}}")


if __name__ == "__main__":
    main()
