#!/usr/bin/env python3
"""Outside reference for the architectures (not part of CI): llama.cpp and `tq` on the same GGUF
models, next-token logits on the same token ids, every row.

Models: the random-weight GGUFs of bench/arch_models.py (llama with Llama 3 and linear RoPE
scaling, qwen2, qwen3 with head_dim 128, gemma3 with a sliding window of 8 under a 40-token
context), written here with a fixed seed; with --model PATH (repeatable) real GGUFs too, e.g.
models/gemma-3-270m-q4_k_m.gguf once tq reads its K-quant weights (token ids: llama.cpp's
tokenization of the first --text-tokens tokens of --corpus, so tq's tokenizer is not involved).

Both engines use an f16 KV cache; llama.cpp gets the whole sequence in one batch
(logits_all=True, flash attention as in bench/llama_cpp_reference.py), tq one prefill
(`tq logits --all-rows`). Each random model runs twice: as written (Q8_0 / F16 / F32) and as an
F32-weight copy (key NAME-f32), see TOL_REL. Per model: max |tq - llama.cpp| over all logits, that relative to max
|llama.cpp logit|, top-1 agreement over rows, and the same figures for tq and for llama.cpp
against the float64 reference of tests/test_arch_reference.py (random models only) and for
llama.cpp against that reference with one rule broken (missing norm, wrong RoPE base, no window
...): the tolerance tests/test_llama_cpp_arch.py checks (TOL_REL below) must sit under every
"broken" figure, or it could not tell a wrong architecture from rounding.

Usage: the test venv (numpy, gguf) with llama-cpp-python taken from the reference venv of
scripts/llama_cpp_reference.sh (--ref-venv, default .venv-ref; its site-packages go last on
sys.path):
  .venv/bin/python bench/llama_cpp_arch.py --tq build/tq --ref-venv .venv-ref \
      --out bench/results/llama_cpp_arch.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import arch_models  # noqa: E402

# max |tq - llama.cpp| / max |llama.cpp| on the F32-weight copies of the random models. With
# F32 weights llama.cpp's remaining roundings are its f16 KV cache and flash attention's f16
# queries (measured 1.1e-3 .. 3.6e-3 against the float64 reference); with Q8_0 / F16 weights
# it also rounds every matrix product's input to Q8_0 / F16 (llama3 Q8_0: 9.5e-2), so the
# files as written ("native") are only held to NATIVE_TOL_REL and NATIVE_MIN_TOP1.
TOL_REL = 1e-2
NATIVE_TOL_REL = 0.15
NATIVE_MIN_TOP1 = 0.9
N_TOKENS = 40


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def top1(a, b):
    return float(np.mean(a.argmax(axis=1) == b.argmax(axis=1)))


def llama_logits(path, toks, threads):
    from llama_cpp import Llama
    n = len(toks)
    llm = Llama(model_path=path, n_ctx=max(64, n), n_batch=max(64, n), n_ubatch=max(64, n), n_threads=threads,
                n_threads_batch=threads, logits_all=True, flash_attn=True, verbose=False)
    llm.eval(toks)
    out = np.asarray(llm.scores[:n], dtype=np.float64)
    tokenizer = llm
    return out, tokenizer


def tq_logits(tq, path, toks, threads):
    out = subprocess.run([tq, "logits", "-m", path, "--ids", ",".join(map(str, toks)), "--all-rows", "-t",
                          str(threads), "-ctk", "f16", "-ctv", "f16"], check=True, capture_output=True,
                         text=True).stdout
    return np.asarray(json.loads(out)["logits"], dtype=np.float64)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tq", default="build/tq")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "llama_cpp_arch.json"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", action="append", default=[], help="a real GGUF model too (repeatable)")
    ap.add_argument("--corpus", default="data/debian-reference.en.txt")
    ap.add_argument("--text-tokens", type=int, default=256)
    ap.add_argument("--ref-venv", default=".venv-ref", help="virtual environment holding llama-cpp-python")
    a = ap.parse_args()
    import glob
    sys.path.extend(glob.glob(os.path.join(a.ref_venv, "lib", "python3*", "site-packages")))
    import llama_cpp
    import test_arch_reference as ref  # the float64 reference forward and its broken variants
    report = {"llama_cpp_python": llama_cpp.__version__, "tol_rel": TOL_REL, "n_tokens": N_TOKENS,
              "kv_cache": "f16 (both engines)", "models": {}}
    report["native_tol_rel"], report["native_min_top1"] = NATIVE_TOL_REL, NATIVE_MIN_TOP1
    with tempfile.TemporaryDirectory() as d:
        for name in arch_models.MODELS:
            native = arch_models.MODELS[name]["wtype"]
            for wtype in ([native, "F32"] if native != "F32" else ["F32"]):
                key = name if wtype == native else f"{name}-f32"
                arch_models.MODELS[name]["wtype"] = wtype
                try:
                    path = arch_models.write(name, os.path.join(d, f"random-{key}.gguf"), seed=3)
                finally:
                    arch_models.MODELS[name]["wtype"] = native
                md, W = ref.load(path)
                V = W["token_embd.weight"].shape[0]
                toks = np.random.default_rng(7).integers(0, V, N_TOKENS).tolist()
                lc, _ = llama_logits(path, toks, a.threads)
                tq = tq_logits(a.tq, path, toks, a.threads)
                r64 = ref.reference(md, W, toks, f16_kv=True)
                broken = {rule: rel(lc, ref.reference(md, W, toks, break_rule=rule)) for rule in ref.RULES[name]}
                m = {"model": name, "arch": md["general.architecture"], "weights": wtype,
                     "checked_against": "tol_rel" if wtype == "F32" else "native_tol_rel",
                     "max_abs_diff": float(np.abs(tq - lc).max()), "rel_diff": rel(tq, lc),
                     "top1_agreement": top1(tq, lc), "tq_vs_ref64_rel": rel(tq, r64),
                     "llama_cpp_vs_ref64_rel": rel(lc, r64), "tq_vs_ref64_top1": top1(tq, r64),
                     "llama_cpp_vs_ref64_top1": top1(lc, r64), "llama_cpp_vs_broken_ref64_rel": broken}
                report["models"][key] = m
                print(f"{key:14s} {wtype:5s} tq vs llama.cpp: max abs {m['max_abs_diff']:.3e}, rel {m['rel_diff']:.2e}, "
                      f"top-1 {100 * m['top1_agreement']:.1f}% | vs ref64: tq {m['tq_vs_ref64_rel']:.2e}, "
                      f"llama.cpp {m['llama_cpp_vs_ref64_rel']:.2e} | llama.cpp vs broken ref64: min "
                      f"{min(broken.values()):.2e} ({min(broken, key=broken.get)})")
    for path in a.model:
        from llama_cpp import Llama
        text = open(a.corpus, encoding="utf-8").read()[:20000]
        tk = Llama(model_path=path, vocab_only=True, verbose=False)
        toks = tk.tokenize(text.encode("utf-8"), add_bos=True)[:a.text_tokens]
        del tk
        lc, _ = llama_logits(path, toks, a.threads)
        tq = tq_logits(a.tq, path, toks, a.threads)
        m = {"max_abs_diff": float(np.abs(tq - lc).max()), "rel_diff": rel(tq, lc), "top1_agreement": top1(tq, lc),
             "n_tokens": len(toks)}
        report["models"][os.path.basename(path)] = m
        print(f"{os.path.basename(path)}: max abs {m['max_abs_diff']:.3e}, rel {m['rel_diff']:.2e}, "
              f"top-1 {100 * m['top1_agreement']:.1f}%")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
