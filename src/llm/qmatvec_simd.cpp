// Highway kernels of qmatvec (see qmatvec.h): one output row at a time, up to 8 rows of x
// (AVX-512; 4 elsewhere) per pass over the weight row.
//
// Float activations (Q5_1, Q5_K, F16, BF16, F32): per 32-value block or sub-block the codes
// (Q5: plus the fifth bit from qh) are widened to int32 lanes and converted to float,
// multiplied into a per-block partial vector (lane-wise FMAs, no horizontal sum), then scaled
// by the block's d (K-quants: d * sub-block scale) into the row accumulator; the offset term
// m * sum(x of the block) is a scalar FMA on the precomputed block sums. One horizontal sum
// per output row. Same grouping as the scalar reference (qmv_rows_ref).
//
// Integer activations (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K; Rows16*): int16 products of the
// signed weight codes with the 16-bit activation codes (see the section below); sse4 and avx2
// use these, avx3 / avx3_dl the kernels of qmatvec_avx512.cpp.
//
// Both kinds prefetch the weight stream detail::kWeightPrefetch bytes ahead, as the AVX-512
// kernels do (at the avx2 level Gemma 3 270M's decode matvecs took 1.8x the time without it).
//
// Also the kernels of tq::dequantize_row (DequantRow, at the end), which give the
// reference's bits.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "llm/qmatvec_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>

#include "llm/qmatvec.h"

HWY_BEFORE_NAMESPACE();
namespace tq::llm {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// A block header's fp16 scale as a float: F16C's conversion on the x86 targets that have it
// (AVX2 and up), tq::fp16_to_fp32's bit arithmetic otherwise; the same value for every finite
// or infinite scale.
HWY_INLINE float Scale1(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
  return _cvtsh_ss(h);
#else
  return tq::fp16_to_fp32(h);
#endif
}

// The weight stream, detail::kWeightPrefetch bytes ahead of the `bytes` from p (a line per 64
// bytes; a block shorter than a line asks again for the line it shares with the next).
HWY_INLINE void PrefetchAhead(const uint8_t* p, size_t bytes = 1) {
  for (size_t i = 0; i < bytes; i += 64) hwy::Prefetch(p + i + detail::kWeightPrefetch);
}

// The block header's fp16 scale(s) as floats (one or two lanes converted at once).
HWY_INLINE void Scales2(const uint8_t* p, float& d, float& m) {
  const hn::CappedTag<float, 2> d2;
  const hn::Rebind<hwy::float16_t, decltype(d2)> dh2;
  if (hn::Lanes(d2) < 2) {  // Highway's single-lane fallback targets
    uint16_t h[2];
    std::memcpy(h, p, 4);
    d = tq::fp16_to_fp32(h[0]);
    m = tq::fp16_to_fp32(h[1]);
    return;
  }
  HWY_ALIGN float f[2] = {0.0f, 0.0f};
  hn::StoreU(hn::PromoteTo(d2, hn::LoadU(dh2, reinterpret_cast<const hwy::float16_t*>(p))), d2, f);
  d = f[0];
  m = f[1];
}

// F16 / F32 rows: 32-value chunks summed on their own, then added (as the reference); a
// chunk shorter than 32 at the end (in % 32 != 0) is done in scalar code.
// kKind: 0 F32, 1 F16, 2 BF16 (the 16 bits shifted into the top of a float).
template <int NR, int kKind>
void RowsFloat(const uint8_t* w, int in, const float* x, int o0, int o1, float* y, int ldy) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const hn::Rebind<uint16_t, DF> du16;
  const hn::Rebind<uint32_t, DF> du32;
  const size_t N = hn::Lanes(df);
  constexpr bool kF16 = kKind == 1;
  const size_t es = kKind == 0 ? 4 : 2;
  const int full = in / 32 * 32;
  for (int o = o0; o < o1; ++o) {
    const uint8_t* row = w + static_cast<size_t>(o) * in * es;
    VF acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = hn::Zero(df);
    for (int i0 = 0; i0 < full; i0 += 32) {
      PrefetchAhead(row + static_cast<size_t>(i0) * es, 32 * es);
      VF part[NR];
      for (int r = 0; r < NR; ++r) part[r] = hn::Zero(df);
      for (size_t j = 0; j < 32; j += N) {
        VF wv;
        if constexpr (kF16) {
          wv = hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(row) + i0 + j));
        } else if constexpr (kKind == 2) {
          wv = hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(
                                   du32, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(row) + i0 + j))));
        } else {
          wv = hn::LoadU(df, reinterpret_cast<const float*>(row) + i0 + j);
        }
        for (int r = 0; r < NR; ++r) part[r] = hn::MulAdd(wv, hn::LoadU(df, x + static_cast<size_t>(r) * in + i0 + j), part[r]);
      }
      for (int r = 0; r < NR; ++r) acc[r] = hn::Add(acc[r], part[r]);
    }
    for (int r = 0; r < NR; ++r) {
      float s = hn::GetLane(hn::SumOfLanes(df, acc[r]));
      if (full < in) {
        const float* xr = x + static_cast<size_t>(r) * in;
        float t = 0;
        for (int i = full; i < in; ++i) {
          float wv;
          if constexpr (kF16) {
            uint16_t h;
            std::memcpy(&h, row + 2 * static_cast<size_t>(i), 2);
            wv = tq::fp16_to_fp32(h);
          } else if constexpr (kKind == 2) {
            uint16_t h;
            std::memcpy(&h, row + 2 * static_cast<size_t>(i), 2);
            const uint32_t u = static_cast<uint32_t>(h) << 16;
            std::memcpy(&wv, &u, 4);
          } else {
            std::memcpy(&wv, row + 4 * static_cast<size_t>(i), 4);
          }
          t += wv * xr[i];
        }
        s += t;
      }
      y[static_cast<size_t>(r) * ldy + o] = s;
    }
  }
}

