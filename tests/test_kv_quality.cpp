// KvQuality.*: the quality options of the KV cache (f16 sink tokens, per-stream mean
// centring): fused attention vs attention_ref with them on (several types, GQA, across sink /
// window / 2048-token chunk boundaries, token-by-token and batch appends), the online mean
// rule, byte accounting and config errors.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kv_test_util.h"
#include "kv/kv_internal.h"
#include "tq/common.h"
#include "tq/error.h"
#include "tq/eval.h"
#include "tq/kv_cache.h"
#include "tq/kv_spec.h"
#include "tq/model.h"

namespace {

constexpr double kExactRelTol = 1e-5;  // same bound as Attention.FusedMatchesReferenceAllTypes
constexpr double kFastRelTol = 3e-2;

bool small() { return std::getenv("TQ_TEST_SMALL") != nullptr; }

// Rows with a large common mean (like real keys: a few channels carry a big offset) plus
// noise; token 0 is an outlier (like the BOS / attention-sink token).
void fill_shifted(tq::Rng& rng, int n, int kvh, int D, std::vector<float>& k, std::vector<float>& v) {
  k.resize((size_t)n * kvh * D);
  v.resize((size_t)n * kvh * D);
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < kvh; ++h)
      for (int d = 0; d < D; ++d) {
        const size_t i = ((size_t)t * kvh + h) * D + d;
        const float mk = (d % 7 == 3) ? 4.f + h : 0.5f * std::sin(0.3f * d + h);
        const float mv = 0.8f * std::cos(0.2f * d + h);
        k[i] = mk + (float)rng.normal();
        v[i] = mv + 0.5f * (float)rng.normal();
        if (t == 0) { k[i] *= 6.f; v[i] *= 0.1f; }
      }
}

using tq_test::rel_err;

// Keys with a constant pre-RoPE component in every third RoPE pair (what RoPE-rotating means
// remove): k_t += R(t) c, pair i turned by t * 10000^(-2i / rope_dim).
void add_rotating_mean(int n, int kvh, int D, int rope_dim, std::vector<float>& k) {
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < kvh; ++h)
      for (int i = 0; i < rope_dim / 2; i += 3) {
        const double a = t * std::pow(10000.0, -2.0 * i / rope_dim);
        const double c0 = 3.0 + h, c1 = -2.0;
        float* x = &k[((size_t)t * kvh + h) * D + 2 * i];
        x[0] += (float)(c0 * std::cos(a) - c1 * std::sin(a));
        x[1] += (float)(c0 * std::sin(a) + c1 * std::cos(a));
      }
}

struct QCase {
  std::string tk, tv;
  int kvh, G, n_ctx, n_q, window, sink;
  bool ck, cv;
  bool token_by_token;
  int segment = 0;  // center_segment
  bool ks = false;  // scale_k (the queries of each append are observed first)
  int rope_dim = 0;  // > 0: center_rope with RoPE over this many dims (base 10000)
};

std::string describe(const QCase& c) {
  return c.tk + "/" + c.tv + " kvh=" + std::to_string(c.kvh) + " G=" + std::to_string(c.G) +
         " n=" + std::to_string(c.n_ctx) + " nq=" + std::to_string(c.n_q) + " W=" + std::to_string(c.window) +
         " S=" + std::to_string(c.sink) + (c.ck ? " ck" : "") + (c.cv ? " cv" : "") +
         (c.token_by_token ? " token-by-token" : " batches") + " seg=" + std::to_string(c.segment) +
         (c.ks ? " ks" : "") + (c.rope_dim > 0 ? " cr" + std::to_string(c.rope_dim) : "");
}

tq::KvCacheConfig make_cfg(const QCase& c, int D = 64) {
  tq::KvCacheConfig cfg;
  cfg.n_layers = 2;
  cfg.n_kv_heads = c.kvh;
  cfg.head_dim = D;
  cfg.max_tokens = c.n_ctx + 8;
  cfg.type_k = tq::parse_kv_format(c.tk);
  cfg.type_v = tq::parse_kv_format(c.tv);
  cfg.window = c.window;
  cfg.sink = c.sink;
  cfg.center_k = c.ck;
  cfg.center_v = c.cv;
  cfg.center_segment = c.segment;
  cfg.scale_k = c.ks;
  cfg.center_rope = c.rope_dim > 0;
  cfg.rope_base = 10000;
  cfg.rope_dim = c.rope_dim;
  return cfg;
}

// Fills layer 1, then compares attention (exact and fast) of the last n_q positions and of
// n_q queries at early positions (inside the sinks / the first blocks) with attention_ref.
void check(const QCase& c) {
  SCOPED_TRACE(describe(c));
  const int D = 64;
  tq::KvCache cache(make_cfg(c, D));
  tq::Rng rng(99 + c.n_ctx + c.sink);
  std::vector<float> k, v;
  fill_shifted(rng, c.n_ctx, c.kvh, D, k, v);
  const size_t row = (size_t)c.kvh * D;
  const int H = c.kvh * c.G;
  if (c.rope_dim > 0) add_rotating_mean(c.n_ctx, c.kvh, D, c.rope_dim, k);
  // scale_k: queries with most of their energy on a few channel pairs (as in real models)
  std::vector<float> qs((size_t)c.n_ctx * H * D);
  for (size_t i = 0; i < qs.size(); ++i) qs[i] = (float)rng.normal() * ((i % D) / 2 % 5 == 1 ? 4.f : 0.5f);
  auto add = [&](int t, int n) {
    if (c.ks) cache.observe_queries(1, n, qs.data() + (size_t)t * H * D, H);
    cache.append(1, n, k.data() + t * row, v.data() + t * row);
  };
  if (c.token_by_token) {
    for (int t = 0; t < c.n_ctx; ++t) add(t, 1);
  } else {
    const int first = c.n_ctx / 3;
    add(0, first);
    for (int t = first; t < c.n_ctx; t += 13) add(t, std::min(13, c.n_ctx - t));
  }
  // scale_k on: weights chosen unless the first quantized token was position 0 on its own
  // (then no query had been seen: identity, like the mean)
  const auto& s0 = cache.impl().layers[1].k[0];
  if (c.ks && s0.kscale.on && s0.n_quant > 0)
    EXPECT_EQ(s0.kscale.w.empty(), c.token_by_token && c.sink == 0 && c.window == 0);
  ASSERT_EQ(cache.n_tokens(1), c.n_ctx);
  const auto& L = cache.impl().layers[1];
  EXPECT_EQ(L.k[0].n_quant, std::max(0, c.n_ctx - c.sink - c.window));
  std::vector<float> q((size_t)c.n_q * H * D);
  for (auto& x : q) x = (float)rng.normal();
  for (int pos0 : {-1, 0, std::max(0, std::min(c.sink + 3, c.n_ctx - c.n_q))}) {
    std::vector<float> ref(q.size()), exact(q.size(), -1.f), fast(q.size(), -1.f);
    tq::AttentionParams p;
    p.n_heads = H;
    p.n_threads = 2;
    p.pos0 = pos0;
    tq::attention_ref(cache, 1, c.n_q, q.data(), ref.data(), p);
    p.kernel = tq::AttnKernel::fused;
    tq::attention(cache, 1, c.n_q, q.data(), exact.data(), p);
    tq::attention(cache, 1, c.n_q, q.data(), fast.data(), p);
    EXPECT_LE(rel_err(exact, ref), kExactRelTol) << "pos0 " << pos0;
    EXPECT_LE(rel_err(fast, ref), kFastRelTol) << "pos0 " << pos0;
    std::vector<float> lut(q.size(), -1.f);  // int8 tables where the host runs them, else the float kernel
    p.kernel = tq::AttnKernel::lut8;
    tq::attention(cache, 1, c.n_q, q.data(), lut.data(), p);
    EXPECT_LE(rel_err(lut, ref), kFastRelTol) << "lut8, pos0 " << pos0;
  }
}

}  // namespace

