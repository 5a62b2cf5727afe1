#!/usr/bin/env python3
"""scripts/reliability_table.py: a hand-checked case, bad input (exit 2), and RELIABILITY.md's
bad-input table equal to the rendering of tests/cli_bad_input_cases.json."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "scripts", "reliability_table.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import reliability_table as rt  # noqa: E402

failures = []


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, cwd=tempfile.gettempdir())


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


with tempfile.TemporaryDirectory() as td:
    cases = os.path.join(td, "cases.json")
    doc = os.path.join(td, "R.md")
    json.dump({"cases": [
        {"group": "G", "entry": "tq", "what": "no subcommand", "args": [], "expect": ["subcommand"], "exit": 2,
         "error": "tq: error: A subcommand is required"},
        {"group": "G", "entry": "tq x", "what": "a | in it", "args": ["x", "", "$SRC/configs/a.kv"],
         "expect": ["x"], "exit": 1, "error": "tq: error: bad 'a|b'"}]}, open(cases, "w"))
    open(doc, "w").write(f"# R\n\ntext\n\n{rt.BEGIN}\nold table\n{rt.END}\n\nmore\n")
    want = (f"# R\n\ntext\n\n{rt.BEGIN}\n| entry point | bad input | exit | error printed |\n|---|---|---|---|\n"
            "| tq | no subcommand: `tq ` | 2 | `tq: error: A subcommand is required` |\n"
            "| tq x | a \\| in it: `tq x '' configs/a.kv` | 1 | `tq: error: bad 'a\\|b'` |\n"
            f"{rt.END}\n\nmore\n")
    r = run("--cases", cases, "--doc", doc, "--check")
    check(r.returncode == 1 and "out of date" in r.stderr, f"--check on a stale file: {r.returncode} {r.stderr!r}")
    r = run("--cases", cases, "--doc", doc)
    got = open(doc).read()
    check(r.returncode == 0 and got == want, f"rendered: {r.returncode} {r.stderr!r} {got!r}")
    r = run("--cases", cases, "--doc", doc, "--check")
    check(r.returncode == 0, f"--check on a fresh file: {r.returncode} {r.stderr!r}")
    open(doc, "w").write("# no markers\n")
    r = run("--cases", cases, "--doc", doc)
    check(r.returncode == 2 and "marker" in r.stderr and r.stderr.count("\n") == 1, f"no markers: {r.stderr!r}")
    r = run("--cases", os.path.join(td, "missing.json"), "--doc", doc)
    check(r.returncode == 2 and "missing.json" in r.stderr, f"missing cases: {r.stderr!r}")

# The repository's RELIABILITY.md shows the cases the gtest checks.
r = run("--check")
check(r.returncode == 0, f"RELIABILITY.md out of date:\n{r.stderr[-3000:]}")

print("reliability_table: %d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
