// tq calibrate's method (include/tq/calibrate.h): the knapsack against brute force, the budget
// as the cache counts it, an end-to-end run on a tiny random llama, and the SmolLM2 allocations
// of configs/ reproduced from the sensitivities bench/kv_layer_plan.py fitted them with.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>

#include "llm_test_util.h"
#include "tq/calibrate.h"
#include "tq/error.h"
#include "tq/eval.h"
#include "tq/gguf.h"
#include "tq/kv_cache.h"
#include "tq/model.h"

namespace {

// Every combination: the least value within the cap (inf when none fits).
double brute_force(const std::vector<std::vector<tq::McOption>>& g, int64_t cap) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<size_t> idx(g.size(), 0);
  while (true) {
    double v = 0;
    int64_t c = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      v += g[i][idx[i]].value;
      c += g[i][idx[i]].cost;
    }
    if (c <= cap) best = std::min(best, v);
    size_t i = 0;
    while (i < g.size() && ++idx[i] == g[i].size()) idx[i++] = 0;
    if (i == g.size()) return best;
  }
}

TEST(Calibrate, KnapsackMatchesBruteForce) {
  tq::Rng r(11);
  int feasible = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int n_groups = 1 + static_cast<int>(r.below(5));
    std::vector<std::vector<tq::McOption>> g(n_groups);
    int64_t min_sum = 0;
    for (auto& og : g) {
      const int n = 1 + static_cast<int>(r.below(4));
      int64_t mn = 1 << 30;
      for (int i = 0; i < n; ++i) {
        og.push_back({r.uniform() * (trial % 3 == 0 ? 1.0 : 0.01), static_cast<int64_t>(r.below(12))});
        mn = std::min(mn, og.back().cost);
      }
      min_sum += mn;
    }
    const int64_t cap = static_cast<int64_t>(r.below(static_cast<uint32_t>(12 * n_groups)));
    const double want = brute_force(g, cap);
    if (cap < min_sum) {
      EXPECT_TRUE(std::isinf(want));
      EXPECT_THROW(tq::solve_mckp(g, cap), tq::Error);
      continue;
    }
    ++feasible;
    double value = -1;
    int64_t cost = -1;
    const std::vector<int> pick = tq::solve_mckp(g, cap, &value, &cost);
    ASSERT_EQ(pick.size(), g.size());
    double v = 0;
    int64_t c = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_GE(pick[i], 0);
      ASSERT_LT(pick[i], static_cast<int>(g[i].size()));
      v += g[i][pick[i]].value;
      c += g[i][pick[i]].cost;
    }
    EXPECT_LE(c, cap);
    EXPECT_EQ(c, cost);
    EXPECT_NEAR(v, value, 1e-12);
    EXPECT_NEAR(value, want, 1e-12) << "trial " << trial;
  }
  EXPECT_GT(feasible, 200);
}

// A tiny llama with head_dim 64 (the tq h-types need it) and its model.
struct Tiny {
  std::vector<uint8_t> bytes;
  tq::GgufFile g;
  tq::LlamaModel m;
  static std::vector<uint8_t> make() {
    tq_test::TinyLlama c;
    c.n_embd = 256;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.n_ff = 128;
    c.rope_dim = 64;
    return tq_test::tiny_llama_gguf(c, tq::GgmlType::F32, 5).bytes();
  }
  Tiny() : bytes(make()), g(tq::GgufFile::from_bytes(bytes.data(), bytes.size())), m(tq::LlamaModel::load(g)) {
    m.set_threads(1);
  }
};