TEST(KvQuality, FusedMatchesReferenceWithSinksAndCentring) {
  const int nl = small() ? 300 : 2100;  // 2100 - sink - window crosses the 2048-token chunk
  const std::vector<QCase> cases = {
      {"tq3", "tq3", 2, 4, nl, 1, 0, 4, true, true, false},
      {"tq3", "tq3", 2, 4, nl, 5, 7, 4, true, true, false},
      {"tq2h3", "tq2h3", 3, 3, nl, 1, 16, 1, true, true, false},
      {"tq4", "tq2", 3, 3, nl, 3, 0, 0, true, false, false},
      {"q4_0h", "q4_0h", 2, 2, nl, 1, 5, 3, true, true, false},
      {"q4_0h", "tq3", 1, 8, nl, 2, 0, 33, false, true, false},
      {"tq3h4", "tq2h3", 2, 4, 301, 1, 0, 2, true, true, true},
      {"tq3", "tq3", 3, 3, 301, 1, 0, 0, true, true, true},   // mu = 0: only position 0 seen
      {"tq3", "tq3", 3, 3, 301, 1, 0, 1, true, true, true},   // mu = row 1
      {"tq3", "tq3", 2, 4, 301, 1, 9, 2, true, true, true},
      {"tq5", "tq3", 2, 4, 301, 4, 0, 4, true, true, true},
      {"f16", "q8_0", 2, 2, 301, 2, 3, 4, true, true, false},  // f16 K: not centred
      {"tq3n8", "tq3n8", 2, 4, nl, 2, 3, 1, true, false, false},
      {"tq3", "tq3", 2, 4, nl, 1, 0, 1, true, true, false, 256},
      {"tq3", "tq2h3", 3, 3, nl, 3, 5, 2, true, true, false, 64},
      {"tq5n8", "tq3", 2, 4, 301, 1, 0, 1, true, false, true, 32},
      {"q4_0h", "tq3", 2, 2, 301, 2, 7, 0, false, true, true, 96},
      {"tq5n8", "tq3", 3, 3, 301, 1, 0, 1, true, false, true},
      {"tq3", "tq3", 2, 4, nl, 1, 0, 1, true, true, false, 0, true},
      {"tq3h6", "tq4n8", 3, 3, nl, 3, 5, 1, true, false, false, 256, true},
      {"tq4", "tq3", 2, 4, nl, 2, 0, 1, true, false, false, 96},  // K means straddle the chunk
      {"tq4n8", "tq3", 2, 4, 301, 2, 0, 1, true, false, true, 0, true},
      {"tq2h3", "tq3", 2, 2, 301, 1, 7, 0, false, false, false, 0, true},
      {"tq3", "tq3", 2, 4, 40, 3, 0, 44, true, true, false},   // all tokens are sinks
      {"tq3", "tq3", 2, 4, 70, 3, 64, 4, true, true, false},   // sinks + window only
      // RoPE-rotating K means: fused kernels (per-block mean terms) and the row path
      {"tq3", "tq3", 2, 4, nl, 1, 0, 1, true, false, false, 0, false, 64},
      {"tq3h6", "tq4n8", 3, 3, nl, 3, 5, 1, true, false, false, 256, true, 64},
      {"tq4", "tq3", 2, 4, nl, 2, 0, 1, true, true, false, 96, false, 48},  // dims 48..63 not rotated
      {"tq4n8", "tq3", 2, 4, 301, 2, 0, 1, true, false, true, 64, false, 64},
      {"tq3", "tq3", 3, 3, 301, 1, 0, 0, true, false, true, 0, false, 64},  // mu = 0: only position 0 seen
      {"q4_0h", "tq3", 2, 2, 301, 2, 7, 1, true, false, false, 96, false, 64},  // row path
      {"tq3", "f16", 2, 2, 301, 2, 0, 1, true, false, false, 32, false, 64},  // row path (V f16)
      {"tq3", "tq3", 1, 5, 301, 2, 0, 1, true, false, false, 64, false, 64},  // G = 5: row path
      {"tq3h6n8", "tq4h5n8", 3, 3, nl, 1, 0, 1, true, false, false, 512, true, 64},  // split with 8-bit norms
      {"tq3h5n8", "tq4h5n8", 1, 5, 301, 1, 0, 1, true, false, false, 0, true, 64},  // the same, row path
  };
  for (const auto& c : cases) check(c);
}

TEST(KvQuality, SinksAreExactF16) {
  // A query that only sees the sinks gets exact f16 attention, whatever the quantized type.
  tq::KvCacheConfig cfg;
  cfg.n_kv_heads = 2;
  cfg.head_dim = 64;
  cfg.max_tokens = 200;
  cfg.type_k = tq::KvFormat::tq2;
  cfg.type_v = tq::KvFormat::tq2;
  cfg.sink = 5;
  cfg.center_k = cfg.center_v = true;
  tq::KvCache cache(cfg);
  tq::Rng rng(5);
  std::vector<float> k, v;
  fill_shifted(rng, 150, 2, 64, k, v);
  cache.append(0, 150, k.data(), v.data());
  std::vector<float> q(4 * 64), out(q.size());
  for (auto& x : q) x = (float)rng.normal();
  tq::AttentionParams p;
  p.n_heads = 4;
  p.pos0 = 4;  // sees positions 0..4: all sinks
  p.kernel = tq::AttnKernel::fused;
  tq::attention(cache, 0, 1, q.data(), out.data(), p);
  for (int h = 0; h < 4; ++h) {
    const int kh = h / 2;
    double s[5], mx = -1e30, l = 0;
    for (int t = 0; t < 5; ++t) {
      double a = 0;
      for (int d = 0; d < 64; ++d) a += (double)q[h * 64 + d] * k[(t * 2 + kh) * 64 + d];
      s[t] = a / 8.0;
      mx = std::max(mx, s[t]);
    }
    for (double& x : s) { x = std::exp(x - mx); l += x; }
    for (int d = 0; d < 64; ++d) {
      double o = 0;
      for (int t = 0; t < 5; ++t) o += s[t] * v[(t * 2 + kh) * 64 + d];
      EXPECT_NEAR(out[h * 64 + d], o / l, 2e-3 * (1 + std::fabs(o / l))) << h << " " << d;
    }
  }
}

