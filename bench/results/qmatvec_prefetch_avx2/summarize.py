#!/usr/bin/env python3
"""summary.json of the weight-prefetch A/B of the Highway decode kernels at the avx2 level
(BENCHMARKS.md "Weight prefetch in the AVX2 / SSE4 decode kernels"): bq_{old,new}_{1,2,3}.json
are three alternating runs of each build's `bench_qmatvec --benchmark_filter='Gemma(Stack|Head)/[12]'
--benchmark_repetitions=3` with TQ_SIMD=avx2; per benchmark (GemmaStack: Gemma 3 270M's 18
layers and output matrix, one row of x; GemmaHead: the output matrix alone; _tN: N threads) the
median wall time in ms of each build and new / old. Under "avx2_vs_avx3_dl": the new build
at the avx2 level (bq_avx2_N.json) and at avx3_dl (bq_avx3dl_N.json, the AVX-512 kernels),
GemmaStack only, alternating in a later run of 3; ratio avx3_dl / avx2. Under
"float_kernels_avx3_dl": the float-activation kernels (F32, F16, BF16, Q5_1, Q5_K), which
prefetch at every level, at this host's own level (avx3_dl), one row of x, matrices of 1.3-5.2
MB (`bench_qmatvec --benchmark_filter='run_fmt/simd/(F32|F16|BF16|Q5_1|Q5_K)/'
--benchmark_min_time=0.3`, float_avx3dl/bq_{old,new}_N.json, 3 alternating runs): median CPU
µs and new / old.
Usage: python3 bench/results/qmatvec_prefetch_avx2/summarize.py"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import results_summary  # noqa: E402


def name(n):
    """run_gemma/GemmaStack/2/real_time -> GemmaStack_t2."""
    parts = n.split("/")
    return f"{parts[1]}_t{parts[2]}"


def summarize():
    summ = results_summary.bench_ab(HERE, "real_time", "ms", name)
    summ["avx2_vs_avx3_dl"] = results_summary.bench_ab(HERE, "real_time", "ms", name, builds=("avx2", "avx3dl"))
    summ["float_kernels_avx3_dl"] = results_summary.bench_ab(os.path.join(HERE, "float_avx3dl"), "cpu_time", "us",
                                                             results_summary.fmt_name)
    return summ


if __name__ == "__main__":
    summ = summarize()
    results_summary.write(HERE, summ, {})
    print(json.dumps(summ, indent=1))
