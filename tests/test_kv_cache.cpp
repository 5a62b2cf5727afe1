// KvCache.* and Attention.*: format table, memory accounting, errors, fused attention vs the
// dequantize-then-exact reference for every type, shapes, windows and thread counts.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <numeric>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "kv_test_util.h"
#include "kv/attention_kernels.h"
#include "kv/kv_internal.h"
#include "tq/common.h"
#include "tq/error.h"
#include "tq/kv_cache.h"
#include "tq/simd.h"

namespace {

// Types whose fused path is compared with the reference.
const std::vector<std::string> kTypes = tq::kv_type_names();

// Default (float) kernels and exact mode vs reference: same codes, only float summation
// order differs (issue bound: 1e-5).
constexpr double kExactRelTol = 1e-5;
// lut8 mode (int8 lookup tables / int8 weights where a fused kernel uses them).
constexpr double kFastRelTol = 3e-2;

bool small() { return std::getenv("TQ_TEST_SMALL") != nullptr; }

// Gaussian rows with a few large outlier channels (like real keys).
void fill_kv(tq::Rng& rng, int n, int kvh, int D, std::vector<float>& k, std::vector<float>& v) {
  k.resize((size_t)n * kvh * D);
  v.resize((size_t)n * kvh * D);
  for (size_t i = 0; i < k.size(); ++i) {
    const int d = (int)(i % D);
    const float s = (d % 37 == 5) ? 8.f : 1.f;
    k[i] = (float)rng.normal() * s;
    v[i] = (float)rng.normal();
  }
}

using tq_test::rel_err;

struct Case {
  std::string type_k, type_v;
  int D, kvh, G, n_ctx, n_q, window;
};

// Fill a cache with n_ctx tokens (appended in two uneven batches), then compare attention of
// n_q queries (the last n_q positions) with attention_ref. rel_exact: the worse of the
// default kernels and exact mode; rel_fast: lut8 mode.
void check_case(const Case& c, int n_threads, double* rel_exact, double* rel_fast) {
  tq::KvCacheConfig cfg;
  cfg.n_layers = 2;
  cfg.n_kv_heads = c.kvh;
  cfg.head_dim = c.D;
  cfg.max_tokens = c.n_ctx + 8;
  cfg.type_k = tq::parse_kv_format(c.type_k);
  cfg.type_v = tq::parse_kv_format(c.type_v);
  cfg.window = c.window;
  tq::KvCache cache(cfg);
  tq::Rng rng(1234 + c.D + c.n_ctx);
  std::vector<float> k, v;
  fill_kv(rng, c.n_ctx, c.kvh, c.D, k, v);
  const int first = c.n_ctx / 3;
  const size_t row = (size_t)c.kvh * c.D;
  cache.append(1, first, k.data(), v.data());
  for (int t = first; t < c.n_ctx; t += 7) {
    const int n = std::min(7, c.n_ctx - t);
    cache.append(1, n, k.data() + t * row, v.data() + t * row);
  }
  ASSERT_EQ(cache.n_tokens(1), c.n_ctx);
  ASSERT_EQ(cache.n_tokens(0), 0);
  const int H = c.kvh * c.G;
  std::vector<float> q((size_t)c.n_q * H * c.D);
  for (auto& x : q) x = (float)rng.normal();
  std::vector<float> ref(q.size()), fused(q.size(), -1.f), exact(q.size(), -1.f), fast(q.size(), -1.f);
  tq::AttentionParams p;
  p.n_heads = H;
  p.n_threads = n_threads;
  tq::attention_ref(cache, 1, c.n_q, q.data(), ref.data(), p);
  tq::attention(cache, 1, c.n_q, q.data(), fused.data(), p);
  p.kernel = tq::AttnKernel::fused;
  tq::attention(cache, 1, c.n_q, q.data(), exact.data(), p);
  p.kernel = tq::AttnKernel::lut8;
  tq::attention(cache, 1, c.n_q, q.data(), fast.data(), p);
  *rel_exact = std::max(rel_err(fused, ref), rel_err(exact, ref));
  *rel_fast = rel_err(fast, ref);
}

std::string describe(const Case& c) {
  return c.type_k + "/" + c.type_v + " D=" + std::to_string(c.D) + " kvh=" + std::to_string(c.kvh) +
         " G=" + std::to_string(c.G) + " n=" + std::to_string(c.n_ctx) + " nq=" + std::to_string(c.n_q) +
         " W=" + std::to_string(c.window);
}

}  // namespace

TEST(KvCache, ParseAndNames) {
  const auto names = tq::kv_type_names();
  ASSERT_GE(names.size(), 18u);
  for (const auto& n : names) EXPECT_EQ(tq::kv_type_name(tq::parse_kv_type(n)), n);
  for (const char* n : {"f32", "f16", "q8_0", "q4_0", "q8_0h", "q4_0h", "tq1", "tq2", "tq3", "tq4",
                        "tq5", "tq6", "tq7", "tq8", "tq2h3", "tq3h4"})
    EXPECT_NO_THROW(tq::parse_kv_type(n)) << n;
  try {
    tq::parse_kv_type("q5_k");
    FAIL() << "no error";
  } catch (const tq::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("q5_k"), std::string::npos);
    EXPECT_NE(msg.find("tq3h4"), std::string::npos) << "lists the valid names: " << msg;
  }
  EXPECT_EQ(tq::kv_type_name(tq::kv_f16()), "f16");
}

// The kernel choice: names, the environment variable, and `reference` running attention_ref.
TEST(Attention, KernelChoice) {
  for (tq::AttnKernel k : {tq::AttnKernel::reference, tq::AttnKernel::fused, tq::AttnKernel::lut8})
    EXPECT_EQ(tq::parse_attn_kernel(tq::attn_kernel_name(k)), k);
  EXPECT_THROW(tq::parse_attn_kernel("exact"), tq::Error);
  const char* old = std::getenv("TQ_ATTN");
  const std::string saved = old ? old : "";
  unsetenv("TQ_ATTN");
  EXPECT_EQ(tq::attn_kernel_from_env(), tq::AttnKernel::fused);
  EXPECT_EQ(tq::attn_kernel_from_env(tq::AttnKernel::reference), tq::AttnKernel::reference);
  setenv("TQ_ATTN", "lut8", 1);
  EXPECT_EQ(tq::attn_kernel_from_env(), tq::AttnKernel::lut8);
  setenv("TQ_ATTN", "int8", 1);
  try {
    tq::attn_kernel_from_env();
    ADD_FAILURE() << "no error";
  } catch (const tq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("TQ_ATTN"), std::string::npos) << e.what();
  }
  if (old) setenv("TQ_ATTN", saved.c_str(), 1);
  else unsetenv("TQ_ATTN");

  tq::KvCacheConfig cfg = tq_test::kv_config(1, 2, 64, 100, "tq3", "tq4");
  tq::KvCache cache(cfg);
  tq::Rng rng(17);
  std::vector<float> k, v;
  fill_kv(rng, 90, 2, 64, k, v);
  cache.append(0, 90, k.data(), v.data());
  std::vector<float> q(3 * 6 * 64), a(q.size()), r(q.size());
  for (auto& x : q) x = (float)rng.normal();
  tq::AttentionParams p;
  p.n_heads = 6;
  p.kernel = tq::AttnKernel::reference;
  EXPECT_EQ(tq::attention_kernel(cache, 0, p), "reference");
  tq::attention(cache, 0, 3, q.data(), a.data(), p);
  tq::attention_ref(cache, 0, 3, q.data(), r.data(), p);
  EXPECT_EQ(a, r);
}

// Names of removed formats fail with what to use instead (docs/design.md, "Removed, and why").
TEST(KvCache, RemovedTypesSayWhatToUse) {
  const std::pair<const char*, const char*> removed[] = {
      {"tq3p", "use tq3h6 or tq4"}, {"tq4p", "use tq3h6 or tq4"}, {"tq2.5", "use tq2h3"}, {"tq3.5", "use tq3h4"}};
  for (const auto& [name, use] : removed) {
    EXPECT_EQ(tq::find_kv_type(name), nullptr) << name;
    try {
      tq::parse_kv_type(name);
      ADD_FAILURE() << name << ": no error";
    } catch (const tq::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(name), std::string::npos) << msg;
      EXPECT_NE(msg.find("removed"), std::string::npos) << msg;
      EXPECT_NE(msg.find(use), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
}

TEST(KvCache, BytesPerVector) {
  auto b = [](const char* t, int d) { return tq::kv_type_bytes(tq::parse_kv_type(t), d); };
  EXPECT_EQ(b("f32", 128), 512u);
  EXPECT_EQ(b("f16", 128), 256u);
  EXPECT_EQ(b("q8_0", 128), 136u);
  EXPECT_EQ(b("q4_0", 128), 72u);
  EXPECT_EQ(b("q4_0h", 128), 72u);
  EXPECT_EQ(b("tq4", 128), 66u);   // issue: at most 66
  EXPECT_EQ(b("tq3", 128), 50u);   // issue: at most 50
  EXPECT_EQ(b("tq1", 128), 18u);
  EXPECT_EQ(b("tq8", 64), 66u);
  // tqBhH: 32 channels at H bits + 96 at B bits + 2 fp16 norms (docs/design.md table)
  const std::pair<const char*, size_t> hh[] = {{"tq2h3", 40}, {"tq3h4", 56}, {"tq2h4", 44}, {"tq2h5", 48},
                                               {"tq3h5", 60}, {"tq3h6", 64}, {"tq4h5", 72}, {"tq4h6", 76}};
  for (const auto& [t, bytes] : hh) EXPECT_EQ(b(t, 128), bytes) << t;
  // tqBhHn8: the same with two 8-bit log norms (+ 4 B per 32-token block, not in the row)
  const std::pair<const char*, size_t> hn[] = {{"tq2h4n8", 42}, {"tq2h5n8", 46}, {"tq2h6n8", 50}, {"tq3h4n8", 54},
                                               {"tq3h5n8", 58}, {"tq3h6n8", 62},
                                               {"tq4h5n8", 70}, {"tq4h6n8", 74}};
  for (const auto& [t, bytes] : hn) EXPECT_EQ(b(t, 128), bytes) << t;
  EXPECT_EQ(b("tq3h6n8", 64), 32u);
  EXPECT_THROW(b("tq3h6", 96), tq::Error);  // split types: head_dim a multiple of 64
  EXPECT_THROW(b("tq3h6n8", 96), tq::Error);
  EXPECT_THROW(b("q4_0", 48), tq::Error);
  EXPECT_THROW(b("tq4", 40), tq::Error);
  EXPECT_THROW(b("f16", 8), tq::Error);
}

TEST(KvCache, BadConfig) {
  auto make = [](auto edit) {
    tq::KvCacheConfig cfg;
    cfg.head_dim = 64;
    cfg.max_tokens = 64;
    edit(cfg);
    tq::KvCache c(cfg);
  };
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.type_k = tq::parse_kv_format("bogus"); }), tq::Error);
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.type_v = tq::parse_kv_format("q4_1"); }), tq::Error);
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.type_k = tq::KvFormat::q8_0; c.head_dim = 48; }), tq::Error);
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.head_dim = 20; }), tq::Error);
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.window = 65; }), tq::Error);
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.window = -1; }), tq::Error);
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.n_layers = 0; }), tq::Error);
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.boundary_layers = 3; c.n_layers = 4; }), tq::Error);
  EXPECT_NO_THROW(make([](tq::KvCacheConfig&) {}));
}

