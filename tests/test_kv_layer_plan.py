#!/usr/bin/env python3
"""bench/kv_layer_plan.py: the sweep string, the published plan from the published sweep, the
knapsack (plan) and the multiple-choice knapsack (alloc) against brute force on a small case, and
bad input (one-line error, non-zero exit)."""
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


def one_side_results(ko, vo, f16_bytes, units):
    """`tq perplexity --json --compare f16` results of one-side configs (T/f16 for the K options,
    f16/T for the V options), each option's BYTES per unit times the units."""
    return [{"kv": {"label": f"{t}/f16 s1 ck cs512 cr ks" if side == "K" else f"f16/{t}"}, "kld_mean": k,
             "kv_bytes_per_token": f16_bytes / 2 + units * b, "kv_bytes_per_token_f16": f16_bytes}
            for side, opts in (("K", ko), ("V", vo)) for t, k, b in opts]


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
sens = os.path.join(ROOT, "bench", "results", "kv_layer_sens_c2048_calib.json")
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
    # 5. alloc: the multiple-choice knapsack against brute force over every assignment.
    ko = [("tq2h5n8", 0.03, 72.375), ("tq2h6n8", 0.026, 78.375), ("tq3h6n8", 0.008, 96.375)]
    vo = [("tq3n8", 0.02, 75.1875), ("tq3h4n8", 0.012, 84.375)]
    spec = lambda opts: ",".join(f"{t}:{k}:{b}" for t, k, b in opts)
    tot = {sd: sum(v for (s_, _), v in kld.items() if s_ == sd) for sd in "KV"}
    groups = [(sd, l) for sd in "KV" for l in range(3)]
    for budget in (3 * 72.375 + 3 * 75.1875, 450, 470, 500, 540, 600):
        r = run("alloc", f, "--k", spec(ko), "--v", spec(vo), "--budget", str(budget), "--json")
        out = json.loads(r.stdout)
        best = None
        for combo in itertools.product(*[ko if sd == "K" else vo for sd, _ in groups]):
            cost = sum(b for _, _, b in combo)
            if cost <= budget + 1e-9:
                pk = sum(kld[g] / tot[g[0]] * o[1] for g, o in zip(groups, combo))
                best = pk if best is None else min(best, pk)
        check(abs(out["predicted_kld"] - best) < 1e-12, f"alloc budget {budget}: {out['predicted_kld']} vs {best}")
        check(out["bytes_per_token"] <= budget + 1e-9, f"alloc within budget {budget}")
        kb = {t: b for t, _, b in ko}
        vb = {t: b for t, _, b in vo}
        check(abs(sum(kb[t] for t in out["k_types"]) + sum(vb[t] for t in out["v_types"]) - out["bytes_per_token"])
              < 1e-9, f"alloc bytes add up at budget {budget}")
    r = run("alloc", f, "--k", spec(ko), "--v", spec(vo), "--budget", "500", "--suffix", " ks")
    w = r.stdout.split()
    check(r.returncode == 0 and len(w) >= 2 and w[0].count("/") == 1 and w[1] == "ks" and
          all(x.startswith("L") for x in w[2:]), f"alloc label: {r.stdout!r}")
    for k, v, b, what in ((spec(ko), spec(vo), "100", "below the cheapest"), ("tq2h5n8:0.03", spec(vo), "500", "TYPE:KLD:BYTES"),
                          ("tq2h5n8:x:72", spec(vo), "500", "TYPE:KLD:BYTES"), ("a:1:0", spec(vo), "500", "TYPE:KLD:BYTES"),
                          ("a:1:2,a:1:3", spec(vo), "500", "twice")):
        r = run("alloc", f, "--k", k, "--v", v, "--budget", b)
        check(r.returncode != 0 and what in r.stderr and r.stderr.strip().count("\n") == 0,
              f"alloc bad input ({what}): rc {r.returncode} stderr {r.stderr!r}")
    # 6. alloc --types: the options read from one-side `tq perplexity` results (bytes per layer
    # from kv_bytes_per_token minus the f16 side) give the same allocation as --k / --v.
    tres = one_side_results(ko, vo, 3 * 2 * 3 * 64 * 2, 3)  # 3 layers, K and V, 3 heads, D = 64, 2 B
    tf = os.path.join(td, "types.json")
    json.dump({"results": tres}, open(tf, "w"))
    for budget in ("450", "500", "540"):
        a = run("alloc", f, "--types", tf, "--budget", budget, "--json")
        b = run("alloc", f, "--k", spec(ko), "--v", spec(vo), "--budget", budget, "--json")
        check(a.returncode == 0 and json.loads(a.stdout) == json.loads(b.stdout),
              f"alloc --types = --k/--v at {budget}: {a.stdout!r} {a.stderr!r}")
    json.dump({"results": tres[:2]}, open(os.path.join(td, "t1.json"), "w"))
    json.dump({"results": tres[2:]}, open(os.path.join(td, "t2.json"), "w"))
    a = run("alloc", f, "--types", os.path.join(td, "t1.json"), "--types", os.path.join(td, "t2.json"), "--budget", "500")
    b = run("alloc", f, "--types", tf, "--budget", "500")
    check(a.returncode == 0 and a.stdout == b.stdout, f"alloc: two --types files = one: {a.stdout!r} {a.stderr!r}")
    json.dump({"results": tres + [dict(tres[0], kv={"label": "tq3/f16 L1:tq4/f16"})]}, open(os.path.join(td, "tl.json"), "w"))
    json.dump({"results": tres[:3]}, open(os.path.join(td, "tk.json"), "w"))
    json.dump({"results": [dict(tres[0], kld_mean=float("nan"))] + tres[1:]}, open(os.path.join(td, "tn.json"), "w"))
    for args, what in ((["--types", os.path.join(td, "tl.json")], "not a one-side config"),
                       (["--types", os.path.join(td, "tk.json")], "no V option"),
                       (["--types", bad], "cannot read the type costs"),
                       (["--types", tf, "--types", os.path.join(td, "t1.json")], "appears twice"),
                       (["--types", tf, "--k", spec(ko)], "--types FILE, or --k and --v"),
                       (["--k", spec(ko)], "--types FILE, or --k and --v"),
                       (["--types", os.path.join(td, "tn.json")], "without a valid kv.label")):
        r = run("alloc", f, *args, "--budget", "500")
        check(r.returncode != 0 and what in r.stderr and r.stderr.strip().count("\n") == 0,
              f"alloc bad types ({what}): rc {r.returncode} stderr {r.stderr!r}")
    for budget in ("nan", "-1", "inf"):
        r = run("alloc", f, "--types", tf, "--budget", budget)
        check(r.returncode != 0 and "not a byte count" in r.stderr, f"alloc --budget {budget}: {r.stderr!r}")
    r = run("sweep", "--layers", "0", "--k", "tq3", "--v", "tq3")
    check(r.returncode != 0 and "--layers" in r.stderr, f"zero layers: {r.stderr!r}")
    # 7. Per KV head: the sweep probes L<layer>.<head>; alloc over those units (brute force), the
    # --types bytes divided over the units, and the label names the heads.
    r = run("sweep", "--layers", "2", "--heads", "2", "--k", "tq2h5n8", "--v", "tq3n8", "--protect", "s1 ck")
    check(r.returncode == 0 and r.stdout.strip().split(";") == [
        "f16 s1 ck L0.0:tq2h5n8/f16", "f16 s1 ck L0.1:tq2h5n8/f16", "f16 s1 ck L1.0:tq2h5n8/f16",
        "f16 s1 ck L1.1:tq2h5n8/f16", "f16 L0.0:f16/tq3n8", "f16 L0.1:f16/tq3n8", "f16 L1.0:f16/tq3n8",
        "f16 L1.1:f16/tq3n8"], "per-head sweep string: " + r.stdout)
    hk = {("K", (0, 0)): 0.004, ("K", (0, 1)): 0.0002, ("K", (1, 0)): 0.001, ("K", (1, 1)): 0.003,
          ("V", (0, 0)): 0.0001, ("V", (0, 1)): 0.002, ("V", (1, 0)): 0.0035, ("V", (1, 1)): 0.0005}
    hres = [{"kv": {"label": f"f16 s1 ck L{l}.{h}:tq2h5n8/f16" if sd == "K" else f"f16 L{l}.{h}:f16/tq3n8"},
             "kld_mean": v} for (sd, (l, h)), v in hk.items()]
    hf = os.path.join(td, "h.json")
    json.dump({"results": hres}, open(hf, "w"))
    # options per unit (one KV head): whole-layer bytes / 2 heads
    hko = [("tq2h5n8", 0.03, 24.125), ("tq3h6n8", 0.008, 32.125)]
    hvo = [("tq3n8", 0.02, 25.0625), ("tq4n8", 0.005, 33.0625)]
    hg = [(sd, u) for sd in "KV" for u in ((0, 0), (0, 1), (1, 0), (1, 1))]
    htot = {sd: sum(v for (s_, _), v in hk.items() if s_ == sd) for sd in "KV"}
    for budget in (4 * 24.125 + 4 * 25.0625, 215, 230, 250, 300):
        r = run("alloc", hf, "--k", spec(hko), "--v", spec(hvo), "--budget", str(budget), "--json")
        out = json.loads(r.stdout)
        best = None
        for combo in itertools.product(*[hko if sd == "K" else hvo for sd, _ in hg]):
            if sum(b for _, _, b in combo) <= budget + 1e-9:
                pk = sum(hk[g] / htot[g[0]] * o[1] for g, o in zip(hg, combo))
                best = pk if best is None else min(best, pk)
        check(abs(out["predicted_kld"] - best) < 1e-12, f"per-head alloc {budget}: {out['predicted_kld']} vs {best}")
        check(out["units"] == ["0.0", "0.1", "1.0", "1.1"], f"per-head units: {out['units']}")
        for tok in out["label"].split()[1:]:
            check(all(len(x.split(".")) == 2 for x in tok[1:].split(":")[0].split(",")), f"head entries: {tok}")
    htres = one_side_results(hko, hvo, 2 * 2 * 2 * 64 * 2, 4)  # 2 layers, K and V, 2 heads, D = 64, 2 B
    htf = os.path.join(td, "htypes.json")
    json.dump({"results": htres}, open(htf, "w"))
    a = run("alloc", hf, "--types", htf, "--budget", "230", "--json")
    b = run("alloc", hf, "--k", spec(hko), "--v", spec(hvo), "--budget", "230", "--json")
    check(a.returncode == 0 and json.loads(a.stdout) == json.loads(b.stdout),
          f"per-head alloc --types = --k/--v: {a.stdout!r} {a.stderr!r}")
    json.dump({"results": hres + res}, open(os.path.join(td, "mix.json"), "w"))
    r = run("alloc", os.path.join(td, "mix.json"), "--types", htf, "--budget", "230")
    check(r.returncode != 0 and "mixes whole-layer and one-head" in r.stderr, f"mixed units: {r.stderr!r}")
    json.dump({"results": hres[1:]}, open(os.path.join(td, "hole.json"), "w"))
    r = run("alloc", os.path.join(td, "hole.json"), "--types", htf, "--budget", "230")
    check(r.returncode != 0 and "no K probe of L0.0" in r.stderr, f"missing head probe: {r.stderr!r}")

    # 8. --out writes the label as a cache config file (comments, then one entry per line) that
    # reads back to the printed label; an unwritable path is a one-line error and leaves nothing.
    cfg = os.path.join(td, "alloc.kv")
    r = run("alloc", hf, "--types", htf, "--budget", "230", "--out", cfg)
    lines = open(cfg).read().splitlines() if os.path.exists(cfg) else []
    body = [ln.split("#")[0].strip() for ln in lines if ln.split("#")[0].strip()]
    check(r.returncode == 0 and " ".join(body) == r.stdout.strip(), f"--out file = label: {lines} {r.stdout!r}")
    check(lines and lines[0].startswith("#") and "--out" in lines[1], f"--out header: {lines[:3]}")
    check(all(e.startswith("L") for e in body[1:]) and len(body) >= 2, f"--out: one L entry per line: {body}")
    bad = os.path.join(td, "no_such_dir", "x.kv")
    r = run("plan", f, "--base", "tq3h6n8/tq4n8", "--up-k", "tq4h6n8", "--up-v", "tq5n8", "--cost-k", "18",
            "--cost-v", "24", "--budget", "36", "--out", bad)
    check(r.returncode != 0 and r.stderr.count("\n") == 1 and "cannot write" in r.stderr, f"--out unwritable: {r.stderr!r}")
    r = run("plan", f, "--base", "tq3h6n8/tq4n8", "--up-k", "tq4h6n8", "--up-v", "tq5n8", "--cost-k", "18",
            "--cost-v", "24", "--budget", "36", "--out", os.path.join(td, "plan.kv"))
    check(r.returncode == 0 and open(os.path.join(td, "plan.kv")).read().splitlines()[3] == r.stdout.split()[0],
          f"plan --out: {r.stdout!r} {r.stderr!r}")

print("kv_layer_plan: %d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
