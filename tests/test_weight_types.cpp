// WeightTypes.*: LlamaModel with the weight types added for the K-quant GGUFs (Q5_0, Q5_1,
// Q4_K, Q5_K, Q6_K, BF16) in every matrix, and a Gemma-like mix (Q8_0 embedding and V, Q5_0
// Q / K / gate / up, Q4_K attention output, Q6_K down and output): the matrices are held as
// their GGUF blocks, decode (block kernels) and prefill (qgemm panels) match the f32-copy
// OpenBLAS path at every SIMD level within kTol of the largest logit (both paths compute the
// same products of the same f32 weight values and differ only in summation order: at most
// (39 + in/32) u = 3.3e-6 of the sum of |terms| per projection at in = 512, see
// test_qmatvec.cpp, carried through 2 layers of 7 projections whose random-block weights
// cancel more than test_qmatvec.cpp's quantized normals: the largest seen was 3.2e-5, Q5_0 at
// sse4); and a tensor of a type tq does not read is an error naming the tensor and the type.
// The kernels themselves are checked tightly in test_qmatvec.cpp. Decode with Q5_0, Q4_K, Q6_K
// or Q8_0 matrices (integer activations, see src/llm/qmatvec.h) also rounds every projection's
// input to 16 bits: there the decode logits must stay within kInt16Tol of the f32 path's, the
// bound of QMatvec.ModelDecodeMatchesF32Path (test_qmatvec.cpp, which says why; seen here: at
// most 7.7e-4, the Gemma-like mix). On AVX-512 levels prefill rounds those inputs to 16 bits
// too (llm::qgemm_int16): its logits must then stay within kInt16Tol (seen: 4.5e-4 for one row
// of the Q5_0 model, 1.2-1.4e-4 for the last rows checked here). The decode steps, which round
// their own inputs and read a cache written from rounded ones, must stay within 2 kInt16Tol:
// after an int16 prefill, seen 1.18e-3 (the first step of the Q5_0 model; 1.0-1.4e-4 for the
// steps after it); after a float prefill the Gemma-like mix reached 1.19e-3 at the scalar level
// on an AVX2 host (AMD EPYC, OpenBLAS Zen kernels; 0.84e-3 at avx2), and 1.21-1.43e-3 at every
// level with OpenBLAS's Sandybridge kernels there: the same block kernels against an f32 path
// whose summation order alone moves this random-weight model's figure by half a kInt16Tol.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llm/qmatvec.h"
#include "llm_test_util.h"
#include "tq/error.h"
#include "tq/gguf.h"
#include "tq/kv_cache.h"
#include "tq/model.h"
#include "tq/simd.h"

namespace {

using tq::GgmlType;

constexpr double kTol = 1e-4;
constexpr double kInt16Tol = 1e-3;

GgmlType gemma_like(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("token_embd") || has("attn_v")) return GgmlType::Q8_0;
  if (has("attn_output")) return GgmlType::Q4_K;
  if (has("ffn_down") || name == "output.weight") return GgmlType::Q6_K;
  return GgmlType::Q5_0;
}

tq_test::TinyLlama tiny256() {
  tq_test::TinyLlama c;
  c.n_embd = 256;  // rows of a multiple of 256 values: K-quant super-blocks
  c.n_ff = 512;
  c.tied = false;
  return c;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return scale > 0 ? err / scale : 1.0;
}

}  // namespace

