// Llama forward pass: a tiny random-weight model written by the test, checked against a plain
// double-precision reference written here from the equations (RMSNorm, normal-mode RoPE, GQA
// causal softmax attention, SwiGLU, tied head); batched prefill vs token-by-token decode;
// the sampler. The end-to-end run on the real model is in test_model_e2e.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "llm/qmatvec.h"
#include "cli_test_util.h"
#include "llm_test_util.h"
#include "tq/common.h"
#include "tq/error.h"
#include "tq/gguf.h"
#include "tq/kv_cache.h"
#include "tq/kv_spec.h"
#include "tq/model.h"

namespace {

using tq_test::TinyLlama;

// Plain reference: all tokens at once, double precision, K/V kept exactly.
std::vector<double> reference_logits(const tq::GgufFile& g, const TinyLlama& c, const std::vector<int32_t>& toks) {
  const int n = static_cast<int>(toks.size()), E = c.n_embd, H = c.n_heads, KH = c.n_kv_heads, D = E / H,
            KV = KH * D, F = c.n_ff, V = c.n_vocab;
  auto W = [&](const std::string& name) { return g.tensor_f32(g.tensor(name)); };
  auto mat = [&](const std::vector<double>& x, const std::vector<float>& w, int in, int out) {
    std::vector<double> y(static_cast<size_t>(n) * out, 0.0);
    for (int i = 0; i < n; ++i)
      for (int o = 0; o < out; ++o) {
        double s = 0;
        for (int j = 0; j < in; ++j) s += x[static_cast<size_t>(i) * in + j] * w[static_cast<size_t>(o) * in + j];
        y[static_cast<size_t>(i) * out + o] = s;
      }
    return y;
  };
  auto norm = [&](const std::vector<double>& x, const std::vector<float>& w) {
    std::vector<double> y(x.size());
    for (int i = 0; i < n; ++i) {
      double ss = 0;
      for (int j = 0; j < E; ++j) ss += x[i * E + j] * x[i * E + j];
      const double r = 1.0 / std::sqrt(ss / E + c.eps);
      for (int j = 0; j < E; ++j) y[i * E + j] = x[i * E + j] * r * w[j];
    }
    return y;
  };
  auto rope = [&](std::vector<double>& x, int heads) {
    for (int i = 0; i < n; ++i)
      for (int h = 0; h < heads; ++h)
        for (int k = 0; k < c.rope_dim / 2; ++k) {
          const double ang = i * std::pow(static_cast<double>(c.rope_base), -2.0 * k / c.rope_dim);
          double* v = &x[(static_cast<size_t>(i) * heads + h) * D];
          const double a = v[2 * k], b = v[2 * k + 1];
          v[2 * k] = a * std::cos(ang) - b * std::sin(ang);
          v[2 * k + 1] = a * std::sin(ang) + b * std::cos(ang);
        }
  };
  const auto emb = W("token_embd.weight");
  std::vector<double> x(static_cast<size_t>(n) * E);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < E; ++j) x[i * E + j] = emb[static_cast<size_t>(toks[i]) * E + j];
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    auto h = norm(x, W(p + "attn_norm.weight"));
    auto q = mat(h, W(p + "attn_q.weight"), E, E);
    auto k = mat(h, W(p + "attn_k.weight"), E, KV);
    auto v = mat(h, W(p + "attn_v.weight"), E, KV);
    rope(q, H);
    rope(k, KH);
    std::vector<double> att(static_cast<size_t>(n) * E, 0.0);
    for (int i = 0; i < n; ++i)
      for (int hh = 0; hh < H; ++hh) {
        const int kh = hh / (H / KH);
        std::vector<double> s(i + 1);
        double mx = -1e300;
        for (int t = 0; t <= i; ++t) {
          double d = 0;
          for (int j = 0; j < D; ++j) d += q[(i * H + hh) * D + j] * k[(t * KH + kh) * D + j];
          s[t] = d / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, s[t]);
        }
        double z = 0;
        for (auto& e : s) z += (e = std::exp(e - mx));
        for (int t = 0; t <= i; ++t)
          for (int j = 0; j < D; ++j) att[(i * H + hh) * D + j] += s[t] / z * v[(t * KH + kh) * D + j];
      }
    auto o = mat(att, W(p + "attn_output.weight"), E, E);
    for (size_t j = 0; j < x.size(); ++j) x[j] += o[j];
    h = norm(x, W(p + "ffn_norm.weight"));
    auto gg = mat(h, W(p + "ffn_gate.weight"), E, F);
    auto uu = mat(h, W(p + "ffn_up.weight"), E, F);
    for (size_t j = 0; j < gg.size(); ++j) gg[j] = gg[j] / (1 + std::exp(-gg[j])) * uu[j];
    auto d = mat(gg, W(p + "ffn_down.weight"), F, E);
    for (size_t j = 0; j < x.size(); ++j) x[j] += d[j];
  }
  auto h = norm(x, W("output_norm.weight"));
  return mat(h, c.tied ? emb : W("output.weight"), E, V);
}

