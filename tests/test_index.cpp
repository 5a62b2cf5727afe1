// Index.*: recall against brute force, fast scan == scalar reference, every width and scale
// mode, ids, bad inputs. IndexIo.*: save/load round trip and corrupted-file rejection.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tq/bitpack.h"
#include "tq/common.h"
#include "tq/error.h"
#include "tq/fileio.h"
#include "tq/index.h"
#include "tq/simd.h"
#include "tq/bitpack.h"
#include "tq/codebook.h"
#include "tq/rotation.h"
#include "tq/trellis.h"
#include "search/index_internal.h"

extern "C" int openblas_get_num_threads(void);
extern "C" void openblas_set_num_threads(int num_threads);

namespace fs = std::filesystem;

namespace {

bool small() { return std::getenv("TQ_TEST_SMALL") != nullptr; }

// Clustered Gaussian data: 32 centres, points = centre + noise, so neighbours are meaningful.
std::vector<float> make_data(size_t n, int d, uint64_t seed, float noise = 0.35f) {
  tq::Rng rng(seed);
  tq::Rng crng(1234);  // shared centres for base and queries
  const int nc = 32;
  std::vector<float> c(static_cast<size_t>(nc) * d);
  for (auto& v : c) v = static_cast<float>(crng.normal());
  std::vector<float> x(n * d);
  for (size_t i = 0; i < n; ++i) {
    const int ci = static_cast<int>(rng.below(nc));
    const float s = 0.5f + static_cast<float>(rng.uniform());  // varied norms
    for (int j = 0; j < d; ++j)
      x[i * d + j] = s * (c[ci * d + j] + noise * static_cast<float>(rng.normal()));
  }
  return x;
}

struct Results {
  std::vector<float> s;
  std::vector<int64_t> id;
};
Results run(const tq::Index& idx, const std::vector<float>& q, int k, tq::SearchParams p = {}) {
  p.k = k;
  const size_t nq = q.size() / idx.dim();
  Results r{std::vector<float>(nq * k), std::vector<int64_t>(nq * k)};
  idx.search(nq, q.data(), p, r.s.data(), r.id.data());
  return r;
}
// Two searches that score the same codes: equal scores (float rounding), and ids that differ
// only where two neighbours of a row tie within that rounding.
void expect_same_up_to_ties(const Results& ra, const Results& rb, size_t nq, int k, const std::string& what) {
  for (size_t i = 0; i < nq * k; ++i) {
    EXPECT_NEAR(ra.s[i], rb.s[i], 1e-4f * (1.f + std::fabs(rb.s[i]))) << what << " " << i;
    if (ra.id[i] != rb.id[i]) {
      const size_t row = i / k;
      bool tie = false;
      for (size_t j = row * k; j < (row + 1) * k; ++j)
        tie |= rb.id[j] == ra.id[i] && std::fabs(rb.s[j] - ra.s[i]) <= 1e-4f * (1.f + std::fabs(ra.s[i]));
      EXPECT_TRUE(tie) << what << " query " << row;
    }
  }
}
Results exact(tq::Metric m, const std::vector<float>& x, const std::vector<float>& q, int d, int k) {
  const size_t n = x.size() / d, nq = q.size() / d;
  Results r{std::vector<float>(nq * k), std::vector<int64_t>(nq * k)};
  tq::exact_search(m, n, d, x.data(), nq, q.data(), k, r.s.data(), r.id.data());
  return r;
}
// Share of queries whose exact top-1 is among the first k results.
double recall1(const Results& got, int kg, const Results& gt, int kt, int k) {
  const size_t nq = gt.id.size() / kt;
  size_t hit = 0;
  for (size_t i = 0; i < nq; ++i)
    for (int j = 0; j < k; ++j)
      if (got.id[i * kg + j] == gt.id[i * kt]) { ++hit; break; }
  return static_cast<double>(hit) / nq;
}

struct TempDir {
  fs::path dir;
  TempDir() {
    dir = fs::temp_directory_path() /
          ("tq_index_test_" + std::to_string(::getpid()) + "_" + std::to_string(reinterpret_cast<uintptr_t>(this)));
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
  std::string path(const std::string& n) const { return (dir / n).string(); }
};

tq::IndexConfig cfg_of(int d, double bits, tq::Metric m) {
  tq::IndexConfig c;
  c.dim = d;
  c.bits = bits;
  c.metric = m;
  return c;
}

}  // namespace

// Named thresholds: on clustered data at d = 64, 4-bit codes with re-ranking find the exact
// top-1 among the first 10 for nearly every query; 2 bits for most.
constexpr double kMinRecall1at10_4bit = 0.95;
constexpr double kMinRecall1at10_2bit = 0.6;

TEST(Index, RecallAgainstBruteForceAllMetrics) {
  const int d = 64;
  const size_t n = small() ? 1000 : 4000, nq = 100;
  auto x = make_data(n, d, 1), q = make_data(nq, d, 2);
  for (auto m : {tq::Metric::cosine, tq::Metric::ip, tq::Metric::l2}) {
    auto gt = exact(m, x, q, d, 10);
    for (double bits : {4.0, 2.0}) {
      tq::Index idx(cfg_of(d, bits, m));
      idx.add(n, x.data());
      ASSERT_EQ(idx.size(), n);
      auto r = run(idx, q, 10);
      const double rec = recall1(r, 10, gt, 10, 10);
      EXPECT_GE(rec, bits == 4 ? kMinRecall1at10_4bit : kMinRecall1at10_2bit)
          << tq::metric_name(m) << " bits " << bits;
      // Scores are sorted best first and consistent with the metric direction.
      for (size_t i = 0; i < nq; ++i)
        for (int j = 1; j < 10; ++j) {
          if (m == tq::Metric::l2) EXPECT_LE(r.s[i * 10 + j - 1], r.s[i * 10 + j]);
          else EXPECT_GE(r.s[i * 10 + j - 1], r.s[i * 10 + j]);
        }
    }
  }
}

// lut_u8, the uint8 LUTs' rounding without a library call, against its reference: nearbyint,
// then clamped to [0, 255], NaN to 0; for every kind of float (ties, out of range, huge, inf,
// NaN, random ones).
TEST(Index, LutRoundingEqualsNearbyint) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> xs = {0.f, -0.f, 0.5f, 1.5f, 2.5f, 254.5f, 255.f, 255.5f, 256.f, -0.5f, -0.49f, -1.5f,
                           0.49999997f, 4194304.5f, 8388607.f, 1e30f, -1e30f, inf, -inf,
                           std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::quiet_NaN()};
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> small(-10.f, 270.f), big(-1e7f, 1e7f);
  for (int i = 0; i < 200000; ++i) xs.push_back(i % 8 ? small(rng) : big(rng));
  for (int i = -20; i <= 530; ++i) xs.push_back(static_cast<float>(i) / 2.f);  // every half-integer tie
  for (float x : xs) {
    const float r = std::nearbyint(x);
    const uint8_t want = r >= 0.f ? static_cast<uint8_t>(std::min(r, 255.f)) : uint8_t{0};
    EXPECT_EQ(tq::lut_u8(x), want) << x;
  }
}

// The uint8 LUT kernel gives its reference's bytes at every SIMD level: fast-layout (16) and
// trellis (256) table sizes and one no vector width divides, ordinary tables and tables with
// NaN, inf, -0 and values far out of range.
TEST(Index, LutToU8EqualsScalarReference) {
  tq::Rng rng(9);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t st : {16u, 256u, 12u}) {
    for (bool special : {false, true}) {
      const size_t m = 37;
      std::vector<float> lut(m * st), mins(m);
      for (auto& v : lut) v = static_cast<float>(rng.uniform() * 8.0 - 4.0);
      for (size_t g = 0; g < m; ++g) mins[g] = *std::min_element(lut.begin() + g * st, lut.begin() + (g + 1) * st);
      float range = 0;
      for (size_t g = 0; g < m; ++g)
        range = std::max(range, *std::max_element(lut.begin() + g * st, lut.begin() + (g + 1) * st) - mins[g]);
      if (special) {
        const float odd[] = {nan, inf, -inf, -0.f, 1e30f, -1e30f, 0.5f, mins[3] + range * 0.5f / 255.f};
        for (size_t i = 0; i < 40; ++i) lut[rng.below(lut.size())] = odd[i % 8];
        mins[5] = nan;
        mins[6] = -inf;
      }
      std::vector<uint8_t> ref(m * st), got(m * st);
      tq::lut_to_u8_ref(m, st, lut.data(), mins.data(), 255.f / range, ref.data());
      for (const auto& level : tq::simd::available_levels()) {
        tq::simd::ScopedLevel sl(level);
        std::fill(got.begin(), got.end(), uint8_t{77});
        tq::lut_to_u8(m, st, lut.data(), mins.data(), 255.f / range, got.data());
        EXPECT_EQ(got, ref) << "level " << level << " st " << st << (special ? " with NaN / inf" : "");
      }
    }
  }
}

// The coarse step's skip to the next score at or above the bar: the reference's index at every
// SIMD level, for lengths around the vector widths, with NaN, infinities and signed zeros in the
// scores and as the bar.
namespace {

// Scores for the search kernels' tests: n values in [-1, 1), and with odd about n / 4 + 1 of
// them replaced by NaN, infinities, signed zeros or +-1e30.
std::vector<float> kernel_test_scores(tq::Rng& rng, size_t n, bool odd) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float odds[] = {nan, inf, -inf, -0.f, 0.f, 1e30f, -1e30f};
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.uniform() * 2.0 - 1.0);
  if (odd)
    for (size_t i = 0; i < n / 4 + 1 && n > 0; ++i) v[rng.below(n)] = odds[rng.below(7)];
  return v;
}

// Bars to test scores v against: above and below everything, NaN, infinities, signed zeros, and
// 4 of the entries plus shift (a hit there or earlier).
std::vector<float> kernel_test_bars(tq::Rng& rng, const std::vector<float>& v, float shift) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> bars = {2.f, -2.f, nan, inf, -inf, 0.f, -0.f};
  for (int b = 0; b < 4 && !v.empty(); ++b) bars.push_back(v[rng.below(v.size())] + shift);
  return bars;
}

}  // namespace

TEST(Index, FirstAtLeastEqualsScalarReference) {
  tq::Rng rng(10);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t n : {0u, 1u, 3u, 7u, 8u, 15u, 16u, 17u, 31u, 33u, 64u, 100u, 4096u}) {
    for (int trial = 0; trial < 20; ++trial) {
      const std::vector<float> v = kernel_test_scores(rng, n, trial % 2 == 1);
      for (float thr : kernel_test_bars(rng, v, 0.f)) {
        const size_t ref = tq::first_at_least_ref(v.data(), n, thr);
        for (const auto& level : tq::simd::available_levels()) {
          tq::simd::ScopedLevel sl(level);
          EXPECT_EQ(tq::first_at_least(v.data(), n, thr), ref) << "level " << level << " n " << n << " bar " << thr;
        }
      }
    }
  }
  // Exactly: the first index at or above, n when none.
  const std::vector<float> v = {0.5f, nan, 1.f, 3.f, 1.f};
  EXPECT_EQ(tq::first_at_least_ref(v.data(), v.size(), 1.f), 2u);
  EXPECT_EQ(tq::first_at_least_ref(v.data(), v.size(), 2.f), 3u);
  EXPECT_EQ(tq::first_at_least_ref(v.data(), v.size(), 4.f), 5u);
  EXPECT_EQ(tq::first_at_least_ref(v.data(), v.size(), nan), 5u);
  EXPECT_EQ(tq::first_at_least(v.data(), v.size(), 1.f), 2u);
}

TEST(Index, MaskAtLeastEqualsScalarReference) {
  tq::Rng rng(11);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t n : {0u, 1u, 5u, 8u, 15u, 16u, 17u, 31u, 32u}) {
    for (int trial = 0; trial < 40; ++trial) {
      const std::vector<float> v = kernel_test_scores(rng, n, trial % 2 == 1);
      const std::vector<float> bars = kernel_test_bars(rng, v, 0.25f);
      for (float off : {0.f, -0.f, 0.25f, -1e30f, inf, nan})  // -0: the flat scan's offset
        for (float thr : bars) {
          const uint32_t ref = tq::mask_at_least_ref(v.data(), n, off, thr);
          for (const auto& level : tq::simd::available_levels()) {
            tq::simd::ScopedLevel sl(level);
            EXPECT_EQ(tq::mask_at_least(v.data(), n, off, thr), ref)
                << "level " << level << " n " << n << " off " << off << " bar " << thr;
          }
        }
    }
  }
  // Exactly: the bits of the scores at or above the bar after the offset; bit 31 reachable.
  std::vector<float> v(32, 0.f);
  v[0] = 1.f, v[3] = 0.5f, v[31] = 2.f, v[7] = nan;
  EXPECT_EQ(tq::mask_at_least_ref(v.data(), 32, 0.5f, 1.f), (1u << 0) | (1u << 3) | (1u << 31));
  EXPECT_EQ(tq::mask_at_least(v.data(), 32, 0.5f, 1.f), (1u << 0) | (1u << 3) | (1u << 31));
  EXPECT_EQ(tq::mask_at_least(v.data(), 32, 0.f, 1.5f), 1u << 31);
}

// The scan's best-R selection keeps the best R of everything pushed (higher score first, then the
// lower index), whatever the order of the pushes, equal scores and replacements included.
TEST(Index, TopRKeepsTheBestInOneTotalOrder) {
  tq::Rng rng(12);
  for (size_t cap : {1u, 2u, 3u, 10u, 26u, 100u}) {
    for (int trial = 0; trial < 20; ++trial) {
      const size_t n = cap * (1 + rng.below(8)) + rng.below(5);
      std::vector<std::pair<float, uint32_t>> all(n);
      for (size_t i = 0; i < n; ++i)  // few distinct scores: many ties, decided by the index
        all[i] = {static_cast<float>(rng.below(trial % 2 ? 4 : 1000)), static_cast<uint32_t>(i)};
      std::vector<std::pair<float, uint32_t>> order = all;
      for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
      tq::TopR t;
      t.reset(cap);
      for (const auto& e : order) t.push(e.first, e.second);
      // The scans' way in: blocks of up to 32 slots in slot order through offer_block, the
      // scores offset by -0 (nothing) and by 0.5 (every score 0.5 higher, the same order).
      std::vector<float> sc(n);
      for (size_t i = 0; i < n; ++i) sc[i] = all[i].first;
      tq::TopR tb, th;
      tb.reset(cap);
      th.reset(cap);
      for (size_t b0 = 0; b0 < n; b0 += 32) {
        const size_t len = std::min<size_t>(32, n - b0);
        const float mx = *std::max_element(sc.begin() + b0, sc.begin() + b0 + len);
        tb.offer_block(sc.data() + b0, len, -0.f, mx, static_cast<uint32_t>(b0));
        th.offer_block(sc.data() + b0, len, 0.5f, mx, static_cast<uint32_t>(b0));
      }
      std::sort(all.begin(), all.end(), tq::TopR::cmp);
      all.resize(std::min(cap, n));
      ASSERT_EQ(t.sorted(), all) << "cap " << cap << " n " << n;
      ASSERT_EQ(tb.sorted(), all) << "blocks, cap " << cap << " n " << n;
      auto shifted = all;
      for (auto& e : shifted) e.first += 0.5f;
      ASSERT_EQ(th.sorted(), shifted) << "blocks + 0.5, cap " << cap << " n " << n;
      if (n >= cap) {
        EXPECT_EQ(t.threshold, all.back().first);
        EXPECT_EQ(t.threshold_id, all.back().second);
      }
    }
  }
}

TEST(Index, FastScanKernelEqualsScalarReference) {
  tq::Rng rng(7);
  for (size_t mg : {4u, 8u, 28u, 100u, 1100u}) {  // 1100 groups: > 256 iterations, flushes
    const size_t nb = 5;
    std::vector<uint8_t> codes(nb * mg * 16), lut(mg * 16);
    for (auto& c : codes) c = static_cast<uint8_t>(rng.below(256));
    for (auto& t : lut) t = static_cast<uint8_t>(rng.below(256));
    // Extremes: all-0xFF codes in one block, max LUT entries.
    std::fill(codes.begin(), codes.begin() + mg * 16, 0xFF);
    std::fill(lut.begin(), lut.begin() + 16, 255);
    std::vector<uint32_t> ref(nb * 32), got(nb * 32);
    tq::fast_scan_u8_ref(nb, mg, codes.data(), lut.data(), ref.data());
    for (const auto& level : tq::simd::available_levels()) {
      tq::simd::ScopedLevel sl(level);
      std::fill(got.begin(), got.end(), 0xDEADBEEF);
      tq::fast_scan_u8(nb, mg, codes.data(), lut.data(), got.data());
      EXPECT_EQ(got, ref) << "level " << level << " groups " << mg;
    }
  }
}

// The vector layout's transpose into the fast layout equals its reference at every SIMD level,
// and the reference is the fast layout itself: scanning the transposed blocks gives the sums of
// the vectors' own codes. Group counts below one register (the byte-by-byte tail), between,
// and several registers with a tail (d = 784's 784 groups).
TEST(Index, VectorToFastLayoutEqualsScalarReference) {
  tq::Rng rng(11);
  for (size_t mg : {4u, 12u, 28u, 128u, 136u, 784u}) {
    const size_t nb = 3, vb = mg / 2;
    std::vector<uint8_t> vec(nb * 32 * vb), lut(mg * 16);
    for (auto& c : vec) c = static_cast<uint8_t>(rng.below(256));
    for (auto& t : lut) t = static_cast<uint8_t>(rng.below(256));
    std::vector<uint8_t> ref(nb * mg * 16), got(nb * mg * 16);
    tq::vector_to_fast_layout_ref(nb, mg, vec.data(), ref.data());
    // The reference against its definition: the fast scan of its blocks is each vector's LUT sum.
    std::vector<uint32_t> acc(nb * 32);
    tq::fast_scan_u8_ref(nb, mg, ref.data(), lut.data(), acc.data());
    for (size_t v = 0; v < nb * 32; ++v) {
      uint32_t s = 0;
      for (size_t g = 0; g < mg; ++g) s += lut[g * 16 + ((vec[v * vb + g / 2] >> ((g & 1) * 4)) & 15)];
      ASSERT_EQ(acc[v], s) << "vector " << v << " groups " << mg;
    }
    for (const auto& level : tq::simd::available_levels()) {
      tq::simd::ScopedLevel sl(level);
      std::fill(got.begin(), got.end(), uint8_t{0xA5});
      tq::vector_to_fast_layout(nb, mg, vec.data(), got.data());
      EXPECT_EQ(got, ref) << "level " << level << " groups " << mg;
    }
  }
}

// The vector layout's dot product in 16 partial sums equals its reference bit for bit at every
// SIMD level, for 4-bit and 3-bit packed codes (3 bits: the 16-channel steps start at every bit
// offset), ranges that start and end off a multiple of 16 (a 3.5-bit index's second segment
// starts at (d + 1) / 2), shorter than 16, and empty; the codes are copied to a buffer of their
// exact size (no byte past them is read: ASan); and the reference is the dot product (to float
// rounding).
TEST(Index, CodeDotLanesEqualsScalarReference) {
  tq::Rng rng(12);
  const size_t d = 800;
  std::vector<float> y(d);
  for (auto& v : y) v = static_cast<float>(rng.normal());
  std::array<float, 16> cent{};
  for (auto& c : cent) c = static_cast<float>(rng.normal());
  const std::vector<std::pair<size_t, size_t>> ranges = {{0, 800}, {0, 392}, {392, 784}, {5, 11},  {3, 797},
                                                         {1, 800}, {2, 799}, {7, 700}, {16, 32}, {0, 0}};
  for (const int bits : {4, 3}) {
    for (const auto& [g0, g1] : ranges) {
      std::vector<uint8_t> idx(g1 - g0);
      for (auto& c : idx) c = static_cast<uint8_t>(rng.below(1u << bits));
      std::vector<uint8_t> codes(tq::packed_bytes(idx.size(), bits));
      tq::pack_bits(idx.size(), bits, idx.data(), codes.data());
      float ref[16], got[16];
      for (size_t l = 0; l < 16; ++l) ref[l] = static_cast<float>(l) * 0.25f;  // a sum carried in
      tq::code_dot_lanes_ref(g0, g1, bits, y.data(), codes.data(), cent.data(), ref);
      double exact = 0;
      for (size_t l = 0; l < 16; ++l) exact += static_cast<double>(l) * 0.25;
      for (size_t g = g0; g < g1; ++g) exact += static_cast<double>(y[g]) * cent[idx[g - g0]];
      EXPECT_NEAR(tq::reduce_lanes16(ref), exact, 1e-3) << g0 << ".." << g1;
      for (const auto& level : tq::simd::available_levels()) {
        tq::simd::ScopedLevel sl(level);
        for (size_t l = 0; l < 16; ++l) got[l] = static_cast<float>(l) * 0.25f;
        tq::code_dot_lanes(g0, g1, bits, y.data(), codes.data(), cent.data(), got);
        for (size_t l = 0; l < 16; ++l)
          EXPECT_EQ(std::memcmp(&got[l], &ref[l], sizeof(float)), 0)
              << "level " << level << " lane " << l << " range " << g0 << ".." << g1 << " bits " << bits;
      }
    }
  }
}

