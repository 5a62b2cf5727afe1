// SIMD kernels of the scalar quantizer (Highway, dispatched per batch call).
//   QuantizeRotated: index = number of codebook boundaries <= y, by a branch-free binary
//     search (permutes when the boundaries fit one register, else gathers) or, up to 4 bits,
//     by counting them (one compare each); identical to Codebook::quantize (the reference),
//     so codes are bit-identical across levels.
//   DotCentroids: sum q[i] * c[idx[i]] with gathers and FMA; differs from the sequential
//     reference only by float summation order.
//   GatherScale: out[i] = s * c[idx[i]] (decode), exact same products as the reference.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "codec/quantizer_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "tq/codebook.h"
#include "tq/quantizer.h"
#include "tq/simd.h"

HWY_BEFORE_NAMESPACE();
namespace tq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// t = y * scale (scale 1 for plain quantize); idx = #boundaries <= t; returns the integer
// sum of csq[idx] (nullptr: 0). Integer sums are order-independent, hence identical at
// every level.
int64_t QuantizeScaled(const float* HWY_RESTRICT bounds, int bits, size_t n, const float* HWY_RESTRICT y,
                       float scale, uint8_t* HWY_RESTRICT idx, const int32_t* HWY_RESTRICT csq) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  const int nb = (1 << bits) - 1;
  const auto vscale = hn::Set(df, scale);
  auto acc = hn::Zero(di);
  if (static_cast<size_t>(nb) <= N && N <= 64) {
    // All boundaries fit in one register: permutes instead of gathers.
    HWY_ALIGN float padded[64];
    for (size_t j = 0; j < N; ++j) padded[j] = j < static_cast<size_t>(nb) ? bounds[j] : HUGE_VALF;
    const auto bv = hn::Load(df, padded);
    for (; i + N <= n; i += N) {
      const auto v = hn::Mul(hn::LoadU(df, y + i), vscale);
      auto pos = hn::Zero(di);
      for (int step = 1 << (bits - 1); step >= 1; step >>= 1) {
        const auto cand = hn::Add(pos, hn::Set(di, step));
        const auto b = hn::TableLookupLanes(bv, hn::IndicesFromVec(df, hn::Sub(cand, hn::Set(di, 1))));
        pos = hn::IfThenElse(hn::RebindMask(di, hn::Ge(v, b)), cand, pos);
      }
      hn::StoreU(hn::DemoteTo(d8, pos), d8, idx + i);
      if (csq) acc = hn::Add(acc, hn::GatherIndex(di, csq, pos));
    }
  } else if (nb <= 15) {
    // Up to 4 bits with more boundaries than lanes (4 bits on AVX2 and below): count the
    // boundaries <= t, one compare against each (broadcast), instead of the search's four
    // gathers, which cost more than the 15 compares on AVX2 hosts. The same count: the
    // boundaries are sorted, and a NaN t compares false with every one of them.
    for (; i + N <= n; i += N) {
      const auto v = hn::Mul(hn::LoadU(df, y + i), vscale);
      auto pos = hn::Zero(di);
      for (int j = 0; j < nb; ++j)  // pos - (-1) for each boundary <= v
        pos = hn::Sub(pos, hn::VecFromMask(di, hn::RebindMask(di, hn::Ge(v, hn::Set(df, bounds[j])))));
      hn::StoreU(hn::DemoteTo(d8, pos), d8, idx + i);
      if (csq) acc = hn::Add(acc, hn::GatherIndex(di, csq, pos));
    }
  }
  for (; i + N <= n; i += N) {
    const auto v = hn::Mul(hn::LoadU(df, y + i), vscale);
    auto pos = hn::Zero(di);
    for (int step = 1 << (bits - 1); step >= 1; step >>= 1) {
      const auto cand = hn::Add(pos, hn::Set(di, step));
      const auto b = hn::GatherIndex(df, bounds, hn::Sub(cand, hn::Set(di, 1)));
      pos = hn::IfThenElse(hn::RebindMask(di, hn::Ge(v, b)), cand, pos);
    }
    hn::StoreU(hn::DemoteTo(d8, pos), d8, idx + i);
    if (csq) acc = hn::Add(acc, hn::GatherIndex(di, csq, pos));
  }
  int64_t total = 0;
  HWY_ALIGN int32_t lanes[64];
  hn::Store(acc, di, lanes);
  for (size_t k = 0; k < N; ++k) total += lanes[k];
  for (; i < n; ++i) {
    const float t = y[i] * scale;
    int lo = 0, hi = (1 << bits) - 1;
    while (lo < hi) {
      int mid = (lo + hi) >> 1;
      if (bounds[mid] <= t) lo = mid + 1; else hi = mid;
    }
    idx[i] = static_cast<uint8_t>(lo);
    if (csq) total += csq[lo];
  }
  return total;
}

