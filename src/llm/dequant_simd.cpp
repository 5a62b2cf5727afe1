// Highway kernels of tq::dequantize_row for the block types prefill dequantizes into its GEMM
// panels (Q4_0, Q4_1, Q8_0) and F16: the same float operations as the scalar reference in
// gguf.cpp, value for value (code to float, times d, plus m), hence the same bits at every
// level. (A code times an fp16 scale, at most 8 + 11 significant bits, is exact in float, so
// even a fused multiply-add would round the same.)
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "llm/dequant_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstring>

#include "llm/qmatvec.h"

HWY_BEFORE_NAMESPACE();
namespace tq::llm {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 16 lanes: a Q4 block's 16 code bytes fill one vector of each half.
using DF = hn::CappedTag<float, 16>;

HWY_INLINE float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return tq::fp16_to_fp32(h);
}

template <bool kQ41>
void BlocksQ4(const uint8_t* p, float* dst, size_t nb) {
  const DF df;
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<uint8_t, DF> du8;
  const size_t N = hn::Lanes(df);
  constexpr size_t kBB = kQ41 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
  const auto m15 = hn::Set(di, 15), eight = hn::Set(di, 8);
  for (size_t b = 0; b < nb; ++b, p += kBB) {
    const auto vd = hn::Set(df, Half(p));
    const auto vm = hn::Set(df, kQ41 ? Half(p + 2) : 0.0f);
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
  const DF df;
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<int8_t, DF> d8;
  const size_t N = hn::Lanes(df);
  for (size_t b = 0; b < nb; ++b, p += sizeof(BlockQ8_0)) {
    const auto vd = hn::Set(df, Half(p));
    const int8_t* qs = reinterpret_cast<const int8_t*>(p + 2);
    for (size_t j = 0; j < 32; j += N)
      hn::StoreU(hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, qs + j))), vd), df, dst + b * 32 + j);
  }
}

void RowF16(const uint8_t* p, float* dst, size_t n) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p) + i)), df, dst + i);
  for (; i < n; ++i) dst[i] = Half(p + 2 * i);
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
HWY_EXPORT(DequantRow);

namespace detail {
bool dequantize_row_simd(GgmlType t, const void* src, float* dst, size_t n) noexcept {
  return HWY_DYNAMIC_DISPATCH(DequantRow)(t, static_cast<const uint8_t*>(src), dst, n);
}
}  // namespace detail
}  // namespace tq::llm
#endif
