// QMatvec.*: the GGUF block matvec kernels (src/llm/qmatvec.h) for every weight type (F32, F16,
// BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; the types without a quantizer here as
// random blocks), at every SIMD level of the host and in the scalar reference, against the
// weights dequantized to f32 (tq::dequantize_row) and a double-precision dot product; bad
// input; and LlamaModel's decode through the block kernels against its f32 (OpenBLAS) path.
// QGemm.*: the many-row product (panels of dequantized rows times OpenBLAS sgemm; for the
// integer-activation types on AVX-512 levels the integer GEMM on unpacked 16-bit panels)
// against the same exact products, for several panel heights; LlamaModel's prefill through it.
// Activation.*: the GELU gate (src/llm/activation.h) at every SIMD level against the formula
// in double precision.
//
// Error bound. Every kernel sums each 32-value block (or 32-value chunk of F32/F16 rows) on
// its own, scales it by the block's d, adds the Q4 offset term m * (float sum of the block's
// x) and accumulates the nb = in / 32 block results (the SIMD kernels in vector lanes, then
// one horizontal sum of at most 16 lanes). Every product and partial sum passes through at
// most 32 + 3 + nb + 4 float roundings, so with u = 2^-24 the error of each result against the
// exact value is at most (39 + nb) u S to first order, where S = sum_j (|d q_j| + |m|) |x_j|
// is the sum of the magnitudes of the terms actually added (m = 0 for Q8_0 / Q6_K and the
// float types, where S = sum |w_j x_j|; m = -8 d for Q4_0, -16 d for Q5_0, -dmin mn for the
// Q4_K / Q5_K sub-blocks, whose d is d sc). Q6_K sums 16-value groups: at most 16 + 3 +
// in / 16 + 4 roundings. For in = 1536 (nb = 48): 87 u = 5.2e-6 (Q6_K: 119 u = 7.1e-6). The
// dequantized-to-f32 value d q + m adds 2 roundings of its own. kRelTol = 1e-5 of S covers
// kernel vs exact; kernel vs reference is bounded by the sum of two such errors, also < 1e-5 S
// since neither reaches the first-order worst case (checked with kRelTol for both).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "llm/activation.h"
#include "llm/qmatvec.h"
#include "llm_test_util.h"
#include "tq/common.h"
#include "tq/error.h"
#include "tq/gguf.h"
#include "tq/kv_cache.h"
#include "tq/model.h"
#include "tq/simd.h"