TEST(KvCache, AppendPastCapacityAndBadCalls) {
  tq::KvCacheConfig cfg;
  cfg.n_kv_heads = 2;
  cfg.head_dim = 64;
  cfg.max_tokens = 40;
  tq::KvCache cache(cfg);
  std::vector<float> k(41 * 2 * 64, 0.5f), v(k.size(), -0.25f);
  cache.append(0, 39, k.data(), v.data());
  EXPECT_THROW(cache.append(0, 2, k.data(), v.data()), tq::Error);
  EXPECT_EQ(cache.n_tokens(0), 39);
  cache.append(0, 1, k.data(), v.data());
  EXPECT_THROW(cache.append(0, 1, k.data(), v.data()), tq::Error);
  EXPECT_THROW(cache.append(1, 1, k.data(), v.data()), tq::Error);  // layer out of range
  EXPECT_THROW(cache.n_tokens(-1), tq::Error);
  k[5] = NAN;
  cache.clear();
  EXPECT_THROW(cache.append(0, 1, k.data(), v.data()), tq::Error);
  EXPECT_EQ(cache.n_tokens(0), 0);
  std::vector<float> q(4 * 64, 1.f), out(q.size());
  tq::AttentionParams p;
  p.n_heads = 3;  // not a multiple of 2 kv heads
  EXPECT_THROW(tq::attention(cache, 0, 1, q.data(), out.data(), p), tq::Error);
  p.n_heads = 4;
  p.pos0 = 5;  // beyond the cached tokens
  EXPECT_THROW(tq::attention(cache, 0, 1, q.data(), out.data(), p), tq::Error);
}

TEST(KvCache, MemoryAccounting) {
  tq::KvCacheConfig cfg = tq_test::kv_config(4, 2, 128, 256, "q8_0", "q4_0");
  cfg.boundary_layers = 1;
  cfg.window = 16;
  tq::KvCache cache(cfg);
  // boundary layers 0 and 3 use f16 for K and V.
  const double expect = 2 * 2 * (256 + 256) + 2 * 2 * (136 + 72);
  EXPECT_DOUBLE_EQ(cache.bytes_per_token(), expect);
  EXPECT_EQ(cache.bytes_used(), 0u);
  std::vector<float> k(100 * 2 * 128, 0.1f), v(k.size(), 0.2f);
  for (int l = 0; l < 4; ++l) cache.append(l, 100, k.data(), v.data());
  // 84 quantized + 16 window rows (f16) per stream.
  const size_t window_bytes = (size_t)4 * 2 * 2 * 16 * 128 * 2;
  const size_t quant_bytes = (size_t)84 * (size_t)expect;
  EXPECT_EQ(cache.bytes_used(), quant_bytes + window_bytes);
  cache.clear();
  EXPECT_EQ(cache.bytes_used(), 0u);
  EXPECT_EQ(cache.n_tokens(2), 0);
}

TEST(Attention, EmptyCacheAndSingleToken) {
  for (const auto& t : kTypes) {
    tq::KvCacheConfig cfg;
    cfg.n_kv_heads = 2;
    cfg.head_dim = 64;
    cfg.max_tokens = 8;
    cfg.type_k = cfg.type_v = tq::parse_kv_format(t);
    tq::KvCache cache(cfg);
    std::vector<float> q(4 * 64, 0.3f), out(q.size(), 7.f);
    tq::AttentionParams p;
    p.n_heads = 4;
    tq::attention(cache, 0, 0, q.data(), out.data(), p);  // nothing to do
    EXPECT_EQ(out[0], 7.f);
    tq::attention(cache, 0, 1, q.data(), out.data(), p);  // no tokens: zeros
    for (float x : out) ASSERT_EQ(x, 0.f) << t;
    // One token: the output is that token's value (as stored).
    tq::Rng rng(7);
    std::vector<float> k(2 * 64), v(2 * 64);
    for (auto& x : k) x = (float)rng.normal();
    for (auto& x : v) x = (float)rng.normal();
    cache.append(0, 1, k.data(), v.data());
    std::vector<float> ref(q.size());
    tq::attention(cache, 0, 1, q.data(), out.data(), p);
    tq::attention_ref(cache, 0, 1, q.data(), ref.data(), p);
    EXPECT_LE(rel_err(out, ref), kExactRelTol) << t;
    p.kernel = tq::AttnKernel::lut8;
    tq::attention(cache, 0, 1, q.data(), out.data(), p);
    EXPECT_LE(rel_err(out, ref), kFastRelTol) << t;
    p.kernel = tq::AttnKernel::fused;
    tq::attention(cache, 0, 1, q.data(), out.data(), p);
    EXPECT_LE(rel_err(out, ref), kExactRelTol) << t;
    if (t != "f32" && t != "f16") continue;  // lossy types: compared with the reference above
    for (int h = 0; h < 4; ++h)
      for (int d = 0; d < 64; ++d) ASSERT_NEAR(out[h * 64 + d], v[(h / 2) * 64 + d], 2e-3) << t;
  }
}

TEST(Attention, FusedMatchesReferenceAllTypes) {
  const std::vector<int> dims = {64, 128, 256};
  for (const auto& t : kTypes)
    for (int D : dims) {
      Case c{t, t, D, 2, 4, small() ? 77 : 301, 1, 0};
      double re, rf;
      check_case(c, 2, &re, &rf);
      EXPECT_LE(re, kExactRelTol) << describe(c);
      EXPECT_LE(rf, kFastRelTol) << describe(c);
    }
}

TEST(Attention, GqaRatiosOddLengthsWindowsPrefill) {
  const std::vector<Case> cases = {
      {"f16", "f16", 128, 1, 1, 1, 1, 0},     {"f16", "f16", 64, 2, 3, 33, 1, 0},
      {"q8_0", "q4_0", 128, 2, 8, 95, 1, 0},  {"f32", "q8_0", 64, 3, 4, 129, 3, 0},
      {"q4_0", "f16", 128, 1, 3, 65, 5, 16},  {"f16", "q4_0", 256, 2, 4, 200, 1, 31},
      {"q8_0", "q8_0", 64, 1, 8, 40, 40, 32}, {"f16", "f16", 64, 2, 4, 4100, 1, 5},
      {"q4_0", "q4_0", 64, 2, 2, 2049, 17, 0},
      {"tq4", "tq4", 128, 2, 3, 97, 1, 0},     {"tq3", "tq3", 64, 1, 8, 2100, 1, 0},
      {"tq4", "tq3", 256, 2, 1, 70, 1, 0},     {"tq2h3", "tq3h4", 128, 2, 4, 161, 1, 32},
      {"tq3h4", "tq2", 64, 1, 3, 47, 9, 5},    {"tq1", "tq4", 128, 1, 4, 33, 1, 1},
      {"tq6", "tq8", 64, 2, 4, 41, 1, 0},      {"q4_0h", "q8_0h", 128, 2, 4, 77, 4, 20},
      {"f16", "tq4", 128, 2, 4, 300, 1, 0},    {"tq2", "f32", 64, 2, 4, 65, 1, 0},
  };
  for (const auto& c : cases) {
    double re, rf;
    check_case(c, 2, &re, &rf);
    EXPECT_LE(re, kExactRelTol) << describe(c);
    EXPECT_LE(rf, kFastRelTol) << describe(c);
  }
}

TEST(Attention, ThreadCountDoesNotChangeResult) {
  tq::KvCacheConfig cfg;
  cfg.n_kv_heads = 2;
  cfg.head_dim = 128;
  cfg.max_tokens = 5000;
  for (const auto& t : kTypes) {
    cfg.type_k = cfg.type_v = tq::parse_kv_format(t);
    tq::KvCache cache(cfg);
    tq::Rng rng(99);
    std::vector<float> k, v;
    fill_kv(rng, 4500, 2, 128, k, v);  // appended: n tokens below
    const int n = small() || t.find('p') != std::string::npos ? 2100 : 4500;  // > 1 KV chunk
    cache.append(0, n, k.data(), v.data());
    std::vector<float> q(8 * 128);
    for (auto& x : q) x = (float)rng.normal();
    std::vector<float> o1(q.size()), o2(q.size()), o3(q.size());
    tq::AttentionParams p;
    p.n_heads = 8;
    p.n_threads = 1;
    tq::attention(cache, 0, 1, q.data(), o1.data(), p);
    p.n_threads = 2;
    tq::attention(cache, 0, 1, q.data(), o2.data(), p);
    p.n_threads = 3;
    tq::attention(cache, 0, 1, q.data(), o3.data(), p);
    EXPECT_LE(rel_err(o2, o1), 1e-6) << t;
    EXPECT_LE(rel_err(o3, o1), 1e-6) << t;
  }
}

TEST(Attention, ScalarAndSimdLevelsAgree) {
  for (const auto& level : tq::simd::available_levels()) {
    for (const auto& t : kTypes) {
      Case c{t, t, 128, 2, 4, 150, 1, 0};
      double re, rf;
      {
        tq::simd::ScopedLevel sl(level);
        check_case(c, 1, &re, &rf);
      }
      EXPECT_LE(re, kExactRelTol) << level << " " << describe(c);
      EXPECT_LE(rf, kFastRelTol) << level << " " << describe(c);
    }
  }
}

