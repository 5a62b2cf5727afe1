// One layer's attention call timed in CPU time (CLOCK_PROCESS_CPUTIME_ID) and wall time, so that
// two builds of the library can be compared on a loaded host: CPU time is what the call costs
// whatever else runs (at 1 thread; at 2, spinning waits count too). Gemma 3 270M's shape: head
// dim 256, 4 query heads over 1 KV head; synthetic keys (Gaussian, every 37th channel x8) and
// values, appended in batches of 1024; the queries at the last positions.
// Built by CMake (TQ_BUILD_BENCH) as build/attn_cpu_time, linked to that build tree's
// libturboquant.so; bench/attn_cpu_ab.sh compiles this same source against two trees' libraries
// (so both sides run one harness) with g++ -std=c++20 -O2 -fopenmp -Iinclude, -L and -rpath to
// each tree, -lturboquant.
// Usage: attn_cpu_time SPEC CONTEXT QUERIES STEPS KERNEL THREADS SLIDING_WINDOW [FLUSH_MB]
//   e.g. attn_cpu_time "k=tq4h6n8 v=tq3h6n8 sink=1 center=k,rope,512 scale-k" 16384 128 7 lut8 1 512
// FLUSH_MB > 0: before every timed call, read a buffer of that many MB (untimed), so the
// cache's bytes come from memory as in a model's decode step (the weights stream between two
// calls of a layer); 0 (default): back-to-back calls, the cache's bytes warm in L2 / L3.
// Prints one JSON line: the medians and minima over STEPS calls (after one warm-up call).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/blas_core.h"
#include "tq/common.h"
#include "tq/kv_cache.h"
#include "tq/kv_spec.h"
#include "tq/simd.h"

namespace {
double wall_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double cpu_s() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  tq::rerun_with_blas_kernels(argv, tq::simd::blas_core());  // the OpenBLAS kernels tq runs on
  if (argc != 8 && argc != 9) {
    std::fprintf(stderr, "usage: %s SPEC CONTEXT QUERIES STEPS KERNEL THREADS SLIDING_WINDOW [FLUSH_MB]\n", argv[0]);
    return 2;
  }
  try {
    const std::string spec = argv[1];
    const int N = std::atoi(argv[2]), nq = std::atoi(argv[3]), steps = std::atoi(argv[4]);
    const std::string kernel = argv[5];
    const int threads = std::atoi(argv[6]), window = std::atoi(argv[7]);
    const int flush_mb = argc == 9 ? std::atoi(argv[8]) : 0;
    if (N < 1 || nq < 1 || nq > N || steps < 1 || threads < 1 || window < 0 || flush_mb < 0) {
      std::fprintf(stderr, "attn_cpu_time: bad CONTEXT / QUERIES / STEPS / THREADS / SLIDING_WINDOW / FLUSH_MB\n");
      return 2;
    }
    const int D = 256, H = 4;
    tq::KvCacheConfig shape;
    shape.n_layers = 1;
    shape.n_kv_heads = 1;
    shape.head_dim = D;
    shape.max_tokens = N;
    shape.rope_base = 1e6f;
    shape.rope_dim = D;
    tq::KvCache cache(tq::KvSpec::parse(spec).resolve(shape));
    tq::Rng rng(1);
    std::vector<float> k(1024 * D), v(1024 * D), qo(1024 * H * D);
    for (int t0 = 0; t0 < N; t0 += 1024) {
      const int m = std::min(1024, N - t0);
      for (int i = 0; i < m * D; ++i) {
        k[i] = (float)rng.normal() * ((i % D) % 37 == 5 ? 8.f : 1.f);
        v[i] = (float)rng.normal();
      }
      for (int i = 0; i < m * H * D; ++i) qo[i] = (float)rng.normal();
      cache.observe_queries(0, m, qo.data(), H);  // scale-k chooses from the queries it sees
      cache.append(0, m, k.data(), v.data(), 1);
    }
    std::vector<float> q((size_t)nq * H * D), out(q.size());
    for (auto& x : q) x = (float)rng.normal() * 0.3f;
    tq::AttentionParams p;
    p.n_heads = H;
    p.kernel = tq::parse_attn_kernel(kernel);
    p.n_threads = threads;
    p.sliding_window = window;
    tq::attention(cache, 0, nq, q.data(), out.data(), p);  // warm-up
    std::vector<double> wall, cpu;
    std::vector<unsigned char> flush((size_t)flush_mb << 20, 1);
    unsigned sink = 0;
    for (int s = 0; s < steps; ++s) {
      for (size_t i = 0; i < flush.size(); i += 64) sink += flush[i];  // reads only, as weights are
      const double w0 = wall_s(), c0 = cpu_s();
      tq::attention(cache, 0, nq, q.data(), out.data(), p);
      cpu.push_back((cpu_s() - c0) * 1e3);
      wall.push_back((wall_s() - w0) * 1e3);
    }
    std::printf(
        "{\"spec\": \"%s\", \"context\": %d, \"queries\": %d, \"steps\": %d, \"kernel\": \"%s\", \"threads\": %d, "
        "\"sliding_window\": %d, \"flush_mb\": %d, \"cpu_ms_median\": %.4f, \"cpu_ms_min\": %.4f, \"wall_ms_median\": %.4f, "
        "\"wall_ms_min\": %.4f}\n",
        spec.c_str(), N, nq, steps, kernel.c_str(), threads, window, flush_mb, median(cpu),
        *std::min_element(cpu.begin(), cpu.end()), median(wall), *std::min_element(wall.begin(), wall.end()));
    if (sink == 1) std::fprintf(stderr, " ");  // keeps the flush reads
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn_cpu_time: %s\n", e.what());
    return 1;
  }
  return 0;
}
