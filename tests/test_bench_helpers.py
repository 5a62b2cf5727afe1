#!/usr/bin/env python3
"""The A/B helper programs CMake builds from bench/ (attn_cpu_time, qbuild, qbench, qorder) run: a small
attention call prints its JSON line; qbuild builds and saves an IVF index of 600 random vectors,
which qbench loads and searches with every list probed (recall against brute force); each
without its arguments prints its usage and exits 2.
Usage: test_bench_helpers.py ATTN_CPU_TIME QBUILD QBENCH"""
import json
import math
import os
import random
import re
import struct
import subprocess
import sys
import tempfile

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(*args):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300)


def main():
    attn, qbuild, qbench, qorder = sys.argv[1:5]
    for exe in (attn, qbuild, qbench, qorder):
        r = run(exe)
        check(r.returncode == 2 and "usage:" in r.stderr and r.stdout == "",
              f"{os.path.basename(exe)} without arguments: {r.returncode} {r.stderr!r}")

    r = run(attn, "f16", 256, 1, 3, "fused", 1, 0)
    check(r.returncode == 0, f"attn_cpu_time: {r.returncode} {r.stderr!r}")
    if r.returncode == 0:
        j = json.loads(r.stdout.strip().splitlines()[-1])
        check(j.get("context") == 256 and j.get("cpu_ms_median", -1) >= 0, f"attn_cpu_time JSON: {j}")

    rng = random.Random(5)
    n, d, nq, k = 600, 16, 20, 10
    x = [[rng.gauss(0, 1) for _ in range(d)] for _ in range(n)]
    q = [[v + rng.gauss(0, 0.1) for v in x[i * 7]] for i in range(nq)]
    unit = lambda v: [a / math.sqrt(sum(b * b for b in v)) for a in v]
    xu = [unit(v) for v in x]
    gt = []
    for v in q:
        u = unit(v)
        gt.append(sorted(range(n), key=lambda i: -sum(a * b for a, b in zip(u, xu[i])))[:k])
    with tempfile.TemporaryDirectory() as t:
        def fvecs(path, rows):
            with open(path, "wb") as f:
                for v in rows:
                    f.write(struct.pack("<i", d) + struct.pack(f"<{d}f", *v))
        base, qf, gtf, idx = (os.path.join(t, s) for s in ("base.fvecs", "q.fvecs", "gt.ivecs", "i.tqi"))
        fvecs(base, x)
        fvecs(qf, q)
        with open(gtf, "wb") as f:
            for row in gt:
                f.write(struct.pack("<i", k) + struct.pack(f"<{k}i", *row))
        r = run(qbuild, base, n, 8, 5, 1, idx)
        check(r.returncode == 0 and re.search(r"^n 600 nlist 8 build [0-9.]+ s$", r.stdout.strip()) is not None,
              f"qbuild: {r.returncode} {r.stdout!r} {r.stderr!r}")
        r = run(qbench, idx, qf, gtf, 8, 100, 1, 2)
        m = re.search(r"recall10@10 ([0-9.]+) qps ([0-9]+)", r.stdout)
        check(r.returncode == 0 and m is not None, f"qbench: {r.returncode} {r.stdout!r} {r.stderr!r}")
        print("qbench:", r.stdout.strip())
        if m:
            # Every list probed, 100 re-ranked by the 8-bit (4 + 4 refining) code: the top 10
            # of 600 is found nearly exactly.
            check(float(m.group(1)) >= 0.9, f"qbench recall {m.group(1)} < 0.9")
        # Both scan orders on the same index and queries, in calls of 8: the same answers.
        r = run(qorder, idx, qf, gtf, 8, 100, 1, 2, 8)
        check(r.returncode == 0 and "same ids: yes, same scores: yes" in r.stdout,
              f"qorder: {r.returncode} {r.stdout!r} {r.stderr!r}")
    print("ok" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
