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
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kv/attention_tq_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
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
  static const std::vector<float> kSigns = {-1.f, 1.f};
  const std::vector<float>& cs = tc ? tc->lut : cb ? cb->centroids : kSigns;
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

// Trellis codes (include/tq/trellis.h): the value of dim d is lut[w], w = the last 8 bits of
// the token's code stream up to dim d (circular). code_of: the code in byte i of each lane.
HWY_INLINE VU code_of(VU u, int i) {
  return hn::And(hn::ShiftRightSame(u, 8 * i), hn::Set(DU(), 0xFFu));
}

// K: raw[g][32] = sum_d q[g][d] * c(code(t, d)) for the 32 token slots of a block (slots past
// the block's tokens score zero codes; the caller masks them). For each N-token part both
// 16-token halves run together: 2 G independent FMA chains. kTrellis: c is lut[window] of the
// token's code stream (see the comment above code_of): each lane keeps its token's stream
// register (R = R << B | code, the dims in order, preloaded with the last dims' codes for the
// wrap) and one gather per dim replaces the lookup.
template <int G, int B, bool kTrellis = false>
void ScoreBlock(const uint8_t* tiles, int dim, const float* q, const Table& T, float* raw) {
  const DF df;
  const DU du;
  const DI di;
  constexpr size_t N = kN;
  constexpr int P = (8 + B - 1) / B;  // trellis: codes per window
  const int nq = dim / 4;
  const size_t tile_bytes = (size_t)B * 8;
  const uint8_t* half1 = tiles + (size_t)nq * tile_bytes;
  const auto m8 = hn::Set(du, 0xFFu);
  for (size_t j = 0; j < 16 / N; ++j) {
    VF a0[G], a1[G];
    for (int g = 0; g < G; ++g) a0[g] = a1[g] = hn::Zero(df);
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
        VF c0, c1;
        if constexpr (kTrellis) {
          r0 = hn::Or(hn::ShiftLeft<B>(r0), code_of(u0, i));
          r1 = hn::Or(hn::ShiftLeft<B>(r1), code_of(u1, i));
          c0 = hn::GatherIndex(df, T.mem, hn::BitCast(di, hn::And(r0, m8)));
          c1 = hn::GatherIndex(df, T.mem, hn::BitCast(di, hn::And(r1, m8)));
        } else {
          c0 = lookup<B>(T, byte_of<i>(u0));
          c1 = lookup<B>(T, byte_of<i>(u1));
        }
        for (int g = 0; g < G; ++g) {
          const VF qv = hn::Set(df, q[(size_t)g * dim + 4 * k + i]);
          a0[g] = hn::MulAdd(c0, qv, a0[g]);
          a1[g] = hn::MulAdd(c1, qv, a1[g]);
        }
      };
      step(std::integral_constant<int, 0>{});
      step(std::integral_constant<int, 1>{});
      step(std::integral_constant<int, 2>{});
      step(std::integral_constant<int, 3>{});
    }
    for (int g = 0; g < G; ++g) {
      hn::Store(a0[g], df, raw + g * 32 + j * N);
      hn::Store(a1[g], df, raw + g * 32 + 16 + j * N);
    }
  }
}

// V: accv[g][d] = sum_t w[g][t] * c(code(t, d)), w = 0 past the block's tokens. Two N-dim
// columns at once: 2 G independent FMA chains.
template <int G, int B>
void AccumBlock(const uint8_t* tiles, int dim, int nt, const float* w, const Table& T, float* accv) {
  const DF df;
  constexpr size_t N = kN;
  const size_t tile_bytes = (size_t)B * 8;
  const int nr = (nt + 3) / 4;
  const int ncol = dim / (int)N;  // N-dim columns; column c: tile column e = c / (16 / N), part j
  const int per = 16 / (int)N;
  for (int c = 0; c < ncol; c += 2) {
    const bool two = c + 1 < ncol;
    const int c1 = two ? c + 1 : c;
    const uint8_t* t0 = tiles + (size_t)(c / per) * 8 * tile_bytes;
    const uint8_t* t1 = tiles + (size_t)(c1 / per) * 8 * tile_bytes;
    const size_t j0 = (size_t)(c % per), j1 = (size_t)(c1 % per);
    VF a0[G], a1[G];
    for (int g = 0; g < G; ++g) a0[g] = a1[g] = hn::Zero(df);
    for (int r = 0; r < nr; ++r) {
      const VU u0 = tile_part<B>(t0 + (size_t)r * tile_bytes, j0);
      const VU u1 = tile_part<B>(t1 + (size_t)r * tile_bytes, j1);
      auto step = [&](auto I) {
        constexpr int i = decltype(I)::value;
        const VF v0 = lookup<B>(T, byte_of<i>(u0)), v1 = lookup<B>(T, byte_of<i>(u1));
        for (int g = 0; g < G; ++g) {
          const VF wv = hn::Set(df, w[g * 32 + 4 * r + i]);
          a0[g] = hn::MulAdd(wv, v0, a0[g]);
          a1[g] = hn::MulAdd(wv, v1, a1[g]);
        }
      };
      step(std::integral_constant<int, 0>{});
      step(std::integral_constant<int, 1>{});
      step(std::integral_constant<int, 2>{});
      step(std::integral_constant<int, 3>{});
    }
    for (int g = 0; g < G; ++g) {
      hn::Store(a0[g], df, accv + (size_t)g * dim + (size_t)c * N);
      if (two) hn::Store(a1[g], df, accv + (size_t)g * dim + (size_t)c1 * N);
    }
  }
}

