// The keys' RoPE as the cache knows it (KvCacheConfig: rope_neox, layer_rope_base,
// layer_rope_scale, rope_freq_factors): neox pairs moved to (2i, 2i + 1) on entry, one set of
// RoPE-rotating-mean tables per distinct layer frequencies, and the checks on those fields.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kv/kv_internal.h"
#include "kv_test_util.h"
#include "tq/error.h"
#include "tq/kv_cache.h"
#include "tq/common.h"

namespace {

using tq_test::rel_err;

// Interleaved (2i, 2i + 1) rows to neox (i, i + R / 2) rows: the first R dims of each row of D.
std::vector<float> to_neox(const std::vector<float>& x, int D, int R) {
  std::vector<float> y(x);
  const int H = R / 2;
  for (size_t r = 0; r < x.size() / D; ++r)
    for (int i = 0; i < H; ++i) {
      y[r * D + i] = x[r * D + 2 * i];
      y[r * D + i + H] = x[r * D + 2 * i + 1];
    }
  return y;
}

// Keys (interleaved pairs) with a constant pre-RoPE component in every other pair of the first
// R dims, turned by RoPE at base `base`: what the RoPE-rotating mean removes.
void add_turning_mean(int n, int kvh, int D, int R, double base, std::vector<float>& k) {
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < kvh; ++h)
      for (int i = 0; i < R / 2; i += 2) {
        const double a = t * std::pow(base, -2.0 * i / R), c0 = 2.5 + h, c1 = -1.5;
        float* x = &k[((size_t)t * kvh + h) * D + 2 * i];
        x[0] += (float)(c0 * std::cos(a) - c1 * std::sin(a));
        x[1] += (float)(c0 * std::sin(a) + c1 * std::cos(a));
      }
}

std::vector<float> normal(tq::Rng& rng, size_t n, float scale = 1.f) {
  std::vector<float> x(n);
  for (auto& v : x) v = scale * (float)rng.normal();
  return x;
}

struct Data {
  int n, kvh, G, D;
  std::vector<float> k, v, q, qa;  // qa: queries observed with each append (scale_k)
};

Data make_data(int n, int kvh, int G, int D, int R, double base, uint64_t seed) {
  tq::Rng rng(seed);
  Data d{n, kvh, G, D};
  d.k = normal(rng, (size_t)n * kvh * D);
  d.v = normal(rng, d.k.size());
  add_turning_mean(n, kvh, D, R, base, d.k);
  d.qa = normal(rng, (size_t)n * kvh * G * D);
  for (size_t i = 0; i < d.qa.size(); ++i)
    if ((i % D) / 2 % 5 == 1) d.qa[i] *= 4.f;  // energy on a few pairs, as in real models
  d.q = normal(rng, (size_t)16 * kvh * G * D);
  return d;
}

// Fills every layer with the same rows (observe_queries, then append, in three batches).
void fill(tq::KvCache& cache, const Data& d, const std::vector<float>& k, const std::vector<float>& qa) {
  const size_t row = (size_t)d.kvh * d.D, qrow = row * d.G;
  for (int l = 0; l < cache.config().n_layers; ++l)
    for (int t = 0; t < d.n;) {
      const int m = std::min(t == 0 ? d.n / 3 : 37, d.n - t);
      cache.observe_queries(l, m, qa.data() + t * qrow, d.kvh * d.G);
      cache.append(l, m, k.data() + t * row, d.v.data() + t * row);
      t += m;
    }
}

std::vector<float> attend(const tq::KvCache& cache, int layer, const std::vector<float>& q, const Data& d,
                          tq::AttnKernel kernel) {
  std::vector<float> out(q.size());
  tq::AttentionParams p;
  p.n_heads = d.kvh * d.G;
  p.kernel = kernel;
  tq::attention(cache, layer, (int)(q.size() / ((size_t)p.n_heads * d.D)), q.data(), out.data(), p);
  return out;
}

tq::KvCacheConfig protected_cfg(int layers, int kvh, int D, int n, int R, const char* tk, const char* tv) {
  tq::KvCacheConfig cfg = tq_test::kv_config(layers, kvh, D, n, tk, tv);
  tq_test::rope_centred_k(cfg, 10000, 1);
  cfg.rope_dim = R;
  cfg.scale_k = true;
  cfg.center_segment = 64;
  return cfg;
}

constexpr tq::AttnKernel kKernels[] = {tq::AttnKernel::reference, tq::AttnKernel::fused, tq::AttnKernel::lut8};

