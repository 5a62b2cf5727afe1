// Fused decode attention for TurboQuant codes in float arithmetic, Highway-dispatched (every
// x86 level from SSE4 up; the scalar level uses the row path). The default tq kernel.
//
// Everything stays in the rotated domain: the query was rotated once by the driver, the
// output is inverse-rotated once after the merge. Per 32-token block of one kv head:
//
//  K  The bit planes of a K tile (16 tokens x 4 dims) become code bytes with one masked byte
//     op per plane (LoadMaskBits); lane t of the u32 view holds the 4 codes of token t, so a
//     shift by 8 i and one in-register table lookup (TableLookupLanes: vpermps on AVX-512 and
//     AVX2) give the float centroids of dim 4k+i for N tokens, and one FMA per query head with
//     the broadcast rotated query value accumulates the scores. The expansion and the lookup
//     are shared by the G heads of the group; no horizontal sums.
//  softmax  scores norm_t * raw * scale, block max, vector exp, running (m, l).
//  V  Weights w_t = p_t * norm_t stay float; a V tile (16 dims x 4 tokens) gives per token one
//     lookup (N dims) and one FMA per head.
//
// Only the centroid table is "decoded", and it holds the codebook's exact floats: the output
// equals attention_ref on the same codes up to float summation order (tests: 1e-5).
//
// Prefill (several queries per call): a pass of up to kPassRows query rows expands each
// block's K and V values to float tiles once (ExpandK / ExpandV, the same expansion as above
// with stores in place of FMAs) and decodes its norms once; the pass's queries then go through
// the tiles kStepRows / G at a time as one set of rows, which also gives the FMA chains (latency
// bound at G rows) more independent work. Every row's sums run in the one-query order, so each
// query's output is bit for bit that of its own one-query call.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/attention_tq_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kv/attention_kernels.h"
#include "tq/codebook.h"
#include "tq/trellis.h"