TEST(Attention, PrefillWithExplicitPositions) {
  for (const char* t : {"f16", "tq4", "q4_0h"}) {
    tq::KvCacheConfig cfg;
    cfg.n_kv_heads = 2;
    cfg.head_dim = 64;
    cfg.max_tokens = 100;
    cfg.type_k = cfg.type_v = tq::parse_kv_format(t);
    cfg.window = 8;
    tq::KvCache cache(cfg);
    tq::Rng rng(3);
    std::vector<float> k, v;
    fill_kv(rng, 90, 2, 64, k, v);
    cache.append(0, 90, k.data(), v.data());
    std::vector<float> q(5 * 6 * 64), a(q.size()), r(q.size());
    for (auto& x : q) x = (float)rng.normal();
    tq::AttentionParams p;
    p.n_heads = 6;
    for (int pos0 : {0, 10, 85}) {
      p.pos0 = pos0;
      p.kernel = tq::AttnKernel::fused;
      tq::attention(cache, 0, 5, q.data(), a.data(), p);
      tq::attention_ref(cache, 0, 5, q.data(), r.data(), p);
      EXPECT_LE(rel_err(a, r), kExactRelTol) << t << " pos0=" << pos0;
      // Causality: the first query at pos0 = 0 sees only token 0.
      if (pos0 == 0) {
        tq::AttentionParams p1 = p;
        std::vector<float> one(6 * 64);
        tq::attention_ref(cache, 0, 1, q.data(), one.data(), p1);
        for (int i = 0; i < 6 * 64; ++i) ASSERT_NEAR(a[i], one[i], 1e-5);
      }
    }
  }
}

// Statistical: attention error vs exact f32 on unquantized vectors falls as bits rise, and
// the outlier split beats the plain type it extends (fixed seeds, 4 queries).
TEST(Attention, ErrorFallsWithBits) {
  const int n = small() ? 512 : 2048, D = 128, KVH = 2, H = 8;
  tq::Rng rng(11);
  std::vector<float> k, v;
  fill_kv(rng, n, KVH, D, k, v);
  std::vector<float> q(4 * H * D);
  for (auto& x : q) x = (float)rng.normal();
  auto err = [&](const std::string& t) {
    tq::KvCacheConfig cfg;
    cfg.n_kv_heads = KVH;
    cfg.head_dim = D;
    cfg.max_tokens = n;
    cfg.type_k = cfg.type_v = tq::parse_kv_format(t);
    tq::KvCache c(cfg);
    cfg.type_k = cfg.type_v = tq::KvFormat::f32;
    tq::KvCache e(cfg);
    c.append(0, n, k.data(), v.data());
    e.append(0, n, k.data(), v.data());
    std::vector<float> a(q.size()), r(q.size());
    tq::AttentionParams p;
    p.n_heads = H;
    for (int i = 0; i < 4; ++i) {
      tq::attention(c, 0, 1, &q[(size_t)i * H * D], &a[(size_t)i * H * D], p);
      tq::attention(e, 0, 1, &q[(size_t)i * H * D], &r[(size_t)i * H * D], p);
    }
    return rel_err(a, r);
  };
  const double e1 = err("tq1"), e2 = err("tq2"), e3 = err("tq3"), e4 = err("tq4"), e8 = err("tq8");
  const double e25 = err("tq2h3"), e35 = err("tq3h4"), q8 = err("q8_0");
  EXPECT_LT(e2, e1);
  EXPECT_LT(e3, e2);
  EXPECT_LT(e4, e3);
  EXPECT_LT(e8, e4);
  EXPECT_LT(e25, e2);
  EXPECT_LT(e35, e3);
  EXPECT_LT(e4, 0.5);   // measured ~0.2 on this data
  EXPECT_LT(q8, 0.1);   // measured ~0.03
}

TEST(KvCache, SplitPicksOutlierChannelsOnline) {
  tq::KvCacheConfig cfg;
  cfg.n_kv_heads = 2;
  cfg.head_dim = 128;
  cfg.max_tokens = 64;
  cfg.type_k = tq::KvFormat::tq2h3;
  cfg.type_v = tq::KvFormat::tq3h4;
  cfg.window = 4;
  tq::KvCache cache(cfg);
  tq::Rng rng(21);
  std::vector<float> k, v;
  fill_kv(rng, 10, 2, 128, k, v);  // K outliers on channels 5, 42, 79, 116
  for (int t = 0; t < 10; ++t) cache.append(0, 1, k.data() + t * 256, v.data() + t * 256);
  const auto& s = cache.impl().layers[0].k[1];
  ASSERT_TRUE(s.channels.frozen);
  ASSERT_EQ(s.d_hi, 32);
  std::vector<int> hi(s.channels.perm.begin(), s.channels.perm.begin() + 32);
  for (int c : {5, 42, 79, 116}) EXPECT_NE(std::find(hi.begin(), hi.end(), c), hi.end()) << c;
  // Every byte counted: 40 B per K vector, 56 B per V vector at D=128, plus the channel masks.
  EXPECT_DOUBLE_EQ(cache.bytes_per_token(), 2 * (40 + 56));
  EXPECT_EQ(cache.bytes_used(), (size_t)6 * 2 * (40 + 56) + 4 * 2 * 2 * 128 * 2 + 4 * 16);
}

// tqBhH: the high-precision channels are adjacent pairs chosen by K energy x query energy,
// position 0 left out; without queries, by K energy alone.
TEST(KvCache, QueryWeightedSplitFollowsTheQueries) {
  const int D = 64, n = 40, NH = 2;
  tq::Rng rng(5);
  std::vector<float> k((size_t)n * D), v(k.size()), q((size_t)n * NH * D);
  for (int t = 0; t < n; ++t)
    for (int d = 0; d < D; ++d) {
      k[(size_t)t * D + d] = (float)rng.normal() * (d < 16 ? 10.f : 1.f);  // K energy on 0..15
      v[(size_t)t * D + d] = (float)rng.normal();
      for (int h = 0; h < NH; ++h)  // query energy on 40..55
        q[((size_t)t * NH + h) * D + d] = (float)rng.normal() * (d >= 40 && d < 56 ? 3.f : 0.1f);
    }
  k[30] = 1e4f;  // position 0 (BOS): a huge key and query on channel 30, ignored
  q[30] = q[D + 30] = 1e4f;
  auto hi_channels = [&](bool with_queries) {
    const tq::KvCacheConfig cfg = tq_test::kv_config(1, 1, D, 2 * n, "tq3h5", "tq2h4");
    tq::KvCache cache(cfg);
    if (with_queries) cache.observe_queries(0, n, q.data(), NH);
    cache.append(0, n, k.data(), v.data());
    const auto& s = cache.impl().layers[0].k[0];
    EXPECT_TRUE(s.channels.frozen);
    EXPECT_EQ(s.d_hi, 16);
    // Frozen: later queries change nothing.
    std::vector<float> q2(q.size(), 1.f);
    cache.observe_queries(0, n, q2.data(), NH);
    EXPECT_EQ(cache.impl().layers[0].k[0].channels.q_n, with_queries ? n - 1 : 0);
    EXPECT_DOUBLE_EQ(cache.bytes_per_token(), 28 + 4 + 20 + 4);  // K (16*5+48*3)/8 + 2 fp16 norms; V (16*4+48*2)/8 + 4
    return std::vector<int>(s.channels.perm.begin(), s.channels.perm.begin() + 16);
  };
  std::vector<int> want_q(16), want_k(16);
  std::iota(want_q.begin(), want_q.end(), 40);
  std::iota(want_k.begin(), want_k.end(), 0);
  EXPECT_EQ(hi_channels(true), want_q);
  EXPECT_EQ(hi_channels(false), want_k);
  tq::KvCacheConfig cfg;
  cfg.n_kv_heads = 2;
  cfg.head_dim = D;
  tq::KvCache cache(cfg);
  EXPECT_THROW(cache.observe_queries(0, 1, q.data(), 3), tq::Error);  // 3 heads for 2 kv heads
  EXPECT_THROW(cache.observe_queries(1, 1, q.data(), 2), tq::Error);  // no layer 1
  EXPECT_NO_THROW(cache.observe_queries(0, 1, q.data(), 4));          // f16: a no-op
}

TEST(KvCache, BoundaryLayersUseTheirTypes) {
  tq::KvCacheConfig cfg = tq_test::kv_config(5, 1, 64, 64, "tq3", "tq2");
  cfg.boundary_layers = 2;
  cfg.boundary_type_k = tq::KvFormat::q8_0;
  cfg.boundary_type_v = tq::KvFormat::f16;
  tq::KvCache cache(cfg);
  const auto& L = cache.impl().layers;
  EXPECT_EQ(std::string(L[0].k[0].fmt->name), "q8_0");
  EXPECT_EQ(std::string(L[1].v[0].fmt->name), "f16");
  EXPECT_EQ(std::string(L[2].k[0].fmt->name), "tq3");
  EXPECT_EQ(std::string(L[2].v[0].fmt->name), "tq2");
  EXPECT_EQ(std::string(L[3].k[0].fmt->name), "q8_0");
  EXPECT_EQ(std::string(L[4].v[0].fmt->name), "f16");
  EXPECT_DOUBLE_EQ(cache.bytes_per_token(), 4 * (68 + 128) + (26 + 18));
}

