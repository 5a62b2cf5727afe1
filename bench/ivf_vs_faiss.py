#!/usr/bin/env python3
"""Recall-QPS curves: tq IVF (tq index eval --ivf --nprobe sweep) against FAISS IndexIVFRaBitQ,
IndexIVFRaBitQFastScan, IndexIVFPQFastScan and IndexHNSWFlat, and rabitqlib's IvfIndex (RaBitQ's
reference implementation, on FAISS's coarse k-means), on the same data, the same
threads, in the same run; memory per vector, build time, and the load time of a saved
(memory-mapped) tq index.

Not a build dependency and not in CI. Setup: bash scripts/bench-search-setup.sh
Run:  bash scripts/bench-ivf.sh [glove|glove1m|fashion|fashion1m] [out dir]      (the wrapper), or
      python bench/ivf_vs_faiss.py --dataset glove --threads 2 --tq build/tq --out bench/results/ivf/glove100k
Datasets: those of bench/search_vs_faiss.py (glove: the 100k GloVe set; glove1m: the GloVe
base replicated 10x with Gaussian noise, named as what it is; fashion1m: 1M vectors at d = 784,
Fashion-MNIST's images and mixes of two).
Writes <out>/results.json (every curve point, with its command or parameters) and
<out>/recall_qps.png.
"""
import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import blas_env  # noqa: E402

if __name__ == "__main__":
    blas_env.rerun_with_blas_kernels()  # before numpy or faiss loads an OpenBLAS

import numpy as np  # noqa: E402

import search_vs_faiss as svf  # noqa: E402  (data loading, ground truth, recall helpers)

REPO = svf.REPO


def r10_of(ids, gt):
    return float(np.mean([len(set(ids[i, :10]) & set(gt[i, :10])) / 10 for i in range(len(gt))]))


def tq_curve(args, ds, nlist, bits, extra, label):
    cmd = [args.tq, "index", "eval", "--base", ds["base_path"], "--queries", ds["query_path"], "--gt", ds["gt_path"],
           "--bits", str(bits), "--metric", ds["metric"], "--threads", str(args.threads), "--reps", str(args.reps),
           "--build-reps", str(args.build_reps or args.reps), "-k", "10", "--ivf", str(nlist), "--nprobe", ",".join(str(p) for p in args.nprobe if p <= nlist),
           "--json"] + list(extra)
    t0 = time.perf_counter()
    j = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    print(f"  {label}: {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    pts = [dict(param=f"nprobe={e['nprobe']}", qps=e["qps"], recall_10_at_10=e["recall_10_at_10"],
                recall_1_at_1=e["recall_1_at_k"]["1"]) for e in j["sweep"]]
    return dict(method=label, family="tq-ivf", nlist=nlist, bits=bits, build_s=j["build_s"],
                disk_bytes_per_vector=j["disk_bytes_per_vector"], memory_bytes_per_vector=j["memory_bytes_per_vector"],
                code_bytes_per_vector=j["bytes_per_vector"], points=pts, cmd=" ".join(cmd), index=j["index"],
                load_avg_after=os.getloadavg())


def build_flags(extra):
    """The build flags of a variant's flags (search-only options and their values dropped)."""
    out, skip = [], False
    for a in extra:
        if skip:
            skip = False
        elif a in ("--rerank", "--rerank-full"):
            skip = True
        else:
            out.append(a)
    return out


def tq_load_time(args, ds, nlist, bits, extra):
    """Build once, save, then time `tq index search` loading the file (median of reps)."""
    extra = build_flags(extra)
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


def faiss_data(ds):
    cos = ds["metric"] == "cosine"
    return (svf.normalize(ds["xb"]) if cos else ds["xb"]), (svf.normalize(ds["xq"]) if cos else ds["xq"])