// V: lane = dim, so the window of dim d needs the codes of lanes d - 1 .. d - P + 1: the
// column's code vector and the previous column's (the last one for column 0) side by side in
// memory, read back shifted by one lane per step (needs P - 1 <= N: 8+ lanes, checked by
// decode_tq_supported).
template <int G, int B>
void AccumBlockT(const uint8_t* tiles, int dim, int nt, const float* w, const Table& T, float* accv) {
  const DF df;
  const DU du;
  const DI di;
  constexpr size_t N = kN;
  constexpr int P = (8 + B - 1) / B;
  const size_t tile_bytes = (size_t)B * 8;
  const int nr = (nt + 3) / 4;
  const int ncol = dim / (int)N;
  const int per = 16 / (int)N;
  const auto m8 = hn::Set(du, 0xFFu);
  auto column = [&](int c, int r) {
    return tile_part<B>(tiles + (size_t)(c / per) * 8 * tile_bytes + (size_t)r * tile_bytes, (size_t)(c % per));
  };
  // [N spare][previous column][column], the stores aligned; the shifted loads start at most 7
  // lanes before the column (still inside the buffer for every N >= 4)
  HWY_ALIGN uint32_t buf[3 * kN];
  for (int c = 0; c < ncol; ++c) {
    const int cp = c == 0 ? ncol - 1 : c - 1;
    VF a[G];
    for (int g = 0; g < G; ++g) a[g] = hn::Zero(df);
    for (int r = 0; r < nr; ++r) {
      hn::Store(column(cp, r), du, buf + N);
      hn::Store(column(c, r), du, buf + 2 * N);
      // win: byte i of lane l holds token 4r + i's window bits (codes packed B bits apart).
      VU sh[P];
      for (int j = 0; j < P; ++j) sh[j] = hn::LoadU(du, buf + 2 * N - j);
      for (int i = 0; i < 4; ++i) {
        VU wv = code_of(sh[0], i);
        for (int j = 1; j < P; ++j) wv = hn::Or(wv, hn::ShiftLeftSame(code_of(sh[j], i), j * B));
        const VF v = hn::GatherIndex(df, T.mem, hn::BitCast(di, hn::And(wv, m8)));
        for (int g = 0; g < G; ++g) a[g] = hn::MulAdd(hn::Set(df, w[g * 32 + 4 * r + i]), v, a[g]);
      }
    }
    for (int g = 0; g < G; ++g) hn::Store(a[g], df, accv + (size_t)g * dim + (size_t)c * N);
  }
}

using ScoreFn = void (*)(const uint8_t*, int, const float*, const Table&, float*);
using AccumFn = void (*)(const uint8_t*, int, int, const float*, const Table&, float*);
template <int G, int B = 1>
void pick(int bits, bool trellis, ScoreFn* s, AccumFn* a) {
  if constexpr (B <= 8) {
    if (bits == B) {
      if constexpr (B <= 4) {
        if (trellis) {
          *s = ScoreBlock<G, B, true>;
          *a = AccumBlockT<G, B>;
          return;
        }
      }
      *s = ScoreBlock<G, B>;
      *a = AccumBlock<G, B>;
      return;
    }
    pick<G, B + 1>(bits, trellis, s, a);
  }
}

