// A/B helper for the IVF scan order (CMake builds it with TQ_BUILD_BENCH): loads an index file and searches
// the queries in calls of BATCH queries each, per query and list-major alternately (the
// internal override of src/search/index_internal.h), REPS rounds; prints R10@10, each
// order's median and best queries/s and median process CPU microseconds per query (steadier
// than wall time on a shared host), and whether both orders returned the same ids and scores.
// Usage: qorder INDEX QUERIES GT NPROBE RERANK THREADS REPS BATCH [ORDERS: 12 | 1 | 2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <set>
#include <string>
#include <vector>
#include "common/blas_core.h"
#include "search/index_internal.h"
#include "tq/index.h"
#include "tq/vecs.h"
#include "tq/simd.h"
int main(int argc, char** argv) {
  tq::rerun_with_blas_kernels(argv, tq::simd::blas_core());  // the OpenBLAS kernels tq runs on
  if (argc < 9) {
    std::fprintf(stderr, "usage: qorder INDEX QUERIES GT NPROBE RERANK THREADS REPS BATCH [ORDERS]\n");
    return 2;
  }
  auto ix = tq::Index::load(argv[1]);
  auto q = tq::read_vectors(argv[2]);
  auto gt = tq::read_ivecs(argv[3]);
  tq::SearchParams p;
  p.k = 10;
  p.nprobe = std::atoi(argv[4]);
  p.rerank = std::atoi(argv[5]);
  p.n_threads = std::atoi(argv[6]);
  const int reps = std::atoi(argv[7]);
  const size_t batch = std::max<size_t>(1, std::strtoul(argv[8], nullptr, 10));
  const std::string orders = argc > 9 ? argv[9] : "12";
  const size_t n = q.n, d = q.d;
  std::vector<std::vector<float>> s(3, std::vector<float>(n * 10));
  std::vector<std::vector<int64_t>> id(3, std::vector<int64_t>(n * 10));
  std::vector<std::vector<double>> t(3), cpu(3);
  auto cpu_now = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
  };
  for (int r = 0; r < reps; ++r)
    for (char oc : orders) {
      const int o = oc - '0';
      tq::set_ivf_scan_order(static_cast<tq::IvfScanOrder>(o));
      auto t0 = std::chrono::steady_clock::now();
      const double c0 = cpu_now();
      for (size_t b = 0; b < n; b += batch) {
        const size_t m = std::min(batch, n - b);
        ix.search(m, q.data.data() + b * d, p, s[o].data() + b * 10, id[o].data() + b * 10);
      }
      t[o].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      cpu[o].push_back(cpu_now() - c0);
    }
  for (char oc : orders) {
    const int o = oc - '0';
    size_t hit = 0;
    for (size_t i = 0; i < n; ++i) {
      std::set<int64_t> g(gt.row(i), gt.row(i) + 10);
      for (int j = 0; j < 10; ++j) hit += g.count(id[o][i * 10 + j]);
    }
    auto v = t[o];
    std::sort(v.begin(), v.end());
    auto c = cpu[o];
    std::sort(c.begin(), c.end());
    std::printf("order %s batch %zu nprobe %d rerank %d thr %d R10@10 %.4f qps median %.0f best %.0f cpu us/query %.1f\n",
                o == 1 ? "per-query " : "list-major", batch, p.nprobe, p.rerank, p.n_threads, hit / (10.0 * n),
                n / v[v.size() / 2], n / v[0], 1e6 * c[c.size() / 2] / n);
  }
  if (orders.size() == 2)
    std::printf("same ids: %s, same scores: %s\n", id[1] == id[2] ? "yes" : "NO",
                std::memcmp(s[1].data(), s[2].data(), s[1].size() * 4) == 0 ? "yes" : "NO");
}
