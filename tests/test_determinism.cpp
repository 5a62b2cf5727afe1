// Determinism.*: the same seed and input give bit-identical codes at every SIMD level the
// host supports (tq::simd::available_levels(), "scalar" = the reference kernels) and for
// every thread count; decode is bit-identical across levels too (the codec promises the
// same float operations in the same order); scores agree within float-summation tolerance.
// The index file written from the same data is byte-identical at every level and thread
// count; search results, attention outputs and perplexities agree across thread counts.
// The thread tests ("...Thread...") also run under TSan (make test-tsan).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tq/bitpack.h"
#include "tq/codebook.h"
#include "tq/common.h"
#include "tq/distortion.h"
#include "llm_test_util.h"
#include "tq/error.h"
#include "tq/eval.h"
#include "tq/fileio.h"
#include "tq/gguf.h"
#include "tq/index.h"
#include "tq/kv_cache.h"
#include "tq/kv_spec.h"
#include "tq/model.h"
#include "tq/quantizer.h"
#include "tq/rotation.h"
#include "tq/simd.h"

namespace {

bool small() {
  const char* s = std::getenv("TQ_TEST_SMALL");
  return s && *s && std::string(s) != "0";
}

// Relative tolerance of a float score against the scalar reference: the SIMD dot product
// sums in a different order (8 or 16 partial sums), so allow a few ulps per term.
constexpr double kScoreRelTol = 1e-5;

const std::vector<int>& dims() {
  static const std::vector<int> d = {2, 3, 7, 8, 17, 31, 33, 64, 100, 127, 128, 129};
  return d;
}
const char* const kRotations[] = {"hadamard", "haar", "block32", "block64", "block128", "givens", "iso4", "identity"};

std::vector<float> data(size_t n, int d, uint64_t seed) {
  std::vector<float> x(n * static_cast<size_t>(d));
  tq::Rng r(seed);
  for (auto& v : x) v = static_cast<float>(r.normal() * 3.0);
  // Edge rows: a zero vector, a tiny and a large vector.
  if (n >= 3) {
    std::fill(x.begin(), x.begin() + d, 0.0f);
    for (int i = 0; i < d; ++i) x[d + i] *= 1e-20f;
    for (int i = 0; i < d; ++i) x[2 * d + i] *= 1e3f;
  }
  return x;
}

double norm2(const float* x, int d) {
  double s = 0;
  for (int i = 0; i < d; ++i) s += static_cast<double>(x[i]) * x[i];
  return std::sqrt(s);
}

struct Outputs {
  std::vector<uint8_t> codes;
  std::vector<float> decoded, scores;
};

Outputs run(const tq::Quantizer& q, const std::vector<float>& x, size_t n, const std::vector<float>& query) {
  Outputs o;
  o.codes.resize(n * q.code_bytes());
  o.decoded.resize(x.size());
  o.scores.resize(n);
  q.encode(n, x.data(), o.codes.data());
  q.decode(n, o.codes.data(), o.decoded.data());
  std::vector<float> state(q.query_state_floats());
  q.prepare_query(query.data(), state.data());
  q.score(state.data(), n, o.codes.data(), o.scores.data());
  return o;
}

}  // namespace

TEST(Determinism, LevelsListedOnceScalarLast) {
  const auto levels = tq::simd::available_levels();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.back(), "scalar");
  EXPECT_EQ(std::set<std::string>(levels.begin(), levels.end()).size(), levels.size())
      << "a level is listed twice (regression: Highway's own scalar target was listed too)";
  for (const auto& l : levels) {
    tq::simd::ScopedLevel s(l);
    EXPECT_EQ(tq::simd::current_level(), l);
  }
}

