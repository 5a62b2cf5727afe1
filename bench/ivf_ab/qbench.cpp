// A/B helper for IVF search changes: loads an index file, searches all queries `reps` times,
// prints R10@10 and the best run's queries/s. Built by CMake (TQ_BUILD_BENCH) as build/qbench,
// linked to that build tree's shared library, so the qbench of two build trees compare their
// libraries alternately (tests/test_bench_helpers.py runs it).
// Usage: qbench INDEX QUERIES GT NPROBE RERANK THREADS REPS
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <vector>
#include "common/blas_core.h"
#include "tq/index.h"
#include "tq/vecs.h"
#include "tq/simd.h"
int main(int argc, char** argv) {
  tq::rerun_with_blas_kernels(argv, tq::simd::blas_core());  // the OpenBLAS kernels tq runs on
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s INDEX QUERIES GT NPROBE RERANK THREADS REPS\n", argv[0]);
    return 2;
  }
  auto ix = tq::Index::load(argv[1]);
  auto q = tq::read_vectors(argv[2]);
  auto gt = tq::read_ivecs(argv[3]);
  tq::SearchParams p;
  p.k = 10; p.nprobe = atoi(argv[4]); p.rerank = atoi(argv[5]); p.n_threads = atoi(argv[6]);
  int reps = atoi(argv[7]);
  std::vector<float> s(q.n * 10); std::vector<int64_t> id(q.n * 10);
  double best = 1e9;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    ix.search(q.n, q.data.data(), p, s.data(), id.data());
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt < best) best = dt;
  }
  size_t hit = 0;
  for (size_t i = 0; i < q.n; ++i) {
    std::set<int64_t> g(gt.row(i), gt.row(i) + 10);
    for (int j = 0; j < 10; ++j) hit += g.count(id[i * 10 + j]);
  }
  printf("nprobe %d rerank %d thr %d recall10@10 %.4f qps %.0f\n", p.nprobe, p.rerank, p.n_threads, hit / (10.0 * q.n), q.n / best);
}
