#!/usr/bin/env python3
"""Float64 reference forward pass of a GGUF model, in numpy (not part of CI).

Third opinion for the llama.cpp comparison (bench/llama_cpp_reference.py): when tq and llama.cpp
disagree on a next-token argmax, which one is nearer to the exact computation? Weights are
dequantized from the GGUF with the `gguf` package (Q4_1 / Q8_0 -> float), everything else is
float64: RMSNorm, normal-mode RoPE (adjacent pairs, as llama.cpp's LLAMA arch), GQA causal
attention, SwiGLU FFN, tied output. K and V are rounded to float16 as both engines' f16 caches
do (--exact-kv to keep them in float64). Windows and scored rows follow `tq perplexity`.
Other architectures (qwen2, qwen3, gemma3) run forward_arch, the pass that
tests/test_arch_reference.py checks tq against on random-weight models.

With --compare REPORT (the JSON of llama_cpp_reference.py, which holds both engines' top-1
lists), prints each engine's top-1 agreement with this reference and the perplexities.

--ggml-rounding adds llama.cpp's CPU rounding points to the float64 pass: the input of every
quantized-weight matrix product is quantized as ggml's `quantize_row_q8_1` / `_q8_0` do (float32,
blocks of 32, d = max|x| / 127 stored as fp16, q = round(x * 127 / max|x|)) and multiplied as its
Q4_1 x Q8_1 / Q8_0 x Q8_0 dot products do (Q4_1: d_w d_x sum(q_w q_x) + m_w s_x, with s_x the
block's d * sum(q_x) stored as fp16). Queries stay f32: a perplexity window is one batch of
>= 64 rows with f16 K/V, which ggml's tiled flash attention computes in f32.

--jitter REL multiplies every matrix-product input by (1 + REL * N(0, 1)) (seeded by --seed):
noise the size of float32 rounding (REL = 6e-8) that any change of summation order makes. With
--against REPORT (another report of this script) it measures how stable a computation's top-1
choices are: the exact pass keeps all of them, the ggml-rounded pass does not.
Usage: python bench/forward_ref64.py --model M.gguf --tq build/tq --corpus text --ctx 512 --chunks 8 \
           --compare bench/results/llama_cpp_reference_c512.json --out bench/results/ref64_c512.json
"""
import argparse
import json
import math
import subprocess
import sys
import time

import numpy as np


def load(model):
    import gguf
    r = gguf.GGUFReader(model)
    md = {}
    for f in r.fields.values():
        if f.types and f.types[0] != gguf.GGUFValueType.ARRAY:
            md[f.name] = f.contents()
    W = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        W[t.name] = np.asarray(a, dtype=np.float64).reshape([int(x) for x in reversed(t.shape)])
        if t.tensor_type == gguf.GGMLQuantizationType.Q4_1:
            # block = fp16 d, fp16 m, 16 bytes of nibbles; the offsets m are needed for q8_1's s term
            m = np.asarray(t.data, dtype=np.uint8).reshape(-1, 20)[:, 2:4].copy().view(np.float16)
            W[t.name + ".m"] = m.astype(np.float64).reshape(W[t.name].shape[0], -1)
    return md, W


def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def rope(x, pos, base, dim, neox, scale=1.0, ff=None):
    """x: n x heads x D (float64), rotated in place of a copy."""
    x = x.copy()
    half = dim // 2
    inv = base ** (-2.0 * np.arange(half) / dim)
    if ff is not None:
        inv = inv / ff
    ang = (pos[:, None] * scale) * inv[None, :]          # n x half
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if neox:
        a, b = x[..., :half].copy(), x[..., half:dim].copy()
        x[..., :half], x[..., half:dim] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0:dim:2].copy(), x[..., 1:dim:2].copy()
        x[..., 0:dim:2], x[..., 1:dim:2] = a * c - b * s, a * s + b * c
    return x


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1 + np.exp(-x))