float DotCentroids(const float* HWY_RESTRICT cents, size_t n, const float* HWY_RESTRICT q,
                   const uint8_t* HWY_RESTRICT idx) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const size_t N = hn::Lanes(df);
  auto acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const auto i0 = hn::PromoteTo(di, hn::LoadU(d8, idx + i));
    const auto i1 = hn::PromoteTo(di, hn::LoadU(d8, idx + i + N));
    acc0 = hn::MulAdd(hn::LoadU(df, q + i), hn::GatherIndex(df, cents, i0), acc0);
    acc1 = hn::MulAdd(hn::LoadU(df, q + i + N), hn::GatherIndex(df, cents, i1), acc1);
  }
  for (; i + N <= n; i += N) {
    const auto i0 = hn::PromoteTo(di, hn::LoadU(d8, idx + i));
    acc0 = hn::MulAdd(hn::LoadU(df, q + i), hn::GatherIndex(df, cents, i0), acc0);
  }
  float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
  for (; i < n; ++i) s += q[i] * cents[idx[i]];
  return s;
}

void GatherScale(const float* HWY_RESTRICT cents, size_t n, const uint8_t* HWY_RESTRICT idx, float s,
                 float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const size_t N = hn::Lanes(df);
  const auto vs = hn::Set(df, s);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto iv = hn::PromoteTo(di, hn::LoadU(d8, idx + i));
    hn::StoreU(hn::Mul(hn::GatherIndex(df, cents, iv), vs), df, out + i);
  }
  for (; i < n; ++i) out[i] = cents[idx[i]] * s;
}

}  // namespace HWY_NAMESPACE
}  // namespace tq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tq {
HWY_EXPORT(QuantizeScaled);
HWY_EXPORT(DotCentroids);
HWY_EXPORT(GatherScale);

void quantize_rotated_ref(const Codebook& cb, size_t n, const float* y, uint8_t* idx, float scale) noexcept {
  for (size_t i = 0; i < n; ++i) idx[i] = cb.quantize(y[i] * scale);
}
void quantize_rotated(const Codebook& cb, size_t n, const float* y, uint8_t* idx, float scale) noexcept {
  if (simd::use_scalar()) return quantize_rotated_ref(cb, n, y, idx, scale);
  HWY_DYNAMIC_DISPATCH(QuantizeScaled)(cb.boundaries.data(), cb.bits, n, y, scale, idx, nullptr);
}

float dot_centroids_ref(const Codebook& cb, size_t n, const float* q, const uint8_t* idx) noexcept {
  float s = 0;
  for (size_t i = 0; i < n; ++i) s += q[i] * cb.centroids[idx[i]];
  return s;
}
float dot_centroids(const Codebook& cb, size_t n, const float* q, const uint8_t* idx) noexcept {
  if (simd::use_scalar()) return dot_centroids_ref(cb, n, q, idx);
  return HWY_DYNAMIC_DISPATCH(DotCentroids)(cb.centroids.data(), n, q, idx);
}

namespace detail {
int64_t quantize_scaled(const Codebook& cb, size_t n, const float* y, float scale, uint8_t* idx,
                        const int32_t* csq) noexcept {
  if (simd::use_scalar()) {
    int64_t total = 0;
    for (size_t i = 0; i < n; ++i) {
      idx[i] = cb.quantize(y[i] * scale);
      total += csq[idx[i]];
    }
    return total;
  }
  return HWY_DYNAMIC_DISPATCH(QuantizeScaled)(cb.boundaries.data(), cb.bits, n, y, scale, idx, csq);
}

void gather_scale(const Codebook& cb, size_t n, const uint8_t* idx, float s, float* out) noexcept {
  if (simd::use_scalar()) {
    for (size_t i = 0; i < n; ++i) out[i] = cb.centroids[idx[i]] * s;
    return;
  }
  HWY_DYNAMIC_DISPATCH(GatherScale)(cb.centroids.data(), n, idx, s, out);
}
}  // namespace detail
}  // namespace tq
#endif
