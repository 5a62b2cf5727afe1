// Codec tests: codebooks against turboquant.md, rotations, bit packing, quantizers,
// SIMD vs scalar exactness, bad input.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <vector>

#include <strings.h>

#include "common/blas_core.h"
#include "tq/bitpack.h"
#include "tq/codebook.h"
#include "tq/common.h"
#include "tq/distortion.h"
#include "tq/error.h"
#include "tq/quantizer.h"
#include "tq/rotation.h"
#include "tq/simd.h"
#include "tq/trellis.h"

// The scaled quantizer with its integer sum (src/codec/quantizer_simd.cpp; the KV cache's fit).
namespace tq::detail {
int64_t quantize_scaled(const Codebook& cb, size_t n, const float* y, float scale, uint8_t* idx,
                        const int32_t* csq) noexcept;
}

namespace {

const std::vector<int> kEdgeDims = {1, 2, 3, 7, 8, 17, 31, 33, 64, 100, 127, 128, 129, 1536};
const std::vector<std::string> kRotations = {"haar", "hadamard", "block32", "block64", "block128", "givens", "iso4"};

bool small_tests() { return std::getenv("TQ_TEST_SMALL") != nullptr; }

// ---------------------------------------------------------------- fp16
TEST(Fp16, RoundTripAllHalfValues) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = tq::fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(tq::fp16_to_fp32(tq::fp32_to_fp16(f))));
      continue;
    }
    EXPECT_EQ(tq::fp32_to_fp16(f), h) << "half 0x" << std::hex << h;
  }
}

// The (branch-free) conversion against the definition of binary16: every value, exact bits,
// NaN payloads and signalling NaNs included.
TEST(Fp16, ToFloatExactForEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t want;
    if (e == 31) {
      want = sign | 0x7f800000u | (m << 13);
    } else {
      const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -24)
                               : std::ldexp(static_cast<float>(1024 + m), static_cast<int>(e) - 25);
      std::memcpy(&want, &mag, 4);
      want |= sign;
    }
    const float got = tq::fp16_to_fp32(static_cast<uint16_t>(h));
    uint32_t ugot;
    std::memcpy(&ugot, &got, 4);
    ASSERT_EQ(ugot, want) << "half 0x" << std::hex << h;
  }
}

