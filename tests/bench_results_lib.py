"""Helpers of the tests that check saved benchmark results against what BENCHMARKS.md says of
them (tests/test_flat_bench_results.py, tests/test_model_bench_results.py,
tests/test_ivf_bench_results.py): a failure list,
loading under bench/results/, a directory's summarize.py as a module, the text's ranges."""
import importlib.util
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RES = os.path.join(ROOT, "bench", "results")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def load(rel):
    return json.load(open(os.path.join(RES, rel)))


def summarize_module(name):
    """bench/results/NAME/summarize.py as a module (each directory's has the same file name)."""
    spec = importlib.util.spec_from_file_location(f"{name.replace('/', '_')}_summarize",
                                                  os.path.join(RES, name, "summarize.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def spread(xs, lo, hi, what, med=None, digits=1):
    """The text's "lo-hi" (and "median med") over the runs, to the digits it gives."""
    xs = sorted(xs)
    check(round(xs[0], digits) == lo and round(xs[-1], digits) == hi, f"{what}: {xs[0]:.3f}-{xs[-1]:.3f}, text {lo}-{hi}")
    if med is not None:
        check(round(xs[len(xs) // 2], digits) == med, f"{what}: median {xs[len(xs) // 2]:.3f}, text {med}")


def finish(what):
    """Exit non-zero when any statement failed, else say that all of `what` hold."""
    if failures:
        print(f"{len(failures)} statement(s) do not hold")
        sys.exit(1)
    print(f"{what}: all statements hold")
