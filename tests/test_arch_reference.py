#!/usr/bin/env python3
"""Every architecture tq runs, against a plain float64 forward pass written here.

The random-weight GGUFs of bench/arch_models.py (llama with Llama 3 and linear RoPE scaling,
qwen2, qwen3, gemma3 with a sliding window of 8 under a 40-token context) are run by `tq logits`
(all rows) and by reference() below: numpy float64, weights dequantized by the `gguf` package,
the rules of each architecture written out from llama.cpp's (src/llama-model.cpp hparams,
llama-graph / the per-architecture graph builders):

  llama   RMSNorm, normal-mode RoPE (pairs 2i, 2i+1), rope_freqs frequency factors, linear
          scaling (positions / factor), SwiGLU, output.weight or tied
  qwen2   + QKV biases, neox RoPE (pairs i, i + d/2)
  qwen3   + per-head RMSNorm of q and k before RoPE (no biases), head_dim from key_length
  gemma3  + embeddings * sqrt(n_embd), post-attention / post-FFN RMSNorm, GELU-tanh gate,
          layers l % 6 != 5 attend to the last sliding_window positions with RoPE base 10000,
          the others to all with rope.freq_base

Tolerance: max |tq - ref| over all logits of all rows, relative to max |ref|, below kTol =
2e-4 with an f32 cache (float32 arithmetic against float64; measured 0.6-3.1e-6), and kTolF16
= 1e-3 with an f16 cache against the reference with K and V rounded to float16 (measured
2.3e-5 .. 3.2e-4: rounding K and V to f16 moves these logits by 0.5-2.2e-3 itself, and a
float32 input can round to the other f16 neighbour than the float64 one). Sensitivity, checked here every
run: the reference with one rule broken (a norm dropped, a RoPE base or mode changed, the window
removed or off by one, the bias dropped, SiLU for GELU, ...) is at least 10x kTol away from tq's
logits, so a tq with that bug would fail. Checked once by mutating tq itself (2026-12-04): the
window one longer (attn_params), the global RoPE base on the sliding-window layers
(layer_qkv), the post-attention norm dropped (layer_out_ffn) each failed every gemma3 run
(rel err 0.75, 0.44, 0.88).

Usage: test_arch_reference.py TQ_BINARY   (exit 0 when every check passes)
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import arch_models  # noqa: E402
from forward_ref64 import load  # noqa: E402  (metadata + float64 tensors, gguf's dequantizers)

K_TOL = 2e-4
K_TOL_F16 = 1e-3
N_TOKENS = 40


def rms(x, w, eps):
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


def reference(md, W, toks, f16_kv=False, break_rule=None):
    """Logits (float64) of every position. break_rule: None, or the name of one rule to get
    wrong (the sensitivity checks)."""
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
        h = rms(x, W[p + "attn_norm.weight"], eps)
        q, k, v = h @ W[p + "attn_q.weight"].T, h @ W[p + "attn_k.weight"].T, h @ W[p + "attn_v.weight"].T
        if p + "attn_q.bias" in W and br != "bias":
            q, k, v = q + W[p + "attn_q.bias"], k + W[p + "attn_k.bias"], v + W[p + "attn_v.bias"]
        q, k, v = q.reshape(n, H, D), k.reshape(n, KH, D), v.reshape(n, KH, D)
        if p + "attn_q_norm.weight" in W and br != "qk_norm":
            q, k = rms(q, W[p + "attn_q_norm.weight"], eps), rms(k, W[p + "attn_k_norm.weight"], eps)
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
            o = rms(o, W[p + "post_attention_norm.weight"], eps)
        x = x + o
        h = rms(x, W[p + "ffn_norm.weight"], eps)
        act = gelu_tanh if gemma and br != "gelu" else silu
        f = (act(h @ W[p + "ffn_gate.weight"].T) * (h @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T
        if p + "post_ffw_norm.weight" in W and br != "post_norms":
            f = rms(f, W[p + "post_ffw_norm.weight"], eps)
        x = x + f
    x = rms(x, W["output_norm.weight"], eps)
    out = W.get("output.weight", W["token_embd.weight"])
    return x @ out.T


# The rules each model exercises (the sensitivity checks break each one).
RULES = {
    "llama3": ["rope_mode", "rope_base", "freq_factors"],
    "llama-lin": ["rope_mode", "linear_scaling"],
    "qwen2": ["rope_mode", "bias"],
    "qwen3": ["rope_mode", "qk_norm"],
    "gemma3": ["rope_mode", "rope_base", "swa_base", "qk_norm", "post_norms", "gelu", "embd_scale",
               "window_off", "window_plus_one"],
}


def tq_logits(tq, model, toks, *args):
    out = subprocess.run([tq, "logits", "-m", model, "--ids", ",".join(map(str, toks)), "--all-rows", "-t", "2",
                          *args], check=True, capture_output=True, text=True,
                         env={**os.environ, "TQ_NO_REEXEC": "1"}).stdout
    return np.asarray(json.loads(out)["logits"], dtype=np.float64)


def rel_err(a, ref):
    return float(np.abs(a - ref).max() / np.abs(ref).max())


def main():
    tq = sys.argv[1] if len(sys.argv) > 1 else "build/tq"
    failures = []
    with tempfile.TemporaryDirectory() as d:
        for name in arch_models.MODELS:
            path = arch_models.write(name, os.path.join(d, f"random-{name}.gguf"), seed=3)
            md, W = load(path)
            V = W["token_embd.weight"].shape[0]
            toks = np.random.default_rng(7).integers(0, V, N_TOKENS).tolist()
            ref = reference(md, W, toks)
            ref16 = reference(md, W, toks, f16_kv=True)
            runs = {
                "f32 fused": (tq_logits(tq, path, toks, "-ctk", "f32", "-ctv", "f32"), ref, K_TOL),
                "f32 reference-attn decode": (tq_logits(tq, path, toks, "-ctk", "f32", "-ctv", "f32", "--decode",
                                                        "--reference-attention"), ref, K_TOL),
                "f16 fused": (tq_logits(tq, path, toks, "-ctk", "f16", "-ctv", "f16"), ref16, K_TOL_F16),
                "f16 fused decode": (tq_logits(tq, path, toks, "-ctk", "f16", "-ctv", "f16", "--decode"), ref16,
                                     K_TOL_F16),
                "f16 fused ubatch 5": (tq_logits(tq, path, toks, "-ctk", "f16", "-ctv", "f16", "--ubatch", "5"),
                                       ref16, K_TOL_F16),
            }
            for label, (got, r, tol) in runs.items():
                e = rel_err(got, r)
                ok = e < tol
                print(f"{name:10s} {label:28s} rel err {e:.2e} (tol {tol:.0e}) {'ok' if ok else 'FAIL'}")
                if not ok:
                    failures.append(f"{name} {label}: {e:.2e}")
            got = runs["f32 fused"][0]
            for rule in RULES[name]:
                e = rel_err(got, reference(md, W, toks, break_rule=rule))
                ok = e > 10 * K_TOL
                print(f"{name:10s} reference with '{rule}' broken: rel err {e:.2e} (must be > {10 * K_TOL:.0e}) "
                      f"{'ok' if ok else 'FAIL'}")
                if not ok:
                    failures.append(f"{name}: breaking '{rule}' is not detected ({e:.2e})")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("all architectures agree with the float64 reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