TEST(Fp16, RoundsToNearestEven) {
  EXPECT_EQ(tq::fp16_to_fp32(tq::fp32_to_fp16(1.0f + 1.0f / 2048)), 1.0f);           // tie -> even
  EXPECT_EQ(tq::fp16_to_fp32(tq::fp32_to_fp16(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);  // tie -> even (up)
  EXPECT_TRUE(std::isinf(tq::fp16_to_fp32(tq::fp32_to_fp16(70000.0f))));
  EXPECT_EQ(tq::fp16_to_fp32(tq::fp32_to_fp16(65504.0f)), 65504.0f);
  EXPECT_EQ(tq::fp16_to_fp32(tq::fp32_to_fp16(1e-9f)), 0.0f);
}

// ---------------------------------------------------------------- codebooks
// turboquant.md: Gaussian-limit centroids (units of 1/sqrt(d)) and D_mse at d = 128 (Beta law).
TEST(Codebook, GaussianCentroidsMatchTable) {
  const std::vector<std::vector<double>> expected = {
      {0.7979}, {0.4528, 1.5104}, {0.2451, 0.7560, 1.3439, 2.1519},
      {0.1284, 0.3880, 0.6568, 0.9423, 1.2562, 1.6180, 2.0690, 2.7326}};
  for (int b = 1; b <= 4; ++b) {
    const tq::Codebook& cb = tq::get_codebook(128, b, tq::Law::gauss);
    const int K = 1 << b;
    for (int j = 0; j < K / 2; ++j) {
      const double c = cb.centroids[K / 2 + j] * std::sqrt(128.0);
      EXPECT_NEAR(c, expected[b - 1][j], 6e-4) << "bits " << b << " centroid " << j;
      EXPECT_FLOAT_EQ(cb.centroids[K / 2 + j], -cb.centroids[K / 2 - 1 - j]);
    }
  }
}

TEST(Codebook, DistortionMatchesTable) {
  struct Row { int d; double mse[4]; };
  const Row rows[] = {{128, {0.3609, 0.1160, 0.0340, 0.0093}},
                      {64, {0.3584, 0.1145, 0.0334, 0.0091}},
                      {1536, {0.3632, 0.1174, 0.0345, 0.0095}}};
  for (const Row& r : rows)
    for (int b = 1; b <= 4; ++b) {
      const tq::Codebook& cb = tq::get_codebook(r.d, b);
      // the table rounds to 4 decimals: allow half a unit in the last place plus 0.5%
      EXPECT_NEAR(cb.mse_per_vector, r.mse[b - 1], 0.00005 + 0.005 * r.mse[b - 1]) << "d " << r.d << " bits " << b;
    }
  const double gauss[4] = {0.3634, 0.1175, 0.0345, 0.0095};
  for (int b = 1; b <= 4; ++b)
    EXPECT_NEAR(tq::get_codebook(128, b, tq::Law::gauss).mse_per_vector, gauss[b - 1], 0.00005 + 0.005 * gauss[b - 1]);
}

TEST(Codebook, BoundsAndMonotoneForAllBits) {
  for (int d : {2, 3, 8, 128, 1536})
    for (int b = 1; b <= 8; ++b) {
      const tq::Codebook& cb = tq::get_codebook(d, b);
      ASSERT_EQ(static_cast<int>(cb.centroids.size()), 1 << b);
      ASSERT_EQ(static_cast<int>(cb.boundaries.size()), (1 << b) - 1);
      for (size_t j = 1; j < cb.centroids.size(); ++j) EXPECT_LT(cb.centroids[j - 1], cb.centroids[j]);
      for (size_t j = 0; j < cb.boundaries.size(); ++j) {
        EXPECT_GT(cb.boundaries[j], cb.centroids[j]);
        EXPECT_LT(cb.boundaries[j], cb.centroids[j + 1]);
      }
      EXPECT_GE(cb.centroids.front(), -1.0f);
      EXPECT_LE(cb.centroids.back(), 1.0f);
      // paper: D_mse <= sqrt(3) pi / 2 * 4^-b, and above the 4^-b lower bound for large d
      EXPECT_LE(cb.mse_per_vector, std::sqrt(3.0) * M_PI / 2 * std::pow(4.0, -b)) << d << " " << b;
      if (b > 1) EXPECT_LT(cb.mse_per_vector, tq::get_codebook(d, b - 1).mse_per_vector);
    }
}

TEST(Codebook, SmallDimensionsExact) {
  // d = 3: coordinates are uniform on [-1, 1]; the 1-bit Lloyd-Max centroids are +-1/2, mse 1/12 per coord.
  const tq::Codebook& cb = tq::get_codebook(3, 1);
  EXPECT_NEAR(cb.centroids[1], 0.5, 1e-6);
  EXPECT_NEAR(cb.mse_per_coord, 1.0 / 12, 1e-6);
  // d = 2: arcsine law; the 1-bit centroid is E|t| = 2/pi.
  EXPECT_NEAR(tq::get_codebook(2, 1).centroids[1], 2 / M_PI, 1e-5);
}

TEST(Codebook, DeterministicAndCached) {
  const tq::Codebook a = tq::compute_codebook(100, 3);
  const tq::Codebook b = tq::compute_codebook(100, 3);
  EXPECT_EQ(a.centroids, b.centroids);
  EXPECT_EQ(&tq::get_codebook(100, 3), &tq::get_codebook(100, 3));
}

TEST(Codebook, RejectsBadArguments) {
  EXPECT_THROW(tq::get_codebook(1, 2), tq::Error);
  EXPECT_THROW(tq::get_codebook(0, 2), tq::Error);
  EXPECT_THROW(tq::get_codebook(128, 0), tq::Error);
  EXPECT_THROW(tq::get_codebook(128, 9), tq::Error);
  EXPECT_THROW(tq::parse_law("cauchy"), tq::Error);
}

// ---------------------------------------------------------------- rotations
TEST(Rotation, OrthogonalAndInverseForAllKindsAndEdgeDims) {
  for (const auto& name : kRotations)
    for (int d : kEdgeDims) {
      if (name == "haar" && d > 512 && small_tests()) continue;
      auto rot = tq::make_rotation(tq::parse_rotation(name), d, 99);
      const size_t n = 5;
      std::vector<float> x(n * d), y(n * d), z(n * d);
      tq::Rng rng(d);
      for (auto& v : x) v = static_cast<float>(rng.normal());
      rot->forward(n, x.data(), y.data());
      rot->inverse(n, y.data(), z.data());
      for (size_t r = 0; r < n; ++r) {
        double nx = 0, ny = 0, err = 0;
        for (int i = 0; i < d; ++i) {
          nx += double(x[r * d + i]) * x[r * d + i];
          ny += double(y[r * d + i]) * y[r * d + i];
          err += std::pow(double(z[r * d + i]) - x[r * d + i], 2);
        }
        EXPECT_NEAR(std::sqrt(ny / nx), 1.0, 1e-5) << name << " d=" << d;
        EXPECT_LT(std::sqrt(err / nx), 1e-5) << name << " d=" << d;
      }
      // in place gives the same result
      std::vector<float> w = x;
      rot->forward(n, w.data(), w.data());
      EXPECT_EQ(w, y) << name << " d=" << d;
    }
}

TEST(Rotation, PreservesInnerProducts) {
  for (const auto& name : kRotations) {
    const int d = 100;
    auto rot = tq::make_rotation(tq::parse_rotation(name), d, 5);
    std::vector<float> x(2 * d), y(2 * d);
    tq::Rng rng(3);
    for (auto& v : x) v = static_cast<float>(rng.normal());
    rot->forward(2, x.data(), y.data());
    double a = 0, b = 0;
    for (int i = 0; i < d; ++i) { a += double(x[i]) * x[d + i]; b += double(y[i]) * y[d + i]; }
    EXPECT_NEAR(a, b, 1e-4 * d) << name;
  }
}

TEST(Rotation, SeedChangesRotationAndIsDeterministic) {
  auto a = tq::make_rotation(tq::parse_rotation("hadamard"), 64, 1);
  auto b = tq::make_rotation(tq::parse_rotation("hadamard"), 64, 1);
  auto c = tq::make_rotation(tq::parse_rotation("hadamard"), 64, 2);
  std::vector<float> x(64, 0.0f), ya(64), yb(64), yc(64);
  x[3] = 1;
  a->forward(1, x.data(), ya.data());
  b->forward(1, x.data(), yb.data());
  c->forward(1, x.data(), yc.data());
  EXPECT_EQ(ya, yb);
  EXPECT_NE(ya, yc);
}

TEST(Rotation, FwhtSimdBitExactVsScalar) {
  for (int m : {2, 4, 8, 16, 32, 64, 128, 256, 1024}) {
    std::vector<float> x(3 * m + 1);
    tq::Rng rng(m);
    for (auto& v : x) v = static_cast<float>(rng.normal());
    std::vector<float> ref(x.begin() + 1, x.end());  // misaligned source on purpose
    tq::fwht_ref(3, m, ref.data(), m);
    for (const auto& level : tq::simd::available_levels()) {
      tq::simd::ScopedLevel sl(level);
      std::vector<float> y(x.begin() + 1, x.end());
      tq::fwht(3, m, y.data(), m);
      EXPECT_EQ(y, ref) << "m=" << m << " level=" << level;
    }
  }
}

TEST(Rotation, RejectsBadArguments) {
  EXPECT_THROW(tq::parse_rotation("dct"), tq::Error);
  EXPECT_THROW(tq::make_rotation(tq::parse_rotation("hadamard"), 0, 1), tq::Error);
  EXPECT_THROW(tq::make_rotation(tq::parse_rotation("haar"), 100000, 1), tq::Error);
  EXPECT_THROW(tq::make_rotation({tq::RotationKind::block, 48}, 96, 1), tq::Error);
}

// ---------------------------------------------------------------- bit packing
TEST(Bitpack, RoundTripAllWidthsAndEdgeSizes) {
  for (int b = 1; b <= 8; ++b)
    for (int n : {0, 1, 2, 3, 7, 8, 9, 17, 31, 33, 64, 100, 127, 128, 129, 1536}) {
      std::vector<uint8_t> idx(n), back(n), ref(tq::packed_bytes(n, b) + 1, 0xAA), fast(ref.size(), 0xAA);
      tq::Rng rng(b * 1000 + n);
      for (auto& v : idx) v = static_cast<uint8_t>(rng.below(1u << b));
      tq::pack_bits_ref(n, b, idx.data(), ref.data());
      tq::pack_bits(n, b, idx.data(), fast.data());
      EXPECT_EQ(fast, ref) << "b=" << b << " n=" << n;  // includes the guard byte: no overrun
      EXPECT_EQ(ref.back(), 0xAA);
      tq::unpack_bits(n, b, fast.data(), back.data());
      EXPECT_EQ(back, idx);
      std::vector<uint8_t> back_ref(n);
      tq::unpack_bits_ref(n, b, fast.data(), back_ref.data());
      EXPECT_EQ(back_ref, idx);
    }
}

TEST(Bitpack, DocumentedLayout) {
  // 3 bits: 8 indices in 3 bytes, index j at bits [3j, 3j+3) LSB-first.
  const uint8_t idx[8] = {1, 2, 3, 4, 5, 6, 7, 0};
  uint8_t out[3];
  tq::pack_bits(8, 3, idx, out);
  uint32_t w = out[0] | (out[1] << 8) | (out[2] << 16);
  for (int j = 0; j < 8; ++j) EXPECT_EQ((w >> (3 * j)) & 7u, idx[j]);
  // 4 bits: index 2i in the low nibble of byte i.
  const uint8_t i4[2] = {0x3, 0xC};
  uint8_t o4;
  tq::pack_bits(2, 4, i4, &o4);
  EXPECT_EQ(o4, 0xC3);
  EXPECT_EQ(tq::packed_bytes(128, 3), 48u);
  EXPECT_EQ(tq::packed_bytes(100, 3), 38u);
}

TEST(Bitpack, AllZeroAndAllOnesBytes) {
  for (int b = 1; b <= 8; ++b) {
    std::vector<uint8_t> zeros(tq::packed_bytes(129, b), 0), ones(zeros.size(), 0xFF), idx(129);
    tq::unpack_bits(129, b, zeros.data(), idx.data());
    for (auto v : idx) EXPECT_EQ(v, 0);
    tq::unpack_bits(129, b, ones.data(), idx.data());
    for (auto v : idx) EXPECT_EQ(v, (1u << b) - 1);
  }
}

TEST(Bitpack, RejectsBadWidthAndOverflow) {
  EXPECT_THROW(tq::packed_bytes(10, 0), tq::Error);
  EXPECT_THROW(tq::packed_bytes(10, 9), tq::Error);
  EXPECT_THROW(tq::packed_bytes(std::numeric_limits<size_t>::max() / 2, 8), tq::Error);
}

// ---------------------------------------------------------------- quantizers
tq::QuantizerConfig cfg_for(int d, int b, const std::string& rot, bool corr = true) {
  tq::QuantizerConfig c;
  c.dim = d;
  c.bits = b;
  c.rotation = tq::parse_rotation(rot);
  c.seed = 11;
  c.norm_correction = corr;
  return c;
}

// Measured distortion over fixed seeds against turboquant.md (d = 128, plain norm).
TEST(Quantizer, MseDistortionHaarWithin2Percent) {
  const double table[4] = {0.3609, 0.1160, 0.0340, 0.0093};
  const size_t n = small_tests() ? 2000 : 8000;
  for (int b = 1; b <= 4; ++b) {
    auto q = tq::make_quantizer(tq::QuantizerKind::mse, cfg_for(128, b, "haar", false));
    const auto r = tq::measure_distortion(*q, n, 3);
    EXPECT_NEAR(r.mse, table[b - 1], 0.02 * table[b - 1]) << "bits " << b;
  }
}

TEST(Quantizer, MseDistortionHadamardWithin5PercentAndBelowBoundAllBits) {
  const double table[4] = {0.3609, 0.1160, 0.0340, 0.0093};
  const size_t n = small_tests() ? 1000 : 4000;
  for (int b = 1; b <= 8; ++b) {
    auto q = tq::make_quantizer(tq::QuantizerKind::mse, cfg_for(128, b, "hadamard", false));
    const auto r = tq::measure_distortion(*q, n, 4);
    if (b <= 4) EXPECT_NEAR(r.mse, table[b - 1], 0.05 * table[b - 1]) << "bits " << b;
    EXPECT_LE(r.mse, std::sqrt(3.0) * M_PI / 2 * std::pow(4.0, -b)) << "bits " << b;
    EXPECT_GE(r.mse, std::pow(4.0, -b) * 0.9) << "bits " << b;  // information-theoretic floor (slack for sampling)
  }
}

TEST(Quantizer, MseShrinksInnerProductsAndNormCorrectionFixesScale) {
  auto plain = tq::make_quantizer(tq::QuantizerKind::mse, cfg_for(128, 1, "haar", false));
  const auto r = tq::measure_distortion(*plain, 4000, 5);
  EXPECT_NEAR(r.ip_slope, 2 / M_PI, 0.01);  // the 2/pi shrink at one bit
  EXPECT_LT(r.ip_bias, -0.15);
  auto corr = tq::make_quantizer(tq::QuantizerKind::mse, cfg_for(128, 2, "haar", true));
  auto unc = tq::make_quantizer(tq::QuantizerKind::mse, cfg_for(128, 2, "haar", false));
  EXPECT_LT(std::fabs(tq::measure_distortion(*corr, 4000, 6).ip_slope - 1.0),
            std::fabs(tq::measure_distortion(*unc, 4000, 6).ip_slope - 1.0));
}

TEST(Quantizer, ProdIsUnbiased) {
  const size_t n = small_tests() ? 3000 : 10000;
  for (int b = 2; b <= 4; ++b) {
    auto q = tq::make_quantizer(tq::QuantizerKind::prod, cfg_for(128, b, "hadamard"));
    const auto r = tq::measure_distortion(*q, n, 7);
    EXPECT_LT(std::fabs(r.ip_bias), 0.1 * r.ip_rmse) << "bits " << b;
    EXPECT_NEAR(r.ip_slope, 1.0, 0.02) << "bits " << b;
    // variance bound of the paper: E err^2 <= pi/(2d) ||q||^2 D_mse(b-1) (||q|| = 1)
    const double bound = M_PI / (2 * 128.0) * tq::get_codebook(128, b - 1).mse_per_vector;
    EXPECT_LE(r.ip_rmse * r.ip_rmse, bound * 1.1) << "bits " << b;
  }
  auto qjl = tq::make_quantizer(tq::QuantizerKind::qjl, cfg_for(128, 1, "hadamard"));
  const auto r = tq::measure_distortion(*qjl, n, 8);
  EXPECT_LT(std::fabs(r.ip_bias), 0.1 * r.ip_rmse);
}

TEST(Quantizer, CodeSizesAndBitsPerValue) {
  auto q3 = tq::make_quantizer(tq::QuantizerKind::mse, cfg_for(128, 3, "hadamard"));
  EXPECT_EQ(q3->code_bytes(), 2u + 48u);  // 50 B per 128-dim vector at 3 bits (fp16 norm)
  EXPECT_DOUBLE_EQ(q3->bits_per_value(), 50 * 8 / 128.0);
  auto cfg = cfg_for(100, 4, "hadamard");
  cfg.norm = tq::NormFormat::f32;
  EXPECT_EQ(tq::make_quantizer(tq::QuantizerKind::mse, cfg)->code_bytes(), 4u + 50u);
  auto p = tq::make_quantizer(tq::QuantizerKind::prod, cfg_for(128, 4, "hadamard"));
  EXPECT_EQ(p->code_bytes(), 2u + 2u + 48u + 16u);
}

TEST(Quantizer, ScoreMatchesDecodedDot) {
  for (auto kind : {tq::QuantizerKind::mse, tq::QuantizerKind::prod, tq::QuantizerKind::qjl})
    for (int d : {2, 3, 17, 64, 100, 129}) {
      const int b = kind == tq::QuantizerKind::qjl ? 1 : 3;
      auto q = tq::make_quantizer(kind, cfg_for(d, b, "hadamard"));
      const size_t n = 20;
      std::vector<float> x(n * d), xh(n * d), qv(d), st(q->query_state_floats()), sc(n);
      tq::Rng rng(d);
      for (auto& v : x) v = static_cast<float>(rng.normal() * 2);
      for (auto& v : qv) v = static_cast<float>(rng.normal());
      std::vector<uint8_t> codes(n * q->code_bytes());
      q->encode(n, x.data(), codes.data());
      q->decode(n, codes.data(), xh.data());
      q->prepare_query(qv.data(), st.data());
      q->score(st.data(), n, codes.data(), sc.data());
      for (size_t r = 0; r < n; ++r) {
        double dot = 0, nrm = 0;
        for (int i = 0; i < d; ++i) { dot += double(qv[i]) * xh[r * d + i]; nrm += double(xh[r * d + i]) * xh[r * d + i]; }
        EXPECT_NEAR(sc[r], dot, 2e-4 * (1 + std::sqrt(nrm) * d)) << tq::quantizer_kind_name(kind) << " d=" << d;
      }
    }
}

TEST(Quantizer, CodesBitIdenticalAcrossSimdLevels) {
  for (int d : {3, 17, 64, 100, 128, 129})
    for (int b : {1, 2, 3, 4, 8})
      for (auto kind : {tq::QuantizerKind::mse, tq::QuantizerKind::prod}) {
        if (kind == tq::QuantizerKind::prod && b == 1) continue;
        auto q = tq::make_quantizer(kind, cfg_for(d, b, "hadamard"));
        const size_t n = 37;
        std::vector<float> x(n * d + 1);
        tq::Rng rng(d * 7 + b);
        for (auto& v : x) v = static_cast<float>(rng.normal());
        const float* xm = x.data() + 1;  // misaligned input
        std::vector<uint8_t> ref(n * q->code_bytes());
        std::vector<float> dref(n * d);
        {
          tq::simd::ScopedLevel sl("scalar");
          q->encode(n, xm, ref.data());
          q->decode(n, ref.data(), dref.data());
        }
        for (const auto& level : tq::simd::available_levels()) {
          tq::simd::ScopedLevel sl(level);
          std::vector<uint8_t> codes(n * q->code_bytes());
          q->encode(n, xm, codes.data());
          EXPECT_EQ(codes, ref) << "level " << level << " d=" << d << " b=" << b;
          std::vector<float> dec(n * d);
          q->decode(n, codes.data(), dec.data());
          for (size_t i = 0; i < dec.size(); ++i) ASSERT_NEAR(dec[i], dref[i], 1e-5f * (1 + std::fabs(dref[i])));
        }
      }
}

TEST(Quantizer, SimdKernelsMatchReference) {
  for (int b = 1; b <= 8; ++b) {
    const tq::Codebook& cb = tq::get_codebook(128, b);
    const size_t n = 133;
    std::vector<float> y(n), q(n);
    tq::Rng rng(b);
    for (auto& v : y) v = static_cast<float>(rng.normal() / std::sqrt(128.0));
    for (auto& v : q) v = static_cast<float>(rng.normal());
    y[5] = cb.boundaries[0];  // exactly on a boundary
    std::vector<uint8_t> iref(n), ifast(n);
    tq::quantize_rotated_ref(cb, n, y.data(), iref.data());
    const float dref = tq::dot_centroids_ref(cb, n, q.data(), iref.data());
    for (const auto& level : tq::simd::available_levels()) {
      tq::simd::ScopedLevel sl(level);
      tq::quantize_rotated(cb, n, y.data(), ifast.data());
      EXPECT_EQ(ifast, iref) << level << " bits " << b;
      EXPECT_NEAR(tq::dot_centroids(cb, n, q.data(), iref.data()), dref, 1e-5 * (1 + std::fabs(dref))) << level;
    }
  }
}

// Every boundary exactly, its float neighbours, NaN, infinities and signed zeros, scaled and
// not, with the integer sum of csq[idx]: the same codes and sum at every SIMD level (each
// level's path: permutes, the boundary count up to 4 bits, gathers above).
TEST(Quantizer, SimdQuantizeMatchesReferenceAtBoundariesAndOddValues) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int b = 1; b <= 8; ++b) {
    const tq::Codebook& cb = tq::get_codebook(128, b);
    std::vector<float> y = {nan, inf, -inf, 0.f, -0.f, 1e30f, -1e30f};
    for (float t : cb.boundaries) {
      y.push_back(t);
      y.push_back(std::nextafter(t, inf));
      y.push_back(std::nextafter(t, -inf));
    }
    tq::Rng rng(100 + b);
    while (y.size() % 16 != 5) y.push_back(static_cast<float>(rng.normal() / std::sqrt(128.0)));  // and a tail
    std::vector<int32_t> csq(size_t{1} << b);
    for (size_t c = 0; c < csq.size(); ++c) csq[c] = static_cast<int32_t>(c * c + 1);
    for (float scale : {1.f, 0.85f, 1.2f}) {
      std::vector<uint8_t> iref(y.size()), ifast(y.size());
      int64_t tref = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        iref[i] = cb.quantize(y[i] * scale);
        tref += csq[iref[i]];
      }
      tq::quantize_rotated_ref(cb, y.size(), y.data(), ifast.data(), scale);
      EXPECT_EQ(ifast, iref) << "reference, bits " << b << " scale " << scale;
      for (const auto& level : tq::simd::available_levels()) {
        tq::simd::ScopedLevel sl(level);
        std::fill(ifast.begin(), ifast.end(), uint8_t{0xEE});
        tq::quantize_rotated(cb, y.size(), y.data(), ifast.data(), scale);
        EXPECT_EQ(ifast, iref) << level << " bits " << b << " scale " << scale;
        std::fill(ifast.begin(), ifast.end(), uint8_t{0xEE});
        EXPECT_EQ(tq::detail::quantize_scaled(cb, y.size(), y.data(), scale, ifast.data(), csq.data()), tref)
            << level << " bits " << b << " scale " << scale;
        EXPECT_EQ(ifast, iref) << level << " bits " << b << " scale " << scale;
      }
    }
  }
}