TEST(KvQuality, MeanRule) {
  const int D = 64;
  auto cfg_for = [&](int sink, int window) {
    tq::KvCacheConfig cfg;
    cfg.n_kv_heads = 1;
    cfg.head_dim = D;
    cfg.max_tokens = 64;
    cfg.type_k = tq::KvFormat::tq3;
    cfg.type_v = tq::KvFormat::tq3;
    cfg.sink = sink;
    cfg.window = window;
    cfg.center_k = true;
    return cfg;
  };
  tq::Rng rng(3);
  std::vector<float> k, v;
  fill_shifted(rng, 20, 1, D, k, v);
  auto mean_fp16 = [&](int a, int b, int d) {  // mean of rows a..b-1, rounded to fp16
    double s = 0;
    for (int t = a; t < b; ++t) s += k[(size_t)t * D + d];
    return tq::fp16_to_fp32(tq::fp32_to_fp16((float)(s / (b - a))));
  };
  {  // one batch of 20: mu = mean of positions 1..19 (position 0 excluded)
    tq::KvCache c(cfg_for(0, 0));
    c.append(0, 20, k.data(), v.data());
    const auto& s = c.impl().layers[0].k[0];
    ASSERT_TRUE(s.centre.frozen);
    for (int d = 0; d < D; ++d) ASSERT_EQ(s.centre.mu[d], mean_fp16(1, 20, d)) << d;
    EXPECT_FALSE(c.impl().layers[0].v[0].centre.on);  // V not centred in this config
  }
  {  // center_segment = 32, one sink, 100 tokens in one batch: segment 0 (positions 1..32)
     // has the mean of positions 1..99; segment g >= 1 the mean of segment g - 1's rows
    std::vector<float> k2, v2;
    fill_shifted(rng, 100, 1, D, k2, v2);
    auto cfg = cfg_for(1, 0);
    cfg.max_tokens = 100;
    cfg.center_segment = 32;
    tq::KvCache c(cfg);
    c.append(0, 100, k2.data(), v2.data());
    const auto& s = c.impl().layers[0].k[0];
    ASSERT_EQ(s.n_quant, 99);
    ASSERT_EQ(s.centre.n_mu, 4);  // segments start at stream index 0, 32, 64, 96
    auto mean2 = [&](int a, int b, int d) {
      double sum = 0;
      for (int t = a; t < b; ++t) sum += k2[(size_t)t * D + d];
      return tq::fp16_to_fp32(tq::fp32_to_fp16((float)(sum / (b - a))));
    };
    for (int d = 0; d < D; ++d) {
      ASSERT_EQ(s.centre.mu_of(0)[d], mean2(1, 100, d)) << d;
      ASSERT_EQ(s.centre.mu_of(40)[d], mean2(1, 33, d)) << d;   // segment 1: positions 1..32
      ASSERT_EQ(s.centre.mu_of(70)[d], mean2(33, 65, d)) << d;  // segment 2
      ASSERT_EQ(s.centre.mu_of(98)[d], mean2(65, 97, d)) << d;  // segment 3
    }
    // 1 sink row + 99 quantized rows + 4 K means (fp16), V: sink row + 99 rows
    EXPECT_EQ(c.bytes_used(), (size_t)2 * 64 * 2 + 99 * 2 * 26 + 4 * 64 * 2);
  }
  {  // token by token, no sink, no window: position 0 is quantized first, alone: mu = 0
    tq::KvCache c(cfg_for(0, 0));
    for (int t = 0; t < 20; ++t) c.append(0, 1, k.data() + t * D, v.data() + t * D);
    const auto& s = c.impl().layers[0].k[0];
    ASSERT_TRUE(s.centre.frozen);
    for (int d = 0; d < D; ++d) ASSERT_EQ(s.centre.mu[d], 0.f);
  }
  {  // token by token, one sink: the first quantized token is position 1: mu = row 1
    tq::KvCache c(cfg_for(1, 0));
    for (int t = 0; t < 20; ++t) c.append(0, 1, k.data() + t * D, v.data() + t * D);
    const auto& s = c.impl().layers[0].k[0];
    for (int d = 0; d < D; ++d) ASSERT_EQ(s.centre.mu[d], mean_fp16(1, 2, d)) << d;
  }
  {  // token by token, window 6, one sink: position 1 is quantized when position 7 arrives:
     // mu = mean of positions 1..7
    tq::KvCache c(cfg_for(1, 6));
    for (int t = 0; t < 7; ++t) c.append(0, 1, k.data() + t * D, v.data() + t * D);
    EXPECT_FALSE(c.impl().layers[0].k[0].centre.frozen);
    for (int t = 7; t < 20; ++t) c.append(0, 1, k.data() + t * D, v.data() + t * D);
    const auto& s = c.impl().layers[0].k[0];
    for (int d = 0; d < D; ++d) ASSERT_EQ(s.centre.mu[d], mean_fp16(1, 8, d)) << d;
    // clear() forgets the mean; the next fill chooses it again
    c.clear();
    EXPECT_FALSE(s.centre.frozen);
    c.append(0, 20, k.data(), v.data());
    for (int d = 0; d < D; ++d) ASSERT_EQ(s.centre.mu[d], mean_fp16(1, 20, d)) << d;
  }
}

TEST(KvQuality, CentringHelpsShiftedData) {
  // Keys with a large common offset: quantizing x - mu loses less than quantizing x.
  const int D = 64, n = 512, kvh = 2, G = 2;
  tq::Rng rng(17);
  std::vector<float> k, v;
  fill_shifted(rng, n, kvh, D, k, v);
  std::vector<float> q((size_t)kvh * G * D);
  for (auto& x : q) x = (float)rng.normal();
  auto run = [&](const char* type, bool ck, bool cv, int sink) {
    tq::KvCacheConfig cfg;
    cfg.n_kv_heads = kvh;
    cfg.head_dim = D;
    cfg.max_tokens = n;
    cfg.type_k = cfg.type_v = tq::parse_kv_format(type);
    cfg.center_k = ck;
    cfg.center_v = cv;
    cfg.sink = sink;
    tq::KvCache cache(cfg);
    cache.append(0, n, k.data(), v.data());
    std::vector<float> out(q.size());
    tq::AttentionParams p;
    p.n_heads = kvh * G;
    p.kernel = tq::AttnKernel::fused;
    tq::attention(cache, 0, 1, q.data(), out.data(), p);
    return out;
  };
  const auto exact = run("f32", false, false, 0);
  for (const char* t : {"tq2", "tq3"}) {
    const double plain = rel_err(run(t, false, false, 0), exact);
    const double centred = rel_err(run(t, true, true, 0), exact);
    const double both = rel_err(run(t, true, true, 1), exact);
    EXPECT_LT(centred, plain) << t;
    EXPECT_LT(both, plain) << t;
  }
}

TEST(KvQuality, RopeMeansFollowRotatingKeys) {
  // Keys with constant pre-RoPE components (RoPE spins them at their pairs' frequencies): a
  // constant mean cannot remove them, a RoPE-rotating one can. Its mean is the fp16-rounded
  // mean of the keys turned back to position 0 (positions 1.., BOS left out).
  const int D = 64, n = 600, kvh = 2, G = 2, nq = 64;
  tq::Rng rng(23);
  std::vector<float> k((size_t)n * kvh * D), v(k.size());
  for (auto& x : k) x = (float)rng.normal();
  for (auto& x : v) x = (float)rng.normal();
  add_rotating_mean(n, kvh, D, D, k);
  std::vector<float> q((size_t)nq * kvh * G * D);
  for (auto& x : q) x = (float)rng.normal();
  auto run = [&](const char* type, bool rope, std::vector<float>* mu) {
    tq::KvCacheConfig cfg;
    cfg.n_kv_heads = kvh;
    cfg.head_dim = D;
    cfg.max_tokens = n;
    cfg.type_k = tq::parse_kv_format(type);
    cfg.type_v = tq::KvFormat::f32;  // K error only
    cfg.center_k = std::string(type) != "f32";
    cfg.center_rope = rope;
    cfg.rope_base = 10000;
    cfg.rope_dim = D;
    cfg.sink = 1;
    tq::KvCache cache(cfg);
    cache.append(0, n, k.data(), v.data());
    if (mu) *mu = cache.impl().layers[0].k[1].centre.mu;
    std::vector<float> out(q.size());
    tq::AttentionParams p;
    p.n_heads = kvh * G;
    p.kernel = tq::AttnKernel::fused;
    tq::attention(cache, 0, nq, q.data(), out.data(), p);
    return out;
  };
  const auto exact = run("f32", false, nullptr);
  std::vector<float> mu;
  for (const char* t : {"tq3", "tq4"}) {
    const double constant = rel_err(run(t, false, nullptr), exact);
    const double rotating = rel_err(run(t, true, &mu), exact);
    EXPECT_LT(rotating, 0.75 * constant) << t << ": " << rotating << " vs " << constant;  // measured 0.65x
  }
  ASSERT_EQ(mu.size(), (size_t)D);  // kv head 1, one mean: positions 1..n-1 turned back
  int dropped = 0;
  for (int i = 0; i < D / 2; ++i) {
    double s0 = 0, s1 = 0;
    const double w = std::pow(10000.0, -2.0 * i / D);
    if (i >= tq::kv::kRopeExactPairs && w * 15.5 > tq::kv::kRopeTurnMax) {  // no mean: not turnable per block
      EXPECT_EQ(mu[2 * i], 0.f) << i;
      EXPECT_EQ(mu[2 * i + 1], 0.f) << i;
      ++dropped;
      continue;
    }
    for (int t = 1; t < n; ++t) {
      const float* x = &k[((size_t)t * kvh + 1) * D + 2 * i];
      s0 += x[0] * std::cos(t * w) + x[1] * std::sin(t * w);
      s1 += -x[0] * std::sin(t * w) + x[1] * std::cos(t * w);
    }
    EXPECT_NEAR(mu[2 * i], s0 / (n - 1), 2e-3 * (1 + std::fabs(s0 / (n - 1)))) << i;
    EXPECT_NEAR(mu[2 * i + 1], s1 / (n - 1), 2e-3 * (1 + std::fabs(s1 / (n - 1)))) << i;
  }
  EXPECT_EQ(dropped, 2);  // D = 64, base 1e4: pairs 8 and 9 turn by 1.55 and 1.16 rad per half block
}