namespace {

constexpr double kRelTol = 1e-5;

using tq::GgmlType;

const GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0,
                           GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                           GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

bool is_kquant(GgmlType t) { return tq::ggml_block_size(t) == tq::kQK; }
// A row length of the sweeps for t: `in` itself, or for the K-quants (256-value blocks) the
// multiple of 256 nearest above.
int len_for(GgmlType t, int in) { return is_kquant(t) ? (in + 255) / 256 * 256 : in; }

uint16_t rd16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// The per-value offset m of value j of a weight row (see the bound above).
float offset_of(GgmlType t, const uint8_t* row, int j) {
  const int b = j / 32;
  switch (t) {
    case GgmlType::Q4_1: return tq::fp16_to_fp32(rd16(row + static_cast<size_t>(b) * sizeof(tq::BlockQ4_1) + 2));
    case GgmlType::Q4_0: return -8.0f * tq::fp16_to_fp32(rd16(row + static_cast<size_t>(b) * sizeof(tq::BlockQ4_0)));
    case GgmlType::Q5_1: return tq::fp16_to_fp32(rd16(row + static_cast<size_t>(b) * sizeof(tq::BlockQ5_1) + 2));
    case GgmlType::Q5_0: return -16.0f * tq::fp16_to_fp32(rd16(row + static_cast<size_t>(b) * sizeof(tq::BlockQ5_0)));
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {  // -dmin * mn of the sub-block
      const uint8_t* blk = row + static_cast<size_t>(j / 256) * tq::ggml_block_bytes(t);
      int sc, mn;
      tq::kquant_scale_min(blk + 4, (j % 256) / 32, sc, mn);
      return -tq::fp16_to_fp32(rd16(blk + 2)) * static_cast<float>(mn);
    }
    default: return 0.0f;  // Q8_0, Q6_K (signed codes), float types
  }
}

struct Case {
  GgmlType t;
  int in, out, n;
  std::vector<uint8_t> w;
  std::vector<float> x;
  std::vector<double> exact;  // dequantized weights, double dot
  std::vector<double> scale;  // S per output (see the bound above)
  // Integer-activation types (qmatvec_int16): the same with x replaced by its 16-bit rounding
  // x16 (quantize_x16), and the bound of the activation rounding sum_b (dx_b / 2) sum |W[o, j]|.
  bool int16 = false;
  std::vector<double> exact16, scale16, act;
};

Case make_case(GgmlType t, int in, int out, int n, uint64_t seed) {
  Case c{t, in, out, n, {}, {}, {}, {}};
  tq::Rng r(seed);
  std::vector<float> wf(static_cast<size_t>(in) * out);
  // Rows with a positive or negative offset (exercises the Q4_1 m term), and a zero row.
  for (int o = 0; o < out; ++o)
    for (int i = 0; i < in; ++i)
      wf[static_cast<size_t>(o) * in + i] =
          o == 3 ? 0.0f : static_cast<float>(r.normal() * 0.1 + (o % 3 - 1) * 0.07);
  const size_t rb = tq::ggml_row_bytes(t, in);
  c.w.resize(rb * out);
  for (int o = 0; o < out; ++o) {
    if (tq::ggml_has_quantizer(t)) {
      tq::quantize_row(t, wf.data() + static_cast<size_t>(o) * in, c.w.data() + o * rb, in);
    } else {  // random codes and scales (row 3 all zero); values within about +-0.2
      const auto b = tq_test::random_blocks(t, static_cast<size_t>(in), r, o == 3 ? 0.0f : 0.1f);
      std::memcpy(c.w.data() + o * rb, b.data(), rb);
    }
  }
  c.x.resize(static_cast<size_t>(n) * in);
  for (auto& v : c.x) v = static_cast<float>(r.normal() + 0.3);
  std::vector<float> deq(in);
  c.exact.assign(static_cast<size_t>(n) * out, 0.0);
  c.scale.assign(static_cast<size_t>(n) * out, 0.0);
  for (int o = 0; o < out; ++o) {
    const uint8_t* row = c.w.data() + o * rb;
    tq::dequantize_row(t, row, deq.data(), in);
    for (int k = 0; k < n; ++k) {
      double s = 0, a = 0;
      for (int i = 0; i < in; ++i) {
        const double xv = c.x[static_cast<size_t>(k) * in + i];
        const double m = offset_of(t, row, i);
        s += deq[i] * xv;
        a += (std::fabs(deq[i] - m) + std::fabs(m)) * std::fabs(xv);
      }
      c.exact[static_cast<size_t>(k) * out + o] = s;
      c.scale[static_cast<size_t>(k) * out + o] = a;
    }
  }
  c.int16 = tq::llm::qmatvec_int16(t);
  if (c.int16) {
    const int nb = in / 32;
    std::vector<int16_t> q(static_cast<size_t>(n) * in);
    std::vector<float> xd(static_cast<size_t>(n) * nb), xs(xd.size());
    tq::llm::detail::quantize_x16(c.x.data(), n, in, q.data(), xd.data(), xs.data());
    c.exact16.assign(c.exact.size(), 0.0);
    c.scale16.assign(c.exact.size(), 0.0);
    c.act.assign(c.exact.size(), 0.0);
    for (int o = 0; o < out; ++o) {
      const uint8_t* row = c.w.data() + o * rb;
      tq::dequantize_row(t, row, deq.data(), in);
      for (int k = 0; k < n; ++k) {
        double s = 0, a = 0, e = 0;
        for (int i = 0; i < in; ++i) {
          const size_t b = static_cast<size_t>(k) * nb + i / 32;
          const double x16 = static_cast<double>(xd[b]) * q[static_cast<size_t>(k) * in + i];
          const double m = offset_of(t, row, i);
          s += deq[i] * x16;
          a += (std::fabs(deq[i] - m) + std::fabs(m)) * std::fabs(x16);
          e += 0.5 * xd[b] * std::fabs(deq[i]);
        }
        c.exact16[static_cast<size_t>(k) * out + o] = s;
        c.scale16[static_cast<size_t>(k) * out + o] = a;
        c.act[static_cast<size_t>(k) * out + o] = e;
      }
    }
  }
  return c;
}

std::string label(const Case& c, const std::string& what) {
  return std::string(tq::ggml_type_name(c.t)) + " in=" + std::to_string(c.in) + " out=" + std::to_string(c.out) +
         " n=" + std::to_string(c.n) + " " + what;
}

// Checks y (ldy-strided) against the exact products; also that the padding is untouched.
// Integer-activation types: within kRelTol * S16 of the exact product with x16 (the kernels'
// own rounding, the same bound as the float kernels with x16 for x; the integer sums are exact),
// and within the activation bound (+ (1 + 1e-5) for the rounding of dx and of x / dx) plus
// kRelTol * S of the exact product with x.
void expect_close(const Case& c, const std::vector<float>& y, int ldy, const std::vector<double>* other,
                  const std::string& what) {
  for (int k = 0; k < c.n; ++k) {
    for (int o = 0; o < c.out; ++o) {
      const size_t i = static_cast<size_t>(k) * c.out + o;
      const float v = y[static_cast<size_t>(k) * ldy + o];
      if (c.int16) {
        const double tol16 = kRelTol * c.scale16[i] + 1e-30;
        ASSERT_LE(std::fabs(v - c.exact16[i]), tol16) << label(c, what) << " row " << k << " out " << o << " vs x16";
        ASSERT_LE(std::fabs(v - c.exact[i]), c.act[i] * (1 + 1e-5) + tol16 + kRelTol * c.scale[i])
            << label(c, what) << " row " << k << " out " << o << " vs x";
        if (other) ASSERT_LE(std::fabs(v - (*other)[static_cast<size_t>(k) * ldy + o]), tol16) << label(c, what + " vs ref");
        continue;
      }
      const double tol = kRelTol * c.scale[i] + 1e-30;
      ASSERT_LE(std::fabs(v - c.exact[i]), tol) << label(c, what) << " row " << k << " out " << o;
      if (other) ASSERT_LE(std::fabs(v - (*other)[static_cast<size_t>(k) * ldy + o]), tol) << label(c, what + " vs ref");
    }
    for (int o = c.out; o < ldy; ++o) ASSERT_EQ(y[static_cast<size_t>(k) * ldy + o], -7.0f) << label(c, what);
  }
}

}  // namespace