TEST(Quantizer, ZeroVectorEncodesAndDecodesToZero) {
  for (auto kind : {tq::QuantizerKind::mse, tq::QuantizerKind::prod, tq::QuantizerKind::qjl}) {
    auto q = tq::make_quantizer(kind, cfg_for(64, kind == tq::QuantizerKind::qjl ? 1 : 4, "hadamard"));
    std::vector<float> x(64, 0.0f), y(64, 1.0f), qv(64, 1.0f), st(q->query_state_floats());
    std::vector<uint8_t> c(q->code_bytes());
    q->encode(1, x.data(), c.data());
    q->decode(1, c.data(), y.data());
    for (float v : y) EXPECT_EQ(v, 0.0f);
    q->prepare_query(qv.data(), st.data());
    float s = 1;
    q->score(st.data(), 1, c.data(), &s);
    EXPECT_EQ(s, 0.0f);
  }
}

TEST(Quantizer, RejectsBadInput) {
  EXPECT_THROW(tq::make_quantizer(tq::QuantizerKind::mse, cfg_for(1, 4, "hadamard")), tq::Error);
  EXPECT_THROW(tq::make_quantizer(tq::QuantizerKind::mse, cfg_for(0, 4, "hadamard")), tq::Error);
  EXPECT_THROW(tq::make_quantizer(tq::QuantizerKind::mse, cfg_for(64, 0, "hadamard")), tq::Error);
  EXPECT_THROW(tq::make_quantizer(tq::QuantizerKind::mse, cfg_for(64, 9, "hadamard")), tq::Error);
  EXPECT_THROW(tq::make_quantizer(tq::QuantizerKind::prod, cfg_for(64, 1, "hadamard")), tq::Error);
  EXPECT_THROW(tq::parse_quantizer_kind("pq"), tq::Error);
  auto q = tq::make_quantizer(tq::QuantizerKind::mse, cfg_for(16, 4, "hadamard"));
  std::vector<uint8_t> c(2 * q->code_bytes());
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
    std::vector<float> x(32, 1.0f);
    x[20] = bad;
    try {
      q->encode(2, x.data(), c.data());
      FAIL() << "accepted a non-finite value";
    } catch (const tq::Error& e) {
      EXPECT_NE(std::string(e.what()).find("vector 1"), std::string::npos) << e.what();
    }
    std::vector<float> st(q->query_state_floats());
    EXPECT_THROW(q->prepare_query(x.data() + 16, st.data()), tq::Error);
  }
  // a norm beyond the fp16 range with fp16 norms is an error, not Inf
  std::vector<float> big(16, 1e5f);
  EXPECT_THROW(q->encode(1, big.data(), c.data()), tq::Error);
}