TEST(KvQuality, RopeMeanTurnsWithItsToken) {
  // Centre::mean_at against the exact R(p) mu: the kRopeExactPairs fastest pairs turn exactly;
  // the slower ones at their block's centre, turned on to second order in x = w (p - pc), so a
  // pair errs by at most |x|^3 / 6 of its length (plus float rounding), while the block-constant
  // angle it replaces erred by up to |x|.
  const int D = 64, n = 300, sink = 1;
  tq::Rng rng(5);
  std::vector<float> k((size_t)n * D), v(k.size());
  for (auto& x : k) x = (float)rng.normal();
  for (auto& x : v) x = (float)rng.normal();
  add_rotating_mean(n, 1, D, D, k);
  tq::KvCacheConfig cfg = tq_test::kv_config(1, 1, D, n, "tq3", "f32");
  tq_test::rope_centred_k(cfg, 10000, sink);
  tq::KvCache cache(cfg);
  cache.append(0, n, k.data(), v.data());
  const tq::kv::Stream& s = cache.impl().layers[0].k[0];
  ASSERT_TRUE(s.centre.rope);
  std::vector<float> m(D);
  double err_sum = 0, const_sum = 0;  // slow pairs: errors, and the block-constant angle's
  for (int j = 0; j < n - sink; ++j) {
    s.centre.mean_at(j, m.data());
    const float* mu = s.centre.mu_of(j);
    const int p = sink + j;
    const double pc = sink + (j / 32) * 32 + 15.5;
    for (int i = 0; i < D / 2; ++i) {
      const double w = std::pow(10000.0, -2.0 * i / D), a = p * w, len = std::hypot(mu[2 * i], mu[2 * i + 1]);
      const double e0 = mu[2 * i] * std::cos(a) - mu[2 * i + 1] * std::sin(a);
      const double e1 = mu[2 * i] * std::sin(a) + mu[2 * i + 1] * std::cos(a);
      const double err = std::hypot(m[2 * i] - e0, m[2 * i + 1] - e1);
      const double x = i < tq::kv::kRopeExactPairs ? 0.0 : std::fabs(w * (p - pc));
      ASSERT_LE(err, len * (x * x * x / 6 + 1e-6) + 1e-6) << "token " << j << " pair " << i;
      if (i >= tq::kv::kRopeExactPairs) {
        err_sum += err;
        const_sum += len * 2 * std::sin(x / 2);
      }
    }
  }
  EXPECT_GT(const_sum, 0.0);
  EXPECT_LT(err_sum, 0.1 * const_sum) << err_sum << " vs " << const_sum;  // measured 0.077
}

TEST(KvQuality, BytesAccounting) {
  // K tq3: 26 B per vector at D = 64; V tq2h3: 22 B per vector + 8 B channel mask per stream
  tq::KvCacheConfig cfg = tq_test::kv_config(3, 2, 64, 256, "tq3", "tq2h3");
  cfg.window = 10;
  cfg.sink = 4;
  cfg.center_k = true;  // K: 128 B fp16 mean per stream; V not centred
  tq::KvCache cache(cfg);
  EXPECT_DOUBLE_EQ(cache.bytes_per_token(), 3 * 2 * (26 + 22));  // sinks / means reported apart
  const size_t masks = (size_t)3 * 2 * 8;  // the channel masks are counted from the start
  EXPECT_EQ(cache.bytes_used(), masks);
  const int streams = 3 * 2 * 2;
  std::vector<float> k(100 * 2 * 64, 0.1f), v(k.size(), 0.2f);
  for (int l = 0; l < 3; ++l) cache.append(l, 3, k.data(), v.data());
  EXPECT_EQ(cache.bytes_used(), (size_t)streams * 3 * 64 * 2 + masks);  // 3 sink rows each
  for (int l = 0; l < 3; ++l) cache.append(l, 97, k.data(), v.data());
  // 100 tokens: 4 sinks + 10 window rows in f16, 86 quantized; K mean, V channel mask.
  const size_t f16_rows = (size_t)streams * (4 + 10) * 64 * 2;
  const size_t quant = (size_t)86 * 3 * 2 * (26 + 22);
  const size_t means = (size_t)3 * 2 * 64 * 2;
  EXPECT_EQ(cache.bytes_used(), f16_rows + quant + means + masks);
  cache.clear();
  EXPECT_EQ(cache.bytes_used(), masks);
}