// Q5_0 / Q5_1: the Q4 scheme with a fifth bit per value from the block's u32 qh (bit j of it
// for value j), shifted into place lane by lane; m = -16 d for Q5_0.
template <int NR, bool kQ51>
void RowsQ5(const uint8_t* w, int in, const float* x, const float* xs, int o0, int o1, float* y, int ldy) {
  const DF df;
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<uint32_t, DF> du;
  const hn::Rebind<uint8_t, DF> du8;
  const size_t N = hn::Lanes(df);
  const int nb = in / 32;
  constexpr size_t kBB = kQ51 ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0);
  const size_t rb = kBB * static_cast<size_t>(nb);
  const auto m15 = hn::Set(di, 15);
  const auto one = hn::Set(du, 1u);
  for (int o = o0; o < o1; ++o) {
    const uint8_t* blk = w + static_cast<size_t>(o) * rb;
    VF acc[NR];
    float macc[NR];
    for (int r = 0; r < NR; ++r) {
      acc[r] = hn::Zero(df);
      macc[r] = 0.0f;
    }
    for (int b = 0; b < nb; ++b, blk += kBB) {
      PrefetchAhead(blk);
      float d, m;
      Scales2(blk, d, m);  // Q5_0: m is the first qh bytes, replaced below
      if (!kQ51) m = -16.0f * d;
      uint32_t qh32;
      std::memcpy(&qh32, blk + (kQ51 ? 4 : 2), 4);
      const auto vqh = hn::Set(du, qh32);
      const uint8_t* qs = blk + (kQ51 ? 8 : 6);
      const float* xb = x + static_cast<size_t>(b) * 32;
      VF part[NR];
      for (int r = 0; r < NR; ++r) part[r] = hn::Zero(df);
      for (size_t j = 0; j < 16; j += N) {
        const auto q = hn::PromoteTo(di, hn::LoadU(du8, qs + j));
        const auto hl = hn::BitCast(di, hn::ShiftLeft<4>(hn::And(hn::Shr(vqh, hn::Iota(du, static_cast<uint32_t>(j))), one)));
        const auto hh =
            hn::BitCast(di, hn::ShiftLeft<4>(hn::And(hn::Shr(vqh, hn::Iota(du, static_cast<uint32_t>(j + 16))), one)));
        const VF lo = hn::ConvertTo(df, hn::Or(hn::And(q, m15), hl));
        const VF hi = hn::ConvertTo(df, hn::Or(hn::ShiftRight<4>(q), hh));
        for (int r = 0; r < NR; ++r) {
          const float* xr = xb + static_cast<size_t>(r) * in;
          part[r] = hn::MulAdd(lo, hn::LoadU(df, xr + j), part[r]);
          part[r] = hn::MulAdd(hi, hn::LoadU(df, xr + 16 + j), part[r]);
        }
      }
      const VF vd = hn::Set(df, d);
      for (int r = 0; r < NR; ++r) {
        acc[r] = hn::MulAdd(vd, part[r], acc[r]);
        macc[r] += m * xs[static_cast<size_t>(r) * nb + b];
      }
    }
    for (int r = 0; r < NR; ++r)
      y[static_cast<size_t>(r) * ldy + o] = hn::GetLane(hn::SumOfLanes(df, acc[r])) + macc[r];
  }
}

// Q4_K / Q5_K: per super-block, the four 32-byte code chunks each hold two sub-blocks (low and
// high nibbles; Q5_K: bits 2c and 2c + 1 of qh[l] on top); per sub-block the partial vector is
// scaled by d sc into the accumulator and the min term -dmin mn * sum(x) is a scalar FMA.
template <int NR, bool kQ5>
void RowsKQ(const uint8_t* w, int in, const float* x, const float* xs, int o0, int o1, float* y, int ldy) {
  const DF df;
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<uint8_t, DF> du8;
  const size_t N = hn::Lanes(df);
  const int nsb = in / kQK, nb = in / 32;
  constexpr size_t kBB = kQ5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  const size_t rb = kBB * static_cast<size_t>(nsb);
  const auto m15 = hn::Set(di, 15), one = hn::Set(di, 1);
  for (int o = o0; o < o1; ++o) {
    const uint8_t* blk = w + static_cast<size_t>(o) * rb;
    VF acc[NR];
    float macc[NR];
    for (int r = 0; r < NR; ++r) {
      acc[r] = hn::Zero(df);
      macc[r] = 0.0f;
    }
    for (int b = 0; b < nsb; ++b, blk += kBB) {
      PrefetchAhead(blk, kBB);
      float d, dmin;
      Scales2(blk, d, dmin);
      const uint8_t* qh = blk + 16;
      const uint8_t* qs = blk + (kQ5 ? 48 : 16);
      for (int c = 0; c < 4; ++c) {
        VF plo[NR], phi[NR];
        for (int r = 0; r < NR; ++r) plo[r] = phi[r] = hn::Zero(df);
        const float* xb = x + static_cast<size_t>(b) * kQK + 64 * c;
        for (size_t l = 0; l < 32; l += N) {
          const auto q = hn::PromoteTo(di, hn::LoadU(du8, qs + 32 * c + l));
          auto lo = hn::And(q, m15), hi = hn::ShiftRight<4>(q);
          if constexpr (kQ5) {
            const auto h = hn::PromoteTo(di, hn::LoadU(du8, qh + l));
            lo = hn::Or(lo, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, 2 * c), one)));
            hi = hn::Or(hi, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, 2 * c + 1), one)));
          }
          const VF flo = hn::ConvertTo(df, lo), fhi = hn::ConvertTo(df, hi);
          for (int r = 0; r < NR; ++r) {
            const float* xr = xb + static_cast<size_t>(r) * in;
            plo[r] = hn::MulAdd(flo, hn::LoadU(df, xr + l), plo[r]);
            phi[r] = hn::MulAdd(fhi, hn::LoadU(df, xr + 32 + l), phi[r]);
          }
        }
        int sc0, mn0, sc1, mn1;
        kquant_scale_min(blk + 4, 2 * c, sc0, mn0);
        kquant_scale_min(blk + 4, 2 * c + 1, sc1, mn1);
        const VF vd0 = hn::Set(df, d * static_cast<float>(sc0)), vd1 = hn::Set(df, d * static_cast<float>(sc1));
        const float m0 = dmin * static_cast<float>(mn0), m1 = dmin * static_cast<float>(mn1);
        for (int r = 0; r < NR; ++r) {
          const float* xsr = xs + static_cast<size_t>(r) * nb + b * 8 + 2 * c;
          acc[r] = hn::MulAdd(vd0, plo[r], acc[r]);
          macc[r] -= m0 * xsr[0];
          acc[r] = hn::MulAdd(vd1, phi[r], acc[r]);
          macc[r] -= m1 * xsr[1];
        }
      }
    }
    for (int r = 0; r < NR; ++r)
      y[static_cast<size_t>(r) * ldy + o] = hn::GetLane(hn::SumOfLanes(df, acc[r])) + macc[r];
  }
}

