#!/usr/bin/env python3
"""The saved llama.cpp comparison of the random-weight architectures
(bench/results/llama_cpp_arch.json, written by bench/llama_cpp_arch.py): every architecture is
there, tq's next-token logits agree with llama.cpp's within the stated tolerance (max abs diff
relative to max |llama.cpp logit| < 1e-2 on the F32-weight copies, top-1 agreement >= 95% of
the rows; < 0.15 and >= 90% on the Q8_0 / F16 files, where llama.cpp rounds every matrix
product's input to Q8_0 / F16: a smoke check), and the tight tolerance is tight: llama.cpp against the float64 reference with any one rule broken (a norm
dropped, a RoPE base, mode or window wrong, ...) is further away than tol_rel."""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = os.path.join(ROOT, "bench", "results", "llama_cpp_arch.json")
EXPECTED = {"llama3": "llama", "llama-lin": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3"}
TOL_REL = 1e-2          # F32-weight copies (the figures bench/llama_cpp_arch.py states)
NATIVE_TOL_REL = 0.15   # the files as written: llama.cpp rounds matrix inputs to Q8_0 / F16
MIN_TOP1 = 0.95
NATIVE_MIN_TOP1 = 0.9

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


with open(PATH) as f:
    rep = json.load(f)
check(rep.get("tol_rel") == TOL_REL, f"tol_rel {rep.get('tol_rel')} is not the stated {TOL_REL}")
check(rep.get("native_tol_rel") == NATIVE_TOL_REL, f"native_tol_rel {rep.get('native_tol_rel')} is not {NATIVE_TOL_REL}")
models = rep.get("models", {})
for name, arch in EXPECTED.items():
    cases = [(f"{name}-f32", TOL_REL, MIN_TOP1, True), (name, NATIVE_TOL_REL, NATIVE_MIN_TOP1, False)]
    if f"{name}-f32" not in models:  # written as F32: the file itself carries the tight figure
        cases = [(name, TOL_REL, MIN_TOP1, True)]
    for key, tol, min_top1, tight in cases:
        m = models.get(key)
        check(m is not None, f"{key}: missing from {PATH}")
        if m is None:
            continue
        check(tight == (m["weights"] == "F32"), f"{key}: weights {m['weights']}")
        check(m["arch"] == arch, f"{key}: arch {m['arch']}, expected {arch}")
        check(m["rel_diff"] < tol, f"{key}: tq vs llama.cpp rel diff {m['rel_diff']:.3e} >= {tol}")
        check(m["top1_agreement"] >= min_top1, f"{key}: top-1 agreement {m['top1_agreement']:.3f} < {min_top1}")
        broken = m["llama_cpp_vs_broken_ref64_rel"]
        check(len(broken) >= 2, f"{key}: fewer than 2 broken-rule checks")
        for rule, e in broken.items():  # the tight tolerance must tell every broken rule from rounding
            check(not tight or e > tol, f"{key}: llama.cpp vs the reference with '{rule}' broken is {e:.3e}, not above "
                           f"the tolerance {tol}: the tolerance could not detect that bug")
        print(f"{key:14s} {m['weights']:5s} rel diff {m['rel_diff']:.2e} (tol {tol}), top-1 "
              f"{100 * m['top1_agreement']:.1f}%, smallest broken-rule distance {min(broken.values()):.2e}")
if failures:
    sys.exit(1)
print("ok")