TEST(Simd, LevelsAndErrors) {
  auto levels = tq::simd::available_levels();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.back(), "scalar");
  EXPECT_THROW(tq::simd::set_level("avx9000"), tq::Error);
  {
    tq::simd::ScopedLevel sl("scalar");
    EXPECT_TRUE(tq::simd::use_scalar());
    EXPECT_EQ(tq::simd::current_level(), "scalar");
  }
  EXPECT_FALSE(tq::simd::use_scalar());
}

// Every level reaches Highway's dispatch (hwy::DisableTargets): the dispatched target is the
// level's own, and "auto" returns to the best one.
TEST(Simd, LevelsReachHighwayDispatch) {
  const auto levels = tq::simd::available_levels();
  tq::simd::ScopedLevel outer("auto");  // (TQ_SIMD may have set another; restored at the end)
  const std::string best = tq::simd::dispatched_target();
  if (levels.front() != "scalar") EXPECT_EQ(best, levels.front());
  for (const auto& level : levels) {
    if (level == "scalar") continue;
    tq::simd::ScopedLevel sl(level);
    EXPECT_EQ(tq::simd::dispatched_target(), level);
    EXPECT_EQ(tq::simd::current_level(), level);
  }
  tq::simd::set_level("auto");
  EXPECT_EQ(tq::simd::dispatched_target(), best);
}