template <int NR>
void RowsNR(GgmlType t, const uint8_t* w, int in, const float* x, const float* xs, int o0, int o1, float* y,
            int ldy) {
  switch (t) {
    case GgmlType::Q5_1: return RowsQ5<NR, true>(w, in, x, xs, o0, o1, y, ldy);
    case GgmlType::Q5_K: return RowsKQ<NR, true>(w, in, x, xs, o0, o1, y, ldy);
    case GgmlType::F16: return RowsFloat<NR, 1>(w, in, x, o0, o1, y, ldy);
    case GgmlType::BF16: return RowsFloat<NR, 2>(w, in, x, o0, o1, y, ldy);
    case GgmlType::F32: return RowsFloat<NR, 0>(w, in, x, o0, o1, y, ldy);
    default: return;
  }
}

// false: this target's vectors do not divide a 16-value half block (caller uses the reference).
bool QmvRows(GgmlType t, const uint8_t* w, int in, const float* x, const float* xs, int n, int o0, int o1,
             float* y, int ldy) {
  const DF df;
  if (hn::Lanes(df) > 16 || 16 % hn::Lanes(df) != 0) return false;
#if HWY_MAX_BYTES >= 64
  constexpr int kPass = 8;  // 32 vector registers (AVX-512): the weights decoded once for 8 rows
#else
  constexpr int kPass = 4;  // 16 registers: more rows would spill the accumulators
#endif
  if (n > kPass) {  // several passes over the weights; a row's result does not depend on its pass
    const size_t nb = static_cast<size_t>(in / 32);
    return QmvRows(t, w, in, x, xs, kPass, o0, o1, y, ldy) &&
           QmvRows(t, w, in, x + static_cast<size_t>(kPass) * in, xs ? xs + kPass * nb : nullptr, n - kPass, o0,
                   o1, y + static_cast<size_t>(kPass) * ldy, ldy);
  }
  switch (n) {
    case 1: RowsNR<1>(t, w, in, x, xs, o0, o1, y, ldy); return true;
    case 2: RowsNR<2>(t, w, in, x, xs, o0, o1, y, ldy); return true;
    case 3: RowsNR<3>(t, w, in, x, xs, o0, o1, y, ldy); return true;
    case 4: RowsNR<4>(t, w, in, x, xs, o0, o1, y, ldy); return true;
#if HWY_MAX_BYTES >= 64
    case 5: RowsNR<5>(t, w, in, x, xs, o0, o1, y, ldy); return true;
    case 6: RowsNR<6>(t, w, in, x, xs, o0, o1, y, ldy); return true;
    case 7: RowsNR<7>(t, w, in, x, xs, o0, o1, y, ldy); return true;
    case 8: RowsNR<8>(t, w, in, x, xs, o0, o1, y, ldy); return true;
#endif
    default: return false;
  }
}

// Integer activations (see qmatvec.h): the weight codes of 16 values (one vector of at most
// 16 int16 lanes, or several) are widened to int16 as signed codes c, multiplied with the
// 16-bit activation codes q pairwise into int32 lanes (ReorderWidenMulAccumulate: vpmaddwd on
// x86; |c q| <= 128 * 32767: with 16 int16 lanes (avx2) a lane adds at most 4 products, below
// 2^24, exact in int32 and in float; with 8 (sse4) 8 products, exact in int32 and rounded once
// when converted), and once per unit (32-value block; 16-value group
// for Q6_K) the int32 lanes are converted to float and multiplied by d dx of the unit into the
// float accumulator. Q4_1 / Q4_K offset terms m * (dx sum q) as scalars, as the reference
// (qmv16_rows_ref) does.
using D16 = hn::CappedTag<int16_t, 16>;
using D32 = hn::RepartitionToWide<D16>;
using DF8 = hn::Rebind<float, D32>;
using V16 = hn::Vec<D16>;
using V32 = hn::Vec<D32>;
using VF8 = hn::Vec<DF8>;

