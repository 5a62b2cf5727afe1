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
float32 input can round to the other f16 neighbour than the float64 one). The decode and
micro-batch-5 runs of the Q8_0 models (llama3, gemma3) go through the decode kernels, which round
the activations to 16 bits (src/llm/qmatvec.h): K_TOL_INT16 = 1e-3 more (tests/test_qmatvec.cpp,
kInt16Tol, says where it comes from; measured here 1.0e-4 .. 2.7e-4 with the f32 cache, up to
8.7e-4 with f16, where the float kernels gave 5e-7 .. 4e-5). So do the prefill runs of those
models where `tq logits` reports `prefill_matmul` "int16 ..." (the integer GEMM on AVX-512
hosts): the same K_TOL_INT16 more (measured here 2.9e-4 for llama3 with the f32 cache). Sensitivity, checked here every
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
from forward_ref64 import forward_arch as reference, load  # noqa: E402  (the float64 pass; gguf's dequantizers)

K_TOL = 2e-4
K_TOL_F16 = 1e-3
K_TOL_INT16 = 1e-3
INT16_WEIGHTS = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K")  # llm::qmatvec_int16
N_TOKENS = 40


# The rules each model exercises (the sensitivity checks break each one).
RULES = {
    "llama3": ["rope_mode", "rope_base", "freq_factors"],
    "llama-lin": ["rope_mode", "linear_scaling"],
    "qwen2": ["rope_mode", "bias"],
    "qwen3": ["rope_mode", "qk_norm"],
    "gemma3": ["rope_mode", "rope_base", "swa_base", "qk_norm", "post_norms", "gelu", "embd_scale",
               "window_off", "window_plus_one"],
}


PREFILL_MATMUL = []  # what `tq logits` said it ran prefill's int16-type projections with


def tq_logits(tq, model, toks, *args):
    out = subprocess.run([tq, "logits", "-m", model, "--ids", ",".join(map(str, toks)), "--all-rows", "-t", "2",
                          *args], check=True, capture_output=True, text=True,
                         env={**os.environ, "TQ_NO_REEXEC": "1"}).stdout
    j = json.loads(out)
    PREFILL_MATMUL.append(j["prefill_matmul"])
    return np.asarray(j["logits"], dtype=np.float64)


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
            extra = K_TOL_INT16 if arch_models.MODELS[name]["wtype"] in INT16_WEIGHTS else 0.0  # decode kernels
            f32_fused = tq_logits(tq, path, toks, "-ctk", "f32", "-ctv", "f32")
            pextra = extra if PREFILL_MATMUL[-1].startswith("int16") else 0.0  # prefill's integer GEMM
            runs = {
                "f32 fused": (f32_fused, ref, K_TOL + pextra),
                "f32 reference-attn decode": (tq_logits(tq, path, toks, "-ctk", "f32", "-ctv", "f32", "--decode",
                                                        "--reference-attention"), ref, K_TOL + extra),
                "f16 fused": (tq_logits(tq, path, toks, "-ctk", "f16", "-ctv", "f16"), ref16, K_TOL_F16 + pextra),
                "f16 fused decode": (tq_logits(tq, path, toks, "-ctk", "f16", "-ctv", "f16", "--decode"), ref16,
                                     K_TOL_F16 + extra),
                "f16 fused ubatch 5": (tq_logits(tq, path, toks, "-ctk", "f16", "-ctv", "f16", "--ubatch", "5"),
                                       ref16, K_TOL_F16 + extra),
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
