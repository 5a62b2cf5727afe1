// Google Benchmark: decode attention and single-token append per KV type, and calls with
// several queries (prefill) per KV type with scalar and trellis codes.
//   ./build/bench_attention --benchmark_filter='Decode/tq4' --benchmark_min_time=1
//   ./build/bench_attention --benchmark_filter='Queries/' --benchmark_min_time=0.3
// Decode args: context, threads; Queries args: queries, 1 thread, over 2048 tokens.
// Shapes: head_dim 128, 32 query heads, 8 kv heads.
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bench_main.h"
#include "tq/common.h"
#include "tq/kv_cache.h"
#include "tq/kv_spec.h"
#include "tq/simd.h"

namespace {

constexpr int kD = 128, kH = 32, kKVH = 8;

struct Fixture {
  std::unique_ptr<tq::KvCache> cache;
  std::vector<float> q, out;
};

// One cache per (type, context, trellis), filled once with K ~ N(0,1) plus outlier channels, V ~ N(0,1).
// trellis: KvCacheConfig::trellis (trellis-coded tq parts).
Fixture& fixture(const std::string& type, int n, bool trellis = false) {
  static std::map<std::tuple<std::string, int, bool>, Fixture> cache;
  auto& f = cache[{type, n, trellis}];
  if (f.cache) return f;
  tq::KvCacheConfig cfg;
  cfg.n_kv_heads = kKVH;
  cfg.head_dim = kD;
  cfg.max_tokens = n + 100000;
  cfg.type_k = cfg.type_v = tq::parse_kv_format(type);
  cfg.trellis = trellis;
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

// n_q queries at the last n_q positions of a 2048-token cache, one thread (a prefill
// micro-batch's attention for one layer). Per call; divide by n_q for the cost per query.
void Queries(benchmark::State& state, const std::string& type, bool trellis) {
  constexpr int kTokens = 2048;
  auto& f = fixture(type, kTokens, trellis);
  const int n_q = (int)state.range(0);
  std::vector<float> q((size_t)n_q * kH * kD), out(q.size());
  tq::Rng rng(3);
  for (auto& x : q) x = (float)rng.normal();
  tq::AttentionParams p;
  p.n_heads = kH;
  p.n_threads = 1;
  p.pos0 = kTokens - n_q;
  for (auto _ : state) {
    tq::attention(*f.cache, 0, n_q, q.data(), out.data(), p);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["queries"] = n_q;
}

void Append(benchmark::State& state, const std::string& type) {
  tq::KvCacheConfig cfg;
  cfg.n_kv_heads = kKVH;
  cfg.head_dim = kD;
  cfg.max_tokens = 1 << 16;
  cfg.type_k = cfg.type_v = tq::parse_kv_format(type);
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
  for (const char* t : {"f16", "q8_0", "q4_0", "q4_0h", "tq3", "tq4", "tq2h3", "tq3h4"}) {
    benchmark::RegisterBenchmark((std::string("Decode/") + t).c_str(), Decode, std::string(t))
        ->ArgsProduct({{4096, 32768}, {1, 2}})
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark((std::string("Append/") + t).c_str(), Append, std::string(t))
        ->Unit(benchmark::kMicrosecond);
  }
  for (const char* t : {"tq2", "tq3", "tq4"})
    for (bool tc : {false, true})
      benchmark::RegisterBenchmark((std::string("Queries/") + t + (tc ? "_tc" : "")).c_str(), Queries,
                                   std::string(t), tc)
          ->ArgsProduct({{1, 2, 4, 8, 16, 32, 64}})
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  return run_benchmarks(argc, argv);
}