// 3-bit codes widened to nibbles (a register of 64-bit words, then word by word) equal the
// reference at every SIMD level, and the reference is unpack_bits' indices, for counts below,
// at and past a register (16 indices a 64-bit lane) with tails of whole words and fewer, odd and
// even; the input is exactly packed_bytes long (no byte past it is read: ASan) and nothing past
// (n + 1) / 2 output bytes is written.
TEST(Index, Bits3ToNibblesEqualsScalarReference) {
  tq::Rng rng(13);
  for (size_t n : {0u, 1u, 2u, 15u, 16u, 17u, 32u, 47u, 127u, 128u, 129u, 150u, 256u, 392u, 784u, 801u, 1000u}) {
    std::vector<uint8_t> idx(n);
    for (auto& c : idx) c = static_cast<uint8_t>(rng.below(8));
    std::vector<uint8_t> in(tq::packed_bytes(n, 3));
    tq::pack_bits(n, 3, idx.data(), in.data());
    std::vector<uint8_t> ref((n + 1) / 2 + 1, 0xA5), got(ref.size(), 0xA5);
    tq::bits3_to_nibbles_ref(n, in.data(), ref.data());
    for (size_t t = 0; t < n; ++t) ASSERT_EQ((ref[t / 2] >> ((t & 1) * 4)) & 15, idx[t]) << n << " " << t;
    if (n % 2 == 1) EXPECT_EQ(ref[n / 2] >> 4, 0) << n;
    EXPECT_EQ(ref.back(), 0xA5) << n;
    for (const auto& level : tq::simd::available_levels()) {
      tq::simd::ScopedLevel sl(level);
      std::fill(got.begin(), got.end(), uint8_t{0xA5});
      tq::bits3_to_nibbles(n, in.data(), got.data());
      EXPECT_EQ(got, ref) << "level " << level << " n " << n;
    }
  }
}

// derive_block (the sign plane and the factors an index derives from its codes) equals its
// reference at every SIMD level, bit for bit: one-channel groups at 3 and 4 bits over two
// segments (a 3.5-bit index: tables 0 and 1) with and without IVF's list centroid, d not a
// multiple of 4 (the plane's last row written at j = d - 1), no plane (IVF's l2 list terms
// alone, groups of two 2-bit digits), and sums that start nonzero; and the reference is what
// the definition says, slot by slot.
TEST(Index, DeriveBlockEqualsScalarReference) {
  tq::Rng rng(14);
  std::vector<float> tabs(96);
  for (auto& t : tabs) t = static_cast<float>(rng.normal());
  for (const size_t d : {1u, 4u, 7u, 64u, 197u, 784u}) {
    for (const int bits : {2, 3, 4}) {
      // Digits: one channel a row (3, 4 bits; the second half on table 1), or two 2-bit digits a row.
      std::vector<tq::PlaneDigit> dg;
      for (size_t j = 0; j < d; ++j) {
        tq::PlaneDigit p;
        p.row = static_cast<uint32_t>(bits == 2 ? j / 2 : j);
        p.j = static_cast<uint32_t>(j);
        p.sh = static_cast<uint8_t>(bits == 2 ? (j % 2) * 2 : 0);
        p.mask = static_cast<uint8_t>((1u << bits) - 1);
        p.top = static_cast<uint8_t>(bits - 1);
        p.tab = static_cast<uint8_t>(bits != 2 && j >= (d + 1) / 2 ? 1 : 0);
        dg.push_back(p);
      }
      const size_t rows = bits == 2 ? (d + 1) / 2 : d;
      std::vector<uint8_t> fb(rows * 16);
      for (auto& b : fb) b = static_cast<uint8_t>(rng.below(256));
      std::vector<float> rc(d);
      for (auto& v : rc) v = static_cast<float>(rng.normal());
      for (const bool plane : {true, false}) {
        if (plane && bits == 2) continue;
        for (const bool ivf : {true, false}) {
          if (!plane && !ivf) continue;
          const size_t cbytes = (d + 3) / 4 * 16;
          std::array<float, 32> cc0{}, ca0{}, ct0{}, cu0{};
          for (size_t v = 0; v < 32; ++v) cc0[v] = ca0[v] = ct0[v] = cu0[v] = static_cast<float>(v) * 0.25f;
          auto cc = cc0, ca = ca0, ct = ct0, cu = cu0;
          std::vector<uint8_t> cb(cbytes + 16, 0xA5);
          tq::derive_block_ref(fb.data(), dg.size(), dg.data(), tabs.data(), ivf ? rc.data() : nullptr, d, cc.data(),
                               ca.data(), ct.data(), cu.data(), plane ? cb.data() : nullptr);
          // The definition, slot by slot, in channel order.
          for (size_t v = 0; v < 32; ++v) {
            float ecc = cc0[v], eca = ca0[v], ect = ct0[v], ecu = cu0[v];
            std::vector<unsigned> sgn(d);
            for (const auto& p : dg) {
              const uint8_t byte = fb[p.row * 16 + v % 16];
              const unsigned c = ((v < 16 ? byte & 15u : byte >> 4) >> p.sh) & p.mask;
              const float* t = tabs.data() + 48 * p.tab;
              sgn[p.j] = c >> p.top;
              if (plane) {
                ecc += t[c];
                eca += t[16 + c];
              }
              if (ivf) {
                ect += rc[p.j] * t[32 + c];
                if (plane) ecu += sgn[p.j] ? rc[p.j] : -rc[p.j];
              }
            }
            ASSERT_EQ(cc[v], ecc) << d << " " << bits << " " << v;
            ASSERT_EQ(ca[v], eca);
            ASSERT_EQ(ct[v], ect);
            ASSERT_EQ(cu[v], ecu);
            if (!plane) continue;
            for (size_t j = 0; j < d; ++j) {
              const uint8_t nib = static_cast<uint8_t>((cb[(j / 4) * 16 + v % 16] >> (v < 16 ? 0 : 4)) & 15);
              ASSERT_EQ((nib >> (j % 4)) & 1u, sgn[j]) << d << " " << bits << " " << v << " " << j;
            }
            for (size_t j = d; j % 4 != 0; ++j)  // the last row's unused channels: 0
              ASSERT_EQ((cb[(j / 4) * 16 + v % 16] >> ((v < 16 ? 0 : 4) + j % 4)) & 1u, 0u);
          }
          if (plane) EXPECT_EQ(cb[cbytes], 0xA5) << "past the plane";
          for (const auto& level : tq::simd::available_levels()) {
            tq::simd::ScopedLevel sl(level);
            auto gcc = cc0, gca = ca0, gct = ct0, gcu = cu0;
            std::vector<uint8_t> gcb(cb.size(), 0xA5);
            tq::derive_block(fb.data(), dg.size(), dg.data(), tabs.data(), ivf ? rc.data() : nullptr, d, gcc.data(),
                             gca.data(), gct.data(), gcu.data(), plane ? gcb.data() : nullptr);
            EXPECT_EQ(gcc, cc) << "level " << level << " d " << d << " bits " << bits;
            EXPECT_EQ(gca, ca) << "level " << level;
            EXPECT_EQ(gct, ct) << "level " << level;
            EXPECT_EQ(gcu, cu) << "level " << level;
            if (plane) EXPECT_EQ(gcb, cb) << "level " << level;
          }
        }
      }
    }
  }
}

// The trellis scan (256-entry byte tables, blocks of 64 vectors) equals its reference at every
// SIMD level (AVX3_DL's byte permutes; the 16-entry shuffles of the XOR-differenced table rows
// on AVX3, AVX2 and SSE4): channel counts with and without a uint16 flush (> 256 channels),
// extreme indices and entries.
TEST(Index, TrellisScanKernelEqualsScalarReference) {
  tq::Rng rng(8);
  for (size_t d : {1u, 7u, 100u, 256u, 300u, 784u}) {
    const size_t nb = 3;
    std::vector<uint8_t> codes(nb * d * 64), lut(d * 256);
    for (auto& c : codes) c = static_cast<uint8_t>(rng.below(256));
    for (auto& t : lut) t = static_cast<uint8_t>(rng.below(256));
    std::fill(codes.begin(), codes.begin() + d * 64, 0xFF);  // block 0: index 255 everywhere
    for (size_t j = 0; j < d; ++j) lut[j * 256 + 255] = 255;
    std::vector<uint32_t> ref(nb * 64), got(nb * 64);
    tq::trellis_scan_u8_ref(nb, d, codes.data(), lut.data(), ref.data());
    EXPECT_EQ(ref[0], 255u * d);
    for (const auto& level : tq::simd::available_levels()) {
      tq::simd::ScopedLevel sl(level);
      std::fill(got.begin(), got.end(), 0xDEADBEEF);
      tq::trellis_scan_u8(nb, d, codes.data(), lut.data(), got.data());
      EXPECT_EQ(got, ref) << "level " << level << " channels " << d;
    }
  }
}

// The multi-table kernel (one pass over the codes for several LUTs, 4 at a time with AVX-512, 2
// on other x86 targets) gives each table exactly the single-table reference's sums: 1 to 9 tables
// (whole passes and a rest),
// every SIMD level, group counts with and without flushes, extreme codes and entries.
TEST(Index, FastScanMultiKernelEqualsScalarReference) {
  tq::Rng rng(8);
  for (size_t mg : {4u, 8u, 100u, 1100u})
    for (size_t nq : {1u, 2u, 3u, 4u, 5u, 9u}) {
      const size_t nb = 3;
      std::vector<uint8_t> codes(nb * mg * 16), luts(nq * mg * 16);
      for (auto& c : codes) c = static_cast<uint8_t>(rng.below(256));
      for (auto& t : luts) t = static_cast<uint8_t>(rng.below(256));
      std::fill(codes.begin(), codes.begin() + mg * 16, 0xFF);
      std::fill(luts.begin(), luts.begin() + mg * 16, 255);
      std::vector<std::vector<uint32_t>> ref(nq, std::vector<uint32_t>(nb * 32)), got = ref;
      std::vector<const uint8_t*> lp(nq);
      std::vector<uint32_t*> op(nq);
      for (size_t i = 0; i < nq; ++i) {
        lp[i] = luts.data() + i * mg * 16;
        tq::fast_scan_u8_ref(nb, mg, codes.data(), lp[i], ref[i].data());
      }
      for (const auto& level : tq::simd::available_levels()) {
        tq::simd::ScopedLevel sl(level);
        for (size_t i = 0; i < nq; ++i) {
          std::fill(got[i].begin(), got[i].end(), 0xDEADBEEF);
          op[i] = got[i].data();
        }
        tq::fast_scan_u8_multi(nb, mg, codes.data(), nq, lp.data(), op.data());
        for (size_t i = 0; i < nq; ++i)
          EXPECT_EQ(got[i], ref[i]) << "level " << level << " groups " << mg << " tables " << nq << " table " << i;
      }
    }
}

TEST(Index, FastScanSearchEqualsFloatLutSearch) {
  // With every vector re-ranked, the fast path's final scores are the exact float-LUT scores.
  const int d = 100;
  const size_t n = 700, nq = 20;
  auto x = make_data(n, d, 3), q = make_data(nq, d, 4);
  for (double bits : {1.0, 2.0, 2.5, 3.0, 4.0}) {
    tq::Index idx(cfg_of(d, bits, tq::Metric::cosine));
    idx.add(n, x.data());
    tq::SearchParams pf;
    pf.rerank = static_cast<int>(n);
    tq::SearchParams ps;
    ps.fast_scan = false;
    auto a = run(idx, q, 10, pf), b = run(idx, q, 10, ps);
    EXPECT_EQ(a.id, b.id) << bits;
    EXPECT_EQ(a.s, b.s) << bits;
    // Approximate (uint8) scores are close to the float ones.
    tq::SearchParams p0;
    p0.rerank = 0;
    auto c = run(idx, q, 1, p0);
    for (size_t i = 0; i < nq; ++i) EXPECT_NEAR(c.s[i], b.s[i * 10], 0.02) << bits;
    // Every SIMD level gives the same results.
    for (const auto& level : tq::simd::available_levels()) {
      tq::simd::ScopedLevel sl(level);
      auto e = run(idx, q, 10);
      auto base = run(idx, q, 10);
      EXPECT_EQ(e.id, base.id);
    }
  }
}

TEST(Index, EveryWidthAndScaleMode) {
  const int d = 48;
  const size_t n = 1500, nq = 60;
  auto x = make_data(n, d, 5, 0.6f), q = make_data(nq, d, 6, 0.6f);
  auto gt = exact(tq::Metric::ip, x, q, d, 1);
  std::vector<double> rec;
  const std::vector<double> widths = {1, 1.5, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8};
  for (double bits : widths) {
    tq::Index idx(cfg_of(d, bits, tq::Metric::ip));
    idx.add(n, x.data());
    auto r = run(idx, q, 8);
    rec.push_back(recall1(r, 8, gt, 1, 1));
    // The record size follows the width: 2 bytes of f16 scale + packed channels.
    size_t expect = 2;
    if (bits == std::floor(bits)) expect += (static_cast<size_t>(d) * static_cast<int>(bits) + 7) / 8;
    else expect += (24 * static_cast<size_t>(bits + 0.5) + 7) / 8 + (24 * static_cast<size_t>(bits - 0.5) + 7) / 8;
    EXPECT_EQ(idx.code_bytes(), expect) << bits;
  }
  // Recall@1@1 grows with width (allowing small noise between neighbours).
  EXPECT_LT(rec.front() + 0.2, rec.back());
  for (size_t i = 2; i < rec.size(); ++i) EXPECT_GE(rec[i] + 0.1, rec[i - 2]) << widths[i];
  EXPECT_GE(rec.back(), 0.9);
  for (auto mode : {tq::ScaleMode::plain, tq::ScaleMode::corrected, tq::ScaleMode::eden, tq::ScaleMode::lsq}) {
    auto c = cfg_of(d, 3, tq::Metric::ip);
    c.scale = mode;
    tq::Index idx(c);
    idx.add(n, x.data());
    EXPECT_GE(recall1(run(idx, q, 8), 8, gt, 1, 8), 0.9) << tq::scale_mode_name(mode);
  }
}

TEST(Index, CenterAndFitScaleKeepRecallAndScores) {
  // Centred / fitted codes estimate the same inner products: compare against exact scores.
  const int d = 64;
  const size_t n = 1500, nq = 50;
  auto x = make_data(n, d, 30), q = make_data(nq, d, 31);
  for (auto m : {tq::Metric::ip, tq::Metric::cosine, tq::Metric::l2}) {
    auto gt = exact(m, x, q, d, 1);
    for (int variant = 0; variant < 3; ++variant) {
      auto c = cfg_of(d, 4, m);
      c.center = variant != 1;
      c.fit_scale = variant != 0;
      tq::Index idx(c);
      idx.add(700, x.data());
      idx.add(n - 700, x.data() + 700 * d);  // the centre comes from the first batch
      auto r = run(idx, q, 10);
      EXPECT_GE(recall1(r, 10, gt, 1, 10), kMinRecall1at10_4bit) << tq::metric_name(m) << variant;
      // The returned score of the top hit is close to its exact score.
      auto all = exact(m, x, q, d, static_cast<int>(n));
      for (size_t i = 0; i < nq; ++i) {
        const int64_t id = r.id[i * 10];
        float ex = 0;
        for (size_t j = 0; j < n; ++j)
          if (all.id[i * n + j] == id) ex = all.s[i * n + j];
        // l2: the error of -2<q, x> is relative to ||q||^2 + ||x||^2, not to the distance.
        double qq = 0;
        for (int j = 0; j < d; ++j) qq += q[i * d + j] * q[i * d + j];
        const double tol = m == tq::Metric::l2 ? 0.05 * qq : 0.05 * (1 + std::fabs(ex));
        EXPECT_NEAR(r.s[i * 10], ex, tol) << tq::metric_name(m) << variant;
      }
    }
  }
}

TEST(Index, IdsBatchesAndFewerThanK) {
  const int d = 32;
  auto x = make_data(300, d, 8), q = make_data(10, d, 9);
  std::vector<int64_t> ids(300);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(1) << 40 | static_cast<int64_t>(i * 3);
  tq::Index one(cfg_of(d, 4, tq::Metric::l2)), parts(cfg_of(d, 4, tq::Metric::l2));
  one.add(300, x.data(), ids.data());
  parts.add(7, x.data(), ids.data());
  parts.add(100, x.data() + 7 * d, ids.data() + 7);
  parts.add(193, x.data() + 107 * d, ids.data() + 107);
  auto a = run(one, q, 5), b = run(parts, q, 5);
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.s, b.s);
  for (auto id : a.id) EXPECT_EQ(id >> 40, 1);
  // k larger than the index: missing results are -1 / +inf.
  tq::Index tiny(cfg_of(d, 4, tq::Metric::l2));
  tiny.add(3, x.data());
  auto t = run(tiny, q, 5);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(t.id[i * 5 + 3], -1);
    EXPECT_TRUE(std::isinf(t.s[i * 5 + 4]));
    std::set<int64_t> got(t.id.begin() + i * 5, t.id.begin() + i * 5 + 3);
    EXPECT_EQ(got, (std::set<int64_t>{0, 1, 2}));
  }
  // Empty index.
  tq::Index empty(cfg_of(d, 4, tq::Metric::l2));
  auto e = run(empty, q, 2);
  for (auto id : e.id) EXPECT_EQ(id, -1);
}

TEST(Index, ZeroVectorsScoreZeroUnderCosine) {
  const int d = 16;
  std::vector<float> x(3 * d, 0.f);
  for (int j = 0; j < d; ++j) x[2 * d + j] = 1.f;
  tq::Index idx(cfg_of(d, 4, tq::Metric::cosine));
  idx.add(3, x.data());
  std::vector<float> q(d, 1.f);
  auto r = run(idx, q, 3);
  EXPECT_EQ(r.id[0], 2);
  EXPECT_NEAR(r.s[0], 1.0, 0.02);
  EXPECT_EQ(r.s[1], 0.f);
  EXPECT_EQ(r.s[2], 0.f);
}

TEST(Index, KeepVectorsRerankFullIsExact) {
  const int d = 40;
  const size_t n = 800, nq = 50;
  auto x = make_data(n, d, 10), q = make_data(nq, d, 11);
  for (auto m : {tq::Metric::cosine, tq::Metric::l2}) {
    auto c = cfg_of(d, 2, m);
    c.keep_vectors = true;
    tq::Index idx(c);
    idx.add(n, x.data());
    tq::SearchParams p;
    p.rerank_full = 100;
    auto r = run(idx, q, 5, p);
    auto gt = exact(m, x, q, d, 5);
    EXPECT_GE(recall1(r, 5, gt, 5, 1), 0.98);
    for (size_t i = 0; i < nq; ++i)
      if (r.id[i * 5] == gt.id[i * 5]) EXPECT_NEAR(r.s[i * 5], gt.s[i * 5], 1e-3 * (1 + std::fabs(gt.s[i * 5])));
  }
  tq::Index nokeep(cfg_of(d, 2, tq::Metric::l2));
  nokeep.add(n, x.data());
  tq::SearchParams p;
  p.rerank_full = 10;
  std::vector<float> s(5 * nq);
  std::vector<int64_t> id(5 * nq);
  EXPECT_THROW(nokeep.search(nq, q.data(), p, s.data(), id.data()), tq::Error);
}

TEST(Index, ProdCodecForComparison) {
  const int d = 64;
  const size_t n = 1500, nq = 60;
  auto x = make_data(n, d, 12), q = make_data(nq, d, 13);
  auto gt = exact(tq::Metric::ip, x, q, d, 1);
  auto c = cfg_of(d, 4, tq::Metric::ip);
  c.codec = tq::QuantizerKind::prod;
  tq::Index idx(c);
  idx.add(n, x.data());
  EXPECT_GE(recall1(run(idx, q, 10), 10, gt, 1, 10), 0.9);
  c.bits = 2.5;
  EXPECT_THROW(tq::Index bad(c), tq::Error);
}

