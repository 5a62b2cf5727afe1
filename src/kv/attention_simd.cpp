// Fused decode-attention kernels, Highway-dispatched (every x86 level; scalar: the generic path).
//
//   DecodeF16   f16 K (dim-major blocks) and f16 V (rows): per 32-token block, scores of up to 8
//               query rows (the G heads of one kv head, of one or several queries) as FMAs of
//               broadcast query values with K columns (no horizontal sums), block softmax with a
//               vector exp, V rows accumulated for the rows with each row converted once. Float
//               arithmetic: equals the reference up to summation order (test tolerance 1e-5
//               relative); a query's result is the same bit for bit alone or with others.
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

// One 32-token block (nt tokens) for R query rows: rows r = 0 .. R - 1 of qd (D floats apart)
// and of st. Each row's sums run in the same order whatever R is, so a row's result does not
// depend on the rows beside it.
template <int R>
void F16Rows(const Shape& sh, const hwy::float16_t* kb, const hwy::float16_t* vb, int nt, const float* qd,
             const States& st) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  constexpr size_t N = hn::MaxLanes(decltype(df)());
  constexpr size_t NV = kBlock / N;  // score vectors per row per block (compile time: registers)
  static_assert(kBlock % N == 0, "block is a whole number of vectors");
  const int D = sh.D;
  HWY_ALIGN float pbuf[R][kBlock];
  float alpha[R];
  using V = hn::Vec<decltype(df)>;
  // Scores: acc[r][j] lanes = tokens j*N .. j*N+N-1.
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (size_t j = 0; j < NV; ++j) acc[r][j] = hn::Zero(df);
  for (int d = 0; d < D; ++d) {
    V col[NV];
    for (size_t j = 0; j < NV; ++j) col[j] = hn::PromoteTo(df, hn::LoadU(dh, kb + (size_t)d * kBlock + j * N));
    for (int r = 0; r < R; ++r) {
      const V qr = hn::Set(df, qd[(size_t)r * D + d]);
      for (size_t j = 0; j < NV; ++j) acc[r][j] = hn::MulAdd(qr, col[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r) alpha[r] = BlockSoftmax(df, acc[r], NV, nt, sh.scale, st, r, pbuf[r]);
  // V: out[r] = out[r] * alpha[r] + sum_t p[r][t] V[t].
  for (int dv = 0; dv < D; dv += (int)N) {
    V o[R];
    for (int r = 0; r < R; ++r) o[r] = hn::Mul(hn::LoadU(df, st.acc(r) + dv), hn::Set(df, alpha[r]));
    for (int t = 0; t < nt; ++t) {
      const V v = hn::PromoteTo(df, hn::LoadU(dh, vb + (size_t)t * D + dv));
      for (int r = 0; r < R; ++r) o[r] = hn::MulAdd(hn::Set(df, pbuf[r][t]), v, o[r]);
    }
    for (int r = 0; r < R; ++r) hn::StoreU(o[r], df, st.acc(r) + dv);
  }
}

// Rows per F16Rows call: R NV score vectors stay in registers (AVX-512: 8 rows, AVX2: 4).
constexpr int kF16Rows = std::max<int>(1, 16 / (kBlock / hn::MaxLanes(hn::ScalableTag<float>())));

void F16RowsN(int n, const Shape& sh, const hwy::float16_t* kb, const hwy::float16_t* vb, int nt, const float* qd,
              const States& st) {
  switch (n) {
    case 1: return F16Rows<1>(sh, kb, vb, nt, qd, st);
    case 2: return F16Rows<2>(sh, kb, vb, nt, qd, st);
    case 3: return F16Rows<3>(sh, kb, vb, nt, qd, st);
    case 4: return F16Rows<4>(sh, kb, vb, nt, qd, st);
    case 5: return F16Rows<5>(sh, kb, vb, nt, qd, st);
    case 6: return F16Rows<6>(sh, kb, vb, nt, qd, st);
    case 7: return F16Rows<7>(sh, kb, vb, nt, qd, st);
    default: return F16Rows<8>(sh, kb, vb, nt, qd, st);
  }
}

// nq queries of G rows each over the blocks of [a, b): block by block, the rows of the queries
// that see the same number of the block's tokens (all of them, except near a query's causal
// limit) in calls of up to kF16Rows rows, so each block's K and V are read from memory once per
// call of the kernel rather than once per query and its f16 -> float conversions are shared by
// the rows of a call.
bool DecodeF16(const Shape& sh, const Stream& sk, const Stream& sv, int nq, const float* qd, const int* limits,
               int a, int b, const States& st) {
  const hn::ScalableTag<float> df;
  if (hn::Lanes(df) != hn::MaxLanes(df) || kBlock / hn::Lanes(df) > 8 || sh.D % hn::Lanes(df) != 0) return false;
  const int G = sh.G, D = sh.D;
  const int end = std::min(b, *std::max_element(limits, limits + nq));
  for (int t0 = a; t0 < end; t0 += kBlock) {
    const hwy::float16_t* kb = reinterpret_cast<const hwy::float16_t*>(sk.block(t0 / kBlock));
    const hwy::float16_t* vb = reinterpret_cast<const hwy::float16_t*>(sv.block(t0 / kBlock));
    auto seen = [&](int i) { return std::min(kBlock, std::min(b, limits[i]) - t0); };
    for (int i0 = 0, i1; i0 < nq; i0 = i1) {
      const int nt = seen(i0);
      for (i1 = i0 + 1; i1 < nq && seen(i1) == nt; ++i1) {
      }
      if (nt <= 0) continue;
      for (int r0 = i0 * G, r1 = i1 * G, n; r0 < r1; r0 += n) {
        n = std::min(kF16Rows, r1 - r0);
        F16RowsN(n, sh, kb, vb, nt, qd + (size_t)r0 * D, States{st.base + (size_t)r0 * st.stride(), D});
      }
    }
  }
  return true;
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

bool decode_f16(const Shape& sh, const Stream& sk, const Stream& sv, int nq, const float* qd, const int* limits,
                int a, int b, const States& st) {
  return HWY_DYNAMIC_DISPATCH(DecodeF16)(sh, sk, sv, nq, qd, limits, a, b, st);
}

}  // namespace tq::kv
#endif
