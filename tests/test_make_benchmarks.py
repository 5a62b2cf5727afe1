#!/usr/bin/env python3
"""bench/make_benchmarks.py: placeholders on a small hand-checked case, bad templates (one-line
error, exit 2), and the repository's BENCHMARKS.md equal to the generator's output."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "bench", "make_benchmarks.py")
failures = []


def run(*args):
    # From another directory: paths are the repository root's, not the caller's.
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, cwd=tempfile.gettempdir())


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


with tempfile.TemporaryDirectory() as td:
    os.makedirs(os.path.join(td, "bench", "benchmarks"))
    os.makedirs(os.path.join(td, "bench", "results"))

    def write(rel, text):
        with open(os.path.join(td, rel), "w") as f:
            f.write(text)

    json.dump({"results": [{"kv": {"label": "f16"}, "ppl_delta_pct": 0.0, "top1": 1.0},
                           {"kv": {"label": "tq3 s1 ck"}, "ppl_delta_pct": 1.23456, "top1": 0.9512}]},
              open(os.path.join(td, "bench", "results", "r.json"), "w"))
    write("bench/results/t.md", "Header line\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\ntrailer\n")
    write("bench/benchmarks/20-b.md", "## B\n\n{{include bench/results/t.md table}}\n")
    write("bench/benchmarks/10-a.md",
          "# A\n\nDelta {{value bench/results/r.json \"results[kv.label=tq3 s1 ck].ppl_delta_pct\" +.2f}}%,"
          " top-1 {{ value bench/results/r.json results.1.top1 %.1f }}%, label"
          " {{value bench/results/r.json results.0.kv.label}}.\n\n\n")
    write("bench/benchmarks/30-prose.md", "## Prose only\n\nNo placeholder.\n")
    write("bench/benchmarks/notes.txt", "not a template {{value nothing}}\n")
    want = ("# A\n\nDelta +1.23%, top-1 95.1%, label f16.\n\n"
            "## B\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
            "## Prose only\n\nNo placeholder.\n")
    r = run("--root", td)
    got = open(os.path.join(td, "BENCHMARKS.md")).read() if r.returncode == 0 else ""
    check(r.returncode == 0 and got == want, f"generated: {r.returncode} {r.stderr!r} {got!r}")
    r = run("--root", td, "--check")
    check(r.returncode == 0 and r.stderr == "", f"--check on a fresh file: {r.returncode} {r.stderr!r}")
    write("BENCHMARKS.md", want.replace("+1.23%", "+1.24%"))
    r = run("--root", td, "--check")
    check(r.returncode == 1 and "-Delta +1.24%" in r.stderr and "+Delta +1.23%" in r.stderr
          and "out of date" in r.stderr, f"--check on a stale file: {r.returncode} {r.stderr!r}")
    r = run("--root", td, "--sources")
    check(r.returncode == 0 and "bench/benchmarks/10-a.md: bench/results/r.json\n" in r.stdout
          and "bench/benchmarks/30-prose.md: prose\n" in r.stdout, f"--sources: {r.stdout!r}")

    for text, word in (("{{value bench/results/r.json results.5.top1}}", "bad list index"),
                       ("{{value bench/results/r.json results[kv.label=tq9].top1}}", "tq9"),
                       ("{{value bench/results/r.json results.0.nope}}", "nope"),
                       ("{{value bench/results/missing.json a}}", "no such file"),
                       ("{{include bench/results/r.json table}}", "no table"),
                       ("{{frobnicate x}}", "unknown placeholder"),
                       ("{{value \"unclosed}}", "quotation")):
        write("bench/benchmarks/40-bad.md", text + "\n")
        r = run("--root", td, "--out", os.path.join(td, "bad.md"))
        check(r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1 and word in r.stderr
              and "40-bad.md" in r.stderr and not os.path.exists(os.path.join(td, "bad.md")),
              f"bad template {text!r}: {r.returncode} {r.stderr!r}")

# The repository's BENCHMARKS.md is what the generator makes of the templates and results.
r = run("--check")
check(r.returncode == 0, f"BENCHMARKS.md out of date:\n{r.stderr[-3000:]}")

print("make_benchmarks: %d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