TEST(KvQuality, BadConfigAndLabels) {
  auto make = [](auto edit) {
    tq::KvCacheConfig cfg;
    cfg.head_dim = 64;
    cfg.max_tokens = 64;
    edit(cfg);
    tq::KvCache c(cfg);
  };
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.sink = -1; }), tq::Error);
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.sink = 65; }), tq::Error);  // beyond capacity
  try {
    make([](tq::KvCacheConfig& c) { c.sink = 100; });
    FAIL() << "no error";
  } catch (const tq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sink"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(make([](tq::KvCacheConfig& c) { c.sink = 64; c.window = 64; c.center_k = true; }));

  using tq::KvFormat;
  const tq::KvSpec kv = tq::KvSpec::parse("tq4/tq2 w16 s4 ckv b1:f16");
  EXPECT_EQ(kv.k, KvFormat::tq4);
  EXPECT_EQ(kv.v, KvFormat::tq2);
  EXPECT_EQ(kv.window, 16);
  EXPECT_EQ(kv.sink, 4);
  EXPECT_TRUE(kv.center_k);
  EXPECT_TRUE(kv.center_v);
  EXPECT_EQ(kv.boundary_layers, 1);
  EXPECT_EQ(kv.resolved().to_string(), "k=tq4 v=tq2 window=16 sink=4 center=kv boundary=1:f16");
  EXPECT_EQ(tq::KvSpec::parse(tq::KvSpec::parse("tq3 cv").to_string()).to_string(), "k=tq3 v=tq3 center=v");
  const tq::KvSpec k_only = tq::KvSpec::parse("tq3 ck");
  EXPECT_TRUE(k_only.center_k);
  EXPECT_FALSE(k_only.center_v);
  // ck:N (the centring token limit) was removed: a one-line error that says what to use instead.
  for (const char* old : {"tq3 s1 ck:64", "tq3 ckv:16", "tq3 ck:", "tq3 ck:x"}) {
    try {
      tq::KvSpec::parse(old);
      ADD_FAILURE() << old << ": no error";
    } catch (const tq::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("removed"), std::string::npos) << old << ": " << msg;
      EXPECT_NE(msg.find("use ck"), std::string::npos) << old << ": " << msg;
    }
  }
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.center_segment = 48; }), tq::Error);   // not a multiple of 32
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.center_segment = 4096; }), tq::Error); // above the chunk
  EXPECT_EQ(tq::KvSpec::parse("tq3 s1 ck cs256").center_segment, 256);
  EXPECT_EQ(tq::KvSpec::parse("tq3 s1 ck cs256").to_string(), "k=tq3 v=tq3 sink=1 center=k,256");
  EXPECT_TRUE(tq::KvSpec::parse("tq3h6/tq4n8 s1 ck ks").scale_k);
  EXPECT_EQ(tq::KvSpec::parse("tq3h6/tq4n8 s1 ck cs256 ks").to_string(), "k=tq3h6 v=tq4n8 sink=1 center=k,256 scale-k");
  EXPECT_THROW(tq::KvSpec::parse("tq3 ksx"), tq::Error);
  EXPECT_TRUE(tq::KvSpec::parse("tq3h6/tq4n8 s1 ck tc").trellis);
  EXPECT_FALSE(tq::KvSpec::parse("tq3h6/tq4n8 s1 ck").trellis);
  EXPECT_EQ(tq::KvSpec::parse("tq3h6/tq4n8 tc s1 ck ks").to_string(), "k=tq3h6 v=tq4n8 sink=1 center=k scale-k trellis");
  EXPECT_THROW(tq::KvSpec::parse("tq3 tcx"), tq::Error);
  EXPECT_THROW(tq::KvSpec::parse("tq3 cx"), tq::Error);
  EXPECT_THROW(tq::KvSpec::parse("tq3 sx"), tq::Error);
  EXPECT_THROW(tq::KvSpec::parse("tq3 plainx"), tq::Error);
  // Numbers: digits only and in range, with an error that names the token.
  for (const char* bad : {"tq3 wX", "tq3 w-4", "tq3 s99999999999", "tq3 cs99999999999",
                          "tq3 bX:f16", "tq3 b:f16"}) {
    try {
      tq::KvSpec::parse(bad);
      ADD_FAILURE() << bad << ": no error";
    } catch (const tq::Error& e) {
      EXPECT_NE(std::string(e.what()).find("needs a number"), std::string::npos) << bad << ": " << e.what();
    }
  }
  EXPECT_EQ(tq::KvSpec::parse("tq3 w128 b2:f16").window, 128);
  EXPECT_THROW(tq::KvSpec::parse("tq3 crx"), tq::Error);
  // RoPE-rotating K means: need K centring and the keys' RoPE
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.center_rope = true; c.rope_base = 1e4f; c.rope_dim = 64; }),
               tq::Error);  // no center_k
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.center_k = c.center_rope = true; }), tq::Error);  // no RoPE
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.center_k = c.center_rope = true; c.rope_base = 1e4f; c.rope_dim = 63; }),
               tq::Error);  // odd
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.center_k = c.center_rope = true; c.rope_base = 1e4f; c.rope_dim = 66; }),
               tq::Error);  // > head_dim
  EXPECT_NO_THROW(make([](tq::KvCacheConfig& c) { c.center_k = c.center_rope = true; c.rope_base = 1e4f; c.rope_dim = 32; }));

  // Automatic protection: a tq K type with no sink or centring given runs with one f16 sink and
  // K means (512-token segments unless csN); either given, "plain", or a non-tq K type: as given.
  struct AutoCase {
    const char* in;
    bool prot;
    int sink;
    bool ck, cv;
    int seg;
    const char* label;
  };
  for (const AutoCase& c : std::vector<AutoCase>{
           {"tq3", true, 1, true, false, 512, "k=tq3 v=tq3 sink=1 center=k,rope,512"},
           {"tq3h6/tq4n8 ks", true, 1, true, false, 512, "k=tq3h6 v=tq4n8 sink=1 center=k,rope,512 scale-k"},
           {"tq3h6/tq4n8 cr", true, 1, true, false, 512, "k=tq3h6 v=tq4n8 sink=1 center=k,rope,512"},
           {"tq3 s1 ckv cr", false, 1, true, true, 0, "k=tq3 v=tq3 sink=1 center=kv,rope"},
           {"tq4/tq3 w64 b1:f16", true, 1, true, false, 512, "k=tq4 v=tq3 window=64 sink=1 center=k,rope,512 boundary=1:f16"},
           {"tq3 plain", false, 0, false, false, 0, "k=tq3 v=tq3 plain"},
           {"tq3 s0", false, 0, false, false, 0, "k=tq3 v=tq3 plain"},
           {"tq3 c0", false, 0, false, false, 0, "k=tq3 v=tq3 plain"},
           // The segment of the automatic means: the protection it implies is spelled out when parsed
           // (KvSpec has no "automatic but with another segment"), the same cache.
           {"tq3 cs256", false, 1, true, false, 256, "k=tq3 v=tq3 sink=1 center=k,rope,256"},
           // A segment without centring does nothing (and a KvSpec does not keep it).
           {"tq3 s0 cs256", false, 0, false, false, 0, "k=tq3 v=tq3 plain"},
           {"tq3 s4", false, 4, false, false, 0, "k=tq3 v=tq3 sink=4"},
           {"tq3 ck", false, 0, true, false, 0, "k=tq3 v=tq3 center=k"},
           {"tq3 s1 ck", false, 1, true, false, 0, "k=tq3 v=tq3 sink=1 center=k"},
           {"tq3 plain s2 cv", false, 2, false, true, 0, "k=tq3 v=tq3 sink=2 center=v"},
           {"q4_0h", false, 0, false, false, 0, "k=q4_0h v=q4_0h"},
           {"f16/tq3", false, 0, false, false, 0, "k=f16 v=tq3"},
           {"q8_0/tq3 ckv", false, 0, true, true, 0, "k=q8_0 v=tq3 center=kv"},
       }) {
    SCOPED_TRACE(c.in);
    const tq::KvSpec kv = tq::KvSpec::parse(c.in);
    EXPECT_EQ(kv.auto_protected(), c.prot);
    const tq::KvSpec r = kv.resolved();
    EXPECT_EQ(r.sink, c.sink);
    EXPECT_EQ(r.center_k, c.ck);
    EXPECT_EQ(r.center_v, c.cv);
    EXPECT_EQ(r.center_segment, c.seg);
    EXPECT_FALSE(r.auto_protected());  // resolving twice changes nothing
    EXPECT_EQ(r.to_string(), c.label);
    // The label names the same cache: it parses back to the same resolved options.
    const tq::KvSpec back = tq::KvSpec::parse(r.to_string()).resolved();
    EXPECT_EQ(back.sink, r.sink);
    EXPECT_EQ(back.center_k, r.center_k);
    EXPECT_EQ(back.center_v, r.center_v);
    EXPECT_EQ(back.center_rope, r.center_rope);
    EXPECT_EQ(back.center_k || back.center_v ? back.center_segment : 0, r.center_k || r.center_v ? r.center_segment : 0);
    EXPECT_EQ(back.to_string(), r.to_string());
  }
  // The automatic rotating mean is for the tq K types: the label rule and the cache agree on
  // every type name.
  for (const std::string& t : tq::kv_type_names()) {
    if (t.rfind("tq", 0) != 0) continue;
    SCOPED_TRACE(t);
    tq::KvCacheConfig c;
    c.head_dim = 64;
    c.max_tokens = 64;
    c.type_k = tq::parse_kv_format(t);
    c.center_k = c.center_rope = true;
    c.rope_base = 1e4f;
    c.rope_dim = 64;
    tq::KvCache cache(c);
    EXPECT_EQ(cache.impl().layers[0].k[0].centre.rope, tq::KvSpec::parse(t).resolved().center_rope);
  }
  tq::KvSpec plain_flag;  // --kv-plain on a type given with -ctk
  plain_flag.k = plain_flag.v = KvFormat::tq3;
  EXPECT_TRUE(plain_flag.auto_protected());
  plain_flag.protection = tq::Protection::none;
  EXPECT_FALSE(plain_flag.auto_protected());
  EXPECT_EQ(plain_flag.resolved().to_string(), "k=tq3 v=tq3 plain");
  EXPECT_TRUE(tq::KvSpec::parse("k=tq3 v=tq3 plain") == plain_flag);

  // Per-layer types: label round trip and expansion onto the cache config.
  const tq::KvSpec lk = tq::KvSpec::parse("tq4/tq3 s1 ck L0,2-3:tq6/tq4n8 L3:f16");
  ASSERT_EQ(lk.layers.size(), 2u);
  EXPECT_EQ(lk.layers[0].to_string(), "0,2-3:tq6/tq4n8");
  EXPECT_EQ(lk.to_string(), "k=tq4 v=tq3 sink=1 center=k layers=0,2-3:tq6/tq4n8 layers=3:f16");
  tq::KvCacheConfig lc;
  lc.n_layers = 5;
  lc = lk.resolve(lc);
  const std::vector<std::string> want_k = {"tq6", "", "tq6", "f16", ""}, want_v = {"tq4n8", "", "tq4n8", "f16", ""};
  EXPECT_EQ(tq_test::names(lc.layer_type_k), want_k);
  EXPECT_EQ(tq_test::names(lc.layer_type_v), want_v);
  // LAYER.HEAD items: one KV head, onto head_type_k / head_type_v (layer-major).
  tq::KvCacheConfig hc;
  hc.n_layers = 3;
  hc.n_kv_heads = 2;
  hc = tq::KvSpec::parse("f16 layers=1:tq3 layers=2.1,0.0:tq4/tq2").resolve(hc);
  const std::vector<std::string> want_hk = {"tq4", "", "", "", "", "tq4"}, want_hv = {"tq2", "", "", "", "", "tq2"};
  EXPECT_EQ(tq_test::names(hc.layer_type_k), (std::vector<std::string>{"", "tq3", ""}));
  EXPECT_EQ(tq_test::names(hc.head_type_k), want_hk);
  EXPECT_EQ(tq_test::names(hc.head_type_v), want_hv);
  EXPECT_EQ(tq::KvSpec::parse("tq4 plain L2.1,0.0:tq4/tq2").to_string(), "k=tq4 v=tq4 plain layers=2.1,0.0:tq4/tq2");
  for (const char* bad : {"5:tq4", "1-0:tq4", "x:tq4", "1,:tq4", ":tq4", "1:", "1:fp8", "1:tq4/", "-1:tq4", "1--2:tq4",
                          "1.2:tq4", "1.:tq4", ".1:tq4", "5.0:tq4", "1.0-2:tq4", "1.x:tq4"}) {
    tq::KvCacheConfig c;
    c.n_layers = 5;
    c.n_kv_heads = 2;
    EXPECT_THROW(tq::KvSpec::parse(std::string("f16 layers=") + bad).resolve(c), tq::Error) << bad;
    EXPECT_THROW(tq::KvSpec::parse(std::string("f16 L") + bad).resolve(c), tq::Error) << bad;
  }
}

