#!/usr/bin/env python3
"""Would a data-chosen linear map on K before quantization help? A float64 numpy simulation
(not part of CI; an experiment whose answer is recorded in docs/design.md).

The score error of a quantized key is q . e. With a random rotation the error e is isotropic,
so E[(q . e)^2] is proportional to E|k|^2 E|q|^2. Storing T k instead of k (and scoring with
T^-T q) changes that to E|T k|^2 E|T^-T q|^2, which a T fitted to the second moments of q and
k minimises: per channel s = (E q^2 / E k^2)^(1/4) ("S"), the same per RoPE pair ("Sp"), 2x2
blocks per RoPE pair ("B2"), or the full matrix geometric mean ("M"). This script fits T on
the first --stats tokens of each window (as a cache would at prefill: q and k of the prompt)
and measures the KL divergence of the next-token distribution to the unquantized model.

Model: the same float64 forward pass as bench/forward_ref64.py (weights dequantized with the
`gguf` package). Quantizer: a Haar rotation and the tq Lloyd-Max codebook for head_dim
(from `tq codebook`), unit-norm codes rescaled to the row norm (tq's norm correction). Every
mode uses K mean centring and one unquantized sink (position 0), as `--kv-sink 1 --kv-center k`;
V stays unquantized unless --v-bits is given, so the KLD is K's.

Usage: python bench/kv_precond_sim.py --modes c,S,Sp,B2,M --ctx 2048 --stats 512 --windows 2
       (c: centring only, the baseline)
"""
import argparse
import json
import subprocess
import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from forward_ref64 import forward as forward_ref, load  # noqa: E402


def psd_pow(m, p):
    w, u = np.linalg.eigh(m)
    return (u * np.maximum(w, 1e-12) ** p) @ u.T


def fit_transform(mode, kc, q):
    """T (D x D) from centred keys kc (n x D) and queries q (m x D) of the same stream."""
    d = kc.shape[1]
    if mode == "c":
        return np.eye(d)
    if mode in ("S", "Sp"):
        ek, eq = (kc ** 2).mean(0), (q ** 2).mean(0)
        if mode == "Sp":  # a pair's energy does not depend on the RoPE angle
            ek = np.repeat(ek[0::2] + ek[1::2], 2)
            eq = np.repeat(eq[0::2] + eq[1::2], 2)
        s = (eq / ek) ** 0.25
        return np.diag(s / np.exp(np.log(s).mean()))
    sk, sq = kc.T @ kc / len(kc), q.T @ q / len(q)
    if mode == "B2":
        mask = np.kron(np.eye(d // 2), np.ones((2, 2)))
        sk, sq = sk * mask, sq * mask
    sk += 1e-3 * np.trace(sk) / d * np.eye(d)
    sq += 1e-3 * np.trace(sq) / d * np.eye(d)
    kh, kmh = psd_pow(sk, 0.5), psd_pow(sk, -0.5)
    a = kmh @ psd_pow(kh @ sq @ kh, 0.5) @ kmh  # minimises tr(A Sk) tr(A^-1 Sq)
    return psd_pow(a, 0.5)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--corpus", default="data/debian-reference.en.txt")
    ap.add_argument("--tq", default="build/tq")
    ap.add_argument("--modes", default="c,S,Sp,B2,M")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--stats", type=int, default=0, help="tokens the mean and T are fitted on (0: the whole window)")
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--k-bits", type=int, default=3)
    ap.add_argument("--v-bits", type=int, default=0, help="0: V unquantized")
    ap.add_argument("--seed", type=int, default=1, help="Haar rotation")
    ap.add_argument("--per-layer", action="store_true",
                    help="quantize one layer at a time (each mode): KLD per layer, how the error spreads")
    args = ap.parse_args()
    toks = json.loads(subprocess.run([args.tq, "tokenize", "-m", args.model, "-f", args.corpus, "--json"],
                                     check=True, capture_output=True, text=True).stdout)["ids"]
    md, W = load(args.model)
    L, H = md["llama.block_count"], md["llama.attention.head_count"]
    Hk, E = md["llama.attention.head_count_kv"], md["llama.embedding_length"]
    D, G = E // H, H // Hk
    rot, _ = np.linalg.qr(np.random.default_rng(args.seed).standard_normal((D, D)))
    books = {}

    def quant(x, bits):
        if bits not in books:
            j = json.loads(subprocess.run([args.tq, "codebook", "-d", str(D), "-b", str(bits), "--json"],
                                          check=True, capture_output=True, text=True).stdout)
            books[bits] = (np.array(j["centroids"]), np.array(j["boundaries"]))
        c, b = books[bits]
        nrm = np.linalg.norm(x, axis=1, keepdims=True)
        nrm[nrm == 0] = 1
        y = c[np.searchsorted(b, (x / nrm) @ rot.T)]
        y /= np.linalg.norm(y, axis=1, keepdims=True)
        return (y @ rot) * nrm

    ctx = args.ctx
    ns = args.stats or ctx

    def forward(win, mode, only=None):
        def hook(l, q, k, v):
            if mode is None or only not in (None, l):
                return k, v
            k, v = k.copy(), v.copy()
            for kv in range(Hk):
                mu = k[1:ns, kv].mean(0)
                kc = k[1:, kv] - mu
                t = fit_transform(mode, kc[:ns - 1], q[:ns, kv * G:(kv + 1) * G].reshape(-1, D))
                k[1:, kv] = quant(kc @ t, args.k_bits) @ np.linalg.inv(t) + mu
                if args.v_bits:
                    v[1:, kv] = quant(v[1:, kv], args.v_bits)
            return k, v

        lg = forward_ref(md, W, win, ctx // 2, True, hook)
        m = lg.max(1, keepdims=True)
        return lg - m - np.log(np.exp(lg - m).sum(1, keepdims=True))

    modes = args.modes.split(",")
    layers = [None] + (list(range(L)) if args.per_layer else [])
    kld = {m: [0.0] * len(layers) for m in modes}
    for w in range(args.windows):
        win = toks[w * ctx:(w + 1) * ctx]
        ref = forward(win, None)
        for m in modes:
            for i, only in enumerate(layers):
                kld[m][i] += float((np.exp(ref) * (ref - forward(win, m, only))).sum(1).mean()) / args.windows
        print(f"window {w} done", file=sys.stderr, flush=True)
    rep = {"ctx": ctx, "stats_tokens": ns, "windows": args.windows, "k_bits": args.k_bits, "v_bits": args.v_bits,
           "kld": {m: v[0] for m, v in kld.items()}}
    if args.per_layer:
        rep["kld_one_layer"] = {m: v[1:] for m, v in kld.items()}
    print(json.dumps(rep))


if __name__ == "__main__":
    sys.exit(main())