// A level switch settles Highway's pick of the dispatched target before it returns, on the
// calling thread: the next dispatch reads it and does not pick again. (Highway 1.0.3 leaves the
// pick to the next dispatch, whose first step publishes every detected target as chosen: a
// thread dispatching at that moment ran a better level's kernel, and a KV cache test built with
// two threads failed about one process in ten.)
TEST(Simd, ALevelSwitchSettlesHighwaysPick) {
  for (const auto& level : tq::simd::available_levels()) {
    tq::simd::ScopedLevel sl(level);
    EXPECT_TRUE(hwy::GetChosenTarget().IsInitialized()) << level;
  }
  EXPECT_TRUE(hwy::GetChosenTarget().IsInitialized()) << "back to the outer level";
}

// OpenBLAS's SSE3 Prescott fallback is replaced on CPUs with AVX2 (SkylakeX with AVX-512),
// a kernel set OpenBLAS picked for the CPU is kept; the tests themselves never run on the
// fallback where a better set exists (tests/test_main.cpp).
TEST(Simd, BlasKernelsForTheCpu) {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const char* want = avx512 ? "SkylakeX" : avx2 ? "Haswell" : nullptr;
  for (const char* fallback : {"Prescott", "prescott"}) {
    const char* got = tq::blas_core_for_cpu(fallback);
    EXPECT_EQ(got ? std::string(got) : "", want ? std::string(want) : "") << fallback;
  }
  for (const char* picked : {"SkylakeX", "Haswell", "Zen", "Cooperlake", "Core2", ""})
    EXPECT_EQ(tq::blas_core_for_cpu(picked), nullptr) << picked;
  EXPECT_EQ(tq::blas_core_for_cpu(nullptr), nullptr);
  const std::string running = tq::simd::blas_core();
  EXPECT_FALSE(running.empty());
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced && *forced) EXPECT_EQ(strcasecmp(running.c_str(), forced), 0) << running << " vs " << forced;
  else if (avx2 && !tq::env_as_given())
    EXPECT_NE(strcasecmp(running.c_str(), "Prescott"), 0);
}

