// Highway kernels of qmatvec (see qmatvec.h): one output row at a time, up to 4 rows of x
// per pass over the weight row. Per 32-value block: the integer codes are widened to int32
// lanes and converted to float, multiplied into a per-block partial vector (lane-wise FMAs,
// no horizontal sum), then scaled by the block's d into the row accumulator; the Q4 offset
// term m * sum(x of the block) is a scalar FMA on the precomputed block sums. One horizontal
// sum per output row. Same grouping as the scalar reference (qmv_rows_ref). Also the
// kernels of tq::dequantize_row (DequantRow, at the end).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "llm/qmatvec_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
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

template <int NR, bool kQ41>
void RowsQ4(const uint8_t* w, int in, const float* x, const float* xs, int o0, int o1, float* y, int ldy) {
  const DF df;
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<uint8_t, DF> du8;
  const size_t N = hn::Lanes(df);
  const int nb = in / 32;
  constexpr size_t kBB = kQ41 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
  const size_t rb = kBB * static_cast<size_t>(nb);
  const auto m15 = hn::Set(di, 15);
  for (int o = o0; o < o1; ++o) {
    const uint8_t* blk = w + static_cast<size_t>(o) * rb;
    VF acc[NR];
    float macc[NR];
    for (int r = 0; r < NR; ++r) {
      acc[r] = hn::Zero(df);
      macc[r] = 0.0f;
    }
    for (int b = 0; b < nb; ++b, blk += kBB) {
      float d, m;
      Scales2(blk, d, m);
      if (!kQ41) m = -8.0f * d;
      const uint8_t* qs = blk + (kQ41 ? 4 : 2);
      const float* xb = x + static_cast<size_t>(b) * 32;
      VF part[NR];
      for (int r = 0; r < NR; ++r) part[r] = hn::Zero(df);
      for (size_t j = 0; j < 16; j += N) {
        const auto q = hn::PromoteTo(di, hn::LoadU(du8, qs + j));
        const VF lo = hn::ConvertTo(df, hn::And(q, m15));
        const VF hi = hn::ConvertTo(df, hn::ShiftRight<4>(q));
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

template <int NR>
void RowsQ8(const uint8_t* w, int in, const float* x, int o0, int o1, float* y, int ldy) {
  const DF df;
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<int8_t, DF> d8;
  const size_t N = hn::Lanes(df);
  const int nb = in / 32;
  const size_t rb = sizeof(BlockQ8_0) * static_cast<size_t>(nb);
  for (int o = o0; o < o1; ++o) {
    const uint8_t* blk = w + static_cast<size_t>(o) * rb;
    VF acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = hn::Zero(df);
    for (int b = 0; b < nb; ++b, blk += sizeof(BlockQ8_0)) {
      float d, unused;
      Scales2(blk, d, unused);  // reads the first two code bytes too (ignored): inside the block
      const int8_t* qs = reinterpret_cast<const int8_t*>(blk + 2);
      const float* xb = x + static_cast<size_t>(b) * 32;
      VF part[NR];
      for (int r = 0; r < NR; ++r) part[r] = hn::Zero(df);
      for (size_t j = 0; j < 32; j += N) {
        const VF q = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, qs + j)));
        for (int r = 0; r < NR; ++r) part[r] = hn::MulAdd(q, hn::LoadU(df, xb + static_cast<size_t>(r) * in + j), part[r]);
      }
      const VF vd = hn::Set(df, d);
      for (int r = 0; r < NR; ++r) acc[r] = hn::MulAdd(vd, part[r], acc[r]);
    }
    for (int r = 0; r < NR; ++r) y[static_cast<size_t>(r) * ldy + o] = hn::GetLane(hn::SumOfLanes(df, acc[r]));
  }
}

// F16 / F32 rows: 32-value chunks summed on their own, then added (as the reference); a
// chunk shorter than 32 at the end (in % 32 != 0) is done in scalar code.
template <int NR, bool kF16>
void RowsFloat(const uint8_t* w, int in, const float* x, int o0, int o1, float* y, int ldy) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const size_t N = hn::Lanes(df);
  const size_t es = kF16 ? 2 : 4;
  const int full = in / 32 * 32;
  for (int o = o0; o < o1; ++o) {
    const uint8_t* row = w + static_cast<size_t>(o) * in * es;
    VF acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = hn::Zero(df);
    for (int i0 = 0; i0 < full; i0 += 32) {
      VF part[NR];
      for (int r = 0; r < NR; ++r) part[r] = hn::Zero(df);
      for (size_t j = 0; j < 32; j += N) {
        VF wv;
        if constexpr (kF16) wv = hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(row) + i0 + j));
        else wv = hn::LoadU(df, reinterpret_cast<const float*>(row) + i0 + j);
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

template <int NR>
void RowsNR(GgmlType t, const uint8_t* w, int in, const float* x, const float* xs, int o0, int o1, float* y,
            int ldy) {
  switch (t) {
    case GgmlType::Q4_1: return RowsQ4<NR, true>(w, in, x, xs, o0, o1, y, ldy);
    case GgmlType::Q4_0: return RowsQ4<NR, false>(w, in, x, xs, o0, o1, y, ldy);
    case GgmlType::Q8_0: return RowsQ8<NR>(w, in, x, o0, o1, y, ldy);
    case GgmlType::F16: return RowsFloat<NR, true>(w, in, x, o0, o1, y, ldy);
    case GgmlType::F32: return RowsFloat<NR, false>(w, in, x, o0, o1, y, ldy);
    default: return;
  }
}

// false: this target's vectors do not divide a 16-value half block (caller uses the reference).
bool QmvRows(GgmlType t, const uint8_t* w, int in, const float* x, const float* xs, int n, int o0, int o1,
             float* y, int ldy) {
  const DF df;
  if (hn::Lanes(df) > 16 || 16 % hn::Lanes(df) != 0) return false;
  switch (n) {
    case 1: RowsNR<1>(t, w, in, x, xs, o0, o1, y, ldy); return true;
    case 2: RowsNR<2>(t, w, in, x, xs, o0, o1, y, ldy); return true;
    case 3: RowsNR<3>(t, w, in, x, xs, o0, o1, y, ldy); return true;
    case 4: RowsNR<4>(t, w, in, x, xs, o0, o1, y, ldy); return true;
    default: return false;
  }
}

// tq::dequantize_row for the block types prefill dequantizes into its GEMM panels (Q4_0,
// Q4_1, Q8_0) and F16: the same float operations as the scalar reference in gguf.cpp, value
// for value (code to float, times d, plus m), hence the same bits at every level. (A code
// times an fp16 scale, at most 8 + 11 significant bits, is exact in float, so even a fused
// multiply-add would round the same.)

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

// False for a type these kernels do not read (the caller uses the reference).
bool DequantRow(GgmlType t, const uint8_t* p, float* dst, size_t n) {
  switch (t) {
    case GgmlType::Q4_0: BlocksQ4<false>(p, dst, n / 32); return true;
    case GgmlType::Q4_1: BlocksQ4<true>(p, dst, n / 32); return true;
    case GgmlType::Q8_0: BlocksQ8(p, dst, n / 32); return true;
    case GgmlType::F16: RowF16(p, dst, n); return true;
    default: return false;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace tq::llm
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tq::llm {
HWY_EXPORT(QmvRows);
HWY_EXPORT(DequantRow);

namespace detail {
void qmv_rows_simd(GgmlType t, const uint8_t* w, int in, const float* x, const float* xs, int n, int o0, int o1,
                   float* y, int ldy) noexcept {
  if (!HWY_DYNAMIC_DISPATCH(QmvRows)(t, w, in, x, xs, n, o0, o1, y, ldy))
    qmv_rows_ref(t, w, in, x, xs, n, o0, o1, y, ldy);
}

bool dequantize_row_simd(GgmlType t, const void* src, float* dst, size_t n) noexcept {
  return HWY_DYNAMIC_DISPATCH(DequantRow)(t, static_cast<const uint8_t*>(src), dst, n);
}
}  // namespace detail
}  // namespace tq::llm
#endif