std::vector<int32_t> some_tokens(int n, int vocab, uint64_t seed) {
  tq::Rng r(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(r.below(vocab));
  return t;
}

// Max |a - b| over all logits, relative to max |b|.
double rel_err(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::fabs(a[i] - b[i]));
    s = std::max(s, std::fabs(b[i]));
  }
  return m / s;
}

constexpr double kTolF32 = 2e-4;  // f32 forward vs double reference, f32 cache
// More for a prefill through the integer GEMM (llm::qgemm_int16: Q8_0 / Q4_1 weights on AVX-512
// levels), which rounds each projection's input to 16 bits: the bound of the int16 decode
// kernels, kInt16Tol in test_qmatvec.cpp (which says why; seen here 2.7-5.2e-4).
constexpr double kTolInt16 = 1e-3;

}  // namespace

TEST(Model, TinyForwardMatchesReference) {
  for (tq::GgmlType wt : {tq::GgmlType::F32, tq::GgmlType::F16, tq::GgmlType::Q8_0, tq::GgmlType::Q4_1}) {
    for (bool tied : {true, false}) {
      TinyLlama c;
      c.tied = tied;
      const auto bytes = tq_test::tiny_llama_gguf(c, wt, 7).bytes();
      auto g = tq::GgufFile::from_bytes(bytes.data(), bytes.size());
      tq::LlamaModel m = tq::LlamaModel::load(g);
      m.set_threads(2);
      EXPECT_EQ(m.config().head_dim, 16);
      EXPECT_EQ(m.config().tied_output, tied);
      const auto toks = some_tokens(37, c.n_vocab, 3);
      const auto ref = reference_logits(g, c, toks);
      for (auto impl : {tq::AttnKernel::reference, tq::AttnKernel::fused}) {
        m.set_attention_kernel(impl);
        auto kc = m.kv_config(64);
        kc.type_k = kc.type_v = tq::KvFormat::f32;
        tq::KvCache cache(kc);
        std::vector<float> hidden(toks.size() * c.n_embd), lg(toks.size() * c.n_vocab);
        m.forward(cache, toks.data(), static_cast<int>(toks.size()), hidden.data());
        m.logits(hidden.data(), static_cast<int>(toks.size()), lg.data());
        EXPECT_LT(rel_err(lg, ref), kTolF32 + (tq::llm::qgemm_int16(wt) ? kTolInt16 : 0.0))
            << tq::ggml_type_name(wt) << " tied=" << tied;
        EXPECT_EQ(cache.n_tokens(0), 37);
      }
    }
  }
}