TEST(Errors, CheckedArithmetic) {
  EXPECT_THROW(tq::checked_mul(std::numeric_limits<size_t>::max(), 2, "x"), tq::Error);
  EXPECT_THROW(tq::checked_add(std::numeric_limits<size_t>::max(), 1, "x"), tq::Error);
  EXPECT_EQ(tq::checked_mul(3, 4, "x"), 12u);
}

}  // namespace

namespace {
// On anisotropic (key-like) data the rotation matters: dense and Hadamard rotations bring
// the distortion back to the isotropic value, 2-D / 4-D block rotations only partly.
TEST(Quantizer, RotationQualityOnOutlierData) {
  const size_t n = small_tests() ? 1000 : 3000;
  auto mse_of = [&](const char* rot) {
    auto q = tq::make_quantizer(tq::QuantizerKind::mse, cfg_for(128, 3, rot, false));
    return tq::measure_distortion(*q, n, 9, "outlier").mse;
  };
  const double haar = mse_of("haar"), had = mse_of("hadamard"), giv = mse_of("givens"), iso = mse_of("iso4"),
               none = mse_of("identity");
  EXPECT_NEAR(haar, 0.0340, 0.05 * 0.0340);
  EXPECT_LT(had, 0.0340 * 1.05);
  EXPECT_GT(giv, 2 * had);
  EXPECT_GT(iso, 2 * had);
  EXPECT_LT(iso, none);
  EXPECT_LT(giv, none);
}
}  // namespace