TEST(KvRope, NeoxRowsEqualInterleavedRows) {
  // A cache told its rows are neox works on them in (2i, 2i + 1) order: given neox rows it holds
  // and answers exactly what a normal-mode cache does given the same rows interleaved. Partial
  // RoPE (R < D) keeps the tail where it is; two layers with their own bases.
  const int D = 64, R = 48, n = 230, kvh = 2, G = 2;
  const Data d = make_data(n, kvh, G, D, R, 1e4, 3);
  for (auto [tk, tv] : {std::pair{"tq4", "tq3"}, std::pair{"tq3h5n8", "tq3n8"}}) {
    SCOPED_TRACE(std::string(tk) + "/" + tv);
    tq::KvCacheConfig cfg = protected_cfg(2, kvh, D, n, R, tk, tv);
    cfg.layer_rope_base = {1e4f, 1e6f};
    tq::KvCacheConfig neox = cfg;
    neox.rope_neox = true;
    tq::KvCache a(neox), b(cfg);
    ASSERT_TRUE(a.impl().neox_to_pairs);
    ASSERT_FALSE(b.impl().neox_to_pairs);
    fill(a, d, to_neox(d.k, D, R), to_neox(d.qa, D, R));
    fill(b, d, d.k, d.qa);
    EXPECT_EQ(a.bytes_used(), b.bytes_used());
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < kvh; ++h) {
        EXPECT_EQ(a.impl().layers[l].k[h].centre.mu, b.impl().layers[l].k[h].centre.mu);
        EXPECT_EQ(a.impl().layers[l].k[h].kscale.w, b.impl().layers[l].k[h].kscale.w);
        EXPECT_FALSE(a.impl().layers[l].k[h].kscale.w.empty());
      }
      const std::vector<float> qn = to_neox(d.q, D, R);
      for (tq::AttnKernel kern : kKernels) {
        const std::vector<float> oa = attend(a, l, qn, d, kern), ob = attend(b, l, d.q, d, kern);
        ASSERT_EQ(0, std::memcmp(oa.data(), ob.data(), oa.size() * sizeof(float)))
            << "layer " << l << " kernel " << tq::attn_kernel_name(kern);
      }
    }
  }
}

TEST(KvRope, NeoxPairsOnlyWhenTheyMatter) {
  // Without center_rope and scale_k nothing reads the pairs: a neox cache takes its rows as
  // they are (q4_0 blocks keep the model's own dim order, as llama.cpp's do).
  const int D = 64, n = 100, kvh = 1, G = 4;
  const Data d = make_data(n, kvh, G, D, D, 1e4, 5);
  tq::KvCacheConfig cfg = tq_test::kv_config(1, kvh, D, n, "q4_0", "q4_0");
  cfg.rope_base = 1e4f;
  cfg.rope_dim = D;
  tq::KvCacheConfig neox = cfg;
  neox.rope_neox = true;
  tq::KvCache a(neox), b(cfg);
  EXPECT_FALSE(a.impl().neox_to_pairs);
  fill(a, d, d.k, d.qa);
  fill(b, d, d.k, d.qa);
  const std::vector<float> oa = attend(a, 0, d.q, d, tq::AttnKernel::fused), ob = attend(b, 0, d.q, d, tq::AttnKernel::fused);
  EXPECT_EQ(0, std::memcmp(oa.data(), ob.data(), oa.size() * sizeof(float)));
}

TEST(KvRope, NeoxKeysNeedNeoxPairs) {
  // Keys roped in neox order with a turning pre-RoPE mean: the rotating mean removes it only
  // when the cache pairs the right dims. The protected tq3 cache's attention error with
  // rope_neox against the same cache pairing (2i, 2i + 1) of neox rows.
  const int D = 128, n = 600, kvh = 1, G = 4;
  const Data d = make_data(n, kvh, G, D, D, 1e4, 7);
  const std::vector<float> kn = to_neox(d.k, D, D), qan = to_neox(d.qa, D, D), qn = to_neox(d.q, D, D);
  auto run = [&](const char* type, bool neox_pairs) {
    tq::KvCacheConfig cfg = protected_cfg(1, kvh, D, n, D, type, "f32");
    if (std::string(type) == "f32") cfg.center_k = cfg.center_rope = cfg.scale_k = false;
    cfg.rope_neox = neox_pairs;
    tq::KvCache cache(cfg);
    fill(cache, d, kn, qan);
    return attend(cache, 0, qn, d, tq::AttnKernel::fused);
  };
  const std::vector<float> exact = run("f32", false);
  for (const char* t : {"tq3", "tq4"}) {
    const double wrong = rel_err(run(t, false), exact), right = rel_err(run(t, true), exact);
    EXPECT_LT(right, 0.8 * wrong) << t << ": " << right << " vs " << wrong;
  }
}