// s0[r] += c . x of row r (lanes of pairwise products; s1 for targets that split even / odd).
template <int NR>
HWY_INLINE void Dot16(const V16 c, const int16_t* x, size_t in, V32* s0, V32* s1) {
  const D16 d16;
  const D32 d32;
  for (int r = 0; r < NR; ++r)
    s0[r] = hn::ReorderWidenMulAccumulate(d32, c, hn::LoadU(d16, x + static_cast<size_t>(r) * in), s0[r], s1[r]);
}

template <int NR>
HWY_INLINE void Zero32(V32* s0, V32* s1) {
  const D32 d32;
  for (int r = 0; r < NR; ++r) s0[r] = s1[r] = hn::Zero(d32);
}

// acc[r] += scale_r * float(lanes of s0[r] + s1[r]).
HWY_INLINE VF8 Scale(VF8 acc, float scale, V32 s0, V32 s1) {
  const DF8 df;
  return hn::MulAdd(hn::Set(df, scale), hn::ConvertTo(df, hn::RearrangeToOddPlusEven(s0, s1)), acc);
}

template <int NR>
HWY_INLINE void Store8(const VF8* acc, const float* macc, float* y, int ldy, int o) {
  const DF8 df;
  for (int r = 0; r < NR; ++r)
    y[static_cast<size_t>(r) * ldy + o] = hn::GetLane(hn::SumOfLanes(df, acc[r])) + (macc ? macc[r] : 0.0f);
}

// Q4_0 (codes nibble - 8) / Q4_1 (codes nibble, offset m of the block).
template <int NR, bool kQ41>
void Rows16Q4(const uint8_t* w, int in, const int16_t* xq, const float* xd, const float* xs, int o0, int o1,
             float* y, int ldy) {
  const D16 d16;
  const DF8 df;
  const hn::Rebind<uint8_t, D16> du8;
  const size_t N = hn::Lanes(d16);
  const int nb = in / 32;
  constexpr size_t kBB = kQ41 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
  const size_t rb = kBB * static_cast<size_t>(nb);
  const auto m15 = hn::Set(d16, 15), off = hn::Set(d16, kQ41 ? 0 : 8);
  for (int o = o0; o < o1; ++o) {
    const uint8_t* blk = w + static_cast<size_t>(o) * rb;
    VF8 acc[NR];
    float macc[NR];
    for (int r = 0; r < NR; ++r) {
      acc[r] = hn::Zero(df);
      macc[r] = 0.0f;
    }
    for (int b = 0; b < nb; ++b, blk += kBB) {
      PrefetchAhead(blk);
      float d, m;
      Scales2(blk, d, m);  // Q4_0: m is the first code bytes, unused
      const uint8_t* qs = blk + (kQ41 ? 4 : 2);
      const int16_t* xb = xq + static_cast<size_t>(b) * 32;
      V32 s0[NR], s1[NR];
      Zero32<NR>(s0, s1);
      for (size_t j = 0; j < 16; j += N) {
        const V16 v = hn::PromoteTo(d16, hn::LoadU(du8, qs + j));
        Dot16<NR>(hn::Sub(hn::And(v, m15), off), xb + j, in, s0, s1);
        Dot16<NR>(hn::Sub(hn::ShiftRight<4>(v), off), xb + 16 + j, in, s0, s1);
      }
      for (int r = 0; r < NR; ++r) {
        acc[r] = Scale(acc[r], d * xd[static_cast<size_t>(r) * nb + b], s0[r], s1[r]);
        if (kQ41) macc[r] += m * xs[static_cast<size_t>(r) * nb + b];
      }
    }
    Store8<NR>(acc, macc, y, ldy, o);
  }
}

// Q5_0: codes (nibble | bit j of qh << 4) - 16; the bit chosen by a per-lane test.
template <int NR>
void Rows16Q5(const uint8_t* w, int in, const int16_t* xq, const float* xd, int o0, int o1, float* y, int ldy) {
  const D16 d16;
  const DF8 df;
  const hn::Rebind<uint8_t, D16> du8;
  const size_t N = hn::Lanes(d16);
  const int nb = in / 32;
  const size_t rb = sizeof(BlockQ5_0) * static_cast<size_t>(nb);
  const auto m15 = hn::Set(d16, 15), k16 = hn::Set(d16, 16);
  HWY_ALIGN int16_t bits[16];
  for (int l = 0; l < 16; ++l) bits[l] = static_cast<int16_t>(static_cast<uint16_t>(1u << l));
  for (int o = o0; o < o1; ++o) {
    const uint8_t* blk = w + static_cast<size_t>(o) * rb;
    VF8 acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = hn::Zero(df);
    for (int b = 0; b < nb; ++b, blk += sizeof(BlockQ5_0)) {
      PrefetchAhead(blk);
      const float d = Scale1(blk);
      uint16_t qh[2];
      std::memcpy(qh, blk + 2, 4);
      const auto hlo = hn::Set(d16, static_cast<int16_t>(qh[0])), hhi = hn::Set(d16, static_cast<int16_t>(qh[1]));
      const uint8_t* qs = blk + 6;
      const int16_t* xb = xq + static_cast<size_t>(b) * 32;
      V32 s0[NR], s1[NR];
      Zero32<NR>(s0, s1);
      for (size_t j = 0; j < 16; j += N) {
        const V16 v = hn::PromoteTo(d16, hn::LoadU(du8, qs + j));
        const V16 bit = hn::Load(d16, bits + j);
        // c = nibble + 16 * bit - 16 = nibble - (bit ? 0 : 16)
        Dot16<NR>(hn::Sub(hn::And(v, m15), hn::IfThenZeroElse(hn::TestBit(hlo, bit), k16)), xb + j, in, s0, s1);
        Dot16<NR>(hn::Sub(hn::ShiftRight<4>(v), hn::IfThenZeroElse(hn::TestBit(hhi, bit), k16)), xb + 16 + j, in, s0,
                  s1);
      }
      for (int r = 0; r < NR; ++r) acc[r] = Scale(acc[r], d * xd[static_cast<size_t>(r) * nb + b], s0[r], s1[r]);
    }
    Store8<NR>(acc, nullptr, y, ldy, o);
  }
}