// Every quantizer kind x rotation x dimension x bit width: codes and decoded vectors
// bit-identical at every level, scores within kScoreRelTol of the scalar reference.
TEST(Determinism, CodesIdenticalAcrossSimdLevels) {
  const auto levels = tq::simd::available_levels();
  const size_t n = small() ? 5 : 40;  // includes the zero / tiny / large edge rows
  int configs = 0;
  for (auto kind : {tq::QuantizerKind::mse, tq::QuantizerKind::prod, tq::QuantizerKind::qjl}) {
    for (const char* rot : kRotations) {
      for (int d : dims()) {
        for (int bits = 1; bits <= 8; ++bits) {
          if (kind == tq::QuantizerKind::prod && bits < 2) continue;
          if (kind == tq::QuantizerKind::qjl && bits > 1) continue;  // qjl ignores bits
          // Keep the sweep fast: every bit width at a few dims, every dim at 2 and 4 bits.
          if (!(bits == 2 || bits == 4 || d == 7 || d == 128)) continue;
          tq::QuantizerConfig cfg;
          cfg.dim = d;
          cfg.bits = bits;
          cfg.rotation = tq::parse_rotation(rot);
          cfg.seed = 1234 + d;
          cfg.norm = (d % 2) ? tq::NormFormat::f32 : tq::NormFormat::f16;
          auto q = tq::make_quantizer(kind, cfg);
          const auto x = data(n, d, 99 + d);
          const auto query = data(1, d, 7 + d);
          Outputs ref;
          {
            tq::simd::ScopedLevel s("scalar");
            ref = run(*q, x, n, query);
          }
          for (const auto& level : levels) {
            if (level == "scalar") continue;
            tq::simd::ScopedLevel s(level);
            const Outputs o = run(*q, x, n, query);
            SCOPED_TRACE(std::string(tq::quantizer_kind_name(kind)) + " " + rot + " d=" + std::to_string(d) +
                         " bits=" + std::to_string(bits) + " level=" + level);
            ASSERT_EQ(o.codes, ref.codes);
            ASSERT_EQ(0, std::memcmp(o.decoded.data(), ref.decoded.data(), o.decoded.size() * sizeof(float)));
            for (size_t i = 0; i < n; ++i) {
              // |score| is at most about ||q|| ||x_i||: the tolerance is relative to that.
              const double scale = norm2(query.data(), d) * norm2(x.data() + i * d, d);
              ASSERT_LE(std::fabs(o.scores[i] - ref.scores[i]), kScoreRelTol * scale + 1e-30) << "row " << i;
            }
          }
          ++configs;
        }
      }
    }
  }
  EXPECT_GT(configs, 200);
}

// The kernels the KV cache and the index share, at every level, against the references.
TEST(Determinism, KernelsMatchReferenceAtEveryLevel) {
  tq::Rng r(5);
  for (int bits = 1; bits <= 8; ++bits) {
    for (int d : dims()) {
      // Every width at d = 7 and 128, every dimension at 2 and 4 bits (the codebooks of
      // the sweep above, already cached: a 7- or 8-bit codebook takes ~1 s to compute).
      if (!(bits == 2 || bits == 4 || d == 7 || d == 128)) continue;
      const tq::Codebook& cb = tq::get_codebook(std::max(d, 2), bits);
      std::vector<float> y(d), q(d);
      for (auto& v : y) v = static_cast<float>(r.normal() / std::sqrt(d));
      for (auto& v : q) v = static_cast<float>(r.normal());
      std::vector<uint8_t> ref(d), idx(d);
      tq::quantize_rotated_ref(cb, d, y.data(), ref.data());
      const float dot_ref = tq::dot_centroids_ref(cb, d, q.data(), ref.data());
      std::vector<float> w_ref(64 * 4);
      for (auto& v : w_ref) v = static_cast<float>(r.normal());
      std::vector<float> w_out_ref = w_ref;
      tq::fwht_ref(4, 64, w_out_ref.data(), 64);
      for (const auto& level : tq::simd::available_levels()) {
        tq::simd::ScopedLevel s(level);
        tq::quantize_rotated(cb, d, y.data(), idx.data());
        EXPECT_EQ(idx, ref) << level << " d=" << d << " bits=" << bits;
        double sum_abs = 0;
        for (int i = 0; i < d; ++i) sum_abs += std::fabs(q[i] * cb.centroids[ref[i]]);
        EXPECT_NEAR(tq::dot_centroids(cb, d, q.data(), ref.data()), dot_ref, 1e-6 * sum_abs + 1e-30) << level;
        std::vector<float> w = w_ref;
        tq::fwht(4, 64, w.data(), 64);
        EXPECT_EQ(0, std::memcmp(w.data(), w_out_ref.data(), w.size() * sizeof(float))) << level;
      }
    }
  }
}

