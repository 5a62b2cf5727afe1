#!/usr/bin/env python3
"""bench/llama_cpp_stable_rows.py: agreement on the rows every llama.cpp run reproduces, on a
small hand-checked case and on the published reference files, and bad input (one-line error,
non-zero exit)."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "bench", "llama_cpp_stable_rows.py")
failures = []


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


with tempfile.TemporaryDirectory() as td:
    # Rows 0..5: llama.cpp's one-batch run vs micro-batches of 32 and of 1 differ at rows 2 and 4,
    # so rows 0, 1, 3, 5 are stable; tq agrees with llama.cpp at rows 0, 3, 5 of those and at row 2.
    case = {"llama_cpp_top1_f16": [1, 2, 3, 4, 5, 6], "llama_cpp_top1_f16_ubatch32": [1, 2, 9, 4, 5, 6],
            "llama_cpp_top1_f16_ubatch1": [1, 2, 3, 4, 7, 6], "tq_top1_f16": [1, 8, 3, 4, 0, 6]}
    f = os.path.join(td, "self.json")
    json.dump(case, open(f, "w"))
    r = run(f)
    check(r.returncode == 0, f"exit 0: {r.stderr!r}")
    out = json.loads(r.stdout) if r.returncode == 0 else {}
    check(out.get("rows") == 6 and out.get("stable_rows") == 4, f"stable rows: {out}")
    check(abs(out.get("llama_cpp_self_agreement", 0) - 4 / 6) < 1e-12, f"self agreement: {out}")
    check(abs(out.get("top1_tq_vs_llama_cpp_stable_rows", 0) - 3 / 4) < 1e-12, f"stable agreement: {out}")
    check(abs(out.get("top1_tq_vs_llama_cpp_all_rows", 0) - 4 / 6) < 1e-12, f"all-row agreement: {out}")
    check(out.get("llama_cpp_runs") == ["one batch", "ubatch1", "ubatch32"], f"runs: {out}")

    # Bad input: missing file, not JSON, no micro-batch runs, lists of different lengths, no arguments.
    bad_json = os.path.join(td, "bad.json")
    open(bad_json, "w").write("{not json")
    no_runs = os.path.join(td, "no_runs.json")
    json.dump({"llama_cpp_top1_f16": [1], "tq_top1_f16": [1]}, open(no_runs, "w"))
    short = os.path.join(td, "short.json")
    json.dump(dict(case, tq_top1_f16=[1, 2]), open(short, "w"))
    for path, word in ((os.path.join(td, "missing.json"), "No such file"), (bad_json, "bad.json"),
                       (no_runs, "--self-ubatch"), (short, "different lengths")):
        r = run(path)
        check(r.returncode != 0 and r.stdout == "" and r.stderr.count("\n") == 1 and word in r.stderr,
              f"bad input {os.path.basename(path)}: {r.returncode} {r.stderr!r}")
    r = run()
    check(r.returncode != 0 and r.stderr.count("\n") == 1 and "usage" in r.stderr, f"no arguments: {r.stderr!r}")

# The published files (BENCHMARKS.md, "Outside reference"): 99.35% / 99.07% on the stable rows.
for ctx, stable, want in ((512, 2007, 0.9935), (2048, 7942, 0.9907)):
    r = run(os.path.join(ROOT, "bench", "results", f"llama_cpp_reference_c{ctx}_self.json"))
    out = json.loads(r.stdout) if r.returncode == 0 else {}
    check(out.get("stable_rows") == stable and round(out.get("top1_tq_vs_llama_cpp_stable_rows", 0), 4) == want,
          f"published ctx {ctx}: {out} {r.stderr!r}")

print("llama_cpp_stable_rows: %d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