std::vector<int32_t> random_tokens(size_t n, int vocab, uint64_t seed) {
  tq::Rng r(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(r.below(static_cast<uint32_t>(vocab)));
  return t;
}

// Made-up sensitivities over the default types (KLD falling with the bytes).
tq::CalibSensitivity fake_sens(const tq::LlamaConfig& mc, uint64_t seed) {
  tq::Rng r(seed);
  tq::CalibSensitivity s;
  s.n_layers = mc.n_layers;
  s.n_kv_heads = mc.n_kv_heads;
  s.head_dim = mc.head_dim;
  s.n_ctx = 64;
  s.windows = s.windows_requested = 1;
  s.n_scored = 31;
  s.protect = "ks";
  for (int u = 0; u < mc.n_layers * mc.n_kv_heads; ++u) {
    s.sens_k.push_back(r.uniform() * 0.01);
    s.sens_v.push_back(r.uniform() * 0.01);
  }
  s.k_types = tq::default_calib_k_types();
  s.v_types = tq::default_calib_v_types();
  for (const auto& t : s.k_types)
    s.kld_k.push_back(1.0 / tq::kv_type_traits(tq::parse_kv_type(t)).block_bytes(mc.head_dim) + 0.001 * r.uniform());
  for (const auto& t : s.v_types)
    s.kld_v.push_back(1.0 / tq::kv_type_traits(tq::parse_kv_type(t)).block_bytes(mc.head_dim) + 0.001 * r.uniform());
  return s;
}

// The budget holds as `tq perplexity` counts it (bits_per_value_all of a window of n_ctx
// tokens), and calib_bytes_used agrees with the cache the model fills.
TEST(Calibrate, BudgetAsTheCacheCountsIt) {
  Tiny t;
  const tq::LlamaConfig& mc = t.m.config();
  const int n_ctx = 96;
  const std::vector<int32_t> tokens = random_tokens(n_ctx, mc.n_vocab, 3);
  double prev_kld = std::numeric_limits<double>::infinity();
  for (double bits : {3.25, 3.6, 4.25, 5.0}) {
    const tq::CalibSensitivity s = fake_sens(mc, 7);
    const tq::CalibAllocation a = tq::calibrate_allocate(mc, s, bits, n_ctx);
    EXPECT_LE(a.bits_all, bits) << a.alloc.label;
    EXPECT_GT(a.bits_all, bits - 0.25) << "the budget is nearly spent: " << a.alloc.label;
    EXPECT_LE(a.alloc.predicted_kld, prev_kld);  // more bits, no worse
    prev_kld = a.alloc.predicted_kld;
    tq::KvSpec kv = tq::KvSpec::parse(a.alloc.label);
    tq::PerplexityOptions po;
    po.n_ctx = n_ctx;
    const tq::PerplexityResult r = tq::perplexity_multi(t.m, tokens, po, {kv})[0];
    EXPECT_EQ(r.kv_bytes_used, a.bytes_used) << a.alloc.label;
    EXPECT_LE(r.bits_per_value_all, bits);
  }
  const tq::CalibSensitivity s = fake_sens(mc, 7);
  EXPECT_THROW(tq::calibrate_allocate(mc, s, 2.0, n_ctx), tq::Error);  // below the cheapest types
}

TEST(Calibrate, EndToEndOnTinyModel) {
  Tiny t;
  const tq::LlamaConfig& mc = t.m.config();
  const std::vector<int32_t> tokens = random_tokens(3 * 64 + 5, mc.n_vocab, 9);
  tq::CalibOptions co;
  co.n_ctx = 64;
  co.n_chunks = 2;
  size_t last = 0, total = 0;
  co.progress = [&](size_t d, size_t n) {
    EXPECT_GT(d, last);
    last = d;
    total = n;
  };
  const tq::CalibSensitivity s = tq::calibrate_measure(t.m, tokens, co);
  const size_t n_configs = 2 * mc.n_layers * mc.n_kv_heads + s.k_types.size() + s.v_types.size();
  EXPECT_EQ(total, 2 * (n_configs + 1));
  EXPECT_EQ(last, total);
  ASSERT_TRUE(s.complete());
  EXPECT_EQ(s.windows, 2);
  EXPECT_EQ(s.n_scored, 2u * 31);
  ASSERT_EQ(s.sens_k.size(), static_cast<size_t>(mc.n_layers * mc.n_kv_heads));
  for (double x : s.sens_k) EXPECT_GT(x, 0);
  for (double x : s.sens_v) EXPECT_GT(x, 0);
  // Fewer bits, more KLD: the whole-model KLD of tq2h4n8 K above tq4h6n8's.
  EXPECT_GT(s.kld_k.front(), s.kld_k.back());

  const tq::CalibAllocation a = tq::calibrate_allocate(mc, s, 4.25, co.n_ctx);
  EXPECT_LE(a.bits_all, 4.25);
  const std::string path = std::filesystem::temp_directory_path() / ("tq_calib_" + std::to_string(getpid()) + ".kv");
  tq::write_kv_config_file(path, {"a comment", "another"}, a.alloc.label);
  const std::string label = tq::read_kv_label_file(path);
  std::filesystem::remove(path);
  EXPECT_EQ(label, a.alloc.label);
  const tq::KvSpec kv = tq::KvSpec::parse(label);
  EXPECT_TRUE(kv.auto_protected());  // the base K is a tq type: sink, centring as measured
  EXPECT_TRUE(kv.scale_k);
  tq::PerplexityOptions po;
  po.n_ctx = co.n_ctx;
  po.n_chunks = 1;
  po.compare = true;
  const tq::PerplexityResult r = tq::perplexity_multi(t.m, tokens, po, {kv})[0];
  EXPECT_LE(r.bits_per_value_all, 4.25);
  EXPECT_GT(r.kld_mean, 0);

  // Stopped after the first window's passes: what that window measured, nothing of the second.
  co.progress = nullptr;
  int calls = 0;
  co.stop = [&] { return ++calls > static_cast<int>(n_configs + 3); };
  const tq::CalibSensitivity p = tq::calibrate_measure(t.m, tokens, co);
  EXPECT_FALSE(p.complete());
  EXPECT_EQ(p.windows, 1);
  EXPECT_EQ(p.windows_requested, 2);
  ASSERT_EQ(p.sens_k.size(), s.sens_k.size());
  co.stop = [] { return true; };
  EXPECT_EQ(tq::calibrate_measure(t.m, tokens, co).windows, 0);
}

TEST(Calibrate, ProbesSpellTheProtectionOut) {
  Tiny t;
  tq::CalibOptions co;
  const auto cfg = tq::calib_configs(t.m.config(), co, {"tq3h6n8"}, {"tq4n8"});
  ASSERT_EQ(cfg.size(), 2u * 2 * 2 + 2);
  for (const auto& kv : cfg) {
    EXPECT_FALSE(kv.auto_protected());
    const tq::KvSpec r = kv.resolved();
    EXPECT_EQ(r.sink, 1);
    EXPECT_TRUE(r.center_k && r.center_rope && r.scale_k);
    EXPECT_EQ(r.center_segment, 512);
  }
  EXPECT_EQ(cfg[0].resolved().to_string(), "k=f16 v=f16 sink=1 center=k,rope,512 scale-k layers=0.0:tq2h5n8/f16");
  EXPECT_EQ(cfg[5].resolved().to_string(), "k=f16 v=f16 sink=1 center=k,rope,512 scale-k layers=0.1:f16/tq3n8");
  EXPECT_EQ(cfg[8].resolved().to_string(), "k=tq3h6n8 v=f16 sink=1 center=k,rope,512 scale-k");
  // The same caches as the short labels of earlier releases.
  EXPECT_EQ(cfg[0].resolved(), tq::KvSpec::parse("f16 s1 ck cs512 cr ks L0.0:tq2h5n8/f16").resolved());
  EXPECT_EQ(cfg[8].resolved(), tq::KvSpec::parse("tq3h6n8/f16 s1 ck cs512 cr ks").resolved());
  co.protect = "plain ks";
  EXPECT_EQ(tq::calib_configs(t.m.config(), co, {"tq3h6n8"}, {"tq4n8"})[8].resolved().to_string(),
            "k=tq3h6n8 v=f16 plain scale-k");
  co.protect = "ks L0:tq4";
  EXPECT_THROW(tq::calib_configs(t.m.config(), co, {"tq3h6n8"}, {"tq4n8"}), tq::Error);
}

// bench/kv_layer_plan.py `alloc` fed the same inputs: the labels of configs/smollm2-135m-kv*.kv
// and the predicted KLDs their comments give.

TEST(Calibrate, ReproducesKvLayerPlanAlloc) {
  const std::string sens_path = tq_test::source_path("bench/results/kv_head_sens_c2048_calib_q2.json");
  if (!tq_test::file_exists(sens_path)) GTEST_SKIP() << "no " << sens_path;
  nlohmann::json sj = nlohmann::json::parse(std::ifstream(sens_path));
  tq::AllocInput base;
  base.n_layers = 30;
  base.n_kv_heads = 3;
  base.sens_k.assign(90, -1);
  base.sens_v.assign(90, -1);
  const std::regex unit(R"(\bL(\d+)\.(\d+):(\S+)/(\S+))");
  for (const auto& r : sj["results"]) {
    const std::string lab = r["kv"]["label"];
    std::smatch m;
    ASSERT_TRUE(std::regex_search(lab, m, unit)) << lab;
    const int u = std::stoi(m[1]) * 3 + std::stoi(m[2]);
    (m[4] == "f16" ? base.sens_k : base.sens_v)[u] = r["kld_mean"].get<double>();
  }
  for (double x : base.sens_k) ASSERT_GE(x, 0);
  for (double x : base.sens_v) ASSERT_GE(x, 0);
  // The type options as kv_layer_plan.py reads them: bytes per unit from one-side configs,
  // in 1/16 B rounded up.
  auto add_types = [&](tq::AllocInput& in, const std::string& rel) {
    nlohmann::json tj = nlohmann::json::parse(std::ifstream(tq_test::source_path(rel)));
    for (const auto& r : tj["results"]) {
      const std::string lab = r["kv"]["label"];
      const std::string first = lab.substr(0, lab.find(' '));
      const std::string tk = first.substr(0, first.find('/')), tv = first.substr(first.find('/') + 1);
      const double b = (r["kv_bytes_per_token"].get<double>() - r["kv_bytes_per_token_f16"].get<double>() / 2) / 90;
      const int64_t c = static_cast<int64_t>(std::ceil(b * 16 - 1e-9));
      if (tv == "f16") {
        in.k_types.push_back(tk);
        in.kld_k.push_back(r["kld_mean"]);
        in.cost_k.push_back(c);
      } else {
        in.v_types.push_back(tv);
        in.kld_v.push_back(r["kld_mean"]);
        in.cost_v.push_back(c);
      }
    }
  };
  struct Case {
    const char* config;
    std::vector<std::string> types;
    double budget;
    double predicted;
  };
  for (const Case& c : {Case{"configs/smollm2-135m-kv3.25.kv", {"bench/results/kv_types_c2048_calib.json"}, 4608, 0.0297698},
                        Case{"configs/smollm2-135m-kv4.25.kv",
                             {"bench/results/kv_types_c2048_calib.json", "bench/results/kv_types3_c2048_calib.json"},
                             6050, 0.00733226}}) {
    tq::AllocInput in = base;
    for (const auto& t : c.types) add_types(in, t);
    in.budget = static_cast<int64_t>(std::floor(c.budget * 16 + 1e-9));
    in.suffix = " ks";
    const tq::AllocResult r = tq::allocate_heads(in);
    // The shipped file (written in the short form of earlier releases) names the same cache.
    EXPECT_EQ(tq::KvSpec::parse(r.label), tq::KvSpec::parse(tq::read_kv_label_file(tq_test::source_path(c.config))))
        << c.config << ": " << r.label;
    EXPECT_LE(r.cost, in.budget);
    EXPECT_NEAR(r.predicted_kld, c.predicted, c.predicted * 1e-5);
  }
}

}  // namespace