HWY_BEFORE_NAMESPACE();
namespace tq::kv {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
#include "kv/block_softmax-inl.h"

#if HWY_TARGET != HWY_SCALAR
using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;
using DB = hn::Repartition<uint8_t, DU>;
using VF = hn::Vec<DF>;
using VU = hn::Vec<DU>;

constexpr size_t kN = hn::MaxLanes(DF());  // x86 targets: Lanes == MaxLanes (checked)
constexpr int kMaxSlices = 4;  // in-register tables up to 4 N entries; larger ones are gathered
template <int B>
constexpr int slices() {
  return (1 << B) <= (int)kN * kMaxSlices ? (int)(((1 << B) + kN - 1) / kN) : 0;  // 0: gather
}

// The 2^b centroids of one codebook: in registers as slices of N floats, and in memory for
// the gather fallback.
struct Table {
  HWY_ALIGN float mem[256];
  VF reg[kMaxSlices];
};

void make_table(const Codebook* cb, const TrellisCode* tc, Table* T) {
  const std::vector<float>& cs = tc ? tc->lut : cb->centroids;
  const DF df;
  std::fill(T->mem, T->mem + 256, 0.f);
  for (size_t j = 0; j < cs.size() && j < 256; ++j) T->mem[j] = cs[j];
  for (int s = 0; s < kMaxSlices; ++s) T->reg[s] = hn::Load(df, T->mem + s * kN);
}

// Centroids of the codes in the low byte of each u32 lane (upper bytes ignored).
template <int B>
HWY_INLINE VF lookup(const Table& T, VU u) {
  const DF df;
  const DU du;
  const DI di;
  constexpr int S = slices<B>();
#if HWY_TARGET <= HWY_AVX3
  // vpermps / vpermt2ps read only the low 4 / 5 bits of each index: no masking, one op.
  if constexpr (S == 1) return VF{_mm512_permutexvar_ps(u.raw, T.reg[0].raw)};
  if constexpr (S == 2) return VF{_mm512_permutex2var_ps(T.reg[0].raw, u.raw, T.reg[1].raw)};
#elif HWY_TARGET == HWY_AVX2
  // vpermps reads the low 3 bits; bit 3 picks the slice through the sign bit for blendv.
  if constexpr (S == 1) return VF{_mm256_permutevar8x32_ps(T.reg[0].raw, u.raw)};
  if constexpr (S == 2)
    return VF{_mm256_blendv_ps(_mm256_permutevar8x32_ps(T.reg[0].raw, u.raw),
                               _mm256_permutevar8x32_ps(T.reg[1].raw, u.raw),
                               _mm256_castsi256_ps(_mm256_slli_epi32(u.raw, 28)))};
#endif
  if constexpr (S == 0) {
    return hn::GatherIndex(df, T.mem, hn::BitCast(di, hn::And(u, hn::Set(du, (1u << B) - 1))));
  } else {
    constexpr uint32_t lane_mask = (uint32_t)std::min<size_t>(kN, (size_t)1 << B) - 1;
    const auto ind = hn::IndicesFromVec(df, hn::BitCast(di, hn::And(u, hn::Set(du, lane_mask))));
    VF r = hn::TableLookupLanes(T.reg[0], ind);
    if constexpr (S > 1) {
      constexpr int lg = kN == 4 ? 2 : kN == 8 ? 3 : kN == 16 ? 4 : 5;
      const VU slice = hn::And(hn::ShiftRight<lg>(u), hn::Set(du, (uint32_t)(S - 1)));
      for (int s = 1; s < S; ++s)
        r = hn::IfThenElse(hn::RebindMask(df, hn::Eq(slice, hn::Set(du, (uint32_t)s))),
                           hn::TableLookupLanes(T.reg[s], ind), r);
    }
    return r;
  }
}

// Code bytes of part j (4N of the 64 codes) of a tile stored as B planes of 8 bytes.
template <int B>
HWY_INLINE VU tile_part(const uint8_t* planes, size_t j) {
  const DB db;
  const DU du;
  constexpr size_t nb = 4 * kN;  // codes per part: nb / 8 bytes of each plane
  auto idx = hn::Zero(db);
  for (int p = 0; p < B; ++p) {
    const auto m = hn::LoadMaskBits(db, planes + (size_t)p * 8 + j * (nb / 8));
    idx = hn::Or(idx, hn::IfThenElseZero(m, hn::Set(db, (uint8_t)(1u << p))));
  }
  return hn::BitCast(du, idx);
}

template <int I>
HWY_INLINE VU byte_of(VU u) {
  return hn::ShiftRight<8 * I>(u);
}

// f(I) for the byte index I = 0 .. 3 of a u32 lane, as a compile-time constant.
template <class F>
HWY_INLINE void each_byte(F&& f) {
  f(std::integral_constant<int, 0>{});
  f(std::integral_constant<int, 1>{});
  f(std::integral_constant<int, 2>{});
  f(std::integral_constant<int, 3>{});
}

// Trellis codes (include/tq/trellis.h): the value of dim d is lut[w], w = the last 8 bits of
// the token's code stream up to dim d (circular). code_of: the code in byte i of each lane.
HWY_INLINE VU code_of(VU u, int i) {
  return hn::And(hn::ShiftRightSame(u, 8 * i), hn::Set(DU(), 0xFFu));
}

// K values of one N-token part j of a block: f(d, c0, c1) for every dim d in order, c0 holding
// dim d of token slots j N .. j N + N - 1 and c1 of slots 16 + j N .. (the two 16-token halves
// together; slots past the block's tokens hold the values of zero codes). kTrellis: the value is
// lut[window] of the token's code stream (see the comment above code_of): each lane keeps its
// token's stream register (R = R << B | code, the dims in order, preloaded with the last dims'
// codes for the wrap) and one gather per dim replaces the lookup.
template <int B, bool kTrellis, class F>
HWY_INLINE void KColumns(const uint8_t* tiles, int dim, const Table& T, size_t j, F&& f) {
  const DF df;
  const DU du;
  const DI di;
  constexpr int P = (8 + B - 1) / B;  // trellis: codes per window
  const int nq = dim / 4;
  const size_t tile_bytes = (size_t)B * 8;
  const uint8_t* half1 = tiles + (size_t)nq * tile_bytes;
  const auto m8 = hn::Set(du, 0xFFu);
  VU r0 = hn::Zero(du), r1 = hn::Zero(du);
  if constexpr (kTrellis) {
    for (int d = dim - (P - 1); d < dim; ++d) {  // the wrap: the last P - 1 dims' codes
      const int k = d / 4;
      r0 = hn::Or(hn::ShiftLeft<B>(r0), code_of(tile_part<B>(tiles + (size_t)k * tile_bytes, j), d % 4));
      r1 = hn::Or(hn::ShiftLeft<B>(r1), code_of(tile_part<B>(half1 + (size_t)k * tile_bytes, j), d % 4));
    }
  }
  for (int k = 0; k < nq; ++k) {
    const VU u0 = tile_part<B>(tiles + (size_t)k * tile_bytes, j);
    const VU u1 = tile_part<B>(half1 + (size_t)k * tile_bytes, j);
    auto step = [&](auto I) {
      constexpr int i = decltype(I)::value;
      if constexpr (kTrellis) {
        r0 = hn::Or(hn::ShiftLeft<B>(r0), code_of(u0, i));
        r1 = hn::Or(hn::ShiftLeft<B>(r1), code_of(u1, i));
        f(4 * k + i, hn::GatherIndex(df, T.mem, hn::BitCast(di, hn::And(r0, m8))),
          hn::GatherIndex(df, T.mem, hn::BitCast(di, hn::And(r1, m8))));
      } else {
        f(4 * k + i, lookup<B>(T, byte_of<i>(u0)), lookup<B>(T, byte_of<i>(u1)));
      }
    };
    each_byte(step);
  }
}

// K: raw[g][32] = sum_d q[g][d] * c(t, d) for the 32 token slots of a block (the caller masks
// the slots past its tokens), the sum over d in order from zero, whatever cols reads the values
// from (the codes or an expanded tile): cols(j, f) calls f(d, c0, c1) as KColumns does. Each
// N-token part runs both 16-token halves together: 2 G independent FMA chains.
template <int G, class Cols>
HWY_INLINE void ScoreWith(int dim, const float* q, float* raw, Cols&& cols) {
  const DF df;
  for (size_t j = 0; j < 16 / kN; ++j) {
    VF a0[G], a1[G];
    for (int g = 0; g < G; ++g) a0[g] = a1[g] = hn::Zero(df);
    cols(j, [&](int d, VF c0, VF c1) HWY_ATTR {
      for (int g = 0; g < G; ++g) {
        const VF qv = hn::Set(df, q[(size_t)g * dim + d]);
        a0[g] = hn::MulAdd(c0, qv, a0[g]);
        a1[g] = hn::MulAdd(c1, qv, a1[g]);
      }
    });
    for (int g = 0; g < G; ++g) {
      hn::Store(a0[g], df, raw + g * 32 + j * kN);
      hn::Store(a1[g], df, raw + g * 32 + 16 + j * kN);
    }
  }
}

// Scores from the codes (one query: the expansion feeds the FMAs directly).
template <int G, int B, bool kTrellis = false>
void ScoreBlock(const uint8_t* tiles, int dim, const float* q, const Table& T, float* raw) {
  ScoreWith<G>(dim, q, raw,
               [&](size_t j, auto&& f) HWY_ATTR { KColumns<B, kTrellis>(tiles, dim, T, j, f); });
}

// Scores from an expanded K tile (ExpandK): the same sums.
template <int G>
void ScoreTile(const float* kt, int dim, const float* q, float* raw) {
  const DF df;
  ScoreWith<G>(dim, q, raw, [&](size_t j, auto&& f) HWY_ATTR {
    for (int d = 0; d < dim; ++d)
      f(d, hn::Load(df, kt + (size_t)d * 32 + j * kN), hn::Load(df, kt + (size_t)d * 32 + 16 + j * kN));
  });
}

// A block's K values once for several queries: kt[d 32 + t] (dim-major, 32 token slots).
template <int B, bool kTrellis = false>
void ExpandK(const uint8_t* tiles, int dim, const Table& T, float* kt) {
  const DF df;
  for (size_t j = 0; j < 16 / kN; ++j)
    KColumns<B, kTrellis>(tiles, dim, T, j, [&](int d, VF c0, VF c1) HWY_ATTR {
      hn::Store(c0, df, kt + (size_t)d * 32 + j * kN);
      hn::Store(c1, df, kt + (size_t)d * 32 + 16 + j * kN);
    });
}

// V values of N-dim columns c0 and c1 (column c: tile column c / (16 / N), part c % (16 / N)):
// f(t, v0, v1) for token slots t = 0 .. 4 nr - 1 in order.
template <int B, class F>
HWY_INLINE void VColumnPair(const uint8_t* tiles, int nr, int c0, int c1, const Table& T, F&& f) {
  const size_t tile_bytes = (size_t)B * 8;
  const int per = 16 / (int)kN;
  const uint8_t* t0 = tiles + (size_t)(c0 / per) * 8 * tile_bytes;
  const uint8_t* t1 = tiles + (size_t)(c1 / per) * 8 * tile_bytes;
  const size_t j0 = (size_t)(c0 % per), j1 = (size_t)(c1 % per);
  for (int r = 0; r < nr; ++r) {
    const VU u0 = tile_part<B>(t0 + (size_t)r * tile_bytes, j0);
    const VU u1 = tile_part<B>(t1 + (size_t)r * tile_bytes, j1);
    auto step = [&](auto I) {
      constexpr int i = decltype(I)::value;
      f(4 * r + i, lookup<B>(T, byte_of<i>(u0)), lookup<B>(T, byte_of<i>(u1)));
    };
    each_byte(step);
  }
}

// Trellis V values of N-dim column c: f(t, v) for t = 0 .. 4 nr - 1. Lane = dim, so the window
// of dim d needs the codes of lanes d - 1 .. d - P + 1: the column's code vector and the
// previous column's (the last one for column 0) side by side in memory, read back shifted by
// one lane per step (needs P - 1 <= N: 8+ lanes, checked by decode_tq_supported).
template <int B, class F>
HWY_INLINE void VColumnT(const uint8_t* tiles, int dim, int nr, int c, const Table& T, F&& f) {
  const DF df;
  const DU du;
  const DI di;
  constexpr size_t N = kN;
  constexpr int P = (8 + B - 1) / B;
  const size_t tile_bytes = (size_t)B * 8;
  const int ncol = dim / (int)N;
  const int per = 16 / (int)N;
  const auto m8 = hn::Set(du, 0xFFu);
  auto column = [&](int cc, int r) HWY_ATTR {
    return tile_part<B>(tiles + (size_t)(cc / per) * 8 * tile_bytes + (size_t)r * tile_bytes, (size_t)(cc % per));
  };
  // [N spare][previous column][column], the stores aligned; the shifted loads start at most 7
  // lanes before the column (still inside the buffer for every N >= 4)
  HWY_ALIGN uint32_t buf[3 * kN];
  const int cp = c == 0 ? ncol - 1 : c - 1;
  for (int r = 0; r < nr; ++r) {
    hn::Store(column(cp, r), du, buf + N);
    hn::Store(column(c, r), du, buf + 2 * N);
    // win: byte i of lane l holds token 4r + i's window bits (codes packed B bits apart).
    VU sh[P];
    for (int j = 0; j < P; ++j) sh[j] = hn::LoadU(du, buf + 2 * N - j);
    for (int i = 0; i < 4; ++i) {
      VU wv = code_of(sh[0], i);
      for (int j = 1; j < P; ++j) wv = hn::Or(wv, hn::ShiftLeftSame(code_of(sh[j], i), j * B));
      f(4 * r + i, hn::GatherIndex(df, T.mem, hn::BitCast(di, hn::And(wv, m8))));
    }
  }
}

// V: accv[g][d] = sum_t w[g][t] * c(t, d), t = 0 .. 4 ceil(nt / 4) - 1 in order from zero (w = 0
// past the block's tokens), whatever cols reads the values from: cols(nr, c0, c1, f) calls
// f(t, v0, v1) as VColumnPair does. Two N-dim columns at once: 2 G independent FMA chains.
template <int G, class Cols>
HWY_INLINE void AccumWith(int dim, int nt, const float* w, float* accv, Cols&& cols) {
  const DF df;
  const int nr = (nt + 3) / 4;
  const int ncol = dim / (int)kN;
  for (int c = 0; c < ncol; c += 2) {
    const bool two = c + 1 < ncol;
    const int c1 = two ? c + 1 : c;
    VF a0[G], a1[G];
    for (int g = 0; g < G; ++g) a0[g] = a1[g] = hn::Zero(df);
    cols(nr, c, c1, [&](int t, VF v0, VF v1) HWY_ATTR {
      for (int g = 0; g < G; ++g) {
        const VF wv = hn::Set(df, w[g * 32 + t]);
        a0[g] = hn::MulAdd(wv, v0, a0[g]);
        a1[g] = hn::MulAdd(wv, v1, a1[g]);
      }
    });
    for (int g = 0; g < G; ++g) {
      hn::Store(a0[g], df, accv + (size_t)g * dim + (size_t)c * kN);
      if (two) hn::Store(a1[g], df, accv + (size_t)g * dim + (size_t)c1 * kN);
    }
  }
}

template <int G, int B>
void AccumBlock(const uint8_t* tiles, int dim, int nt, const float* w, const Table& T, float* accv) {
  AccumWith<G>(dim, nt, w, accv, [&](int nr, int c0, int c1, auto&& f) HWY_ATTR {
    VColumnPair<B>(tiles, nr, c0, c1, T, f);
  });
}

// Trellis V from the codes: one column (one FMA chain per head) at a time.
template <int G, int B>
void AccumBlockT(const uint8_t* tiles, int dim, int nt, const float* w, const Table& T, float* accv) {
  const DF df;
  const int nr = (nt + 3) / 4;
  for (int c = 0; c < dim / (int)kN; ++c) {
    VF a[G];
    for (int g = 0; g < G; ++g) a[g] = hn::Zero(df);
    VColumnT<B>(tiles, dim, nr, c, T, [&](int t, VF v) HWY_ATTR {
      for (int g = 0; g < G; ++g) a[g] = hn::MulAdd(hn::Set(df, w[g * 32 + t]), v, a[g]);
    });
    for (int g = 0; g < G; ++g) hn::Store(a[g], df, accv + (size_t)g * dim + (size_t)c * kN);
  }
}

// V from an expanded tile (ExpandV): the same sums.
template <int G>
void AccumTile(const float* vt, int dim, int nt, const float* w, float* accv) {
  const DF df;
  AccumWith<G>(dim, nt, w, accv, [&](int nr, int c0, int c1, auto&& f) HWY_ATTR {
    for (int t = 0; t < 4 * nr; ++t)
      f(t, hn::Load(df, vt + (size_t)t * dim + (size_t)c0 * kN), hn::Load(df, vt + (size_t)t * dim + (size_t)c1 * kN));
  });
}

// A block's V values once for several queries: vt[t dim + d] (token-major, 32 token slots).
template <int B, bool kTrellis = false>
void ExpandV(const uint8_t* tiles, int dim, const Table& T, float* vt) {
  const DF df;
  const int ncol = dim / (int)kN;
  if constexpr (kTrellis) {
    for (int c = 0; c < ncol; ++c)
      VColumnT<B>(tiles, dim, kBlock / 4, c, T,
                  [&](int t, VF v) HWY_ATTR { hn::Store(v, df, vt + (size_t)t * dim + (size_t)c * kN); });
  } else {
    for (int c = 0; c < ncol; c += 2) {
      const int c1 = c + 1 < ncol ? c + 1 : c;
      VColumnPair<B>(tiles, kBlock / 4, c, c1, T, [&](int t, VF v0, VF v1) HWY_ATTR {
        hn::Store(v0, df, vt + (size_t)t * dim + (size_t)c * kN);
        hn::Store(v1, df, vt + (size_t)t * dim + (size_t)c1 * kN);
      });
    }
  }
}

using ScoreFn = void (*)(const uint8_t*, int, const float*, const Table&, float*);
using AccumFn = void (*)(const uint8_t*, int, int, const float*, const Table&, float*);
using ExpandFn = void (*)(const uint8_t*, int, const Table&, float*);
struct PartFns {
  ScoreFn score = nullptr;      // K, from the codes
  AccumFn accum = nullptr;      // V, from the codes
  ExpandFn expand_k = nullptr;  // K tile for several queries
  ExpandFn expand_v = nullptr;  // V tile for several queries
};
template <int G, int B = 1>
void pick(int bits, bool trellis, PartFns* f) {
  if constexpr (B <= 8) {
    if (bits == B) {
      if constexpr (B <= 4) {
        if (trellis) {
          *f = {ScoreBlock<G, B, true>, AccumBlockT<G, B>, ExpandK<B, true>, ExpandV<B, true>};
          return;
        }
      }
      *f = {ScoreBlock<G, B>, AccumBlock<G, B>, ExpandK<B>, ExpandV<B>};
      return;
    }
    pick<G, B + 1>(bits, trellis, f);
  }
}

// Several queries (prefill): each pass takes up to kPassRows query rows through the range, and
// every block's K and V tiles are expanded to floats (ExpandK / ExpandV) and its norms decoded
// once per pass instead of once per query. Within a pass the queries go kStepRows / G at a time
// through ScoreTile / AccumTile as one set of rows: more independent FMA chains per tile read
// (the chains are latency-bound at G rows) and the same arithmetic per row.
constexpr int kPassRows = 64;
constexpr int kStepRows = kN >= 16 ? 9 : 6;  // 2 R accumulators + 3 live vectors: 32 / 16 registers
template <int G>
constexpr int step_queries() {
  return G >= kStepRows ? 1 : kStepRows / G;
}

// Per-thread scratch, 64-byte aligned, grown on demand.
float* scratch_floats(size_t n) {
  thread_local hwy::AlignedFreeUniquePtr<float[]> buf;
  thread_local size_t cap = 0;
  if (n > cap) {
    buf = hwy::AllocateAligned<float>(n);
    TQ_CHECK(buf != nullptr, "out of memory for the attention scratch");
    cap = n;
  }
  return buf.get();
}

constexpr size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

// nq queries (rows i G .. i G + G - 1 of qd, causal limits[i]) over tokens [a, b). One query
// scores from the codes; several go through each block from expanded tiles. Each row's
// arithmetic is the same either way (ScoreWith, AccumWith: the sums in the same order, from
// zero; extra zero weights past a query's last token add exact zeros), so a prefill call gives
// every query the result of its own one-query call, bit for bit.
template <int G>
void DecodeTqG(const Shape& sh, const Stream& sk, const Stream& sv, int nq, const float* qd, const int* limits,
               int a, int b, const States& st) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const size_t N = hn::Lanes(df);
  constexpr size_t NV = 32 / kN;  // score vectors per row per block
  Part pk[2], pv[2];
  const int npk = parts_of(sk, pk), npv = parts_of(sv, pv);
  Table tk[2], tv[2];
  PartFns fk[2], fv[2];
  for (int i = 0; i < npk; ++i) {
    make_table(pk[i].cb, pk[i].tc, &tk[i]);
    pick<G>(pk[i].bits, pk[i].tc != nullptr, &fk[i]);
  }
  for (int i = 0; i < npv; ++i) {
    make_table(pv[i].cb, pv[i].tc, &tv[i]);
    pick<G>(pv[i].bits, pv[i].tc != nullptr, &fv[i]);
  }
  const bool tiles = nq > 1;
  constexpr int S = step_queries<G>();
  // Queries per pass: a multiple of the step (the last step's missing queries are zero rows).
  const int QB = tiles ? S * std::max(1, kPassRows / (S * G)) : 1;
  // Scratch: the pass's query rows per K part ([QB][G][dim], so a step's rows are contiguous),
  // each query's RoPE-mean terms, and the K and V tiles (32 x dim floats per part; unused by a
  // one-query call, but reserved so every pointer below lies inside the buffer).
  const bool rope = sh.rope_mc != nullptr;
  const size_t r_floats = rope ? round16((size_t)G * rope_terms_stride()) : 0;
  const size_t q_part[2] = {round16((size_t)QB * G * pk[0].dim), npk > 1 ? round16((size_t)QB * G * pk[1].dim) : 0};
  const size_t kt_part[2] = {(size_t)pk[0].dim * 32, npk > 1 ? (size_t)pk[1].dim * 32 : 0};
  const size_t vt_part[2] = {(size_t)pv[0].dim * 32, npv > 1 ? (size_t)pv[1].dim * 32 : 0};
  // Several queries with a RoPE-rotating K mean: the blocks' angles, turned once for all of them.
  const size_t ang_floats = rope && tiles ? round16(rope_angles_floats(sk)) : 0;
  float* mem = scratch_floats(q_part[0] + q_part[1] + QB * r_floats + kt_part[0] + kt_part[1] + vt_part[0] +
                             vt_part[1] + ang_floats);
  float* qs[2] = {mem, mem + q_part[0]};
  float* rts = qs[1] + q_part[1];
  float* ktp[2] = {rts + QB * r_floats, rts + QB * r_floats + kt_part[0]};
  float* vtp[2] = {ktp[1] + kt_part[1], ktp[1] + kt_part[1] + vt_part[0]};
  const float* angles = nullptr;
  if (ang_floats) {
    int end = a;
    for (int i = 0; i < nq; ++i) end = std::max(end, std::min(b, limits[i]));
    if (end > a) {
      float* cs = vtp[1] + vt_part[1];
      rope_block_angles(sk, a / kBlock, (end - a + kBlock - 1) / kBlock, cs);
      angles = cs;
    }
  }
  HWY_ALIGN float nk[2][32], nv[2][32];
  HWY_ALIGN float p[32];
  auto load_norms = [&](const uint8_t* blk, const Part& P, float* out) HWY_ATTR {
    if (P.n8) {  // norm = 2^(e / 32) * n8_pow_table()[c]; c = 255: 0
      const float* kPow = n8_pow_table();
      const float base = n8_block_base(blk + P.norm_off);
      const uint8_t* c = blk + P.norm_off + 2;
      for (int t = 0; t < 32; ++t) out[t] = base * kPow[c[t]];
      return;
    }
    const hwy::float16_t* h = reinterpret_cast<const hwy::float16_t*>(blk + P.norm_off);
    for (size_t t = 0; t < 32; t += N) hn::Store(hn::PromoteTo(df, hn::LoadU(dh, h + t)), df, out + t);
  };
  int ends[kPassRows];
  // One block for queries q .. q + R / G - 1 of the pass (rows of the pass's query and state
  // arrays): scores of every row (score(i, rows of part i, raw)), then softmax, V (accum(i, nt,
  // w, accv)) and the output for the rows whose query sees the block.
  auto block_step = [&]<int R>(std::integral_constant<int, R>, int q0, int q, int t0, auto&& score,
                               auto&& accum) HWY_ATTR {
    constexpr int Q = R / G;
    HWY_ALIGN float raw[2][R * 32];
    HWY_ALIGN float w[2][R * 32];
    HWY_ALIGN float accv[R * kMaxHeadDim];
    float alpha[R];
    int nt[Q];
    int nt_max = 0;
    for (int j = 0; j < Q; ++j) {
      nt[j] = std::clamp(ends[q + j] - t0, 0, kBlock);  // 0: the query does not see the block
      nt_max = std::max(nt_max, nt[j]);
    }
    VF s[R][NV];
    for (int r = 0; r < R; ++r)
      for (size_t v = 0; v < NV; ++v) s[r][v] = hn::Zero(df);
    for (int i = 0; i < npk; ++i) {
      score(i, qs[i] + (size_t)q * G * pk[i].dim, raw[i]);
      for (int r = 0; r < R; ++r)
        for (size_t v = 0; v < NV; ++v)
          s[r][v] = hn::MulAdd(hn::Load(df, raw[i] + r * 32 + v * N), hn::Load(df, nk[i] + v * N), s[r][v]);
    }
    if (rope) {  // RoPE-rotating K mean: its logit terms (rope_block_terms)
      const int F = rope_fast_pairs(sk), bi = t0 / kBlock - a / kBlock;
      const float* tx = sk.centre.rope_j + (size_t)F * 2 * kBlock;  // x, x^2
      for (int r = 0; r < R; ++r) {
        if (nt[r / G] == 0) continue;
        const float* rt = rts + (size_t)(q + r / G) * r_floats + (size_t)(r % G) * rope_terms_stride();
        for (size_t v = 0; v < NV; ++v) {
          VF acc0 = hn::MulAdd(hn::Set(df, rt[kRopeMaxBlocks + bi]), hn::LoadU(df, tx + v * N), hn::Set(df, rt[bi]));
          VF acc1 = hn::Mul(hn::Set(df, rt[2 * kRopeMaxBlocks + bi]), hn::LoadU(df, tx + kBlock + v * N));
          for (int i = 0; i < F; ++i) {
            const float* tj = sk.centre.rope_j + (size_t)i * 2 * kBlock + v * N;
            const float* ri = rt + (size_t)(kRopeSlowRows + 2 * i) * kRopeMaxBlocks + bi;
            acc0 = hn::MulAdd(hn::Set(df, ri[0]), hn::LoadU(df, tj), acc0);
            acc1 = hn::MulAdd(hn::Set(df, ri[kRopeMaxBlocks]), hn::LoadU(df, tj + kBlock), acc1);
          }
          s[r][v] = hn::Add(s[r][v], hn::Add(acc0, acc1));
        }
      }
    }
    const States sq{st.base + (size_t)(q0 + q) * G * st.stride(), st.D};  // row r of the step: r
    for (int r = 0; r < R; ++r) {
      if (nt[r / G] == 0) {  // weights 0: exact zeros in the other rows' sums, this row unused
        for (int i = 0; i < npv; ++i) std::fill(w[i] + r * 32, w[i] + r * 32 + 32, 0.f);
        continue;
      }
      alpha[r] = BlockSoftmax(df, s[r], NV, nt[r / G], sh.scale, sq, r, p);
      for (int i = 0; i < npv; ++i)
        for (size_t v = 0; v < NV; ++v)
          hn::Store(hn::Mul(hn::Load(df, p + v * N), hn::Load(df, nv[i] + v * N)), df, w[i] + r * 32 + v * N);
    }
    for (int i = 0; i < npv; ++i) {
      const Part& P = pv[i];
      accum(i, nt_max, w[i], accv);
      for (int r = 0; r < R; ++r) {
        if (nt[r / G] == 0) continue;
        float* o = sq.acc(r) + P.off;
        const VF al = hn::Set(df, alpha[r]);
        for (int d = 0; d < P.dim; d += (int)N)
          hn::StoreU(hn::MulAdd(hn::LoadU(df, o + d), al, hn::Load(df, accv + (size_t)r * P.dim + d)), df, o + d);
      }
    }
  };
  for (int q0 = 0; q0 < nq; q0 += QB) {
    const int qn = std::min(QB, nq - q0);
    const int qpad = tiles ? (qn + S - 1) / S * S : 1;
    int pass_end = a;
    for (int i = 0; i < qpad; ++i) {
      const bool real = i < qn;
      ends[i] = real ? std::min(b, limits[q0 + i]) : a;  // padding: sees nothing
      pass_end = std::max(pass_end, ends[i]);
      for (int j = 0; j < npk; ++j)
        for (int g = 0; g < G; ++g) {
          float* row = qs[j] + ((size_t)i * G + g) * pk[j].dim;
          if (real)
            std::memcpy(row, qd + ((size_t)(q0 + i) * G + g) * sh.D + pk[j].off, sizeof(float) * pk[j].dim);
          else
            std::fill(row, row + pk[j].dim, 0.f);
        }
      // RoPE-rotating K mean: the terms of every block the query sees, once.
      if (rope && ends[i] > a)
        rope_block_terms(sk, sh.rope_mc + (size_t)(q0 + i) * G * rope_mc_stride(sk), G, a / kBlock,
                         (ends[i] - a + kBlock - 1) / kBlock, rts + i * r_floats, angles);
    }
    for (int t0 = a; t0 < pass_end; t0 += kBlock) {
      const uint8_t* kb = sk.block(t0 / kBlock);
      const uint8_t* vb = sv.block(t0 / kBlock);
      for (int i = 0; i < npk; ++i) {
        if (tiles) fk[i].expand_k(kb + pk[i].tiles_off, pk[i].dim, tk[i], ktp[i]);
        load_norms(kb, pk[i], nk[i]);
      }
      for (int i = 0; i < npv; ++i) {
        if (tiles) fv[i].expand_v(vb + pv[i].tiles_off, pv[i].dim, tv[i], vtp[i]);
        load_norms(vb, pv[i], nv[i]);
      }
      if (!tiles) {
        block_step(
            std::integral_constant<int, G>{}, q0, 0, t0,
            [&](int i, const float* rows, float* raw) HWY_ATTR { fk[i].score(kb + pk[i].tiles_off, pk[i].dim, rows, tk[i], raw); },
            [&](int i, int nt, const float* w, float* accv) HWY_ATTR {
              fv[i].accum(vb + pv[i].tiles_off, pv[i].dim, nt, w, tv[i], accv);
            });
        continue;
      }
      for (int q = 0; q < qpad; q += S) {
        bool sees = false;
        for (int j = 0; j < S; ++j) sees |= ends[q + j] > t0;
        if (!sees) continue;
        block_step(
            std::integral_constant<int, S * G>{}, q0, q, t0,
            [&](int i, const float* rows, float* raw) HWY_ATTR { ScoreTile<S * G>(ktp[i], pk[i].dim, rows, raw); },
            [&](int i, int nt, const float* w, float* accv) HWY_ATTR { AccumTile<S * G>(vtp[i], pv[i].dim, nt, w, accv); });
      }
    }
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

// Up to 4 heads at once (GN): each table vector is loaded once for the GN heads, and every
// head's sums run in the one-head order (the same floats for any grouping of the heads).
// cos / sin of the seed (c0, s0) turned by lane l's turn (lane[l], lane[2 kRopeSeedBlocks + l]),
// in double, rounded to float.
template <class DFT, class V>
HWY_INLINE void TurnSeed(DFT df, const double* seed, const double* lane, V* C, V* S) {
#if HWY_TARGET == HWY_SCALAR
  (void)df;
  *C = V((float)(seed[0] * lane[0] - seed[1] * lane[2 * kRopeSeedBlocks]));
  *S = V((float)(seed[1] * lane[0] + seed[0] * lane[2 * kRopeSeedBlocks]));
#else
  const hn::Repartition<double, DFT> dd;  // N / 2 doubles
  const hn::Rebind<float, decltype(dd)> dh;       // N / 2 floats
  const size_t ND = hn::Lanes(dd);
  using VD = hn::Vec<decltype(dd)>;
  const VD c0 = hn::Set(dd, seed[0]), s0 = hn::Set(dd, seed[1]);
  VD c[2], s[2];
  for (int h = 0; h < 2; ++h) {
    const VD cl = hn::LoadU(dd, lane + h * ND), sl = hn::LoadU(dd, lane + 2 * kRopeSeedBlocks + h * ND);
    c[h] = hn::MulSub(c0, cl, hn::Mul(s0, sl));
    s[h] = hn::MulAdd(s0, cl, hn::Mul(c0, sl));
  }
  *C = hn::Combine(df, hn::DemoteTo(dh, c[1]), hn::DemoteTo(dh, c[0]));
  *S = hn::Combine(df, hn::DemoteTo(dh, s[1]), hn::DemoteTo(dh, s[0]));
#endif
}

// cos / sin of every pair's angle at blocks [b0, b0 + nb), rounded up to whole vectors:
// [pair][cos (kRopeMaxBlocks)][sin (kRopeMaxBlocks)] (rope_block_angles).
void RopeBlockAngles(const Stream& s, int b0, int nb, float* cs) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int N = (int)hn::Lanes(df);
  const int P = (int)s.centre.rope_freq.size();
  TQ_ASSERT(N <= kRopeSeedBlocks && nb <= kRopeMaxBlocks);
  for (int j = 0; j < nb; j += N) {
    const int k0 = (b0 + j) % kRopeSeedBlocks;
    const double* seed = s.centre.rope_seed + (size_t)((b0 + j) / kRopeSeedBlocks) * P * 2;
    for (int i = 0; i < P; ++i) {
      V C, S;
      TurnSeed(df, seed + 2 * i, s.centre.rope_lane + (size_t)i * 4 * kRopeSeedBlocks + k0, &C, &S);
      hn::StoreU(C, df, cs + rope_angle_row(i, 0) + j);
      hn::StoreU(S, df, cs + rope_angle_row(i, 1) + j);
    }
  }
}

// kTable: the angles from cs (RopeBlockAngles from block b0); else turned here from the seeds.
template <int GN, bool kTable>
HWY_INLINE void RopeBlockTermsN(const Stream& s, const float* mc, int b0, int nb, float* out, const float* cs) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int N = (int)hn::Lanes(df);
  const int P = (int)s.centre.rope_freq.size(), F = rope_fast_pairs(s), mst = rope_mc_stride(s);
  TQ_ASSERT(N <= kRopeSeedBlocks);
  for (int j = 0; j < nb; j += N) {  // out rows hold 64 (>= nb rounded up to N)
    // Blocks b0 + j + l (l < N) are k = k0 + l blocks past their seed (k < 32).
    const int k0 = (b0 + j) % kRopeSeedBlocks;
    const double* seed = s.centre.rope_seed + (size_t)((b0 + j) / kRopeSeedBlocks) * P * 2;
    V c[GN], d[GN], e[GN];
    for (int g = 0; g < GN; ++g) {
      c[g] = hn::Set(df, mc[(size_t)g * mst + 2 * P]);
      d[g] = hn::Zero(df);
      e[g] = hn::Zero(df);
    }
    for (int i = 0; i < P; ++i) {
      V C, S;
      if constexpr (kTable) {
        C = hn::LoadU(df, cs + rope_angle_row(i, 0) + j);
        S = hn::LoadU(df, cs + rope_angle_row(i, 1) + j);
      } else {
        TurnSeed(df, seed + 2 * i, s.centre.rope_lane + (size_t)i * 4 * kRopeSeedBlocks + k0, &C, &S);
      }
      if (i < F) {
        for (int g = 0; g < GN; ++g) {
          const float* m = mc + (size_t)g * mst;
          float* r = out + (size_t)g * rope_terms_stride();
          const V A = hn::Set(df, m[i]), B = hn::Set(df, m[P + i]);
          hn::StoreU(hn::MulAdd(A, C, hn::Mul(B, S)), df, r + (size_t)(kRopeSlowRows + 2 * i) * kRopeMaxBlocks + j);
          hn::StoreU(hn::NegMulAdd(A, S, hn::Mul(B, C)), df,
                     r + (size_t)(kRopeSlowRows + 1 + 2 * i) * kRopeMaxBlocks + j);
        }
      } else {
        const float w = (float)s.centre.rope_freq[i];
        const V vw = hn::Set(df, w), vw2 = hn::Set(df, -0.5f * w * w);
        for (int g = 0; g < GN; ++g) {
          const float* m = mc + (size_t)g * mst;
          const V A = hn::Set(df, m[i]), B = hn::Set(df, m[P + i]);
          const V v = hn::MulAdd(A, C, hn::Mul(B, S)), u = hn::NegMulAdd(A, S, hn::Mul(B, C));
          c[g] = hn::Add(c[g], v);
          d[g] = hn::MulAdd(vw, u, d[g]);
          e[g] = hn::MulAdd(vw2, v, e[g]);
        }
      }
    }
    for (int g = 0; g < GN; ++g) {
      float* r = out + (size_t)g * rope_terms_stride();
      hn::StoreU(c[g], df, r + j);
      hn::StoreU(d[g], df, r + kRopeMaxBlocks + j);
      hn::StoreU(e[g], df, r + 2 * kRopeMaxBlocks + j);
    }
  }
}