TEST(Index, BadInputsRejected) {
  const int d = 16;
  auto x = make_data(50, d, 14);
  tq::Index idx(cfg_of(d, 4, tq::Metric::cosine));
  idx.add(50, x.data());
  std::vector<float> q(2 * d, 0.5f), s(20);
  std::vector<int64_t> id(20);
  tq::SearchParams p;
  EXPECT_NO_THROW(idx.search(2, d, q.data(), p, s.data(), id.data()));
  EXPECT_THROW(idx.search(2, d + 1, q.data(), p, s.data(), id.data()), tq::Error);  // wrong d
  q[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(idx.search(2, q.data(), p, s.data(), id.data()), tq::Error);
  q[5] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(idx.search(2, q.data(), p, s.data(), id.data()), tq::Error);
  q[5] = 0.5f;
  p.k = 0;
  EXPECT_THROW(idx.search(2, q.data(), p, s.data(), id.data()), tq::Error);
  // NaN in added data: rejected, index unchanged.
  auto bad = x;
  bad[3 * d + 1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(idx.add(50, bad.data()), tq::Error);
  EXPECT_EQ(idx.size(), 50u);
  // Bad configurations.
  EXPECT_THROW(tq::Index(cfg_of(1, 4, tq::Metric::ip)), tq::Error);
  EXPECT_THROW(tq::Index(cfg_of(16, 0, tq::Metric::ip)), tq::Error);
  EXPECT_THROW(tq::Index(cfg_of(16, 9, tq::Metric::ip)), tq::Error);
  EXPECT_THROW(tq::Index(cfg_of(16, 2.25, tq::Metric::ip)), tq::Error);
  EXPECT_THROW(tq::parse_metric("hamming"), tq::Error);
  // f16 norm overflow: clear error, f32 works.
  std::vector<float> big(d, 1e5f);
  tq::Index ipx(cfg_of(d, 4, tq::Metric::ip));
  EXPECT_THROW(ipx.add(1, big.data()), tq::Error);
  auto c32 = cfg_of(d, 4, tq::Metric::ip);
  c32.norm = tq::NormFormat::f32;
  tq::Index ip32(c32);
  EXPECT_NO_THROW(ip32.add(1, big.data()));
}

// Vectors of every scale an index takes (norm 0 or in [2^-100, 2^62]) give the results of the
// same vectors at unit scale (cosine: bit for bit the same ids; ip and l2: the same ids, the
// scores scaled), and a norm outside is a clear error naming the vector, never inf/NaN scores
// or a ranking of garbage (a query of norm 3e37 once gave NaN scores, a cosine query of norm
// 1e-29 the same ids for every query: its float sum of squares underflowed to 0).
TEST(Index, NormsFrom2PowMinus100To2Pow62AndClearErrorsOutside) {
  const int d = 32;
  const size_t n = 400, nq = 20;
  auto x = make_data(n, d, 15), q = make_data(nq, d, 16);
  auto scaled = [](std::vector<float> v, float f) {
    for (auto& e : v) e *= f;
    return v;
  };
  for (tq::Metric m : {tq::Metric::cosine, tq::Metric::ip, tq::Metric::l2})
    for (bool trellis : {false, true})
      for (int nlist : {0, 4}) {
        if (trellis && nlist) continue;
        auto c = cfg_of(d, 4, m);
        c.norm = tq::NormFormat::f32;
        c.trellis = trellis;
        c.nlist = nlist;
        tq::SearchParams p;
        p.nprobe = nlist ? nlist : 1;
        tq::Index ref(c);
        ref.add(n, x.data());
        const Results want = run(ref, q, 5, p);
        const std::string what = ref.describe();
        // Data and queries scaled by a power of two: the codes, ids and (scaled) scores of unit scale.
        for (float f : {0x1p-40f, 0x1p55f}) {
          if (m != tq::Metric::cosine && f < 1) continue;  // ip / l2: f32 norms keep any scale; see below
          tq::Index idx(c);
          auto xs = scaled(x, f), qs = scaled(q, f);
          idx.add(n, xs.data());
          const Results got = run(idx, qs, 5, p);
          EXPECT_EQ(got.id, want.id) << what << " scale " << f;
          const double unit = m == tq::Metric::cosine ? 1.0 : double(f) * f;  // ip, l2: scores of x f, q f
          for (size_t i = 0; i < got.s.size(); ++i) {
            ASSERT_TRUE(std::isfinite(got.s[i])) << what;
            EXPECT_NEAR(got.s[i] / unit, want.s[i], 1e-3 * (1 + std::fabs(want.s[i]))) << what << " scale " << f;
          }
        }
        // Cosine queries of any scale in range: the same results as the unit query.
        if (m == tq::Metric::cosine) {
          auto qs = scaled(q, 0x1p-90f);  // float squares underflow: the sum is taken in double
          EXPECT_EQ(run(ref, qs, 5, p).id, want.id) << what;
        }
        // Outside the range: errors naming the vector and the bound, the index unchanged.
        for (float f : {0x1p64f, 0x1p-110f}) {
          auto xs = x;
          for (int j = 0; j < d; ++j) xs[7 * d + j] *= f;
          tq::Index idx(c);
          try {
            idx.add(n, xs.data());
            ADD_FAILURE() << what << ": add of a vector of norm x " << f << " did not throw";
          } catch (const tq::Error& e) {
            EXPECT_NE(std::string(e.what()).find("vector 7 has norm"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(f > 1 ? "above the 2^62" : "below the 2^-100"), std::string::npos)
                << e.what();
          }
          EXPECT_EQ(idx.size(), 0u);
          auto qs = q;
          for (int j = 0; j < d; ++j) qs[3 * d + j] *= f;
          std::vector<float> sc(nq * 5);
          std::vector<int64_t> ids(nq * 5);
          p.k = 5;
          EXPECT_THROW(ref.search(nq, qs.data(), p, sc.data(), ids.data()), tq::Error) << what << " x " << f;
        }
      }
  // Zero vectors stay allowed (cosine: score 0 against everything).
  tq::Index z(cfg_of(d, 4, tq::Metric::cosine));
  std::vector<float> zero(2 * d, 0.f);
  EXPECT_NO_THROW(z.add(2, zero.data()));
  EXPECT_NO_THROW(run(z, zero, 1));
  // exact_search: the same range.
  std::vector<float> sc(5);
  std::vector<int64_t> ids(5);
  auto qb = scaled(q, 0x1p70f);
  EXPECT_THROW(tq::exact_search(tq::Metric::ip, n, d, x.data(), 1, qb.data(), 5, sc.data(), ids.data(), 1), tq::Error);
}

// ---------------------------------------------------------------------------------------

namespace {
std::vector<uint8_t> slurp(const std::string& p) { return tq::read_file_bytes(p); }
void st64(uint8_t* p, uint64_t v) { for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i)); }
void st32(uint8_t* p, uint32_t v) { for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i)); }
void fix_header_checksum(std::vector<uint8_t>& b) { st64(b.data() + 120, tq::checksum64(b.data(), 120)); }
tq::Index small_index(tq::Metric m = tq::Metric::l2, double bits = 2, bool keep = true, size_t n = 37,
                      bool center = false) {
  const int d = 12;
  auto x = make_data(n, d, 20);
  auto c = cfg_of(d, bits, m);
  c.keep_vectors = keep;
  c.center = center;
  tq::Index idx(c);
  idx.add(n, x.data());
  return idx;
}
}  // namespace

TEST(IndexIo, RoundTripGivesIdenticalResults) {
  TempDir t;
  const int d = 64;
  auto x = make_data(900, d, 21), q = make_data(30, d, 22);
  struct Case { tq::Metric m; double bits; tq::QuantizerKind codec; bool keep; tq::NormFormat nf; bool center; };
  const std::vector<Case> cases = {
      {tq::Metric::cosine, 4, tq::QuantizerKind::mse, false, tq::NormFormat::f16, false},
      {tq::Metric::cosine, 4, tq::QuantizerKind::mse, false, tq::NormFormat::f16, true},
      {tq::Metric::l2, 2.5, tq::QuantizerKind::mse, true, tq::NormFormat::f32, true},
      {tq::Metric::ip, 6, tq::QuantizerKind::mse, false, tq::NormFormat::f16, false},
      {tq::Metric::ip, 1, tq::QuantizerKind::mse, false, tq::NormFormat::f16, true},
      {tq::Metric::l2, 3, tq::QuantizerKind::prod, false, tq::NormFormat::f16, false},
  };
  for (const auto& cs : cases) {
    auto c = cfg_of(d, cs.bits, cs.m);
    c.codec = cs.codec;
    c.keep_vectors = cs.keep;
    c.norm = cs.nf;
    c.seed = 99;
    c.scale = tq::ScaleMode::eden;
    c.center = cs.center;
    c.fit_scale = cs.center;
    tq::Index idx(c);
    std::vector<int64_t> ids(900);
    for (size_t i = 0; i < 900; ++i) ids[i] = -static_cast<int64_t>(i) * 1000003;
    idx.add(900, x.data(), ids.data());
    idx.save(t.path("a.tqi"));
    EXPECT_EQ(tq::file_size(t.path("a.tqi")),
              128 + (cs.center ? 4 * d : 0) + 900 * (idx.code_bytes() + 8 + (cs.keep ? 4 * d : 0)));
    auto back = tq::Index::load(t.path("a.tqi"));
    EXPECT_EQ(back.size(), idx.size());
    EXPECT_EQ(back.describe(), idx.describe());
    tq::SearchParams p;
    p.rerank_full = cs.keep ? 20 : 0;
    auto a = run(idx, q, 10, p), b = run(back, q, 10, p);
    EXPECT_EQ(a.id, b.id) << idx.describe();
    EXPECT_EQ(a.s, b.s) << idx.describe();
    // Saving the loaded index reproduces the file byte for byte.
    back.save(t.path("b.tqi"));
    EXPECT_EQ(slurp(t.path("a.tqi")), slurp(t.path("b.tqi")));
  }
  // An empty index round-trips too.
  tq::Index empty(cfg_of(d, 4, tq::Metric::cosine));
  empty.save(t.path("e.tqi"));
  EXPECT_EQ(tq::Index::load(t.path("e.tqi")).size(), 0u);
}

TEST(IndexIo, TruncatedAtEveryOffsetRejected) {
  TempDir t;
  auto idx = small_index();
  idx.save(t.path("s.tqi"));
  auto b = slurp(t.path("s.tqi"));
  ASSERT_GT(b.size(), 128u + 37 * 8);
  for (size_t len = 0; len < b.size(); ++len)
    EXPECT_THROW(tq::Index::from_bytes(b.data(), len, "trunc"), tq::Error) << len;
  auto longer = b;
  longer.push_back(0);
  EXPECT_THROW(tq::Index::from_bytes(longer.data(), longer.size(), "long"), tq::Error);
  EXPECT_NO_THROW(tq::Index::from_bytes(b.data(), b.size(), "ok"));
}

TEST(IndexIo, FlippedBytesRejected) {
  TempDir t;
  auto idx = small_index(tq::Metric::cosine, 2.5, true, 20, true);
  idx.save(t.path("s.tqi"));
  const auto b = slurp(t.path("s.tqi"));
  for (size_t i = 0; i < b.size(); ++i)
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}}) {
      auto c = b;
      c[i] ^= mask;
      EXPECT_THROW(tq::Index::from_bytes(c.data(), c.size(), "flip"), tq::Error) << i;
    }
}

TEST(IndexIo, ForeignAndInconsistentHeadersRejected) {
  TempDir t;
  auto idx = small_index();
  idx.save(t.path("s.tqi"));
  const auto b = slurp(t.path("s.tqi"));
  auto expect_msg = [](std::vector<uint8_t> c, const char* needle) {
    try {
      tq::Index::from_bytes(c.data(), c.size(), "hdr");
      ADD_FAILURE() << "accepted; expected " << needle;
    } catch (const tq::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // Zero-length and foreign files.
  expect_msg({}, "empty");
  std::vector<uint8_t> foreign(500, 'x');
  expect_msg(foreign, "magic");
  auto c = b;
  c[0] = 'X';
  expect_msg(c, "magic");
  // Wrong version, with a valid header checksum.
  c = b;
  st32(c.data() + 8, 2);
  fix_header_checksum(c);
  expect_msg(c, "version 2");
  // Absurd counts with a valid header checksum: rejected before any allocation.
  for (uint64_t count : {uint64_t{1} << 40, uint64_t{1} << 31, uint64_t{38}, uint64_t{0}}) {
    c = b;
    st64(c.data() + 40, count);
    fix_header_checksum(c);
    EXPECT_THROW(tq::Index::from_bytes(c.data(), c.size(), "count"), tq::Error) << count;
  }
  // Consistent-looking sections for a huge count: still rejected against the file size.
  c = b;
  const uint64_t huge = uint64_t{1} << 31, cb = idx.code_bytes();
  st64(c.data() + 40, huge);
  st64(c.data() + 64, huge * cb);
  st64(c.data() + 72, 128 + huge * cb);
  st64(c.data() + 80, huge * 8);
  st64(c.data() + 88, 128 + huge * cb + huge * 8);
  st64(c.data() + 96, huge * 12 * 4);
  st64(c.data() + 104, 128 + huge * cb + huge * 8 + huge * 48);
  fix_header_checksum(c);
  expect_msg(c, "truncated");
  // Bad enums / parameters with valid header checksums.
  for (size_t off : {size_t{20}, size_t{21}, size_t{22}, size_t{23}, size_t{24}, size_t{25}, size_t{26}, size_t{27}}) {
    c = b;
    c[off] = 0xEE;
    fix_header_checksum(c);
    EXPECT_THROW(tq::Index::from_bytes(c.data(), c.size(), "enum"), tq::Error) << off;
  }
  c = b;
  st32(c.data() + 16, 1);  // dim 1
  fix_header_checksum(c);
  EXPECT_THROW(tq::Index::from_bytes(c.data(), c.size(), "dim"), tq::Error);
  c = b;
  c[26] = 8;  // 2 bits -> 4 bits: the record size no longer matches
  fix_header_checksum(c);
  expect_msg(c, "record size");
  // Missing file.
  EXPECT_THROW(tq::Index::load(t.path("missing.tqi")), tq::Error);
}

TEST(IndexIo, InterruptedSaveLeavesOldFileLoadable) {
  TempDir t;
  auto old_idx = small_index(tq::Metric::l2, 4, false, 30);
  const std::string p = t.path("idx.tqi");
  old_idx.save(p);
  const auto before = slurp(p);
  auto new_idx = small_index(tq::Metric::cosine, 2, true, 60);
  for (auto f : {tq::AtomicWriteFault::after_partial_write, tq::AtomicWriteFault::before_rename}) {
    tq::set_atomic_write_fault(f);
    EXPECT_THROW(new_idx.save(p), tq::Error);
    tq::set_atomic_write_fault(tq::AtomicWriteFault::none);
    EXPECT_EQ(slurp(p), before);
    auto back = tq::Index::load(p);
    EXPECT_EQ(back.size(), 30u);
    EXPECT_EQ(back.config().metric, tq::Metric::l2);
  }
  // The next successful save replaces it.
  new_idx.save(p);
  EXPECT_EQ(tq::Index::load(p).size(), 60u);
}

// ---------------------------------------------------------------------------------------
// IVF

namespace {

tq::IndexConfig ivf_cfg(int d, double bits, tq::Metric m, int nlist) {
  auto c = cfg_of(d, bits, m);
  c.nlist = nlist;
  c.seed = 7;
  return c;
}
void fix_payload_checksum(std::vector<uint8_t>& b) {
  st64(b.data() + 112, tq::checksum64(b.data() + 128, b.size() - 128));
  fix_header_checksum(b);
}
// Forces the IVF scan order (src/search/index_internal.h) for a scope.
struct ScopedScanOrder {
  explicit ScopedScanOrder(tq::IvfScanOrder o) { tq::set_ivf_scan_order(o); }
  ~ScopedScanOrder() { tq::set_ivf_scan_order(tq::IvfScanOrder::automatic); }
  ScopedScanOrder(const ScopedScanOrder&) = delete;
  ScopedScanOrder& operator=(const ScopedScanOrder&) = delete;
};
constexpr tq::IvfScanOrder kScanOrders[] = {tq::IvfScanOrder::per_query, tq::IvfScanOrder::list_major};
size_t overlap(const Results& a, const Results& b, size_t nq, int k) {
  size_t same = 0;
  for (size_t i = 0; i < nq; ++i) {
    std::set<int64_t> sa(a.id.begin() + i * k, a.id.begin() + (i + 1) * k);
    for (int j = 0; j < k; ++j) same += sa.count(b.id[i * k + j]);
  }
  return same;
}

}  // namespace

// Named thresholds: clustered data, 16 lists; probing 4 of them finds most true top-1s
// among the first 10 at 4 bits.
constexpr double kMinIvfRecall1at10_nprobe4 = 0.8;

// The exact relation: with nprobe = nlist every code is scored. With rerank >= n the fast
// scan's candidates are all codes, re-scored with the float LUTs, so the result is the top-k
// by float-LUT score over every code, which is what the float-LUT path (fast_scan = false)
// returns; scores agree to float rounding (the per-list offsets are the same numbers, the
// LUT sums are added in the same order), ids agree except where two scores tie within it.
TEST(Ivf, AllListsProbedEqualsExhaustiveScanOfTheSameCodes) {
  const int d = 48;
  const size_t n = small() ? 600 : 2000, nq = 40;
  auto x = make_data(n, d, 31), q = make_data(nq, d, 32);
  for (tq::Metric m : {tq::Metric::cosine, tq::Metric::ip, tq::Metric::l2})
    for (double bits : {1.0, 2.0, 2.5, 3.0, 4.0, 8.0}) {
      const int nlist = 16;
      tq::Index idx(ivf_cfg(d, bits, m, nlist));
      idx.add(n, x.data());
      ASSERT_EQ(idx.size(), n);
      size_t total = 0;
      for (int l = 0; l < nlist; ++l) total += idx.list_size(l);
      EXPECT_EQ(total, n);
      tq::SearchParams a, b;
      a.nprobe = b.nprobe = nlist;
      a.rerank = static_cast<int>(n);
      b.fast_scan = false;
      const int k = 10;
      const std::string what = idx.describe();
      auto rb = run(idx, q, k, b);
      // Either fast-scan order (per query, list-major) against the exhaustive float-LUT scan.
      for (tq::IvfScanOrder o : kScanOrders) {
        ScopedScanOrder so(o);
        expect_same_up_to_ties(run(idx, q, k, a), rb, nq, k, what + " order " + std::to_string(static_cast<int>(o)));
      }
      // And recall against exact search is that of the codes, at every nprobe it can only
      // lose candidates: recall(nprobe = 4) <= recall(all) + noise, recall(4) high at 4 bits.
      if (bits == 4.0) {
        auto gt = exact(m, x, q, d, 1);
        tq::SearchParams p4;
        p4.nprobe = 4;
        const double r4 = recall1(run(idx, q, k, p4), k, gt, 1, k);
        const double rall = recall1(rb, k, gt, 1, k);
        EXPECT_GE(r4, kMinIvfRecall1at10_nprobe4) << what;
        EXPECT_GE(rall, r4 - 1e-9) << what;
      }
    }
}

TEST(Ivf, FastScanWithinListsMatchesFloatLuts) {
  // With the default re-ranking, fast scan and float LUTs return mostly the same top 10.
  const int d = 64;
  const size_t n = 3000, nq = 50;
  auto x = make_data(n, d, 41), q = make_data(nq, d, 42);
  for (tq::Metric m : {tq::Metric::cosine, tq::Metric::l2}) {
    tq::Index idx(ivf_cfg(d, 4, m, 20));
    idx.add(n, x.data());
    tq::SearchParams a, b;
    a.nprobe = b.nprobe = 5;
    b.fast_scan = false;
    auto ra = run(idx, q, 10, a), rb = run(idx, q, 10, b);
    EXPECT_GE(overlap(ra, rb, nq, 10), static_cast<size_t>(0.95 * nq * 10)) << idx.describe();
  }
}

// The l2 fast scan reads one set of uint8 tables, of Pi q, for every list, plus each slot's list
// term l2term = -2 scale <Pi c_l, c>: l2term is its definition after batches, remove_ids and a
// load, and every scan score (rerank 0, every list probed, every vector returned) is the
// float-LUT score of its vector within the tables' rounding, 2 scale m step / 2 (step: the
// largest channel range of Pi q's tables / 255; 4 bits: one channel a group), at every SIMD level.
TEST(Ivf, L2ScanScoresAreTheListQuerysWithinTheTablesRounding) {
  TempDir t;
  const int d = 64, nlist = 8;
  const size_t n = 900, nq = 6;
  auto x = make_data(n, d, 43), q = make_data(nq, d, 44);
  tq::Index idx(ivf_cfg(d, 4, tq::Metric::l2, nlist));
  auto expect_l2term = [&](const tq::Index& ix, const char* when) {
    const tq::Index::Impl& I = ix.impl();
    ASSERT_EQ(I.l2term.size(), I.scale.size()) << when;
    std::vector<uint8_t> ind(d);
    for (size_t s = 0; s < I.slots; ++s) {
      if (I.ids[s] < 0) {
        EXPECT_EQ(I.l2term[s], 0.f) << when;
        continue;
      }
      I.get_indices(s, ind.data());
      const float* rc = I.rcentroids.data() + I.list_of(s) * d;
      double dot = 0, rn = 0;
      for (int j = 0; j < d; ++j) {
        dot += rc[j] * I.segs[0].cb->centroids[ind[j]];
        rn += static_cast<double>(rc[j]) * rc[j];
      }
      EXPECT_NEAR(I.l2term[s], -2 * I.scale[s] * dot, 1e-5 * (1 + I.scale[s] * std::sqrt(rn * d))) << when << " " << s;
    }
  };
  idx.add(400, x.data());
  expect_l2term(idx, "first batch");
  idx.add(n - 400, x.data() + 400 * d);
  expect_l2term(idx, "second batch");
  std::vector<int64_t> gone;
  for (size_t i = 0; i < n; i += 7) gone.push_back(static_cast<int64_t>(i));
  ASSERT_EQ(idx.remove_ids(gone.size(), gone.data()), gone.size());
  expect_l2term(idx, "remove_ids");
  idx.save(t.path("l2.tqi"));
  const tq::Index ix = tq::Index::load(t.path("l2.tqi"));
  expect_l2term(ix, "load");
  const tq::Index::Impl& I = ix.impl();
  const int k = static_cast<int>(ix.size());
  tq::SearchParams pf, p0;
  pf.fast_scan = false;
  pf.nprobe = p0.nprobe = nlist;
  p0.rerank = 0;
  const auto ref = run(ix, q, k, pf);
  const auto& cent = I.segs[0].cb->centroids;
  const float crange = cent.back() - cent.front();
  float smax = 0;
  for (size_t s = 0; s < I.slots; ++s) smax = std::max(smax, I.scale[s]);
  for (const auto& level : tq::simd::available_levels()) {
    tq::simd::ScopedLevel sl(level);
    const auto got = run(ix, q, k, p0);
    for (size_t qi = 0; qi < nq; ++qi) {
      std::vector<float> y(d);
      I.rot->forward(1, q.data() + qi * d, y.data());
      float ymax = 0;
      for (float v : y) ymax = std::max(ymax, std::fabs(v));
      const double tol = 2.0 * smax * d * (ymax * crange / 255.0) / 2 + 1e-3;
      const int64_t* rid = ref.id.data() + qi * k;
      for (int r = 0; r < k; ++r) {
        const int64_t id = got.id[qi * k + r];
        ASSERT_GE(id, 0) << level;
        const size_t at = static_cast<size_t>(std::find(rid, rid + k, id) - rid);
        ASSERT_LT(at, static_cast<size_t>(k));
        EXPECT_NEAR(got.s[qi * k + r], ref.s[qi * k + at], tol) << level << " query " << qi << " id " << id;
      }
    }
  }
}

// The list-major scan (each probed list scanned once for all the queries of a chunk probing
// it, src/search/index.cpp) returns exactly what the per-query scan returns: the same ids and
// the same score bits, for every metric, fast-scan width and second stage, with nprobe from 1
// to nlist, re-ranking off, default and deep, k = 1 and 10, 1 to 3 threads (chunks of a
// third of the queries), and duplicated vectors (equal scores, ties between candidates).
TEST(Ivf, ListMajorScanEqualsPerQueryScanExactly) {
  const int d = 40;
  const size_t half = small() ? 400 : 1000, nq = 64;
  auto x = make_data(half, d, 51);
  x.insert(x.end(), x.begin(), x.end());  // every vector twice
  const size_t n = 2 * half;
  auto q = make_data(nq, d, 52);
  struct Width {
    double bits;
    int rerank_bits;
    bool refine;
  };
  const Width widths[] = {{4, 0, false}, {4, 4, true}, {4, 8, false}, {3, 0, false},
                          {2.5, 0, false}, {2, 2, true}, {1, 0, false}};
  size_t compared = 0, ties = 0;
  for (tq::Metric m : {tq::Metric::cosine, tq::Metric::ip, tq::Metric::l2})
    for (const Width& w : widths) {
      const int nlist = 16;
      auto c = ivf_cfg(d, w.bits, m, nlist);
      c.rerank_bits = w.rerank_bits;
      c.rerank_refine = w.refine;
      tq::Index idx(c);
      idx.add(n, x.data());
      const std::string what = idx.describe();
      for (int nprobe : {1, 5, nlist})
        for (int rerank : {0, -1, 40})
          for (int threads : {1, 2, 3})
            for (int k : {1, 10}) {
              tq::SearchParams p;
              p.nprobe = nprobe;
              p.rerank = rerank;
              p.n_threads = threads;
              Results r[2];
              for (int o = 0; o < 2; ++o) {
                ScopedScanOrder so(kScanOrders[o]);
                r[o] = run(idx, q, k, p);
              }
              const std::string at = what + " nprobe " + std::to_string(nprobe) + " rerank " + std::to_string(rerank) +
                                     " threads " + std::to_string(threads) + " k " + std::to_string(k);
              ASSERT_EQ(r[0].id, r[1].id) << at;
              ASSERT_EQ(0, std::memcmp(r[0].s.data(), r[1].s.data(), r[0].s.size() * sizeof(float))) << at;
              ++compared;
              for (size_t i = 0; i + 1 < nq * k; ++i) ties += (i + 1) % k != 0 && r[0].s[i] == r[0].s[i + 1];
            }
    }
  EXPECT_EQ(compared, 3u * 7 * 3 * 3 * 3 * 2);
  EXPECT_GT(ties, 0u);  // the duplicates do put equal scores side by side in the results
}

// nearest_centroids (the lane-wise argmax over tiles) equals one sequential strict-greater
// scan of 2 <x, c> - ||c||^2: integer data, so every score is exact whatever the GEMM's order,
// and repeated centroids, so ties must go to the lowest index; k below, at and above 16.
TEST(Ivf, NearestCentroidsEqualsSequentialScanWithTies) {
  tq::Rng rng(77);
  const int d = 6;
  for (int k : {1, 5, 16, 37, 300}) {
    const size_t n = 2100;
    std::vector<float> x(n * d), c(static_cast<size_t>(k) * d), cn2(k);
    for (auto& v : x) v = static_cast<float>(static_cast<int>(rng.next_u64() % 7) - 3);
    for (int j = 0; j < k; ++j)
      for (int t = 0; t < d; ++t)
        c[j * d + t] = j % 3 == 2 ? c[(j - 1) * d + t] : static_cast<float>(static_cast<int>(rng.next_u64() % 5) - 2);
    for (int j = 0; j < k; ++j) {
      cn2[j] = 0;
      for (int t = 0; t < d; ++t) cn2[j] += c[j * d + t] * c[j * d + t];
    }
    std::vector<uint32_t> out(n);
    std::vector<float> best(n);
    tq::nearest_centroids(n, d, x.data(), k, c.data(), cn2.data(), out.data(), best.data());
    for (size_t i = 0; i < n; ++i) {
      float b = -std::numeric_limits<float>::infinity();
      uint32_t a = 0;
      for (int j = 0; j < k; ++j) {
        float dot = 0;
        for (int t = 0; t < d; ++t) dot += x[i * d + t] * c[j * d + t];
        const float v = 2.f * dot - cn2[j];
        if (v > b) {
          b = v;
          a = static_cast<uint32_t>(j);
        }
      }
      ASSERT_EQ(out[i], a) << "k " << k << " row " << i;
      ASSERT_EQ(best[i], b) << "k " << k << " row " << i;
    }
  }
}

// IVF build and search run OpenBLAS single-threaded while they work and then restore its
// thread count, also when several searches overlap (the first in saves, the last out restores).
// add() with a progress callback: an IVF index's first add reports k-means, assign and encode
// in that order, each from 0 (or more) up to its total, every call on the calling thread (2
// OpenMP threads), and the index equals one added without a callback; a flat add reports
// encode only.
TEST(Ivf, AddReportsProgressByStage) {
  const int d = 16, nlist = 8;
  const size_t n = 3000;
  auto x = make_data(n, d, 63), q = make_data(20, d, 64);
  for (int nl : {nlist, 0}) {
    const auto cfg = nl ? ivf_cfg(d, 4, tq::Metric::cosine, nl) : cfg_of(d, 4, tq::Metric::cosine);
    struct Call {
      std::string stage;
      size_t done, total;
      std::thread::id tid;
    };
    std::vector<Call> calls;
    tq::Index with(cfg), without(cfg);
    const int before = omp_get_max_threads();
    omp_set_num_threads(2);
    with.add(n, x.data(), nullptr, [&](const char* s, size_t done, size_t total) {
      calls.push_back({s, done, total, std::this_thread::get_id()});
    });
    omp_set_num_threads(before);
    without.add(n, x.data());
    const std::vector<std::string> want_stages =
        nl ? std::vector<std::string>{"k-means", "assign", "encode"} : std::vector<std::string>{"encode"};
    std::vector<std::string> stages;
    for (size_t i = 0; i < calls.size(); ++i) {
      const Call& c = calls[i];
      EXPECT_EQ(c.tid, std::this_thread::get_id()) << c.stage;
      EXPECT_LE(c.done, c.total) << c.stage;
      if (stages.empty() || stages.back() != c.stage) {
        stages.push_back(c.stage);
      } else {
        EXPECT_GE(c.done, calls[i - 1].done) << c.stage << " went back";
        EXPECT_EQ(c.total, calls[i - 1].total) << c.stage;
      }
      const bool last_of_stage = i + 1 == calls.size() || calls[i + 1].stage != c.stage;
      if (last_of_stage) EXPECT_EQ(c.done, c.total) << c.stage << " did not finish";
      if (c.stage == "k-means")  // 10 iterations over the sample, at most 256 rows per list
        EXPECT_EQ(c.total, 10 * std::min(n, size_t{256} * nlist));
      if (c.stage == "assign" || c.stage == "encode") EXPECT_EQ(c.total, n);
    }
    EXPECT_EQ(stages, want_stages);
    tq::SearchParams p;
    p.nprobe = nl ? 3 : 1;
    const Results a = run(with, q, 5, p), b = run(without, q, 5, p);
    EXPECT_EQ(a.id, b.id);
    EXPECT_EQ(a.s, b.s);
  }
}

TEST(Ivf, OpenBlasThreadCountRestoredAfterConcurrentSearches) {
  const int d = 16;
  auto x = make_data(800, d, 61), q = make_data(40, d, 62);
  const int before = openblas_get_num_threads();
  openblas_set_num_threads(2);
  tq::Index idx(ivf_cfg(d, 4, tq::Metric::l2, 8));
  idx.add(x.size() / d, x.data());
  EXPECT_EQ(openblas_get_num_threads(), 2);
  tq::SearchParams p;
  p.nprobe = 3;
  p.n_threads = 2;
  const Results want = run(idx, q, 5, p);
  std::vector<std::thread> ts;
  std::vector<Results> got(4);
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int r = 0; r < 20; ++r) got[t] = run(idx, q, 5, p);
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(openblas_get_num_threads(), 2);
  for (const Results& g : got) {
    EXPECT_EQ(g.id, want.id);
    EXPECT_EQ(g.s, want.s);
  }
  openblas_set_num_threads(before);
}

TEST(Ivf, DeterministicForASeedAndThreadCount) {
  TempDir t;
  const int d = 32;
  auto x = make_data(1500, d, 51), q = make_data(20, d, 52);
  auto build = [&](uint64_t seed, const std::string& f) {
    auto c = ivf_cfg(d, 4, tq::Metric::cosine, 12);
    c.seed = seed;
    tq::Index idx(c);
    idx.add(x.size() / d, x.data());
    idx.save(t.path(f));
    return idx;
  };
  auto a = build(5, "a.tqi"), b = build(5, "b.tqi"), c = build(6, "c.tqi");
  EXPECT_EQ(slurp(t.path("a.tqi")), slurp(t.path("b.tqi")));
  EXPECT_NE(slurp(t.path("a.tqi")), slurp(t.path("c.tqi")));
  // The k-means assignments are single-threaded GEMMs over fixed tiles of rows and the
  // encoding is per vector, so the file does not depend on the thread count either.
  const int saved = omp_get_max_threads();
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    build(5, "t" + std::to_string(threads) + ".tqi");
    EXPECT_EQ(slurp(t.path("a.tqi")), slurp(t.path("t" + std::to_string(threads) + ".tqi"))) << threads << " threads";
  }
  omp_set_num_threads(saved);
  tq::SearchParams p;
  p.nprobe = 3;
  for (int threads : {1, 2, 3}) {
    p.n_threads = threads;
    auto ra = run(a, q, 10, p), rb = run(b, q, 10, p);
    EXPECT_EQ(ra.id, rb.id);
    EXPECT_EQ(ra.s, rb.s);
  }
}