TEST(KvCache, PerLayerTypesOverrideTheRest) {
  tq::KvCacheConfig cfg = tq_test::kv_config(5, 1, 64, 64, "tq3", "tq2");
  cfg.boundary_layers = 1;
  cfg.boundary_type_k = cfg.boundary_type_v = tq::KvFormat::q8_0;
  cfg.layer_type_k = tq_test::formats({"", "", "tq5", "", "f16"});  // layer 4 is a boundary layer: the override wins
  cfg.layer_type_v = tq_test::formats({"", "", "tq4n8", "", ""});
  tq::KvCache cache(cfg);
  const auto& L = cache.impl().layers;
  EXPECT_EQ(std::string(L[0].k[0].fmt->name), "q8_0");
  EXPECT_EQ(std::string(L[1].k[0].fmt->name), "tq3");
  EXPECT_EQ(std::string(L[2].k[0].fmt->name), "tq5");
  EXPECT_EQ(std::string(L[2].v[0].fmt->name), "tq4n8");
  EXPECT_EQ(std::string(L[3].v[0].fmt->name), "tq2");
  EXPECT_EQ(std::string(L[4].k[0].fmt->name), "f16");
  EXPECT_EQ(std::string(L[4].v[0].fmt->name), "q8_0");
  double expect = 0;
  for (const auto& layer : L)
    expect += tq::kv_type_bytes(tq::kv_type(layer.k[0].fmt->id), 64) + tq::kv_type_bytes(tq::kv_type(layer.v[0].fmt->id), 64);
  expect += 2.0 / 32;  // tq4n8: a 2-byte norm header per 32-token block
  EXPECT_DOUBLE_EQ(cache.bytes_per_token(), expect);
  // Attention through a mixed cache matches the reference on every layer.
  tq::Rng rng(11);
  std::vector<float> k(20 * 64), v(k.size()), q(2 * 64), out(q.size()), ref(q.size());
  for (auto& x : k) x = (float)rng.normal();
  for (auto& x : v) x = (float)rng.normal();
  for (auto& x : q) x = (float)rng.normal();
  tq::AttentionParams p;
  p.n_heads = 2;
  for (int l = 0; l < 5; ++l) {
    cache.append(l, 20, k.data(), v.data());
    tq::attention(cache, l, 1, q.data(), out.data(), p);  // one query at the last position
    tq::attention_ref(cache, l, 1, q.data(), ref.data(), p);
    EXPECT_LE(rel_err(out, ref), kExactRelTol) << "layer " << l;
  }
  cfg.layer_type_k = tq_test::formats({"tq3"});  // wrong length
  EXPECT_THROW(tq::KvCache bad(cfg), tq::Error);
  EXPECT_THROW(cfg.layer_type_k = tq_test::formats({"", "", "fp8", "", ""}), tq::Error);  // names: at the edge
}

TEST(KvCache, PerHeadTypesOverrideLayers) {
  // 3 layers x 3 KV heads; centred K (RoPE-rotating, 32-token segments) and centred V with a
  // sink: heads of one layer differ in type, f16 heads are never centred, and attention of
  // every query of a prefill batch matches the reference.
  const int L = 3, H = 3, D = 64, n = 100;
  tq::KvCacheConfig cfg = tq_test::kv_config(L, H, D, 128, "tq3", "tq3n8");
  cfg.sink = 1;
  cfg.center_k = cfg.center_v = cfg.center_rope = true;
  cfg.center_segment = 32;
  cfg.rope_base = 1e4f;
  cfg.rope_dim = D;
  cfg.layer_type_k = tq_test::formats({"", "tq2h5n8", ""});
  cfg.head_type_k.assign(L * H, std::nullopt);
  cfg.head_type_v.assign(L * H, std::nullopt);
  cfg.head_type_k[1 * H + 1] = tq::KvFormat::f16;  // wins over layer 1's tq2h5n8
  cfg.head_type_k[2 * H + 0] = tq::KvFormat::tq4;
  cfg.head_type_v[2 * H + 0] = tq::KvFormat::f16;  // layer 2: the V segments come from heads 1 and 2
  cfg.head_type_v[0 * H + 1] = tq::KvFormat::tq4;
  tq::KvCache cache(cfg);
  const auto& Ls = cache.impl().layers;
  const char* want_k[L][H] = {{"tq3", "tq3", "tq3"}, {"tq2h5n8", "f16", "tq2h5n8"}, {"tq4", "tq3", "tq3"}};
  const char* want_v[L][H] = {{"tq3n8", "tq4", "tq3n8"}, {"tq3n8", "tq3n8", "tq3n8"}, {"f16", "tq3n8", "tq3n8"}};
  double expect = 0;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      EXPECT_EQ(std::string(Ls[l].k[h].fmt->name), want_k[l][h]) << l << "." << h;
      EXPECT_EQ(std::string(Ls[l].v[h].fmt->name), want_v[l][h]) << l << "." << h;
      EXPECT_EQ(Ls[l].k[h].centre.on, std::string(want_k[l][h]) != "f16");
      EXPECT_EQ(Ls[l].v[h].centre.on, std::string(want_v[l][h]) != "f16");
      expect += (double)(Ls[l].k[h].block_bytes + Ls[l].v[h].block_bytes) / 32;
    }
  EXPECT_DOUBLE_EQ(cache.bytes_per_token(), expect);
  tq::Rng rng(12);
  std::vector<float> k((size_t)n * H * D), v(k.size()), q((size_t)n * 2 * H * D), out(q.size()), ref(q.size());
  for (auto& x : k) x = (float)rng.normal() + 0.5f;
  for (auto& x : v) x = (float)rng.normal() - 0.25f;
  for (auto& x : q) x = (float)rng.normal();
  tq::AttentionParams p;
  p.n_heads = 2 * H;
  for (int l = 0; l < L; ++l) {
    cache.append(l, n, k.data(), v.data());
    tq::attention(cache, l, n, q.data(), out.data(), p);  // the prefill batch, causal
    tq::attention_ref(cache, l, n, q.data(), ref.data(), p);
    EXPECT_LE(rel_err(out, ref), kExactRelTol) << "layer " << l;
  }
  cfg.head_type_k = tq_test::formats({"tq3"});  // wrong length
  EXPECT_THROW(tq::KvCache bad(cfg), tq::Error);
}

TEST(Attention, EdgeHeadDims) {
  const std::vector<Case> cases = {
      {"f16", "f16", 16, 1, 2, 40, 1, 0},    {"tq3", "tq4", 16, 1, 2, 40, 1, 0},
      {"tq1", "tq2", 48, 2, 1, 70, 2, 3},    {"f32", "tq8", 48, 1, 3, 33, 1, 0},
      {"tq4", "tq3", 512, 1, 4, 65, 1, 0},   {"tq3h4", "tq2h3", 192, 1, 2, 50, 1, 0},
      {"q4_0h", "q8_0", 96, 1, 4, 35, 1, 0},
  };
  for (const auto& c : cases) {
    double re, rf;
    check_case(c, 2, &re, &rf);
    EXPECT_LE(re, kExactRelTol) << describe(c);
    EXPECT_LE(rf, kFastRelTol) << describe(c);
  }
}

