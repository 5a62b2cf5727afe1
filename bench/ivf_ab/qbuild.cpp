// A/B helper for IVF build changes: times one add() of the first N vectors into a cosine 4-bit
// IVF index with a 4-bit refining second stage (as the 1M bench), optionally saving it (to
// compare files across builds and thread counts). Built by CMake (TQ_BUILD_BENCH) as
// build/qbuild, linked to that build tree's shared library (tests/test_bench_helpers.py runs it).
// Usage: qbuild BASE N NLIST KMEANS_ITERS THREADS [OUT.tqi]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <omp.h>
#include "common/blas_core.h"
#include "tq/index.h"
#include "tq/vecs.h"
#include "tq/simd.h"
int main(int argc, char** argv) {
  tq::rerun_with_blas_kernels(argv, tq::simd::blas_core());  // the OpenBLAS kernels tq runs on
  if (argc != 6 && argc != 7) {
    std::fprintf(stderr, "usage: %s BASE N NLIST KMEANS_ITERS THREADS [OUT.tqi]\n", argv[0]);
    return 2;
  }
  auto x = tq::read_vectors(argv[1], atol(argv[2]));
  tq::IndexConfig c; c.dim = x.d; c.bits = 4; c.metric = tq::Metric::cosine; c.nlist = atoi(argv[3]);
  c.rerank_bits = 4; c.rerank_refine = true; c.kmeans_iters = atoi(argv[4]);
  omp_set_num_threads(atoi(argv[5]));
  auto t0 = std::chrono::steady_clock::now();
  tq::Index ix(c);
  ix.add(x.n, x.data.data());
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("n %zu nlist %d build %.2f s\n", x.n, c.nlist, dt);
  if (argc > 6) ix.save(argv[6]);
}
