#!/usr/bin/env python3
"""What editing a turboquant.Index costs on GloVe-100 at 1M: remove_ids of a share of the
vectors, and adding them back, beside the build and a search of the queries, all in one
process. Each round removes a fresh seeded random share, times it, adds the same vectors back
with their ids and times that; recall_10@10 is measured on the built index and after every
round (the re-added vectors sit at the ends of their lists, so ids tied in score may trade
places; the recall must not move).

    PYTHONPATH=build/python .venv/bin/python bench/index_edit.py --threads 2 --rounds 3 \
        --out bench/results/glove1m/index_edit

Data: data/bench/glove1m_base.fvecs, glove1m_q1000.fvecs, glove1m_gt1000.ivecs (written by
`bench/search_vs_faiss.py --dataset glove1m --nq 1000`). Indexes: the flat default (4 bits,
center, fit-scale) and IVF (--nlist lists, nprobe --nprobe). Writes OUT.json (every round,
medians) and OUT.md (the table BENCHMARKS.md includes).
"""
import argparse
import json
import os
import pathlib
import statistics
import time

import numpy as np

import turboquant as tq

ROOT = pathlib.Path(__file__).resolve().parents[1]


def recall10(ids, gt):
    return float(np.mean([len(set(ids[i, :10]) & set(gt[i, :10])) / 10 for i in range(len(gt))]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=pathlib.Path, default=ROOT / "data" / "bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--share", type=float, default=0.01, help="share of the vectors removed per round")
    ap.add_argument("--nlist", type=int, default=1024)
    ap.add_argument("--nprobe", type=int, default=32)
    ap.add_argument("--max-n", type=int, default=0, help="use only the first N base vectors (0: all)")
    ap.add_argument("--out", type=pathlib.Path, default=None)
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    x = tq.read_vectors(str(a.data / "glove1m_base.fvecs"))
    if a.max_n:
        x = np.ascontiguousarray(x[:a.max_n])
    q = tq.read_vectors(str(a.data / "glove1m_q1000.fvecs"))
    gt = tq.read_ivecs(str(a.data / "glove1m_gt1000.ivecs"))
    if a.max_n:  # ground truth of the full base does not hold for a prefix
        gt = None
    n, d = x.shape
    ids = np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(7)
    out = {"n": n, "dim": d, "nq": len(q), "threads": a.threads, "share": a.share, "rounds": a.rounds,
           "indexes": []}
    for name, kw, nprobe in [("flat", {}, 1), (f"ivf{a.nlist}", {"nlist": a.nlist}, a.nprobe)]:
        idx = tq.Index(d, bits=4, **kw)
        t0 = time.perf_counter()
        idx.add(x, ids)
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        _, got = idx.search(q, 10, threads=a.threads, nprobe=nprobe)
        search_s = time.perf_counter() - t0
        r_built = recall10(got, gt) if gt is not None else None
        rounds = []
        for r in range(a.rounds):
            gone = np.sort(rng.choice(n, size=int(n * a.share), replace=False)).astype(np.int64)
            t0 = time.perf_counter()
            removed = idx.remove_ids(gone)
            remove_s = time.perf_counter() - t0
            assert removed == len(gone) and len(idx) == n - len(gone)
            t0 = time.perf_counter()
            idx.add(np.ascontiguousarray(x[gone]), gone)
            readd_s = time.perf_counter() - t0
            _, got = idx.search(q, 10, threads=a.threads, nprobe=nprobe)
            rounds.append({"remove_s": remove_s, "readd_s": readd_s,
                           "recall_10_at_10": recall10(got, gt) if gt is not None else None})
            print(f"{name} round {r}: remove {len(gone)} in {remove_s:.3f} s, add back {readd_s:.3f} s", flush=True)
        med = {k: statistics.median(rr[k] for rr in rounds) for k in ("remove_s", "readd_s")}
        entry = {"index": idx.describe_search(nprobe=nprobe), "build_s": build_s, "search_s": search_s,
                 "nprobe": nprobe, "removed_per_round": int(n * a.share), "recall_10_at_10_built": r_built,
                 "rounds": rounds, "median": med}
        out["indexes"].append(entry)
        print(json.dumps({k: v for k, v in entry.items() if k != "rounds"}), flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")
        rows = ["| index | build (s) | search of the queries (s) | remove 1% (s) | add them back (s) | R10@10 built | after the rounds |",
                "|---|---|---|---|---|---|---|"]
        for e in out["indexes"]:
            after = [rr["recall_10_at_10"] for rr in e["rounds"]]
            rows.append(f"| {e['index']} | {e['build_s']:.1f} | {e['search_s']:.3f} | {e['median']['remove_s']:.3f} | "
                        f"{e['median']['readd_s']:.3f} | {e['recall_10_at_10_built']:.4f} | "
                        f"{', '.join(f'{v:.4f}' for v in after)} |")
        a.out.with_suffix(".md").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