def faiss_kmeans(args, ds, nlist):
    """One coarse k-means shared by every FAISS IVF (faiss.Kmeans: niter = tq's 10 iterations,
    at most 256 points per centroid, as tq samples), timed once and added to each build time."""
    import faiss
    faiss.omp_set_num_threads(args.threads)
    xb, _ = faiss_data(ds)
    t0 = time.perf_counter()
    km = faiss.Kmeans(xb.shape[1], nlist, niter=10, seed=1234, max_points_per_centroid=256)
    km.train(xb)
    t = time.perf_counter() - t0
    print(f"  FAISS k-means ({nlist} lists, 10 iterations): {t:.1f}s", file=sys.stderr, flush=True)
    return km.centroids.copy(), t


def faiss_curve(args, ds, label, family, make, sweep, set_param, bytes_per_vector, extra_build_s=0.0, keep=False):
    """make(d) -> a new index (trained and filled here), or a built index when it has ntotal > 0
    (extra_build_s is then its whole build time). keep: return (curve, index) instead of
    deleting the index, so that a refine stage can wrap it."""
    import faiss
    faiss.omp_set_num_threads(args.threads)
    xb, xq = faiss_data(ds)
    t0 = time.perf_counter()
    ix = make(xb.shape[1])
    if ix.ntotal == 0:
        if not ix.is_trained:
            ix.train(xb)
        ix.add(xb)
    build = time.perf_counter() - t0 + extra_build_s
    pts = []
    for v in sweep:
        set_param(ix, v)
        (_, ids), ts = svf.timed_search(lambda q: ix.search(q, 10), xq, args.reps)
        pts.append(dict(param=f"{v}", qps=len(xq) / ts, recall_10_at_10=r10_of(ids, ds["gt"]),
                        recall_1_at_1=float(np.mean(ids[:, 0] == ds["gt"][:, 0]))))
    bpv = bytes_per_vector(ix) if callable(bytes_per_vector) else bytes_per_vector
    print(f"  {label}: build {build:.1f}s (shared k-means or base build {extra_build_s:.1f}s included)", file=sys.stderr, flush=True)
    cur = dict(method=label, family=family, build_s=build, kmeans_s=extra_build_s, memory_bytes_per_vector=bpv,
               points=pts, cmd="faiss " + faiss.__version__, load_avg_after=os.getloadavg())
    if keep:
        return cur, ix
    del ix
    return cur


def rabitqlib_curve(args, ds, nlist, bits, cents, km_s, sweep):
    """rabitqlib's own IVF (IvfIndex, nlist clusters) on the given coarse centroids: each vector
    goes to its nearest centroid (l2; inner product for cosine, on normalised data, as FAISS's IVF
    quantizer assigns), the assignment timed and added to km_s. B/vector: rabitqlib's saved file / n."""
    import faiss
    import rabitqlib
    faiss.omp_set_num_threads(args.threads)
    xb, xq = faiss_data(ds)
    n, d = xb.shape
    cos = ds["metric"] == "cosine"
    t0 = time.perf_counter()
    qz = faiss.IndexFlatIP(d) if cos else faiss.IndexFlatL2(d)
    qz.add(cents)
    _, assign = qz.search(xb, 1)
    ix = rabitqlib.IvfIndex(d, n, nlist, int(bits), "ip" if cos else "l2")
    ix.build(xb, cents, assign[:, 0].astype(np.uint32), num_threads=args.threads)
    build = time.perf_counter() - t0 + km_s
    pts = []
    for v in sweep:
        res, ts = svf.timed_search(lambda q, v=v: ix.search(q, 10, v, num_threads=args.threads), xq, args.reps)
        ids = np.asarray(res[1] if isinstance(res, tuple) and len(res) > 1 else res)
        if ids.dtype.kind == "f":  # (ids, dists) order varies by version: pick the integer array
            ids = np.asarray(res[0])
        ids = ids.astype(np.int64)
        pts.append(dict(param=f"{v}", qps=len(xq) / ts, recall_10_at_10=r10_of(ids, ds["gt"]),
                        recall_1_at_1=float(np.mean(ids[:, 0] == ds["gt"][:, 0]))))
    with tempfile.TemporaryDirectory(dir=os.path.join(REPO, "data", "bench")) as td:
        f = os.path.join(td, "rabitqlib.ivf")
        ix.save(f)
        bpv = os.path.getsize(f) / n
    label = f"rabitqlib IVF{nlist} {bits:g}b"
    print(f"  {label}: build {build:.1f}s (k-means {km_s:.1f}s included)", file=sys.stderr, flush=True)
    return dict(method=label, family="rabitqlib-ivf", build_s=build, kmeans_s=km_s, memory_bytes_per_vector=bpv,
                bytes_note="rabitqlib's saved file / n", initializer=ix.initializer, points=pts,
                cmd="rabitqlib " + importlib.metadata.version("rabitqlib"), load_avg_after=os.getloadavg())


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


