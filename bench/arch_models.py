#!/usr/bin/env python3
"""Random-weight GGUF models of every architecture tq runs, written with the `gguf` package.

One small model per architecture rule (tests/test_arch_reference.py runs them through `tq` and a
float64 reference written in that test; bench/llama_cpp_arch.py runs them in llama.cpp):

  llama3      llama, Llama 3 RoPE scaling (rope_freqs.weight frequency factors, computed from
              factor 8 / low 1 / high 4 / original context 64 the way convert_hf_to_gguf.py
              does), separate output head, rope base 500000, Q8_0 weights
  llama-lin   llama, linear RoPE scaling (rope.scaling.type linear, factor 4), tied, F16
  qwen2       qwen2: QKV biases, neox RoPE, tied output, F16 weights
  qwen3       qwen3: QK-norm, head_dim 128 (key_length, != n_embd / n_heads), neox, separate
              output, F32 weights
  gemma3      gemma3: 6 layers (layer 5 global, 0-4 sliding window 8 with RoPE base 10000,
              global base 1e6), head_dim 64 from key_length (4 heads: q_dim 256 != n_embd 128),
              QK-norm, post-attention and post-FFN norms, GELU-tanh, sqrt(n_embd) embedding
              scale, tied, Q8_0 weights

Every model has a byte-level BPE vocabulary (256 byte tokens, a few merges, <|endoftext|>:
261 tokens) so that llama.cpp and tq load it; the tests feed token ids. Norm weights are
1 + 0.1 N(0, 1) (stored as used: the GGUF convention, Gemma's +1 included), matrices N(0, s^2).

Usage: python bench/arch_models.py OUTDIR [--only NAME,...]   (prints the paths written)
"""
import argparse
import math
import os
import sys

import numpy as np

MODELS = {
    "llama3": dict(arch="llama", n_layers=2, n_embd=64, n_heads=4, n_kv=2, head_dim=None, n_ff=96,
                   rope_base=500000.0, eps=1e-5, tied=False, wtype="Q8_0",
                   llama3_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                       original_max_position_embeddings=64)),
    "llama-lin": dict(arch="llama", n_layers=2, n_embd=64, n_heads=4, n_kv=1, head_dim=None, n_ff=96,
                      rope_base=10000.0, eps=1e-5, tied=True, wtype="F16", linear_factor=4.0),
    "qwen2": dict(arch="qwen2", n_layers=2, n_embd=64, n_heads=4, n_kv=2, head_dim=None, n_ff=96,
                  rope_base=1000000.0, eps=1e-6, tied=True, wtype="F16", bias=True),
    "qwen3": dict(arch="qwen3", n_layers=2, n_embd=128, n_heads=4, n_kv=2, head_dim=128, n_ff=160,
                  rope_base=1000000.0, eps=1e-6, tied=False, wtype="F32", qk_norm=True),
    "gemma3": dict(arch="gemma3", n_layers=6, n_embd=128, n_heads=4, n_kv=1, head_dim=64, n_ff=192,
                   rope_base=1000000.0, eps=1e-6, tied=True, wtype="Q8_0", qk_norm=True, post_norms=True,
                   sliding_window=8),
}
N_CTX_TRAIN = 256


def bytes_to_unicode():
    """GPT-2's byte -> printable character map (byte-level BPE vocabularies)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def vocab():
    b2u = bytes_to_unicode()
    toks = [b2u[b] for b in range(256)]
    merges = ["Ġ t", "h e", "Ġt he", "i n"]
    toks += ["Ġt", "he", "Ġthe", "in", "<|endoftext|>"]
    types = [1] * (len(toks) - 1) + [3]
    return toks, types, merges


def llama3_freq_factors(head_dim, base, s):
    """rope_freqs as convert_hf_to_gguf.py computes it for rope_type llama3."""
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    factor, lo, hi, old = s["factor"], s["low_freq_factor"], s["high_freq_factor"], \
        s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / lo, old / hi
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < high_wavelen:
            out.append(1.0)
        elif wl > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wl - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def write(name, path, seed=1):
    import gguf
    c = MODELS[name]
    rng = np.random.default_rng(seed)
    arch = c["arch"]
    E, H, KH, F = c["n_embd"], c["n_heads"], c["n_kv"], c["n_ff"]
    D = c["head_dim"] or E // H
    QD, KV = H * D, KH * D
    toks, types, merges = vocab()
    V = len(toks)
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"random-{name}")
    w.add_block_count(c["n_layers"])
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(E)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(KH)
    if c["head_dim"]:
        w.add_key_length(D)
        w.add_value_length(D)
    w.add_rope_dimension_count(D)
    w.add_rope_freq_base(c["rope_base"])
    w.add_layer_norm_rms_eps(c["eps"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if "linear_factor" in c:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(c["linear_factor"])
    if "sliding_window" in c:
        w.add_sliding_window(c["sliding_window"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(V - 1)
    w.add_eos_token_id(V - 1)
    w.add_add_bos_token(False)
    qt = getattr(gguf.GGMLQuantizationType, c["wtype"])

    def mat(tname, rows, cols, scale):
        x = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        if qt == gguf.GGMLQuantizationType.F32:
            w.add_tensor(tname, x)
        elif qt == gguf.GGMLQuantizationType.F16:
            w.add_tensor(tname, x.astype(np.float16))
        else:
            w.add_tensor(tname, gguf.quants.quantize(x, qt), raw_dtype=qt)

    def vec(tname, n, scale, offset):
        w.add_tensor(tname, (offset + rng.standard_normal(n) * scale).astype(np.float32))

    mat("token_embd.weight", V, E, 0.5 if arch != "gemma3" else 0.05)
    vec("output_norm.weight", E, 0.1, 1.0)
    if not c["tied"]:
        mat("output.weight", V, E, 0.3)
    if "llama3_scaling" in c:
        w.add_tensor("rope_freqs.weight", llama3_freq_factors(D, c["rope_base"], c["llama3_scaling"]))
    for l in range(c["n_layers"]):
        p = f"blk.{l}."
        vec(p + "attn_norm.weight", E, 0.1, 1.0)
        mat(p + "attn_q.weight", QD, E, 0.3)
        mat(p + "attn_k.weight", KV, E, 0.3)
        mat(p + "attn_v.weight", KV, E, 0.3)
        if c.get("bias"):
            vec(p + "attn_q.bias", QD, 0.5, 0.0)
            vec(p + "attn_k.bias", KV, 0.5, 0.0)
            vec(p + "attn_v.bias", KV, 0.5, 0.0)
        if c.get("qk_norm"):
            vec(p + "attn_q_norm.weight", D, 0.1, 1.0)
            vec(p + "attn_k_norm.weight", D, 0.1, 1.0)
        mat(p + "attn_output.weight", E, QD, 0.1)
        if c.get("post_norms"):
            vec(p + "post_attention_norm.weight", E, 0.1, 1.0)
        vec(p + "ffn_norm.weight", E, 0.1, 1.0)
        mat(p + "ffn_gate.weight", F, E, 0.2)
        mat(p + "ffn_up.weight", F, E, 0.2)
        mat(p + "ffn_down.weight", E, F, 0.1)
        if c.get("post_norms"):
            vec(p + "post_ffw_norm.weight", E, 0.1, 1.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--only", default="", help="comma-separated model names (default: all)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    names = [n for n in a.only.split(",") if n] or list(MODELS)
    for n in names:
        if n not in MODELS:
            sys.exit(f"unknown model {n} (have: {', '.join(MODELS)})")
        print(write(n, os.path.join(a.outdir, f"random-{n}.gguf"), a.seed))


if __name__ == "__main__":
    main()