template <int G>
void DecodeTqG(const Shape& sh, const Stream& sk, const Stream& sv, const float* qd, int limit, int a, int b,
               const States& st) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const size_t N = hn::Lanes(df);
  const size_t NV = 32 / N;  // score vectors per head per block
  Part pk[2], pv[2];
  const int npk = parts_of(sk, pk), npv = parts_of(sv, pv);
  Table tk[2], tv[2];
  ScoreFn score[2] = {};
  AccumFn accum[2] = {};
  for (int i = 0; i < npk; ++i) {
    make_table(pk[i].cb, pk[i].tc, &tk[i]);
    AccumFn unused;
    pick<G>(pk[i].bits, pk[i].tc != nullptr, &score[i], &unused);
  }
  for (int i = 0; i < npv; ++i) {
    make_table(pv[i].cb, pv[i].tc, &tv[i]);
    ScoreFn unused;
    pick<G>(pv[i].bits, pv[i].tc != nullptr, &unused, &accum[i]);
  }
  // Query slices per K part: G x dim, contiguous.
  HWY_ALIGN float q[2][G * kMaxHeadDim];
  for (int i = 0; i < npk; ++i)
    for (int g = 0; g < G; ++g)
      std::memcpy(q[i] + (size_t)g * pk[i].dim, qd + (size_t)g * sh.qstride + pk[i].qoff, sizeof(float) * pk[i].dim);
  HWY_ALIGN float raw[2][G * 32];
  HWY_ALIGN float norms[2][32];
  HWY_ALIGN float w[2][G * 32];
  HWY_ALIGN float accv[G * kMaxHeadDim];
  float alpha[G];
  const int end = std::min(b, limit);
  // RoPE-rotating K mean: the terms of every block of this call, once.
  HWY_ALIGN float rterms[G * rope_terms_stride()];  // written only where read
  if (sh.rope_mc && end > a) rope_block_terms(sk, sh.rope_mc, G, a / kBlock, (end - a + kBlock - 1) / kBlock, rterms);
  auto load_norms = [&](const uint8_t* blk, const Part& P, float* out) {
    if (P.n8) {  // norm = 2^(e / 32) * n8_pow_table()[c]; c = 255: 0
      const float* kPow = n8_pow_table();
      const float base = n8_block_base(blk + P.norm_off);
      const uint8_t* c = blk + P.norm_off + 2;
      for (int t = 0; t < 32; ++t) out[t] = base * kPow[c[t]];
      return;
    }
    const hwy::float16_t* h = reinterpret_cast<const hwy::float16_t*>(blk + P.norm_off);
    const hwy::float16_t* h2 = reinterpret_cast<const hwy::float16_t*>(blk + P.norm2_off);
    for (size_t t = 0; t < 32; t += N) {
      VF v = hn::PromoteTo(df, hn::LoadU(dh, h + t));
      if (P.norm2_off) v = hn::Mul(hn::Mul(v, hn::PromoteTo(df, hn::LoadU(dh, h2 + t))), hn::Set(df, P.norm_mul));
      hn::Store(v, df, out + t);
    }
  };
  for (int t0 = a; t0 < end; t0 += kBlock) {
    const int nt = std::min(kBlock, end - t0);
    const uint8_t* kb = sk.block(t0 / kBlock);
    const uint8_t* vb = sv.block(t0 / kBlock);
    // Scores of the G heads: sum over K parts of norm_t * raw.
    VF s[G][32 / hn::MaxLanes(DF())];
    for (int g = 0; g < G; ++g)
      for (size_t v = 0; v < NV; ++v) s[g][v] = hn::Zero(df);
    for (int i = 0; i < npk; ++i) {
      score[i](kb + pk[i].tiles_off, pk[i].dim, q[i], tk[i], raw[i]);
      load_norms(kb, pk[i], norms[i]);
      for (int g = 0; g < G; ++g)
        for (size_t v = 0; v < NV; ++v)
          s[g][v] = hn::MulAdd(hn::Load(df, raw[i] + g * 32 + v * N), hn::Load(df, norms[i] + v * N), s[g][v]);
    }
    if (sh.rope_mc) {  // RoPE-rotating K mean: its logit terms (rope_block_terms)
      const int F = rope_fast_pairs(sk), bi = t0 / kBlock - a / kBlock;
      for (int g = 0; g < G; ++g) {
        const float* r = rterms + (size_t)g * rope_terms_stride();
        const float* tx = sk.rope_j + (size_t)F * 2 * kBlock;  // x, x^2
        for (size_t v = 0; v < NV; ++v) {
          VF acc0 = hn::MulAdd(hn::Set(df, r[kRopeMaxBlocks + bi]), hn::LoadU(df, tx + v * N), hn::Set(df, r[bi]));
          VF acc1 = hn::Mul(hn::Set(df, r[2 * kRopeMaxBlocks + bi]), hn::LoadU(df, tx + kBlock + v * N));
          for (int i = 0; i < F; ++i) {
            const float* tj = sk.rope_j + (size_t)i * 2 * kBlock + v * N;
            const float* ri = r + (size_t)(kRopeSlowRows + 2 * i) * kRopeMaxBlocks + bi;
            acc0 = hn::MulAdd(hn::Set(df, ri[0]), hn::LoadU(df, tj), acc0);
            acc1 = hn::MulAdd(hn::Set(df, ri[kRopeMaxBlocks]), hn::LoadU(df, tj + kBlock), acc1);
          }
          s[g][v] = hn::Add(s[g][v], hn::Add(acc0, acc1));
        }
      }
    }
    for (int i = 0; i < npv; ++i) load_norms(vb, pv[i], norms[i]);
    HWY_ALIGN float p[32];
    for (int g = 0; g < G; ++g) {
      alpha[g] = BlockSoftmax(df, s[g], NV, nt, sh.scale, st, g, p);
      for (int i = 0; i < npv; ++i)
        for (size_t v = 0; v < NV; ++v)
          hn::Store(hn::Mul(hn::Load(df, p + v * N), hn::Load(df, norms[i] + v * N)), df, w[i] + g * 32 + v * N);
    }
    for (int i = 0; i < npv; ++i) {
      const Part& P = pv[i];
      accum[i](vb + P.tiles_off, P.dim, nt, w[i], tv[i], accv);
      for (int g = 0; g < G; ++g) {
        float* o = st.acc(g) + P.off;
        const VF al = hn::Set(df, alpha[g]);
        for (int d = 0; d < P.dim; d += (int)N)
          hn::StoreU(hn::MulAdd(hn::LoadU(df, o + d), al, hn::Load(df, accv + (size_t)g * P.dim + d)), df, o + d);
      }
    }
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

void RopeBlockTerms(const Stream& s, const float* mc, int G, int b0, int nb, float* out) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int N = (int)hn::Lanes(df);
  const int P = (int)s.rope_freq.size(), F = rope_fast_pairs(s), mst = rope_mc_stride(s);
  for (int g = 0; g < G; ++g) {
    const float* m = mc + (size_t)g * mst;
    float* r = out + (size_t)g * rope_terms_stride();
    for (int j = 0; j < nb; j += N) {  // tables padded by 16 blocks; out rows hold 64
      V c = hn::Set(df, m[2 * P]), d = hn::Zero(df), e = hn::Zero(df);
      for (int i = 0; i < P; ++i) {
        const V A = hn::Set(df, m[i]), B = hn::Set(df, m[P + i]);
        const V C = hn::LoadU(df, s.rope_cos + (size_t)i * s.rope_nbs + b0 + j);
        const V S = hn::LoadU(df, s.rope_sin + (size_t)i * s.rope_nbs + b0 + j);
        const V v = hn::MulAdd(A, C, hn::Mul(B, S)), u = hn::NegMulAdd(A, S, hn::Mul(B, C));
        if (i < F) {
          hn::StoreU(v, df, r + (size_t)(kRopeSlowRows + 2 * i) * kRopeMaxBlocks + j);
          hn::StoreU(u, df, r + (size_t)(kRopeSlowRows + 1 + 2 * i) * kRopeMaxBlocks + j);
        } else {
          const float w = (float)s.rope_freq[i];
          c = hn::Add(c, v);
          d = hn::MulAdd(hn::Set(df, w), u, d);
          e = hn::MulAdd(hn::Set(df, -0.5f * w * w), v, e);
        }
      }
      hn::StoreU(c, df, r + j);
      hn::StoreU(d, df, r + kRopeMaxBlocks + j);
      hn::StoreU(e, df, r + 2 * kRopeMaxBlocks + j);
    }
  }
}