def forward_arch(md, W, toks, f16_kv=False, break_rule=None):
    """Logits (float64) of every position, for every architecture tq runs (llama, qwen2, qwen3,
    gemma3: the rules in tests/test_arch_reference.py's docstring). f16_kv: K and V rounded to
    float16 as the engines' f16 caches. break_rule: None, or the name of one rule to get wrong
    (that test's sensitivity checks)."""
    arch = md["general.architecture"]
    g = lambda k, d=None: md.get(f"{arch}.{k}", d)  # noqa: E731
    n_layers, E = int(g("block_count")), int(g("embedding_length"))
    H, KH = int(g("attention.head_count")), int(g("attention.head_count_kv", g("attention.head_count")))
    D = int(g("attention.key_length", E // H))
    rope_dim = int(g("rope.dimension_count", D))
    base, eps = float(g("rope.freq_base", 10000.0)), float(g("attention.layer_norm_rms_epsilon"))
    factor = float(g("rope.scaling.factor", 0.0) or 0.0)
    scale = 1.0 / factor if factor else 1.0
    ff = W.get("rope_freqs.weight")
    neox = arch in ("qwen2", "qwen3", "gemma3")
    gemma = arch == "gemma3"
    window = int(g("attention.sliding_window", 0)) if gemma else 0
    br = break_rule
    if br == "rope_mode":
        neox = not neox
    if br == "rope_base":
        base = base * 0.1
    if br == "freq_factors":
        ff = None
    if br == "linear_scaling":
        scale = 1.0
    if br == "window_off":
        window = 0
    if br == "window_plus_one":
        window += 1
    n = len(toks)
    pos = np.arange(n, dtype=np.float64)
    x = W["token_embd.weight"][toks].copy()
    if gemma and br != "embd_scale":
        x *= math.sqrt(E)
    for l in range(n_layers):
        p = f"blk.{l}."
        swa = gemma and window > 0 and l % 6 != 5
        lbase = 10000.0 if (swa and br != "swa_base") else base
        lscale = 1.0 if swa else scale
        h = rmsnorm(x, W[p + "attn_norm.weight"], eps)
        q, k, v = h @ W[p + "attn_q.weight"].T, h @ W[p + "attn_k.weight"].T, h @ W[p + "attn_v.weight"].T
        if p + "attn_q.bias" in W and br != "bias":
            q, k, v = q + W[p + "attn_q.bias"], k + W[p + "attn_k.bias"], v + W[p + "attn_v.bias"]
        q, k, v = q.reshape(n, H, D), k.reshape(n, KH, D), v.reshape(n, KH, D)
        if p + "attn_q_norm.weight" in W and br != "qk_norm":
            q, k = rmsnorm(q, W[p + "attn_q_norm.weight"], eps), rmsnorm(k, W[p + "attn_k_norm.weight"], eps)
        q, k = rope(q, pos, lbase, rope_dim, neox, lscale, ff), rope(k, pos, lbase, rope_dim, neox, lscale, ff)
        if f16_kv:
            k, v = k.astype(np.float16).astype(np.float64), v.astype(np.float16).astype(np.float64)
        att = np.zeros((n, H, D))
        for hh in range(H):
            kh = hh // (H // KH)
            s = q[:, hh, :] @ k[:, kh, :].T / math.sqrt(D)   # n x n
            i, j = np.arange(n)[:, None], np.arange(n)[None, :]
            mask = j > i
            if swa:
                mask |= j <= i - window
            s = np.where(mask, -np.inf, s)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            att[:, hh, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kh, :]
        o = att.reshape(n, H * D) @ W[p + "attn_output.weight"].T
        if p + "post_attention_norm.weight" in W and br != "post_norms":
            o = rmsnorm(o, W[p + "post_attention_norm.weight"], eps)
        x = x + o
        h = rmsnorm(x, W[p + "ffn_norm.weight"], eps)
        act = gelu_tanh if gemma and br != "gelu" else silu
        f = (act(h @ W[p + "ffn_gate.weight"].T) * (h @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T
        if p + "post_ffw_norm.weight" in W and br != "post_norms":
            f = rmsnorm(f, W[p + "post_ffw_norm.weight"], eps)
        x = x + f
    x = rmsnorm(x, W["output_norm.weight"], eps)
    out = W.get("output.weight", W["token_embd.weight"])
    return x @ out.T


def q8_blocks(x):
    """ggml's activation quantization for quantized weights, per block of 32 float32 values:
    codes q = round(x * (127 / max|x|)) (ties to even), the scale d = max|x| / 127 as stored
    (fp16) and q8_1's block sum s = d * sum(q) as stored (fp16). Returns (q, d, s), float64."""
    b = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(b).max(axis=1, keepdims=True)
    d = amax / np.float32(127)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.round(b * inv)
    s = (q.sum(axis=1, keepdims=True) * d).astype(np.float16)
    return q.astype(np.float64), d.astype(np.float16).astype(np.float64), s.astype(np.float64)


def forward(md, W, toks, first, exact_kv, kv_hook=None, ggml_rounding=False, jitter=0.0, rng=None):
    """Logits (float64) of rows first .. len(toks)-2. kv_hook(layer, q, k, v) -> (k, v), if
    given, replaces each layer's K and V (n x heads x D, after RoPE) before attention: how
    bench/kv_precond_sim.py simulates a quantized cache. ggml_rounding, jitter: see --ggml-rounding
    and --jitter (rng: a numpy Generator, needed with jitter)."""

    def mm(a, name):
        """a @ W[name].T, with the roundings asked for."""
        w = W[name]
        if jitter:
            a = a * (1 + jitter * rng.standard_normal(a.shape))
        if not ggml_rounding:
            return a @ w.T
        q, d, s = q8_blocks(a)
        out = (q * d).reshape(a.shape) @ w.T
        if name + ".m" in W:  # Q4_1: the offsets multiply s, not the block sum of the rounded a
            out += (s - d * q.sum(axis=1, keepdims=True)).reshape(a.shape[0], -1) @ W[name + ".m"].T
        return out
    n = len(toks)
    L = md["llama.block_count"]
    H = md["llama.attention.head_count"]
    Hk = md["llama.attention.head_count_kv"]
    E = md["llama.embedding_length"]
    D = E // H
    eps = md["llama.attention.layer_norm_rms_epsilon"]
    base = md["llama.rope.freq_base"]
    rd = md.get("llama.rope.dimension_count", D)
    pos = np.arange(n, dtype=np.float64)[:, None]
    ang = pos * base ** (-2.0 * np.arange(rd // 2) / rd)  # (n, rd/2)
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(x, heads):
        x = x.reshape(n, heads, D).copy()
        a, b = x[:, :, 0:rd:2].copy(), x[:, :, 1:rd:2].copy()
        x[:, :, 0:rd:2] = a * cos[:, None, :] - b * sin[:, None, :]
        x[:, :, 1:rd:2] = a * sin[:, None, :] + b * cos[:, None, :]
        return x

    mask = np.triu(np.full((n, n), -np.inf), 1)
    x = W["token_embd.weight"][np.asarray(toks)]
    for l in range(L):
        p = f"blk.{l}."
        h = rmsnorm(x, W[p + "attn_norm.weight"], eps)
        q = rope(mm(h, p + "attn_q.weight"), H)
        k = rope(mm(h, p + "attn_k.weight"), Hk)
        v = mm(h, p + "attn_v.weight").reshape(n, Hk, D)
        if not exact_kv:
            k = k.astype(np.float16).astype(np.float64)
            v = v.astype(np.float16).astype(np.float64)
        if kv_hook is not None:
            k, v = kv_hook(l, q, k, v)
        out = np.empty((n, H, D))
        for hh in range(H):
            kv = hh // (H // Hk)
            s = q[:, hh, :] @ k[:, kv, :].T / math.sqrt(D) + mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            out[:, hh, :] = s @ v[:, kv, :]
        x = x + mm(out.reshape(n, E), p + "attn_output.weight")
        h = rmsnorm(x, W[p + "ffn_norm.weight"], eps)
        g = mm(h, p + "ffn_gate.weight")
        u = mm(h, p + "ffn_up.weight")
        x = x + mm((g / (1 + np.exp(-g))) * u, p + "ffn_down.weight")
    h = rmsnorm(x[first:n - 1], W["output_norm.weight"], eps)
    return mm(h, "output.weight" if "output.weight" in W else "token_embd.weight")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tq", default="build/tq", help="used only to tokenize (ids checked against llama.cpp)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--exact-kv", action="store_true", help="keep K/V in float64 instead of rounding to f16")
    ap.add_argument("--ggml-rounding", action="store_true",
                    help="quantize matrix-product inputs to 8-bit blocks as llama.cpp's CPU path does")
    ap.add_argument("--jitter", type=float, default=0.0,
                    help="relative noise on every matrix-product input (6e-8: float32 rounding size)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the --jitter noise")
    ap.add_argument("--against", help="another report of this script: top-1 agreement with its rows")
    ap.add_argument("--compare", help="JSON report of llama_cpp_reference.py with both engines' top-1 lists")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.jitter < 0 or not math.isfinite(args.jitter):
        ap.error("--jitter must be a finite number >= 0")
    rng = np.random.default_rng(args.seed)

    def read_report(path, what, key):
        """A JSON report given on the command line, read before the (long) run."""
        try:
            with open(path) as f:
                rep = json.load(f)
            if key not in rep:
                raise ValueError(f"no '{key}' list")
            return rep
        except (OSError, ValueError) as e:
            sys.exit(f"forward_ref64.py: {what} {path}: {e}")
    against = read_report(args.against, "--against", "top1") if args.against else None
    compare = read_report(args.compare, "--compare", "tq_top1_f16") if args.compare else None
    toks = json.loads(subprocess.run([args.tq, "tokenize", "-m", args.model, "-f", args.corpus, "--json"],
                                     check=True, capture_output=True, text=True).stdout)["ids"]
    md, W = load(args.model)
    llama = md.get("general.architecture") == "llama"
    if not llama and (args.ggml_rounding or args.jitter):
        sys.exit(f"forward_ref64.py: --ggml-rounding and --jitter are for llama models, not "
                 f"{md.get('general.architecture')}")
    ctx, first = args.ctx, args.ctx // 2
    nll, n, top1, logits_all, chunk_ppl = 0.0, 0, [], [], []
    t0 = time.time()
    for c in range(args.chunks):
        win = toks[c * ctx:(c + 1) * ctx]
        if llama:
            lg = forward(md, W, win, first, args.exact_kv, ggml_rounding=args.ggml_rounding, jitter=args.jitter,
                         rng=rng)
        else:
            lg = forward_arch(md, W, win, f16_kv=not args.exact_kv)[first:ctx - 1]
        m = lg.max(axis=1, keepdims=True)
        lp = lg - m - np.log(np.exp(lg - m).sum(axis=1, keepdims=True))
        tgt = np.asarray(win[first + 1:ctx])
        nl = -lp[np.arange(len(tgt)), tgt]
        chunk_ppl.append(math.exp(nl.mean()))
        nll += float(nl.sum())
        n += len(tgt)
        top1.extend(int(i) for i in lg.argmax(axis=1))
        logits_all.append(lg.astype(np.float32))
        print(f"window {c}: ppl {chunk_ppl[-1]:.4f} ({time.time() - t0:.0f} s)", file=sys.stderr)
    lg = np.concatenate(logits_all)
    rep = {"ctx": ctx, "chunks": args.chunks, "scored_tokens": n, "kv": "float64" if args.exact_kv else "f16-rounded",
           "ggml_rounding": args.ggml_rounding, "jitter": args.jitter, "seed": args.seed,
           "ppl": math.exp(nll / n), "chunk_ppl": chunk_ppl, "seconds": time.time() - t0}
    print(f"ref64 ({rep['kv']} K/V): ppl {rep['ppl']:.4f} over {n} scored tokens")
    if args.against:
        t = np.asarray(against["top1"])
        if len(t) != n:
            sys.exit(f"forward_ref64.py: --against {args.against} has {len(t)} rows, this run {n}")
        rep["against"] = args.against
        rep["top1_agreement_vs_against"] = float(np.mean(t == np.asarray(top1)))
        print(f"top-1 agreement with {args.against}: {100 * rep['top1_agreement_vs_against']:.2f}% "
              f"({int(np.sum(t != np.asarray(top1)))} rows differ)")
    if args.compare:
        other = compare
        srt = np.sort(lg, axis=1)
        margin = srt[:, -1] - srt[:, -2]  # reference top-1 margin per row
        ref = np.asarray(top1)
        for eng in ("tq", "llama_cpp"):
            t = np.asarray(other[f"{eng}_top1_f16"])
            assert len(t) == len(ref), (eng, len(t), len(ref))
            dis = np.nonzero(t != ref)[0]
            # how far below the reference's best logit the engine's choice is, where they differ
            gaps = [float(lg[i, ref[i]] - lg[i, t[i]]) for i in dis]
            rep[f"{eng}_top1_agreement_vs_ref64"] = float(np.mean(t == ref))
            rep[f"{eng}_top1_disagreements_vs_ref64"] = len(dis)
            rep[f"{eng}_ref64_logit_gap_at_disagreements"] = sorted(gaps)
            rep[f"{eng}_ppl_f16"] = other[f"{eng}_ppl_f16"]
            rep[f"{eng}_ppl_rel_diff_vs_ref64_pct"] = 100 * (other[f"{eng}_ppl_f16"] / rep["ppl"] - 1)
            print(f"{eng:9s}: top-1 agreement with ref64 {100 * np.mean(t == ref):.2f}% ({len(dis)} differ, ref64 "
                  f"gap max {max(gaps, default=0):.3f}); ppl {other[f'{eng}_ppl_f16']:.4f} "
                  f"({rep[f'{eng}_ppl_rel_diff_vs_ref64_pct']:+.3f}% vs ref64)")
        a, b = np.asarray(other["tq_top1_f16"]), np.asarray(other["llama_cpp_top1_f16"])
        both = np.nonzero(a != b)[0]
        rep["engines_disagree"] = len(both)
        rep["engines_disagree_ref64_margin_median"] = float(np.median(margin[both])) if len(both) else None
        rep["all_rows_ref64_margin_median"] = float(np.median(margin))
        rep["engines_disagree_ref64_sides_with"] = {
            "tq": int(np.sum(a[both] == ref[both])), "llama_cpp": int(np.sum(b[both] == ref[both])),
            "neither": int(np.sum((a[both] != ref[both]) & (b[both] != ref[both])))}
        print(f"where tq and llama.cpp differ ({len(both)} rows): ref64 sides with "
              f"{rep['engines_disagree_ref64_sides_with']}; ref64 top-1 margin there median "
              f"{rep['engines_disagree_ref64_margin_median']}, over all rows {rep['all_rows_ref64_margin_median']:.3f}")
    rep["top1"] = top1
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rep, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
