// End to end on the real model (SmolLM2-135M-Instruct Q4_1, fetched by `make test`):
// greedy chat answer, perplexity of a few hundred corpus tokens in a sane range, and a
// compressed cache within a loose bound of f16 on the same tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "llm_test_util.h"
#include "tq/eval.h"
#include "tq/gguf.h"
#include "tq/kv_cache.h"
#include "tq/model.h"
#include "tq/tokenizer.h"

namespace {

struct Real {
  tq::GgufFile g;
  tq::Tokenizer tok;
  tq::LlamaModel m;
};

Real* real() {
  static Real* r = [] {
    auto g = tq::GgufFile::open(tq_test::real_model_path());
    tq::Tokenizer tok(g);
    tq::LlamaModel m = tq::LlamaModel::load(g);
    m.set_threads(1);  // ctest runs tests in parallel on a 2-core machine
    return new Real{std::move(g), std::move(tok), std::move(m)};
  }();
  return r;
}

// Named thresholds (loose on purpose: a behaviour check, the measured tables are in
// BENCHMARKS.md).
constexpr double kPplMin = 2.0, kPplMax = 30.0;     // f16 perplexity of technical English
constexpr double kCompressedMaxRatio = 1.15;       // compressed ppl <= 1.15 x f16
constexpr double kCompressedMinTop1 = 0.80;        // top-1 agreement with f16

}  // namespace

TEST(ModelE2E, RealModelChatAndPerplexity) {
  if (!tq_test::file_exists(tq_test::real_model_path()))
    GTEST_SKIP() << tq_test::real_model_path() << " missing: run scripts/fetch-model.sh (make test does)";
  if (!tq_test::file_exists(tq_test::corpus_path()))
    GTEST_SKIP() << tq_test::corpus_path() << " missing: run scripts/fetch-corpus.sh (make test does)";
  Real& R = *real();
  const auto& c = R.m.config();
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_EQ(c.n_heads, 9);
  EXPECT_EQ(c.n_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.n_embd, 576);
  EXPECT_EQ(c.n_vocab, 49152);
  EXPECT_TRUE(c.tied_output);
  EXPECT_FLOAT_EQ(c.rope_base, 100000.0f);

  // Greedy chat answer.
  {
    const std::string prompt = R.tok.apply_chat_template({{"user", "What is the capital of France?"}});
    const auto ids = R.tok.encode(prompt, true);
    tq::KvCache cache(R.m.kv_config(128));
    auto lg = R.m.forward_last(cache, ids);
    std::vector<int32_t> out;
    for (int i = 0; i < 12; ++i) {
      const int32_t id = tq::argmax(lg.data(), static_cast<int>(lg.size()));
      if (R.tok.is_end_of_generation(id)) break;
      out.push_back(id);
      lg = R.m.forward_last(cache, {id});
    }
    EXPECT_NE(R.tok.decode(out).find("Paris"), std::string::npos) << R.tok.decode(out);
  }

  // Perplexity of 2 windows of 192 tokens, f16 vs a compressed cache on the same tokens.
  const auto tokens = R.tok.encode(tq::read_text_file(tq_test::corpus_path()));
  std::vector<int32_t> slice(tokens.begin() + 2000, tokens.begin() + 2000 + 384);
  const auto names = tq::kv_type_names();
  std::string compressed = "q8_0";
  for (const char* want : {"tq4", "q4_0h", "q8_0"})
    if (std::find(names.begin(), names.end(), want) != names.end()) { compressed = want; break; }
  tq::PerplexityOptions po;
  po.n_ctx = 192;
  po.compare = true;
  po.kv = tq::KvSpec::parse(compressed + " plain");  // the bare format; the protected one (the default for tq K) is checked below
  const auto r = tq::perplexity(R.m, slice, po);
  EXPECT_EQ(r.n_chunks, 2);
  EXPECT_EQ(r.n_scored, 2u * 95u);
  EXPECT_GT(r.ppl_ref, kPplMin);
  EXPECT_LT(r.ppl_ref, kPplMax);
  EXPECT_LT(r.ppl / r.ppl_ref, kCompressedMaxRatio) << compressed << " ppl " << r.ppl << " vs f16 " << r.ppl_ref;
  EXPECT_GT(r.top1_agreement, kCompressedMinTop1) << compressed;
  // Quantized on write: prefill read the compressed cache, so the distributions differ.
  EXPECT_GT(r.kld_mean, 0.0) << "compressed cache gave bit-identical logits: deferred quantization?";
  EXPECT_LT(r.kv_bytes_per_token, 0.6 * r.kv_bytes_per_token_ref);
  EXPECT_DOUBLE_EQ(r.kv_bytes_per_token_ref, 30.0 * 3 * 64 * 2 * 2);  // f16: layers*heads*dim*2B*(K,V)

  // The fused kernels against the oracle (every row dequantized, exact attention) on the real
  // model's keys and values, over 8 windows of 192. With f16 the two differ by float summation
  // order only. With a bare quantized cache that order can flip a rounding decision of a later
  // layer's writes, and the flips cascade: on 2 windows fused vs oracle measured 0.65% apart in
  // perplexity with float prefill and 3.04% after the prefill's activations moved by ~1e-4
  // (the 16-bit integer GEMM); on these 8 windows 0.32% / 0.06%, KLD 1% / 12% apart
  // (bench/results/kv/prefill_int16_tq4plain_fused_vs_reference.json). So the bounds are loose
  // and the windows many; a wrong kernel is off by far more.
  const std::vector<int32_t> wide(tokens.begin() + 2000, tokens.begin() + 2000 + 8 * 192);
  const auto rf = tq::perplexity(R.m, wide, po);
  R.m.set_attention_kernel(tq::AttnKernel::reference);
  const auto ro = tq::perplexity(R.m, wide, po);
  R.m.set_attention_kernel(tq::AttnKernel::fused);
  EXPECT_EQ(ro.n_chunks, 8);
  EXPECT_NEAR(ro.ppl_ref, rf.ppl_ref, 1e-3 * rf.ppl_ref) << "f16 cache: fused vs reference attention";
  EXPECT_NEAR(ro.ppl, rf.ppl, 3e-2 * rf.ppl) << compressed << ": fused vs reference attention";
  EXPECT_NEAR(ro.kld_mean, rf.kld_mean, 0.4 * rf.kld_mean) << compressed << ": fused vs reference attention";

  // The automatic protection of tq K types (one f16 sink, RoPE-rotating K means) beats the bare format,
  // and query-weighted K channels and scaling (the model hands the queries to the cache
  // before each append) beat the bare symmetric cache at about the same size.
  if (compressed == "tq4") {
    po.kv = tq::KvSpec::parse("tq4");
    ASSERT_TRUE(po.kv.auto_protected());
    const auto rp = tq::perplexity(R.m, slice, po);
    EXPECT_LT(rp.kld_mean, r.kld_mean) << "automatic sink and K means no better than bare tq4";
    EXPECT_GT(rp.bits_per_value_all, r.bits_per_value_all);  // the sink row and the means are counted

    po.kv = tq::KvSpec::parse("tq3h6/tq4n8 s1 ck cs512 ks");
    const auto rr = tq::perplexity(R.m, slice, po);
    EXPECT_LT(rr.ppl / rr.ppl_ref, kCompressedMaxRatio) << "ppl " << rr.ppl << " vs f16 " << rr.ppl_ref;
    EXPECT_LT(rr.kld_mean, r.kld_mean) << "query-weighted cache no better than bare tq4";
    EXPECT_LT(rr.kv_bytes_per_token, r.kv_bytes_per_token);
  }
}