namespace {
TEST(Quantizer, RejectsNullPointersAndOverflowingSizes) {
  for (auto kind : {tq::QuantizerKind::mse, tq::QuantizerKind::prod}) {
    auto q = tq::make_quantizer(kind, cfg_for(64, 3, "hadamard"));
    std::vector<float> x(64, 1.0f), st(q->query_state_floats());
    std::vector<uint8_t> c(q->code_bytes());
    float out;
    EXPECT_THROW(q->encode(1, nullptr, c.data()), tq::Error);
    EXPECT_THROW(q->encode(1, x.data(), nullptr), tq::Error);
    EXPECT_THROW(q->decode(1, nullptr, x.data()), tq::Error);
    EXPECT_THROW(q->score(st.data(), 1, nullptr, &out), tq::Error);
    EXPECT_THROW(q->prepare_query(nullptr, st.data()), tq::Error);
    EXPECT_NO_THROW(q->encode(0, nullptr, nullptr));  // an empty batch needs no buffers
    const size_t huge = std::numeric_limits<size_t>::max() / 8;
    EXPECT_THROW(q->encode(huge, x.data(), c.data()), tq::Error);
    EXPECT_THROW(q->decode(huge, c.data(), x.data()), tq::Error);
  }
  for (const auto& name : kRotations) {
    auto rot = tq::make_rotation(tq::parse_rotation(name), 16, 1);
    std::vector<float> x(16);
    EXPECT_THROW(rot->forward(1, nullptr, x.data()), tq::Error) << name;
    EXPECT_THROW(rot->inverse(1, x.data(), nullptr), tq::Error) << name;
  }
}
}  // namespace

namespace {
// The batched scoring path (sign lookup tables, n >= 32) agrees with one-by-one scoring.
TEST(Quantizer, ProdBatchScoreMatchesSingle) {
  for (int d : {17, 100, 128}) {
    auto q = tq::make_quantizer(tq::QuantizerKind::prod, cfg_for(d, 3, "hadamard"));
    const size_t n = 70;
    std::vector<float> x(n * d), qv(d), st(q->query_state_floats()), batch(n), one(1);
    tq::Rng rng(d + 1);
    for (auto& v : x) v = static_cast<float>(rng.normal());
    for (auto& v : qv) v = static_cast<float>(rng.normal());
    std::vector<uint8_t> codes(n * q->code_bytes());
    q->encode(n, x.data(), codes.data());
    q->prepare_query(qv.data(), st.data());
    q->score(st.data(), n, codes.data(), batch.data());
    for (size_t r = 0; r < n; ++r) {
      q->score(st.data(), 1, codes.data() + r * q->code_bytes(), one.data());
      EXPECT_NEAR(batch[r], one[0], 1e-4f * (1 + std::fabs(one[0]))) << "d=" << d << " r=" << r;
    }
  }
}
}  // namespace

// ---------------------------------------------------------------- trellis codes
namespace {
// Mean squared error per coordinate of the cached trellis code on fresh random unit vectors.
double trellis_mse(const tq::TrellisCode& tc, int n, uint64_t seed) {
  tq::Rng rng(seed);
  std::vector<float> u(tc.dim), out(tc.dim);
  std::vector<uint8_t> codes(tc.dim);
  double e = 0;
  for (int v = 0; v < n; ++v) {
    double nn = 0;
    for (auto& x : u) { x = (float)rng.normal(); nn += (double)x * x; }
    for (auto& x : u) x = (float)(x / std::sqrt(nn));
    tq::trellis_encode(tc, u.data(), codes.data());
    for (int i = 0; i < tc.dim; ++i) EXPECT_LT(codes[i], 1u << tc.bits);
    tq::trellis_decode(tc, codes.data(), out.data());
    for (int i = 0; i < tc.dim; ++i) e += (double)(u[i] - out[i]) * (u[i] - out[i]);
  }
  return e / ((double)n * tc.dim);
}
}  // namespace

TEST(Trellis, LessErrorThanLloydMaxAtTheSameBits) {
  // Measured (docs/design.md, "Trellis codes"): 0.71 / 0.67 / 0.69 of the Lloyd-Max MSE at
  // D = 64 and 2 / 3 / 4 bits, 0.71 at D = 48 and 2 bits, 0.81 at 1 bit, 0.75 at D = 16, 4 bits.
  struct C { int dim, bits; double max_ratio; };
  const std::vector<C> cases = small_tests() ? std::vector<C>{{64, 2, 0.76}, {64, 3, 0.72}}
                                             : std::vector<C>{{64, 2, 0.76}, {64, 3, 0.72}, {64, 4, 0.74},
                                                              {48, 2, 0.76}, {16, 4, 0.80}, {64, 1, 0.85}};
  for (const auto& c : cases) {
    const auto& tc = tq::get_trellis(c.dim, c.bits);
    EXPECT_EQ(tc.bits + tc.state_bits, 8);
    ASSERT_EQ(tc.lut.size(), 256u);
    const double lm = tq::get_codebook(c.dim, c.bits).mse_per_coord;
    const double mse = trellis_mse(tc, 400, 99);
    EXPECT_LT(mse / lm, c.max_ratio) << "D=" << c.dim << " bits=" << c.bits;
    EXPECT_NEAR(mse / tc.mse_per_coord, 1.0, 0.1) << "held-out MSE of the cached code";
  }
}

TEST(Trellis, CodewordsAreRecoveredExactly) {
  // A vector that is itself a decoded code sequence has a zero-error path; the tail-biting
  // encoder must find it (the windows wrap around the end of the vector).
  for (const auto& [dim, bits] : std::vector<std::pair<int, int>>{{64, 2}, {48, 3}, {16, 4}, {4, 2}, {8, 1}}) {
    const auto& tc = tq::get_trellis(dim, bits);
    tq::Rng rng(5);
    std::vector<uint8_t> c(dim), back(dim);
    std::vector<float> x(dim), y(dim);
    for (int rep = 0; rep < 50; ++rep) {
      for (auto& v : c) v = (uint8_t)rng.below(1u << bits);
      tq::trellis_decode(tc, c.data(), x.data());
      tq::trellis_encode(tc, x.data(), back.data());
      tq::trellis_decode(tc, back.data(), y.data());
      for (int i = 0; i < dim; ++i) ASSERT_EQ(x[i], y[i]) << "D=" << dim << " rep " << rep << " coordinate " << i;
    }
  }
}

