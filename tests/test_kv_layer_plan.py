#!/usr/bin/env python3
"""bench/kv_layer_plan.py: the sweep string, the published plan from the published sweep, the
knapsack against brute force on a small case, and bad input (one-line error, non-zero exit)."""
import itertools
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "bench", "kv_layer_plan.py")
failures = []


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


# 1. The sweep: one K probe and one V probe per layer.
r = run("sweep", "--layers", "3", "--k", "tq3h6", "--v", "tq4n8")
check(r.returncode == 0, "sweep exits 0")
check(r.stdout.strip().split(";") == ["f16 s1 ck cs512 cr L0:tq3h6/f16", "f16 s1 ck cs512 cr L1:tq3h6/f16",
                                      "f16 s1 ck cs512 cr L2:tq3h6/f16", "f16 L0:f16/tq4n8", "f16 L1:f16/tq4n8",
                                      "f16 L2:f16/tq4n8"], "sweep string: " + r.stdout)

# 2. The plan published in BENCHMARKS.md from the published sensitivity sweep.
sens = os.path.join(ROOT, "results", "kv_layer_sens_c2048_calib.json")
plan = ["plan", sens, "--base", "tq3h6n8/tq4n8", "--up-k", "tq4h6n8", "--up-v", "tq5n8", "--cost-k", "18",
        "--cost-v", "24"]
r = run(*plan, "--budget", "174")
check(r.returncode == 0 and r.stdout.strip() ==
      "tq3h6n8/tq4n8 L1:tq3h6n8/tq5n8 L3,5,8,18,19,20:tq4h6n8/tq4n8 L16:tq4h6n8/tq5n8", "published plan: " + r.stdout)
r = run(*plan, "--budget", "0")
check(r.returncode == 0 and r.stdout.strip() == "tq3h6n8/tq4n8", "zero budget keeps the base: " + r.stdout)

# 3. Knapsack optimal on a small case (brute force over all subsets).
kld = {("K", 0): 0.004, ("K", 1): 0.001, ("K", 2): 0.003, ("V", 0): 0.002, ("V", 1): 0.0035, ("V", 2): 0.0001}
res = []
for (side, l), v in sorted(kld.items()):
    lab = f"f16 s1 ck cs512 cr L{l}:tq3h6/f16" if side == "K" else f"f16 L{l}:f16/tq4n8"
    res.append({"kv": {"label": lab}, "kld_mean": v})
with tempfile.TemporaryDirectory() as td:
    f = os.path.join(td, "s.json")
    json.dump({"results": res}, open(f, "w"))
    fk, fv = 1 - 0.009497 / 0.03454, 1 - 0.002499 / 0.009497
    for budget in (0, 5, 7, 13, 20, 31, 60):
        r = run("plan", f, "--base", "tq3h6/tq4n8", "--up-k", "tq4h6", "--up-v", "tq5n8", "--cost-k", "6",
                "--cost-v", "7", "--budget", str(budget), "--json")
        out = json.loads(r.stdout)
        best = 0.0
        items = list(kld.items())
        for n in range(len(items) + 1):
            for sub in itertools.combinations(items, n):
                cost = sum(6 if k[0] == "K" else 7 for k, _ in sub)
                if cost <= budget:
                    best = max(best, sum(v * (fk if k[0] == "K" else fv) for k, v in sub))
        check(abs(out["predicted_kld_saved"] - best) < 1e-12, f"knapsack budget {budget}: {out} vs {best}")
        check(out["bytes_per_token_added"] <= budget, f"within budget {budget}")
    # 4. Bad input: missing file, not JSON, a config that is not a one-layer probe, unknown type.
    bad = os.path.join(td, "bad.json")
    open(bad, "w").write("{not json")
    json.dump({"results": [{"kv": {"label": "tq3/tq3"}, "kld_mean": 0.1}]}, open(os.path.join(td, "nl.json"), "w"))
    for args in (["plan", os.path.join(td, "missing.json")], ["plan", bad], ["plan", os.path.join(td, "nl.json")]):
        r = run(*args, "--base", "tq3h6/tq4n8", "--up-k", "tq4h6", "--up-v", "tq5n8", "--cost-k", "6",
                "--cost-v", "7", "--budget", "10")
        check(r.returncode != 0 and r.stderr.strip().count("\n") == 0 and "kv_layer_plan:" in r.stderr,
              f"bad input {args[-1]}: rc {r.returncode} stderr {r.stderr!r}")
    r = run("plan", f, "--base", "f16/tq4n8", "--up-k", "tq4h6", "--up-v", "tq5n8", "--cost-k", "6",
            "--cost-v", "7", "--budget", "10")
    check(r.returncode != 0 and "not a tq type" in r.stderr, f"non-tq base: {r.stderr!r}")
    r = run("sweep", "--layers", "0", "--k", "tq3", "--v", "tq3")
    check(r.returncode != 0 and "--layers" in r.stderr, f"zero layers: {r.stderr!r}")

print("kv_layer_plan: %d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
