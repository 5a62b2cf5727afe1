#!/usr/bin/env python3
"""Recall-QPS curves: tq IVF (tq index eval --ivf --nprobe sweep) against FAISS IndexIVFRaBitQ,
IndexIVFRaBitQFastScan, IndexIVFPQFastScan and IndexHNSWFlat, on the same data, the same
threads, in the same run; memory per vector, build time, and the load time of a saved
(memory-mapped) tq index.

Not a build dependency and not in CI. Setup: bash scripts/bench-search-setup.sh
Run:  bash scripts/bench-ivf.sh [glove|glove1m] [out dir]      (the wrapper), or
      python bench/ivf_vs_faiss.py --dataset glove --threads 2 --tq build/tq --out bench/results/ivf/glove100k
Datasets: those of bench/search_vs_faiss.py (glove: the 100k GloVe set; glove1m: the GloVe
base replicated 10x with Gaussian noise, named as what it is).
Writes <out>/results.json (every curve point, with its command or parameters) and
<out>/recall_qps.png.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import search_vs_faiss as svf  # noqa: E402  (data loading, ground truth, recall helpers)

REPO = svf.REPO


def r10_of(ids, gt):
    return float(np.mean([len(set(ids[i, :10]) & set(gt[i, :10])) / 10 for i in range(len(gt))]))


def tq_curve(args, ds, nlist, bits, extra, label):
    cmd = [args.tq, "index", "eval", "--base", ds["base_path"], "--queries", ds["query_path"], "--gt", ds["gt_path"],
           "--bits", str(bits), "--metric", ds["metric"], "--threads", str(args.threads), "--reps", str(args.reps),
           "-k", "10", "--ivf", str(nlist), "--nprobe", ",".join(str(p) for p in args.nprobe if p <= nlist),
           "--json"] + list(extra)
    t0 = time.perf_counter()
    j = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    print(f"  {label}: {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    pts = [dict(param=f"nprobe={e['nprobe']}", qps=e["qps"], recall_10_at_10=e["recall_10_at_10"],
                recall_1_at_1=e["recall_1_at_k"]["1"]) for e in j["sweep"]]
    return dict(method=label, family="tq-ivf", nlist=nlist, bits=bits, build_s=j["build_s"],
                disk_bytes_per_vector=j["disk_bytes_per_vector"], memory_bytes_per_vector=j["memory_bytes_per_vector"],
                code_bytes_per_vector=j["bytes_per_vector"], points=pts, cmd=" ".join(cmd), index=j["index"])


def tq_load_time(args, ds, nlist, bits, extra):
    """Build once, save, then time `tq index search` loading the file (median of reps)."""
    with tempfile.TemporaryDirectory(dir=os.path.join(REPO, "data", "bench")) as td:
        f = os.path.join(td, "ivf.tqi")
        subprocess.run([args.tq, "index", "build", "-i", ds["base_path"], "-o", f, "--bits", str(bits), "--metric",
                        ds["metric"], "--ivf", str(nlist), "--threads", str(args.threads)] + list(extra),
                       check=True, capture_output=True)
        q1 = os.path.join(td, "q1.fvecs")
        svf.write_vecs(q1, ds["xq"][:1])
        loads = []
        for _ in range(args.reps):
            j = json.loads(subprocess.run([args.tq, "index", "search", "--index", f, "-q", q1, "--nprobe", "1",
                                           "--threads", str(args.threads), "--json"],
                                          check=True, capture_output=True, text=True).stdout)
            loads.append(j["load_s"])
        return dict(file_bytes=os.path.getsize(f), load_s=float(np.median(loads)), load_s_all=loads)


def faiss_curve(args, ds, label, family, make, sweep, set_param, bytes_per_vector):
    import faiss
    faiss.omp_set_num_threads(args.threads)
    cos = ds["metric"] == "cosine"
    xb = svf.normalize(ds["xb"]) if cos else ds["xb"]
    xq = svf.normalize(ds["xq"]) if cos else ds["xq"]
    t0 = time.perf_counter()
    ix = make(xb.shape[1])
    if not ix.is_trained:
        ix.train(xb)
    ix.add(xb)
    build = time.perf_counter() - t0
    pts = []
    for v in sweep:
        set_param(ix, v)
        (_, ids), ts = svf.timed_search(lambda q: ix.search(q, 10), xq, args.reps)
        pts.append(dict(param=f"{v}", qps=len(xq) / ts, recall_10_at_10=r10_of(ids, ds["gt"]),
                        recall_1_at_1=float(np.mean(ids[:, 0] == ds["gt"][:, 0]))))
    bpv = bytes_per_vector(ix) if callable(bytes_per_vector) else bytes_per_vector
    print(f"  {label}: build {build:.1f}s", file=sys.stderr, flush=True)
    return dict(method=label, family=family, build_s=build, memory_bytes_per_vector=bpv, points=pts,
                cmd="faiss " + faiss.__version__)


def qps_at(points, target):
    """QPS at recall target by linear interpolation between the two bracketing points."""
    pts = sorted(points, key=lambda p: p["recall_10_at_10"])
    for a, b in zip(pts, pts[1:]):
        if a["recall_10_at_10"] <= target <= b["recall_10_at_10"]:
            if b["recall_10_at_10"] == a["recall_10_at_10"]:
                return max(a["qps"], b["qps"])
            t = (target - a["recall_10_at_10"]) / (b["recall_10_at_10"] - a["recall_10_at_10"])
            return a["qps"] + t * (b["qps"] - a["qps"])
    best = [p["qps"] for p in pts if p["recall_10_at_10"] >= target]
    return max(best) if best else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="glove", choices=["glove", "glove1m", "fashion"])
    ap.add_argument("--glove-dir", default=os.path.join(os.path.dirname(REPO), "shared", "data", "glove100"),
                    help="the GloVe-100 files (as in bench/search_vs_faiss.py)")
    ap.add_argument("--nq", type=int, default=1000)
    ap.add_argument("--perturb", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tq", default=os.path.join(REPO, "build", "tq"))
    ap.add_argument("--nlist", type=int, default=0, help="0: about 4 sqrt(n)")
    ap.add_argument("--nprobe", type=lambda s: [int(v) for v in s.split(",")], default=[1, 2, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--bits", type=lambda s: [float(v) for v in s.split(",")], default=[4.0])
    ap.add_argument("--tq-extra", default="", help="extra tq build flags, space separated")
    ap.add_argument("--skip", default="", help="comma list of families to skip: hnsw,ivfpq,ivfrabitq,ivfrabitqfs")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    args.glove_dir = os.path.abspath(args.glove_dir)
    ds = svf.load_dataset(args)
    n, d = ds["xb"].shape
    nlist = args.nlist or int(4 * np.sqrt(n) // 8 * 8)
    skip = set(filter(None, args.skip.split(",")))
    extra = args.tq_extra.split()
    print(f"{ds['name']}: n={n} d={d} nq={len(ds['xq'])} nlist={nlist} threads={args.threads}", file=sys.stderr)
    import faiss
    mt = faiss.METRIC_L2 if ds["metric"] == "l2" else faiss.METRIC_INNER_PRODUCT
    flat = (lambda dd: faiss.IndexFlatL2(dd)) if mt == faiss.METRIC_L2 else (lambda dd: faiss.IndexFlatIP(dd))
    res = []
    for b in args.bits:
        res.append(tq_curve(args, ds, nlist, b, extra, f"tq IVF{nlist} {b:g}b" + (f" {args.tq_extra}" if extra else "")))
    nprobe = [p for p in args.nprobe if p <= nlist]

    def set_nprobe(ix, v):
        ix.nprobe = v
    for b in args.bits:
        bi = int(b)
        if "ivfrabitq" not in skip:
            res.append(faiss_curve(args, ds, f"FAISS IVF{nlist},RaBitQ {bi}b", "faiss-ivfrabitq",
                                   lambda dd, bi=bi: faiss.IndexIVFRaBitQ(flat(dd), dd, nlist, mt, True, bi),
                                   nprobe, set_nprobe, lambda ix: ix.code_size + 8))
        if "ivfrabitqfs" not in skip and hasattr(faiss, "IndexIVFRaBitQFastScan"):
            try:
                def mk(dd, bi=bi):
                    return faiss.IndexIVFRaBitQFastScan(flat(dd), dd, nlist, mt, 32, True, bi)
                mk(d)
                res.append(faiss_curve(args, ds, f"FAISS IVF{nlist},RaBitQFastScan {bi}b", "faiss-ivfrabitqfs", mk,
                                       nprobe, set_nprobe, lambda ix: ix.code_size + 8))
            except Exception as e:  # signature differs across versions
                print(f"  IndexIVFRaBitQFastScan skipped: {e}", file=sys.stderr)
        if "ivfpq" not in skip and (d * bi) % 8 == 0:
            m = d * bi // 4  # 4-bit sub-quantizers: m * 4 bits = d * bi bits
            if d % m == 0:
                res.append(faiss_curve(args, ds, f"FAISS IVF{nlist},PQ{m}x4fs", "faiss-ivfpqfs",
                                       lambda dd, m=m: faiss.IndexIVFPQFastScan(flat(dd), dd, nlist, m, 4, mt),
                                       nprobe, set_nprobe, m * 4 / 8 + 8))
    if "hnsw" not in skip:
        def set_ef(ix, v):
            ix.hnsw.efSearch = v
        res.append(faiss_curve(args, ds, "FAISS HNSW32,Flat", "faiss-hnsw",
                               lambda dd: faiss.IndexHNSWFlat(dd, 32, mt), [10, 16, 32, 64, 128, 256], set_ef,
                               4 * d + 2 * 32 * 4))  # floats + level-0 links (upper levels not counted)
    load = tq_load_time(args, ds, nlist, args.bits[0], extra)
    summary = {}
    for r in res:
        summary[r["method"]] = dict(qps_at_r10_0p9=qps_at(r["points"], 0.9), build_s=r["build_s"],
                                    memory_bytes_per_vector=r["memory_bytes_per_vector"])
    os.makedirs(args.out, exist_ok=True)
    out = dict(dataset=ds["name"], n=n, nq=len(ds["xq"]), dim=d, metric=ds["metric"], threads=args.threads,
               nlist=nlist, date=time.strftime("%Y-%m-%d %H:%M"), faiss=faiss.__version__, results=res,
               tq_load=load, summary=summary)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(out, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 5))
        for r in res:
            xs = [p["recall_10_at_10"] for p in r["points"]]
            ys = [p["qps"] for p in r["points"]]
            ax.plot(xs, ys, marker="o", label=f"{r['method']} ({r['memory_bytes_per_vector']:.0f} B/vec)")
        ax.set_yscale("log")
        ax.set_xlabel("Recall 10@10")
        ax.set_ylabel(f"QPS ({args.threads} threads)")
        ax.set_title(f"{ds['name']}, n={n}, nq={len(ds['xq'])}")
        ax.axvline(0.9, color="grey", lw=0.5)
        ax.grid(True, which="both", lw=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "recall_qps.png"), dpi=120)
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
    print(json.dumps(summary, indent=1))
    print(json.dumps(load))


if __name__ == "__main__":
    main()