// Every SIMD pass (its four-chain minimum from 3 bits on, its broadcast old-state cost where
// 2^bits >= the vector length) picks the reference's codes, ties included: the 256 / 192 dims
// are a Gemma head and its split part.
TEST(Trellis, SimdSearchMatchesReferenceAtEveryLevel) {
  for (const auto& lv : tq::simd::available_levels()) {
  tq::simd::ScopedLevel sl(lv);
  for (int bits = 1; bits <= 4; ++bits)
    for (int dim : {256, 192, 64, 48, 16}) {
      const auto& tc = tq::get_trellis(dim, bits);
      tq::Rng rng(17 + bits);
      std::vector<float> u(dim);
      std::vector<uint8_t> a(dim), b(dim);
      for (int rep = 0; rep < 40; ++rep) {
        for (auto& x : u) x = (float)(rng.normal() / std::sqrt((double)dim)) * (rep % 4 == 3 ? 3.f : 1.f);
        if (rep == 7) u[3] = std::numeric_limits<float>::quiet_NaN();
        if (rep == 11) std::fill(u.begin(), u.end(), 0.f);  // all-zero: ties among equal table entries
        tq::trellis_encode(tc, u.data(), a.data());
        tq::trellis_encode_ref(tc, u.data(), b.data());
        ASSERT_EQ(a, b) << lv << " D=" << dim << " bits=" << bits << " rep " << rep;
      }
    }
  }
}

// Tables of few distinct values make equal path costs everywhere: the SIMD search must keep
// the reference's choice among them (the lowest candidate index), also across its chains.
TEST(Trellis, SimdSearchBreaksTiesAsTheReference) {
  for (const auto& lv : tq::simd::available_levels()) {
    tq::simd::ScopedLevel sl(lv);
    for (int bits = 1; bits <= 4; ++bits)
      for (int dim : {256, 64}) {
        tq::TrellisCode tc = tq::get_trellis(dim, bits);
        tq::Rng rng(5 + bits);
        for (int table = 0; table < 3; ++table) {
          // all zero; two values; four values
          for (auto& v : tc.lut) v = table == 0 ? 0.f : (float)(0.05 * (1 + (int)rng.below(table == 1 ? 2 : 4))) *
                                                           (rng.below(2) ? 1.f : -1.f);
          std::vector<float> u(dim);
          std::vector<uint8_t> a(dim), b(dim);
          for (int rep = 0; rep < 6; ++rep) {
            for (auto& x : u) x = rep < 2 ? 0.f : (float)(0.05 * (int)rng.below(5) - 0.1);
            tq::trellis_encode(tc, u.data(), a.data());
            tq::trellis_encode_ref(tc, u.data(), b.data());
            ASSERT_EQ(a, b) << lv << " D=" << dim << " bits=" << bits << " table " << table << " rep " << rep;
          }
        }
      }
  }
}

TEST(Trellis, SimdDecodeMatchesReferenceAtEveryLevel) {
  for (const auto& lv : tq::simd::available_levels()) {
    tq::simd::ScopedLevel sl(lv);
    for (const auto& [dim, bits] : std::vector<std::pair<int, int>>{{64, 1}, {64, 2}, {64, 3}, {64, 4}, {48, 2}, {8, 2}, {100, 3}}) {
      const auto& tc = tq::get_trellis(dim, bits);
      tq::Rng rng(3 + bits);
      std::vector<uint8_t> c(dim);
      std::vector<float> ref(dim), out(dim);
      for (int rep = 0; rep < 8; ++rep) {
        for (auto& v : c) v = (uint8_t)rng.below(1u << bits);
        const float s = rep == 0 ? 1.f : (float)rng.uniform() * 3.f;
        tq::trellis_decode(tc, c.data(), ref.data());
        for (auto& v : ref) v *= s;
        tq::trellis_decode_scaled(tc, c.data(), s, out.data());
        ASSERT_EQ(out, ref) << lv << " D=" << dim << " bits=" << bits;
      }
    }
  }
}

TEST(Trellis, WindowWrapsAroundAndTrainingIsDeterministic) {
  tq::TrellisCode tc;
  tc.dim = 4;
  tc.bits = 3;
  tc.state_bits = 5;
  const uint8_t codes[4] = {1, 2, 3, 4};
  EXPECT_EQ(tc.window(codes, 3), (4u | 3u << 3 | 2u << 6) & 255u);
  EXPECT_EQ(tc.window(codes, 0), (1u | 4u << 3 | 3u << 6) & 255u);  // wraps: codes 3, 2 before code 0
  const auto a = tq::train_trellis(16, 2, 6, 7, 64, 3), b = tq::train_trellis(16, 2, 6, 7, 64, 3);
  EXPECT_EQ(a.lut, b.lut);
  EXPECT_EQ(&tq::get_trellis(64, 2), &tq::get_trellis(64, 2));
}

TEST(Trellis, ZeroNanAndBadArguments) {
  const auto& tc = tq::get_trellis(64, 3);
  std::vector<float> z(64, 0.f), out(64);
  std::vector<uint8_t> codes(64, 255);
  tq::trellis_encode(tc, z.data(), codes.data());
  for (auto c : codes) EXPECT_LT(c, 8u);
  z[7] = std::numeric_limits<float>::quiet_NaN();
  tq::trellis_encode(tc, z.data(), codes.data());
  tq::trellis_decode(tc, codes.data(), out.data());
  for (float v : out) EXPECT_TRUE(std::isfinite(v));
  EXPECT_THROW(tq::get_trellis(64, 0), tq::Error);
  EXPECT_THROW(tq::get_trellis(64, 5), tq::Error);   // 5+ bits: no better than Lloyd-Max
  EXPECT_THROW(tq::get_trellis(2, 2), tq::Error);    // 4 code bits cannot hold an 8-bit window
  EXPECT_THROW(tq::train_trellis(64, 2, 7, 1, 10, 1), tq::Error);  // 9-bit window
  EXPECT_THROW(tq::train_trellis(64, 2, 6, 1, 0, 1), tq::Error);
}