// The coarse step probes the nprobe lists of best centroid score (ip: <q, c>; cosine, l2:
// 2 <q, c> - ||c||^2, q normalised for cosine). With k >= n every vector of the probed lists
// comes back, so the result's ids give the probed lists: each must score at least as well as
// every list not probed (to float rounding), for list counts that are not multiples of the
// 16 scores the selection compares at a time and for nprobe below and above 16.
TEST(Ivf, ProbedListsAreTheBestByCentroidScore) {
  const int d = 24, nlist = 37;
  const size_t n = 1500, nq = 12;
  auto x = make_data(n, d, 61), q = make_data(nq, d, 62);
  for (tq::Metric m : {tq::Metric::cosine, tq::Metric::ip, tq::Metric::l2}) {
    tq::Index idx(ivf_cfg(d, 4, m, nlist));
    idx.add(n, x.data());
    const auto& I = idx.impl();
    std::vector<int> list_of_id(n, -1);
    for (int l = 0; l < nlist; ++l)
      for (size_t s = I.list_begin[l]; s < I.list_begin[l] + I.list_size[l]; ++s) list_of_id[I.ids[s]] = l;
    for (int np : {1, 5, 17, 20, 36}) {
      tq::SearchParams p;
      p.nprobe = np;
      const int k = static_cast<int>(n);
      auto r = run(idx, q, k, p);
      for (size_t qi = 0; qi < nq; ++qi) {
        std::vector<bool> probed(nlist, false);
        for (int j = 0; j < k; ++j) {
          const int64_t id = r.id[qi * k + j];
          if (id >= 0) probed[list_of_id[id]] = true;
        }
        const float* qr = q.data() + qi * d;
        double qq = 0;
        for (int j = 0; j < d; ++j) qq += static_cast<double>(qr[j]) * qr[j];
        const double qs = m == tq::Metric::cosine ? 1.0 / std::sqrt(qq) : 1.0;
        std::vector<double> sc(nlist);
        for (int l = 0; l < nlist; ++l) {
          double dot = 0, cc = 0;
          for (int j = 0; j < d; ++j) {
            const double c = I.centroids[l * d + j];
            dot += qr[j] * qs * c;
            cc += c * c;
          }
          sc[l] = m == tq::Metric::ip ? dot : 2 * dot - cc;
        }
        double worst_in = 1e300, best_out = -1e300;
        int n_in = 0;
        for (int l = 0; l < nlist; ++l) {
          if (probed[l]) {
            worst_in = std::min(worst_in, sc[l]);
            ++n_in;
          } else if (I.list_size[l] > 0) {
            best_out = std::max(best_out, sc[l]);
          }
        }
        EXPECT_LE(n_in, np) << idx.describe() << " nprobe " << np;
        EXPECT_GE(worst_in, best_out - 1e-4 * (1 + std::fabs(best_out))) << idx.describe() << " nprobe " << np;
      }
    }
  }
}

TEST(Ivf, SaveLoadRoundTripAndIncrementalAdd) {
  TempDir t;
  const int d = 40;
  auto x = make_data(1200, d, 61), q = make_data(25, d, 62);
  struct Case { tq::Metric m; double bits; bool keep; bool list_mean; };
  for (const Case& cs : {Case{tq::Metric::cosine, 4, false, false}, Case{tq::Metric::l2, 2.5, true, true},
                         Case{tq::Metric::ip, 8, false, false}, Case{tq::Metric::cosine, 3, true, false}}) {
    auto c = ivf_cfg(d, cs.bits, cs.m, 9);
    c.keep_vectors = cs.keep;
    c.ivf_list_mean = cs.list_mean;
    tq::Index idx(c);
    std::vector<int64_t> ids(1200);
    for (size_t i = 0; i < 1200; ++i) ids[i] = 5000000000LL + static_cast<int64_t>(i) * 7;
    idx.add(700, x.data(), ids.data());  // trains the lists
    idx.add(500, x.data() + 700 * d, ids.data() + 700);  // added to the existing lists
    ASSERT_EQ(idx.size(), 1200u);
    idx.save(t.path("i.tqi"));
    EXPECT_EQ(tq::file_size(t.path("i.tqi")), idx.file_bytes());
    const auto bytes = slurp(t.path("i.tqi"));
    EXPECT_EQ(bytes[8], 2);  // IVF files are version 2
    auto back = tq::Index::load(t.path("i.tqi"));
    EXPECT_EQ(back.describe(), idx.describe());
    EXPECT_EQ(back.nlist(), 9);
    for (int l = 0; l < 9; ++l) EXPECT_EQ(back.list_size(l), idx.list_size(l));
    tq::SearchParams p;
    p.nprobe = 4;
    p.rerank_full = cs.keep ? 20 : 0;
    auto a = run(idx, q, 10, p), b = run(back, q, 10, p);
    EXPECT_EQ(a.id, b.id) << idx.describe();
    EXPECT_EQ(a.s, b.s) << idx.describe();
    for (int64_t id : a.id) EXPECT_TRUE(id >= 5000000000LL && (id - 5000000000LL) % 7 == 0) << id;
    back.save(t.path("j.tqi"));
    EXPECT_EQ(bytes, slurp(t.path("j.tqi")));
    // An index built in one add has the same lists (the lists are trained on the first batch).
    tq::Index one(c);
    one.add(700, x.data(), ids.data());
    tq::Index two(c);
    two.add(700, x.data(), ids.data());
    EXPECT_EQ(run(one, q, 10, p).id, run(two, q, 10, p).id);
  }
  // Empty IVF index: round-trips, searches return -1.
  tq::Index empty(ivf_cfg(d, 4, tq::Metric::cosine, 4));
  empty.save(t.path("e.tqi"));
  auto e = tq::Index::load(t.path("e.tqi"));
  EXPECT_EQ(e.size(), 0u);
  EXPECT_EQ(e.nlist(), 4);
  tq::SearchParams p;
  p.nprobe = 2;
  auto r = run(e, q, 3, p);
  for (int64_t id : r.id) EXPECT_EQ(id, -1);
  // A flat index is still written as version 1.
  tq::Index flat(cfg_of(d, 4, tq::Metric::cosine));
  flat.add(50, x.data());
  flat.save(t.path("f.tqi"));
  EXPECT_EQ(slurp(t.path("f.tqi"))[8], 1);
}