template <bool kTable>
void RopeBlockTermsT(const Stream& s, const float* mc, int G, int b0, int nb, float* out, const float* cs) {
  const int mst = rope_mc_stride(s);
  for (int g = 0; g < G;) {
    const float* m = mc + (size_t)g * mst;
    float* r = out + (size_t)g * rope_terms_stride();
    const int left = G - g;
    if (left >= 4) RopeBlockTermsN<4, kTable>(s, m, b0, nb, r, cs), g += 4;
    else if (left == 3) RopeBlockTermsN<3, kTable>(s, m, b0, nb, r, cs), g += 3;
    else if (left == 2) RopeBlockTermsN<2, kTable>(s, m, b0, nb, r, cs), g += 2;
    else RopeBlockTermsN<1, kTable>(s, m, b0, nb, r, cs), g += 1;
  }
}

void RopeBlockTerms(const Stream& s, const float* mc, int G, int b0, int nb, float* out, const float* cs) {
  if (cs) return RopeBlockTermsT<true>(s, mc, G, b0, nb, out, cs);
  RopeBlockTermsT<false>(s, mc, G, b0, nb, out, nullptr);
}

bool DecodeTq(const Shape& sh, const Stream& sk, const Stream& sv, int nq, const float* qd, const int* limits,
              int a, int b, const States& st) {
#if HWY_TARGET == HWY_SCALAR
  (void)sh, (void)sk, (void)sv, (void)nq, (void)qd, (void)limits, (void)a, (void)b, (void)st;
  return false;
#else
  const DF df;
  const size_t N = hn::Lanes(df);
  if (N != hn::MaxLanes(df) || N < 4 || N > 16) return false;
  switch (sh.G) {
    case 1: DecodeTqG<1>(sh, sk, sv, nq, qd, limits, a, b, st); return true;
    case 2: DecodeTqG<2>(sh, sk, sv, nq, qd, limits, a, b, st); return true;
    case 3: DecodeTqG<3>(sh, sk, sv, nq, qd, limits, a, b, st); return true;
    case 4: DecodeTqG<4>(sh, sk, sv, nq, qd, limits, a, b, st); return true;
    case 8: DecodeTqG<8>(sh, sk, sv, nq, qd, limits, a, b, st); return true;
    default: return false;
  }
#endif
}

