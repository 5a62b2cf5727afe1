#!/usr/bin/env python3
"""turboquant.ShardedIndex (2 shards, Ray actors) against one turboquant.Index on GloVe-100:
build time and search QPS, same process, rounds alternating the two; every round checks that
the sharded search returns the single index's ids and scores bit for bit.

    PYTHONPATH=build/python .venv/bin/python bench/sharded_ray.py --rounds 5 \
        --out bench/results/sharded_ray

Ray: a local cluster of --cpus CPUs (loopback, no dashboard) started here; each shard actor runs
its OpenMP with 1 thread (Ray sets OMP_NUM_THREADS=1 in actors without num_cpus), the single
index with --threads threads (build: OpenMP's default in this process; search: threads=).
Writes OUT.json (every round, medians, load average) and OUT.md (the table BENCHMARKS.md
includes).
"""
import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import numpy as np

import turboquant as tq

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python" / "examples"))
from glove_search import default_dir  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=pathlib.Path, default=default_dir())
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="threads of the single index's search")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--bits", type=float, default=4)
    ap.add_argument("--out", type=pathlib.Path, default=None)
    a = ap.parse_args()
    import ray

    x = tq.read_vectors(str(a.data / "glove100_base.fvecs"))
    q = tq.read_vectors(str(a.data / "glove100_query.fvecs"))
    gt = tq.read_ivecs(str(a.data / "glove100_gt100.ivecs"))[:, :a.k]
    ray.init(address="local", num_cpus=a.cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    rounds = []
    for r in range(a.rounds):
        t0 = time.perf_counter()
        single = tq.Index(x.shape[1], bits=a.bits)
        single.add(x)
        t_single_build = time.perf_counter() - t0

        t0 = time.perf_counter()
        sharded = tq.ShardedIndex(x.shape[1], a.shards, bits=a.bits)
        assert sharded.shard_sizes() == [0] * a.shards  # waits for the actors (not part of the build)
        t_actors = time.perf_counter() - t0
        t0 = time.perf_counter()
        sharded.add(x)
        t_sharded_build = time.perf_counter() - t0

        t0 = time.perf_counter()
        s1, i1 = single.search(q, a.k, threads=a.threads)
        t_single_search = time.perf_counter() - t0
        t0 = time.perf_counter()
        s2, i2 = sharded.search(q, a.k, threads=1)
        t_sharded_search = time.perf_counter() - t0
        equal = bool(np.array_equal(i1, i2) and s1.tobytes() == s2.tobytes())
        if not equal:
            sys.exit("sharded results differ from the single index's")
        recall = float(np.mean([len(set(i1[j]) & set(gt[j])) / a.k for j in range(len(q))]))
        sharded.close()
        row = {"round": r, "single_build_s": t_single_build, "sharded_build_s": t_sharded_build,
               "actor_start_s": t_actors, "single_qps": len(q) / t_single_search,
               "sharded_qps": len(q) / t_sharded_search, "equal": equal, "recall_10_at_10": recall,
               "loadavg_1min": os.getloadavg()[0]}
        rounds.append(row)
        print(json.dumps(row), flush=True)
    ray.shutdown()
    med = {key: statistics.median(r[key] for r in rounds)
           for key in ("single_build_s", "sharded_build_s", "actor_start_s", "single_qps", "sharded_qps")}
    res = {"n": int(x.shape[0]), "dim": int(x.shape[1]), "nq": int(q.shape[0]), "k": a.k, "bits": a.bits,
           "metric": "cosine", "shards": a.shards, "ray_cpus": a.cpus, "single_search_threads": a.threads,
           "shard_threads": 1, "ray_version": ray.__version__, "index": single.describe(),
           "rounds": rounds, "median": med,
           "build_ratio_sharded_over_single": med["sharded_build_s"] / med["single_build_s"],
           "qps_ratio_sharded_over_single": med["sharded_qps"] / med["single_qps"],
           "all_equal": all(r["equal"] for r in rounds), "recall_10_at_10": rounds[0]["recall_10_at_10"]}
    print(json.dumps(res["median"]), res["build_ratio_sharded_over_single"], res["qps_ratio_sharded_over_single"])
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
        lines = ["| round | single build s | sharded build s | single QPS | sharded QPS | same ids and scores |",
                 "|---|---|---|---|---|---|"]
        for r in rounds:
            lines.append(f"| {r['round']} | {r['single_build_s']:.2f} | {r['sharded_build_s']:.2f} | "
                         f"{r['single_qps']:.0f} | {r['sharded_qps']:.0f} | {'yes' if r['equal'] else 'NO'} |")
        lines.append(f"| median | {med['single_build_s']:.2f} | {med['sharded_build_s']:.2f} | "
                     f"{med['single_qps']:.0f} | {med['sharded_qps']:.0f} | |")
        a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