TEST(Ivf, BadInputsRejectedWithClearErrors) {
  const int d = 16;
  auto x = make_data(300, d, 71), q = make_data(3, d, 72);
  auto expect_msg = [](auto&& f, const char* needle) {
    try {
      f();
      ADD_FAILURE() << "accepted; expected " << needle;
    } catch (const tq::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  tq::Index idx(ivf_cfg(d, 4, tq::Metric::cosine, 8));
  idx.add(300, x.data());
  std::vector<float> s(30);
  std::vector<int64_t> ids(30);
  for (int np : {0, -1, 9, 1 << 30}) {
    tq::SearchParams p;
    p.k = 10;
    p.nprobe = np;
    expect_msg([&] { idx.search(3, q.data(), p, s.data(), ids.data()); }, "nprobe");
  }
  tq::SearchParams p;
  p.k = 10;
  p.nprobe = 8;
  expect_msg([&] { idx.search(3, d + 1, q.data(), p, s.data(), ids.data()); }, "dim 16");
  // Fewer vectors in the first add than lists.
  tq::Index few(ivf_cfg(d, 4, tq::Metric::cosine, 64));
  expect_msg([&] { few.add(10, x.data()); }, "at least 64 vectors");
  EXPECT_EQ(few.size(), 0u);
  // Configurations IVF does not combine with.
  auto c = ivf_cfg(d, 4, tq::Metric::cosine, 8);
  c.center = true;
  expect_msg([&] { tq::Index bad(c); }, "center");
  c = ivf_cfg(d, 4, tq::Metric::cosine, 8);
  c.codec = tq::QuantizerKind::prod;
  expect_msg([&] { tq::Index bad(c); }, "codec mse");
  c = ivf_cfg(d, 4, tq::Metric::cosine, -3);
  expect_msg([&] { tq::Index bad(c); }, "nlist");
  c = ivf_cfg(d, 4, tq::Metric::cosine, 8);
  c.kmeans_iters = 0;
  expect_msg([&] { tq::Index bad(c); }, "kmeans_iters");
  EXPECT_THROW(idx.list_size(8), tq::Error);
}

TEST(Ivf, TruncatedAndCorruptedFilesRejected) {
  TempDir t;
  const int d = 12;
  auto x = make_data(100, d, 81);
  auto c = ivf_cfg(d, 2, tq::Metric::l2, 5);
  c.keep_vectors = true;
  tq::Index idx(c);
  idx.add(100, x.data());
  idx.save(t.path("v.tqi"));
  const auto b = slurp(t.path("v.tqi"));
  for (size_t len = 0; len < b.size(); ++len)
    EXPECT_THROW(tq::Index::from_bytes(b.data(), len, "trunc"), tq::Error) << len;
  for (size_t i = 0; i < b.size(); ++i) {
    auto f = b;
    f[i] ^= 0x10;
    EXPECT_THROW(tq::Index::from_bytes(f.data(), f.size(), "flip"), tq::Error) << i;
  }
  EXPECT_NO_THROW(tq::Index::from_bytes(b.data(), b.size(), "ok"));
  auto expect_msg = [](std::vector<uint8_t> f, const char* needle) {
    try {
      tq::Index::from_bytes(f.data(), f.size(), "ivf");
      ADD_FAILURE() << "accepted; expected " << needle;
    } catch (const tq::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // Valid checksums, inconsistent IVF fields (the section starts at byte 128).
  const size_t L = 5, sizes = 128 + 16 + L * d * 4;
  auto f = b;
  st32(f.data() + 128, 0);
  fix_payload_checksum(f);
  expect_msg(f, "nlist 0");
  f = b;
  st32(f.data() + 128, 6);  // one more list: the sections no longer add up
  fix_payload_checksum(f);
  expect_msg(f, "inconsistent");
  f = b;
  st32(f.data() + 132, 0);
  fix_payload_checksum(f);
  expect_msg(f, "kmeans_iters");
  f = b;
  st64(f.data() + sizes, idx.list_size(0) + 1);
  fix_payload_checksum(f);
  expect_msg(f, "list sizes");
  f = b;
  st64(f.data() + sizes, ~uint64_t{0});
  fix_payload_checksum(f);
  expect_msg(f, "list sizes");
  f = b;
  st32(f.data() + 128 + 16, 0x7fc00000u);  // NaN centroid component
  fix_payload_checksum(f);
  expect_msg(f, "centroid");
  f = b;
  f[27] &= static_cast<uint8_t>(~8u);  // version 2 without the IVF flag
  fix_header_checksum(f);
  expect_msg(f, "version 2");
  f = b;
  st32(f.data() + 8, 4);
  fix_header_checksum(f);
  expect_msg(f, "version 4");
  // Version 3 (second stage) needs a width in the IVF section's last word, here 0.
  f = b;
  st32(f.data() + 8, 3);
  fix_header_checksum(f);
  expect_msg(f, "second-stage code width 0");
}

// Stored floats a search would turn into garbage fail at load, naming the field: non-finite
// ones, and finite ones above 2^64 (sqrt(FLT_MAX); for centroids, the center and kept vectors
// their norm), which made a query's lookup table inf - inf = NaN (the fuzz seed
// fuzz/corpus/fuzz_index/regress_nan_lut, a centroid component of 2.9e38). Values just below
// the bound load.
TEST(IndexFile, NonFiniteOrExtremeStoredFloatsRejectedNamingTheField) {
  TempDir t;
  const int d = 12;
  const size_t L = 5;
  auto x = make_data(100, d, 83);
  auto c = ivf_cfg(d, 2, tq::Metric::l2, static_cast<int>(L));
  c.keep_vectors = true;
  c.norm = tq::NormFormat::f32;
  tq::Index idx(c);
  idx.add(100, x.data());
  idx.save(t.path("v.tqi"));
  const auto b = slurp(t.path("v.tqi"));
  auto f32bits = [](float v) { uint32_t u; std::memcpy(&u, &v, 4); return u; };
  auto expect_msg = [](std::vector<uint8_t> f, const std::string& needle) {
    fix_payload_checksum(f);
    try {
      tq::Index::from_bytes(f.data(), f.size(), "x.tqi");
      ADD_FAILURE() << "accepted; expected " << needle;
    } catch (const tq::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  };
  auto expect_loads = [](std::vector<uint8_t> f) {
    fix_payload_checksum(f);
    EXPECT_NO_THROW(tq::Index::from_bytes(f.data(), f.size(), "x.tqi"));
  };
  const size_t cent = 128 + 16;                         // centroid 0, component 0
  const size_t rec0 = cent + L * d * 4 + L * 8;         // record 0: [scale f32][norm f32][codes]
  uint64_t vec0 = 0;                                    // kept vector 0 (header bytes 88..95)
  for (int i = 0; i < 8; ++i) vec0 |= static_cast<uint64_t>(b[88 + i]) << (8 * i);
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    size_t at;
    float v;
    const char* needle;
  };
  const Case bad[] = {
      {cent + 4 * (2 * d + 3), inf, "IVF centroid 2, component 3 is not finite"},
      {cent + 4 * (2 * d + 3), 2.88e38f, "IVF centroid 2 has norm 2.88e+38, above the 2^64"},
      {rec0, std::nanf(""), "vector 0 has a non-finite scale"},
      {rec0, 3e38f, "vector 0 has scale 3e+38, above the 2^64"},
      {rec0 + 4, -inf, "vector 0 has a bad norm"},
      {rec0 + 4, 1e20f, "vector 0 has norm 1e+20, above the 2^64"},
      {vec0 + 4 * 5, std::nanf(""), "kept vector 0 is not finite"},
      {vec0 + 4 * 5, 1e25f, "kept vector 0 has norm 1e+25, above the 2^64"},
  };
  for (const Case& k : bad) {
    auto f = b;
    st32(f.data() + k.at, f32bits(k.v));
    expect_msg(f, k.needle);
  }
  // Just below the bound: loads (a search on such values is the caller's range).
  for (size_t at : {cent + 4 * (2 * d + 3), rec0, rec0 + 4, vec0 + 4 * 5}) {
    auto f = b;
    st32(f.data() + at, f32bits(1e19f));
    expect_loads(f);
  }
  // The center of a flat index with the center option.
  auto fc = cfg_of(d, 4, tq::Metric::ip);
  fc.center = true;
  tq::Index flat(fc);
  flat.add(100, x.data());
  flat.save(t.path("c.tqi"));
  const auto cb = slurp(t.path("c.tqi"));
  auto f = cb;
  st32(f.data() + 128 + 4 * 7, f32bits(inf));
  expect_msg(f, "center component 7 is not finite");
  f = cb;
  st32(f.data() + 128 + 4 * 7, f32bits(-1e30f));
  expect_msg(f, "center has norm 1e+30, above the 2^64");
  // The fuzz seed: byte 0 is the target's mode (bit 0: the checksums are recomputed).
  const auto seed = slurp(std::string(TQ_SOURCE_DIR) + "/fuzz/corpus/fuzz_index/regress_nan_lut");
  ASSERT_GT(seed.size(), 129u);
  ASSERT_EQ(seed[0] & 1, 1);
  expect_msg(std::vector<uint8_t>(seed.begin() + 1, seed.end()), "IVF centroid");
  // Vectors of norm 1e18 (below the bound) round-trip and search with finite scores.
  auto big = x;
  for (float& v : big) v *= 1e17f;
  tq::Index bi(c);
  bi.add(100, big.data());
  bi.save(t.path("big.tqi"));
  const tq::Index back = tq::Index::load(t.path("big.tqi"));
  tq::SearchParams p;
  p.k = 5;
  p.nprobe = static_cast<int>(L);
  std::vector<float> s(5);
  std::vector<int64_t> ids(5);
  back.search(1, big.data(), p, s.data(), ids.data());
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(std::isfinite(s[i])) << s[i];
  EXPECT_EQ(ids[0], 0);
}

// ---------------------------------------------------------------------------------------
// IVF second-stage re-rank code (IndexConfig::rerank_bits)

// The second stage re-scores the shortlist with an independent rerank_bits-bit code of the
// same residual. With every list probed and the whole index as the shortlist, the result is
// the top-k by that code's score over every vector: what an IVF index whose only code has
// rerank_bits bits (same seed, same k-means, same residuals, so the same codes and scales)
// returns from its exhaustive float-LUT scan. Scores agree to float rounding; ids except ties
// within it.
TEST(IvfRerank, SecondStageEqualsBruteForceRerankOfTheSameCodes) {
  const int d = 40;
  const size_t n = small() ? 600 : 1500, nq = 30;
  auto x = make_data(n, d, 131), q = make_data(nq, d, 132);
  for (tq::Metric m : {tq::Metric::cosine, tq::Metric::ip, tq::Metric::l2})
    for (int rb : {8, 6, 3}) {
      const int nlist = 12;
      auto ca = ivf_cfg(d, 4, m, nlist);
      ca.rerank_bits = rb;
      ca.rerank_refine = false;
      tq::Index a(ca), ref(ivf_cfg(d, rb, m, nlist));
      a.add(n, x.data());
      ref.add(n, x.data());
      tq::SearchParams pa, pr;
      pa.nprobe = pr.nprobe = nlist;
      pa.rerank = static_cast<int>(n);
      pr.fast_scan = false;
      const int k = 10;
      auto ra = run(a, q, k, pa), rr = run(ref, q, k, pr);
      const std::string what = a.describe();
      expect_same_up_to_ties(ra, rr, nq, k, what);
      // rerank 0: the scan scores of the first code alone, as an index without a second stage.
      tq::Index plain(ivf_cfg(d, 4, m, nlist));
      plain.add(n, x.data());
      tq::SearchParams p0;
      p0.nprobe = 3;
      p0.rerank = 0;
      auto r0 = run(a, q, k, p0), rp = run(plain, q, k, p0);
      EXPECT_EQ(r0.id, rp.id) << what;
      EXPECT_EQ(r0.s, rp.s) << what;
    }
}

// Refining second stage (IndexConfig::rerank_refine, the default): each channel's B bits
// place the residual inside the Lloyd-Max cell of its first-stage index. Checked against the
// codebook directly: every decoded value lies in its first index's cell (inner cells) or on
// its side of the boundary (outer cells), and within half a part (cell width / 2^B) of the
// rotated unit residual wherever the residual lies inside an inner cell. Then the search:
// with every list probed and the whole index as the shortlist, the result is the top-k of a
// brute-force scan that decodes the same first and second codes (score = list offset +
// scale2 * <rotated query, decoded value>, l2 minus ||x||^2); scores agree to float rounding.
TEST(IvfRerank, RefiningSecondStageDecodesInsideTheCellsAndEqualsBruteForce) {
  const int d = 40;
  const size_t n = small() ? 600 : 1200, nq = 25;
  auto x = make_data(n, d, 181), q = make_data(nq, d, 182);
  for (tq::Metric m : {tq::Metric::cosine, tq::Metric::ip, tq::Metric::l2})
    for (double bits : {4.0, 2.0, 2.5})
      for (int rb : {4, 2, 8}) {
        const int nlist = 9;
        auto c = ivf_cfg(d, bits, m, nlist);
        c.rerank_bits = rb;
        ASSERT_TRUE(c.rerank_refine);  // the default
        tq::Index a(c);
        a.add(n, x.data());
        const std::string what = a.describe();
        EXPECT_NE(what.find("refine" + std::to_string(rb) + "b"), std::string::npos) << what;
        const auto& I = a.impl();
        const bool l2 = m == tq::Metric::l2, cosine = m == tq::Metric::cosine;
        // Decoded values of slot s (codebook units) and its rotated unit residual.
        std::vector<uint8_t> i1(d), i2(d);
        std::vector<float> u(d), y(d);
        auto decode = [&](size_t s, std::vector<float>& v, std::vector<int>& seg_of) {
          I.get_indices(s, i1.data());
          tq::unpack_bits(d, rb, I.rcodes.data() + s * I.rbytes, i2.data());
          for (size_t sg = 0; sg < I.segs.size(); ++sg)
            for (int j = I.segs[sg].begin; j < I.segs[sg].begin + I.segs[sg].len; ++j) {
              v[j] = I.rtab[sg][(static_cast<size_t>(i1[j]) << rb) | i2[j]];
              seg_of[j] = static_cast<int>(sg);
            }
        };
        std::vector<float> v(d);
        std::vector<int> seg_of(d);
        size_t checked = 0;
        for (size_t l = 0; l < static_cast<size_t>(nlist); ++l)
          for (size_t s = I.list_begin[l]; s < I.list_begin[l] + I.list_size[l]; ++s) {
            const int64_t id = I.ids[s];
            ASSERT_TRUE(id >= 0 && id < static_cast<int64_t>(n));
            const float* xr = x.data() + id * d;
            double nx = 0;
            for (int j = 0; j < d; ++j) nx += static_cast<double>(xr[j]) * xr[j];
            const float inv = cosine ? static_cast<float>(1.0 / std::sqrt(nx)) : 1.f;
            double len = 0;
            for (int j = 0; j < d; ++j) {
              u[j] = xr[j] * inv - I.centroids[l * d + j];
              len += static_cast<double>(u[j]) * u[j];
            }
            for (int j = 0; j < d; ++j) u[j] = static_cast<float>(u[j] / std::sqrt(len));
            I.rot->forward(1, u.data(), y.data());
            decode(s, v, seg_of);
            for (int j = 0; j < d; ++j) {
              const tq::Codebook& cb = *I.segs[seg_of[j]].cb;
              const int L = cb.levels(), ci = i1[j];
              const float lo = ci > 0 ? cb.boundaries[ci - 1] : -1e30f, hi = ci < L - 1 ? cb.boundaries[ci] : 1e30f;
              const float eps = 1e-6f;
              EXPECT_TRUE(v[j] >= lo - eps && v[j] <= hi + eps) << what << " slot " << s << " ch " << j;
              if (ci > 0 && ci < L - 1) {
                EXPECT_LE(std::fabs(y[j] - v[j]), (hi - lo) / (2 << rb) + 1e-5f) << what << " slot " << s << " ch " << j;
                ++checked;
              }
            }
          }
        EXPECT_GT(checked, n * d / 4) << what;
        // Brute force over every real slot.
        const int k = 10;
        Results bf{std::vector<float>(nq * k), std::vector<int64_t>(nq * k)};
        std::vector<float> qq(d), qc(d), yq(d);
        for (size_t qi = 0; qi < nq; ++qi) {
          const float* qr = q.data() + qi * d;
          double nq2 = 0;
          for (int j = 0; j < d; ++j) nq2 += static_cast<double>(qr[j]) * qr[j];
          const float qs = cosine ? static_cast<float>(1.0 / std::sqrt(nq2)) : 1.f;
          for (int j = 0; j < d; ++j) qq[j] = qr[j] * qs;
          std::vector<std::pair<double, int64_t>> all;
          for (size_t l = 0; l < static_cast<size_t>(nlist); ++l) {
            const float* cl = I.centroids.data() + l * d;
            double off = 0;
            for (int j = 0; j < d; ++j) {
              qc[j] = l2 ? qq[j] - cl[j] : qq[j];
              off += l2 ? -static_cast<double>(qc[j]) * qc[j] : static_cast<double>(qq[j]) * cl[j];
            }
            I.rot->forward(1, qc.data(), yq.data());
            for (size_t s = I.list_begin[l]; s < I.list_begin[l] + I.list_size[l]; ++s) {
              decode(s, v, seg_of);
              double dot = 0;
              for (int j = 0; j < d; ++j) dot += static_cast<double>(yq[j]) * v[j];
              const double sd = I.rscale[s] * dot;
              const double sc = off + (l2 ? 2 * sd - static_cast<double>(I.norm[s]) * I.norm[s] : sd);
              all.push_back({sc, I.ids[s]});
            }
          }
          std::sort(all.begin(), all.end(), [](auto& p1, auto& p2) { return p1.first > p2.first; });
          for (int r = 0; r < k; ++r) {
            bf.s[qi * k + r] = static_cast<float>(l2 ? -all[r].first : all[r].first);
            bf.id[qi * k + r] = all[r].second;
          }
        }
        tq::SearchParams p;
        p.nprobe = nlist;
        p.rerank = static_cast<int>(n);
        for (tq::IvfScanOrder o : kScanOrders) {
          ScopedScanOrder so(o);
          expect_same_up_to_ties(run(a, q, k, p), bf, nq, k, what + " order " + std::to_string(static_cast<int>(o)));
        }
      }
}

// A shortlist re-scored with an 8-bit code finds more true neighbours than the 4-bit code's
// own float-LUT re-rank at the same nprobe (clustered data, exact ground truth).
TEST(IvfRerank, EightBitSecondStageRaisesRecall) {
  const int d = 64;
  const size_t n = small() ? 1500 : 4000, nq = 60;
  auto x = make_data(n, d, 141, 0.6f), q = make_data(nq, d, 142, 0.6f);
  for (tq::Metric m : {tq::Metric::cosine, tq::Metric::l2}) {
    auto c = ivf_cfg(d, 4, m, 16);
    tq::Index plain(c);
    c.rerank_bits = 8;
    tq::Index two(c);
    plain.add(n, x.data());
    two.add(n, x.data());
    auto gt = exact(m, x, q, d, 10);
    tq::SearchParams p;
    p.nprobe = 16;
    p.rerank = 50;
    const size_t hit_plain = overlap(run(plain, q, 10, p), gt, nq, 10);
    const size_t hit_two = overlap(run(two, q, 10, p), gt, nq, 10);
    EXPECT_GT(hit_two, hit_plain) << two.describe();
    EXPECT_GE(hit_two, static_cast<size_t>(0.97 * nq * 10)) << two.describe();  // 8 bits: near exact
  }
}

TEST(IvfRerank, SaveLoadRoundTripIncrementalAddAndBytes) {
  TempDir t;
  const int d = 36;
  auto x = make_data(900, d, 151), q = make_data(20, d, 152);
  for (bool refine : {true, false})
  for (tq::Metric m : {tq::Metric::cosine, tq::Metric::l2, tq::Metric::ip})
    for (int rb : {8, 5, 1}) {
      auto c = ivf_cfg(d, m == tq::Metric::l2 ? 2.5 : 4, m, 7);
      c.rerank_bits = rb;
      c.rerank_refine = refine;
      c.keep_vectors = rb == 5;
      tq::Index idx(c);
      idx.add(500, x.data());
      idx.add(400, x.data() + 500 * d);  // relayout moves the second stage with the slots
      idx.save(t.path("r.tqi"));
      const auto bytes = slurp(t.path("r.tqi"));
      EXPECT_EQ(bytes[8], refine ? 4 : 3);  // IVF with a refining / independent second stage
      EXPECT_EQ(bytes.size(), idx.file_bytes());
      // Record: first code + [scale][rerank codes]; memory: + packed codes and a float scale.
      tq::Index first(ivf_cfg(d, c.bits, m, 7));
      first.add(500, x.data());
      first.add(400, x.data() + 500 * d);
      const size_t rbytes = (static_cast<size_t>(d) * rb + 7) / 8;
      EXPECT_EQ(idx.code_bytes(), first.code_bytes() + 2 + rbytes);
      // (Per slot: IVF lists are padded to whole 32-vector blocks.)
      EXPECT_NEAR(idx.memory_bytes_per_vector(),
                  first.memory_bytes_per_vector() +
                      ((c.keep_vectors ? 4.0 * d : 0.0) + rbytes + 4.0) * [&] {
                        size_t slots = 0;
                        for (int l = 0; l < 7; ++l) slots += (idx.list_size(l) + 31) / 32 * 32;
                        return static_cast<double>(slots) / 900;
                      }(),
                  1e-9);
      EXPECT_NE(idx.describe().find((refine ? "refine" : "rerank") + std::to_string(rb) + "b"), std::string::npos)
          << idx.describe();
      auto back = tq::Index::load(t.path("r.tqi"));
      EXPECT_EQ(back.describe(), idx.describe());
      EXPECT_EQ(back.config().rerank_bits, rb);
      EXPECT_EQ(back.config().rerank_refine, refine);
      tq::SearchParams p;
      p.nprobe = 3;
      p.rerank = 40;
      p.rerank_full = c.keep_vectors ? 15 : 0;
      auto a = run(idx, q, 10, p), b = run(back, q, 10, p);
      EXPECT_EQ(a.id, b.id) << idx.describe();
      EXPECT_EQ(a.s, b.s) << idx.describe();
      back.save(t.path("s.tqi"));
      EXPECT_EQ(bytes, slurp(t.path("s.tqi")));
      // One add of the same vectors: the same lists, the same results.
      tq::Index one(c);
      one.add(500, x.data());
      tq::Index one2(c);
      one2.add(500, x.data());
      EXPECT_EQ(run(one, q, 10, p).id, run(one2, q, 10, p).id);
    }
  // An index without a second stage is still written as version 2 (earlier builds read it).
  tq::Index v2(ivf_cfg(d, 4, tq::Metric::cosine, 5));
  v2.add(200, x.data());
  v2.save(t.path("v2.tqi"));
  EXPECT_EQ(slurp(t.path("v2.tqi"))[8], 2);
}

// Files written before the second stage existed (tests/data, saved by `tq index build` of the
// build just before it: a flat version-1 file, 2.5 bits cosine --center --fit-scale, and an
// IVF version-2 file, 4 lists, 4 bits l2 --keep-vectors, 200 vectors of d = 8) still load,
// search, and are written back byte for byte.
TEST(IvfRerank, FilesOfEarlierBuildsStillLoad) {
  TempDir t;
  const std::string dir = std::string(TQ_SOURCE_DIR) + "/tests/data/";
  // Also an IVF version-3 file (independent 6-bit second stage over 2-bit ip codes; written
  // with --rerank-independent, whose encoder and layout are those of the build before the
  // refining stage) and a version-4 file (refining 4-bit stage, 4 bits cosine), 4 lists each.
  struct F {
    const char* name;
    int version, rerank_bits;
  };
  for (const F& fi : {F{"index_flat_v1_2p5b.tqi", 1, 0}, F{"index_ivf_v2_l2_4b.tqi", 2, 0},
                      F{"index_ivf_v3_ip_2b_rb6.tqi", 3, 6}, F{"index_ivf_v4_cos_4b_rf4.tqi", 4, 4}}) {
    const char* name = fi.name;
    const auto before = slurp(dir + name);
    ASSERT_GT(before.size(), 128u) << name;
    auto idx = tq::Index::load(dir + name);
    EXPECT_EQ(idx.size(), 200u) << name;
    EXPECT_EQ(idx.dim(), 8) << name;
    EXPECT_EQ(idx.config().rerank_bits, fi.rerank_bits) << name;
    if (fi.rerank_bits > 0) EXPECT_EQ(idx.config().rerank_refine, fi.version == 4) << name;
    EXPECT_EQ(before[8], fi.version) << name;
    auto q = make_data(5, 8, 171);
    tq::SearchParams p;
    p.nprobe = idx.nlist() > 0 ? 2 : 1;
    auto r = run(idx, q, 5, p);
    for (int64_t id : r.id) EXPECT_TRUE(id >= 0 && id < 200) << name;
    idx.save(t.path("again.tqi"));
    EXPECT_EQ(slurp(t.path("again.tqi")), before) << name;
  }
}

TEST(IvfRerank, BadConfigAndCorruptFilesRejected) {
  auto expect_msg = [](auto&& f, const char* needle) {
    try {
      f();
      ADD_FAILURE() << "accepted; expected " << needle;
    } catch (const tq::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const int d = 12;
  for (int rb : {-1, 9, 16}) {
    auto c = ivf_cfg(d, 4, tq::Metric::cosine, 4);
    c.rerank_bits = rb;
    expect_msg([&] { tq::Index bad(c); }, "rerank_bits");
  }
  auto flat = cfg_of(d, 4, tq::Metric::cosine);
  flat.rerank_bits = 8;
  expect_msg([&] { tq::Index bad(flat); }, "needs IVF");

  TempDir t;
  auto x = make_data(100, d, 161);
  for (bool refine : {false, true}) {
  auto c = ivf_cfg(d, 2, tq::Metric::l2, 5);
  c.rerank_bits = 6;
  c.rerank_refine = refine;
  tq::Index idx(c);
  idx.add(100, x.data());
  idx.save(t.path("v3.tqi"));
  const auto b = slurp(t.path("v3.tqi"));
  ASSERT_EQ(b[8], refine ? 4 : 3);
  for (size_t len = 0; len < b.size(); ++len)
    EXPECT_THROW(tq::Index::from_bytes(b.data(), len, "trunc"), tq::Error) << len;
  for (size_t i = 0; i < b.size(); ++i) {
    auto f = b;
    f[i] ^= 0x10;
    EXPECT_THROW(tq::Index::from_bytes(f.data(), f.size(), "flip"), tq::Error) << i;
  }
  EXPECT_NO_THROW(tq::Index::from_bytes(b.data(), b.size(), "ok"));
  auto expect_file = [&](std::vector<uint8_t> f, const char* needle) {
    expect_msg([&] { tq::Index::from_bytes(f.data(), f.size(), "v3"); }, needle);
  };
  // Valid checksums, inconsistent second-stage fields (IVF section word 3 at byte 140).
  for (uint32_t rb : {0u, 9u, 255u}) {
    auto f = b;
    st32(f.data() + 140, rb);
    fix_payload_checksum(f);
    expect_file(f, "second-stage code width");
  }
  auto f = b;
  st32(f.data() + 140, 7);  // another width: the record size no longer matches
  fix_payload_checksum(f);
  expect_file(f, "record size");
  f = b;
  st32(f.data() + 8, 2);  // version 2 with a second stage in its records and IVF word
  fix_header_checksum(f);
  expect_file(f, "record size");
  f = b;
  st32(f.data() + 8, 5);  // a flat trellis file cannot have the IVF flag
  fix_header_checksum(f);
  expect_file(f, "version 5 (flat)");
  f = b;
  st32(f.data() + 8, 6);
  fix_header_checksum(f);
  expect_file(f, "version 6");
  // Version 3 read as 4 and back: same layout, loads, but decodes the other second stage.
  f = b;
  st32(f.data() + 8, refine ? 3 : 4);
  fix_header_checksum(f);
  EXPECT_EQ(tq::Index::from_bytes(f.data(), f.size(), "other").config().rerank_refine, !refine);
  // A NaN second-stage scale (f16 0x7e00) in the first record, checksums valid.
  const size_t rec0 = 128 + 16 + 5 * d * 4 + 5 * 8;
  const size_t first_code = 2 + 2 + (d * 2 + 7) / 8;  // scale, norm, 2-bit codes
  f = b;
  f[rec0 + first_code] = 0x00;
  f[rec0 + first_code + 1] = 0x7e;
  fix_payload_checksum(f);
  expect_file(f, "second-stage scale");
  }
}

// Honest descriptions and byte counts (issue 35): the search description names the scan a
// search actually uses; memory and file bytes count ids, kept floats and IVF tables.
TEST(Index, DescriptionAndBytesSayWhatIsUsed) {
  const int d = 32;
  auto x = make_data(200, d, 91);
  tq::SearchParams fast, slow;
  slow.fast_scan = false;
  for (double bits : {2.0, 3.0, 4.0, 8.0}) {
    tq::Index idx(cfg_of(d, bits, tq::Metric::cosine));
    idx.add(200, x.data());
    const bool has_fast = bits <= 4;  // widths above 4 bits per channel: float LUTs only
    EXPECT_EQ(idx.describe_search(fast).find("fast-scan") != std::string::npos, has_fast) << idx.describe_search(fast);
    EXPECT_EQ(idx.describe_search(slow).find("fast-scan"), std::string::npos) << idx.describe_search(slow);
    EXPECT_NE(idx.describe_search(slow).find("float-lut"), std::string::npos) << idx.describe_search(slow);
    EXPECT_EQ(idx.file_bytes(), 128 + 200 * (idx.code_bytes() + 8));
  }
  // 3-bit channels take a nibble each in the fast-scan layout (the same memory as 4 bits)
  // but 3 bits in the file; see docs/design.md for why the layout is not narrower. (Indexes
  // with a sign plane, d >= 320, hold them packed: IndexTwoLevel.WhereItAppliesAndBadParameters.)
  tq::Index b3(cfg_of(d, 3, tq::Metric::cosine)), b4(cfg_of(d, 4, tq::Metric::cosine));
  b3.add(200, x.data());
  b4.add(200, x.data());
  EXPECT_DOUBLE_EQ(b3.memory_bytes_per_vector(), b4.memory_bytes_per_vector());
  EXPECT_EQ(b3.code_bytes(), 2u + 12u);  // f16 scale + 32 * 3 bits
  EXPECT_EQ(b4.code_bytes(), 2u + 16u);
  // Kept vectors count in memory and on disk.
  auto c = cfg_of(d, 4, tq::Metric::cosine);
  c.keep_vectors = true;
  tq::Index kv(c);
  kv.add(200, x.data());
  EXPECT_DOUBLE_EQ(kv.memory_bytes_per_vector(), b4.memory_bytes_per_vector() + 4.0 * d);
  EXPECT_EQ(kv.file_bytes(), 128 + 200 * (kv.code_bytes() + 8 + 4 * d));
  // IVF: list padding and the centroid tables are spread over the vectors.
  tq::Index iv(ivf_cfg(d, 4, tq::Metric::cosine, 4));
  iv.add(200, x.data());
  size_t slots = 0;
  for (int l = 0; l < 4; ++l) slots += (iv.list_size(l) + 31) / 32 * 32;
  const double per_slot = 16 + 4 + 8;  // 32 channels * 4 bits, float scale, id
  EXPECT_NEAR(iv.memory_bytes_per_vector(), (per_slot * slots + 4 * d * 8.0 + 4 * 4 + 9 * 8) / 200, 1e-9);
  EXPECT_EQ(iv.file_bytes(), 128 + 16 + 4 * d * 4 + 4 * 8 + 200 * (iv.code_bytes() + 8));
  EXPECT_NE(iv.describe_search(fast).find("nprobe 1"), std::string::npos);
}

// ---------------------------------------------------------------------------------------
// Shards: train / set_center share one fit; search_candidates of shards merge into exactly
// the single index's search (the rule of include/tq/index.h, as python/turboquant/sharded.py
// applies it).

TEST(Index, TrainAndSetCenterShareOneFit) {
  const int d = 48;
  auto x = make_data(600, d, 40), q = make_data(20, d, 41);
  for (auto m : {tq::Metric::cosine, tq::Metric::ip, tq::Metric::l2}) {
    auto c = cfg_of(d, 4, m);
    c.center = true;
    c.fit_scale = true;
    tq::Index single(c), trained(c), copy(c);
    single.add(600, x.data());
    trained.train(400, x.data());  // a different batch than the first add below
    EXPECT_EQ(trained.size(), 0u);
    tq::Index ref(c);
    ref.add(400, x.data());  // the fit of the first add() of the same rows, bit for bit
    ASSERT_EQ(trained.center().size(), static_cast<size_t>(d));
    EXPECT_EQ(std::memcmp(trained.center().data(), ref.center().data(), d * sizeof(float)), 0);
    // train(all rows) + add == add: same codes, same results.
    tq::Index t2(c);
    t2.train(600, x.data());
    copy.set_center(t2.center().data());
    copy.add(300, x.data());
    copy.add(300, x.data() + 300 * d);
    auto a = run(single, q, 10), b = run(copy, q, 10);
    EXPECT_EQ(a.id, b.id) << tq::metric_name(m);
    EXPECT_EQ(std::memcmp(a.s.data(), b.s.data(), a.s.size() * sizeof(float)), 0) << tq::metric_name(m);
    // Errors: a second fit, a non-empty index, no center option, IVF, non-finite center.
    EXPECT_THROW(t2.train(600, x.data()), tq::Error);
    EXPECT_THROW(single.train(10, x.data()), tq::Error);
    EXPECT_THROW(single.set_center(t2.center().data()), tq::Error);
    EXPECT_THROW(trained.train(0, x.data()), tq::Error);
    std::vector<float> bad(t2.center());
    bad[3] = std::numeric_limits<float>::quiet_NaN();
    tq::Index fresh(c);
    EXPECT_THROW(fresh.set_center(bad.data()), tq::Error);
    auto nc = c;
    nc.center = false;
    tq::Index plain(nc);
    EXPECT_THROW(plain.set_center(t2.center().data()), tq::Error);
    plain.train(100, x.data());  // nothing to fit: a no-op
    EXPECT_TRUE(plain.center().empty());
    auto ic = cfg_of(d, 4, m);
    ic.nlist = 4;
    tq::Index ivf(ic);
    EXPECT_THROW(ivf.train(100, x.data()), tq::Error);
  }
}

namespace {

// Merge of the shards' candidates (include/tq/index.h): slots map to global positions
// slot * S + s (rows dealt round-robin). Returns the merged top-k.
Results merge_shards(const std::vector<tq::Index>& shards, const std::vector<float>& q, int k, tq::SearchParams p) {
  p.k = k;
  const size_t S = shards.size(), d = shards[0].dim(), nq = q.size() / d;
  const size_t r = shards[0].candidates_per_query(p);
  struct C {
    float s1, s2, s3, out;
    int64_t id, pos;
  };
  std::vector<std::vector<C>> per(nq);
  for (size_t s = 0; s < S; ++s) {
    std::vector<float> s1(nq * r), s2(nq * r), s3(nq * r), out(nq * r);
    std::vector<int64_t> id(nq * r), slot(nq * r);
    shards[s].search_candidates(nq, q.data(), p, s1.data(), s2.data(), s3.data(), out.data(), id.data(), slot.data());
    for (size_t i = 0; i < nq; ++i)
      for (size_t j = 0; j < r; ++j)
        if (slot[i * r + j] >= 0)
          per[i].push_back({s1[i * r + j], s2[i * r + j], s3[i * r + j], out[i * r + j], id[i * r + j],
                            slot[i * r + j] * static_cast<int64_t>(S) + static_cast<int64_t>(s)});
  }
  const size_t r2 = std::max(static_cast<size_t>(k), static_cast<size_t>(p.rerank_full));
  Results res{std::vector<float>(nq * k), std::vector<int64_t>(nq * k, -1)};
  for (size_t i = 0; i < nq; ++i) {
    auto& v = per[i];
    auto stage = [&](float C::*f, size_t keep) {
      std::sort(v.begin(), v.end(), [&](const C& a, const C& b) { return a.*f > b.*f || (a.*f == b.*f && a.pos < b.pos); });
      if (v.size() > keep) v.resize(keep);
    };
    stage(&C::s1, r);
    stage(&C::s2, r2);
    stage(&C::s3, static_cast<size_t>(k));
    for (size_t j = 0; j < static_cast<size_t>(k); ++j) {
      res.s[i * k + j] = j < v.size() ? v[j].out
                                      : (shards[0].config().metric == tq::Metric::l2 ? std::numeric_limits<float>::infinity()
                                                                                      : -std::numeric_limits<float>::infinity());
      if (j < v.size()) res.id[i * k + j] = v[j].id;
    }
  }
  return res;
}

}  // namespace

TEST(Index, ShardCandidatesMergeIntoTheSingleIndexResult) {
  const int d = 64;
  const size_t n = small() ? 900 : 2500, nq = 40;
  auto x = make_data(n, d, 50), q = make_data(nq, d, 51);
  // Duplicated rows (exact ties in every stage) and a coarse 1-bit index (many scan ties).
  for (size_t i = 0; i < 200; ++i) std::memcpy(x.data() + (n - 1 - i) * d, x.data() + (3 * i) * d, d * sizeof(float));
  struct Case {
    double bits;
    tq::Metric m;
    bool center, fit, keep, prod;
    tq::SearchParams p;
  };
  tq::SearchParams dflt, rr0, nofast, full, wide;
  rr0.rerank = 0;
  nofast.fast_scan = false;
  full.rerank_full = 40;
  wide.rerank = 100;
  const std::vector<Case> cases = {
      {4, tq::Metric::cosine, true, true, false, false, dflt},  {4, tq::Metric::ip, true, true, false, false, dflt},
      {4, tq::Metric::l2, true, true, false, false, dflt},      {1, tq::Metric::cosine, false, false, false, false, dflt},
      {3.5, tq::Metric::l2, true, false, false, false, wide},   {2, tq::Metric::cosine, true, true, false, false, rr0},
      {4, tq::Metric::ip, true, true, false, false, nofast},    {8, tq::Metric::cosine, true, true, false, false, dflt},
      {4, tq::Metric::l2, true, true, true, false, full},       {2, tq::Metric::cosine, true, true, true, false, full},
      {4, tq::Metric::cosine, false, false, false, true, dflt},
  };
  for (const Case& cs : cases) {
    auto c = cfg_of(d, cs.bits, cs.m);
    if (cs.prod) c.codec = tq::QuantizerKind::prod;
    c.center = cs.center;
    c.fit_scale = cs.fit;
    c.keep_vectors = cs.keep;
    const std::string what = std::string(tq::metric_name(cs.m)) + " bits " + std::to_string(cs.bits);
    tq::Index single(c);
    const size_t n1 = n * 2 / 5;  // two add batches (1000 + 1500 rows; 360 + 540 small)
    single.add(n1, x.data());
    single.add(n - n1, x.data() + n1 * d);
    for (size_t S : {1, 2, 3}) {
      std::vector<tq::Index> shards;
      tq::Index tpl(c);
      tpl.train(n1, x.data());  // the first batch, as the single index fits it
      for (size_t s = 0; s < S; ++s) {
        shards.emplace_back(c);
        if (c.center) shards.back().set_center(tpl.center().data());
      }
      // Rows dealt round-robin by global position, ids = positions (as the single index's).
      for (auto [b0, b1] : {std::pair<size_t, size_t>{0, n1}, {n1, n}})
        for (size_t s = 0; s < S; ++s) {
          std::vector<float> xs;
          std::vector<int64_t> ids;
          for (size_t g = b0; g < b1; ++g)
            if (g % S == s) {
              xs.insert(xs.end(), x.begin() + g * d, x.begin() + (g + 1) * d);
              ids.push_back(static_cast<int64_t>(g));
            }
          shards[s].add(ids.size(), xs.data(), ids.data());
        }
      for (int k : {1, 37}) {
        auto a = run(single, q, k, cs.p);
        auto b = merge_shards(shards, q, k, cs.p);
        EXPECT_EQ(a.id, b.id) << what << " S " << S << " k " << k;
        EXPECT_EQ(std::memcmp(a.s.data(), b.s.data(), a.s.size() * sizeof(float)), 0) << what << " S " << S << " k " << k;
      }
    }
  }
  // More candidates than vectors: missing rows are marked, the merge still equals.
  auto c = cfg_of(d, 4, tq::Metric::cosine);
  tq::Index tiny(c);
  tiny.add(5, x.data());
  tq::SearchParams p;
  p.k = 8;
  const size_t r = tiny.candidates_per_query(p);
  EXPECT_EQ(r, 24u);
  std::vector<float> s1(r), s2(r), s3(r), out(r);
  std::vector<int64_t> id(r), slot(r);
  tiny.search_candidates(1, q.data(), p, s1.data(), s2.data(), s3.data(), out.data(), id.data(), slot.data());
  EXPECT_EQ(slot[4] >= 0, true);
  EXPECT_EQ(slot[5], -1);
  EXPECT_EQ(id[5], -1);
  EXPECT_TRUE(std::isinf(s1[5]) && s1[5] < 0);
  auto ic = cfg_of(d, 4, tq::Metric::cosine);
  ic.nlist = 2;
  tq::Index ivf(ic);
  ivf.add(100, x.data());
  EXPECT_THROW(ivf.search_candidates(1, q.data(), p, s1.data(), s2.data(), s3.data(), out.data(), id.data(), slot.data()),
               tq::Error);
}

// ---------------------------------------------------------------------------------------
// Trellis codes (IndexConfig::trellis)

// Every score of a trellis index is scale * <Pi q, decoded codes>: the codes are those of
// trellis_encode on the rotated unit vector (no fit, no centre), decoded by trellis_decode,
// and a search over all vectors without re-ranking returns exactly those estimates.
TEST(IndexTrellis, ScoresAreTheDecodedTrellisCodes) {
  const int d = 40;
  const size_t n = 300, nq = 4;
  auto x = make_data(n, d, 61), q = make_data(nq, d, 62);
  for (int bits : {1, 2, 4}) {
    auto c = cfg_of(d, bits, tq::Metric::ip);
    c.trellis = true;
    tq::Index idx(c);
    idx.add(n, x.data());
    const auto& I = idx.impl();
    const tq::TrellisCode& tc = tq::get_trellis(d, bits);
    std::vector<float> u(d), y(d), dec(d), qr(nq * d);
    std::vector<uint8_t> got(d), want(d);
    std::vector<float> est(nq * n);
    I.rot->forward(nq, q.data(), qr.data());
    for (size_t i = 0; i < n; ++i) {
      double s2 = 0;
      for (int j = 0; j < d; ++j) s2 += double(x[i * d + j]) * x[i * d + j];
      for (int j = 0; j < d; ++j) u[j] = static_cast<float>(x[i * d + j] / std::sqrt(s2));
      I.rot->forward(1, u.data(), y.data());
      tq::trellis_encode(tc, y.data(), want.data());
      I.get_indices(i, got.data());
      ASSERT_EQ(got, want) << bits << " bits, vector " << i;
      tq::trellis_decode(tc, got.data(), dec.data());
      for (size_t b = 0; b < nq; ++b) {
        double dot = 0;
        for (int j = 0; j < d; ++j) dot += double(qr[b * d + j]) * dec[j];
        est[b * n + i] = static_cast<float>(I.scale[i] * dot);
      }
    }
    tq::SearchParams p;
    p.fast_scan = false;  // float tables over every vector
    p.rerank = 0;
    auto r = run(idx, q, static_cast<int>(n), p);
    // The uint8 scan with every vector re-ranked returns the same (trellis_scan_u8 is only a
    // shortlist), and so does the default search for the first 10.
    tq::SearchParams pf;
    pf.rerank = static_cast<int>(n);
    expect_same_up_to_ties(run(idx, q, static_cast<int>(n), pf), r, nq, static_cast<int>(n), "trellis fast scan");
    for (size_t b = 0; b < nq; ++b)
      for (size_t j = 0; j < n; ++j) {
        const int64_t id = r.id[b * n + j];
        ASSERT_GE(id, 0);
        EXPECT_NEAR(r.s[b * n + j], est[b * n + static_cast<size_t>(id)], 1e-4f * (1.f + std::fabs(r.s[b * n + j])))
            << bits << " bits";
      }
    EXPECT_NE(idx.describe().find("trellis"), std::string::npos);
    EXPECT_NE(idx.describe_search(p).find("float-lut"), std::string::npos);
    EXPECT_NE(idx.describe_search(pf).find("trellis-scan"), std::string::npos);
  }
}

// At the same bits per channel, trellis codes rank better than the scalar codes: recall of
// the exact top-10 among the first 10 on clustered data, with the flat defaults (centre,
// grid fit) on both.
TEST(IndexTrellis, HigherRecallThanScalarCodesAtTheSameBits) {
  const int d = 64;
  const size_t n = small() ? 2000 : 6000, nq = 200;
  auto x = make_data(n, d, 63, 0.6f), q = make_data(nq, d, 64, 0.6f);
  auto gt = exact(tq::Metric::cosine, x, q, d, 10);
  for (int bits : {2, 4}) {
    double rec[2];
    for (int t = 0; t < 2; ++t) {
      auto c = cfg_of(d, bits, tq::Metric::cosine);
      c.center = c.fit_scale = true;
      c.trellis = t == 1;
      tq::Index idx(c);
      idx.add(n, x.data());
      EXPECT_EQ(idx.code_bytes(), 2 + tq::packed_bytes(d, bits));  // the same bytes on disk
      auto r = run(idx, q, 10);
      size_t hit = 0;
      for (size_t i = 0; i < nq; ++i)
        for (int a = 0; a < 10; ++a)
          for (int b = 0; b < 10; ++b) hit += r.id[i * 10 + a] == gt.id[i * 10 + b];
      rec[t] = static_cast<double>(hit) / (10.0 * nq);
    }
    EXPECT_GT(rec[1], rec[0] + 0.01) << bits << " bits: trellis " << rec[1] << ", scalar " << rec[0];
  }
}

TEST(IndexTrellis, SaveLoadRoundTripIncrementalAddAndBadInput) {
  TempDir t;
  const int d = 24;
  auto x = make_data(500, d, 65), q = make_data(10, d, 66);
  for (auto m : {tq::Metric::cosine, tq::Metric::l2}) {
    auto c = cfg_of(d, m == tq::Metric::l2 ? 2 : 3, m);
    c.trellis = true;
    c.center = c.fit_scale = true;
    c.keep_vectors = m == tq::Metric::l2;
    tq::Index idx(c);
    idx.add(300, x.data());
    idx.save(t.path("t.tqi"));
    const auto bytes = slurp(t.path("t.tqi"));
    EXPECT_EQ(bytes[8], 5);  // version 5: earlier builds refuse it rather than misread the codes
    EXPECT_EQ(bytes.size(), 128 + 4 * d + 300 * (idx.code_bytes() + 8 + (c.keep_vectors ? 4 * d : 0)));
    auto back = tq::Index::load(t.path("t.tqi"));
    EXPECT_TRUE(back.config().trellis);
    EXPECT_EQ(back.describe(), idx.describe());
    EXPECT_EQ(run(back, q, 10).id, run(idx, q, 10).id);
    EXPECT_EQ(run(back, q, 10).s, run(idx, q, 10).s);
    back.save(t.path("t2.tqi"));
    EXPECT_EQ(slurp(t.path("t2.tqi")), bytes);
    // Adding to the loaded index equals adding to the original.
    idx.add(200, x.data() + 300 * d);
    back.add(200, x.data() + 300 * d);
    EXPECT_EQ(run(back, q, 10).id, run(idx, q, 10).id);
    // The same file with the scalar codes' version loads as a scalar index (the layout is
    // version 1's), and a version-5 file of a width trellis codes do not take is refused.
    auto f = bytes;
    st32(f.data() + 8, 1);
    fix_header_checksum(f);
    EXPECT_FALSE(tq::Index::from_bytes(f.data(), f.size(), "v1").config().trellis);
    f = bytes;
    f[26] = 10;  // 5 bits
    fix_header_checksum(f);
    try {
      tq::Index::from_bytes(f.data(), f.size(), "wide");
      ADD_FAILURE() << "a 5-bit trellis file loaded";
    } catch (const tq::Error& e) {
      EXPECT_NE(std::string(e.what()).find("trellis"), std::string::npos) << e.what();
    }
  }
  // Configurations trellis codes do not take.
  auto bad = [&](double bits, int nlist, tq::QuantizerKind codec, int dim) {
    auto c = cfg_of(dim, bits, tq::Metric::cosine);
    c.trellis = true;
    c.nlist = nlist;
    c.codec = codec;
    EXPECT_THROW(tq::Index{c}, tq::Error) << bits << " " << nlist << " " << dim;
  };
  bad(5, 0, tq::QuantizerKind::mse, 16);
  bad(2.5, 0, tq::QuantizerKind::mse, 16);
  bad(4, 4, tq::QuantizerKind::mse, 16);
  bad(2, 0, tq::QuantizerKind::prod, 16);
  bad(1, 0, tq::QuantizerKind::mse, 4);  // dim * bits < 8
}

// ---------------------------------------------------------------------------------------
// remove_ids

namespace {
// Ids of the vectors in `ids` whose position i has i % 3 == 0, plus the first and the last,
// an id the index does not hold and one repeat.
std::vector<int64_t> ids_to_remove(const std::vector<int64_t>& ids) {
  std::vector<int64_t> r;
  for (size_t i = 0; i < ids.size(); i += 3) r.push_back(ids[i]);
  r.push_back(ids.front());
  r.push_back(ids.back());
  r.push_back(-123456789);
  return r;
}
// The rows of x (n * d) and their ids that are not in `gone`, in order.
void kept_rows(const std::vector<float>& x, int d, const std::vector<int64_t>& ids, const std::vector<int64_t>& gone,
               std::vector<float>* kx, std::vector<int64_t>* kid) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (std::find(gone.begin(), gone.end(), ids[i]) != gone.end()) continue;
    kx->insert(kx->end(), x.begin() + i * d, x.begin() + (i + 1) * d);
    kid->push_back(ids[i]);
  }
}
}  // namespace

TEST(IndexRemove, FlatEqualsAnIndexGivenOnlyTheKeptVectors) {
  TempDir t;
  const int d = 40;
  const size_t N = 301;  // not a whole number of 32- or 64-vector blocks
  auto x = make_data(N, d, 71), q = make_data(12, d, 72);
  std::vector<int64_t> ids(N);
  for (size_t i = 0; i < N; ++i) ids[i] = 1000 + static_cast<int64_t>(i) * 5;
  ids[10] = ids[11];  // two vectors share an id: both go
  struct Case { tq::Metric m; double bits; bool center, keep, trellis; tq::QuantizerKind codec; };
  for (const Case& cs : {Case{tq::Metric::cosine, 4, true, false, false, tq::QuantizerKind::mse},
                         Case{tq::Metric::l2, 2.5, false, true, false, tq::QuantizerKind::mse},
                         Case{tq::Metric::ip, 6, false, false, false, tq::QuantizerKind::mse},
                         Case{tq::Metric::l2, 1.5, true, false, false, tq::QuantizerKind::mse},
                         Case{tq::Metric::cosine, 3, true, false, true, tq::QuantizerKind::mse},
                         Case{tq::Metric::l2, 2, false, true, true, tq::QuantizerKind::mse},
                         Case{tq::Metric::l2, 3, false, false, false, tq::QuantizerKind::prod}}) {
    auto c = cfg_of(d, cs.bits, cs.m);
    c.center = c.fit_scale = cs.center;
    c.keep_vectors = cs.keep;
    c.trellis = cs.trellis;
    c.codec = cs.codec;
    tq::Index a(c);
    a.add(N, x.data(), ids.data());
    const auto gone = ids_to_remove(ids);
    std::vector<float> kx;
    std::vector<int64_t> kid;
    kept_rows(x, d, ids, gone, &kx, &kid);
    const size_t removed = a.remove_ids(gone.size(), gone.data());
    EXPECT_EQ(removed, N - kid.size()) << a.describe();
    ASSERT_EQ(a.size(), kid.size());
    EXPECT_EQ(a.ids(), kid) << a.describe();  // the kept ids, in insertion order
    // The index given only the kept vectors, with the same fit.
    tq::Index b(c);
    if (cs.center) b.set_center(a.center().data());
    b.add(kid.size(), kx.data(), kid.data());
    a.save(t.path("a.tqi"));
    b.save(t.path("b.tqi"));
    EXPECT_EQ(slurp(t.path("a.tqi")), slurp(t.path("b.tqi"))) << a.describe();
    tq::SearchParams p;
    p.rerank_full = cs.keep ? 20 : 0;
    auto ra = run(a, q, 10, p), rb = run(b, q, 10, p);
    EXPECT_EQ(ra.id, rb.id) << a.describe();
    EXPECT_EQ(ra.s, rb.s) << a.describe();
    // Removing ids it no longer holds changes nothing; later adds go after the kept vectors.
    EXPECT_EQ(a.remove_ids(gone.size(), gone.data()), 0u);
    a.add(40, x.data(), ids.data());
    b.add(40, x.data(), ids.data());
    a.save(t.path("a.tqi"));
    b.save(t.path("b.tqi"));
    EXPECT_EQ(slurp(t.path("a.tqi")), slurp(t.path("b.tqi"))) << a.describe();
  }
}

TEST(IndexRemove, IvfRanksAsBeforeWithoutTheRemoved) {
  TempDir t;
  const int d = 40;
  const size_t N = 900;
  auto x = make_data(N, d, 73), q = make_data(15, d, 74);
  std::vector<int64_t> ids(N);
  for (size_t i = 0; i < N; ++i) ids[i] = 7000000000LL - static_cast<int64_t>(i) * 3;
  struct Case { tq::Metric m; double bits; bool keep; int rerank_bits; };
  for (const Case& cs : {Case{tq::Metric::cosine, 4, false, 0}, Case{tq::Metric::l2, 2.5, true, 0},
                         Case{tq::Metric::ip, 4, false, 4}, Case{tq::Metric::cosine, 3, true, 8}}) {
    auto c = ivf_cfg(d, cs.bits, cs.m, 9);
    c.keep_vectors = cs.keep;
    c.rerank_bits = cs.rerank_bits;
    tq::Index a(c);
    a.add(600, x.data(), ids.data());
    a.add(N - 600, x.data() + 600 * d, ids.data() + 600);
    a.save(t.path("before.tqi"));
    const auto before = tq::Index::load(t.path("before.tqi"));
    const auto gone = ids_to_remove(ids);
    const size_t removed = a.remove_ids(gone.size(), gone.data());
    EXPECT_EQ(removed, (N + 2) / 3 + 1) << a.describe();  // every third, and the last
    EXPECT_EQ(a.size(), N - removed);
    size_t listed = 0;
    for (int l = 0; l < 9; ++l) listed += a.list_size(l);
    EXPECT_EQ(listed, a.size());
    // ids(): list by list, so the kept ids in some order; each list's in insertion order.
    auto held = a.ids();
    std::vector<int64_t> kept;
    for (int64_t id : ids)
      if (std::find(gone.begin(), gone.end(), id) == gone.end()) kept.push_back(id);
    ASSERT_EQ(held.size(), kept.size());
    for (size_t at = 0, l = 0; l < 9; at += a.list_size(static_cast<int>(l)), ++l)
      EXPECT_TRUE(std::is_sorted(held.begin() + at, held.begin() + at + a.list_size(static_cast<int>(l)),
                                 std::greater<>()))  // the ids fall with the insertion position
          << "list " << l;
    std::sort(held.begin(), held.end());
    std::sort(kept.begin(), kept.end());
    EXPECT_EQ(held, kept);
    EXPECT_LT(a.file_bytes(), before.file_bytes());
    // Every list probed and every vector re-ranked: the full ranking is the one before,
    // without the removed vectors, score for score.
    tq::SearchParams p;
    p.nprobe = 9;
    p.rerank_full = cs.keep ? static_cast<int>(N) : 0;
    const int kb = static_cast<int>(N), ka = static_cast<int>(a.size());
    auto rb = run(before, q, kb, p), ra = run(a, q, ka, p);
    for (size_t i = 0; i < q.size() / d; ++i) {
      std::vector<int64_t> want_id;
      std::vector<float> want_s;
      for (int j = 0; j < kb; ++j) {
        const int64_t id = rb.id[i * kb + j];
        if (std::find(gone.begin(), gone.end(), id) != gone.end()) continue;
        want_id.push_back(id);
        want_s.push_back(rb.s[i * kb + j]);
      }
      EXPECT_EQ(std::vector<int64_t>(ra.id.begin() + i * ka, ra.id.begin() + (i + 1) * ka), want_id)
          << a.describe() << " query " << i;
      EXPECT_EQ(std::vector<float>(ra.s.begin() + i * ka, ra.s.begin() + (i + 1) * ka), want_s)
          << a.describe() << " query " << i;
    }
    // Saved and loaded: the same file and results.
    a.save(t.path("after.tqi"));
    auto back = tq::Index::load(t.path("after.tqi"));
    back.save(t.path("after2.tqi"));
    EXPECT_EQ(slurp(t.path("after.tqi")), slurp(t.path("after2.tqi")));
    p.nprobe = 3;
    p.rerank_full = cs.keep ? 20 : 0;
    EXPECT_EQ(run(back, q, 10, p).id, run(a, q, 10, p).id);
    // The removed vectors added back (same lists, no new k-means): the same scores per id.
    std::vector<float> gx;
    std::vector<int64_t> gid;
    for (size_t i = 0; i < N; ++i)
      if (std::find(gone.begin(), gone.end(), ids[i]) != gone.end()) {
        gx.insert(gx.end(), x.begin() + i * d, x.begin() + (i + 1) * d);
        gid.push_back(ids[i]);
      }
    a.add(gid.size(), gx.data(), gid.data());
    for (int l = 0; l < 9; ++l) EXPECT_EQ(a.list_size(l), before.list_size(l));
    p.nprobe = 9;
    p.rerank_full = cs.keep ? static_cast<int>(N) : 0;
    auto rr = run(a, q, kb, p);
    for (size_t i = 0; i < q.size() / d; ++i) {
      std::vector<std::pair<int64_t, float>> got, want;
      for (int j = 0; j < kb; ++j) {
        got.emplace_back(rr.id[i * kb + j], rr.s[i * kb + j]);
        want.emplace_back(rb.id[i * kb + j], rb.s[i * kb + j]);
      }
      std::sort(got.begin(), got.end());
      std::sort(want.begin(), want.end());
      EXPECT_EQ(got, want) << a.describe() << " query " << i;
    }
  }
}

TEST(IndexRemove, EmptiedIndexesAndDefaultIds) {
  const int d = 16;
  auto x = make_data(200, d, 75), q = make_data(4, d, 76);
  for (int nlist : {0, 4}) {
    auto c = nlist ? ivf_cfg(d, 4, tq::Metric::l2, nlist) : cfg_of(d, 4, tq::Metric::l2);
    tq::Index idx(c);
    EXPECT_EQ(idx.next_id(), 0);
    idx.add(100, x.data());  // ids 0..99
    EXPECT_EQ(idx.next_id(), 100);
    const int64_t last = 99;
    EXPECT_EQ(idx.remove_ids(1, &last), 1u);
    EXPECT_EQ(idx.next_id(), 99);  // one past the largest id held, so never one in use
    idx.add(2, x.data() + 100 * d);
    EXPECT_EQ(idx.size(), 101u);
    EXPECT_EQ(idx.next_id(), 101);
    const int64_t big[2] = {5000, 7};
    idx.add(2, x.data() + 110 * d, big);
    EXPECT_EQ(idx.next_id(), 5001);
    // Everything removed: an empty index that searches (ids -1) and takes vectors again,
    // into the lists it had (an IVF index does not train again).
    std::vector<int64_t> all(6000);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
    EXPECT_EQ(idx.remove_ids(all.size(), all.data()), 103u);
    EXPECT_EQ(idx.size(), 0u);
    EXPECT_EQ(idx.next_id(), 0);
    tq::SearchParams p;
    p.nprobe = nlist ? 2 : 1;
    for (int64_t id : run(idx, q, 3, p).id) EXPECT_EQ(id, -1);
    idx.add(50, x.data() + 150 * d);
    EXPECT_EQ(idx.size(), 50u);
    tq::Index fresh(c);
    if (nlist) {
      fresh.add(100, x.data());
      std::vector<int64_t> first(100);
      for (size_t i = 0; i < 100; ++i) first[i] = static_cast<int64_t>(i);
      fresh.remove_ids(100, first.data());
      fresh.add(50, x.data() + 150 * d);
    } else {
      fresh.add(50, x.data() + 150 * d);
    }
    EXPECT_EQ(run(idx, q, 5, p).id, run(fresh, q, 5, p).id);
    // Bad input: null ids; nothing to remove is a no-op.
    EXPECT_THROW(idx.remove_ids(3, nullptr), tq::Error);
    EXPECT_EQ(idx.remove_ids(0, nullptr), 0u);
    EXPECT_EQ(idx.size(), 50u);
    // No id past INT64_MAX: default ids refuse, given ids still go in.
    const int64_t top = std::numeric_limits<int64_t>::max();
    idx.add(1, x.data(), &top);
    try {
      idx.add(1, x.data());
      ADD_FAILURE() << "a default id past INT64_MAX";
    } catch (const tq::Error& e) {
      EXPECT_NE(std::string(e.what()).find("INT64_MAX"), std::string::npos) << e.what();
    }
    const int64_t one = 1;
    idx.add(1, x.data(), &one);
    EXPECT_EQ(idx.size(), 52u);
    // Negative ids: the next default id is still one past the largest.
    tq::Index neg(c);
    const int64_t low[5] = {-9, std::numeric_limits<int64_t>::min(), -3, -100, -50};
    neg.add(5, x.data(), low);
    EXPECT_EQ(neg.next_id(), -2);
    neg.add(3, x.data() + 5 * d);
    EXPECT_EQ(neg.next_id(), 1);
  }
}

// An exception from the progress callback cancels add() at any stage: rethrown as is, and the
// index is as it was (the same file), so the same add then gives what it would have given.
TEST(IndexAdd, AProgressExceptionCancelsTheAddAndLeavesTheIndexAsItWas) {
  TempDir t;
  const int d = 24;
  auto x = make_data(3000, d, 77);
  struct Stop {};
  struct Case { int nlist; bool trellis; bool first_batch; const char* stage; };
  for (const Case& cs : {Case{0, false, true, "encode"}, Case{0, false, false, "encode"}, Case{0, true, true, "encode"},
                         Case{6, false, true, "k-means"}, Case{6, false, true, "assign"}, Case{6, false, true, "encode"},
                         Case{6, false, false, "assign"}, Case{6, false, false, "encode"}}) {
    auto c = cs.nlist ? ivf_cfg(d, 4, tq::Metric::cosine, cs.nlist) : cfg_of(d, 3, tq::Metric::l2);
    c.trellis = cs.trellis;
    c.center = c.fit_scale = cs.nlist == 0;
    const std::string what = std::string(cs.stage) + (cs.nlist ? " ivf" : " flat") + (cs.first_batch ? " first" : " later");
    tq::Index idx(c), ref(c);
    if (!cs.first_batch) {
      idx.add(1000, x.data());
      ref.add(1000, x.data());
    }
    idx.save(t.path("before.tqi"));
    std::vector<std::string> seen;
    try {
      idx.add(2000, x.data() + 1000 * d, nullptr, [&](const char* stage, size_t done, size_t total) {
        seen.emplace_back(stage);
        if (std::string(stage) == cs.stage && (done > 0 || done == total)) throw Stop{};
      });
      ADD_FAILURE() << what << ": the add went through";
    } catch (const Stop&) {
    }
    EXPECT_NE(std::find(seen.begin(), seen.end(), cs.stage), seen.end()) << what;
    EXPECT_EQ(idx.size(), cs.first_batch ? 0u : 1000u) << what;
    idx.save(t.path("after.tqi"));
    EXPECT_EQ(slurp(t.path("after.tqi")), slurp(t.path("before.tqi"))) << what;
    // The same add again, without a callback: what it gives on an index that never saw the
    // cancelled one.
    idx.add(2000, x.data() + 1000 * d);
    ref.add(2000, x.data() + 1000 * d);
    idx.save(t.path("a.tqi"));
    ref.save(t.path("b.tqi"));
    EXPECT_EQ(slurp(t.path("a.tqi")), slurp(t.path("b.tqi"))) << what;
  }
}

// ---------------------------------------------------------------------------------------
// Two-level scan (sign plane, then full codes for the vectors the bound cannot rule out)

namespace {
// Sets the two-level bound's eps for one scope (the default again after it).
struct ScopedTwoLevelEps {
  explicit ScopedTwoLevelEps(float e) { tq::set_two_level_eps(e); }
  ~ScopedTwoLevelEps() { tq::set_two_level_eps(0.f); }
};
tq::SearchParams two_level(int on) {
  tq::SearchParams p;
  p.two_level = on;
  return p;
}
}  // namespace

TEST(IndexTwoLevel, WithAnUnboundedBarItIsTheFloatLutSearch) {
  // eps so large that no vector is ruled out: every vector is scored with its float LUT in slot
  // order, as the float-LUT search does, so ids and scores are the same, at every SIMD level.
  // d = 385: a last sign group of one channel; n not a whole number of blocks.
  const size_t n = 1001, nq = 16;
  for (int d : {385, 400}) {
    auto x = make_data(n, d, 11), q = make_data(nq, d, 12);
    for (tq::Metric m : {tq::Metric::cosine, tq::Metric::l2, tq::Metric::ip})
      for (double bits : {3.0, 3.5, 4.0}) {
        auto c = cfg_of(d, bits, m);
        c.center = c.fit_scale = (m != tq::Metric::ip);
        tq::Index idx(c);
        idx.add(n, x.data());
        ASSERT_NE(idx.describe_search(two_level(-1)).find("two-level"), std::string::npos) << idx.describe();
        tq::SearchParams pf;
        pf.fast_scan = false;
        const auto ref = run(idx, q, 10, pf);
        ScopedTwoLevelEps big(1e30f);
        for (const auto& level : tq::simd::available_levels()) {
          tq::simd::ScopedLevel sl(level);
          const auto got = run(idx, q, 10, two_level(1));
          EXPECT_EQ(got.id, ref.id) << idx.describe() << " " << level;
          EXPECT_EQ(got.s, ref.s) << idx.describe() << " " << level;
        }
      }
  }
  // IVF: each probed list's slots scored with the list's float LUTs (l2: of Pi (q - c_l)) plus its
  // offset, as the float-LUT scan of the same lists; with a second-stage code, its re-rank of the
  // same shortlist follows.
  const int d = 390;
  auto x = make_data(n, d, 13), q = make_data(nq, d, 14);
  for (tq::Metric m : {tq::Metric::cosine, tq::Metric::l2, tq::Metric::ip})
    for (double bits : {3.0, 3.5, 4.0})
      for (int rb : {0, 4}) {
        auto c = cfg_of(d, bits, m);
        c.nlist = 8;
        c.rerank_bits = rb;
        tq::Index idx(c);
        idx.add(n, x.data());
        for (int np : {1, 3}) {
          tq::SearchParams pf, pt = two_level(1);
          pf.fast_scan = false;
          pf.nprobe = pt.nprobe = np;
          ASSERT_NE(idx.describe_search(pt).find("two-level"), std::string::npos) << idx.describe();
          const auto ref = run(idx, q, 10, pf);
          ScopedTwoLevelEps big(1e30f);
          for (const auto& level : tq::simd::available_levels()) {
            tq::simd::ScopedLevel sl(level);
            const auto got = run(idx, q, 10, pt);
            EXPECT_EQ(got.id, ref.id) << idx.describe() << " nprobe " << np << " " << level;
            EXPECT_EQ(got.s, ref.s) << idx.describe() << " nprobe " << np << " " << level;
          }
        }
      }
}

TEST(IndexTwoLevel, TheBoundKeepsTheFloatLutResultsAndScoresAreExact) {
  // With the default eps: the results are (nearly always) the float-LUT search's, and every score
  // returned is the float-LUT score of its vector (the second level scores exactly).
  const int d = 384;
  const size_t n = small() ? 1500 : 4000, nq = 200;
  const int k = 10;
  auto x = make_data(n, d, 21), q = make_data(nq, d, 22);
  for (tq::Metric m : {tq::Metric::cosine, tq::Metric::l2})
    for (int nlist : {0, 16}) {
      auto c = cfg_of(d, 4, m);
      c.center = c.fit_scale = nlist == 0;
      c.nlist = nlist;
      tq::Index idx(c);
      idx.add(n, x.data());
      // IVF: 4 of 16 lists; `all` scores every vector of the probed lists (the rest pad with -1).
      tq::SearchParams pf, pt = two_level(1), po = two_level(0);
      pf.fast_scan = false;
      pf.nprobe = pt.nprobe = po.nprobe = nlist > 0 ? 4 : 1;
      const auto all = run(idx, q, static_cast<int>(n), pf);  // every vector's float-LUT score
      const auto ref = run(idx, q, k, pf);
      const auto got = run(idx, q, k, pt);
      const auto one = run(idx, q, k, po);
      size_t same = 0;
      for (size_t i = 0; i < nq; ++i) {
        for (int r = 0; r < k; ++r) {
          const int64_t id = got.id[i * k + r];
          ASSERT_GE(id, 0);
          const auto* row = all.id.data() + i * n;
          const size_t at = static_cast<size_t>(std::find(row, row + n, id) - row);
          ASSERT_LT(at, n);
          EXPECT_EQ(got.s[i * k + r], all.s[i * n + at]) << "query " << i << " rank " << r;
          same += std::count(ref.id.begin() + i * k, ref.id.begin() + (i + 1) * k, id);
        }
      }
      // The bound is probabilistic (RaBitQ's eps 1.9: on this data 5.3% of the estimates lie
      // outside it, flat or IVF, before the uint8 rounding term widens it), but a vector is lost
      // only when its estimate errs that far and its score is near the bar.
      EXPECT_GE(static_cast<double>(same) / (nq * k), 0.99) << idx.describe();
      // Against exact neighbours, the two-level search ranks at least as well as the single-level one
      // (200 queries: one query is 0.005 of recall).
      std::vector<float> gs(nq * k);
      std::vector<int64_t> gi(nq * k);
      tq::exact_search(m, n, d, x.data(), nq, q.data(), k, gs.data(), gi.data());
      const Results gt{gs, gi};
      EXPECT_GE(recall1(got, k, gt, k, k) + 0.02, recall1(one, k, gt, k, k)) << idx.describe();
    }
  // Fewer vectors than k: the shortlist never fills, so every vector is scored (the float-LUT
  // search's result, padded with id -1); an empty index returns only padding.
  auto c = cfg_of(d, 4, tq::Metric::l2);
  tq::Index few(c), empty(c);
  few.add(50, x.data());
  tq::SearchParams pf;
  pf.fast_scan = false;
  const auto a = run(few, q, 64, two_level(1)), b = run(few, q, 64, pf);
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.s, b.s);
  EXPECT_EQ(a.id[63], -1);
  const auto e = run(empty, q, 3, two_level(1));
  EXPECT_TRUE(std::all_of(e.id.begin(), e.id.end(), [](int64_t v) { return v == -1; }));
}

TEST(IndexTwoLevel, ThePlaneFollowsAddsLoadsAndRemoves) {
  // The sign plane is derived from the stored codes: batches sharing blocks, a loaded file and an
  // index after remove_ids search as an index built at once from the same vectors, whose saved
  // file is byte for byte the batches'. 4 bits, and 3.5 (packed rows of 195 channels of 4 bits
  // and 195 of 3, the second segment from an odd channel).
  TempDir t;
  const int d = 390;
  const size_t N = 1001;
  auto x = make_data(N, d, 31), q = make_data(12, d, 32);
  for (const auto& [m, bits] : {std::pair{tq::Metric::l2, 4.0}, std::pair{tq::Metric::cosine, 4.0},
                                std::pair{tq::Metric::l2, 3.5}, std::pair{tq::Metric::ip, 3.5}}) {
    auto c = cfg_of(d, bits, m);
    tq::Index once(c), batches(c);
    once.add(N, x.data());
    size_t at = 0;
    for (size_t len : {50u, 333u, 618u}) {
      batches.add(len, x.data() + at * d);
      at += len;
    }
    const auto ref = run(once, q, 10, two_level(1));
    auto r = run(batches, q, 10, two_level(1));
    EXPECT_EQ(r.id, ref.id);
    EXPECT_EQ(r.s, ref.s);
    once.save(t.path("a.tqi"));
    batches.save(t.path("b.tqi"));
    EXPECT_EQ(slurp(t.path("a.tqi")), slurp(t.path("b.tqi"))) << bits;
    const tq::Index loaded = tq::Index::load(t.path("a.tqi"));
    r = run(loaded, q, 10, two_level(1));
    EXPECT_EQ(r.id, ref.id);
    EXPECT_EQ(r.s, ref.s);
    std::vector<int64_t> ids(N);
    for (size_t i = 0; i < N; ++i) ids[i] = static_cast<int64_t>(i);
    const auto gone = ids_to_remove(ids);
    std::vector<float> kx;
    std::vector<int64_t> kid;
    kept_rows(x, d, ids, gone, &kx, &kid);
    ASSERT_EQ(once.remove_ids(gone.size(), gone.data()), N - kid.size());
    tq::Index kept(c);
    kept.add(kid.size(), kx.data(), kid.data());
    const auto rk = run(kept, q, 10, two_level(1));
    r = run(once, q, 10, two_level(1));
    EXPECT_EQ(r.id, rk.id);
    EXPECT_EQ(r.s, rk.s);
  }
}

// A loaded index with a sign plane takes each record's code bytes as its row: bits a crafted
// file sets past a segment's last code (within its last byte) stay out of it, so the index
// searches (one and two levels, and released) and saves as the clean file's. 3.5 bits at
// d = 390: a 4-bit segment of 195 channels (98 bytes, the last one's high nibble unused) and a
// 3-bit one of 195 (74 bytes, 7 bits of the last unused), the last 172 bytes of a record.
TEST(IndexTwoLevel, PaddingBitsOfAFileStayOutOfTheRows) {
  TempDir t;
  const int d = 390;
  const size_t n = 300;
  auto x = make_data(n, d, 33), q = make_data(8, d, 34);
  tq::Index idx(cfg_of(d, 3.5, tq::Metric::l2));
  idx.add(n, x.data());
  ASSERT_TRUE(idx.has_sign_plane());
  idx.save(t.path("clean.tqi"));
  auto b = slurp(t.path("clean.tqi"));
  auto ld = [&](size_t at) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b[at + i]) << (8 * i);
    return static_cast<size_t>(v);
  };
  const size_t code_bytes = ld(48), codes_offset = ld(56);
  ASSERT_EQ(code_bytes, idx.code_bytes());
  for (size_t r = 0; r < n; ++r) {
    uint8_t* c = b.data() + codes_offset + r * code_bytes + code_bytes - 172;
    c[97] |= 0xF0;
    c[171] |= 0xFE;
  }
  fix_payload_checksum(b);
  EXPECT_NE(b, slurp(t.path("clean.tqi")));
  const tq::Index clean = tq::Index::load(t.path("clean.tqi"));
  tq::Index dirty = tq::Index::from_bytes(b.data(), b.size(), "dirty");
  for (const int tl : {1, 0}) {
    const auto a = run(clean, q, 10, two_level(tl)), e = run(dirty, q, 10, two_level(tl));
    EXPECT_EQ(e.id, a.id) << tl;
    EXPECT_EQ(e.s, a.s) << tl;
  }
  dirty.save(t.path("resaved.tqi"));
  EXPECT_EQ(slurp(t.path("resaved.tqi")), slurp(t.path("clean.tqi")));
  dirty.release_sign_plane();
  const auto a = run(clean, q, 10, two_level(0)), e = run(dirty, q, 10, two_level(0));
  EXPECT_EQ(e.id, a.id);
  EXPECT_EQ(e.s, a.s);
}

TEST(IndexTwoLevel, WhereItAppliesAndBadParameters) {
  const size_t n = 200;
  auto x = make_data(n, 400, 41);
  std::vector<float> q(x.begin(), x.begin() + 400);
  auto expect_throw = [&](const tq::Index& idx, tq::SearchParams p, const char* what) {
    p.k = 5;
    std::vector<float> s(5);
    std::vector<int64_t> id(5);
    try {
      idx.search(1, q.data(), p, s.data(), id.data());
      ADD_FAILURE() << "no error: " << what << " " << idx.describe();
    } catch (const tq::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  // Flat below dim 320, IVF below 191, and 2 or 5 bits per channel: no sign plane, auto is the
  // single-level scan, 1 an error; flat at 320 and IVF at 192 keep one.
  auto x319 = make_data(n, 320, 42);
  for (auto [d, nlist, bits, plane] : {std::tuple{319, 0, 4.0, false}, std::tuple{320, 0, 3.0, true},
                                       std::tuple{191, 4, 4.0, false}, std::tuple{192, 4, 3.0, true},
                                       std::tuple{319, 4, 3.0, true}, std::tuple{400, 0, 2.0, false},
                                       std::tuple{400, 0, 2.5, false}, std::tuple{400, 0, 5.0, false}}) {
    auto c = cfg_of(d, bits, tq::Metric::l2);
    c.nlist = nlist;
    tq::Index idx(c);
    std::vector<float> xd(n * static_cast<size_t>(d));
    const std::vector<float>& src = d <= 320 ? x319 : x;
    const size_t sd = d <= 320 ? 320 : 400;
    for (size_t i = 0; i < n; ++i) std::copy_n(src.data() + i * sd, d, xd.data() + i * static_cast<size_t>(d));
    idx.add(n, xd.data());
    EXPECT_EQ(idx.has_sign_plane(), plane) << idx.describe();
    EXPECT_EQ(idx.describe_search(two_level(-1)).find("two-level") != std::string::npos, plane) << idx.describe();
    if (!plane) expect_throw(idx, two_level(1), "two_level 1 needs");
  }
  tq::Index idx(cfg_of(400, 4, tq::Metric::l2));
  idx.add(n, x.data());
  EXPECT_NE(idx.describe_search(two_level(-1)).find("two-level"), std::string::npos);
  EXPECT_EQ(idx.describe_search(two_level(0)).find("two-level"), std::string::npos);
  tq::SearchParams pf = two_level(1);
  pf.fast_scan = false;
  expect_throw(idx, pf, "two_level 1 needs");
  expect_throw(idx, two_level(2), "two_level must be");
  expect_throw(idx, two_level(-2), "two_level must be");
  // The sign plane is counted in memory: cmp / 2 bytes (400 channels: 100 groups) and two floats.
  EXPECT_DOUBLE_EQ(idx.memory_bytes_per_vector(), 400 * 16.0 / 32 + 16 + 100 * 16.0 / 32 + 8);
  // With a plane the codes are held packed (the vector layout): 3-bit channels take 3 bits in
  // memory, 3.5 bits 200 channels of 4 and 200 of 3.
  for (const double bits : {3.0, 3.5}) {
    tq::Index b(cfg_of(400, bits, tq::Metric::l2));
    b.add(n, x.data());
    ASSERT_TRUE(b.has_sign_plane());
    EXPECT_DOUBLE_EQ(b.memory_bytes_per_vector(), (bits == 3.0 ? 150 : 100 + 75) + 16 + 100 * 16.0 / 32 + 8) << bits;
    EXPECT_EQ(b.code_bytes(), (bits == 3.0 ? 150u : 175u) + 4u) << bits;  // the file's record: f16 scale and norm
  }
  // Trellis codes have no sign plane; IVF has one (on with auto), but not at 2 bits.
  auto ct = cfg_of(400, 4, tq::Metric::l2);
  ct.trellis = true;
  tq::Index tr(ct);
  tr.add(n, x.data());
  expect_throw(tr, two_level(1), "two_level 1 needs");
  for (double bits : {4.0, 2.0}) {
    auto ci = cfg_of(400, bits, tq::Metric::l2);
    ci.nlist = 4;
    tq::Index iv(ci);
    iv.add(n, x.data());
    EXPECT_EQ(iv.describe_search(two_level(-1)).find("two-level") != std::string::npos, bits == 4.0) << iv.describe();
    if (bits == 2.0) expect_throw(iv, two_level(1), "two_level 1 needs");
    else EXPECT_EQ(run(iv, q, 5, two_level(1)).id, run(iv, q, 5, two_level(-1)).id);
  }
  // Sharded candidates come from the single-level scan: auto is that, 1 an error.
  tq::SearchParams pc;
  pc.k = 5;
  const size_t r = idx.candidates_per_query(pc);
  std::vector<float> s1(r), s2(r), s3(r), so(r);
  std::vector<int64_t> io(r), sl(r);
  idx.search_candidates(1, q.data(), pc, s1.data(), s2.data(), s3.data(), so.data(), io.data(), sl.data());
  const auto single = run(idx, q, 5, two_level(0));
  for (size_t i = 0; i < 5; ++i) EXPECT_NE(std::find(io.begin(), io.end(), single.id[i]), io.end()) << i;
  pc.two_level = 1;
  EXPECT_THROW(idx.search_candidates(1, q.data(), pc, s1.data(), s2.data(), s3.data(), so.data(), io.data(), sl.data()),
               tq::Error);
}

namespace {
// Checks every slot holding a vector against the definition of the sign plane (Impl::derive):
// bit j % 4 of group j / 4 (the fast layout's nibble of the slot) is the top bit of channel j's
// index; cA = scale ||c||^2 / sum |c_j|; cB = (l2 ? 2 : 1) scale ||c|| sqrt(1 - a^2) /
// (a sqrt(d - 1)), a = sum |c_j| / (||c|| sqrt d); IVF: cL = (ip, cosine: scale <Pi c_l, c>) -
// (l2 ? 2 : 1) cA <Pi c_l, sign(c)>, c_l the slot's list centroid. Unused sign groups (up to a
// multiple of 4) stay zero: their table entries are 0.
void expect_plane_is_its_definition(const tq::Index& ix, const std::string& when) {
  const tq::Index::Impl& I = ix.impl();
  ASSERT_TRUE(I.coarse_ok) << when;
  ASSERT_EQ(I.cblocks.size(), (I.slots + 31) / 32 * I.cmp * 16) << when;
  const int d = ix.dim();
  const bool l2 = I.cfg.metric == tq::Metric::l2;
  const double mul = l2 ? 2 : 1;
  std::vector<uint8_t> ind(static_cast<size_t>(d));
  size_t held = 0;
  for (size_t i = 0; i < I.slots; ++i) {
    if (I.ids[i] < 0) continue;  // IVF padding
    ++held;
    I.get_indices(i, ind.data());
    const float* rc = I.ivf() ? I.rcentroids.data() + I.list_of(i) * d : nullptr;
    double cc = 0, ca = 0, ct = 0, cu = 0, rn = 0;
    for (const tq::Segment& s : I.segs)
      for (int j = s.begin; j < s.begin + s.len; ++j) {
        const uint8_t byte = I.cblocks[(i / 32) * I.cmp * 16 + static_cast<size_t>(j / 4) * 16 + i % 16];
        const int bit = (byte >> ((i % 32) < 16 ? 0 : 4) >> (j % 4)) & 1;
        ASSERT_EQ(bit, ind[j] >> (s.bits - 1)) << when << ": slot " << i << " channel " << j;
        const double c = s.cb->centroids[ind[j]];
        cc += c * c;
        ca += std::fabs(c);
        if (rc != nullptr) {
          ct += rc[j] * c;
          cu += bit ? rc[j] : -rc[j];
          rn += static_cast<double>(rc[j]) * rc[j];
        }
      }
    const double a = ca / (std::sqrt(cc) * std::sqrt(static_cast<double>(d)));
    EXPECT_NEAR(I.cA[i], I.scale[i] * cc / ca, 1e-4 * std::fabs(I.scale[i] * cc / ca)) << when << ": slot " << i;
    const double cb = mul * I.scale[i] * std::sqrt(cc) * std::sqrt(1 - a * a) / (a * std::sqrt(d - 1.0));
    EXPECT_NEAR(I.cB[i], cb, 1e-4 * cb) << when << ": slot " << i;
    if (rc != nullptr) {
      const double cl = (l2 ? 0.0 : I.scale[i] * ct) - mul * I.cA[i] * cu;
      // float sums of d terms: within 1e-4 of the size of the terms (||Pi c_l|| ||c|| scale).
      EXPECT_NEAR(I.cL[i], cl, 1e-4 * (1 + 4 * I.scale[i] * std::sqrt(rn * cc))) << when << ": slot " << i;
      if (l2)  // the l2 scan's list term, -2 scale <Pi c_l, c>
        EXPECT_NEAR(I.l2term[i], -2 * I.scale[i] * ct, 1e-4 * (1 + 4 * I.scale[i] * std::sqrt(rn * cc))) << when << ": slot " << i;
    } else {
      EXPECT_TRUE(I.cL.empty()) << when;
    }
  }
  EXPECT_EQ(held, ix.size()) << when;
  for (size_t b = 0; b * 32 < I.slots; ++b)
    for (size_t g = I.cm; g < I.cmp; ++g)
      for (size_t v = 0; v < 16; ++v) EXPECT_EQ(I.cblocks[b * I.cmp * 16 + g * 16 + v], 0) << when;
}
}  // namespace

TEST(IndexTwoLevel, TheSignPlaneIsTheTopBitOfEachChannelsIndex) {
  const size_t n = 77;
  for (int d : {385, 400})
    for (double bits : {3.0, 3.5, 4.0})
      for (tq::Metric mt : {tq::Metric::l2, tq::Metric::ip}) {
        auto x = make_data(n, d, 51);
        tq::Index idx(cfg_of(d, bits, mt));
        idx.add(n, x.data());
        expect_plane_is_its_definition(idx, idx.describe());
      }
}

// release_sign_plane (ShardedIndex shards): the codes return to the fast layout and the
// index searches in one level exactly as an index with the plane does with two_level 0 (ids
// and scores), through adds and removes after the release; memory drops by the plane and its
// factors, two_level 1 becomes an error, the saved file is byte for byte the same, and a loaded
// index holds a plane again. Flat and IVF, 4 and 3.5 bits.
TEST(IndexTwoLevel, ReleasingThePlaneKeepsTheSingleLevelSearch) {
  TempDir t;
  const int d = 390;
  const size_t N = 700;
  auto x = make_data(N + 200, d, 71), q = make_data(12, d, 72);
  for (const int nlist : {0, 5}) {
    for (const double bits : {4.0, 3.5}) {
      auto c = cfg_of(d, bits, nlist ? tq::Metric::cosine : tq::Metric::l2);
      c.nlist = nlist;
      tq::Index keep(c), rel(c);
      keep.add(N, x.data());
      rel.add(N, x.data());
      ASSERT_TRUE(rel.has_sign_plane());
      const double mem = rel.memory_bytes_per_vector();
      rel.release_sign_plane();
      EXPECT_FALSE(rel.has_sign_plane());
      // Per slot: the plane and its factors (IVF: and the list term) go; the codes go from their
      // packed rows (3.5 bits: 195 channels of 4 bits, 195 of 3) to a nibble a channel.
      const size_t cmp = ((static_cast<size_t>(d) + 3) / 4 + 3) / 4 * 4, mp = (static_cast<size_t>(d) + 3) / 4 * 4;
      const size_t packed = bits == 4.0 ? tq::packed_bytes(d, 4) : tq::packed_bytes(195, 4) + tq::packed_bytes(195, 3);
      const double plane = static_cast<double>(cmp) * 16.0 / 32 + 8.0 + (nlist ? 4.0 : 0.0);
      const double net = plane - (static_cast<double>(mp) / 2 - static_cast<double>(packed));
      double slots = N;  // IVF: lists padded to whole blocks
      if (nlist > 0) {
        slots = 0;
        for (int l = 0; l < nlist; ++l) slots += static_cast<double>((rel.list_size(l) + 31) / 32 * 32);
      }
      EXPECT_NEAR(mem - rel.memory_bytes_per_vector(), net * slots / N, 1e-9) << nlist << " " << bits;
      EXPECT_THROW(run(rel, q, 10, two_level(1)), tq::Error);
      auto p = two_level(0);
      p.nprobe = nlist ? 3 : 1;
      auto same = [&](const char* what) {
        const auto a = run(keep, q, 10, p), b = run(rel, q, 10, p);
        EXPECT_EQ(a.id, b.id) << what;
        EXPECT_EQ(a.s, b.s) << what;
        tq::SearchParams dflt;  // auto: one level on the released index
        dflt.nprobe = p.nprobe;
        const auto r = run(rel, q, 10, dflt);
        EXPECT_EQ(r.id, a.id) << what;
      };
      same("released");
      keep.add(200, x.data() + N * d);
      rel.add(200, x.data() + N * d);
      EXPECT_FALSE(rel.has_sign_plane());
      same("an add after");
      std::vector<int64_t> ids(N + 200);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
      const auto gone = ids_to_remove(ids);
      ASSERT_EQ(keep.remove_ids(gone.size(), gone.data()), rel.remove_ids(gone.size(), gone.data()));
      same("remove_ids after");
      keep.save(t.path("keep.tqi"));
      rel.save(t.path("rel.tqi"));
      EXPECT_EQ(slurp(t.path("keep.tqi")), slurp(t.path("rel.tqi")));
      EXPECT_TRUE(tq::Index::load(t.path("rel.tqi")).has_sign_plane());
      rel.release_sign_plane();  // again: a no-op
      same("released twice");
    }
  }
}

TEST(IndexTwoLevel, TheIvfPlaneFollowsAddsRemovesAndLoads) {
  // An IVF add moves every slot into its list: the plane of every slot holding a vector, and its
  // list term, are their definitions after each batch, after remove_ids and after a load.
  TempDir t;
  const int d = 390;
  const size_t N = 700;
  auto x = make_data(N, d, 61);
  for (tq::Metric mt : {tq::Metric::l2, tq::Metric::cosine, tq::Metric::ip}) {
    auto c = cfg_of(d, 3.5, mt);
    c.nlist = 5;
    tq::Index idx(c);
    idx.add(300, x.data());
    expect_plane_is_its_definition(idx, "first batch");
    idx.add(N - 300, x.data() + 300 * d);
    expect_plane_is_its_definition(idx, "second batch");
    std::vector<int64_t> ids(N);
    for (size_t i = 0; i < N; ++i) ids[i] = static_cast<int64_t>(i);
    const auto gone = ids_to_remove(ids);
    ASSERT_GT(idx.remove_ids(gone.size(), gone.data()), 0u);
    expect_plane_is_its_definition(idx, "remove_ids");
    idx.save(t.path("ivf.tqi"));
    expect_plane_is_its_definition(tq::Index::load(t.path("ivf.tqi")), "load");
  }
}
