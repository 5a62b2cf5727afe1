// Fused decode-attention kernels, Highway-dispatched (every x86 level; scalar: the generic path).
//
//   DecodeF16   f16 K (dim-major blocks) and f16 V (rows): per 32-token block, scores of the G
//               query heads of one kv head as FMAs of broadcast query values with K columns (no
//               horizontal sums), block softmax with a vector exp, V rows accumulated for the G
//               heads with each row converted once. Float arithmetic: equals the reference up
//               to summation order (test tolerance 1e-5 relative).
//   tq kernels  attention_tq_simd.cpp (float centroids), attention_vnni.cpp (int8 tables).
// Which of them runs is pick_kernel's choice (attention.cpp).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/attention_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kv/attention_kernels.h"
#include "tq/common.h"
#include "tq/simd.h"

HWY_BEFORE_NAMESPACE();
namespace tq::kv {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
#include "kv/block_softmax-inl.h"

template <int G>
void DecodeF16G(const Shape& sh, const Stream& sk, const Stream& sv, const float* qd, int limit, int a,
                int b, const States& st) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  constexpr size_t N = hn::MaxLanes(decltype(df)());
  constexpr size_t NV = kBlock / N;  // score vectors per head per block (compile time: registers)
  constexpr size_t kMaxNV = NV;
  static_assert(kBlock % N == 0, "block is a whole number of vectors");
  const int D = sh.D;
  const int end = std::min(b, limit);
  HWY_ALIGN float pbuf[G][kBlock];
  float alpha[G];
  using V = hn::Vec<decltype(df)>;
  for (int t0 = a; t0 < end; t0 += kBlock) {
    const int nt = std::min(kBlock, end - t0);
    const hwy::float16_t* kb = reinterpret_cast<const hwy::float16_t*>(sk.block(t0 / kBlock));
    const hwy::float16_t* vb = reinterpret_cast<const hwy::float16_t*>(sv.block(t0 / kBlock));
    // Scores: acc[g][j] lanes = tokens j*N .. j*N+N-1.
    V acc[G][kMaxNV];
    for (int g = 0; g < G; ++g)
      for (size_t j = 0; j < NV; ++j) acc[g][j] = hn::Zero(df);
    for (int d = 0; d < D; ++d) {
      V col[kMaxNV];
      for (size_t j = 0; j < NV; ++j) col[j] = hn::PromoteTo(df, hn::LoadU(dh, kb + (size_t)d * kBlock + j * N));
      for (int g = 0; g < G; ++g) {
        const V qg = hn::Set(df, qd[(size_t)g * D + d]);
        for (size_t j = 0; j < NV; ++j) acc[g][j] = hn::MulAdd(qg, col[j], acc[g][j]);
      }
    }
    // Block softmax per head.
    for (int g = 0; g < G; ++g) alpha[g] = BlockSoftmax(df, acc[g], NV, nt, sh.scale, st, g, pbuf[g]);
    // V: out[g] = out[g] * alpha[g] + sum_t p[g][t] V[t].
    for (int dv = 0; dv < D; dv += (int)N) {
      V o[G];
      for (int g = 0; g < G; ++g) o[g] = hn::Mul(hn::LoadU(df, st.acc(g) + dv), hn::Set(df, alpha[g]));
      for (int t = 0; t < nt; ++t) {
        const V v = hn::PromoteTo(df, hn::LoadU(dh, vb + (size_t)t * D + dv));
        for (int g = 0; g < G; ++g) o[g] = hn::MulAdd(hn::Set(df, pbuf[g][t]), v, o[g]);
      }
      for (int g = 0; g < G; ++g) hn::StoreU(o[g], df, st.acc(g) + dv);
    }
  }
}