namespace {

// allocate_heads with further measurements and unit cost scales: the same measurement given twice
// (any weights) picks what it picks alone, and a scaled unit's cost counts scaled.
TEST(Calibrate, FurtherMeasurementsAndUnitScales) {
  tq::Rng r(5);
  tq::AllocInput in;
  in.n_layers = 6;
  in.n_kv_heads = 1;
  for (int u = 0; u < 6; ++u) {
    in.sens_k.push_back(0.01 + r.uniform());
    in.sens_v.push_back(0.01 + r.uniform());
  }
  in.k_types = {"tq2h5n8", "tq3h6n8", "tq4h6n8"};
  in.v_types = {"tq2h5n8", "tq3n8", "tq5n8"};
  in.kld_k = {0.3, 0.1, 0.02};
  in.kld_v = {0.2, 0.08, 0.01};
  in.cost_k = {10, 14, 18};
  in.cost_v = {10, 13, 21};
  in.budget = 12 * 14;
  const tq::AllocResult one = tq::allocate_heads(in);
  EXPECT_TRUE(one.predicted_each.empty());
  tq::AllocInput twice = in;
  twice.weight = 2;
  twice.more.push_back({in.sens_k, in.sens_v, in.kld_k, in.kld_v, 3});
  const tq::AllocResult two = tq::allocate_heads(twice);
  EXPECT_EQ(two.k_type, one.k_type);
  EXPECT_EQ(two.v_type, one.v_type);
  ASSERT_EQ(two.predicted_each.size(), 2u);
  EXPECT_NEAR(two.predicted_each[0], one.predicted_kld, 1e-12);
  EXPECT_NEAR(two.predicted_each[1], one.predicted_kld, 1e-12);
  EXPECT_NEAR(two.predicted_kld, 5 * one.predicted_kld, 1e-12);
  // A measurement that finds only unit 0's K sensitive moves bits there.
  tq::AllocInput other = in;
  std::vector<double> k0(6, 1e-6);
  k0[0] = 1;
  other.more.push_back({k0, in.sens_v, in.kld_k, in.kld_v, 100});
  EXPECT_EQ(tq::allocate_heads(other).k_type[0], "tq4h6n8");
  // Unit 2 held 4x the tokens (a global layer at a long context): its cost counts 4x.
  tq::AllocInput scaled = in;
  scaled.unit_scale = {1, 1, 4, 1, 1, 1};
  scaled.budget = 15 * 14 + 6 * 10;
  const tq::AllocResult s = tq::allocate_heads(scaled);
  int64_t cost = 0;
  for (int u = 0; u < 6; ++u) {
    const int64_t sc = scaled.unit_scale[u];
    cost += sc * scaled.cost_k[std::find(in.k_types.begin(), in.k_types.end(), s.k_type[u]) - in.k_types.begin()];
    cost += sc * scaled.cost_v[std::find(in.v_types.begin(), in.v_types.end(), s.v_type[u]) - in.v_types.begin()];
  }
  EXPECT_EQ(cost, s.cost);
  EXPECT_LE(s.cost, scaled.budget);
  scaled.unit_scale = {1, 1, 0, 1, 1, 1};
  EXPECT_THROW(tq::allocate_heads(scaled), tq::Error);
  scaled.unit_scale = {1, 1};
  EXPECT_THROW(tq::allocate_heads(scaled), tq::Error);
  tq::AllocInput bad = in;
  bad.more.push_back({{1, 2}, in.sens_v, in.kld_k, in.kld_v, 1});
  EXPECT_THROW(tq::allocate_heads(bad), tq::Error);
  bad.more = {{in.sens_k, in.sens_v, in.kld_k, in.kld_v, 0}};
  EXPECT_THROW(tq::allocate_heads(bad), tq::Error);
}

// Two measurements (two contexts): the budget holds at both, each counted as perplexity counts it.
TEST(Calibrate, SeveralContextsKeepTheBudgetAtEach) {
  Tiny t;
  const tq::LlamaConfig& mc = t.m.config();
  tq::CalibSensitivity a = fake_sens(mc, 7), b = fake_sens(mc, 8);
  a.n_ctx = 96;
  b.n_ctx = 192;
  const std::vector<int32_t> tokens = random_tokens(192, mc.n_vocab, 3);
  double prev = std::numeric_limits<double>::infinity();
  for (double bits : {3.6, 4.25, 5.0}) {
    const tq::CalibAllocation al = tq::calibrate_allocate_multi(mc, {a, b}, bits, 96);
    ASSERT_EQ(al.check_ctx, (std::vector<int>{96, 192}));
    ASSERT_EQ(al.alloc.predicted_each.size(), 2u);
    EXPECT_LE(al.alloc.predicted_kld, prev);
    prev = al.alloc.predicted_kld;
    const tq::KvSpec kv = tq::KvSpec::parse(al.alloc.label);
    for (size_t i = 0; i < al.check_ctx.size(); ++i) {
      EXPECT_LE(al.check_bits[i], bits) << al.alloc.label;
      tq::PerplexityOptions po;
      po.n_ctx = al.check_ctx[i];
      const tq::PerplexityResult r = tq::perplexity_multi(t.m, tokens, po, {kv})[0];
      EXPECT_EQ(r.kv_bytes_used, tq::calib_bytes_held(mc, kv, po.n_ctx)) << al.alloc.label;
      EXPECT_LE(r.bits_per_value_all, bits);
    }
    EXPECT_DOUBLE_EQ(al.bits_all, al.check_bits[0]);
  }
  // One measurement: what calibrate_allocate gives (no windows on this model).
  const tq::CalibAllocation one = tq::calibrate_allocate_multi(mc, {a}, 4.25, 96);
  EXPECT_EQ(one.alloc.label, tq::calibrate_allocate(mc, a, 4.25, 96).alloc.label);
  EXPECT_THROW(tq::calibrate_allocate_multi(mc, {a, b}, 2.0, 96), tq::Error);  // below the cheapest
  tq::CalibSensitivity c = b;
  c.k_types.pop_back();
  c.kld_k.pop_back();
  EXPECT_THROW(tq::calibrate_allocate_multi(mc, {a, c}, 4.25, 96), tq::Error);  // other candidates
  c = b;
  c.protect = "plain ks";
  EXPECT_THROW(tq::calibrate_allocate_multi(mc, {a, c}, 4.25, 96), tq::Error);  // other protection
  EXPECT_THROW(tq::calibrate_allocate_multi(mc, {}, 4.25, 96), tq::Error);
}

// --long-probes growing: the layers whose attended tokens grow with the context, probed alone;
// the others' sensitivities copied from the shorter context.
TEST(Calibrate, LongContextProbesOnlyTheGrowingLayers) {
  tq::LlamaConfig w;
  w.n_layers = 6;
  w.sliding_window = 512;
  w.traits.swa_pattern = 6;  // layer 5 global, the rest in 512-token windows
  EXPECT_EQ(tq::calib_layers_growing(w, 512, 8192), (std::vector<int>{5}));
  EXPECT_EQ(tq::calib_layers_growing(w, 1024, 2048), (std::vector<int>{5}));
  EXPECT_EQ(tq::calib_layers_growing(w, 256, 8192), (std::vector<int>{0, 1, 2, 3, 4, 5}));  // windows not yet full
  w.sliding_window = 0;  // no windows: every layer grows
  EXPECT_EQ(tq::calib_layers_growing(w, 512, 8192), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_THROW(tq::calib_layers_growing(w, 512, 512), tq::Error);

  Tiny t;
  const tq::LlamaConfig& mc = t.m.config();
  const std::vector<int32_t> tokens = random_tokens(2 * 64 + 3, mc.n_vocab, 5);
  tq::CalibOptions co;
  co.n_ctx = 64;
  co.n_chunks = 1;
  co.k_types = {"tq2h4n8", "tq4h6n8"};
  co.v_types = {"tq3n8", "tq5n8"};
  const tq::CalibSensitivity all = tq::calibrate_measure(t.m, tokens, co);
  co.probe_layers = std::vector<int>{1};
  size_t total = 0;
  co.progress = [&](size_t, size_t n) { total = n; };
  tq::CalibSensitivity some = tq::calibrate_measure(t.m, tokens, co);
  EXPECT_EQ(total, 2u * mc.n_kv_heads + 2 + 2 + 1);  // layer 1's K and V probes, the types, f16
  const int H = mc.n_kv_heads;
  for (int h = 0; h < H; ++h) {
    EXPECT_EQ(some.sens_k[h], -1);  // layer 0: not probed
    EXPECT_EQ(some.sens_v[h], -1);
    EXPECT_NEAR(some.sens_k[H + h], all.sens_k[H + h], 1e-12 + 1e-9 * all.sens_k[H + h]);
    EXPECT_NEAR(some.sens_v[H + h], all.sens_v[H + h], 1e-12 + 1e-9 * all.sens_v[H + h]);
  }
  EXPECT_EQ(some.kld_k, all.kld_k);
  EXPECT_EQ(some.kld_v, all.kld_v);
  some.n_ctx = 128;  // as if measured at a longer context
  tq::CalibSensitivity shorter = fake_sens(mc, 4);
  shorter.k_types = co.k_types;
  shorter.v_types = co.v_types;
  EXPECT_THROW(tq::calib_reuse_sens(some, shorter, {1}), tq::Error);  // other probes (fake_sens has none)
  shorter.probe_k = some.probe_k;
  shorter.probe_v = some.probe_v;
  tq::CalibSensitivity longer = some;
  tq::calib_reuse_sens(longer, shorter, {1});
  EXPECT_EQ(longer.reused_layers, (std::vector<int>{0}));
  EXPECT_EQ(longer.reused_from_ctx, 64);
  for (int h = 0; h < H; ++h) {
    EXPECT_EQ(longer.sens_k[h], shorter.sens_k[h]);
    EXPECT_EQ(longer.sens_v[h], shorter.sens_v[h]);
    EXPECT_EQ(longer.sens_k[H + h], some.sens_k[H + h]);
  }
  tq::CalibSensitivity bad = some;
  shorter.n_ctx = 128;  // not a shorter context
  EXPECT_THROW(tq::calib_reuse_sens(bad, shorter, {1}), tq::Error);
  shorter.n_ctx = 64;
  shorter.v_types.pop_back();  // other candidates
  EXPECT_THROW(tq::calib_reuse_sens(bad, shorter, {1}), tq::Error);
}

// On Gemma 3 (15 of 18 layers in 512-token windows) calib_bytes_held is what tq perplexity
// counts past the window, and calib_bytes_used (every token of every layer) within it.
TEST(Calibrate, BytesHeldAsPerplexityCountsThemOnGemma) {
  const std::string path = tq_test::source_path("models/gemma-3-270m-q4_k_m.gguf");
  if (!tq_test::file_exists(path))
    GTEST_SKIP() << path << " missing: run scripts/fetch-model.sh gemma3-270m (make test does)";
  const tq::GgufFile g = tq::GgufFile::open(path);
  tq::LlamaModel m = tq::LlamaModel::load(g);
  m.set_threads(2);
  const tq::LlamaConfig& mc = m.config();
  ASSERT_EQ(mc.sliding_window, 512);
  // What tq perplexity counts for a window of 1056 tokens: bytes_used after one forward (the
  // model appends 512 at a time; the last append, 32 tokens at position 1024, first drops what
  // the windowed layers' queries no longer see: they hold 544 tokens, the global ones 1056).
  const int n = 1056;
  const std::vector<int32_t> tokens = random_tokens(n, mc.n_vocab, 11);
  const tq::KvSpec kv = tq::KvSpec::parse("tq3h6n8/tq3h4n8 ks L5:tq4h6n8/tq5n8 L11:f16/tq4n8");
  tq::KvCache cache(kv.resolve(mc, n));
  std::vector<float> hidden(static_cast<size_t>(n) * mc.n_embd);
  m.forward(cache, tokens.data(), n, hidden.data());
  EXPECT_EQ(cache.bytes_used(), tq::calib_bytes_held(mc, kv, n));
  EXPECT_LT(tq::calib_bytes_held(mc, kv, n), tq::calib_bytes_used(mc, kv, n) * 0.8);
  EXPECT_EQ(tq::calib_bytes_held(mc, kv, 512), tq::calib_bytes_used(mc, kv, 512));
  // A budget at 512 and 1024: the knapsack at 512 (every layer holds 512), checked at both.
  tq::CalibSensitivity a;
  a.n_layers = mc.n_layers;
  a.n_kv_heads = 1;
  a.head_dim = mc.head_dim;
  a.n_ctx = 512;
  a.windows = a.windows_requested = 1;
  a.n_scored = 255;
  a.protect = "ks";
  tq::Rng rr(3);
  for (int l = 0; l < mc.n_layers; ++l) {
    a.sens_k.push_back(0.001 + rr.uniform());
    a.sens_v.push_back(0.001 + rr.uniform());
  }
  a.k_types = tq::default_calib_k_types();
  a.v_types = tq::default_calib_v_types();
  for (const auto& t : a.k_types) a.kld_k.push_back(1.0 / tq::kv_type_traits(tq::parse_kv_type(t)).block_bytes(256));
  for (const auto& t : a.v_types) a.kld_v.push_back(1.0 / tq::kv_type_traits(tq::parse_kv_type(t)).block_bytes(256));
  tq::CalibSensitivity b = a;
  b.n_ctx = 2048;
  for (int l : {5, 11, 17}) b.sens_k[l] *= 20;  // the global layers matter more at the long context
  const tq::CalibAllocation al = tq::calibrate_allocate_multi(mc, {a, b}, 3.25, 512);
  ASSERT_EQ(al.check_ctx, (std::vector<int>{512, 2048}));
  EXPECT_LE(al.check_bits[0], 3.25);
  EXPECT_GT(al.check_bits[0], 3.0);
  EXPECT_LT(al.check_bits[1], al.check_bits[0]);  // the windowed layers hold about 1024 of 2048
  const tq::CalibAllocation only_a = tq::calibrate_allocate(mc, a, 3.25, 512);
  double pa = 0;
  for (int l : {5, 11, 17})
    pa += tq::kv_type_traits(tq::parse_kv_type(al.alloc.k_type[l])).block_bytes(256) -
          tq::kv_type_traits(tq::parse_kv_type(only_a.alloc.k_type[l])).block_bytes(256);
  EXPECT_GT(pa, 0) << "the global layers' K gets more bytes: " << al.alloc.label << " vs " << only_a.alloc.label;
}

}  // namespace