// Cache config files (--kv-config, @FILE): one label over several lines with '#' comments
// and CRLF line ends; a file without a label, a missing file and a directory are errors.
TEST(KvQuality, LabelFiles) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tq_label_files_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name, std::ios::binary) << text;
    return (dir / name).string();
  };
  const std::string good = write("good.kv", "# a comment\r\n\r\ntq4h6n8/tq4n8 ks   # base\r\n\tL0.1,2.0:tq3h6n8/tq3n8\r\nL5:tq6\n");
  EXPECT_EQ(tq::read_kv_label_file(good), "tq4h6n8/tq4n8 ks L0.1,2.0:tq3h6n8/tq3n8 L5:tq6");
  const tq::KvSpec kv = tq::KvSpec::parse(tq::read_kv_label_file(good));
  EXPECT_EQ(kv.k, tq::KvFormat::tq4h6n8);
  EXPECT_TRUE(kv.scale_k);
  ASSERT_EQ(kv.layers.size(), 2u);
  EXPECT_EQ(kv.layers[0].to_string(), "0.1,2.0:tq3h6n8/tq3n8");
  auto error_of = [](const std::string& path) {
    try {
      tq::read_kv_label_file(path);
    } catch (const tq::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(write("empty.kv", "")).find("no cache label"), std::string::npos);
  EXPECT_NE(error_of(write("comments.kv", "# nothing\n  \n# here\n")).find("no cache label"), std::string::npos);
  EXPECT_NE(error_of(write("binary.kv", std::string("tq4\0\x01", 5))).find("not a text file"), std::string::npos);
  EXPECT_NE(error_of((dir / "missing.kv").string()).find("cannot read"), std::string::npos);
  EXPECT_NE(error_of(dir.string()).find("directory"), std::string::npos);
  // A long label's parse error quotes it shortened, on one line.
  std::string long_label = "tq4";
  for (int i = 0; i < 60; ++i) long_label += " L" + std::to_string(i) + ":tq3";
  try {
    tq::KvSpec::parse(long_label + " zz");
    ADD_FAILURE() << "no error";
  } catch (const tq::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'zz'"), std::string::npos) << m;
    EXPECT_LT(m.size(), 300u) << m;
  }
  fs::remove_all(dir);
}

// The shipped per-head allocations (configs/*.kv) parse, fit their model's shape (named by the
// file: SmolLM2-135M's 30 layers x 3 KV heads of 64 dims, Gemma 3 270M's 18 x 1 of 256) within
// the bits their names promise (the regular per-token bytes; sink and means come on top and are
// counted by `tq perplexity`), and are refused by a smaller model.
TEST(KvQuality, ShippedConfigsFitTheirModel) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(TQ_SOURCE_DIR) / "configs";
  struct Shape {
    const char* prefix;
    int layers, heads, dim;
  };
  const Shape shapes[] = {{"smollm2-135m-", 30, 3, 64}, {"gemma3-270m-", 18, 1, 256}};
  int seen = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".kv") continue;
    ++seen;
    const std::string name = e.path().filename().string();
    const Shape* sh = nullptr;
    for (const Shape& x : shapes)
      if (name.rfind(x.prefix, 0) == 0) sh = &x;
    ASSERT_NE(sh, nullptr) << name << ": a config for a model this test does not know (add its shape)";
    const tq::KvSpec kv = tq::KvSpec::parse(tq::read_kv_label_file(e.path().string()));
    tq::KvCacheConfig cfg = tq_test::kv_config(sh->layers, sh->heads, sh->dim, 2048, tq::kv_format_name(kv.k),
                                               tq::kv_format_name(kv.v));
    {  // the per-layer and per-head types only (the protection needs the model's RoPE)
      const tq::KvCacheConfig full = kv.resolve(cfg);
      cfg.layer_type_k = full.layer_type_k;
      cfg.layer_type_v = full.layer_type_v;
      cfg.head_type_k = full.head_type_k;
      cfg.head_type_v = full.head_type_v;
    }
    int entries = 0;
    for (const auto& t : cfg.head_type_k) entries += t.has_value();
    for (const auto& t : cfg.layer_type_k) entries += t.has_value();
    EXPECT_GT(entries, 0) << name << ": per-KV-head (or, one head per layer, per-layer) entries";
    const tq::KvCache cache(cfg);
    const double bits = cache.bytes_per_token() * 8.0 / (2.0 * sh->layers * sh->heads * sh->dim);
    const double promised = std::stod(name.substr(name.find("-kv") + 3));
    EXPECT_LE(bits, promised) << name;
    EXPECT_GT(bits, promised - 0.25) << name;
    const tq::KvCacheConfig small = tq_test::kv_config(2, sh->heads, sh->dim, 2048, "f16", "f16");
    EXPECT_THROW(kv.resolve(small), tq::Error) << name;
  }
  EXPECT_GE(seen, 2);
}