// The CLI prints one JSON object with one result per type and thread count.
TEST(Attention, BenchCliJson) {
  using tq_test::run_tq;
  const auto r = run_tq({"bench", "attention", "--head-dim", "64", "--n-heads", "4", "--n-kv-heads", "2", "--context",
                         "300", "--kv", "f16,tq4,q4_0h,tq4@lut8,tq3@tc,tq3@tc@lut8", "--threads", "1", "--steps", "1",
                         "--err-queries", "1", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["results"].size(), 6u);
  EXPECT_EQ(j["results"][1]["kv"], "tq4");
  EXPECT_EQ(j["results"][1]["k_bytes_per_head"], 34);  // 64 * 4 / 8 + 2
  EXPECT_GT(j["results"][1]["speedup_vs_f16"].get<double>(), 0.0);
  EXPECT_LT(j["results"][1]["rel_err_fused_vs_ref"].get<double>(), kExactRelTol);  // the timed kernel
  EXPECT_LT(j["results"][1]["rel_err_float_vs_ref"].get<double>(), kExactRelTol);
  EXPECT_LT(j["results"][3]["rel_err_fused_vs_ref"].get<double>(), kFastRelTol);  // tq4@lut8
  EXPECT_EQ(j["results"][3]["type_k"], "tq4");
  // '@tc': trellis codes, the same bytes as the scalar codes, same-codes checks as above
  EXPECT_EQ(j["results"][4]["trellis"], true);
  EXPECT_EQ(j["results"][4]["type_k"], "tq3");
  EXPECT_EQ(j["results"][1]["trellis"], false);
  EXPECT_LT(j["results"][4]["rel_err_fused_vs_ref"].get<double>(), kExactRelTol);
  EXPECT_LT(j["results"][5]["rel_err_fused_vs_ref"].get<double>(), kFastRelTol);
  if (tq::simd::current_level() == "avx3_dl") {
    EXPECT_EQ(j["results"][0]["kernel"], "f16");
    EXPECT_EQ(j["results"][1]["kernel"], "tq-float");
    EXPECT_EQ(j["results"][2]["kernel"], "rows");
    EXPECT_EQ(j["results"][3]["kernel"], "tq-lut8");
    EXPECT_EQ(j["results"][4]["kernel"], "tq-float");
    EXPECT_EQ(j["results"][5]["kernel"], "tq-lut8");
  }
  EXPECT_LT(j["results"][0]["rel_err"].get<double>(), 1e-2);  // f16 vs exact f32
  EXPECT_GT(j["results"][2]["append_tokens_per_s"].get<double>(), 0.0);
  // --queries: the timed call is a prefill of that many queries; its same-codes checks cover
  // every query of it.
  {
    const auto rq = run_tq({"bench", "attention", "--head-dim", "64", "--n-heads", "6", "--n-kv-heads", "2",
                            "--context", "300", "--queries", "40", "--kv", "f16,tq4,tq4@lut8", "--threads", "1",
                            "--steps", "1", "--err-queries", "1", "--json"});
    ASSERT_EQ(rq.status, 0) << rq.err;
    const auto jq = nlohmann::json::parse(rq.out);
    EXPECT_EQ(jq["queries"], 40);
    ASSERT_EQ(jq["results"].size(), 3u);
    EXPECT_GT(jq["results"][1]["ms_per_step"].get<double>(), 0.0);
    EXPECT_LT(jq["results"][1]["rel_err_fused_vs_ref"].get<double>(), kExactRelTol);
    EXPECT_LT(jq["results"][2]["rel_err_fused_vs_ref"].get<double>(), kFastRelTol);
    EXPECT_LT(jq["results"][2]["rel_err_float_vs_ref"].get<double>(), kExactRelTol);
  }
  // '@auto': the automatic protection of a QK-norm model (sink, RoPE-rotating K mean, scale-k);
  // --sliding-window: the timed calls and the same-codes check are a windowed layer's (40
  // queries: most of them run alone with a window start inside a block).
  {
    const auto rw = run_tq({"bench", "attention", "--head-dim", "64", "--n-heads", "4", "--n-kv-heads", "1",
                            "--context", "300", "--queries", "40", "--sliding-window", "50", "--kv",
                            "f16,tq4:tq3@auto,tq4:tq3@auto@lut8", "--threads", "1", "--steps", "1", "--err-queries",
                            "1", "--json"});
    ASSERT_EQ(rw.status, 0) << rw.err;
    const auto jw = nlohmann::json::parse(rw.out);
    EXPECT_EQ(jw["sliding_window"], 50);
    ASSERT_EQ(jw["results"].size(), 3u);
    EXPECT_EQ(jw["results"][0]["protection"], "plain");
    EXPECT_EQ(jw["results"][1]["protection"], "sink=1 center=k,rope,512 scale-k");
    EXPECT_LT(jw["results"][1]["rel_err_fused_vs_ref"].get<double>(), kExactRelTol);
    EXPECT_LT(jw["results"][2]["rel_err_fused_vs_ref"].get<double>(), kFastRelTol);
    EXPECT_LT(jw["results"][2]["rel_err_float_vs_ref"].get<double>(), kExactRelTol);
  }
  // More queries than context, unknown type or kernel suffix: a one-line error naming it.
  const std::pair<std::vector<std::string>, const char*> bad[] = {
      {{"--context", "10", "--queries", "11"}, "--queries"},
      {{"--kv", "tq4@lut9", "--context", "10"}, "lut9"},
      {{"--kv", "tq4@tc@x", "--context", "10"}, "'@x'"},
      {{"--sliding-window", "-1", "--context", "10"}, "--sliding-window"},
      {{"--kv", "q5_k", "--context", "10"}, "q5_k"}};
  for (const auto& [args, names] : bad) {
    std::vector<std::string> a{"bench", "attention"};
    a.insert(a.end(), args.begin(), args.end());
    const auto rb = run_tq(a);
    EXPECT_TRUE(tq_test::failed_cleanly(rb)) << names << ": exit " << rb.status << ", stderr: " << rb.err;
    EXPECT_NE(rb.err.find(names), std::string::npos) << rb.err;
  }
}

// Which decode kernel runs: every tq mse / split K with tq V up to 8 bits gets the
// fused float kernel at every SIMD level but scalar (the int8 one only when asked, on
// avx3_dl, up to 6 bits); formats without a fused kernel report "rows". Values are checked
// by the tests above.
TEST(Attention, KernelSelection) {
  const std::string level = tq::simd::current_level();
  if (level == "scalar") GTEST_SKIP() << "scalar level: row path only";
  auto kernel = [](const std::string& k, const std::string& v, int D, int G, bool lut8) {
    tq::KvCacheConfig cfg;
    cfg.n_kv_heads = 2;
    cfg.head_dim = D;
    cfg.max_tokens = 64;
    cfg.type_k = tq::parse_kv_format(k);
    cfg.type_v = tq::parse_kv_format(v);
    tq::KvCache cache(cfg);
    tq::Rng rng(5);
    std::vector<float> kk, vv;
    fill_kv(rng, 40, 2, D, kk, vv);
    cache.append(0, 40, kk.data(), vv.data());  // freezes the tq2h3 / tq3h4 selected channels
    tq::AttentionParams p;
    p.n_heads = 2 * G;
    p.kernel = lut8 ? tq::AttnKernel::lut8 : tq::AttnKernel::fused;
    return tq::attention_kernel(cache, 0, p);
  };
  for (const char* t : {"tq1", "tq2", "tq3", "tq4", "tq5", "tq6", "tq7", "tq8", "tq2h3", "tq3h4"}) {
    EXPECT_EQ(kernel(t, t, 128, 4, false), "tq-float") << t;
    EXPECT_EQ(kernel(t, "tq3", 64, 3, false), "tq-float") << t;
  }
  for (const char* t : {"tq2n8", "tq3n8", "tq4n8", "tq5n8"}) {
    EXPECT_EQ(kernel(t, "tq3n8", 64, 3, false), "tq-float") << t;
  }
  EXPECT_EQ(kernel("tq4", "tq3", 48, 2, false), "tq-float");   // D multiple of 16
  EXPECT_EQ(kernel("tq4", "tq3", 128, 5, false), "tq-float");  // G = 5: subgroups of 4 and 1
  EXPECT_EQ(kernel("f16", "f16", 64, 7, false), "f16");         // 4 + 3
  EXPECT_EQ(kernel("tq4", "f16", 128, 4, false), "rows");
  EXPECT_EQ(kernel("f16", "f16", 128, 4, false), "f16");
  EXPECT_EQ(kernel("q4_0h", "q4_0h", 128, 4, false), "rows");
  if (level == "avx3_dl") {
    EXPECT_EQ(kernel("tq4", "tq3", 128, 4, true), "tq-lut8");
    EXPECT_EQ(kernel("tq6", "tq6", 64, 3, true), "tq-lut8");
    for (const char* t : {"tq2n8", "tq3n8", "tq4n8", "tq5n8", "tq3h6n8", "tq4h5n8"}) {  // log-coded norms too
      EXPECT_EQ(kernel("tq5", t, 64, 3, true), "tq-lut8") << t;
      EXPECT_EQ(kernel(t, "tq4", 64, 3, true), "tq-lut8") << t;
    }
    EXPECT_EQ(kernel("tq7", "tq3", 128, 4, true), "tq-float");  // lut8 tables hold 6 bits
    EXPECT_EQ(kernel("tq4", "tq3", 64, 6, true), "tq-lut8");    // 4 + 2
  }
  for (const auto& lv : tq::simd::available_levels()) {  // Highway: every level but scalar
    tq::simd::ScopedLevel sl(lv);
    EXPECT_EQ(kernel("tq4", "tq3", 128, 4, false), lv == "scalar" ? "rows" : "tq-float") << lv;
    if (lv != "avx3_dl") EXPECT_EQ(kernel("tq4", "tq3", 128, 4, true), lv == "scalar" ? "rows" : "tq-float") << lv;
  }
  {  // per-head types: the distinct kernels of the layer's heads, in head order
    tq::KvCacheConfig cfg = tq_test::kv_config(2, 3, 64, 64, "tq4", "tq3");
    cfg.head_type_k.assign(6, std::nullopt);
    cfg.head_type_v.assign(6, std::nullopt);
    cfg.head_type_k[1] = cfg.head_type_v[1] = tq::KvFormat::f16;  // layer 0: tq, f16, tq
    cfg.head_type_k[5] = tq::KvFormat::f16;                       // layer 1: tq, tq, f16 K with tq V
    tq::KvCache cache(cfg);
    tq::Rng rng(5);
    std::vector<float> kk, vv;
    fill_kv(rng, 40, 3, 64, kk, vv);
    for (int l = 0; l < 2; ++l) cache.append(l, 40, kk.data(), vv.data());
    tq::AttentionParams p;
    p.n_heads = 9;
    const bool fused = level != "scalar";
    EXPECT_EQ(tq::attention_kernel(cache, 0, p), fused ? "tq-float+f16" : "rows+f16");
    EXPECT_EQ(tq::attention_kernel(cache, 1, p), fused ? "tq-float+rows" : "rows");
  }
  tq::KvCacheConfig cfg;
  tq::KvCache cache(cfg);
  tq::AttentionParams p;
  EXPECT_THROW(tq::attention_kernel(cache, 3, p), tq::Error);
}

TEST(KvCache, TrellisCodesCutErrorAndMatchReference) {
  // KvCacheConfig::trellis: same bytes per token, ~30% less squared error on the 1-4-bit parts,
  // the float kernel (8+ lanes; rows below) equal to attention_ref at every SIMD level, lut8
  // (avx3_dl) within its int8 tolerance.
  // Gaussian keys without fill_kv's 8x channels: a key dominated by two channels is, after the
  // rotation, a few levels that a 2-bit scalar code hits and a trellis code (4 values reachable
  // per step) does not (docs/design.md, "Trellis codes").
  const int n = small() ? 300 : 700, D = 64, KVH = 2, H = 6;
  tq::Rng rng(21);
  std::vector<float> k((size_t)n * KVH * D), v(k.size());
  for (auto& x : k) x = (float)rng.normal();
  for (auto& x : v) x = (float)rng.normal();
  std::vector<float> q(4 * H * D);
  for (auto& x : q) x = (float)rng.normal();
  tq::KvCacheConfig ecfg = tq_test::kv_config(1, KVH, D, n, "f32", "f32");
  tq::KvCache exact(ecfg);
  exact.append(0, n, k.data(), v.data());
  std::vector<float> r(q.size());
  tq::AttentionParams p;
  p.n_heads = H;
  for (int i = 0; i < 4; ++i) tq::attention(exact, 0, 1, &q[(size_t)i * H * D], &r[(size_t)i * H * D], p);
  for (const char* t : {"tq1", "tq2", "tq3", "tq4", "tq3n8", "tq2h4n8", "tq3h6", "tq2h3"}) {
    double err[2];
    for (int tc = 0; tc < 2; ++tc) {
      tq::KvCacheConfig cfg = tq_test::kv_config(1, KVH, D, n, t, t);
      cfg.trellis = tc == 1;
      tq::KvCache c(cfg);
      c.append(0, n / 3, k.data(), v.data());
      c.append(0, n - n / 3, k.data() + (size_t)(n / 3) * KVH * D, v.data() + (size_t)(n / 3) * KVH * D);
      std::vector<float> ref(q.size());
      for (int i = 0; i < 4; ++i) tq::attention_ref(c, 0, 1, &q[(size_t)i * H * D], &ref[(size_t)i * H * D], p);
      for (const auto& lv : tq::simd::available_levels()) {
        tq::simd::ScopedLevel sl(lv);
        for (bool lut8 : {false, true}) {
          tq::AttentionParams pl = p;
          pl.kernel = lut8 ? tq::AttnKernel::lut8 : tq::AttnKernel::fused;
          std::vector<float> a(q.size());
          for (int i = 0; i < 4; ++i) tq::attention(c, 0, 1, &q[(size_t)i * H * D], &a[(size_t)i * H * D], pl);
          const std::string kernel = tq::attention_kernel(c, 0, pl);
          if (tc == 1 && lut8 && lv == "avx3_dl") {  // trellis streams: lut8's 256-entry tables
            EXPECT_EQ(kernel, "tq-lut8") << t;
            EXPECT_LE(rel_err(a, ref), kFastRelTol) << t << " trellis lut8";
          } else if (tc == 1) {  // the float kernel where it has 8+ lanes
            EXPECT_EQ(kernel, lv == "scalar" || lv == "sse4" ? "rows" : "tq-float") << t << " " << lv;
            EXPECT_LE(rel_err(a, ref), kExactRelTol) << t << " trellis " << lv << (lut8 ? " lut8" : "");
          }
          if (lv == tq::simd::available_levels().front() && !lut8) err[tc] = rel_err(a, r);
        }
      }
    }
    // Attention-output error: the squared error falls ~30% at 2-4 bits (relative error ~15%),
    // ~19% at 1 bit (relative error ~10%; measured 0.94x with the small test sizes).
    const double bound = std::string(t) == "tq1" ? 0.97 : 0.93;
    EXPECT_LT(err[1], bound * err[0]) << t << ": trellis " << err[1] << " scalar " << err[0];
  }
  tq::KvCacheConfig a = tq_test::kv_config(1, KVH, D, n, "tq3", "tq3"), b = a;
  b.trellis = true;
  tq::KvCache ca(a), cb(b);
  ca.append(0, n, k.data(), v.data());
  cb.append(0, n, k.data(), v.data());
  EXPECT_EQ(ca.bytes_used(), cb.bytes_used());
}

namespace {

// What the two append tests below compare: attention of the last 40 queries, the K means and
// the bytes of a cache filled the same way twice.
struct FilledCache {
  std::vector<float> out, mu;
  size_t bytes = 0;
};

// Random K / V (fill_kv) and queries of n tokens.
struct RopeCacheInputs {
  std::vector<float> k, v, q;
  RopeCacheInputs(uint64_t seed, int n, int KVH, int D, int H) : q((size_t)n * H * D) {
    tq::Rng rng(seed);
    fill_kv(rng, n, KVH, D, k, v);
    for (auto& x : q) x = (float)rng.normal();
  }
};

// A 2-layer cache of `cfg`'s types with one sink, an 8-token window and RoPE-rotating K means
// per 64 tokens, filled with k / v (n tokens) by a prefill in two batches, then single tokens
// (which never run in parallel) on `threads`; `observe`: the queries are observed first (K
// scaling); `prepare` may change the cache before the appends.
template <class Prepare>
FilledCache fill_rope_cache(tq::KvCacheConfig cfg, int n, int H, const RopeCacheInputs& in, int threads, bool observe,
                            Prepare prepare) {
  const int D = cfg.head_dim, KVH = cfg.n_kv_heads;
  const std::vector<float>&k = in.k, &v = in.v, &q = in.q;
  cfg.sink = 1;
  cfg.window = 8;
  cfg.center_k = cfg.center_rope = true;
  cfg.center_segment = 64;
  cfg.rope_base = 10000;
  cfg.rope_dim = D;
  tq::KvCache c(cfg);
  prepare(c);
  for (int t0 = 0, m; t0 < n; t0 += m) {
    m = t0 == 0 ? n / 2 : (t0 < n - 20 ? n - 20 - t0 : 1);
    for (int l = 0; l < cfg.n_layers; ++l) {
      if (observe) c.observe_queries(l, m, &q[(size_t)t0 * H * D], H);
      c.append(l, m, &k[(size_t)t0 * KVH * D], &v[(size_t)t0 * KVH * D], threads);
    }
  }
  FilledCache f;
  for (const auto& L : c.impl().layers)
    for (const auto& s : L.k) f.mu.insert(f.mu.end(), s.centre.mu.begin(), s.centre.mu.end());
  tq::AttentionParams p;
  p.n_heads = H;
  p.pos0 = n - 40;
  f.out.resize((size_t)40 * H * D);
  tq::attention(c, 1, 40, &q[(size_t)(n - 40) * H * D], f.out.data(), p);
  f.bytes = c.bytes_used();
  return f;
}

}  // namespace

TEST(KvCache, ParallelAppendStoresTheSameCache) {
  // append(..., n_threads) encodes the streams of a layer in parallel from 16 tokens on: the
  // cache (bytes and every attention output) must not depend on the thread count. Covers the
  // per-stream state that appends move: means (RoPE-rotating, segmented), K scaling from the
  // observed queries, the outlier channel choice, sinks, the window, trellis codes.
  const int n = small() ? 150 : 400, D = 64, KVH = 3, H = 9;
  const RopeCacheInputs in(23, n, KVH, D, H);
  struct Cfg { const char* k; const char* v; bool trellis; };
  for (const Cfg& t : {Cfg{"tq2h4n8", "tq3n8", true}, Cfg{"tq3h4", "tq4", false}, Cfg{"q4_0h", "f16", false}}) {
    tq::KvCacheConfig cfg = tq_test::kv_config(2, KVH, D, n, t.k, t.v);
    cfg.trellis = t.trellis;
    cfg.scale_k = true;
    const FilledCache a = fill_rope_cache(cfg, n, H, in, 1, true, [](tq::KvCache&) {});
    const FilledCache b = fill_rope_cache(cfg, n, H, in, 3, true, [](tq::KvCache&) {});
    EXPECT_EQ(a.bytes, b.bytes) << t.k;
    EXPECT_EQ(a.out, b.out) << t.k << "/" << t.v << ": the thread count changed the cache";
  }
}

TEST(KvCache, N8BlockBaseEqualsExp2) {
  // The kernels' tq_n8 block factor 2^(e / 32) comes from a table for common exponents: the same
  // float as exp2 for every int16 exponent.
  for (int e = -32768; e < 32768; ++e) {
    const int16_t v = (int16_t)e;
    uint8_t hdr[2];
    std::memcpy(hdr, &v, 2);
    const float want = std::exp2((float)e * (1.0f / tq::kv::kN8Steps));
    ASSERT_EQ(tq::kv::n8_block_base(hdr), want) << e;
  }
}

TEST(KvCache, RopeBlockTermsMatchTheirDefinition) {
  // rope_block_terms (the RoPE-rotating K mean's per-block logit terms, both tq kernels) takes
  // cos / sin of each block's angle from a seed per 16 blocks turned once; at every SIMD level
  // its terms equal the definition in double (attention_kernels.h) up to float rounding, for
  // ranges starting on and off a seed, 1 to 5 heads, fast and slow pairs.
  const int D = 64, n = 6000, P = D / 2, F = std::min(P, tq::kv::kRopeExactPairs), sink = 1;
  tq::KvCacheConfig cfg = tq_test::kv_config(1, 1, D, n, "tq4", "tq4");
  tq_test::rope_centred_k(cfg, 1e6f, sink);
  tq::KvCache c(cfg);
  const tq::kv::Stream& s = c.impl().layers[0].k[0];
  ASSERT_TRUE(s.centre.rope);
  const int mst = tq::kv::rope_mc_stride(s), RB = tq::kv::kRopeMaxBlocks;
  tq::Rng rng(77);
  std::vector<float> mc((size_t)5 * mst);
  for (auto& x : mc) x = (float)rng.normal();
  struct Range {
    int b0, nb;
  };
  const Range ranges[] = {{0, 64}, {37, 64}, {150, 37}, {176, 1}, {5, 16}};
  for (const std::string& lv : tq::simd::available_levels()) {
    tq::simd::ScopedLevel level(lv);
    for (int G : {1, 4, 5})
      for (const Range& rg : ranges) {
        std::vector<float> out((size_t)G * tq::kv::rope_terms_stride(), 0.f);
        tq::kv::rope_block_terms(s, mc.data(), G, rg.b0, rg.nb, out.data());
        for (int g = 0; g < G; ++g) {
          const float* m = mc.data() + (size_t)g * mst;
          const float* r = out.data() + (size_t)g * tq::kv::rope_terms_stride();
          double mag = std::fabs(m[2 * P]);
          for (int i = 0; i < 2 * P; ++i) mag += std::fabs(m[i]);
          for (int k = 0; k < rg.nb; ++k) {
            const int b = rg.b0 + k;
            double cc = m[2 * P], dd = 0, ee = 0;
            for (int i = 0; i < P; ++i) {
              const double w = std::pow(1e6, -2.0 * i / D);
              const double pos = i < F ? sink + b * tq::kv::kBlock : sink + b * tq::kv::kBlock + 15.5;
              const double C = std::cos(pos * w), S = std::sin(pos * w);
              const double v = m[i] * C + m[P + i] * S, u = m[P + i] * C - m[i] * S;
              if (i < F) {
                EXPECT_NEAR(r[(size_t)(tq::kv::kRopeSlowRows + 2 * i) * RB + k], v, 2e-6 * mag) << lv << " " << b;
                EXPECT_NEAR(r[(size_t)(tq::kv::kRopeSlowRows + 2 * i + 1) * RB + k], u, 2e-6 * mag) << lv << " " << b;
              } else {
                cc += v;
                dd += w * u;
                ee -= 0.5 * w * w * v;
              }
            }
            EXPECT_NEAR(r[k], cc, 2e-6 * mag) << lv << " G " << G << " block " << b;
            EXPECT_NEAR(r[RB + k], dd, 2e-6 * mag) << lv << " G " << G << " block " << b;
            EXPECT_NEAR(r[2 * RB + k], ee, 2e-6 * mag) << lv << " G " << G << " block " << b;
          }
        }
      }
  }
}

TEST(KvCache, RopeAngleTableStoresTheSameCache) {
  // append() computes the RoPE-rotating means' cos / sin once per appended position range
  // (kv::RopeTurns) and the streams look them up; a stream without the table computes them in
  // place. Both must store the same cache, bit for bit: the means (taken of keys turned back
  // to position 0), the codes, and what attention reads. Covers prefill batches, single
  // tokens, window evictions (positions outside the range), a first batch longer than the
  // table (kRopeTurnsMax: the rest computed in place) and segmented means.
  const int n = 2 * tq::kv::kRopeTurnsMax + 100, D = 64, KVH = 3, H = 9;
  const RopeCacheInputs in(29, n, KVH, D, H);
  for (const char* kt : {"tq3h5n8", "tq4"}) {
    const tq::KvCacheConfig cfg = tq_test::kv_config(2, KVH, D, n, kt, "tq3n8");
    const FilledCache a = fill_rope_cache(cfg, n, H, in, 2, false, [](tq::KvCache&) {});
    int cleared = 0;
    const FilledCache b = fill_rope_cache(cfg, n, H, in, 2, false, [&](tq::KvCache& c) {
      for (auto& L : c.impl().layers)
        for (auto& s : L.k) cleared += s.centre.turns != nullptr, s.centre.turns = nullptr;
    });
    EXPECT_EQ(cleared, 2 * KVH) << kt << ": every K stream should read the table";
    EXPECT_FALSE(a.mu.empty()) << kt;
    EXPECT_EQ(a.mu, b.mu) << kt << ": the means differ";
    EXPECT_EQ(a.out, b.out) << kt << ": the cache differs";
  }
}

namespace {

// RoPE-rotating K means per 128 tokens (the attention driver's centred path).
void center_rope_k(tq::KvCacheConfig& cfg, int D) {
  cfg.center_k = cfg.center_rope = true;
  cfg.center_segment = 128;
  cfg.rope_base = 10000;
  cfg.rope_dim = D;
}

// The nq queries of q (H heads x D each) one call each, query i at position p.pos0 + i.
std::vector<float> one_query_calls(const tq::KvCache& c, const std::vector<float>& q, int nq, int H, int D,
                                   const tq::AttentionParams& p) {
  std::vector<float> out(q.size());
  for (int i = 0; i < nq; ++i) {
    tq::AttentionParams p1 = p;
    p1.pos0 = p.pos0 + i;
    tq::attention(c, 0, 1, &q[(size_t)i * H * D], &out[(size_t)i * H * D], p1);
  }
  return out;
}

}  // namespace

TEST(Attention, GqaRatiosWithoutInstanceRunAsSubgroups) {
  // 5, 6, 7, 12 query heads per kv head: the tq kernels run on subgroups of instanced sizes
  // (8, 4, 3, 2, 1) over copies of their rows, the f16 kernel on all the rows in one call. Decode and prefill calls, f16 and tq caches, RoPE-rotating K means (their per-row coefficients are copied too), a sink and a window.
  const int n = small() ? 200 : 420, D = 64, KVH = 2;
  tq::Rng rng(41);
  std::vector<float> k, v;
  fill_kv(rng, n, KVH, D, k, v);
  struct Case {
    const char *k, *v;
    bool centred;
    const char* kernel;  // the layer's fused kernel with lut8 off
  };
  const Case cases[] = {{"f16", "f16", false, "f16"}, {"tq4", "tq3", false, "tq-float"},
                        {"tq3h6n8", "tq4n8", true, "tq-float"}};
  const bool fused = tq::simd::current_level() != "scalar";
  for (int G : {5, 6, 7, 12})
    for (const Case& cs : cases) {
      const int H = KVH * G;
      tq::KvCacheConfig cfg = tq_test::kv_config(1, KVH, D, n, cs.k, cs.v);
      cfg.window = 16;
      cfg.sink = cs.centred ? 1 : 0;
      if (cs.centred) center_rope_k(cfg, D);
      tq::KvCache c(cfg);
      c.append(0, n, k.data(), v.data());
      tq::AttentionParams p;
      p.n_heads = H;
      const std::string what = std::string(cs.k) + "/" + cs.v + " G " + std::to_string(G);
      EXPECT_EQ(tq::attention_kernel(c, 0, p), fused ? cs.kernel : "rows") << what;
      for (int nq : {1, 13}) {
        std::vector<float> q((size_t)nq * H * D);
        for (auto& x : q) x = (float)rng.normal();
        std::vector<float> out(q.size(), -1.f), ref(q.size());
        p.pos0 = n - nq - 150;  // prefill: causal limits across blocks and mean segments
        p.kernel = tq::AttnKernel::fused;
        tq::attention_ref(c, 0, nq, q.data(), ref.data(), p);
        tq::attention(c, 0, nq, q.data(), out.data(), p);
        EXPECT_LE(rel_err(out, ref), kExactRelTol) << what << " nq " << nq;
        if (nq > 1) EXPECT_LE(rel_err(out, one_query_calls(c, q, nq, H, D, p)), kExactRelTol) << what;
        p.kernel = tq::AttnKernel::lut8;
        const bool lut8 = tq::attention_kernel(c, 0, p) == "tq-lut8";
        EXPECT_EQ(lut8, fused && std::string(cs.kernel) != "f16" && tq::simd::current_level() == "avx3_dl") << what;
        tq::attention(c, 0, nq, q.data(), out.data(), p);
        EXPECT_LE(rel_err(out, ref), lut8 ? kFastRelTol : kExactRelTol) << what << " nq " << nq << " lut8";
        if (lut8 && nq > 1) EXPECT_LE(rel_err(out, one_query_calls(c, q, nq, H, D, p)), kExactRelTol) << what;
      }
    }
}

TEST(KvCache, ManyQueryCallEqualsOneQueryCalls) {
  // Prefill passes its queries to the tq kernels together. The float kernel expands each
  // block's codes to float tiles once for kTileRows / G queries and decodes the norms once; the
  // lut8 kernel takes kMaxRows / G queries through a block per pass and decodes the range's norms
  // once (the last few queries one at a time in both). Every query's output equals its own
  // one-query call (which reads the codes directly): bit for bit with the float kernel, up to
  // float order with lut8. fp16 and 8-bit log norms, split K, trellis codes, the
  // RoPE-rotating K mean, causal limits ending mid-block, every G with a kernel instance. The
  // f16 kernel runs up to 8 query rows (of one or more queries) through each block: bit for bit.
  const int n = 400, D = 64, KVH = 2, nq = 29;
  struct Case {
    const char *k, *v;
    bool trellis, centred;
    int window;
  };
  const Case cases[] = {{"tq4", "tq4", false, false, 0},      {"tq3h6n8", "tq4n8", false, true, 0},
                        {"tq3h4", "tq2h3", false, false, 16},
                        {"tq2h4n8", "tq3n8", true, true, 16}, {"tq3", "tq3n8", true, false, 16},
                        {"tq5", "tq6", false, true, 0},       {"tq8", "tq7", false, false, 0},
                        {"f16", "f16", false, false, 0}};
  tq::Rng rng(31);
  std::vector<float> k, v;
  fill_kv(rng, n, KVH, D, k, v);
  for (const std::string& lv : tq::simd::available_levels()) {
    if (lv == "scalar") continue;  // no fused tq kernel
    tq::simd::ScopedLevel level(lv);
    int ran[3] = {0, 0, 0};  // float, lut8, f16
    int want_float = 0;      // at 4 float lanes (sse4) trellis codes take the row path
    for (int G : {1, 2, 3, 4, 8}) {
      const int H = KVH * G;
      std::vector<float> q((size_t)nq * H * D);
      for (auto& x : q) x = (float)rng.normal();
      for (const Case& cs : cases) {
        tq::KvCacheConfig cfg = tq_test::kv_config(1, KVH, D, n, cs.k, cs.v);
        cfg.trellis = cs.trellis;
        cfg.window = cs.window;
        cfg.sink = 1;
        if (cs.centred) center_rope_k(cfg, D);
        tq::KvCache c(cfg);
        c.append(0, n, k.data(), v.data());
        const bool f16 = std::string(cs.k) == "f16";
        want_float += !f16 && !(cs.trellis && lv == "sse4");
        for (bool lut8 : {false, true}) {
          tq::AttentionParams p;
          p.n_heads = H;
          p.kernel = lut8 ? tq::AttnKernel::lut8 : tq::AttnKernel::fused;
          p.pos0 = n - 120;  // limits 281..309: across a block boundary, mid-block ends
          if (tq::attention_kernel(c, 0, p) != (f16 ? "f16" : lut8 ? "tq-lut8" : "tq-float") || (f16 && lut8))
            continue;
          ++ran[f16 ? 2 : lut8];
          std::vector<float> many(q.size()), ref(q.size());
          tq::attention(c, 0, nq, q.data(), many.data(), p);
          tq::attention_ref(c, 0, nq, q.data(), ref.data(), p);
          const std::vector<float> one = one_query_calls(c, q, nq, H, D, p);
          const std::string what = std::string(cs.k) + "/" + cs.v + (cs.trellis ? " tc" : "") +
                                   (cs.centred ? " centred" : "") + " G " + std::to_string(G) + " " + lv +
                                   (f16 ? "" : lut8 ? " lut8" : " float");
          if (lut8) {
            EXPECT_LE(rel_err(many, one), kExactRelTol) << what;
            EXPECT_LE(rel_err(many, ref), kFastRelTol) << what;
          } else {
            EXPECT_EQ(many, one) << what;
            EXPECT_LE(rel_err(many, ref), kExactRelTol) << what;
          }
        }
      }
    }
    EXPECT_EQ(ran[0], want_float) << lv << ": the float kernel ran for some cases only";
    // lut8: avx3_dl, up to 6 bits (not tq8/tq7)
    EXPECT_EQ(ran[1], lv == "avx3_dl" ? 5 * ((int)std::size(cases) - 2) : 0) << lv << ": lut8 ran for some cases only";
    EXPECT_EQ(ran[2], 5) << lv << ": the f16 kernel ran for some G only";
  }
}

// The traits table: one row per KvFormat in enum order, bytes and head_dim checks read from it.
TEST(KvTypes, TableIndexedByEnumAndConsistent) {
  const auto& t = tq::kv_types();
  ASSERT_EQ(t.size(), (size_t)tq::KvFormat::count);
  for (size_t i = 0; i < t.size(); ++i) {
    const tq::KvTypeTraits& f = t[i];
    EXPECT_EQ((size_t)f.id, i) << f.name;
    EXPECT_EQ(tq::kv_type_traits(tq::kv_type(f.id)).name, std::string(f.name));
    ASSERT_NE(tq::find_kv_type(f.name), nullptr) << f.name;
    EXPECT_EQ(tq::find_kv_type(f.name)->id, f.id) << f.name;
    EXPECT_EQ(tq::parse_kv_type(f.name), tq::kv_type(f.id)) << f.name;
    ASSERT_TRUE(f.n_parts == 1 || f.n_parts == 2) << f.name;
    int quarters = 0;
    for (int p = 0; p < f.n_parts; ++p) quarters += f.parts[p].quarters;
    EXPECT_EQ(quarters, 4) << f.name;  // parts cover the head vector once
    EXPECT_EQ(f.channels != tq::KvChannels::all, f.layout == tq::KvLayout::tq_split) << f.name;
    EXPECT_TRUE(f.kernels_k & tq::kKvKernelRows) << f.name;
    EXPECT_TRUE(f.kernels_v & tq::kKvKernelRows) << f.name;
    EXPECT_NE(std::string(f.desc), "") << f.name;
    for (int D : {16, 32, 48, 64, 96, 128, 256, 1024, 1040, 8, 0}) {
      EXPECT_EQ(f.supports(D), D >= 16 && D <= 1024 && D % 16 == 0 && D % f.dim_multiple == 0) << f.name << " " << D;
      if (!f.supports(D)) {
        EXPECT_THROW(tq::kv_type_bytes(tq::kv_type(f.id), D), tq::Error) << f.name << " " << D;
        continue;
      }
      EXPECT_EQ(tq::kv_type_bytes(tq::kv_type(f.id), D), f.row_bytes(D)) << f.name;
      EXPECT_EQ(f.block_bytes(D), 32 * f.row_bytes(D) + (f.log8_norms() ? 2 * f.n_parts : 0)) << f.name;
      // What the cache stores per token is what the table says.
      tq::KvCacheConfig cfg = tq_test::kv_config(1, 1, D, 64, f.name, f.name);
      tq::KvCache cache(cfg);
      EXPECT_DOUBLE_EQ(cache.bytes_per_token(), 2.0 * f.block_bytes(D) / 32) << f.name << " " << D;
    }
  }
  EXPECT_EQ(tq::find_kv_type("tq9"), nullptr);
  EXPECT_TRUE(tq::kv_type_traits(tq::parse_kv_type("tq3h6n8")).turboquant());
  EXPECT_FALSE(tq::kv_type_traits(tq::parse_kv_type("q4_0h")).turboquant());
}

namespace {
// The lines of docs/design.md between `<!-- kv-types:begin -->` and `<!-- kv-types:end -->`.
std::string design_md_kv_types() {
  const std::string md = tq_test::slurp_text(std::string(TQ_SOURCE_DIR) + "/docs/design.md");
  const std::string b = "<!-- kv-types:begin (tq kv-types --markdown) -->\n", e = "<!-- kv-types:end -->";
  const size_t i = md.find(b), j = md.find(e);
  if (i == std::string::npos || j == std::string::npos || j < i) return "";
  return md.substr(i + b.size(), j - i - b.size());
}
}  // namespace

// The type lists readers see come from the table: tq kv-types (text, JSON, markdown), the
// -ctk help, and docs/design.md's table (checked equal to the markdown output).
TEST(KvTypes, CliHelpAndDesignDocMatchTheTable) {
  using tq_test::run_tq;
  const auto md = run_tq({"kv-types", "--markdown"});
  ASSERT_EQ(md.status, 0) << md.err;
  EXPECT_EQ(design_md_kv_types(), md.out)
      << "docs/design.md's format table differs from `tq kv-types --markdown`: paste the new output between the "
         "kv-types markers";
  const auto js = run_tq({"kv-types", "--json", "--head-dim", "64"});
  ASSERT_EQ(js.status, 0) << js.err;
  const auto j = nlohmann::json::parse(js.out);
  ASSERT_EQ(j["types"].size(), tq::kv_types().size());
  for (size_t i = 0; i < tq::kv_types().size(); ++i) {
    const auto& f = tq::kv_types()[i];
    EXPECT_EQ(j["types"][i]["name"], f.name);
    EXPECT_EQ(j["types"][i]["row_bytes"].get<size_t>(), tq::kv_type_bytes(tq::kv_type(f.id), 64));
    EXPECT_EQ(j["types"][i]["parts"].size(), (size_t)f.n_parts);
  }
  const auto txt = run_tq({"kv-types"});
  ASSERT_EQ(txt.status, 0) << txt.err;
  const auto help = run_tq({"perplexity", "--help"});
  ASSERT_EQ(help.status, 0) << help.err;
  for (const auto& f : tq::kv_types()) {
    EXPECT_NE(txt.out.find(std::string("\n") + f.name + " "), std::string::npos) << f.name;
    const bool last = &f == &tq::kv_types().back();
    EXPECT_NE(help.out.find(std::string(" ") + f.name + (last ? " (" : ",")), std::string::npos) << f.name;  // -ctk help
    EXPECT_NE(md.out.find(std::string("| ") + f.name + " |"), std::string::npos) << f.name;
  }
  EXPECT_TRUE(tq_test::failed_cleanly(run_tq({"kv-types", "--head-dim", "40"})));
}

namespace {
// The preconditioners of one K stream with every one on: K centring with RoPE-rotating means
// per 64-token segment, K scaling and the split layout's channel selection.
tq::KvCacheConfig all_preconditioners() {
  tq::KvCacheConfig cfg = tq_test::kv_config(1, 2, 64, 256, "tq3h6", "tq4h5");
  cfg.center_k = cfg.center_v = cfg.center_rope = cfg.scale_k = true;
  cfg.center_segment = 64;
  cfg.rope_base = 10000;
  cfg.rope_dim = 64;
  cfg.sink = 1;
  cfg.window = 8;
  return cfg;
}
void fill(tq::KvCache& c, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
          int n, int n_heads) {
  const size_t qs = (size_t)n_heads * 64, ks = (size_t)c.config().n_kv_heads * 64;
  for (int t = 0; t < n;) {  // a prefill, then token by token
    const int m = t == 0 ? 100 : 1;
    c.observe_queries(0, m, q.data() + t * qs, n_heads);
    c.append(0, m, k.data() + t * ks, v.data() + t * ks);
    t += m;
  }
}
}  // namespace

// Each preconditioner's forward then inverse is the identity (to float rounding), its query
// transform keeps q.k exact to rounding, and the whole chain's inverse undoes its forward.
TEST(KvCache, PreconditionersInvertAndKeepQk) {
  const int D = 64, n = 160, NH = 4;
  tq::Rng rng(3);
  std::vector<float> q((size_t)n * NH * D), k, v;
  fill_kv(rng, n, 2, D, k, v);
  for (auto& x : q) x = (float)rng.normal();
  tq::KvCache cache(all_preconditioners());
  fill(cache, q, k, v, n, NH);
  auto& s = cache.impl().layers[0].k[1];
  for (const tq::kv::Precond* p : s.chain()) ASSERT_TRUE(p->on && p->frozen);
  ASSERT_FALSE(s.kscale.w.empty());
  const int j0 = 70, m = 5;  // rows inside the second mean segment
  std::vector<float> x((size_t)m * D), qq((size_t)m * D);
  for (auto& e : x) e = (float)rng.normal() * 3;
  for (auto& e : qq) e = (float)rng.normal();
  auto max_abs_diff = [](const std::vector<float>& a, const std::vector<float>& b) {
    double e = 0;
    for (size_t i = 0; i < a.size(); ++i) e = std::max(e, (double)std::fabs(a[i] - b[i]));
    return e;
  };
  auto dot = [&](const float* a, const float* b) {
    double r = 0;
    for (int d = 0; d < D; ++d) r += (double)a[d] * b[d];
    return r;
  };
  for (tq::kv::Precond* p : s.chain()) {
    std::vector<float> y = x;
    p->forward(j0, m, y.data(), D);
    EXPECT_GT(max_abs_diff(y, x), 1e-3);  // it does something
    p->inverse(j0, m, y.data(), D);
    EXPECT_LE(max_abs_diff(y, x), 1e-5 * 16);
    if (p == &s.centre) continue;  // the mean's logit is added by the kernels, not through q
    std::vector<float> kx = x, qx = qq;
    p->forward(j0, m, kx.data(), D);
    p->query(m, qx.data(), D);
    for (int r = 0; r < m; ++r)
      EXPECT_NEAR(dot(&qx[(size_t)r * D], &kx[(size_t)r * D]), dot(&qq[(size_t)r * D], &x[(size_t)r * D]), 1e-4);
  }
  // The chain and the format's rotation: to_orig after forward + rotate gives the rows back.
  std::vector<float> y = x;
  for (tq::kv::Precond* p : s.chain()) p->forward(j0, m, y.data(), D);
  s.rotate(m, y.data(), y.data());
  s.to_orig(j0, m, y.data());
  EXPECT_LE(max_abs_diff(y, x), 1e-4);
}

// clear() returns every preconditioner to its unchosen state; refilling stores the same bytes
// as a new cache.
TEST(KvCache, ClearResetsPreconditionersAndStoresTheSameBytes) {
  const int D = 64, n = 200, NH = 4;
  tq::Rng rng(4);
  std::vector<float> q((size_t)n * NH * D), k, v, k2, v2;
  fill_kv(rng, n, 2, D, k, v);
  fill_kv(rng, n, 2, D, k2, v2);
  for (auto& x : q) x = (float)rng.normal();
  tq::KvCache used(all_preconditioners()), fresh(all_preconditioners());
  fill(used, q, k2, v2, n, NH);  // other data first
  used.clear();
  EXPECT_EQ(used.bytes_used(), fresh.bytes_used());  // empty (the channel masks are counted always)
  for (auto* vec : {&used.impl().layers[0].k, &used.impl().layers[0].v})
    for (const tq::kv::Stream& s : *vec) {
      EXPECT_EQ(s.n_quant, 0);
      for (const tq::kv::Precond* p : s.chain()) EXPECT_EQ(p->open(), p->on);
      EXPECT_EQ(s.centre.n_mu, 0);
      EXPECT_EQ(s.centre.stat_n, 0);
      EXPECT_TRUE(s.kscale.w.empty());
      EXPECT_EQ(s.kscale.q_n + s.kscale.n + s.channels.q_n + s.channels.n, 0);
      EXPECT_TRUE(s.channels.perm.empty());
    }
  fill(used, q, k, v, n, NH);
  fill(fresh, q, k, v, n, NH);
  EXPECT_EQ(used.bytes_used(), fresh.bytes_used());
  for (int side = 0; side < 2; ++side)
    for (int h = 0; h < 2; ++h) {
      const auto& a = (side ? used.impl().layers[0].v : used.impl().layers[0].k)[h];
      const auto& b = (side ? fresh.impl().layers[0].v : fresh.impl().layers[0].k)[h];
      ASSERT_EQ(a.n_quant, b.n_quant);
      EXPECT_EQ(a.centre.mu, b.centre.mu);
      EXPECT_EQ(a.kscale.w, b.kscale.w);
      EXPECT_EQ(a.channels.perm, b.channels.perm);
      for (int blk = 0; blk * tq::kv::kBlock < a.n_quant; ++blk)
        EXPECT_EQ(std::memcmp(a.block(blk), b.block(blk), a.block_bytes), 0) << side << " " << h << " " << blk;
    }
}