// tq niah's per-trial margin: along the answer's tokens, the answer token's logit minus the
// best other, its smallest value; recomputed here by teacher forcing on the same prompt (the
// niah seed's first passphrase and offset), so it is the figure it claims, and its sign
// agrees with the pass / miss of every trial.
TEST(ModelE2E, NiahMarginIsTheAnswersLogitLead) {
  if (!tq_test::file_exists(tq_test::real_model_path()))
    GTEST_SKIP() << tq_test::real_model_path() << " missing: run scripts/fetch-model.sh (make test does)";
  if (!tq_test::file_exists(tq_test::corpus_path()))
    GTEST_SKIP() << tq_test::corpus_path() << " missing: run scripts/fetch-corpus.sh (make test does)";
  Real& R = *real();
  const std::string corpus = tq::read_text_file(tq_test::corpus_path());
  tq::NiahOptions opt;
  opt.context = 384;
  opt.depths = {0.5};
  opt.trials = 3;
  opt.seed = 7;
  // f16 passes these trials; bare 2-bit codes (measured: 0 of 3) miss them.
  opt.kv = tq::KvSpec::parse("k=tq2 v=tq2 plain");
  const tq::NiahResult lossy = tq::niah(R.m, R.tok, corpus, opt);
  opt.kv = tq::KvSpec{};
  const tq::NiahResult r = tq::niah(R.m, R.tok, corpus, opt);
  ASSERT_EQ(r.details.size(), 3u);
  int misses = 0;
  for (const tq::NiahResult* res : {&r, &lossy})
    for (const auto& t : res->details) {
      misses += !t.passed;
      if (std::isnan(t.margin)) {
        EXPECT_TRUE(t.passed);  // NaN only for a pass on another tokenization
        continue;
      }
      if (t.passed) EXPECT_GT(t.margin, 0) << t.passphrase << " -> " << t.answer;
      else EXPECT_LE(t.margin, 0) << t.passphrase << " -> " << t.answer;
    }
  EXPECT_GT(misses, 0);  // both signs are exercised
  // Trial 0 again, by hand.
  const std::vector<int32_t> hay = R.tok.encode(corpus);
  tq::Rng rng(opt.seed);
  char digits[16];
  std::snprintf(digits, sizeof digits, "%06u", rng.below(1000000));
  ASSERT_EQ(r.details[0].passphrase, digits);
  const auto prompt = tq::niah_prompt(R.tok, hay, opt.context, 0.5, digits, [&](size_t n) {
    return static_cast<size_t>(rng.below(static_cast<uint32_t>(n)));
  });
  const std::vector<int32_t> want = R.tok.encode(std::string(" ") + digits + ".");
  tq::KvCache cache(R.m.kv_config(opt.context + 16));
  auto lg = R.m.forward_last(cache, prompt);
  double margin = 1e30;
  for (size_t i = 0; i < want.size(); ++i) {
    float other = -1e30f;
    for (size_t j = 0; j < lg.size(); ++j)
      if (static_cast<int32_t>(j) != want[i]) other = std::max(other, lg[j]);
    margin = std::min(margin, static_cast<double>(lg[static_cast<size_t>(want[i])]) - other);
    if (tq::argmax(lg.data(), static_cast<int>(lg.size())) != want[i]) break;  // greedy leaves the answer
    if (i + 1 < want.size()) lg = R.m.forward_last(cache, {want[i]});
  }
  if (!std::isnan(r.details[0].margin)) EXPECT_DOUBLE_EQ(r.details[0].margin, margin);
}