TEST(Model, TinyForwardGqaSevenMatchesReference) {
  // 7 query heads per kv head (no kernel instance: the fused kernels run subgroups of 4 and 3).
  // f32 cache (row path) against the double reference as above; f16 and tq caches (the fused
  // f16 and float tq kernels) against the same model with attention_ref on the same cache type.
  TinyLlama c;
  c.n_embd = 224;
  c.n_heads = 14;
  c.n_kv_heads = 2;
  const auto bytes = tq_test::tiny_llama_gguf(c, tq::GgmlType::F32, 9).bytes();
  auto g = tq::GgufFile::from_bytes(bytes.data(), bytes.size());
  tq::LlamaModel m = tq::LlamaModel::load(g);
  m.set_threads(2);
  ASSERT_EQ(m.config().head_dim, 16);
  const auto toks = some_tokens(41, c.n_vocab, 5);
  auto run = [&](const char* type, tq::AttnKernel impl) {
    m.set_attention_kernel(impl);
    auto kc = m.kv_config(64);
    kc.type_k = kc.type_v = tq::parse_kv_format(type);
    tq::KvCache cache(kc);
    std::vector<float> hidden(toks.size() * c.n_embd), lg(toks.size() * c.n_vocab);
    m.forward(cache, toks.data(), static_cast<int>(toks.size()), hidden.data());
    m.logits(hidden.data(), static_cast<int>(toks.size()), lg.data());
    return lg;
  };
  EXPECT_LT(rel_err(run("f32", tq::AttnKernel::fused), reference_logits(g, c, toks)), kTolF32);
  for (const char* type : {"f16", "tq4", "tq8"}) {
    const auto ref = run(type, tq::AttnKernel::reference);
    const double e = rel_err(run(type, tq::AttnKernel::fused), std::vector<double>(ref.begin(), ref.end()));
    std::printf("[ gqa 7 ] %s cache: fused vs reference attention, logits rel err %.2e\n", type, e);
    EXPECT_LT(e, kTolF32) << type;
  }
}

TEST(Model, PrefillEqualsDecodeAndMicroBatches) {
  TinyLlama c;
  const auto bytes = tq_test::tiny_llama_gguf(c, tq::GgmlType::F32, 9).bytes();
  auto g = tq::GgufFile::from_bytes(bytes.data(), bytes.size());
  tq::LlamaModel m = tq::LlamaModel::load(g);
  m.set_threads(2);
  const auto toks = some_tokens(29, c.n_vocab, 5);
  const auto ref = reference_logits(g, c, toks);
  auto kc = m.kv_config(64);
  kc.type_k = kc.type_v = tq::KvFormat::f32;
  // Token by token (decode path: n = 1 sgemv).
  {
    tq::KvCache cache(kc);
    std::vector<float> lg;
    double err = 0, scale = 0;
    for (size_t i = 0; i < toks.size(); ++i) {
      lg = m.forward_last(cache, {toks[i]});
      for (int v = 0; v < c.n_vocab; ++v) {
        err = std::max(err, std::fabs(lg[v] - ref[i * c.n_vocab + v]));
        scale = std::max(scale, std::fabs(ref[i * c.n_vocab + v]));
      }
    }
    EXPECT_LT(err / scale, kTolF32);
  }
  // Micro-batches of 5 plus a second call continuing the same cache.
  {
    m.set_ubatch(5);
    tq::KvCache cache(kc);
    std::vector<float> hidden(toks.size() * c.n_embd), lg(toks.size() * c.n_vocab);
    m.forward(cache, toks.data(), 20, hidden.data());
    m.forward(cache, toks.data() + 20, 9, hidden.data() + 20 * c.n_embd);
    m.logits(hidden.data(), static_cast<int>(toks.size()), lg.data());
    EXPECT_LT(rel_err(lg, ref), kTolF32);
    m.set_ubatch(512);
  }
  // Cache capacity and shape are checked.
  {
    auto small = kc;
    small.max_tokens = 10;
    tq::KvCache cache(small);
    EXPECT_THROW(m.forward_last(cache, toks), tq::Error);
    auto wrong = kc;
    wrong.n_layers = 3;
    wrong.layer_rope_base.clear();  // per-layer lists of the model's 2 layers
    wrong.layer_rope_scale.clear();
    tq::KvCache c3(wrong);
    EXPECT_THROW(m.forward_last(c3, toks), tq::Error);
    tq::KvCache ok(kc);
    EXPECT_THROW(m.forward_last(ok, {c.n_vocab}), tq::Error);  // id out of range
  }
}