TEST(WeightTypes, ModelRunsEveryTypeFromItsBlocks) {
  const tq_test::TinyLlama c = tiny256();
  struct Variant {
    std::string name;
    GgmlType t;
    GgmlType (*type_of)(const std::string&);
  };
  const std::vector<Variant> variants = {
      {"Q5_0", GgmlType::Q5_0, nullptr}, {"Q5_1", GgmlType::Q5_1, nullptr}, {"Q4_K", GgmlType::Q4_K, nullptr},
      {"Q5_K", GgmlType::Q5_K, nullptr}, {"Q6_K", GgmlType::Q6_K, nullptr}, {"BF16", GgmlType::BF16, nullptr},
      {"gemma-like mix", GgmlType::Q8_0, gemma_like}};
  for (const Variant& var : variants) {
    const auto bytes = tq_test::tiny_llama_gguf(c, var.t, 7, var.type_of).bytes();
    const tq::GgufFile g = tq::GgufFile::from_bytes(bytes.data(), bytes.size());
    size_t matrix_bytes = 0;
    for (const auto& t : g.tensors())
      if (t.ne.size() == 2) matrix_bytes += t.n_bytes;
    if (var.type_of) {
      EXPECT_EQ(g.tensor("blk.1.attn_output.weight").type, GgmlType::Q4_K);
      EXPECT_EQ(g.tensor("blk.0.ffn_down.weight").type, GgmlType::Q6_K);
      EXPECT_EQ(g.tensor("blk.0.ffn_up.weight").type, GgmlType::Q5_0);
    } else {
      EXPECT_EQ(g.tensor("blk.1.ffn_gate.weight").type, var.t);
    }
    tq::LlamaModel m = tq::LlamaModel::load(g);
    m.set_threads(2);
    EXPECT_EQ(m.block_weight_bytes(), matrix_bytes) << var.name << ": every matrix held as its GGUF blocks";
    auto kc = m.kv_config(64);
    kc.type_k = kc.type_v = tq::KvFormat::f32;
    std::vector<int32_t> prompt(20);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7 + 3) % c.n_vocab);
    for (const auto& level : tq::simd::available_levels()) {
      tq::simd::ScopedLevel sl(level);
      const std::string what = var.name + " at " + level;
      tq::KvCache cq(kc), cf(kc);
      // Prefill of 20 tokens (qgemm on the blocks) vs the f32 copy; the logits of all 20 rows
      // (qgemm too: forward_last's one row of logits would go through the decode kernels).
      auto prefill_last = [&](tq::KvCache& cache) {
        std::vector<float> h(prompt.size() * c.n_embd), l(prompt.size() * c.n_vocab);
        m.forward(cache, prompt.data(), static_cast<int>(prompt.size()), h.data());
        m.logits(h.data(), static_cast<int>(prompt.size()), l.data());
        return std::vector<float>(l.end() - c.n_vocab, l.end());
      };
      m.set_f32_decode(false);
      auto lq = prefill_last(cq);
      m.set_f32_decode(true);
      auto lf = prefill_last(cf);
      const bool int16_prefill = tq::llm::qgemm_int16(var.type_of ? GgmlType::Q8_0 : var.t);  // the mix: all int16 types
      EXPECT_LT(rel_err(lq, lf), int16_prefill ? kInt16Tol : kTol) << what << " prefill";
      // Greedy decode through the block kernels; the f32 path follows the same tokens.
      int32_t tok = tq::argmax(lq.data(), c.n_vocab);
      double worst = 0, any = 0;
      for (int step = 0; step < 4; ++step) {
        m.set_f32_decode(false);
        lq = m.forward_last(cq, {tok});
        m.set_f32_decode(true);
        lf = m.forward_last(cf, {tok});
        worst = std::max(worst, rel_err(lq, lf));
        for (int v = 0; v < c.n_vocab; ++v) any = std::max(any, static_cast<double>(std::fabs(lq[v] - lf[v])));
        tok = tq::argmax(lq.data(), c.n_vocab);
      }
      const bool int16 = var.type_of || tq::llm::qmatvec_int16(var.t);
      EXPECT_LT(worst, int16 ? 2 * kInt16Tol : kTol) << what << " decode";
      if (int16) std::printf("%s decode: largest logit difference %.3g of the largest logit\n", what.c_str(), worst);
      EXPECT_GT(any, 0.0) << what << ": the two paths gave the same bits (is the block path used?)";
    }
    m.set_f32_decode(false);
  }
}

// A model tensor of a ggml type tq does not read (Q2_K, 10): the error names the tensor, the
// type and the supported types.
TEST(WeightTypes, UnsupportedTensorTypeNamesTensorAndType) {
  const tq_test::TinyLlama c = tiny256();
  auto bytes = tq_test::tiny_llama_gguf(c, GgmlType::Q4_K, 3).bytes();
  // Tensor info: u64 name length | name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset.
  const std::string name = "blk.1.ffn_down.weight";
  std::string key(8, '\0');
  const uint64_t len = name.size();
  std::memcpy(key.data(), &len, 8);
  key += name;
  const std::string all(bytes.begin(), bytes.end());
  const size_t at = all.find(key);
  ASSERT_NE(at, std::string::npos);
  const size_t type_at = at + key.size() + 4 + 2 * 8;
  uint32_t ty;
  std::memcpy(&ty, bytes.data() + type_at, 4);
  ASSERT_EQ(ty, static_cast<uint32_t>(GgmlType::Q4_K));
  ty = 10;
  std::memcpy(bytes.data() + type_at, &ty, 4);
  try {
    const tq::GgufFile g = tq::GgufFile::from_bytes(bytes.data(), bytes.size());
    (void)tq::LlamaModel::load(g);
    FAIL() << "no error";
  } catch (const tq::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'" + name + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("type 10 (Q2_K)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Q6_K(14)"), std::string::npos) << msg;
  }
}