// Same seed, same codes (fresh objects); a different seed, different codes.
TEST(Determinism, SameSeedSameCodesFreshObjects) {
  const int d = 96;
  const auto x = data(16, d, 3);
  for (auto kind : {tq::QuantizerKind::mse, tq::QuantizerKind::prod}) {
    tq::QuantizerConfig cfg;
    cfg.dim = d;
    cfg.bits = 3;
    cfg.seed = 42;
    std::vector<uint8_t> a, b, c;
    for (auto* out : {&a, &b}) {
      auto q = tq::make_quantizer(kind, cfg);
      out->resize(16 * q->code_bytes());
      q->encode(16, x.data(), out->data());
    }
    cfg.seed = 43;
    auto q = tq::make_quantizer(kind, cfg);
    c.resize(16 * q->code_bytes());
    q->encode(16, x.data(), c.data());
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
  }
}

// One quantizer shared by T OpenMP threads, each encoding / decoding / scoring its own
// slice (as `tq bench codec --threads` does): the result does not depend on T.
TEST(Determinism, EncodeDecodeScoreAcrossThreadCounts) {
  const size_t n = small() ? 300 : 3000;
  const int d = 128;
  const auto x = data(n, d, 11);
  const auto query = data(1, d, 12);
  for (auto kind : {tq::QuantizerKind::mse, tq::QuantizerKind::prod, tq::QuantizerKind::qjl}) {
    tq::QuantizerConfig cfg;
    cfg.dim = d;
    cfg.bits = kind == tq::QuantizerKind::qjl ? 1 : 3;
    auto q = tq::make_quantizer(kind, cfg);
    const size_t cb = q->code_bytes();
    std::vector<float> state(q->query_state_floats());
    q->prepare_query(query.data(), state.data());
    Outputs ref;
    for (int T : {1, 2, 3, 4, 8}) {
      Outputs o;
      o.codes.resize(n * cb);
      o.decoded.resize(n * d);
      o.scores.resize(n);
#pragma omp parallel for num_threads(T) schedule(static)
      for (int t = 0; t < T; ++t) {
        const size_t a = n * t / T, b = n * (t + 1) / T;
        if (b > a) {
          q->encode(b - a, x.data() + a * d, o.codes.data() + a * cb);
          q->decode(b - a, o.codes.data() + a * cb, o.decoded.data() + a * d);
          q->score(state.data(), b - a, o.codes.data() + a * cb, o.scores.data() + a);
        }
      }
      if (T == 1) {
        ref = o;
        continue;
      }
      EXPECT_EQ(o.codes, ref.codes) << "T=" << T;
      EXPECT_EQ(0, std::memcmp(o.decoded.data(), ref.decoded.data(), n * d * sizeof(float))) << "T=" << T;
      EXPECT_EQ(0, std::memcmp(o.scores.data(), ref.scores.data(), n * sizeof(float))) << "T=" << T;
    }
  }
}

// Quantizers (and so codebooks, through the process-wide cache) built concurrently from
// many threads give the same codes as one built alone.
TEST(Determinism, ConcurrentConstructionThreads) {
  const int d = 40;
  const auto x = data(8, d, 21);
  std::vector<std::vector<uint8_t>> codes(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      tq::QuantizerConfig cfg;
      cfg.dim = d;
      cfg.bits = 1 + t % 4;  // fresh (d, bits) pairs: threads race on the codebook cache
      cfg.law = tq::Law::gauss;
      auto q = tq::make_quantizer(tq::QuantizerKind::mse, cfg);
      codes[t].resize(8 * q->code_bytes());
      q->encode(8, x.data(), codes[t].data());
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) {
    tq::QuantizerConfig cfg;
    cfg.dim = d;
    cfg.bits = 1 + t % 4;
    cfg.law = tq::Law::gauss;
    auto q = tq::make_quantizer(tq::QuantizerKind::mse, cfg);
    std::vector<uint8_t> c(8 * q->code_bytes());
    q->encode(8, x.data(), c.data());
    EXPECT_EQ(c, codes[t]) << "thread " << t;
  }
}