template <int NR>
void Rows16Q8(const uint8_t* w, int in, const int16_t* xq, const float* xd, int o0, int o1, float* y, int ldy) {
  const D16 d16;
  const DF8 df;
  const hn::Rebind<int8_t, D16> d8;
  const size_t N = hn::Lanes(d16);
  const int nb = in / 32;
  const size_t rb = sizeof(BlockQ8_0) * static_cast<size_t>(nb);
  for (int o = o0; o < o1; ++o) {
    const uint8_t* blk = w + static_cast<size_t>(o) * rb;
    VF8 acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = hn::Zero(df);
    for (int b = 0; b < nb; ++b, blk += sizeof(BlockQ8_0)) {
      PrefetchAhead(blk);
      const float d = Scale1(blk);
      const int8_t* qs = reinterpret_cast<const int8_t*>(blk + 2);
      const int16_t* xb = xq + static_cast<size_t>(b) * 32;
      V32 s0[NR], s1[NR];
      Zero32<NR>(s0, s1);
      for (size_t j = 0; j < 32; j += N) Dot16<NR>(hn::PromoteTo(d16, hn::LoadU(d8, qs + j)), xb + j, in, s0, s1);
      for (int r = 0; r < NR; ++r) acc[r] = Scale(acc[r], d * xd[static_cast<size_t>(r) * nb + b], s0[r], s1[r]);
    }
    Store8<NR>(acc, nullptr, y, ldy, o);
  }
}

// Q4_K: the four 32-byte code chunks of a super-block each hold two 32-value sub-blocks (low,
// high nibbles); per sub-block (d sc dx) times the integer sum, and -(dmin mn) (dx sum q).
template <int NR>
void Rows16Q4K(const uint8_t* w, int in, const int16_t* xq, const float* xd, const float* xs, int o0, int o1,
              float* y, int ldy) {
  const D16 d16;
  const DF8 df;
  const hn::Rebind<uint8_t, D16> du8;
  const size_t N = hn::Lanes(d16);
  const int nsb = in / kQK, nb = in / 32;
  const size_t rb = sizeof(BlockQ4_K) * static_cast<size_t>(nsb);
  const auto m15 = hn::Set(d16, 15);
  for (int o = o0; o < o1; ++o) {
    const uint8_t* blk = w + static_cast<size_t>(o) * rb;
    VF8 acc[NR];
    float macc[NR];
    for (int r = 0; r < NR; ++r) {
      acc[r] = hn::Zero(df);
      macc[r] = 0.0f;
    }
    for (int b = 0; b < nsb; ++b, blk += sizeof(BlockQ4_K)) {
      PrefetchAhead(blk, sizeof(BlockQ4_K));
      float d, dmin;
      Scales2(blk, d, dmin);
      const uint8_t* qs = blk + 16;
      for (int c = 0; c < 4; ++c) {
        const int k0 = b * 8 + 2 * c;
        const int16_t* xb = xq + static_cast<size_t>(k0) * 32;
        V32 a0[NR], a1[NR], h0[NR], h1[NR];
        Zero32<NR>(a0, a1);
        Zero32<NR>(h0, h1);
        for (size_t l = 0; l < 32; l += N) {
          const V16 v = hn::PromoteTo(d16, hn::LoadU(du8, qs + 32 * c + l));
          Dot16<NR>(hn::And(v, m15), xb + l, in, a0, a1);
          Dot16<NR>(hn::ShiftRight<4>(v), xb + 32 + l, in, h0, h1);
        }
        int sc0, mn0, sc1, mn1;
        kquant_scale_min(blk + 4, 2 * c, sc0, mn0);
        kquant_scale_min(blk + 4, 2 * c + 1, sc1, mn1);
        const float ds0 = d * static_cast<float>(sc0), ds1 = d * static_cast<float>(sc1);
        const float m0 = dmin * static_cast<float>(mn0), m1 = dmin * static_cast<float>(mn1);
        for (int r = 0; r < NR; ++r) {
          const size_t k = static_cast<size_t>(r) * nb + k0;
          acc[r] = Scale(acc[r], ds0 * xd[k], a0[r], a1[r]);
          macc[r] -= m0 * xs[k];
          acc[r] = Scale(acc[r], ds1 * xd[k + 1], h0[r], h1[r]);
          macc[r] -= m1 * xs[k + 1];
        }
      }
    }
    Store8<NR>(acc, macc, y, ldy, o);
  }
}

