#!/usr/bin/env python3
"""Fashion-MNIST projected to lower dimensions, for measuring where a search method's speed
changes with d on one data set: base and queries times one seeded Gaussian matrix (784 x d,
entries N(0, 1/d)), exact L2 ground truth (top 100); with --cosine also the exact cosine ground
truth, of the projections and of the original vectors.

Writes data/bench/fashion_p{D}_base.fvecs, _q1000.fvecs and _gt1000.ivecs for each D
(--cosine: also fashion_p{D}_cosgt1000.ivecs and fashion_cosgt1000.ivecs, the original d = 784).
Usage: python bench/fashion_projections.py [--cosine] 128 192 256 384 512
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


def ground_truth(b, q, cosine):
    """Ids of the 100 nearest rows of b for each row of q (L2, or cosine), in float64."""
    b, q = b.astype(np.float64), q.astype(np.float64)
    if cosine:
        b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-300)
        q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-300)
    bn = (b ** 2).sum(1)
    gt = np.empty((len(q), 100), dtype=np.int32)
    for i in range(0, len(q), 100):
        dist = -(q[i:i + 100] @ b.T) if cosine else bn[None, :] - 2 * (q[i:i + 100] @ b.T)
        gt[i:i + 100] = np.argsort(dist, axis=1, kind="stable")[:, :100]
    return gt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dims", type=int, nargs="+")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--cosine", action="store_true", help="also write cosine ground truth")
    args = ap.parse_args()
    xb = read_vecs(os.path.join(REPO, "data", "fashion-mnist", "train.bvecs"), np.uint8)
    xq = read_vecs(os.path.join(REPO, "data", "bench", "fashion_q1000.fvecs"), np.float32)
    rng = np.random.default_rng(args.seed)
    for d in args.dims:
        if not 2 <= d <= xb.shape[1]:
            raise SystemExit(f"dimension {d} outside [2, {xb.shape[1]}]")
        p = (rng.standard_normal((xb.shape[1], d)) / np.sqrt(d)).astype(np.float32)
        b, q = xb @ p, xq @ p
        stem = os.path.join(REPO, "data", "bench", f"fashion_p{d}")
        write_vecs(stem + "_base.fvecs", b, np.float32)
        write_vecs(stem + "_q1000.fvecs", q, np.float32)
        write_vecs(stem + "_gt1000.ivecs", ground_truth(b, q, False), np.int32)
        if args.cosine:
            write_vecs(stem + "_cosgt1000.ivecs", ground_truth(b, q, True), np.int32)
        print(f"d={d}: {stem}_{{base,q1000,gt1000}}")
    if args.cosine:
        path = os.path.join(REPO, "data", "bench", "fashion_cosgt1000.ivecs")
        write_vecs(path, ground_truth(xb, xq, True), np.int32)
        print(f"d=784 (the original vectors), cosine: {path}")


if __name__ == "__main__":
    main()
