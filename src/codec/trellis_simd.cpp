// SIMD kernels of the trellis codes (Highway, dispatched per call).
//   ViterbiPass: one pass of the encoder's search, N new states per vector; the same float
//     operations in the same order as viterbi_any in trellis.cpp (the reference), so the same
//     codes at every level (this file is compiled with -ffp-contract=off: no fused multiply-add).
//     The path cost into window w is the old state's, cost[w >> bits]: N consecutive windows
//     read N / 2^bits consecutive old states, one unaligned load and one in-register lookup.
//   TrellisValues: out[i] = s * lut[w_i], w_i = the last 8 bits of the code stream up to code i
//     (circular), from a copy of the codes with the last ones in front (so every window is a few
//     unaligned loads), shifts, ORs and one gather; the same products as the reference.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "codec/trellis_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
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

// cost, next: S + N floats (the loads past S read padding); back: D x S. Returns the final
// state (start / end < 0: free), or -1 when S is not a multiple of the vector length.
int ViterbiPass(const float* HWY_RESTRICT lut, int k, int s, int D, const float* HWY_RESTRICT u, int start,
                int end, uint8_t* HWY_RESTRICT codes, float* HWY_RESTRICT cost, float* HWY_RESTRICT next,
                uint8_t* HWY_RESTRICT back) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const int N = (int)hn::Lanes(df);
  const int S = 1 << s, K = 1 << k;
  if (S % N != 0) return -1;
  const float inf = std::numeric_limits<float>::infinity();
  for (int n = 0; n < S + N; ++n) cost[n] = next[n] = 0.f;
  if (start >= 0) {
    for (int n = 0; n < S; ++n) cost[n] = inf;
    cost[start] = 0.f;
  }
  const auto rep = hn::IndicesFromVec(df, hn::ShiftRightSame(hn::Iota(di, 0), k));  // lane >> k
  for (int i = 0; i < D; ++i) {
    const float x = std::isnan(u[i]) ? 0.f : u[i];
    const auto vx = hn::Set(df, x);
    uint8_t* bk = back + (size_t)i * S;
    for (int n0 = 0; n0 < S; n0 += N) {
      const auto c0 = hn::TableLookupLanes(hn::LoadU(df, cost + (n0 >> k)), rep);
      const auto e0 = hn::Sub(vx, hn::LoadU(df, lut + n0));
      auto best = hn::Add(c0, hn::Mul(e0, e0));
      auto arg = hn::Zero(di);
      for (int h = 1; h < K; ++h) {
        const int w0 = h * S + n0;
        const auto ch = hn::TableLookupLanes(hn::LoadU(df, cost + (w0 >> k)), rep);
        const auto e = hn::Sub(vx, hn::LoadU(df, lut + w0));
        const auto c = hn::Add(ch, hn::Mul(e, e));
        const auto lt = hn::Lt(c, best);
        best = hn::IfThenElse(lt, c, best);
        arg = hn::IfThenElse(hn::RebindMask(di, lt), hn::Set(di, h), arg);
      }
      hn::StoreU(best, df, next + n0);
      hn::StoreU(hn::DemoteTo(d8, arg), d8, bk + n0);
    }
    std::swap(cost, next);
  }
  int st = end;
  if (st < 0) st = (int)(std::min_element(cost, cost + S) - cost);
  const int fin = st;
  for (int i = D - 1; i >= 0; --i) {
    const int w = (back[(size_t)i * S + st] << s) | st;
    codes[i] = (uint8_t)(w & (K - 1));
    st = w >> k;
  }
  return fin;
}

}  // namespace HWY_NAMESPACE
}  // namespace tq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tq {
HWY_EXPORT(TrellisValues);
HWY_EXPORT(ViterbiPass);

namespace detail {
int viterbi_pass_simd(const TrellisCode& tc, int D, const float* u, int start, int end, uint8_t* codes, float* cost,
                      float* next, uint8_t* back) {
  if (simd::use_scalar()) return -1;
  return HWY_DYNAMIC_DISPATCH(ViterbiPass)(tc.lut.data(), tc.bits, tc.state_bits, D, u, start, end, codes, cost,
                                           next, back);
}
}  // namespace detail

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
  for (int j = 0; j < P; ++j) ext[j] = codes[tc.dim - P + j];  // dim >= P: dim * bits >= 8
  std::memcpy(ext + P, codes, (size_t)tc.dim);
  HWY_DYNAMIC_DISPATCH(TrellisValues)(tc.lut.data(), tc.bits, tc.dim, ext, s, out);
}
}  // namespace tq
#endif
