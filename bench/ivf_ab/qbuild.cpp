// A/B helper for IVF build changes (not built by CMake): times one add() of the first N
// vectors into a cosine 4-bit IVF index with a 4-bit refining second stage (as the 1M bench),
// optionally saving it (to compare files across builds and thread counts):
//   g++ -O2 -std=c++20 -Iinclude bench/ivf_ab/qbuild.cpp -o /tmp/qbuild \
//       -Wl,-rpath,$PWD/build build/libturboquant.so -fopenmp
// Usage: qbuild BASE N NLIST KMEANS_ITERS THREADS [OUT.tqi]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <omp.h>
#include "tq/index.h"
#include "tq/vecs.h"
int main(int argc, char** argv) {
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