// Q6_K: for each half h, quarter g and 16-value group (the scale's span), the signed codes
// c - 32 (4 bits from ql, 2 from qh) times q, scaled by d sc dx of the group.
template <int NR>
void Rows16Q6K(const uint8_t* w, int in, const int16_t* xq, const float* xd, int o0, int o1, float* y, int ldy) {
  const D16 d16;
  const DF8 df;
  const hn::Rebind<uint8_t, D16> du8;
  const size_t N = hn::Lanes(d16);
  const int nsb = in / kQK, nb = in / 32;
  const size_t rb = sizeof(BlockQ6_K) * static_cast<size_t>(nsb);
  const auto m15 = hn::Set(d16, 15), m3 = hn::Set(d16, 3), k32 = hn::Set(d16, 32);
  for (int o = o0; o < o1; ++o) {
    const uint8_t* blk = w + static_cast<size_t>(o) * rb;
    VF8 acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = hn::Zero(df);
    for (int b = 0; b < nsb; ++b, blk += sizeof(BlockQ6_K)) {
      PrefetchAhead(blk, sizeof(BlockQ6_K));
      const float d = Scale1(blk + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
      for (int h = 0; h < 2; ++h) {
        for (int g = 0; g < 4; ++g) {
          const uint8_t* ql = blk + 64 * h + 32 * (g & 1);
          const uint8_t* qh = blk + 128 + 32 * h;
          const int qshift = 4 * (g >> 1), hshift = 2 * g;
          const int k = b * 8 + 4 * h + g;  // the 32-value block of x
          for (int l0 = 0; l0 < 32; l0 += 16) {
            const int16_t* xb = xq + static_cast<size_t>(k) * 32 + l0;
            V32 s0[NR], s1[NR];
            Zero32<NR>(s0, s1);
            for (size_t l = 0; l < 16; l += N) {
              const V16 lq = hn::And(hn::ShiftRightSame(hn::PromoteTo(d16, hn::LoadU(du8, ql + l0 + l)), qshift), m15);
              const V16 hq = hn::And(hn::ShiftRightSame(hn::PromoteTo(d16, hn::LoadU(du8, qh + l0 + l)), hshift), m3);
              Dot16<NR>(hn::Sub(hn::Or(lq, hn::ShiftLeft<4>(hq)), k32), xb + l, in, s0, s1);
            }
            const float ds = d * static_cast<float>(sc[(128 * h + 32 * g + l0) / 16]);
            for (int r = 0; r < NR; ++r) acc[r] = Scale(acc[r], ds * xd[static_cast<size_t>(r) * nb + k], s0[r], s1[r]);
          }
        }
      }
    }
    Store8<NR>(acc, nullptr, y, ldy, o);
  }
}

template <int NR>
void Rows16NR(GgmlType t, const uint8_t* w, int in, const detail::X16& x, int o0, int o1, float* y, int ldy) {
  const int16_t* xq = x.q;
  const float* xd = x.d;
  const float* xs = x.s;
  switch (t) {
    case GgmlType::Q4_0: return Rows16Q4<NR, false>(w, in, xq, xd, xs, o0, o1, y, ldy);
    case GgmlType::Q4_1: return Rows16Q4<NR, true>(w, in, xq, xd, xs, o0, o1, y, ldy);
    case GgmlType::Q5_0: return Rows16Q5<NR>(w, in, xq, xd, o0, o1, y, ldy);
    case GgmlType::Q8_0: return Rows16Q8<NR>(w, in, xq, xd, o0, o1, y, ldy);
    case GgmlType::Q4_K: return Rows16Q4K<NR>(w, in, xq, xd, xs, o0, o1, y, ldy);
    case GgmlType::Q6_K: return Rows16Q6K<NR>(w, in, xq, xd, o0, o1, y, ldy);
    default: return;
  }
}

// false: this target's int16 vectors do not divide 16 values (caller uses the reference).
bool Qmv16Rows(GgmlType t, const uint8_t* w, int in, const detail::X16& x, int n, int o0, int o1, float* y,
              int ldy) {
  const D16 d16;
  if (16 % hn::Lanes(d16) != 0) return false;
#if HWY_MAX_BYTES >= 64
  constexpr int kPass = 8;
#else
  constexpr int kPass = 4;
#endif
  if (n > kPass)
    return Qmv16Rows(t, w, in, x, kPass, o0, o1, y, ldy) &&
           Qmv16Rows(t, w, in, x.from(kPass, in), n - kPass, o0, o1, y + static_cast<size_t>(kPass) * ldy, ldy);
  switch (n) {
    case 1: Rows16NR<1>(t, w, in, x, o0, o1, y, ldy); return true;
    case 2: Rows16NR<2>(t, w, in, x, o0, o1, y, ldy); return true;
    case 3: Rows16NR<3>(t, w, in, x, o0, o1, y, ldy); return true;
    case 4: Rows16NR<4>(t, w, in, x, o0, o1, y, ldy); return true;
#if HWY_MAX_BYTES >= 64
    case 5: Rows16NR<5>(t, w, in, x, o0, o1, y, ldy); return true;
    case 6: Rows16NR<6>(t, w, in, x, o0, o1, y, ldy); return true;
    case 7: Rows16NR<7>(t, w, in, x, o0, o1, y, ldy); return true;
    case 8: Rows16NR<8>(t, w, in, x, o0, o1, y, ldy); return true;
#endif
    default: return false;
  }
}

// tq::dequantize_row for the block types prefill dequantizes into its GEMM panels (every
// block type), F16 and BF16: the same float operations as the scalar reference in gguf.cpp,
// value for value (code to float, times d, plus m), hence the same bits at every level. (A
// code times its fp16 scale (times a K-quant sub-block scale) has at most 23 significant bits
// for every type (see tq/gguf.h), so it is exact in float and even a fused multiply-add
// would round the same.)

// At most 16 lanes: a Q4 block's 16 code bytes fill one vector of each half.
using DF16 = hn::CappedTag<float, 16>;

template <bool kQ41>
void BlocksQ4(const uint8_t* p, float* dst, size_t nb) {
  const DF16 df;
  const hn::Rebind<int32_t, DF16> di;
  const hn::Rebind<uint8_t, DF16> du8;
  const size_t N = hn::Lanes(df);
  constexpr size_t kBB = kQ41 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
  const auto m15 = hn::Set(di, 15), eight = hn::Set(di, 8);
  for (size_t b = 0; b < nb; ++b, p += kBB) {
    float d, m;
    Scales2(p, d, m);  // Q4_0: m is the first code bytes, unused
    const auto vd = hn::Set(df, d), vm = hn::Set(df, m);
    const uint8_t* qs = p + (kQ41 ? 4 : 2);
    float* y = dst + b * 32;
    for (size_t j = 0; j < 16; j += N) {
      const auto q = hn::PromoteTo(di, hn::LoadU(du8, qs + j));
      auto lo = hn::And(q, m15), hi = hn::ShiftRight<4>(q);
      if (kQ41) {  // (q & 15) * d + m
        hn::StoreU(hn::Add(hn::Mul(hn::ConvertTo(df, lo), vd), vm), df, y + j);
        hn::StoreU(hn::Add(hn::Mul(hn::ConvertTo(df, hi), vd), vm), df, y + 16 + j);
      } else {  // ((q & 15) - 8) * d
        hn::StoreU(hn::Mul(hn::ConvertTo(df, hn::Sub(lo, eight)), vd), df, y + j);
        hn::StoreU(hn::Mul(hn::ConvertTo(df, hn::Sub(hi, eight)), vd), df, y + 16 + j);
      }
    }
  }
}

void BlocksQ8(const uint8_t* p, float* dst, size_t nb) {
  const DF16 df;
  const hn::Rebind<int32_t, DF16> di;
  const hn::Rebind<int8_t, DF16> d8;
  const size_t N = hn::Lanes(df);
  for (size_t b = 0; b < nb; ++b, p += sizeof(BlockQ8_0)) {
    float d, unused;
    Scales2(p, d, unused);  // reads the first two code bytes too (ignored): inside the block
    const auto vd = hn::Set(df, d);
    const int8_t* qs = reinterpret_cast<const int8_t*>(p + 2);
    for (size_t j = 0; j < 32; j += N)
      hn::StoreU(hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, qs + j))), vd), df, dst + b * 32 + j);
  }
}