TEST(KvRope, EachLayerTurnsAtItsOwnBase) {
  // layer_rope_base: a layer's tables are those of a cache with that base alone; layers with
  // equal frequencies share one set.
  const int D = 64, n = 200, kvh = 1, G = 2;
  const Data d = make_data(n, kvh, G, D, D, 1e4, 9);
  tq::KvCacheConfig cfg = protected_cfg(3, kvh, D, n, D, "tq3", "tq3");
  cfg.rope_base = 5e5f;
  cfg.layer_rope_base = {1e4f, 0.f, 1e4f};  // 0: rope_base
  tq::KvCache mixed(cfg);
  EXPECT_EQ(mixed.impl().rope.size(), 2u);
  EXPECT_EQ(mixed.impl().layer_rope, (std::vector<int>{0, 1, 0}));
  fill(mixed, d, d.k, d.qa);
  for (float base : {1e4f, 5e5f}) {
    tq::KvCacheConfig one = cfg;
    one.layer_rope_base.clear();
    one.rope_base = base;
    tq::KvCache single(one);
    fill(single, d, d.k, d.qa);
    for (int l = 0; l < 3; ++l) {
      if ((l == 1) != (base == 5e5f)) continue;
      EXPECT_EQ(mixed.impl().layers[l].k[0].centre.rope_freq, single.impl().layers[l].k[0].centre.rope_freq);
      EXPECT_EQ(mixed.impl().layers[l].k[0].centre.mu, single.impl().layers[l].k[0].centre.mu);
      for (tq::AttnKernel kern : kKernels) {
        const std::vector<float> om = attend(mixed, l, d.q, d, kern), os = attend(single, l, d.q, d, kern);
        EXPECT_EQ(0, std::memcmp(om.data(), os.data(), om.size() * sizeof(float)))
            << "layer " << l << " kernel " << tq::attn_kernel_name(kern);
      }
    }
  }
}

TEST(KvRope, ScaleAndFactorsSetTheFrequencies) {
  // w_i = base^(-2i / R) * layer_rope_scale[l] / rope_freq_factors[i].
  const int D = 32, R = 32;
  tq::KvCacheConfig cfg = protected_cfg(2, 1, D, 64, R, "tq3", "tq3");
  cfg.rope_base = 1e4f;
  cfg.layer_rope_scale = {0.125f, 0.f};  // 0: no scaling
  for (int i = 0; i < R / 2; ++i) cfg.rope_freq_factors.push_back(i < 4 ? 1.f : 2.f + i);
  tq::KvCache cache(cfg);
  for (int l = 0; l < 2; ++l) {
    const std::vector<double>& w = cache.impl().layers[l].k[0].centre.rope_freq;
    ASSERT_EQ(w.size(), (size_t)R / 2);
    for (int i = 0; i < R / 2; ++i) {
      const double want = std::pow(1e4, -2.0 * i / R) * (l == 0 ? 0.125 : 1.0) / cfg.rope_freq_factors[i];
      EXPECT_NEAR(w[i], want, 1e-15 * want) << l << " " << i;
    }
  }
}

TEST(KvRope, BadRopeFieldsAreErrors) {
  auto make = [](auto edit) {
    tq::KvCacheConfig c = protected_cfg(2, 1, 64, 64, 64, "tq3", "tq3");
    edit(c);
    tq::KvCache cache(c);
  };
  EXPECT_NO_THROW(make([](tq::KvCacheConfig& c) { c.layer_rope_base = {1e4f, 1e6f}; }));
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.layer_rope_base = {1e4f}; }), tq::Error);  // 1 for 2 layers
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.layer_rope_base = {1e4f, -1.f}; }), tq::Error);
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.layer_rope_base = {1e4f, NAN}; }), tq::Error);
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.layer_rope_scale = {1.f, 1.f, 1.f}; }), tq::Error);
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.layer_rope_scale = {1.f, INFINITY}; }), tq::Error);
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.rope_freq_factors.assign(31, 1.f); }), tq::Error);
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.rope_freq_factors.assign(32, 0.f); }), tq::Error);
  EXPECT_NO_THROW(make([](tq::KvCacheConfig& c) { c.rope_freq_factors.assign(32, 4.f); }));
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.rope_neox = true, c.rope_dim = 0; }), tq::Error);
  EXPECT_THROW(make([](tq::KvCacheConfig& c) { c.rope_neox = true, c.rope_dim = 33; }), tq::Error);
  try {
    make([](tq::KvCacheConfig& c) { c.layer_rope_base = {1e4f}; });
  } catch (const tq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer_rope_base has 1 entries for 2 layers"), std::string::npos) << e.what();
  }
}

}  // namespace