namespace {

std::vector<uint8_t> saved_index_bytes(const tq::IndexConfig& cfg, const std::vector<float>& x, size_t n,
                                       const std::string& path) {
  tq::Index idx(cfg);
  // Added in uneven batches: the file must not depend on how the data was split.
  const size_t a = n / 3;
  idx.add(a, x.data());
  idx.add(n - a, x.data() + a * cfg.dim);
  idx.save(path);
  auto b = tq::read_file_bytes(path);
  std::remove(path.c_str());
  return b;
}

}  // namespace

// Same data, same seed: the saved index file is byte-identical at every SIMD level, for
// every codec / width / metric below, and equal to one built in a single add().
TEST(Determinism, IndexFileIdenticalAcrossSimdLevels) {
  const size_t n = small() ? 100 : 400;
  const int d = 40;
  const auto x = data(n, d, 31);
  const std::string path = ::testing::TempDir() + "/tq_det_index.tqi";
  struct C {
    double bits;
    tq::QuantizerKind codec;
    const char* metric;
    bool center, fit;
  };
  for (const C& c : {C{4, tq::QuantizerKind::mse, "cosine", false, false}, C{2.5, tq::QuantizerKind::mse, "l2", true, false},
                     C{1, tq::QuantizerKind::mse, "ip", false, true}, C{3, tq::QuantizerKind::prod, "ip", false, false},
                     C{8, tq::QuantizerKind::mse, "l2", false, false}}) {
    tq::IndexConfig cfg;
    cfg.dim = d;
    cfg.bits = c.bits;
    cfg.codec = c.codec;
    cfg.metric = tq::parse_metric(c.metric);
    cfg.center = c.center;
    cfg.fit_scale = c.fit;
    std::vector<uint8_t> ref;
    {
      tq::simd::ScopedLevel s("scalar");
      ref = saved_index_bytes(cfg, x, n, path);
    }
    ASSERT_GT(ref.size(), 128u);
    for (const auto& level : tq::simd::available_levels()) {
      tq::simd::ScopedLevel s(level);
      EXPECT_EQ(saved_index_bytes(cfg, x, n, path), ref) << level << " bits=" << c.bits << " " << c.metric;
    }
  }
}

// One index searched with 1..4 threads (queries split across threads): identical ids and
// scores. The index file built while other threads search is unchanged.
TEST(Determinism, IndexSearchAcrossThreadCounts) {
  const size_t n = small() ? 500 : 3000, nq = 37;
  const int d = 48, k = 10;
  const auto x = data(n, d, 41);
  const auto q = data(nq, d, 42);
  for (bool fast : {true, false}) {
    tq::IndexConfig cfg;
    cfg.dim = d;
    cfg.bits = 3;
    tq::Index idx(cfg);
    idx.add(n, x.data());
    tq::SearchParams p;
    p.k = k;
    p.fast_scan = fast;
    std::vector<float> s1(nq * k), sT(nq * k);
    std::vector<int64_t> i1(nq * k), iT(nq * k);
    p.n_threads = 1;
    idx.search(nq, q.data(), p, s1.data(), i1.data());
    for (int T : {2, 3, 4}) {
      p.n_threads = T;
      idx.search(nq, q.data(), p, sT.data(), iT.data());
      EXPECT_EQ(iT, i1) << "T=" << T << " fast_scan=" << fast;
      EXPECT_EQ(0, std::memcmp(sT.data(), s1.data(), sT.size() * sizeof(float))) << "T=" << T;
    }
  }
}

