// SIMD decode of trellis codes (Highway, dispatched per call).
//   TrellisValues: out[i] = s * lut[w_i], w_i = the last 8 bits of the code stream up to code i
//     (circular), from a copy of the codes with the last ones in front (so every window is a few
//     unaligned loads), shifts, ORs and one gather; the same products as the reference.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "codec/trellis_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "tq/simd.h"
#include "tq/trellis.h"

HWY_BEFORE_NAMESPACE();
namespace tq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ext: P = ceil(8 / bits) codes of padding (the last P codes), then the dim codes.
void TrellisValues(const float* HWY_RESTRICT lut, int bits, int dim, const uint8_t* HWY_RESTRICT ext, float s,
                   float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const size_t N = hn::Lanes(df);
  const int P = (8 + bits - 1) / bits;
  const uint8_t* c = ext + P;
  const auto vs = hn::Set(df, s);
  const auto mask = hn::Set(di, 255);
  size_t i = 0;
  for (; i + N <= (size_t)dim; i += N) {
    auto w = hn::PromoteTo(di, hn::LoadU(d8, c + i));
    for (int j = 1; j < P; ++j)
      w = hn::Or(w, hn::ShiftLeftSame(hn::PromoteTo(di, hn::LoadU(d8, c + i - j)), j * bits));
    w = hn::And(w, mask);
    hn::StoreU(hn::Mul(hn::GatherIndex(df, lut, w), vs), df, out + i);
  }
  for (; i < (size_t)dim; ++i) {
    unsigned w = 0;
    for (int j = 0; j < P; ++j) w |= (unsigned)c[(ptrdiff_t)i - j] << (j * bits);
    out[i] = lut[w & 255u] * s;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace tq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tq {
HWY_EXPORT(TrellisValues);

void trellis_decode_scaled(const TrellisCode& tc, const uint8_t* codes, float s, float* out) noexcept {
  if (simd::use_scalar() || tc.window_bits() != 8) {
    for (int i = 0; i < tc.dim; ++i) out[i] = tc.lut[tc.window(codes, i)] * s;
    return;
  }
  const int P = (8 + tc.bits - 1) / tc.bits;
  uint8_t buf[1024 + 8];
  uint8_t* ext = buf;
  std::unique_ptr<uint8_t[]> big;
  if (tc.dim + P > (int)sizeof(buf)) {
    big.reset(new uint8_t[(size_t)tc.dim + P]);
    ext = big.get();
  }
  for (int j = 0; j < P; ++j) ext[j] = codes[((tc.dim - P + j) % tc.dim + tc.dim) % tc.dim];
  std::memcpy(ext + P, codes, (size_t)tc.dim);
  HWY_DYNAMIC_DISPATCH(TrellisValues)(tc.lut.data(), tc.bits, tc.dim, ext, s, out);
}
}  // namespace tq
#endif
