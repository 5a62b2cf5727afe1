// The main of the Google Benchmark binaries (bench_*.cpp): they run on the OpenBLAS kernels tq
// runs on (src/common/blas_core.h: on OpenBLAS's Prescott fallback, run again with the set tq
// asks for) and the report's context names the set (blas_core).
#pragma once

#include <benchmark/benchmark.h>

#include "common/blas_core.h"
#include "tq/simd.h"

inline int run_benchmarks(int argc, char** argv) {
  tq::rerun_with_blas_kernels(argv, tq::simd::blas_core());
  benchmark::AddCustomContext("blas_core", tq::simd::blas_core());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