// Every type x shapes x row counts: reference and every SIMD level (1 and 2 threads) within
// kRelTol * S of the exact product of the dequantized weights, and of each other.
TEST(QMatvec, MatchesDequantizedAtEveryLevel) {
  const auto levels = tq::simd::available_levels();
  int checked = 0;
  for (GgmlType t : kTypes) {
    std::vector<int> ins = {32, 64, 576, 1536};
    if (is_kquant(t)) ins = {256, 512, 1536};
    if (tq::ggml_block_size(t) == 1) {  // block size 1: any length
      ins.push_back(7);
      ins.push_back(100);
    }
    for (int in : ins) {
      for (int out : {1, 5, 67, 131}) {
        for (int n : {1, 2, 3, 4, 6}) {
          if (in == 1536 && out == 131 && n > 2) continue;  // keep the sweep quick
          const Case c = make_case(t, in, out, n, 1000 + in * 7 + out * 3 + n);
          const int ldy = out + 3;
          std::vector<float> ref(static_cast<size_t>(n) * ldy, -7.0f);
          tq::llm::qmatvec_ref(t, c.w.data(), in, out, c.x.data(), n, ref.data(), ldy);
          expect_close(c, ref, ldy, nullptr, "ref");
          std::vector<double> refd(ref.begin(), ref.end());
          for (const auto& level : levels) {
            tq::simd::ScopedLevel sl(level);
            for (int threads : {1, 2}) {
              std::vector<float> y(static_cast<size_t>(n) * ldy, -7.0f);
              tq::llm::qmatvec(t, c.w.data(), in, out, c.x.data(), n, y.data(), ldy, threads);
              expect_close(c, y, ldy, &refd, level + " t=" + std::to_string(threads));
              if (level == "scalar")  // the scalar level is the reference itself
                ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * sizeof(float))) << label(c, "scalar");
            }
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
}

// Results do not depend on the thread count or on how the rows of x are grouped (the kernels
// handle up to kQMatvecMaxRows rows per pass; a row's result is the same in any pass).
TEST(QMatvec, SameBitsForAnyThreadCountAndRowGrouping) {
  for (const auto& level : tq::simd::available_levels()) {
    tq::simd::ScopedLevel sl(level);
    for (GgmlType t : kTypes) {
      const Case c = make_case(t, len_for(t, 576), 200, 7, 42);
      std::vector<float> all(static_cast<size_t>(c.n) * c.out), one(c.out), par(all.size());
      tq::llm::qmatvec(t, c.w.data(), c.in, c.out, c.x.data(), c.n, all.data(), c.out, 1);
      tq::llm::qmatvec(t, c.w.data(), c.in, c.out, c.x.data(), c.n, par.data(), c.out, 2);
      ASSERT_EQ(0, std::memcmp(all.data(), par.data(), all.size() * sizeof(float))) << level;
      for (int k = 0; k < c.n; ++k) {
        tq::llm::qmatvec(t, c.w.data(), c.in, c.out, c.x.data() + static_cast<size_t>(k) * c.in, 1, one.data(), c.out, 1);
        ASSERT_EQ(0, std::memcmp(one.data(), all.data() + static_cast<size_t>(k) * c.out, one.size() * sizeof(float)))
            << level << " " << tq::ggml_type_name(t) << " row " << k;
      }
    }
  }
}

// The 16-bit rounding of the activations (quantize_x16): dx = max|x| / 32767 per 32-value
// block, codes in [-32767, 32767] with |x - dx q| <= dx / 2 (+ the rounding of dx and of
// x / dx), s = dx sum q; a zero block gives dx = 0 and codes 0; inf or NaN gives codes 0 and
// dx = s = NaN.
TEST(QMatvec, QuantizeX16RoundsEachBlock) {
  tq::Rng r(9);
  const int in = 160, nb = in / 32;
  std::vector<float> x(in);
  for (int i = 0; i < in; ++i) x[i] = static_cast<float>(r.normal() * (i < 32 ? 1e-30 : i < 64 ? 3.0 : 1e4));
  for (int i = 64; i < 96; ++i) x[i] = 0.0f;                  // block 2: zero
  x[100] = std::numeric_limits<float>::infinity();            // block 3: inf
  x[140] = std::numeric_limits<float>::quiet_NaN();           // block 4: NaN
  std::vector<int16_t> q(in);
  std::vector<float> d(nb), s(nb);
  tq::llm::detail::quantize_x16(x.data(), 1, in, q.data(), d.data(), s.data());
  for (int b = 0; b < 2; ++b) {
    float amax = 0;
    int sum = 0, top = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    EXPECT_EQ(d[b], amax / 32767.0f) << b;
    for (int j = 0; j < 32; ++j) {
      const int i = b * 32 + j;
      EXPECT_LE(std::abs(q[i]), 32767);
      EXPECT_LE(std::fabs(x[i] - static_cast<double>(d[b]) * q[i]), 0.5 * d[b] * (1 + 1e-5)) << i;
      sum += q[i];
      top = std::max(top, std::abs(static_cast<int>(q[i])));
    }
    EXPECT_EQ(top, 32767) << b;
    EXPECT_EQ(s[b], d[b] * static_cast<float>(sum)) << b;
  }
  EXPECT_EQ(d[2], 0.0f);
  EXPECT_EQ(s[2], 0.0f);
  for (int b = 2; b < 5; ++b)
    for (int j = 0; j < 32; ++j) EXPECT_EQ(q[b * 32 + j], 0) << b;
  EXPECT_TRUE(std::isnan(d[3]) && std::isnan(s[3]) && std::isnan(d[4]) && std::isnan(s[4]));
  // Through the matvec: NaN comes out of the rows that read a non-finite block, at every level.
  const Case c = make_case(GgmlType::Q8_0, in, 3, 1, 5);
  for (const auto& level : tq::simd::available_levels()) {
    tq::simd::ScopedLevel sl(level);
    std::vector<float> y(3);
    tq::llm::qmatvec(GgmlType::Q8_0, c.w.data(), in, 3, x.data(), 1, y.data(), 3, 1);
    EXPECT_TRUE(std::isnan(y[0])) << level;
    // And through qgemm (the prefill path; the integer GEMM on AVX-512 levels).
    std::vector<float> x9(static_cast<size_t>(9) * in), y9(9 * 3);
    for (int k = 0; k < 9; ++k) std::copy(x.begin(), x.end(), x9.begin() + static_cast<size_t>(k) * in);
    tq::llm::qgemm(GgmlType::Q8_0, c.w.data(), in, 3, x9.data(), 9, y9.data(), 3, 2);
    for (int k = 0; k < 9; ++k) EXPECT_TRUE(std::isnan(y9[static_cast<size_t>(k) * 3])) << level << " qgemm row " << k;
  }
}

// quantize_x16_avx512 (the prefill path's rounding of x) gives the reference's bits: random
// rows at scales from 1e-30 to 1e30, halfway cases, zero, inf and NaN blocks.
TEST(QMatvec, QuantizeX16Avx512SameBits) {
  if (!tq::llm::detail::qmv16_avx512_host_ok()) GTEST_SKIP() << "no AVX-512 on this host";
  tq::Rng r(21);
  const int in = 640, n = 7, nb = in / 32;
  std::vector<float> x(static_cast<size_t>(n) * in);
  for (size_t i = 0; i < x.size(); ++i) {
    const int b = static_cast<int>(i / 32) % 13;
    x[i] = static_cast<float>(r.normal() * std::pow(10.0, 5 * (b % 7) - 15));
  }
  for (int i = 0; i < 32; ++i) x[64 + i] = 0.0f;                                  // zero block
  for (int i = 0; i < 32; ++i) x[128 + i] = static_cast<float>(i - 16) * 0.5f;   // halves: ties
  x[200] = std::numeric_limits<float>::infinity();
  x[300] = -std::numeric_limits<float>::infinity();
  x[1000] = std::numeric_limits<float>::quiet_NaN();
  x[2000] = std::numeric_limits<float>::max();
  std::vector<int16_t> q0(x.size()), q1(x.size());
  std::vector<float> d0(static_cast<size_t>(n) * nb), s0(d0.size()), d1(d0.size()), s1(d0.size());
  tq::llm::detail::quantize_x16(x.data(), n, in, q0.data(), d0.data(), s0.data());
  tq::llm::detail::quantize_x16_avx512(x.data(), n, in, q1.data(), d1.data(), s1.data());
  EXPECT_EQ(0, std::memcmp(q0.data(), q1.data(), q0.size() * sizeof(int16_t)));
  for (size_t k = 0; k < d0.size(); ++k) {
    if (std::isnan(d0[k])) {
      EXPECT_TRUE(std::isnan(d1[k]) && std::isnan(s1[k])) << k;
      continue;
    }
    EXPECT_EQ(0, std::memcmp(&d0[k], &d1[k], 4)) << k;
    EXPECT_EQ(0, std::memcmp(&s0[k], &s1[k], 4)) << k;
  }
}

// Batched decode: 8 rows of x in one pass over the weights, 9 and 16 in two (AVX-512; 4 per
// pass elsewhere), every integer-activation type at every level, against the exact products as
// above.
TEST(QMatvec, Int16ManyRowsAtEveryLevel) {
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
    for (int n : {8, 9, 16}) {
      const Case c = make_case(t, len_for(t, 512), 37, n, 300 + n);
      const int ldy = c.out + 1;
      std::vector<float> ref(static_cast<size_t>(n) * ldy, -7.0f);
      tq::llm::qmatvec_ref(t, c.w.data(), c.in, c.out, c.x.data(), n, ref.data(), ldy);
      expect_close(c, ref, ldy, nullptr, "ref");
      std::vector<double> refd(ref.begin(), ref.end());
      for (const auto& level : tq::simd::available_levels()) {
        tq::simd::ScopedLevel sl(level);
        std::vector<float> y(static_cast<size_t>(n) * ldy, -7.0f);
        tq::llm::qmatvec(t, c.w.data(), c.in, c.out, c.x.data(), n, y.data(), ldy, 2);
        expect_close(c, y, ldy, &refd, level);
      }
    }
  }
}

TEST(QMatvec, RejectsBadInput) {
  std::vector<uint8_t> w(4096);
  std::vector<float> x(256), y(256);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0}) {
    for (int in : {48, 31, 33, 0, -32}) {
      EXPECT_THROW(tq::llm::qmatvec(t, w.data(), in, 2, x.data(), 1, y.data(), 2, 1), tq::Error) << in;
      EXPECT_THROW(tq::llm::qmatvec_ref(t, w.data(), in, 2, x.data(), 1, y.data(), 2), tq::Error) << in;
    }
  }
  try {
    tq::llm::qmatvec(GgmlType::Q4_1, w.data(), 48, 2, x.data(), 1, y.data(), 2, 1);
    FAIL() << "no error";
  } catch (const tq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of the Q4_1 block size 32"), std::string::npos) << e.what();
  }
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})  // 256-value super-blocks
    for (int in : {32, 128, 288}) {
      EXPECT_THROW(tq::llm::qmatvec(t, w.data(), in, 2, x.data(), 1, y.data(), 2, 1), tq::Error) << in;
      EXPECT_THROW(tq::llm::qgemm(t, w.data(), in, 2, x.data(), 9, y.data(), 2, 1), tq::Error) << in;
    }
  // A ggml type tq does not read (Q2_K = 10): an error naming it and the supported ones.
  try {
    tq::llm::qmatvec(static_cast<GgmlType>(10), w.data(), 32, 2, x.data(), 1, y.data(), 2, 1);
    FAIL() << "no error";
  } catch (const tq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q4_K(12)"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(tq::llm::qmatvec_supported(static_cast<GgmlType>(10)));
  EXPECT_THROW(tq::llm::qmatvec(GgmlType::F32, w.data(), 32, 4, x.data(), 1, y.data(), 3, 1), tq::Error);  // ldy
  EXPECT_THROW(tq::llm::qmatvec(GgmlType::F32, w.data(), 32, -1, x.data(), 1, y.data(), 3, 1), tq::Error);
  EXPECT_THROW(tq::llm::qmatvec(GgmlType::F32, nullptr, 32, 2, x.data(), 1, y.data(), 2, 1), tq::Error);
  // Nothing to do is fine, with any pointers.
  EXPECT_NO_THROW(tq::llm::qmatvec(GgmlType::Q4_1, nullptr, 32, 0, nullptr, 1, nullptr, 0, 1));
  for (GgmlType t : kTypes) EXPECT_TRUE(tq::llm::qmatvec_supported(t)) << tq::ggml_type_name(t);
}

