// Google Benchmark: decode attention and single-token append per KV type.
//   ./build/bench_attention --benchmark_filter='Decode/tq4' --benchmark_min_time=1
// Args: context, threads. Shapes: head_dim 128, 32 query heads, 8 kv heads.
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tq/common.h"
#include "tq/kv_cache.h"

namespace {

constexpr int kD = 128, kH = 32, kKVH = 8;

struct Fixture {
  std::unique_ptr<tq::KvCache> cache;
  std::vector<float> q, out;
};

// One cache per (type, context), filled once with K ~ N(0,1) plus outlier channels, V ~ N(0,1).
Fixture& fixture(const std::string& type, int n) {
  static std::map<std::pair<std::string, int>, Fixture> cache;
  auto& f = cache[{type, n}];
  if (f.cache) return f;
  tq::KvCacheConfig cfg;
  cfg.n_kv_heads = kKVH;
  cfg.head_dim = kD;
  cfg.max_tokens = n + 100000;
  cfg.type_k = cfg.type_v = type;
  f.cache = std::make_unique<tq::KvCache>(cfg);
  tq::Rng rng(1);
  std::vector<float> k((size_t)1024 * kKVH * kD), v(k.size());
  for (int t0 = 0; t0 < n; t0 += 1024) {
    const int m = std::min(1024, n - t0);
    for (size_t i = 0; i < (size_t)m * kKVH * kD; ++i) {
      k[i] = (float)rng.normal() * ((i % kD) % 37 == 5 ? 8.f : 1.f);
      v[i] = (float)rng.normal();
    }
    f.cache->append(0, m, k.data(), v.data());
  }
  f.q.resize((size_t)kH * kD);
  for (auto& x : f.q) x = (float)rng.normal();
  f.out.resize(f.q.size());
  return f;
}

void Decode(benchmark::State& state, const std::string& type) {
  auto& f = fixture(type, (int)state.range(0));
  tq::AttentionParams p;
  p.n_heads = kH;
  p.n_threads = (int)state.range(1);
  for (auto _ : state) {
    tq::attention(*f.cache, 0, 1, f.q.data(), f.out.data(), p);
    benchmark::DoNotOptimize(f.out.data());
  }
  state.counters["bytes_per_token"] = f.cache->bytes_per_token();
}

void Append(benchmark::State& state, const std::string& type) {
  tq::KvCacheConfig cfg;
  cfg.n_kv_heads = kKVH;
  cfg.head_dim = kD;
  cfg.max_tokens = 1 << 16;
  cfg.type_k = cfg.type_v = type;
  tq::KvCache cache(cfg);
  tq::Rng rng(2);
  std::vector<float> k((size_t)kKVH * kD), v(k.size());
  for (auto& x : k) x = (float)rng.normal();
  for (auto& x : v) x = (float)rng.normal();
  for (auto _ : state) {
    if (cache.n_tokens(0) == cfg.max_tokens) {
      state.PauseTiming();
      cache.clear();
      state.ResumeTiming();
    }
    cache.append(0, 1, k.data(), v.data());
  }
  state.SetItemsProcessed(state.iterations());
}

void register_all() {
  for (const char* t : {"f16", "q8_0", "q4_0", "q4_0h", "tq3", "tq4", "tq2.5", "tq3.5"}) {
    benchmark::RegisterBenchmark((std::string("Decode/") + t).c_str(), Decode, std::string(t))
        ->ArgsProduct({{4096, 32768}, {1, 2}})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark((std::string("Append/") + t).c_str(), Append, std::string(t))
        ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
