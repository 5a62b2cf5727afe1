#!/usr/bin/env python3
"""Side-by-side nearest-neighbour benchmark: tq index vs FAISS (PQ, SQ4/SQ8, TurboQuant SQ,
RaBitQ) and rabitqlib, on the same data, the same threads, at matched bits per dimension.

Not a build dependency and not in CI. Setup: bash scripts/bench-search-setup.sh
Run:     .venv/bin/python bench/search_vs_faiss.py --dataset glove --threads 2 \\
             --tq build/tq --out bench/results/glove
Datasets:
  glove     ../shared/data/glove100 (100k base, 10k queries, cosine; ground truth shipped)
  fashion   data/fashion-mnist (scripts/fetch-fashion-mnist.sh; 60k train as base, 10k test
            as queries, L2; exact ground truth computed here with faiss.IndexFlatL2)
  glove1m   the GloVe base replicated 10x with small Gaussian perturbations (1M vectors,
            cosine; exact ground truth for --nq queries computed here with IndexFlatIP)
  fashion1m 1M vectors at d = 784 (L2): the 60k Fashion-MNIST train images, then 940k mixes
            t a + (1 - t) b of two random train images, t ~ U(0.5, 1) (seed 2026), so the
            neighbours form a continuum rather than clusters of copies; the test images as
            queries; exact ground truth for --nq queries computed here with IndexFlatL2
--pad-dim D appends zeros to base and queries up to D dimensions (same neighbours, same
cosines and distances): rabitqlib pads every vector to a multiple of 64 dimensions and codes
each padded coordinate with --bits bits, so on GloVe-100 its 4 bits are 4 x 128 code bits per
vector, tq's 4 x 100; padding both to 128 compares them at equal code bits.
Writes <out>/results.json, <out>/results.md (Markdown table) and PNG plots
(recall_at_k.png, build_time.png, qps_recall.png).
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import blas_env  # noqa: E402

if __name__ == "__main__":
    blas_env.rerun_with_blas_kernels()  # before numpy or faiss loads an OpenBLAS

import numpy as np  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KS = [1, 2, 4, 8, 16, 32, 64]


# ----------------------------------------------------------------------------- data io
def read_vecs(path, dtype):
    raw = np.fromfile(path, dtype=np.uint8)
    d = struct.unpack("<i", raw[:4].tobytes())[0]
    elem = np.dtype(dtype).itemsize
    rec = 4 + d * elem
    assert raw.size % rec == 0, f"{path}: bad size"
    rows = raw.reshape(-1, rec)[:, 4:]
    return np.ascontiguousarray(rows).view(dtype).reshape(-1, d)


def write_vecs(path, x):
    x = np.ascontiguousarray(x)
    n, d = x.shape
    head = np.full((n, 1), d, dtype=np.int32).view(np.uint8)
    body = x.view(np.uint8).reshape(n, -1)
    tmp = path + ".tmp"
    np.concatenate([head, body], axis=1).tofile(tmp)
    os.replace(tmp, path)


def normalize(x):
    n = np.linalg.norm(x, axis=1, keepdims=True)
    n[n == 0] = 1
    return (x / n).astype(np.float32)


def exact_gt(xb, xq, metric, k, threads):
    import faiss
    faiss.omp_set_num_threads(threads)
    ix = faiss.IndexFlatL2(xb.shape[1]) if metric == "l2" else faiss.IndexFlatIP(xb.shape[1])
    ix.add(xb)
    _, gt = ix.search(xq, k)
    return gt.astype(np.int32)


def load_dataset(args):
    """Returns dict(name, metric, base_path, query_path, gt_path, xb, xq, gt)."""
    cache = os.path.join(REPO, "data", "bench")
    os.makedirs(cache, exist_ok=True)
    if args.dataset == "glove":
        g = args.glove_dir
        bp, qp, gp = (os.path.join(g, f) for f in
                      ("glove100_base.fvecs", "glove100_query.fvecs", "glove100_gt100.ivecs"))
        xb, xq = read_vecs(bp, np.float32), read_vecs(qp, np.float32)
        gt = read_vecs(gp, np.int32)
        if args.nq < len(xq):
            xq, gt = xq[:args.nq], gt[:args.nq]
            qp, gp = os.path.join(cache, f"glove_q{args.nq}.fvecs"), os.path.join(cache, f"glove_gt{args.nq}.ivecs")
            write_vecs(qp, xq)
            write_vecs(gp, gt)
        return dict(name="GloVe-100", metric="cosine", base_path=bp, query_path=qp, gt_path=gp, xb=xb, xq=xq, gt=gt)
    if args.dataset == "fashion":
        fdir = os.path.join(REPO, "data", "fashion-mnist")
        bp, qp = os.path.join(fdir, "train.bvecs"), os.path.join(fdir, "test.bvecs")
        if not os.path.exists(bp):
            sys.exit("run scripts/fetch-fashion-mnist.sh first")
        xb = read_vecs(bp, np.uint8).astype(np.float32)
        xq = read_vecs(qp, np.uint8).astype(np.float32)[:args.nq]
        qp2 = os.path.join(cache, f"fashion_q{len(xq)}.fvecs")
        gp = os.path.join(cache, f"fashion_gt{len(xq)}.ivecs")
        if not os.path.exists(gp):
            write_vecs(qp2, xq)
            write_vecs(gp, exact_gt(xb, xq, "l2", 100, args.threads))
        return dict(name="Fashion-MNIST", metric="l2", base_path=bp, query_path=qp2, gt_path=gp,
                    xb=xb, xq=xq, gt=read_vecs(gp, np.int32))
    if args.dataset == "glove1m":
        g = args.glove_dir
        bp = os.path.join(cache, "glove1m_base.fvecs")
        qp = os.path.join(cache, f"glove1m_q{args.nq}.fvecs")
        gp = os.path.join(cache, f"glove1m_gt{args.nq}.ivecs")
        if not os.path.exists(gp):
            x = read_vecs(os.path.join(g, "glove100_base.fvecs"), np.float32)
            rng = np.random.default_rng(12345)
            sigma = args.perturb * x.std(axis=0, keepdims=True)
            parts = [x] + [x + sigma * rng.standard_normal(x.shape).astype(np.float32) for _ in range(9)]
            xb = np.concatenate(parts).astype(np.float32)
            write_vecs(bp, xb)
            xq = read_vecs(os.path.join(g, "glove100_query.fvecs"), np.float32)[:args.nq]
            write_vecs(qp, xq)
            write_vecs(gp, exact_gt(normalize(xb), normalize(xq), "ip", 100, args.threads))
        xb, xq = read_vecs(bp, np.float32), read_vecs(qp, np.float32)
        return dict(name="GloVe-100 x10 (1M, perturbed)", metric="cosine", base_path=bp, query_path=qp,
                    gt_path=gp, xb=xb, xq=xq, gt=read_vecs(gp, np.int32))
    if args.dataset == "fashion1m":
        fdir = os.path.join(REPO, "data", "fashion-mnist")
        bp = os.path.join(cache, "fashion1m_base.fvecs")
        qp = os.path.join(cache, f"fashion1m_q{args.nq}.fvecs")
        gp = os.path.join(cache, f"fashion1m_gt{args.nq}.ivecs")
        if not os.path.exists(gp):
            if not os.path.exists(os.path.join(fdir, "train.bvecs")):
                sys.exit("run scripts/fetch-fashion-mnist.sh first")
            x = read_vecs(os.path.join(fdir, "train.bvecs"), np.uint8).astype(np.float32)
            rng = np.random.default_rng(2026)
            n_mix = 1_000_000 - len(x)
            xb = np.empty((1_000_000, x.shape[1]), dtype=np.float32)
            xb[:len(x)] = x
            for s in range(0, n_mix, 100_000):  # in slices: the whole at once needs 3x the memory
                m = min(100_000, n_mix - s)
                a, b = rng.integers(0, len(x), m), rng.integers(0, len(x), m)
                t = rng.uniform(0.5, 1.0, (m, 1)).astype(np.float32)
                xb[len(x) + s:len(x) + s + m] = t * x[a] + (1 - t) * x[b]
            write_vecs(bp, xb)
            xq = read_vecs(os.path.join(fdir, "test.bvecs"), np.uint8).astype(np.float32)[:args.nq]
            write_vecs(qp, xq)
            write_vecs(gp, exact_gt(xb, xq, "l2", 100, args.threads))
        xb, xq = read_vecs(bp, np.float32), read_vecs(qp, np.float32)
        return dict(name="Fashion-MNIST 60k + 940k mixes (1M)", metric="l2", base_path=bp, query_path=qp,
                    gt_path=gp, xb=xb, xq=xq, gt=read_vecs(gp, np.int32))
    sys.exit(f"unknown dataset {args.dataset}")


def pad_dataset(ds, dim, tag):
    """ds with base and queries zero-padded to dim dimensions (files cached in data/bench)."""
    d = ds["xb"].shape[1]
    if dim <= d:
        sys.exit(f"--pad-dim {dim} must exceed the data's {d} dimensions")
    cache = os.path.join(REPO, "data", "bench")
    out = dict(ds, name=f"{ds['name']}, zero-padded to {dim} dims")
    for key, path_key in (("xb", "base_path"), ("xq", "query_path")):
        x = np.zeros((len(ds[key]), dim), dtype=np.float32)
        x[:, :d] = ds[key]
        p = os.path.join(cache, f"{tag}_pad{dim}_{'base' if key == 'xb' else 'q' + str(len(x))}.fvecs")
        if not os.path.exists(p):
            write_vecs(p, x)
        out[key], out[path_key] = x, p
    return out


def recalls(ids, gt):
    r = {}
    for k in KS:
        r[str(k)] = float(np.mean([gt[i, 0] in ids[i, :k] for i in range(len(gt))]))
    r10 = float(np.mean([len(set(ids[i, :10]) & set(gt[i, :10])) / 10 for i in range(len(gt))]))
    return r, r10


def cur_rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_mb():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ----------------------------------------------------------------------------- methods
def run_tq(args, ds, bits, extra=(), label=None):
    cmd = [args.tq, "index", "eval", "--base", ds["base_path"], "--queries", ds["query_path"],
           "--gt", ds["gt_path"], "--bits", str(bits), "--metric", ds["metric"],
           "--threads", str(args.threads), "--reps", str(args.reps), "--json"] + list(extra)
    if args.build_reps > 0:
        cmd += ["--build-reps", str(args.build_reps)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    j = json.loads(out)
    if label is None:
        # Name the row by what tq says it built (its defaults change between versions), e.g.
        # "mse 4 bits hadamard corrected+fit+center f16 cosine fast-scan" -> "corrected+fit+center".
        words = j["index"].split()
        flags = words[4] if len(words) > 4 else ""
        if "trellis" in words[5:]:
            flags += " trellis"
        if "two-level" in words[5:]:
            flags += " two-level"
        # Flags the descriptor does not show (e.g. seed=7) are added, so rows stay distinct.
        shown = {"center", "no-center", "fit-scale", "no-fit-scale", "trellis"}
        more = [f.lstrip("-") for f in extra if f.startswith("--") and f.lstrip("-") not in shown | {"rerank"}]
        label = " ".join([f"tq mse {bits}b", flags] + more).rstrip() + (" no-rerank" if "--rerank" in extra else "")
    return dict(method=label, family="tq", bits=bits, index=j["index"], simd=j.get("simd"),
                bytes_per_vector=j["bytes_per_vector"], train_s=0.0, build_s=j["build_s"],
                qps=j["qps"], recall_1_at_k=j["recall_1_at_k"], recall_10_at_10=j["recall_10_at_10"],
                peak_rss_mb=j["peak_rss_mb"], cmd=" ".join(cmd))


def timed_search(search, xq, reps):
    times, res = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        res = search(xq)
        times.append(time.perf_counter() - t0)
    return res, float(np.median(times))


def run_faiss(args, ds, label, family, bits, make, needs_train, bytes_per_vector=None):
    import faiss
    faiss.omp_set_num_threads(args.threads)
    cos = ds["metric"] == "cosine"
    xb = normalize(ds["xb"]) if cos else ds["xb"]
    xq = normalize(ds["xq"]) if cos else ds["xq"]
    ix = make(xb.shape[1])
    t0 = time.perf_counter()
    if needs_train:
        tn = args.train_n if args.train_n > 0 else len(xb)
        ix.train(xb[:tn])
    t1 = time.perf_counter()
    ix.add(xb)
    t2 = time.perf_counter()
    (_, ids), ts = timed_search(lambda q: ix.search(q, KS[-1]), xq, args.faiss_reps)
    r, r10 = recalls(ids, ds["gt"])
    inner = faiss.downcast_index(ix.index) if isinstance(ix, faiss.IndexPreTransform) else ix
    bpv = bytes_per_vector if bytes_per_vector is not None else getattr(inner, "code_size", None)
    return dict(method=label, family=family, bits=bits, bytes_per_vector=bpv, train_s=t1 - t0,
                build_s=t2 - t0, qps=len(xq) / ts, recall_1_at_k=r, recall_10_at_10=r10,
                peak_rss_mb=rss_mb(), cmd="faiss " + faiss.__version__)


def run_rabitqlib(args, ds, bits):
    import rabitqlib
    cos = ds["metric"] == "cosine"
    xb = normalize(ds["xb"]) if cos else ds["xb"]
    xq = normalize(ds["xq"]) if cos else ds["xq"]
    n, d = xb.shape
    metric = "ip" if cos else "l2"
    t0 = time.perf_counter()
    ix = rabitqlib.IvfIndex(d, n, 1, bits, metric)
    cent = xb.mean(axis=0, keepdims=True).astype(np.float32)
    ix.build(xb, cent, np.zeros(n, dtype=np.uint32), num_threads=args.threads)
    t1 = time.perf_counter()
    # Storage per vector: the size of rabitqlib's own saved index divided by n.
    tmp = os.path.join(REPO, "data", "bench", "rabitqlib.tmp")
    ix.save(tmp)
    est = os.path.getsize(tmp) / n
    os.remove(tmp)

    def search(q):
        return ix.search(q, KS[-1], 1, num_threads=args.threads)
    res, ts = timed_search(search, xq, args.faiss_reps)
    ids = np.asarray(res[1] if isinstance(res, tuple) and len(res) > 1 else res)
    if ids.dtype.kind == "f":  # (ids, dists) order varies by version: pick the integer array
        ids = np.asarray(res[0])
    r, r10 = recalls(ids.astype(np.int64), ds["gt"])
    return dict(method=f"rabitqlib {bits}b (1 cluster)", family="rabitqlib", bits=bits,
                bytes_per_vector=f"{est:.0f} (file)", train_s=0.0, build_s=t1 - t0, qps=len(xq) / ts,
                recall_1_at_k=r, recall_10_at_10=r10, peak_rss_mb=rss_mb(), cmd="rabitqlib")


def methods(args, ds):
    import faiss
    d = ds["xb"].shape[1]
    mt = faiss.METRIC_L2 if ds["metric"] == "l2" else faiss.METRIC_INNER_PRODUCT
    SQ = faiss.ScalarQuantizer
    out = []
    for bits in args.bits:
        out.append(("tq", bits, lambda b=bits: run_tq(args, ds, b)))
        if bits == 4:
            # The shortlist re-rank of the single-level scan (indexes of d >= 384 scan in two
            # levels by default, where the second level scores with float LUTs already; off is
            # accepted at any d).
            nr = ["--rerank", "0"] + (["--two-level=off"] if d >= 256 else [])
            out.append(("tq", bits, lambda b=bits, nr=nr: run_tq(args, ds, b, nr)))
        for v in args.tq_variants:
            flags = ["--" + f for f in v.split(",")]
            out.append(("tq", bits, lambda b=bits, fl=flags: run_tq(args, ds, b, fl)))
        m = d * bits // 8
        if not args.skip_pq and d % m == 0:
            out.append(("faiss-pq", bits, lambda m=m, b=bits: run_faiss(
                args, ds, f"FAISS PQ {m}x8", "faiss-pq", b, lambda dd: faiss.IndexPQ(dd, m, 8, mt), True)))
        if bits in (4, 8):
            qt = SQ.QT_4bit if bits == 4 else SQ.QT_8bit
            out.append(("faiss-sq", bits, lambda qt=qt, b=bits: run_faiss(
                args, ds, f"FAISS SQ{b}", "faiss-sq", b, lambda dd: faiss.IndexScalarQuantizer(dd, qt, mt), True)))
        tq_types = {1: "QT_1bit_tqmse", 2: "QT_2bit_tqmse", 3: "QT_3bit_tqmse", 4: "QT_4bit_tqmse", 8: "QT_8bit_tqmse"}
        if ds["metric"] == "cosine" and bits in tq_types and hasattr(SQ, tq_types[bits]):
            qt = getattr(SQ, tq_types[bits])

            def mk(dd, qt=qt):
                return faiss.IndexPreTransform(faiss.RandomRotationMatrix(dd, dd),
                                               faiss.IndexScalarQuantizer(dd, qt, mt))
            out.append(("faiss-tq", bits, lambda mk=mk, b=bits: run_faiss(
                args, ds, f"FAISS TurboQuant-MSE {b}b (SQ tqmse, rotated)", "faiss-tq", b, mk, True)))

        def mk_rq(dd, b=bits):
            return faiss.IndexPreTransform(faiss.RandomRotationMatrix(dd, dd), faiss.IndexRaBitQ(dd, mt, b))
        out.append(("faiss-rabitq", bits, lambda mk=mk_rq, b=bits: run_faiss(
            args, ds, f"FAISS RaBitQ {b}b (rotated)", "faiss-rabitq", b, mk, True)))
        if not args.skip_rabitqlib:
            out.append(("rabitqlib", bits, lambda b=bits: run_rabitqlib(args, ds, b)))
    for bits in args.tq_extra:
        out.append(("tq", bits, lambda b=bits: run_tq(args, ds, b)))
    return out


# ----------------------------------------------------------------------------- report
def write_report(args, ds, res):
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(dict(dataset=ds["name"], n=len(ds["xb"]), d=ds["xb"].shape[1], nq=len(ds["xq"]), threads=args.threads,
                       date=time.strftime("%Y-%m-%d"), faiss_blas_core=blas_env.faiss_blas_core(), results=res), f, indent=1)
    import faiss
    simd = sorted({r["simd"] for r in res if r.get("simd")})
    lines = [f"Dataset: {ds['name']}, n={len(ds['xb'])}, nq={len(ds['xq'])}, metric={ds['metric']}, "
             f"threads={args.threads}, date {time.strftime('%Y-%m-%d')}; tq SIMD {'/'.join(simd) or '-'}, "
             f"faiss {faiss.__version__} ({faiss.get_compile_options().strip()}, OpenBLAS {blas_env.faiss_blas_core()}); "
             f"QPS: median of "
             f"{args.reps} (tq) and {args.faiss_reps} (FAISS, rabitqlib) searches", "",
             "| method | bits/dim | code bits/vec | bytes/vec | R@1@1 | R@1@2 | R@1@4 | R@1@16 | R@1@64 | R10@10 | train s | build s | QPS |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    d = ds["xb"].shape[1]
    for r in res:
        rk = r["recall_1_at_k"]
        # Bits of the per-coordinate codes (scales, norms, factors, ids not counted): tq codes
        # d channels; rabitqlib pads to a multiple of 64 and codes every padded coordinate.
        code_bits = {"tq": round(r["bits"] * d), "rabitqlib": r["bits"] * (-(-d // 64) * 64)}.get(r["family"], "-")
        lines.append("| {} | {} | {} | {} | {:.4f} | {:.4f} | {:.4f} | {:.4f} | {:.4f} | {:.4f} | {:.3f} | {:.3f} | {:.0f} |".format(
            r["method"], r["bits"], code_bits, r["bytes_per_vector"] if r["bytes_per_vector"] is not None else "?",
            rk["1"], rk["2"], rk["4"], rk["16"], rk["64"], r["recall_10_at_10"], r["train_s"], r["build_s"], r["qps"]))
    md = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    print(md)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # plots are optional
        print("no plots:", e)
        return
    colors = list(plt.cm.tab20.colors)
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.set_prop_cycle(color=colors)
    for r in res:
        ax.plot(KS, [r["recall_1_at_k"][str(k)] for k in KS], marker="o",
                linestyle="-" if r["family"] == "tq" else "--", label=r["method"])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("Recall@1@k")
    ax.set_title(f"{ds['name']}: Recall@1@k")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "recall_at_k.png"), dpi=110)
    fig, ax = plt.subplots(figsize=(8, 5))
    names = [r["method"] for r in res]
    ax.barh(names, [max(r["build_s"], 1e-4) for r in res])
    ax.set_xscale("log")
    ax.set_xlabel("build time, s (train + add; log scale)")
    ax.set_title(f"{ds['name']}: build time, {args.threads} threads")
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "build_time.png"), dpi=110)
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, r in enumerate(res):
        ax.scatter(r["recall_1_at_k"]["1"], r["qps"], s=40, color=colors[i % len(colors)])
        ax.annotate(r["method"], (r["recall_1_at_k"]["1"], r["qps"]), fontsize=7)
    ax.set_yscale("log")
    ax.set_xlabel("Recall@1@1")
    ax.set_ylabel(f"QPS (k={KS[-1]}, {args.threads} threads, log)")
    ax.set_title(f"{ds['name']}: speed vs recall")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "qps_recall.png"), dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="glove", choices=["glove", "fashion", "glove1m", "fashion1m"])
    ap.add_argument("--glove-dir", default=os.path.join(os.path.dirname(REPO), "shared", "data", "glove100"))
    ap.add_argument("--tq", default=os.path.join(REPO, "build", "tq"))
    ap.add_argument("--build-reps", type=int, default=0,
                    help="tq builds timed per configuration (0: as --reps)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bits", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--tq-extra", type=float, nargs="*", default=[],
                    help="extra tq widths (e.g. 2.5 3 3.5) to compare at equal bytes")
    ap.add_argument("--tq-variants", nargs="*", default=[],
                    help="extra tq variants at each --bits, each a comma-separated list of `tq index` "
                         "flags without the dashes, e.g. no-center,no-fit-scale trellis; rows are "
                         "named by the index tq reports")
    ap.add_argument("--nq", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=3, help="tq timed runs (median)")
    ap.add_argument("--faiss-reps", type=int, default=1, help="FAISS/rabitqlib timed searches (median)")
    ap.add_argument("--train-n", type=int, default=0, help="PQ/SQ training vectors (0: whole base)")
    ap.add_argument("--pad-dim", type=int, default=0, help="zero-pad base and queries to this many dims")
    ap.add_argument("--perturb", type=float, default=0.05, help="glove1m: noise, in per-dim std units")
    ap.add_argument("--skip-pq", action="store_true")
    ap.add_argument("--skip-rabitqlib", action="store_true")
    ap.add_argument("--only", nargs="*", default=None, help="families to run (tq faiss-pq faiss-sq faiss-tq faiss-rabitq rabitqlib)")
    args = ap.parse_args()
    if args.out is None:
        args.out = os.path.join(REPO, "bench", "results", args.dataset)
    ds = load_dataset(args)
    if args.pad_dim:
        ds = pad_dataset(ds, args.pad_dim, args.dataset)
    res = []
    for fam, bits, fn in methods(args, ds):
        if args.only and fam not in args.only:
            continue
        t0 = time.time()
        try:
            r = fn()
        except Exception as e:  # keep going: one library's failure is reported, not fatal
            print(f"[{fam} {bits}b] failed: {e}", file=sys.stderr)
            continue
        res.append(r)
        print(f"[{time.time() - t0:7.1f}s] {r['method']}: R@1@1={r['recall_1_at_k']['1']:.4f} "
              f"build={r['build_s']:.3f}s qps={r['qps']:.0f} bytes={r['bytes_per_vector']}", file=sys.stderr, flush=True)
    write_report(args, ds, res)


if __name__ == "__main__":
    main()
