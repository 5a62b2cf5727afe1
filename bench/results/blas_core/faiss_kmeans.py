#!/usr/bin/env python3
"""FAISS's k-means of Fashion-MNIST (60,000 x 784, 256 lists, 10 iterations, at most 256 points a
centroid: the coarse step bench/ivf_vs_faiss.py times) on the kernels the OpenBLAS of FAISS's
wheel picks by itself and on those the comparison scripts set (bench/blas_env.py), alternating,
each in a fresh interpreter. Writes faiss_kmeans.json next to this file.
Run: .venv/bin/python bench/results/blas_core/faiss_kmeans.py [--rounds 3]"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
CHILD = r"""
import sys, time
sys.path.insert(0, %r)
import blas_env, numpy as np, faiss
import search_vs_faiss as svf
x = svf.read_vecs(%r, np.uint8).astype(np.float32)
faiss.omp_set_num_threads(2)
t = time.perf_counter()
faiss.Kmeans(x.shape[1], 256, niter=10, seed=1234, max_points_per_centroid=256).train(x)
print(blas_env.faiss_blas_core(), time.perf_counter() - t)
""" % (os.path.join(REPO, "bench"), os.path.join(REPO, "data", "fashion-mnist", "train.bvecs"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import blas_env
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "TQ_NO_REEXEC")}
    lib = blas_env.faiss_openblas()
    rule = blas_env._rule()
    os.environ.pop("OPENBLAS_CORETYPE", None)
    want = rule.choose(lib, probe_import="faiss")
    if not want:
        sys.exit("FAISS's OpenBLAS does not fall back here: nothing to compare")
    runs = []
    for r in range(args.rounds):
        for side in (("own", env), ("set", dict(env, OPENBLAS_CORETYPE=want)))[:: 1 if r % 2 == 0 else -1]:
            out = subprocess.run([sys.executable, "-c", CHILD], env=side[1], capture_output=True, text=True, check=True)
            core, s = out.stdout.split()
            runs.append(dict(round=r + 1, kernels=side[0], blas_core=core, kmeans_s=float(s)))
            print(runs[-1], flush=True)
    med = {k: statistics.median(x["kmeans_s"] for x in runs if x["kernels"] == k) for k in ("own", "set")}
    res = dict(runs=runs, median_s=med, ratio=med["set"] / med["own"], load_avg_end=os.getloadavg())
    with open(os.path.join(HERE, "faiss_kmeans.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res["median_s"]), res["ratio"])


if __name__ == "__main__":
    main()