void RowF16(const uint8_t* p, float* dst, size_t n) {
  const DF16 df;
  const hn::Rebind<hwy::float16_t, DF16> dh;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p) + i)), df, dst + i);
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    dst[i] = tq::fp16_to_fp32(h);
  }
}

template <bool kQ51>
void BlocksQ5(const uint8_t* p, float* dst, size_t nb) {
  const DF16 df;
  const hn::Rebind<int32_t, DF16> di;
  const hn::Rebind<uint32_t, DF16> du;
  const hn::Rebind<uint8_t, DF16> du8;
  const size_t N = hn::Lanes(df);
  constexpr size_t kBB = kQ51 ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0);
  const auto m15 = hn::Set(di, 15), k16 = hn::Set(di, 16);
  const auto one = hn::Set(du, 1u);
  for (size_t b = 0; b < nb; ++b, p += kBB) {
    float d, m;
    Scales2(p, d, m);  // Q5_0: m is the first qh bytes, unused
    const auto vd = hn::Set(df, d), vm = hn::Set(df, m);
    uint32_t qh32;
    std::memcpy(&qh32, p + (kQ51 ? 4 : 2), 4);
    const auto vqh = hn::Set(du, qh32);
    const uint8_t* qs = p + (kQ51 ? 8 : 6);
    float* y = dst + b * 32;
    for (size_t j = 0; j < 16; j += N) {
      const auto q = hn::PromoteTo(di, hn::LoadU(du8, qs + j));
      const auto hl = hn::BitCast(di, hn::ShiftLeft<4>(hn::And(hn::Shr(vqh, hn::Iota(du, static_cast<uint32_t>(j))), one)));
      const auto hh =
          hn::BitCast(di, hn::ShiftLeft<4>(hn::And(hn::Shr(vqh, hn::Iota(du, static_cast<uint32_t>(j + 16))), one)));
      const auto lo = hn::Or(hn::And(q, m15), hl), hi = hn::Or(hn::ShiftRight<4>(q), hh);
      if (kQ51) {  // d * q + m
        hn::StoreU(hn::Add(hn::Mul(vd, hn::ConvertTo(df, lo)), vm), df, y + j);
        hn::StoreU(hn::Add(hn::Mul(vd, hn::ConvertTo(df, hi)), vm), df, y + 16 + j);
      } else {  // d * (q - 16)
        hn::StoreU(hn::Mul(vd, hn::ConvertTo(df, hn::Sub(lo, k16))), df, y + j);
        hn::StoreU(hn::Mul(vd, hn::ConvertTo(df, hn::Sub(hi, k16))), df, y + 16 + j);
      }
    }
  }
}