TEST(Model, RejectsMissingOrMisshapedTensors) {
  TinyLlama c;
  tq::GgufWriter w = tq_test::tiny_llama_gguf(c, tq::GgmlType::F32, 1);
  w.set_string("general.name", "x");
  auto b = w.bytes();
  // Wrong architecture.
  tq::GgufWriter w2(3);
  w2.set_string("general.architecture", "gpt2");
  auto b2 = w2.bytes();
  auto g2 = tq::GgufFile::from_bytes(b2.data(), b2.size());
  EXPECT_THROW(tq::LlamaModel::load(g2), tq::Error);
  // rope_freqs.weight (Llama 3 frequency factors): read with the config and given to the cache;
  // the wrong length or a factor <= 0 is an error.
  auto with_factors = [&](const std::vector<float>& ff) {
    tq::GgufWriter wf = tq_test::tiny_llama_gguf(c, tq::GgmlType::F32, 1);
    wf.add_tensor_raw("rope_freqs.weight", {ff.size()}, tq::GgmlType::F32,
                      reinterpret_cast<const uint8_t*>(ff.data()), ff.size() * sizeof(float));
    return wf.bytes();
  };
  {
    std::vector<float> ff(c.rope_dim / 2);
    for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + static_cast<float>(i);
    const auto bf = with_factors(ff);
    const tq::LlamaConfig cf = tq::LlamaModel::read_config(tq::GgufFile::from_bytes(bf.data(), bf.size()));
    EXPECT_EQ(cf.rope_freq_factors, ff);
    EXPECT_EQ(tq::kv_config_for(cf, 64).rope_freq_factors, ff);
  }
  for (const std::vector<float>& ff :
       {std::vector<float>(c.rope_dim / 2 + 1, 1.f), std::vector<float>(c.rope_dim / 2, 0.f)}) {
    const auto bf = with_factors(ff);
    EXPECT_THROW(tq::LlamaModel::read_config(tq::GgufFile::from_bytes(bf.data(), bf.size())), tq::Error);
  }
  // Heads not dividing the embedding.
  TinyLlama bad = c;
  bad.n_heads = 5;
  bad.n_kv_heads = 5;
  EXPECT_THROW(
      {
        auto bb = tq_test::tiny_llama_gguf(bad, tq::GgmlType::F32, 1).bytes();
        auto gg = tq::GgufFile::from_bytes(bb.data(), bb.size());
        tq::LlamaModel::load(gg);
      },
      tq::Error);
}

// tq::argmax (two vectorizable passes) against the loop it replaces, bit for bit: random
// lengths around the 8-lane blocks, ties, NaN (first and elsewhere), infinities, -0 / +0.
TEST(Model, ArgmaxIsTheFirstLoopOnes) {
  auto loop = [](const float* x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; ++i)
      if (x[i] > x[best]) best = i;
    return best;
  };
  tq::Rng r(7);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float specials[] = {nan, inf, -inf, 0.0f, -0.0f, 1.0f, 1.0f};
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = 1 + static_cast<int>(r.next_u64() % 70);
    std::vector<float> x(n);
    const int levels = 1 + static_cast<int>(r.next_u64() % 4);  // few levels: many ties
    for (auto& v : x) v = static_cast<float>(r.next_u64() % levels) - 1.0f;
    const int k = static_cast<int>(r.next_u64() % 4);
    for (int j = 0; j < k; ++j) x[r.next_u64() % n] = specials[r.next_u64() % 7];
    ASSERT_EQ(tq::argmax(x.data(), n), loop(x.data(), n)) << "trial " << trial << " n " << n;
  }
  std::vector<float> big(262144);
  for (auto& v : big) v = static_cast<float>(r.normal());
  EXPECT_EQ(tq::argmax(big.data(), 262144), loop(big.data(), 262144));
  EXPECT_EQ(tq::argmax(big.data(), 0), 0);
}