bool DecodeTq(const Shape& sh, const Stream& sk, const Stream& sv, const float* qd, int limit, int a, int b,
              const States& st) {
#if HWY_TARGET == HWY_SCALAR
  (void)sh, (void)sk, (void)sv, (void)qd, (void)limit, (void)a, (void)b, (void)st;
  return false;
#else
  const DF df;
  const size_t N = hn::Lanes(df);
  if (N != hn::MaxLanes(df) || N < 4 || N > 16) return false;
  switch (sh.G) {
    case 1: DecodeTqG<1>(sh, sk, sv, qd, limit, a, b, st); return true;
    case 2: DecodeTqG<2>(sh, sk, sv, qd, limit, a, b, st); return true;
    case 3: DecodeTqG<3>(sh, sk, sv, qd, limit, a, b, st); return true;
    case 4: DecodeTqG<4>(sh, sk, sv, qd, limit, a, b, st); return true;
    case 8: DecodeTqG<8>(sh, sk, sv, qd, limit, a, b, st); return true;
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

void rope_block_terms(const Stream& s, const float* mc, int G, int b0, int nb, float* out) {
  HWY_DYNAMIC_DISPATCH(RopeBlockTerms)(s, mc, G, b0, nb, out);
}

int decode_tq_float_lanes() { return HWY_DYNAMIC_DISPATCH(DecodeTqLanes)(); }

bool decode_tq_float(const Shape& sh, const Stream& sk, const Stream& sv, const float* qd, int limit, int a,
                     int b, const States& st) {
  return HWY_DYNAMIC_DISPATCH(DecodeTq)(sh, sk, sv, qd, limit, a, b, st);
}
}  // namespace tq::kv
#endif