bool DecodeF16(const Shape& sh, const Stream& sk, const Stream& sv, const float* qd, int limit, int a, int b,
               const States& st) {
  const hn::ScalableTag<float> df;
  if (hn::Lanes(df) != hn::MaxLanes(df) || kBlock / hn::Lanes(df) > 8 || sh.D % hn::Lanes(df) != 0) return false;
  switch (sh.G) {
    case 1: DecodeF16G<1>(sh, sk, sv, qd, limit, a, b, st); return true;
    case 2: DecodeF16G<2>(sh, sk, sv, qd, limit, a, b, st); return true;
    case 3: DecodeF16G<3>(sh, sk, sv, qd, limit, a, b, st); return true;
    case 4: DecodeF16G<4>(sh, sk, sv, qd, limit, a, b, st); return true;
    case 8: DecodeF16G<8>(sh, sk, sv, qd, limit, a, b, st); return true;
    default: return false;
  }
}

// One block of decoded rows (kR, vR: nt x D floats, row-major) for G heads of one query:
// scores as per-token dot products (one horizontal sum per head and token), block softmax,
// V accumulation. Used for the row formats (f32, q8_0, q4_0 and rotated), tq at the
// scalar level or without a kernel instance for the GQA ratio, the f16 window and the sinks.
template <int G>
void AttendRowsG(int D, float scale, const float* qd, const float* kR, const float* vR, int nt,
                 const States& st) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  using V = hn::Vec<decltype(df)>;
  HWY_ALIGN float sbuf[G][kBlock];
  float alpha[G];
  for (int t = 0; t < nt; ++t) {
    V acc[G];
    for (int g = 0; g < G; ++g) acc[g] = hn::Zero(df);
    for (int d = 0; d < D; d += (int)N) {
      const V k = hn::LoadU(df, kR + (size_t)t * D + d);
      for (int g = 0; g < G; ++g) acc[g] = hn::MulAdd(hn::LoadU(df, qd + (size_t)g * D + d), k, acc[g]);
    }
    for (int g = 0; g < G; ++g) sbuf[g][t] = hn::GetLane(hn::SumOfLanes(df, acc[g])) * scale;
  }
  for (int g = 0; g < G; ++g) {
    float mb = -std::numeric_limits<float>::infinity();
    for (int t = 0; t < nt; ++t) mb = std::max(mb, sbuf[g][t]);
    float& m = st.m(g);
    const float m_new = std::max(m, mb);
    alpha[g] = m == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(m - m_new);
    m = m_new;
    const V vm = hn::Set(df, m_new);
    V sum = hn::Zero(df);
    for (int t = 0; t < kBlock; t += (int)N) {
      const auto valid = hn::FirstN(df, (size_t)std::max(0, nt - t));
      const V p = hn::IfThenElseZero(valid, hn::Exp(df, hn::Sub(hn::IfThenElseZero(valid, hn::Load(df, sbuf[g] + t)), vm)));
      sum = hn::Add(sum, p);
      hn::Store(p, df, sbuf[g] + t);
    }
    st.l(g) = st.l(g) * alpha[g] + hn::GetLane(hn::SumOfLanes(df, sum));
  }
  for (int dv = 0; dv < D; dv += (int)N) {
    V o[G];
    for (int g = 0; g < G; ++g) o[g] = hn::Mul(hn::LoadU(df, st.acc(g) + dv), hn::Set(df, alpha[g]));
    for (int t = 0; t < nt; ++t) {
      const V v = hn::LoadU(df, vR + (size_t)t * D + dv);
      for (int g = 0; g < G; ++g) o[g] = hn::MulAdd(hn::Set(df, sbuf[g][t]), v, o[g]);
    }
    for (int g = 0; g < G; ++g) hn::StoreU(o[g], df, st.acc(g) + dv);
  }
}

void AttendRows(int D, int G, float scale, const float* qd, const float* kR, const float* vR, int nt,
                const States& st) {
  int g0 = 0;
  while (g0 < G) {
    const States s{st.base + g0 * st.stride(), st.D};
    const float* q = qd + (size_t)g0 * D;
    const int left = G - g0;
    if (left >= 4) { AttendRowsG<4>(D, scale, q, kR, vR, nt, s); g0 += 4; }
    else if (left == 3) { AttendRowsG<3>(D, scale, q, kR, vR, nt, s); g0 += 3; }
    else if (left == 2) { AttendRowsG<2>(D, scale, q, kR, vR, nt, s); g0 += 2; }
    else { AttendRowsG<1>(D, scale, q, kR, vR, nt, s); g0 += 1; }
  }
}

