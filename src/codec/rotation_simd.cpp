// SIMD kernels for rotations: the normalized fast Walsh-Hadamard transform.
// Highway, dispatched per batch call; fwht_ref (rotation.cpp) is the scalar reference.
// Both perform the same float operations in the same order on every element (a + b, a - b
// per butterfly, then one multiply by 1/sqrt(m)), so results are bit-identical across levels.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "codec/rotation_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "tq/rotation.h"
#include "tq/simd.h"

HWY_BEFORE_NAMESPACE();
namespace tq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void FwhtRows(size_t n, int m, float* HWY_RESTRICT x, size_t stride) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const size_t N = hn::Lanes(df);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(m)));
  if (static_cast<size_t>(m) < N) {
    fwht_ref(n, m, x, stride);
    return;
  }
  const auto vscale = hn::Set(df, scale);
  const auto iota = hn::Iota(di, 0);
  for (size_t r = 0; r < n; ++r) {
    float* HWY_RESTRICT row = x + r * stride;
    // In-register stages h < N: partner lane i ^ h.
    for (size_t h = 1; h < N; h <<= 1) {
      const auto hv = hn::Set(di, static_cast<int32_t>(h));
      const auto perm = hn::IndicesFromVec(df, hn::Xor(iota, hv));
      const auto upper = hn::RebindMask(df, hn::Ne(hn::And(iota, hv), hn::Zero(di)));
      for (int i = 0; i < m; i += static_cast<int>(N)) {
        const auto v = hn::LoadU(df, row + i);
        const auto s = hn::TableLookupLanes(v, perm);
        // lane i (lower of pair): v + s = a + b; lane i ^ h (upper): s - v = a - b.
        hn::StoreU(hn::IfThenElse(upper, hn::Sub(s, v), hn::Add(v, s)), df, row + i);
      }
    }
    // Vector stages h >= N.
    for (size_t h = N; h < static_cast<size_t>(m); h <<= 1) {
      for (size_t i = 0; i < static_cast<size_t>(m); i += 2 * h) {
        for (size_t j = i; j < i + h; j += N) {
          const auto a = hn::LoadU(df, row + j);
          const auto b = hn::LoadU(df, row + j + h);
          hn::StoreU(hn::Add(a, b), df, row + j);
          hn::StoreU(hn::Sub(a, b), df, row + j + h);
        }
      }
    }
    for (int i = 0; i < m; i += static_cast<int>(N)) hn::StoreU(hn::Mul(hn::LoadU(df, row + i), vscale), df, row + i);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace tq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tq {
HWY_EXPORT(FwhtRows);

void fwht(size_t n, int m, float* x, size_t stride) noexcept {
  if (m <= 1) return;
  if (simd::use_scalar()) {
    fwht_ref(n, m, x, stride);
  } else {
    HWY_DYNAMIC_DISPATCH(FwhtRows)(n, m, x, stride);
  }
}
}  // namespace tq
#endif