int DecodeTqLanes() {
#if HWY_TARGET == HWY_SCALAR
  return 1;
#else
  return (int)hn::Lanes(DF());
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace tq::kv
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tq::kv {
HWY_EXPORT(DecodeTq);
HWY_EXPORT(DecodeTqLanes);
HWY_EXPORT(RopeBlockTerms);
HWY_EXPORT(RopeBlockAngles);

void rope_block_terms(const Stream& s, const float* mc, int G, int b0, int nb, float* out, const float* cs) {
  HWY_DYNAMIC_DISPATCH(RopeBlockTerms)(s, mc, G, b0, nb, out, cs);
}
void rope_block_angles(const Stream& s, int b0, int nb, float* cs) {
  HWY_DYNAMIC_DISPATCH(RopeBlockAngles)(s, b0, nb, cs);
}

int decode_tq_float_lanes() { return HWY_DYNAMIC_DISPATCH(DecodeTqLanes)(); }

bool decode_tq_float(const Shape& sh, const Stream& sk, const Stream& sv, int nq, const float* qd,
                     const int* limits, int a, int b, const States& st) {
  return HWY_DYNAMIC_DISPATCH(DecodeTq)(sh, sk, sv, nq, qd, limits, a, b, st);
}
}  // namespace tq::kv
#endif