TEST(Model, SamplerGreedyAndTopP) {
  std::vector<float> lg = {0.1f, 2.0f, 1.9f, -3.0f};
  EXPECT_EQ(tq::argmax(lg.data(), 4), 1);
  tq::Sampler greedy({0.0f, 0.9f, 0, 1});
  EXPECT_EQ(greedy.sample(lg.data(), 4), 1);
  // top_p tiny: only the best token survives.
  tq::Sampler narrow({1.0f, 1e-6f, 0, 1});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(narrow.sample(lg.data(), 4), 1);
  // Temperature 1, top_p 1: empirical frequencies follow softmax (fixed seed, 20000 draws).
  tq::Sampler s({1.0f, 1.0f, 0, 123});
  std::vector<int> cnt(4);
  const int N = 20000;
  for (int i = 0; i < N; ++i) cnt[s.sample(lg.data(), 4)]++;
  std::vector<float> lp(4);
  tq::log_softmax(lg.data(), 4, lp.data());
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(cnt[i] / double(N), std::exp(lp[i]), 0.015) << i;
  EXPECT_THROW(tq::Sampler({1.0f, 0.0f, 0, 1}), tq::Error);
}

TEST(Model, UnsupportedArchitectureNamesTheSupportedOnes) {
  tq::GgufWriter w(3);
  w.set_string("general.architecture", "gpt2");
  auto b = w.bytes();
  auto g = tq::GgufFile::from_bytes(b.data(), b.size());
  try {
    tq::LlamaModel::load(g);
    FAIL() << "gpt2 loaded";
  } catch (const tq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'gpt2' is not supported (supported: llama, qwen2, qwen3, gemma3)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Model, ReadConfigTakesHeadDimAndWindowFromMetadata) {
  // Metadata and the embedding only: read_config reads no other tensor.
  tq::GgufWriter w(3);
  w.set_string("general.architecture", "gemma3");
  w.set_u32("gemma3.block_count", 12);
  w.set_u32("gemma3.embedding_length", 64);
  w.set_u32("gemma3.feed_forward_length", 96);
  w.set_u32("gemma3.attention.head_count", 4);
  w.set_u32("gemma3.attention.head_count_kv", 1);
  w.set_u32("gemma3.attention.key_length", 80);
  w.set_u32("gemma3.attention.value_length", 80);
  w.set_u32("gemma3.attention.sliding_window", 16);
  w.set_f32("gemma3.rope.freq_base", 1e6f);
  std::vector<float> emb(64 * 10, 0.1f);
  w.add_tensor("token_embd.weight", {64, 10}, tq::GgmlType::F32, emb.data());
  auto b = w.bytes();
  auto g = tq::GgufFile::from_bytes(b.data(), b.size());
  const tq::LlamaConfig c = tq::LlamaModel::read_config(g);
  EXPECT_EQ(c.head_dim, 80);
  EXPECT_EQ(c.q_dim(), 320);
  EXPECT_EQ(c.sliding_window, 16);
  EXPECT_TRUE(c.traits.rope_neox);
  EXPECT_FLOAT_EQ(c.embd_scale, 8.0f);
  for (int l = 0; l < 12; ++l) {
    EXPECT_EQ(c.layer_is_swa(l), l != 5 && l != 11) << l;
    EXPECT_FLOAT_EQ(c.layer_rope_base(l), c.layer_is_swa(l) ? 10000.0f : 1e6f) << l;
  }
  EXPECT_THROW(tq::LlamaModel::load(g), tq::Error);  // the layer tensors are missing
  // The CLI checks the cache type against head_dim 80 before any weight is read (tq2h3 needs a
  // multiple of 64): the error is about head_dim, not about a missing tensor.
  const std::string path = std::string(::testing::TempDir()) + "/tq_head_dim_80.gguf";
  w.write(path);
  const auto r = tq_test::run_tq({"logits", "-m", path, "--ids", "1", "-ctk", "tq2h3", "-ctv", "f16"});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("head_dim 80"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("tensor"), std::string::npos) << r.err;
  std::remove(path.c_str());
}
