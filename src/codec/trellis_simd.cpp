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

// The forward passes of ViterbiPass over the D coordinates (cost: the path costs before
// coordinate 0). Returns the buffer of the path costs after the last one (cost or next).
//   kOneState (2^k >= N): the N windows of a candidate share one old state, whose cost is
//     one broadcast load (else an unaligned load of the N >> k old states and a lookup).
//   kChains (2^k >= 8): the least of a state's 2^k candidates from four chains over their
//     quarters, merged in order: the same minimum and the same index (the lowest h on a tie,
//     as one chain keeps the first strict minimum) with a quarter of the dependent steps. One
//     chain over 16 candidates bound the 4-bit code, one chunk of states per coordinate, by
//     its latency; at 2 bits the 4 chunks overlap already and the chains only add work.
template <bool kOneState, bool kChains, class DF>
HWY_INLINE float* ViterbiPositions(DF df, const float* HWY_RESTRICT lut, int k, int s, int D,
                                   const float* HWY_RESTRICT u, float* cost, float* next, uint8_t* HWY_RESTRICT back) {
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint8_t, DF> d8;
  using VF = hn::Vec<DF>;
  using VI = hn::Vec<decltype(di)>;
  const int N = (int)hn::Lanes(df);
  const int S = 1 << s, K = 1 << k, Q = K / 4;
  const auto rep = hn::IndicesFromVec(df, hn::ShiftRightSame(hn::Iota(di, 0), k));  // lane >> k
  // The path cost through windows h * S + n0.. (N lanes): the old state's cost plus the error.
  const auto cand = [&](VF vx, int h, int n0) {
    const int w0 = h * S + n0;
    const auto e = hn::Sub(vx, hn::LoadU(df, lut + w0));
    const VF c = kOneState ? hn::Set(df, cost[w0 >> k]) : hn::TableLookupLanes(hn::LoadU(df, cost + (w0 >> k)), rep);
    return hn::Add(c, hn::Mul(e, e));
  };
  // Keeps the lesser of (best, arg) and (c, h); on a tie (best, arg).
  const auto take = [&](VF& best, VI& arg, VF c, VI h) {
    const auto lt = hn::Lt(c, best);
    best = hn::IfThenElse(lt, c, best);
    arg = hn::IfThenElse(hn::RebindMask(di, lt), h, arg);
  };
  for (int i = 0; i < D; ++i) {
    const float x = std::isnan(u[i]) ? 0.f : u[i];
    const auto vx = hn::Set(df, x);
    uint8_t* bk = back + (size_t)i * S;
    for (int n0 = 0; n0 < S; n0 += N) {
      VF best = cand(vx, 0, n0);
      VI arg = hn::Zero(di);
      if (kChains) {
        VF b1 = cand(vx, Q, n0), b2 = cand(vx, 2 * Q, n0), b3 = cand(vx, 3 * Q, n0);
        VI a1 = hn::Set(di, Q), a2 = hn::Set(di, 2 * Q), a3 = hn::Set(di, 3 * Q);
        for (int h = 1; h < Q; ++h) {
          take(best, arg, cand(vx, h, n0), hn::Set(di, h));
          take(b1, a1, cand(vx, Q + h, n0), hn::Set(di, Q + h));
          take(b2, a2, cand(vx, 2 * Q + h, n0), hn::Set(di, 2 * Q + h));
          take(b3, a3, cand(vx, 3 * Q + h, n0), hn::Set(di, 3 * Q + h));
        }
        take(best, arg, b1, a1);
        take(b2, a2, b3, a3);
        take(best, arg, b2, a2);
      } else {
        for (int h = 1; h < K; ++h) take(best, arg, cand(vx, h, n0), hn::Set(di, h));
      }
      hn::StoreU(best, df, next + n0);
      hn::StoreU(hn::DemoteTo(d8, arg), d8, bk + n0);
    }
    std::swap(cost, next);
  }
  return cost;
}

// cost, next: S + N floats (the loads past S read padding); back: D x S. Returns the final
// state (start / end < 0: free), or -1 when S is not a multiple of the vector length.
int ViterbiPass(const float* HWY_RESTRICT lut, int k, int s, int D, const float* HWY_RESTRICT u, int start,
                int end, uint8_t* HWY_RESTRICT codes, float* HWY_RESTRICT cost, float* HWY_RESTRICT next,
                uint8_t* HWY_RESTRICT back) {
  const hn::ScalableTag<float> df;
  const int N = (int)hn::Lanes(df);
  const int S = 1 << s, K = 1 << k;
  if (S % N != 0) return -1;
  const float inf = std::numeric_limits<float>::infinity();
  for (int n = 0; n < S + N; ++n) cost[n] = next[n] = 0.f;
  if (start >= 0) {
    for (int n = 0; n < S; ++n) cost[n] = inf;
    cost[start] = 0.f;
  }
  if (K >= N && K >= 8) cost = ViterbiPositions<true, true>(df, lut, k, s, D, u, cost, next, back);
  else if (K >= N) cost = ViterbiPositions<true, false>(df, lut, k, s, D, u, cost, next, back);
  else if (K >= 8) cost = ViterbiPositions<false, true>(df, lut, k, s, D, u, cost, next, back);
  else cost = ViterbiPositions<false, false>(df, lut, k, s, D, u, cost, next, back);
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
