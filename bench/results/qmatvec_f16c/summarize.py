#!/usr/bin/env python3
"""summary.json of the fp16-scale A/B of the decode matvec kernels (BENCHMARKS.md "fp16 block
scales with F16C"): bq_{old,new}_{1,2,3}.json are three alternating runs of each build's
bench_qmatvec; per benchmark the median cpu_time of each build and new / old.
Usage: python3 bench/results/qmatvec_f16c/summarize.py"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import results_summary  # noqa: E402


def summarize():
    return results_summary.bench_ab(HERE, "cpu_time", "us", results_summary.fmt_name)


if __name__ == "__main__":
    summ = summarize()
    results_summary.write(HERE, summ, {})
    print(json.dumps(summ, indent=1))