// q8_0 / q4_0 rows -> floats.
void DecodeQ8Rows(int D, int n, const uint8_t* rows, float* out) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<int32_t, decltype(df)> di;
  const hn::Rebind<int8_t, decltype(df)> d8;
  const size_t N = hn::Lanes(df);
  const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(rows);
  for (int r = 0; r < n * D / 32; ++r, ++b) {
    const auto d = hn::Set(df, fp16_to_fp32(b->d));
    for (size_t j = 0; j < 32; j += N)
      hn::StoreU(hn::Mul(d, hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, b->qs + j)))), df, out + (size_t)r * 32 + j);
  }
}
void DecodeQ4Rows(int D, int n, const uint8_t* rows, float* out) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<int32_t, decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> du8;
  const size_t N = hn::Lanes(df);
  const BlockQ4_0* b = reinterpret_cast<const BlockQ4_0*>(rows);
  const auto m15 = hn::Set(di, 15), eight = hn::Set(di, 8);
  for (int r = 0; r < n * D / 32; ++r, ++b) {
    const auto d = hn::Set(df, fp16_to_fp32(b->d));
    for (size_t j = 0; j < 16; j += N) {
      const auto x = hn::PromoteTo(di, hn::LoadU(du8, b->qs + j));
      const auto lo = hn::Sub(hn::And(x, m15), eight), hi = hn::Sub(hn::ShiftRight<4>(x), eight);
      hn::StoreU(hn::Mul(d, hn::ConvertTo(df, lo)), df, out + (size_t)r * 32 + j);
      hn::StoreU(hn::Mul(d, hn::ConvertTo(df, hi)), df, out + (size_t)r * 32 + 16 + j);
    }
  }
}

void F32ToF16(int n, const float* x, uint16_t* h) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const int N = (int)hn::Lanes(df);
  int i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, x + i)), dh, reinterpret_cast<hwy::float16_t*>(h + i));
  for (; i < n; ++i) h[i] = fp32_to_fp16(x[i]);
}
void F16ToF32(int n, const uint16_t* h, float* x) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const int N = (int)hn::Lanes(df);
  int i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(h + i))), df, x + i);
  for (; i < n; ++i) x[i] = fp16_to_fp32(h[i]);
}

}  // namespace HWY_NAMESPACE
}  // namespace tq::kv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tq::kv {
HWY_EXPORT(DecodeF16);
HWY_EXPORT(AttendRows);
HWY_EXPORT(DecodeQ8Rows);
HWY_EXPORT(DecodeQ4Rows);
HWY_EXPORT(F32ToF16);
HWY_EXPORT(F16ToF32);

void f32_to_f16(int n, const float* x, uint16_t* h) {
  if (simd::use_scalar()) return fp32_to_fp16_n((size_t)n, x, h);
  HWY_DYNAMIC_DISPATCH(F32ToF16)(n, x, h);
}
void f16_to_f32(int n, const uint16_t* h, float* x) {
  if (simd::use_scalar()) return fp16_to_fp32_n((size_t)n, h, x);
  HWY_DYNAMIC_DISPATCH(F16ToF32)(n, h, x);
}

void attend_rows(int D, int G, float scale, const float* qd, const float* kR, const float* vR, int nt,
                 const States& st) {
  HWY_DYNAMIC_DISPATCH(AttendRows)(D, G, scale, qd, kR, vR, nt, st);
}
void decode_q8_rows(int D, int n, const uint8_t* rows, float* out) {
  HWY_DYNAMIC_DISPATCH(DecodeQ8Rows)(D, n, rows, out);
}
void decode_q4_rows(int D, int n, const uint8_t* rows, float* out) {
  HWY_DYNAMIC_DISPATCH(DecodeQ4Rows)(D, n, rows, out);
}

bool decode_f16(const Shape& sh, const Stream& sk, const Stream& sv, const float* qd, int limit, int a, int b,
                const States& st) {
  return HWY_DYNAMIC_DISPATCH(DecodeF16)(sh, sk, sv, qd, limit, a, b, st);
}

}  // namespace tq::kv
#endif
