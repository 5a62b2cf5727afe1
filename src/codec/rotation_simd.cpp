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

// Whole row held in R vectors (m == R * N): every stage in registers, one load and one store.
template <size_t R, class D>
HWY_INLINE void FwhtRowInRegs(D df, float* HWY_RESTRICT row, const float* HWY_RESTRICT pre,
                              const float* HWY_RESTRICT post, float scale) {
  const hn::RebindToSigned<D> di;
  const size_t N = hn::Lanes(df);
  hn::Vec<D> v[R];
  for (size_t r = 0; r < R; ++r) {
    v[r] = hn::LoadU(df, row + r * N);
    if (pre) v[r] = hn::Mul(v[r], hn::LoadU(df, pre + r * N));
  }
  const auto iota = hn::Iota(di, 0);
  for (size_t h = 1; h < N; h <<= 1) {
    const auto hv = hn::Set(di, static_cast<int32_t>(h));
    const auto perm = hn::IndicesFromVec(df, hn::Xor(iota, hv));
    const auto upper = hn::RebindMask(df, hn::Ne(hn::And(iota, hv), hn::Zero(di)));
    for (size_t r = 0; r < R; ++r) {
      const auto s = hn::TableLookupLanes(v[r], perm);
      v[r] = hn::IfThenElse(upper, hn::Sub(s, v[r]), hn::Add(v[r], s));
    }
  }
  for (size_t h = 1; h < R; h <<= 1)
    for (size_t i = 0; i < R; i += 2 * h)
      for (size_t j = i; j < i + h; ++j) {
        const auto a = v[j], b = v[j + h];
        v[j] = hn::Add(a, b);
        v[j + h] = hn::Sub(a, b);
      }
  const auto vs = hn::Set(df, scale);
  for (size_t r = 0; r < R; ++r) {
    auto o = hn::Mul(v[r], vs);
    if (post) o = hn::Mul(o, hn::LoadU(df, post + r * N));
    hn::StoreU(o, df, row + r * N);
  }
}

void FwhtRows(size_t n, int m, float* HWY_RESTRICT x, size_t stride, const float* HWY_RESTRICT pre,
              const float* HWY_RESTRICT post) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const size_t N = hn::Lanes(df);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(m)));
  if (static_cast<size_t>(m) < N) {
    fwht_signed_ref(n, m, x, stride, pre, post);
    return;
  }
  const size_t R = static_cast<size_t>(m) / N;
  switch (R) {
    case 1: for (size_t r = 0; r < n; ++r) FwhtRowInRegs<1>(df, x + r * stride, pre, post, scale); return;
    case 2: for (size_t r = 0; r < n; ++r) FwhtRowInRegs<2>(df, x + r * stride, pre, post, scale); return;
    case 4: for (size_t r = 0; r < n; ++r) FwhtRowInRegs<4>(df, x + r * stride, pre, post, scale); return;
    case 8: for (size_t r = 0; r < n; ++r) FwhtRowInRegs<8>(df, x + r * stride, pre, post, scale); return;
    case 16: for (size_t r = 0; r < n; ++r) FwhtRowInRegs<16>(df, x + r * stride, pre, post, scale); return;
    default: break;
  }
  const auto vscale = hn::Set(df, scale);
  const auto iota = hn::Iota(di, 0);
  for (size_t r = 0; r < n; ++r) {
    float* HWY_RESTRICT row = x + r * stride;
    if (pre)
      for (int i = 0; i < m; i += static_cast<int>(N))
        hn::StoreU(hn::Mul(hn::LoadU(df, row + i), hn::LoadU(df, pre + i)), df, row + i);
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
    for (int i = 0; i < m; i += static_cast<int>(N)) {
      auto o = hn::Mul(hn::LoadU(df, row + i), vscale);
      if (post) o = hn::Mul(o, hn::LoadU(df, post + i));
      hn::StoreU(o, df, row + i);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace tq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tq {
HWY_EXPORT(FwhtRows);

void fwht_signed(size_t n, int m, float* x, size_t stride, const float* pre, const float* post) noexcept {
  if (simd::use_scalar()) {
    fwht_signed_ref(n, m, x, stride, pre, post);
  } else {
    HWY_DYNAMIC_DISPATCH(FwhtRows)(n, m, x, stride, pre, post);
  }
}

void fwht(size_t n, int m, float* x, size_t stride) noexcept { fwht_signed(n, m, x, stride, nullptr, nullptr); }
}  // namespace tq
#endif