def write_md(out, path):
    """<out dir>/results.md: one row per method (bytes, build, QPS at R10@10 = 0.9, every point)
    and the interpolated QPS at a few recalls, from results.json."""
    res = out["results"]
    lines = [f"{out['dataset']}, n={out['n']}, nq={out['nq']}, metric={out['metric']}, threads={out['threads']}, "
             f"nlist={out['nlist']}, faiss {out['faiss']}"
             + (f" (OpenBLAS {out['faiss_blas_core']})" if out.get("faiss_blas_core") else "")
             + f", load average at the end {out.get('load_avg_end', '?')}", "",
             "| method | B/vector in memory | build s (wall) | QPS at R10@10 = 0.9 | points (param: R10@10 / QPS) |",
             "|---|---|---|---|---|"]
    for r in res:
        q = qps_at(r["points"], 0.9)
        pts = "; ".join(f"{p['param']}: {p['recall_10_at_10']:.3f} / {p['qps']:.0f}" for p in r["points"])
        lines.append(f"| {r['method']} | {r['memory_bytes_per_vector']:.1f} | {r['build_s']:.1f} | "
                     f"{'not reached' if q is None else f'{q:.0f}'} | {pts} |")
    targets = [0.8, 0.85, 0.9, 0.95]
    lines += ["", "| R10@10 | " + " | ".join(r["method"] for r in res) + " |",
              "|---|" + "---|" * len(res)]
    for t in targets:
        cells = []
        for r in res:
            q = qps_at(r["points"], t)
            cells.append("not reached" if q is None else f"{q:.0f}")
        lines.append(f"| {t:.2f} | " + " | ".join(cells) + " |")
    ld = out.get("tq_load") or {}
    if ld:
        lines += ["", f"tq IVF file: {ld['file_bytes'] / 2**20:.1f} MiB, load (memory-mapped, validated, decoded) "
                      f"{ld['load_s']:.2f} s, median of {len(ld['load_s_all'])} `tq index search` runs"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="glove", choices=["glove", "glove1m", "fashion", "fashion1m"])
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
    ap.add_argument("--tq-variant", action="append", default=[],
                    help="another tq IVF curve: 'LABEL:FLAGS' (eval flags, space separated, e.g. "
                         "'fit+full40:--fit-scale --keep-vectors --rerank-full 40'); repeatable")
    ap.add_argument("--build-reps", type=int, default=0, help="tq timed builds (0: --reps)")
    ap.add_argument("--shared-kmeans", action="store_true",
                    help="train one FAISS coarse k-means and give it to every FAISS IVF (its time added to each)")
    ap.add_argument("--refine-k-factor", type=int, default=0,
                    help="also FAISS IVF-PQ fast scan + IndexRefineFlat re-ranking k * this many candidates")
    ap.add_argument("--refine-sq", type=lambda s: [int(v) for v in s.split(",")], default=[],
                    help="with --refine-k-factor: also IVF-PQ fast scan + IndexRefine(IndexScalarQuantizer "
                         "QT_<B>bit) for each B of this comma list (4, 6, 8); --refine-sq8 is --refine-sq 8")
    ap.add_argument("--refine-sq8", action="store_true",
                    help="with --refine-k-factor: also IVF-PQ fast scan + IndexRefine(IndexScalarQuantizer QT_8bit), "
                         "the byte-equivalent of an 8-bit second stage. The refine variants wrap the one built "
                         "IVF-PQ fast-scan index (build time = its build + the refine stage's)")
    ap.add_argument("--no-load-time", action="store_true", help="skip the tq load-time measurement (one more build)")
    ap.add_argument("--hnsw-m", type=int, default=32)
    ap.add_argument("--hnsw-efc", type=int, default=40, help="HNSW efConstruction (FAISS's default 40)")
    ap.add_argument("--ef", type=lambda s: [int(v) for v in s.split(",")], default=[10, 16, 32, 64, 128, 256])
    ap.add_argument("--skip", default="",
                    help="comma list of families to skip: hnsw,ivfpq,ivfrabitq,ivfrabitqfs,rabitqlib")
    ap.add_argument("--out", required=True)
    ap.add_argument("--md-only", action="store_true", help="only rewrite <out>/results.md from <out>/results.json")
    args = ap.parse_args()
    if args.md_only:
        with open(os.path.join(args.out, "results.json")) as f:
            write_md(json.load(f), os.path.join(args.out, "results.md"))
        return
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
    for v in args.tq_variant:
        lab, _, fl = v.partition(":")
        res.append(tq_curve(args, ds, nlist, args.bits[0], extra + fl.split(), f"tq IVF{nlist} {args.bits[0]:g}b {lab}"))
    nprobe = [p for p in args.nprobe if p <= nlist]
    km_s = 0.0
    if args.shared_kmeans:
        cents, km_s = faiss_kmeans(args, ds, nlist)
        qcls = faiss.IndexFlatL2 if mt == faiss.METRIC_L2 else faiss.IndexFlatIP

        def flat(dd):  # noqa: F811  (a trained coarse quantizer: IndexIVF::train skips its k-means)
            q = qcls(dd)
            q.add(cents)
            return q

    def set_nprobe(ix, v):
        ix.nprobe = v
    for b in args.bits:
        bi = int(b)
        if "ivfrabitq" not in skip:
            res.append(faiss_curve(args, ds, f"FAISS IVF{nlist},RaBitQ {bi}b", "faiss-ivfrabitq",
                                   lambda dd, bi=bi: faiss.IndexIVFRaBitQ(flat(dd), dd, nlist, mt, True, bi),
                                   nprobe, set_nprobe, lambda ix: ix.code_size + 8, km_s))
        if "ivfrabitqfs" not in skip and hasattr(faiss, "IndexIVFRaBitQFastScan"):
            try:
                def mk(dd, bi=bi):
                    return faiss.IndexIVFRaBitQFastScan(flat(dd), dd, nlist, mt, 32, True, bi)
                mk(d)
                res.append(faiss_curve(args, ds, f"FAISS IVF{nlist},RaBitQFastScan {bi}b", "faiss-ivfrabitqfs", mk,
                                       nprobe, set_nprobe, lambda ix: ix.code_size + 8, km_s))
            except Exception as e:  # signature differs across versions
                print(f"  IndexIVFRaBitQFastScan skipped: {e}", file=sys.stderr)
        if "ivfpq" not in skip and (d * bi) % 8 == 0:
            m = d * bi // 4  # 4-bit sub-quantizers: m * 4 bits = d * bi bits
            if d % m == 0:
                cur, base = faiss_curve(args, ds, f"FAISS IVF{nlist},PQ{m}x4fs", "faiss-ivfpqfs",
                                        lambda dd, m=m: faiss.IndexIVFPQFastScan(flat(dd), dd, nlist, m, 4, mt),
                                        nprobe, set_nprobe, m * 4 / 8 + 8, km_s, keep=True)
                res.append(cur)
                if args.refine_k_factor > 0:
                    kf = args.refine_k_factor
                    xbf, _ = faiss_data(ds)
                    keep_alive = []

                    def mk_refine_flat(dd):
                        ix = faiss.IndexRefineFlat(base, faiss.swig_ptr(xbf))  # refine store = the floats
                        ix.k_factor = kf
                        return ix

                    def mk_refine_sq(dd, qt):
                        sq = faiss.IndexScalarQuantizer(dd, qt, mt)
                        sq.train(xbf)
                        sq.add(xbf)
                        ix = faiss.IndexRefine(base, sq)
                        ix.k_factor = kf
                        keep_alive.append(sq)  # the wrapper does not own it
                        return ix

                    def set_nprobe_refine(ix, v):
                        faiss.extract_index_ivf(ix).nprobe = v
                    res.append(faiss_curve(args, ds, f"FAISS IVF{nlist},PQ{m}x4fs,RFlat k_factor {kf}",
                                           "faiss-ivfpqfs-refine", mk_refine_flat, nprobe, set_nprobe_refine,
                                           m * 4 / 8 + 8 + 4 * d, cur["build_s"]))
                    sq_bits = sorted(set(args.refine_sq + ([8] if args.refine_sq8 else [])), reverse=True)
                    for sb in sq_bits:
                        qt = {4: faiss.ScalarQuantizer.QT_4bit, 6: faiss.ScalarQuantizer.QT_6bit,
                              8: faiss.ScalarQuantizer.QT_8bit}[sb]
                        res.append(faiss_curve(args, ds, f"FAISS IVF{nlist},PQ{m}x4fs,RSQ{sb} k_factor {kf}",
                                               f"faiss-ivfpqfs-refine-sq{sb}", lambda dd, qt=qt: mk_refine_sq(dd, qt),
                                               nprobe, set_nprobe_refine, m * 4 / 8 + 8 + d * sb / 8, cur["build_s"]))
                del base
        if "rabitqlib" not in skip:
            try:
                import rabitqlib  # noqa: F401
            except ImportError:
                print("  rabitqlib missing (scripts/bench-search-setup.sh installs it): its IVF skipped",
                      file=sys.stderr)
            else:
                if args.shared_kmeans:
                    rc, rk = cents, km_s
                else:  # its own k-means, FAISS's, as the shared one would be
                    rc, rk = faiss_kmeans(args, ds, nlist)
                res.append(rabitqlib_curve(args, ds, nlist, bi, rc, rk, nprobe))
    if "hnsw" not in skip:
        def set_ef(ix, v):
            ix.hnsw.efSearch = v
        def mk_hnsw(dd):
            ix = faiss.IndexHNSWFlat(dd, args.hnsw_m, mt)
            ix.hnsw.efConstruction = args.hnsw_efc
            return ix
        res.append(faiss_curve(args, ds, f"FAISS HNSW{args.hnsw_m},Flat efC {args.hnsw_efc}", "faiss-hnsw",
                               mk_hnsw, args.ef, set_ef,
                               4 * d + 2 * args.hnsw_m * 4))  # floats + level-0 links (upper levels not counted)
    load = None if args.no_load_time else tq_load_time(args, ds, nlist, args.bits[0], extra)
    summary = {}
    for r in res:
        summary[r["method"]] = dict(qps_at_r10_0p9=qps_at(r["points"], 0.9), build_s=r["build_s"],
                                    memory_bytes_per_vector=r["memory_bytes_per_vector"])
    os.makedirs(args.out, exist_ok=True)
    out = dict(dataset=ds["name"], n=n, nq=len(ds["xq"]), dim=d, metric=ds["metric"], threads=args.threads,
               nlist=nlist, shared_kmeans_s=km_s if args.shared_kmeans else None,
               load_avg=os.getloadavg(), argv=sys.argv[1:], date=time.strftime("%Y-%m-%d %H:%M"), faiss=faiss.__version__,
               faiss_blas_core=blas_env.faiss_blas_core(), results=res,
               tq_load=load, summary=summary)
    out["load_avg_end"] = os.getloadavg()
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(out, f, indent=1)
    write_md(out, os.path.join(args.out, "results.md"))
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