// Tiny random-weight models: greedy decode (one token per forward, the block kernels) and 3-
// and 7-token forwards (also the block kernels, n <= 8) give the same logits as the f32 OpenBLAS path
// within 2e-5 of the largest logit. Both compute the same products of the same f32 weight
// values (the f32 copy is the dequantized blocks) and differ only in float summation order
// (~1e-6 relative per projection, see the kernel bound above), carried through 2 layers.
// The greedy tokens are the same as long as no top-2 gap is that small (checked).
// Q4_1 / Q8_0 / Q4_0 (16-bit integer activations, see qmatvec.h) differ from the f32 path by
// the rounding of every projection's input as well (per 32-value block within +-dx/2, dx =
// max|x| / 32767), which these random-weight models amplify through 2 layers and the cache.
// With 8-bit activations (dx = max|x| / 127, llama.cpp's rounding; tried first) the largest
// difference here was 0.20 of the largest logit (Q4_0 untied, 3-token forward after 12
// decode steps); 16 bits round 32767 / 127 = 258x finer: 0.20 / 258 = 7.8e-4, so kInt16Tol =
// 1e-3 (seen: 2.8e-4, Q8_0 untied at sse4). The kernels' own error against the exact product
// with the rounded x, and against the float product within the activation bound, is checked
// tightly in MatchesDequantizedAtEveryLevel.
TEST(QMatvec, ModelDecodeMatchesF32Path) {
  constexpr double kInt16Tol = 1e-3;
  for (GgmlType wt : {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::F16}) {
    for (bool tied : {true, false}) {
      tq_test::TinyLlama c;
      c.tied = tied;
      const auto bytes = tq_test::tiny_llama_gguf(c, wt, 11).bytes();
      auto g = tq::GgufFile::from_bytes(bytes.data(), bytes.size());
      tq::LlamaModel m = tq::LlamaModel::load(g);
      m.set_threads(2);
      EXPECT_GT(m.block_weight_bytes(), 0u);
      EXPECT_LT(m.block_weight_bytes(), m.weight_bytes());
      auto kc = m.kv_config(64);
      kc.type_k = kc.type_v = tq::KvFormat::f32;
      for (const auto& level : tq::simd::available_levels()) {
        tq::simd::ScopedLevel sl(level);
        const std::string what = std::string(tq::ggml_type_name(wt)) + (tied ? " tied " : " untied ") + level;
        // Greedy decode, driven by the block-kernel path; the f32 path follows the same tokens.
        tq::KvCache cq(kc), cf(kc);
        int32_t tok = 1;
        double err = 0, scale = 0;
        for (int step = 0; step < 12; ++step) {
          m.set_f32_decode(false);
          const auto lq = m.forward_last(cq, {tok});
          m.set_f32_decode(true);
          const auto lf = m.forward_last(cf, {tok});
          for (int v = 0; v < c.n_vocab; ++v) {
            err = std::max(err, static_cast<double>(std::fabs(lq[v] - lf[v])));
            scale = std::max(scale, static_cast<double>(std::fabs(lf[v])));
          }
          ASSERT_EQ(tq::argmax(lq.data(), c.n_vocab), tq::argmax(lf.data(), c.n_vocab)) << what << " step " << step;
          tok = tq::argmax(lq.data(), c.n_vocab);
        }
        const double tol = tq::llm::qmatvec_int16(wt) ? kInt16Tol : 2e-5;
        EXPECT_LT(err / scale, tol) << what;
        EXPECT_GT(err, 0.0) << what << ": the two paths gave the same bits (is the block path used?)";
        // 3- and 7-token forwards (block kernels: one pass of 3 rows; passes of 4 + 3 rows).
        for (const std::vector<int32_t>& more : {std::vector<int32_t>{5, 17, 42}, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}}) {
          m.set_f32_decode(false);
          const auto lq = m.forward_last(cq, more);
          m.set_f32_decode(true);
          const auto lf = m.forward_last(cf, more);
          err = scale = 0;
          for (int v = 0; v < c.n_vocab; ++v) {
            err = std::max(err, static_cast<double>(std::fabs(lq[v] - lf[v])));
            scale = std::max(scale, static_cast<double>(std::fabs(lf[v])));
          }
          EXPECT_LT(err / scale, tol) << what << " " << more.size() << "-token forward";
        }
      }
      m.set_f32_decode(false);
    }
  }
}