// Q4_K / Q5_K: (d sc) * q - (dmin mn) per 32-value sub-block, as the reference.
template <bool kQ5>
void BlocksKQ(const uint8_t* p, float* dst, size_t nsb) {
  const DF16 df;
  const hn::Rebind<int32_t, DF16> di;
  const hn::Rebind<uint8_t, DF16> du8;
  const size_t N = hn::Lanes(df);
  constexpr size_t kBB = kQ5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  const auto m15 = hn::Set(di, 15), one = hn::Set(di, 1);
  for (size_t b = 0; b < nsb; ++b, p += kBB) {
    float d, dmin;
    Scales2(p, d, dmin);
    const uint8_t* qh = p + 16;
    const uint8_t* qs = p + (kQ5 ? 48 : 16);
    float* y = dst + b * kQK;
    for (int c = 0; c < 4; ++c) {
      int sc0, mn0, sc1, mn1;
      kquant_scale_min(p + 4, 2 * c, sc0, mn0);
      kquant_scale_min(p + 4, 2 * c + 1, sc1, mn1);
      const auto vd0 = hn::Set(df, d * static_cast<float>(sc0)), vm0 = hn::Set(df, dmin * static_cast<float>(mn0));
      const auto vd1 = hn::Set(df, d * static_cast<float>(sc1)), vm1 = hn::Set(df, dmin * static_cast<float>(mn1));
      for (size_t l = 0; l < 32; l += N) {
        const auto q = hn::PromoteTo(di, hn::LoadU(du8, qs + 32 * c + l));
        auto lo = hn::And(q, m15), hi = hn::ShiftRight<4>(q);
        if constexpr (kQ5) {
          const auto h = hn::PromoteTo(di, hn::LoadU(du8, qh + l));
          lo = hn::Or(lo, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, 2 * c), one)));
          hi = hn::Or(hi, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, 2 * c + 1), one)));
        }
        hn::StoreU(hn::Sub(hn::Mul(vd0, hn::ConvertTo(df, lo)), vm0), df, y + 64 * c + l);
        hn::StoreU(hn::Sub(hn::Mul(vd1, hn::ConvertTo(df, hi)), vm1), df, y + 64 * c + 32 + l);
      }
    }
  }
}

// Q6_K: (d sc) * (q - 32) per 16-value group, as the reference.
void BlocksQ6K(const uint8_t* p, float* dst, size_t nsb) {
  const DF16 df;
  const hn::Rebind<int32_t, DF16> di;
  const hn::Rebind<uint8_t, DF16> du8;
  const size_t N = hn::Lanes(df);
  const auto m15 = hn::Set(di, 15), m3 = hn::Set(di, 3), k32 = hn::Set(di, 32);
  for (size_t b = 0; b < nsb; ++b, p += sizeof(BlockQ6_K)) {
    const float d = Scale1(p + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
    float* y = dst + b * kQK;
    for (int h = 0; h < 2; ++h) {
      for (int g = 0; g < 4; ++g) {
        const uint8_t* ql = p + 64 * h + 32 * (g & 1);
        const uint8_t* qh = p + 128 + 32 * h;
        const int qshift = 4 * (g >> 1), hshift = 2 * g;
        for (size_t l = 0; l < 32; l += N) {
          const int i = 128 * h + 32 * g + static_cast<int>(l);
          const auto lq = hn::And(hn::ShiftRightSame(hn::PromoteTo(di, hn::LoadU(du8, ql + l)), qshift), m15);
          const auto hq = hn::And(hn::ShiftRightSame(hn::PromoteTo(di, hn::LoadU(du8, qh + l)), hshift), m3);
          const auto q = hn::ConvertTo(df, hn::Sub(hn::Or(lq, hn::ShiftLeft<4>(hq)), k32));
          hn::StoreU(hn::Mul(hn::Set(df, d * static_cast<float>(sc[i / 16])), q), df, y + i);
        }
      }
    }
  }
}

void RowBF16(const uint8_t* p, float* dst, size_t n) {
  const DF16 df;
  const hn::Rebind<uint16_t, DF16> du16;
  const hn::Rebind<uint32_t, DF16> du32;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p) + i)))),
               df, dst + i);
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    std::memcpy(dst + i, &u, 4);
  }
}

// False for a type these kernels do not read (the caller uses the reference).
bool DequantRow(GgmlType t, const uint8_t* p, float* dst, size_t n) {
  switch (t) {
    case GgmlType::Q4_0: BlocksQ4<false>(p, dst, n / 32); return true;
    case GgmlType::Q4_1: BlocksQ4<true>(p, dst, n / 32); return true;
    case GgmlType::Q8_0: BlocksQ8(p, dst, n / 32); return true;
    case GgmlType::Q5_0: BlocksQ5<false>(p, dst, n / 32); return true;
    case GgmlType::Q5_1: BlocksQ5<true>(p, dst, n / 32); return true;
    case GgmlType::Q4_K: BlocksKQ<false>(p, dst, n / kQK); return true;
    case GgmlType::Q5_K: BlocksKQ<true>(p, dst, n / kQK); return true;
    case GgmlType::Q6_K: BlocksQ6K(p, dst, n / kQK); return true;
    case GgmlType::F16: RowF16(p, dst, n); return true;
    case GgmlType::BF16: RowBF16(p, dst, n); return true;
    default: return false;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace tq::llm
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tq::llm {
HWY_EXPORT(QmvRows);
HWY_EXPORT(Qmv16Rows);
HWY_EXPORT(DequantRow);

namespace detail {
void qmv_rows_simd(GgmlType t, const uint8_t* w, int in, const float* x, const float* xs, int n, int o0, int o1,
                   float* y, int ldy) noexcept {
  if (!HWY_DYNAMIC_DISPATCH(QmvRows)(t, w, in, x, xs, n, o0, o1, y, ldy))
    qmv_rows_ref(t, w, in, x, xs, n, o0, o1, y, ldy);
}

void qmv16_rows_highway(GgmlType t, const uint8_t* w, int in, const X16& x, int n, int o0, int o1, float* y,
                       int ldy) noexcept {
  if (!HWY_DYNAMIC_DISPATCH(Qmv16Rows)(t, w, in, x, n, o0, o1, y, ldy)) qmv16_rows_ref(t, w, in, x, n, o0, o1, y, ldy);
}

bool dequantize_row_simd(GgmlType t, const void* src, float* dst, size_t n) noexcept {
  return HWY_DYNAMIC_DISPATCH(DequantRow)(t, static_cast<const uint8_t*>(src), dst, n);
}
}  // namespace detail
}  // namespace tq::llm
#endif