// Many threads searching one shared index at once (each with its own output): every
// thread gets the single-threaded answer.
TEST(Determinism, ConcurrentIndexSearchThreads) {
  const size_t n = small() ? 300 : 2000, nq = 8;
  const int d = 32, k = 5;
  const auto x = data(n, d, 51);
  const auto q = data(nq, d, 52);
  tq::IndexConfig cfg;
  cfg.dim = d;
  tq::Index idx(cfg);
  idx.add(n, x.data());
  tq::SearchParams p;
  p.k = k;
  p.n_threads = 1;
  std::vector<float> s1(nq * k);
  std::vector<int64_t> i1(nq * k);
  idx.search(nq, q.data(), p, s1.data(), i1.data());
  std::vector<std::vector<int64_t>> ids(4, std::vector<int64_t>(nq * k));
  std::vector<std::vector<float>> sc(4, std::vector<float>(nq * k));
  std::vector<std::thread> th;
  for (int t = 0; t < 4; ++t)
    th.emplace_back([&, t] { idx.search(nq, q.data(), p, sc[t].data(), ids[t].data()); });
  for (auto& t : th) t.join();
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(ids[t], i1) << "thread " << t;
    EXPECT_EQ(sc[t], s1) << "thread " << t;
  }
}

// Prefill attention (several queries, GQA, an f16 window) with 1..4 threads, for a float,
// a row and two TurboQuant cache types: outputs within float-summation tolerance.
TEST(Determinism, AttentionAcrossThreadCounts) {
  const int D = 64, kvh = 2, heads = 4, n_tok = small() ? 300 : 1200, n_q = 3;
  for (const char* t : {"f16", "q8_0", "tq3", "tq4"}) {
    tq::KvCacheConfig cfg;
    cfg.n_layers = 1;
    cfg.n_kv_heads = kvh;
    cfg.head_dim = D;
    cfg.max_tokens = n_tok + 8;
    cfg.type_k = cfg.type_v = tq::parse_kv_format(t);
    cfg.window = 16;
    tq::KvCache cache(cfg);
    const auto k = data(n_tok, kvh * D, 61), v = data(n_tok, kvh * D, 62);
    cache.append(0, n_tok, k.data(), v.data());
    const auto q = data(n_q, heads * D, 63);
    tq::AttentionParams p;
    p.n_heads = heads;
    std::vector<float> o1(q.size()), oT(q.size());
    p.n_threads = 1;
    tq::attention(cache, 0, n_q, q.data(), o1.data(), p);
    double norm = 0;
    for (float z : o1) norm += static_cast<double>(z) * z;
    norm = std::sqrt(norm);
    for (int T : {2, 3, 4}) {
      p.n_threads = T;
      tq::attention(cache, 0, n_q, q.data(), oT.data(), p);
      double diff = 0;
      for (size_t i = 0; i < o1.size(); ++i) diff += (static_cast<double>(oT[i]) - o1[i]) * (oT[i] - o1[i]);
      // Float sums in another order (the split over KV chunks merged by log-sum-exp).
      EXPECT_LE(std::sqrt(diff), 1e-5 * norm + 1e-12) << t << " T=" << T;
    }
  }
}

// Perplexity of a tiny random llama (self-made GGUF) on a quantized cache: 1, 2 and 3
// threads agree within float-summation tolerance.
TEST(Determinism, PerplexityAcrossThreadCounts) {
  tq_test::TinyLlama c;
  const auto bytes = tq_test::tiny_llama_gguf(c, tq::GgmlType::F16, 17).bytes();
  auto g = tq::GgufFile::from_bytes(bytes.data(), bytes.size());
  tq::LlamaModel m = tq::LlamaModel::load(g);
  std::vector<int32_t> toks(small() ? 128 : 256);
  tq::Rng r(5);
  for (auto& t : toks) t = static_cast<int32_t>(r.below(static_cast<uint32_t>(c.n_vocab)));
  tq::PerplexityOptions opt;
  opt.n_ctx = 64;
  opt.kv = tq::KvSpec::parse("tq4/tq3");
  double ref = 0;
  for (int T : {1, 2, 3}) {
    m.set_threads(T);
    const tq::PerplexityResult res = tq::perplexity(m, toks, opt);
    ASSERT_GT(res.ppl, 1.0);
    if (T == 1) {
      ref = res.ppl;
      continue;
    }
    EXPECT_NEAR(res.ppl, ref, 1e-4 * ref) << "T=" << T;
  }
}