// qgemm: every type at every SIMD level, panel heights from 16 rows (several panels per
// thread; 40: not a multiple of the integer GEMM's 16-row tiles) to one panel, 1 and 2
// threads. The float path (dequantized panels times sgemm) within the worst-case bound of any
// float summation order: the dequantized weight (2 roundings) times x, summed over `in`
// terms: (in + 2) u S, u = 2^-24. The integer GEMM (qgemm_int16: the int16 types at avx3 /
// avx3_dl) within the bounds of the int16 matvec (expect_close: vs the exact product with
// x16, vs x with the activation bound, and vs the scalar reference qmatvec_ref).
TEST(QGemm, MatchesDequantizedForAnyPanelHeight) {
  int checked = 0, int16_checked = 0;
  for (GgmlType t : kTypes) {
    for (int in0 : {32, 576}) {
      const int in = len_for(t, in0);
      for (int out : {1, 67, 131}) {
        for (int n : {9, 33}) {
          const Case c = make_case(t, in, out, n, 500 + in + out * 3 + n);
          const int ldy = out + 3;
          std::vector<float> ref(static_cast<size_t>(n) * ldy, -7.0f);
          tq::llm::qmatvec_ref(t, c.w.data(), in, out, c.x.data(), n, ref.data(), ldy);
          const std::vector<double> refd(ref.begin(), ref.end());
          for (const auto& level : tq::simd::available_levels()) {
           tq::simd::ScopedLevel sl(level);
           for (int panel : {0, 16, 40, 48, 4096}) {
            for (int threads : {1, 2}) {
              std::vector<float> y(static_cast<size_t>(n) * ldy, -7.0f);
              tq::llm::qgemm(t, c.w.data(), in, out, c.x.data(), n, y.data(), ldy, threads, panel);
              if (tq::llm::qgemm_int16(t)) {  // integer GEMM: the bounds of the int16 matvec, and vs its reference
                expect_close(c, y, ldy, &refd, "qgemm " + level + " panel " + std::to_string(panel) + " t=" +
                                                   std::to_string(threads));
                ++int16_checked;
                continue;
              }
              for (int k = 0; k < n; ++k) {
                for (int o = 0; o < out; ++o) {
                  const size_t i = static_cast<size_t>(k) * out + o;
                  const double tol = (in + 2) * std::ldexp(1.0, -24) * c.scale[i] + 1e-30;
                  ASSERT_LE(std::fabs(y[static_cast<size_t>(k) * ldy + o] - c.exact[i]), tol)
                      << label(c, "qgemm panel " + std::to_string(panel) + " t=" + std::to_string(threads))
                      << " row " << k << " out " << o;
                }
                for (int o = out; o < ldy; ++o) ASSERT_EQ(y[static_cast<size_t>(k) * ldy + o], -7.0f);
              }
              ++checked;
            }
           }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 400);
  if (tq::llm::detail::qmv16_avx512_host_ok()) EXPECT_GT(int16_checked, 400);
  EXPECT_EQ(tq::llm::qgemm_panel_rows(576), tq::llm::kQGemmPanelFloats / 576 / 16 * 16);
  EXPECT_EQ(tq::llm::qgemm_panel_rows(1 << 20), 16);
}

// The integer GEMM: a row's result does not depend on the thread count, the panel height or
// how the rows of x are grouped (up to kQGemm16Rows per kernel call): the same bits for the
// first rows of a 33-row call and a 9-row call, at every level where it runs.
TEST(QGemm, Int16SameBitsForAnyThreadsPanelsAndRowGrouping) {
  int checked = 0;
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
    const Case c = make_case(t, len_for(t, 576), 131, 33, 77);
    for (const auto& level : tq::simd::available_levels()) {
      tq::simd::ScopedLevel sl(level);
      if (!tq::llm::qgemm_int16(t)) continue;
      std::vector<float> base(static_cast<size_t>(33) * c.out);
      tq::llm::qgemm(t, c.w.data(), c.in, c.out, c.x.data(), 33, base.data(), c.out, 1, 0);
      for (int threads : {1, 2})
        for (int panel : {0, 16, 40}) {
          std::vector<float> y(base.size());
          tq::llm::qgemm(t, c.w.data(), c.in, c.out, c.x.data(), 33, y.data(), c.out, threads, panel);
          ASSERT_EQ(0, std::memcmp(y.data(), base.data(), y.size() * sizeof(float)))
              << tq::ggml_type_name(t) << " " << level << " t=" << threads << " panel " << panel;
          std::vector<float> y9(static_cast<size_t>(9) * c.out);
          tq::llm::qgemm(t, c.w.data(), c.in, c.out, c.x.data(), 9, y9.data(), c.out, threads, panel);
          ASSERT_EQ(0, std::memcmp(y9.data(), base.data(), y9.size() * sizeof(float)))
              << tq::ggml_type_name(t) << " " << level << " 9 rows";
          ++checked;
        }
    }
  }
  if (tq::llm::detail::qmv16_avx512_host_ok()) EXPECT_GT(checked, 0);
}

TEST(QGemm, RejectsBadInput) {
  std::vector<uint8_t> w(4096);
  std::vector<float> x(1024), y(1024);
  EXPECT_THROW(tq::llm::qgemm(GgmlType::Q4_1, w.data(), 48, 2, x.data(), 9, y.data(), 2, 1), tq::Error);
  EXPECT_THROW(tq::llm::qgemm(GgmlType::Q8_0, w.data(), 0, 2, x.data(), 9, y.data(), 2, 1), tq::Error);
  EXPECT_THROW(tq::llm::qgemm(GgmlType::F32, w.data(), 32, 4, x.data(), 9, y.data(), 3, 1), tq::Error);  // ldy
  EXPECT_THROW(tq::llm::qgemm(GgmlType::F16, nullptr, 32, 2, x.data(), 9, y.data(), 2, 1), tq::Error);
  EXPECT_NO_THROW(tq::llm::qgemm(GgmlType::Q4_1, nullptr, 32, 0, nullptr, 9, nullptr, 0, 1));
}

// Prefill (more than 8 rows per projection: llm::qgemm on the blocks) against the f32-copy
// path at every SIMD level, and what each holds in memory: the default keeps only the GGUF blocks (plus the f32
// norms), set_f32_decode(true) adds one f32 value per weight and false drops it again.
TEST(QGemm, ModelPrefillFromBlocksMatchesF32Copy) {
  for (GgmlType wt : {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F16}) {
   for (const auto& level : tq::simd::available_levels()) {
    tq::simd::ScopedLevel sl(level);
    tq_test::TinyLlama c;
    const auto bytes = tq_test::tiny_llama_gguf(c, wt, 23).bytes();
    auto g = tq::GgufFile::from_bytes(bytes.data(), bytes.size());
    tq::LlamaModel m = tq::LlamaModel::load(g);
    m.set_threads(2);
    const size_t norms = static_cast<size_t>(2 * c.n_layers + 1) * c.n_embd * sizeof(float);
    const size_t params = static_cast<size_t>(c.n_vocab) * c.n_embd +
                          static_cast<size_t>(c.n_layers) *
                              (2 * c.n_embd * c.n_embd + 2 * c.n_embd * (c.n_embd / c.n_heads * c.n_kv_heads) +
                               3 * c.n_embd * c.n_ff);
    EXPECT_EQ(m.weight_bytes(), m.block_weight_bytes() + norms) << tq::ggml_type_name(wt);
    m.set_f32_decode(true);
    EXPECT_EQ(m.weight_bytes(), m.block_weight_bytes() + norms + params * sizeof(float)) << tq::ggml_type_name(wt);
    m.set_f32_decode(false);
    EXPECT_EQ(m.weight_bytes(), m.block_weight_bytes() + norms);
    std::vector<int32_t> toks(40);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>((i * 7 + 3) % c.n_vocab);
    auto kc = m.kv_config(64);
    kc.type_k = kc.type_v = tq::KvFormat::f32;
    tq::KvCache cb(kc), cf(kc);
    std::vector<float> hb(toks.size() * c.n_embd), hf(hb.size()), lb(toks.size() * c.n_vocab), lf(lb.size());
    m.forward(cb, toks.data(), static_cast<int>(toks.size()), hb.data());
    m.logits(hb.data(), static_cast<int>(toks.size()), lb.data());
    m.set_f32_decode(true);
    m.forward(cf, toks.data(), static_cast<int>(toks.size()), hf.data());
    m.logits(hf.data(), static_cast<int>(toks.size()), lf.data());
    m.set_f32_decode(false);
    double err = 0, scale = 0;
    for (size_t i = 0; i < lb.size(); ++i) {
      err = std::max(err, static_cast<double>(std::fabs(lb[i] - lf[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(lf[i])));
    }
    EXPECT_GT(scale, 0.0);
    // The integer GEMM rounds x to 16 bits: the tolerance of the int16 decode path
    // (ModelDecodeMatchesF32Path: kInt16Tol = 1e-3); the float path: 2e-5.
    EXPECT_LT(err / scale, tq::llm::qgemm_int16(wt) ? 1e-3 : 2e-5) << tq::ggml_type_name(wt) << " " << level;
   }
  }
}

// F32 weights: no second copy (the kernels read the f32 weights themselves).
TEST(QMatvec, ModelF32WeightsKeepOneCopy) {
  tq_test::TinyLlama c;
  const auto bytes = tq_test::tiny_llama_gguf(c, GgmlType::F32, 3).bytes();
  auto g = tq::GgufFile::from_bytes(bytes.data(), bytes.size());
  tq::LlamaModel m = tq::LlamaModel::load(g);
  EXPECT_EQ(m.block_weight_bytes(), 0u);
}

// tq::dequantize_row's SIMD kernels (prefill's GEMM panels) give the scalar reference's bits at
// every level: Q4_0 / Q4_1 / Q8_0 rows quantized from random weights (codes at both ends of
// their range, negative and tiny scales), F16 rows of any length.
TEST(QGemm, DequantizeRowSameBitsAtEveryLevel) {
  tq::Rng rng(77);
  int checked = 0;
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F16}) {
    for (int n : {32, 576, 1536, 100}) {
      if (n % 32 && t != GgmlType::F16) continue;
      std::vector<float> w(n);
      for (int i = 0; i < n; ++i) w[i] = (float)(rng.normal() * (i % 64 < 32 ? 1e-3 : 3.0)) - (i % 7 == 0 ? 5.f : 0.f);
      std::vector<uint8_t> row(tq::ggml_row_bytes(t, (size_t)n));
      tq::quantize_row(t, w.data(), row.data(), (size_t)n);
      std::vector<float> ref(n), y(n);
      {
        tq::simd::ScopedLevel sl("scalar");
        tq::dequantize_row(t, row.data(), ref.data(), (size_t)n);
      }
      for (const auto& level : tq::simd::available_levels()) {
        tq::simd::ScopedLevel sl(level);
        std::fill(y.begin(), y.end(), -1.f);
        tq::dequantize_row(t, row.data(), y.data(), (size_t)n);
        ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), sizeof(float) * n))
            << tq::ggml_type_name(t) << " n=" << n << " at " << level;
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 13);
}

TEST(Activation, GeluTanhMulMatchesDoubleAtEveryLevel) {
  // z over [-12, 12] in steps of 1/64, then far values and zeros; odd length (a SIMD tail).
  std::vector<float> z, u;
  tq::Rng r(23);
  for (int i = -768; i <= 768; ++i) z.push_back(i / 64.0f);
  for (float f : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-3f, -1e-3f, 30.0f, -30.0f, 1e4f, -1e4f, 1e13f, -1e13f}) z.push_back(f);
  for (size_t i = 0; i < z.size(); ++i) u.push_back(static_cast<float>(r.normal()));
  ASSERT_EQ(z.size() % 2, 1u);
  auto exact = [](double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x))); };
  auto levels = tq::simd::available_levels();
  for (const auto& level : levels) {
    tq::simd::ScopedLevel sl(level);
    for (size_t n : {z.size(), size_t{1}, size_t{7}, size_t{17}}) {
      std::vector<float> g(z.begin(), z.begin() + n);
      tq::llm::gelu_tanh_mul(g.data(), u.data(), n);
      for (size_t i = 0; i < n; ++i) {
        const double want = exact(z[i]) * u[i];
        EXPECT_LE(std::fabs(g[i] - want), 1e-6 * std::fabs(static_cast<double>(z[i]) * u[i]))
            << level << " z=" << z[i] << " got " << g[i] << " want " << want;
      }
    }
  }
  // The reference formula gives the same within the same bound.
  std::vector<float> g = z;
  tq::llm::gelu_tanh_mul_ref(g.data(), u.data(), g.size());
  for (size_t i = 0; i < g.size(); ++i)
    EXPECT_LE(std::fabs(g[i] - exact(z[i]) * u[i]), 1e-6 * std::fabs(static_cast<double>(z[i]) * u[i])) << z[i];
}