// Defaults chosen from what a model is, not its name (kv_model_defaults): a model with
// QK-normed keys (gemma3's traits, Gemma 3 270M's shape) gets scale-k on top of the automatic
// protection and its own `auto` types; one without (llama's traits, SmolLM2-135M's shape) keeps
// exactly the protection and recommendation it had. Written protections are left alone.
TEST(KvQuality, DefaultsFromModelProperties) {
  auto model = [](const char* arch, int layers, int kv_heads, int dim, float rope_base) {
    tq::LlamaConfig m;
    m.arch = arch;
    m.traits = *tq::arch_traits(arch);
    m.n_layers = layers;
    m.n_heads = kv_heads * 3;
    m.n_kv_heads = kv_heads;
    m.head_dim = m.rope_dim = dim;
    m.n_embd = m.n_heads * dim;
    m.rope_base = rope_base;
    return m;
  };
  tq::LlamaConfig plain = model("llama", 30, 3, 64, 1e5f);
  tq::LlamaConfig qkn = model("gemma3", 18, 1, 256, 1e6f);
  qkn.sliding_window = 512;
  ASSERT_FALSE(plain.traits.qk_norm);
  ASSERT_TRUE(qkn.traits.qk_norm);
  // The property decides, not the name: llama's traits with QK-norm on behave as gemma3's.
  tq::LlamaConfig llama_qkn = plain;
  llama_qkn.traits.qk_norm = true;
  EXPECT_TRUE(tq::kv_model_defaults(llama_qkn).scale_k);
  EXPECT_FALSE(tq::kv_model_defaults(plain).scale_k);
  EXPECT_STREQ(tq::kv_model_defaults(qkn).rule, "qk-norm");
  EXPECT_STREQ(tq::kv_model_defaults(plain).rule, "default");

  const tq::KvSpec tq3 = tq::KvSpec::parse("tq3h6/tq4n8");
  // No QK-norm: the same spec and cache as without a model.
  EXPECT_EQ(tq3.resolved(plain), tq3.resolved());
  EXPECT_EQ(tq3.resolved(plain).to_string(), "k=tq3h6 v=tq4n8 sink=1 center=k,rope,512");
  EXPECT_FALSE(tq3.resolve(plain, 512).scale_k);
  // QK-norm: scale-k added, shown in the label and the JSON, built into the cache.
  EXPECT_EQ(tq3.resolved(qkn).to_string(), "k=tq3h6 v=tq4n8 sink=1 center=k,rope,512 scale-k");
  const tq::KvCacheConfig c = tq3.resolve(qkn, 512);
  EXPECT_TRUE(c.scale_k);
  EXPECT_EQ(c.sink, 1);
  EXPECT_TRUE(c.center_k && c.center_rope);
  EXPECT_EQ(c.layer_window.size(), 18u);  // still the model's shape
  const nlohmann::json j = nlohmann::json::parse(tq3.to_json(qkn));
  EXPECT_EQ(j.at("label"), "k=tq3h6 v=tq4n8 sink=1 center=k,rope,512 scale-k");
  EXPECT_EQ(j.at("spec"), "k=tq3h6 v=tq4n8");
  EXPECT_EQ(j.at("model_rule"), "qk-norm");
  EXPECT_TRUE(j.at("scale_k").get<bool>());
  EXPECT_TRUE(j.at("auto_protected").get<bool>());
  // Resolving twice changes nothing.
  EXPECT_EQ(tq3.resolved(qkn).resolved(qkn), tq3.resolved(qkn));
  // Only the automatic protection of a tq K type changes: plain, a written protection and
  // non-tq K types stay as written.
  for (const char* same : {"tq3 plain", "tq3 s1 ck", "tq3 sink=1 center=k,rope,512", "q8_0", "q4_0h", "f16/tq3"}) {
    const tq::KvSpec s = tq::KvSpec::parse(same);
    EXPECT_EQ(s.resolved(qkn), s.resolved()) << same;
    EXPECT_FALSE(s.resolve(qkn, 512).scale_k) << same;
  }

  // `auto`: the generic recommendation of each kind of model.
  const tq::KvSpec a = tq::KvSpec::parse("auto");
  EXPECT_TRUE(a.auto_types);
  EXPECT_TRUE(a.auto_protected());
  EXPECT_EQ(a.to_string(), "auto");
  EXPECT_EQ(tq::KvSpec::parse(a.to_string()), a);
  EXPECT_EQ(a.resolved(), a);  // no model: nothing to choose from
  const tq::KvModelDefaults dq = tq::kv_model_defaults(qkn), dp = tq::kv_model_defaults(plain);
  EXPECT_EQ(a.resolved(plain).k, dp.k);
  EXPECT_EQ(a.resolved(plain).v, dp.v);
  EXPECT_EQ(a.resolved(plain), tq3.resolved(plain));  // SmolLM2's recommendation unchanged
  EXPECT_EQ(a.resolved(qkn).k, dq.k);
  EXPECT_EQ(a.resolved(qkn).v, dq.v);
  EXPECT_TRUE(a.resolved(qkn).scale_k);
  EXPECT_EQ(a.resolve(qkn, 512).type_k, dq.k);
  EXPECT_EQ(nlohmann::json::parse(a.to_json(qkn)).at("spec"), "auto");
  EXPECT_EQ(nlohmann::json::parse(a.to_json()).at("type_k"), "auto");
  // Other tokens still apply on top of it.
  const tq::KvSpec ap = tq::KvSpec::parse("auto plain seed=3");
  EXPECT_EQ(ap.to_string(), "auto plain seed=3");
  EXPECT_EQ(tq::KvSpec::parse(ap.to_string()), ap);
  EXPECT_FALSE(ap.resolved(qkn).scale_k);
  EXPECT_EQ(ap.resolve(qkn, 512).sink, 0);
  EXPECT_EQ(ap.resolve(qkn, 512).seed, 3u);
  EXPECT_TRUE(tq::KvSpec::parse("auto trellis").resolve(plain, 64).trellis);
  // Errors: one line each. `auto` with types; `auto` on a bare cache shape (no model).
  for (const char* bad : {"auto tq4", "tq4 auto", "auto k=tq3", "auto v=tq3n8"}) {
    try {
      tq::KvSpec::parse(bad);
      ADD_FAILURE() << bad << ": no error";
    } catch (const tq::Error& e) {
      EXPECT_NE(std::string(e.what()).find("auto"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  try {
    a.resolve(tq::kv_config_for(plain, 64));
    ADD_FAILURE() << "auto on a shape: no error";
  } catch (const tq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model"), std::string::npos) << e.what();
  }
}

TEST(KvQuality, SplitChannelsOfCentredRows) {
  // Channels 0..15 carry a big constant offset but little variance; channels 40..55 carry big
  // variance. Without centring the offset channels are the "outliers"; centred, the varying ones.
  const int D = 64, n = 40;
  tq::Rng rng(8);
  std::vector<float> k((size_t)n * D), v((size_t)n * D);
  for (int t = 0; t < n; ++t)
    for (int d = 0; d < D; ++d) {
      k[(size_t)t * D + d] = (d < 16 ? 20.f : 0.f) + (d >= 40 && d < 56 ? 5.f : 0.3f) * (float)rng.normal();
      v[(size_t)t * D + d] = (float)rng.normal();
    }
  for (bool centre : {false, true}) {
    tq::KvCacheConfig cfg;
    cfg.n_kv_heads = 1;
    cfg.head_dim = D;
    cfg.max_tokens = n;
    cfg.type_k = tq::KvFormat::tq2h3;
    cfg.center_k = centre;
    tq::KvCache c(cfg);
    c.append(0, n, k.data(), v.data());
    const auto& s = c.impl().layers[0].k[0];
    ASSERT_TRUE(s.channels.frozen);
    std::vector<int> hi(s.channels.perm.begin(), s.channels.perm.begin() + 16);
    std::vector<int> want(16);
    for (int i = 0; i < 16; ++i) want[i] = centre ? 40 + i : i;
    EXPECT_EQ(hi, want) << (centre ? "centred" : "plain");
  }
}

TEST(KvQuality, LogNormFormats) {
  // tqBn8: the tq codes with an 8-bit log norm + an int16 exponent per 32-token block (32
  // steps per octave for the 6 octaves below the block's largest norm, 8 below that). Token
  // norms spanning 2^-6..2^6, in rising order inside blocks (so the block exponent moves up
  // and the earlier codes are re-coded), token by token.
  const int D = 64, n = 100;
  tq::Rng rng(31);
  std::vector<float> k((size_t)n * D), v((size_t)n * D);
  for (int t = 0; t < n; ++t) {
    const float sc = std::exp2(-6.f + 12.f * (float)(t % 37) / 36.f);
    for (int d = 0; d < D; ++d) {
      k[(size_t)t * D + d] = sc * (float)rng.normal();
      v[(size_t)t * D + d] = (t == 50) ? 0.f : sc * (float)rng.normal();  // one zero vector
    }
  }
  tq::KvCacheConfig cfg;
  cfg.n_kv_heads = 1;
  cfg.head_dim = D;
  cfg.max_tokens = n;
  cfg.type_k = tq::KvFormat::tq3n8;
  cfg.type_v = tq::KvFormat::tq3;
  tq::KvCache a(cfg);
  cfg.type_k = tq::KvFormat::tq3;
  tq::KvCache b(cfg);
  for (int t = 0; t < n; ++t) {
    a.append(0, 1, k.data() + t * D, v.data() + t * D);
    b.append(0, 1, k.data() + t * D, v.data() + t * D);
  }
  // Same codes; norms within half a fine log step (2^(1/64) - 1 = 1.1%) of the fp16 ones when
  // within 2^5.8 of the block's largest, else within 2.5 fine steps (one coarse rounding: 5.6%).
  const auto& sa = a.impl().layers[0].k[0];
  const auto& sb = b.impl().layers[0].k[0];
  std::vector<float> ra((size_t)n * D), rb((size_t)n * D);
  sa.decode_domain(0, n, ra.data());
  sb.decode_domain(0, n, rb.data());
  std::vector<double> na(n), nb(n), dot(n), bmax((n + 31) / 32, 0.0);
  for (int t = 0; t < n; ++t) {
    for (int d = 0; d < D; ++d) {
      na[t] += (double)ra[t * D + d] * ra[t * D + d];
      nb[t] += (double)rb[t * D + d] * rb[t * D + d];
      dot[t] += (double)ra[t * D + d] * rb[t * D + d];
    }
    bmax[t / 32] = std::max(bmax[t / 32], std::sqrt(nb[t]));
  }
  int fine = 0, coarse = 0;
  for (int t = 0; t < n; ++t) {
    const bool in_fine = std::sqrt(nb[t]) >= bmax[t / 32] * std::exp2(-5.8);
    (in_fine ? fine : coarse)++;
    EXPECT_NEAR(std::sqrt(na[t] / nb[t]), 1.0, in_fine ? 0.011 : 0.056) << t;
    EXPECT_NEAR(dot[t] / std::sqrt(na[t] * nb[t]), 1.0, 1e-6) << t;  // same direction (same codes)
  }
  EXPECT_GT(fine, 40);
  EXPECT_GT(coarse, 10);
  // Split types with 8-bit norms: the same codes as with fp16 norms (same channels), each
  // part's norm within the fine step of the fp16 one (norms within 2^5.8 of their block's).
  {
    tq::KvCacheConfig sc = cfg;
    sc.type_k = tq::KvFormat::tq3h6n8;
    tq::KvCache s8(sc);
    sc.type_k = tq::KvFormat::tq3h6;
    tq::KvCache s16(sc);
    s8.append(0, n, k.data(), v.data());
    s16.append(0, n, k.data(), v.data());
    const auto& t8 = s8.impl().layers[0].k[0];
    const auto& t16 = s16.impl().layers[0].k[0];
    ASSERT_EQ(t8.channels.perm, t16.channels.perm);
    std::vector<float> r8((size_t)n * D), r16((size_t)n * D);
    t8.decode_domain(0, n, r8.data());
    t16.decode_domain(0, n, r16.data());
    for (int part = 0; part < 2; ++part) {
      const int d0 = part == 0 ? 0 : D / 4, d1 = part == 0 ? D / 4 : D;
      std::vector<double> n8v(n), n16v(n), bm((n + 31) / 32, 0.0);
      for (int t = 0; t < n; ++t) {
        for (int d = d0; d < d1; ++d) {
          n8v[t] += (double)r8[t * D + d] * r8[t * D + d];
          n16v[t] += (double)r16[t * D + d] * r16[t * D + d];
        }
        bm[t / 32] = std::max(bm[t / 32], std::sqrt(n16v[t]));
      }
      for (int t = 0; t < n; ++t) {
        const bool in_fine = std::sqrt(n16v[t]) >= bm[t / 32] * std::exp2(-5.8);
        EXPECT_NEAR(std::sqrt(n8v[t] / n16v[t]), 1.0, in_fine ? 0.011 : 0.056) << "part " << part << " " << t;
      }
    }
    EXPECT_DOUBLE_EQ(s8.bytes_per_token(), 32 + 4.0 / 32 + 26);
    EXPECT_EQ(s8.bytes_used(), (size_t)n * (32 + 26) + 4 * 4 + (size_t)(D + 7) / 8);
  }
  // Bytes: 25 B per K vector + 2 B per started 32-token block; bytes_per_token shares the header.
  EXPECT_EQ(tq::kv_type_bytes(tq::parse_kv_type("tq3n8"), 64), 25u);
  EXPECT_DOUBLE_EQ(a.bytes_per_token(), 25 + 2.0 / 32 + 26);
  EXPECT_EQ(a.bytes_used(), (size_t)n * (25 + 26) + 4 * 2);
  // Attention with n8 on both sides (zero V vector included) matches the reference.
  cfg.type_k = tq::KvFormat::tq5n8;
  cfg.type_v = tq::KvFormat::tq2n8;
  cfg.sink = 1;
  cfg.center_k = true;
  tq::KvCache c(cfg);
  c.append(0, n, k.data(), v.data());
  std::vector<float> q(2 * D), ref(q.size()), out(q.size());
  for (auto& x : q) x = (float)rng.normal();
  tq::AttentionParams p;
  p.n_heads = 2;
  tq::attention_ref(c, 0, 1, q.data(), ref.data(), p);
  p.kernel = tq::AttnKernel::fused;
  tq::attention(c, 0, 1, q.data(), out.data(), p);
  EXPECT_LE(rel_err(out, ref), kExactRelTol);
  tq::attention(c, 0, 1, q.data(), out.data(), p);
  EXPECT_LE(rel_err(out, ref), kExactRelTol);  // no int8 kernel for n8: float path
}

TEST(KvQuality, KScaleFollowsTheQueries) {
  // Keys with their energy on pairs 0..7, queries with theirs on pairs 20..27: scale_k gives
  // the queried pairs the larger weights (w^4 ~ query energy / K energy, equal within a pair,
  // K energy kept), leaves q.k unchanged (tq8: near-exact either way) and lowers the attention
  // error of a 3-bit cache for queries from the same law. Position 0 (BOS) is ignored.
  const int D = 64, n = 300, KVH = 2, G = 2, H = KVH * G;
  tq::Rng rng(17);
  auto scale_k = [](int d) { return d / 2 < 8 ? 6.f : 1.f; };
  auto scale_q = [](int d) { return d / 2 >= 20 && d / 2 < 28 ? 5.f : 0.5f; };
  auto draw_q = [&](int m) {
    std::vector<float> q((size_t)m * H * D);
    for (size_t i = 0; i < q.size(); ++i) q[i] = (float)rng.normal() * scale_q((int)(i % D));
    return q;
  };
  std::vector<float> k((size_t)n * KVH * D), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = (float)rng.normal() * scale_k((int)(i % D));
    v[i] = (float)rng.normal();
  }
  for (int d = 0; d < D; ++d) k[d] = 1e4f;  // BOS, head 0: would swamp the energies
  const std::vector<float> qs = draw_q(n), qe = draw_q(8);
  auto run = [&](const std::string& tk, bool ks, bool observe, std::vector<float>* weights) {
    tq::KvCacheConfig cfg = tq_test::kv_config(1, KVH, D, n, tk, "f16");
    cfg.scale_k = ks;
    cfg.sink = 1;
    tq::KvCache cache(cfg);
    if (observe) cache.observe_queries(0, n, qs.data(), H);
    cache.append(0, n, k.data(), v.data());
    if (weights) *weights = cache.impl().layers[0].k[0].kscale.w;
    std::vector<float> out(qe.size()), ref(qe.size());
    tq::AttentionParams p;
    p.n_heads = H;
    p.kernel = tq::AttnKernel::fused;
    tq::attention(cache, 0, 8, qe.data(), out.data(), p);
    tq::attention_ref(cache, 0, 8, qe.data(), ref.data(), p);
    EXPECT_LE(rel_err(out, ref), kExactRelTol) << tk << (ks ? " ks" : "");
    return out;
  };
  std::vector<float> w;
  const auto exact = run("f32", false, true, nullptr);
  const auto plain = run("tq3", false, true, nullptr);
  const auto scaled = run("tq3", true, true, &w);
  ASSERT_EQ((int)w.size(), D);
  double e_k = 0, e_kw = 0;
  for (int d = 0; d < D; ++d) {
    EXPECT_EQ(w[d], w[d ^ 1]) << d;  // one weight per pair
    if (d / 2 >= 20 && d / 2 < 28) EXPECT_GT(w[d], 2.f * w[0]) << d;
    e_k += scale_k(d) * scale_k(d);
    e_kw += (double)w[d] * w[d] * scale_k(d) * scale_k(d);
  }
  EXPECT_NEAR(e_kw / e_k, 1.0, 0.05);  // K energy kept (up to the sample and fp16 rounding)
  const double err_plain = rel_err(plain, exact), err_scaled = rel_err(scaled, exact);
  EXPECT_LT(err_scaled, 0.5 * err_plain) << err_scaled << " vs " << err_plain;
  EXPECT_LE(rel_err(run("tq8", true, true, nullptr), exact), 0.01);
  // No queries observed: no weights, the same results as without scale_k.
  EXPECT_EQ(run("tq3", true, false, &w), plain);
  EXPECT_TRUE(w.empty());
  // Frozen with the first quantized token; clear() starts over.
  tq::KvCacheConfig cfg = tq_test::kv_config(1, KVH, D, n, "tq3h6", "tq3");
  cfg.scale_k = true;
  tq::KvCache cache(cfg);
  cache.observe_queries(0, n, qs.data(), H);
  cache.append(0, n, k.data(), v.data());
  const std::vector<float> w1 = cache.impl().layers[0].k[1].kscale.w;
  EXPECT_FALSE(w1.empty());
  EXPECT_TRUE(cache.impl().layers[0].v[1].kscale.w.empty());  // V is never scaled
  EXPECT_EQ(cache.bytes_used(), (size_t)n * KVH * (tq::kv_type_bytes(tq::parse_kv_type("tq3h6"), D) +
                                                   tq::kv_type_bytes(tq::parse_kv_type("tq3"), D)) +
                                    (size_t)KVH * (D / 2) * 2 + (size_t)KVH * D / 8);  // K scales, K channel masks
  cache.clear();
  EXPECT_TRUE(cache.impl().layers[0].k[1].kscale.w.empty());
  EXPECT_EQ(cache.impl().layers[0].k[1].kscale.q_n, 0);
}
