// The opt-in lut8 fused decode kernel (AttnKernel::lut8) for TurboQuant codes (tq1..tq6,
// tq2n8..tq5n8 and the split types of <= 6 bits, for K and V; scalar or trellis codes) on
// AVX-512 VNNI + VBMI + VBMI2 (every CPU with Highway's avx3_dl level, which lut8 also asks
// for; pick_kernel in attention.cpp decides where it runs). The default float kernel is
// attention_tq_simd.cpp.
//
// Everything stays in the rotated domain: the query was rotated once by the driver, the
// output is inverse-rotated once after the merge. Per 32-token block of one kv head:
//
//  K  The rotated query of each head is quantized to int8 (per-head scale = max|q| / 127).
//     The codebook becomes a 16-entry byte table (centroid * 127 / max|centroid|, + 128 so it
//     is unsigned). A K tile (16 tokens x 4 dims, bit planes) expands to 64 code bytes with
//     one masked op per plane, one vpshufb turns codes into centroid bytes, and one vpdpbusd
//     per query head adds 4 products per token: 16 token scores per instruction, no decode to
//     float, no horizontal sums. The tile expansion is shared by the G heads of the group.
//     score = norm_t * (acc - 128 * sum(q8)) * q_scale * c_scale * softmax_scale.
//  softmax  block max, vector exp (degree-6 polynomial + vscalefps), running (m, l).
//  V  Softmax weights times V norms are quantized to uint8 per head and block (scale =
//     block max / 255). A V tile (16 dims x 4 tokens) expands to signed centroid bytes and
//     one vpdpbusd per head adds 4 tokens x 16 dims. The int32 sums are scaled into the float
//     output once per block.
//
// Several queries per call (prefill, each with its own causal limit): kMaxRows / G queries go
// through a block together, as kMaxRows rows of the block kernels (one tile expansion for all),
// and the norms of the call's blocks are decoded once. Each row's arithmetic is the one-query
// call's, so the results are identical.
//
// Trellis-coded parts (KvCacheConfig::trellis): the value of a code is lut[window], the window
// being the last 8 bits of the token's code stream, so the table has 256 entries (int8, as the
// codebook's) and every tile's code bytes first become window bytes (the codes of the previous
// dims shifted in from the same tile and the one before: score_block_t, accum_block_t).
//
// Accuracy: int8 query, int8 centroid table and uint8 weights: about 2e-2 relative vs
// attention_ref on the same codes, reported by `tq bench attention` and tested against a
// named threshold (tests/test_kv_cache.cpp).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "kv/attention_kernels.h"

namespace tq::kv {
namespace {

#pragma GCC push_options
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,avx512f,avx512vl,avx512dq,avx512bw,avx512vnni,avx512vbmi,avx512vbmi2")

inline __m512 exp512(__m512 x) {
  // exp(x) = 2^n * exp(r), n = round(x / ln2), r = x - n ln2 in [-ln2/2, ln2/2].
  x = _mm512_max_ps(x, _mm512_set1_ps(-100.f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

constexpr int kMaxRowsV = 12;  // = kMaxRows (below): query rows of one block pass

// One 8-byte bit plane. Tiles follow the per-token norms in a block, so a plane need not be
// 8-byte aligned (1-byte tq_n8 norms): memcpy is the unaligned load (one mov).
inline __mmask64 plane(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return _cvtu64_mask64(v);
}
// 64 codes of one tile (B bit planes of 8 bytes) -> 64 bytes.
template <int B>
inline __m512i tile_codes(const uint8_t* pl) {
  __m512i idx = _mm512_maskz_mov_epi8(plane(pl), _mm512_set1_epi8(1));
  if constexpr (B > 1) idx = _mm512_mask_add_epi8(idx, plane(pl + 8), idx, _mm512_set1_epi8(2));
  if constexpr (B > 2) idx = _mm512_mask_add_epi8(idx, plane(pl + 16), idx, _mm512_set1_epi8(4));
  if constexpr (B > 3) idx = _mm512_mask_add_epi8(idx, plane(pl + 24), idx, _mm512_set1_epi8(8));
  if constexpr (B > 4) idx = _mm512_mask_add_epi8(idx, plane(pl + 32), idx, _mm512_set1_epi8(16));
  if constexpr (B > 5) idx = _mm512_mask_add_epi8(idx, plane(pl + 40), idx, _mm512_set1_epi8(32));
  return idx;
}
// Codes -> centroid bytes: vpshufb over a 16-entry table in every 128-bit lane (B <= 4), or
// vpermb over a 64-entry table (B = 5, 6; AVX-512 VBMI).
template <int B>
inline __m512i lookup(__m512i tbl, __m512i idx) {
  if constexpr (B <= 4) return _mm512_shuffle_epi8(tbl, idx);
  else return _mm512_permutexvar_epi8(idx, tbl);
}

// Trellis codes (include/tq/trellis.h): the value of dim d is lut[w], w = the low 8 bits of the
// codes of dims d, d - 1, .., d - P + 1 packed B bits apart (newest lowest; dims before the
// first wrap to the last ones), P = ceil(8 / B). sh[j] holds the code bytes of dims d - j.
template <int B>
inline __m512i windows(const __m512i* sh) {
  constexpr int P = (8 + B - 1) / B;
  __m512i w = sh[0];
  for (int j = 1; j < P; ++j) {
    // 16-bit shifts: a low byte's top bits spill into the bottom jB bits of the high byte
    // (cleared by the mask) when (j + 1) B > 8, the high byte's fall out of the element.
    __m512i x = _mm512_slli_epi16(sh[j], (unsigned)(j * B));
    if ((j + 1) * B > 8) x = _mm512_and_si512(x, _mm512_set1_epi8((char)((0xFF << (j * B)) & 0xFF)));
    w = _mm512_or_si512(w, x);
  }
  return w;
}
// Windows -> table bytes over 256 entries: two 128-entry vpermi2b, bit 7 of the window picks.
inline __m512i lookup256(const __m512i* t, __m512i w) {
  const __m512i lo = _mm512_permutex2var_epi8(t[0], w, t[1]);
  const __m512i hi = _mm512_permutex2var_epi8(t[2], w, t[3]);
  return _mm512_mask_blend_epi8(_mm512_movepi8_mask(w), lo, hi);
}

// K: raw[g][32] = sum_d q8[g][d] * tblK[code(t, d)] for the nt tokens of a block.
template <int G, int B>
void score_block(const uint8_t* tiles, int D, int nt, const int32_t* q32, const __m512i* tbl, int32_t* raw) {
  const int nq = D / 4;
  for (int s = 0; s < 2; ++s) {
    __m512i acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_si512();
    if (s * 16 < nt) {
      const uint8_t* pl = tiles + (size_t)s * nq * B * 8;
      for (int k = 0; k < nq; ++k, pl += B * 8) {
        const __m512i vals = lookup<B>(tbl[0], tile_codes<B>(pl));
        for (int g = 0; g < G; ++g)
          acc[g] = _mm512_dpbusd_epi32(acc[g], vals, _mm512_set1_epi32(q32[g * nq + k]));
      }
    }
    for (int g = 0; g < G; ++g) _mm512_store_si512(raw + g * 32 + s * 16, acc[g]);
  }
}

// Where the V sums of a block go: row g's output o[g] (dims of the part; null: the row does not
// see the block) becomes o * al[g] + sum * ws[g] (the multiply skipped when al is 1: the running
// max held), straight from the accumulator registers.
struct VOut {
  float* o[kMaxRowsV];
  float al[kMaxRowsV], ws[kMaxRowsV];
};
inline void put_v(const VOut& v, int g, int d, __m512i acc) {
  float* o = v.o[g];
  if (!o) return;
  const __m512 x = _mm512_cvtepi32_ps(acc), ws = _mm512_set1_ps(v.ws[g]);
  __m512 y = _mm512_loadu_ps(o + d);
  if (v.al[g] != 1.f) y = _mm512_mul_ps(y, _mm512_set1_ps(v.al[g]));
  _mm512_storeu_ps(o + d, _mm512_fmadd_ps(x, ws, y));
}

// V: o[g][d] += sum_t w8[g][t] * tblV[code(t, d)] (put_v).
template <int G, int B>
void accum_block(const uint8_t* tiles, int D, int nt, const int32_t* w32, const __m512i* tbl, const VOut& out) {
  const int nr = (nt + 3) / 4;
  for (int e = 0; e < D / 16; ++e) {
    __m512i acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_si512();
    const uint8_t* pl = tiles + (size_t)e * 64 * B;
    for (int r = 0; r < nr; ++r, pl += B * 8) {
      const __m512i vals = lookup<B>(tbl[0], tile_codes<B>(pl));
      for (int g = 0; g < G; ++g) acc[g] = _mm512_dpbusd_epi32(acc[g], _mm512_set1_epi32(w32[g * 8 + r]), vals);
    }
    for (int g = 0; g < G; ++g) put_v(out, g, e * 16, acc[g]);
  }
}

// score_block for trellis codes: the code bytes of the 16 tokens' tiles first, then per tile
// the windows (token lane t, byte i = dim 4k + i: dims d - j from tile k and the tiles before
// it by 32-bit lane shifts) and the 256-entry lookup in place of the 16-entry one.
template <int G, int B>
void score_block_t(const uint8_t* tiles, int D, int nt, const int32_t* q32, const __m512i* tbl, int32_t* raw) {
  constexpr int P = (8 + B - 1) / B;
  const int nq = D / 4;
  alignas(64) uint8_t codes[kMaxHeadDim / 4][64];
  for (int s = 0; s < 2; ++s) {
    __m512i acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_si512();
    if (s * 16 < nt) {
      const uint8_t* pl = tiles + (size_t)s * nq * B * 8;
      for (int k = 0; k < nq; ++k) _mm512_store_si512(codes[k], tile_codes<B>(pl + (size_t)k * B * 8));
      for (int k = 0; k < nq; ++k) {
        const __m512i c0 = _mm512_load_si512(codes[k]);
        const __m512i c1 = _mm512_load_si512(codes[k == 0 ? nq - 1 : k - 1]);
        __m512i sh[P];
        sh[0] = c0;
        for (int j = 1; j < P; ++j) {  // dims d - j: j < 4 from tiles k, k - 1; j >= 4 from k - 1, k - 2
          const int r = j % 4;
          const __m512i a = j < 4 ? c0 : c1;
          const __m512i b = j < 4 ? c1 : _mm512_load_si512(codes[(k + 2 * nq - 2) % nq]);
          if (r == 0) sh[j] = a;
          else if (r == 1) sh[j] = _mm512_shldi_epi32(a, b, 8);
          else if (r == 2) sh[j] = _mm512_shldi_epi32(a, b, 16);
          else sh[j] = _mm512_shldi_epi32(a, b, 24);
        }
        const __m512i vals = lookup256(tbl, windows<B>(sh));
        for (int g = 0; g < G; ++g)
          acc[g] = _mm512_dpbusd_epi32(acc[g], vals, _mm512_set1_epi32(q32[g * nq + k]));
      }
    }
    for (int g = 0; g < G; ++g) _mm512_store_si512(raw + g * 32 + s * 16, acc[g]);
  }
}

// accum_block for trellis codes: a V tile has one dim per 32-bit lane, so dims d - j are the
// same tile shifted j lanes with the previous 16-dim column's (the last column's for the first)
// shifted in (valignd).
template <int G, int B>
void accum_block_t(const uint8_t* tiles, int D, int nt, const int32_t* w32, const __m512i* tbl, const VOut& out) {
  constexpr int P = (8 + B - 1) / B;
  const int nr = (nt + 3) / 4, ne = D / 16;
  alignas(64) uint8_t codes[kMaxHeadDim / 16][8][64];
  for (int e = 0; e < ne; ++e)
    for (int r = 0; r < nr; ++r)
      _mm512_store_si512(codes[e][r], tile_codes<B>(tiles + (size_t)e * 64 * B + (size_t)r * B * 8));
  for (int e = 0; e < ne; ++e) {
    const int ep = e == 0 ? ne - 1 : e - 1;
    __m512i acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_si512();
    for (int r = 0; r < nr; ++r) {
      const __m512i cur = _mm512_load_si512(codes[e][r]), prev = _mm512_load_si512(codes[ep][r]);
      __m512i sh[P];
      sh[0] = cur;
      if constexpr (P > 1) sh[1] = _mm512_alignr_epi32(cur, prev, 15);
      if constexpr (P > 2) sh[2] = _mm512_alignr_epi32(cur, prev, 14);
      if constexpr (P > 3) sh[3] = _mm512_alignr_epi32(cur, prev, 13);
      if constexpr (P > 4) sh[4] = _mm512_alignr_epi32(cur, prev, 12);
      if constexpr (P > 5) sh[5] = _mm512_alignr_epi32(cur, prev, 11);
      if constexpr (P > 6) sh[6] = _mm512_alignr_epi32(cur, prev, 10);
      if constexpr (P > 7) sh[7] = _mm512_alignr_epi32(cur, prev, 9);
      const __m512i vals = lookup256(tbl, windows<B>(sh));
      for (int g = 0; g < G; ++g) acc[g] = _mm512_dpbusd_epi32(acc[g], _mm512_set1_epi32(w32[g * 8 + r]), vals);
    }
    for (int g = 0; g < G; ++g) put_v(out, g, e * 16, acc[g]);
  }
}

using ScoreFn = void (*)(const uint8_t*, int, int, const int32_t*, const __m512i*, int32_t*);
using AccumFn = void (*)(const uint8_t*, int, int, const int32_t*, const __m512i*, const VOut&);

// The block kernels of a part of `bits` bits for G heads (trellis codes: 1-4 bits); left null
// where there is none.
template <int G, int B = 1>
void pick_kernels(int bits, bool trellis, ScoreFn* s, AccumFn* a) {
  if constexpr (B <= 6) {
    if (bits != B) return pick_kernels<G, B + 1>(bits, trellis, s, a);
    if (!trellis) {
      *s = score_block<G, B>;
      *a = accum_block<G, B>;
    } else if constexpr (B <= 4) {
      *s = score_block_t<G, B>;
      *a = accum_block_t<G, B>;
    }
  }
}

// Byte tables of a codebook (16 or 64 entries) or a trellis table (256 entries): value * 127 /
// max|value|, K unsigned (+128), V signed; cscale = max|value| / 127.
struct ByteTable {
  alignas(64) int8_t b[256] = {};
  float cscale = 1.f;
  bool narrow = false;  // <= 16 entries: the vpshufb table, broadcast to every 128-bit lane
};
ByteTable make_byte_table(const Codebook* cb, const TrellisCode* tc, bool offset) {
  const std::vector<float>& cs = tc ? tc->lut : cb->centroids;
  float cmax = 0;
  for (float c : cs) cmax = std::max(cmax, std::fabs(c));
  ByteTable t;
  for (int j = 0; j < (int)cs.size() && j < 256; ++j) {
    const int v = (int)std::lrint(cs[j] * 127.0 / cmax);
    t.b[j] = (int8_t)(offset ? v + 128 : v);
  }
  t.cscale = cmax / 127.f;
  t.narrow = cs.size() <= 16;
  return t;
}
// The table of (cb, tc, offset) in registers (t[0], or t[0..3] for 256 entries). Built once per
// thread: the codebooks and trellis codes of a cache come from get_codebook / get_trellis,
// which keep them for the life of the process, so their addresses identify them (a trellis
// table took 7% of a decode call when it was rebuilt per call).
void byte_table(const Codebook* cb, const TrellisCode* tc, bool offset, __m512i* t, float* cscale) {
  struct Entry {
    const void* cb;
    const void* tc;
    bool offset;
    std::unique_ptr<ByteTable> table;
  };
  thread_local std::vector<Entry> cache;
  const ByteTable* bt = nullptr;
  for (const Entry& e : cache)
    if (e.cb == cb && e.tc == tc && e.offset == offset) bt = e.table.get();
  if (!bt) {
    cache.push_back(Entry{cb, tc, offset, std::make_unique<ByteTable>(make_byte_table(cb, tc, offset))});
    bt = cache.back().table.get();
  }
  *cscale = bt->cscale;
  for (int i = 0; i < 4; ++i) t[i] = _mm512_load_si512(bt->b + 64 * i);
  if (bt->narrow) t[0] = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(bt->b)));
}

inline float hmax(__m512 v) { return _mm512_reduce_max_ps(v); }
inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

// Software prefetch (into L2) of the K and V blocks kPrefetchBlocks ahead of the one being
// read. A decode call reads each code byte once, and between two calls of a layer the model's
// weights stream through the caches, so the blocks come from memory: one 32K global call of
// Gemma 3's `auto` cache (8 MB of codes, 1 thread) took ~1.77 ms of CPU cold against ~1.2 ms
// with the codes warm in L3 (bench/attn_cpu_time.cpp with FLUSH_MB 64 and 0). Two blocks
// ahead took ~6.6% off the cold call; into L1 (_MM_HINT_T0) it cost 8-15% more instead
// (docs/design.md, "Decode at 32K on Gemma").
constexpr int kPrefetchBlocks = 2;
inline void prefetch_block(const uint8_t* p, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p) + o, _MM_HINT_T1);
}

// Query rows per block-kernel call when a call has many queries (prefill): the expansion of a
// tile's codes is shared by the rows, so kMaxRows / G queries go through a block together.
constexpr int kMaxRows = kMaxRowsV;

// The block kernels of part p for G query rows (the heads of a kv head, or kMaxRows: several
// queries; left null: none).
void kernels_of(int G, const Part& p, ScoreFn* s, AccumFn* a) {
  const bool tc = p.tc != nullptr;
  switch (G) {
    case 1: return pick_kernels<1>(p.bits, tc, s, a);
    case 2: return pick_kernels<2>(p.bits, tc, s, a);
    case 3: return pick_kernels<3>(p.bits, tc, s, a);
    case 4: return pick_kernels<4>(p.bits, tc, s, a);
    case 8: return pick_kernels<8>(p.bits, tc, s, a);
    case kMaxRows: return pick_kernels<kMaxRows>(p.bits, tc, s, a);
  }
}

inline __m512 load_norms16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The 32 norms of one block of part P: n0 tokens 0..15, n1 tokens 16..31. fp16 norms, or
// tq_n8 log codes decoded as the float kernel does: 2^(e / 32) * n8_pow_table()[c].
inline void load_norms(const uint8_t* blk, const Part& P, __m512* n0, __m512* n1) {
  if (P.n8) {
    const __m512 base = _mm512_set1_ps(n8_block_base(blk + P.norm_off));
    const float* tab = n8_pow_table();
    const uint8_t* c = blk + P.norm_off + 2;
    const __m512i c0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
    const __m512i c1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 16)));
    *n0 = _mm512_mul_ps(base, _mm512_i32gather_ps(c0, tab, 4));
    *n1 = _mm512_mul_ps(base, _mm512_i32gather_ps(c1, tab, 4));
    return;
  }
  *n0 = load_norms16(blk + P.norm_off);
  *n1 = load_norms16(blk + P.norm_off + 32);
}

struct Kernels {
  ScoreFn score[2] = {};
  AccumFn accum[2] = {};
};

// What the query rows of one call share: parts, tables, and (several queries) the decoded norms.
struct Call {
  const Shape& sh;
  const Stream& sk;
  const Stream& sv;
  const float* qd;
  const int* limits;
  int a, b;
  const States& st;
  Part pk[2], pv[2];
  int npk = 0, npv = 0;
  __m512i tblK[2][4], tblV[2][4];
  float ck[2], cv[2];
  const float* norms = nullptr;  // per block of [a, ..): [K parts][V parts] x 32; null: decode per block
  const float* angles = nullptr;  // RoPE-rotating K mean, several queries: rope_block_angles from a / 32

  Call(const Shape& s, const Stream& k, const Stream& v, const float* q, const int* l, int a_, int b_,
       const States& st_)
      : sh(s), sk(k), sv(v), qd(q), limits(l), a(a_), b(b_), st(st_) {
    npk = parts_of(sk, pk);
    npv = parts_of(sv, pv);
  }
  bool kernels(int rows, Kernels* k) const {
    ScoreFn unused_s = nullptr;
    AccumFn unused_a = nullptr;
    for (int i = 0; i < npk; ++i) {
      kernels_of(rows, pk[i], &k->score[i], &unused_a);
      if (!k->score[i]) return false;
    }
    for (int i = 0; i < npv; ++i) {
      kernels_of(rows, pv[i], &unused_s, &k->accum[i]);
      if (!k->accum[i]) return false;
    }
    return true;
  }
  // Norms of part i (K parts, then V parts) for tokens 0..15 / 16..31 of the block at t0.
  void block_norms(int t0, int i, __m512* n0, __m512* n1) const {
    if (norms) {
      const float* p = norms + ((size_t)((t0 - a) / kBlock) * (npk + npv) + i) * kBlock;
      *n0 = _mm512_loadu_ps(p);
      *n1 = _mm512_loadu_ps(p + 16);
    } else if (i < npk) {
      load_norms(sk.block(t0 / kBlock), pk[i], n0, n1);
    } else {
      load_norms(sv.block(t0 / kBlock), pv[i - npk], n0, n1);
    }
  }
};

// Queries q0 .. q0 + rows / G - 1 of the call (rows = G or kMaxRows) with the kernels for `rows` rows.
void run_rows(const Call& c, int q0, int rows, const Kernels& k) {
  const Shape& sh = c.sh;
  const int G = sh.G, npk = c.npk, npv = c.npv, r0 = q0 * G;
  const Part* pk = c.pk;
  const Part* pv = c.pv;
  const States st{c.st.base + (size_t)r0 * c.st.stride(), c.st.D};
  alignas(64) int8_t q8[2][kMaxRows * kMaxHeadDim];  // per K part: rows x dim
  alignas(64) int32_t raw[2][kMaxRows * 32];
  alignas(64) uint8_t w8[2][kMaxRows * 32];
  float kscale[2][kMaxRows], qoff[2][kMaxRows], alpha[kMaxRows];
  int row_end[kMaxRows];
  int end = c.a;
  for (int r = 0; r < rows; ++r) {
    row_end[r] = std::min(c.b, c.limits[q0 + r / G]);
    end = std::max(end, row_end[r]);
  }
  for (int i = 0; i < npk; ++i) {
    for (int r = 0; r < rows; ++r) {
      const float* qg = c.qd + (size_t)(r0 + r) * sh.D + pk[i].off;
      int8_t* out = q8[i] + (size_t)r * pk[i].dim;
      __m512 vmax = _mm512_setzero_ps();
      for (int d = 0; d < pk[i].dim; d += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(qg + d)));
      const float amax = hmax(vmax);
      const float sq = amax > 0 ? amax / 127.f : 1.f;
      const __m512 inv = _mm512_set1_ps(1.f / sq);
      __m512i vsum = _mm512_setzero_si512();
      for (int d = 0; d < pk[i].dim; d += 16) {  // round to nearest even, |v| <= 127
        const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(qg + d), inv));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + d), _mm512_cvtsepi32_epi8(v));
        vsum = _mm512_add_epi32(vsum, v);
      }
      const int sum = _mm512_reduce_add_epi32(vsum);
      kscale[i][r] = sq * c.ck[i] * sh.scale;
      qoff[i][r] = 128.f * (float)sum;
    }
  }
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const __m512 ninf = _mm512_set1_ps(neg_inf);
  // RoPE-rotating K mean: the terms of every block of these rows, once (written only where read)
  alignas(64) float rterms[kMaxRows * rope_terms_stride()];
  if (sh.rope_mc && end > c.a)
    rope_block_terms(c.sk, sh.rope_mc + (size_t)r0 * rope_mc_stride(c.sk), rows, c.a / kBlock,
                     (end - c.a + kBlock - 1) / kBlock, rterms, c.angles);
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (int t0 = c.a; t0 < end; t0 += kBlock) {
    const int nt = std::min(kBlock, end - t0);  // the longest row's tokens in this block
    const uint8_t* kb = c.sk.block(t0 / kBlock);
    const uint8_t* vb = c.sv.block(t0 / kBlock);
    if (t0 + kPrefetchBlocks * kBlock < end) {  // a block of the range: its chunk exists
      const int pb = t0 / kBlock + kPrefetchBlocks;
      prefetch_block(c.sk.block(pb), c.sk.block_bytes);
      prefetch_block(c.sv.block(pb), c.sv.block_bytes);
    }
    for (int i = 0; i < npk; ++i)
      k.score[i](kb + pk[i].tiles_off, pk[i].dim, nt, reinterpret_cast<const int32_t*>(q8[i]), c.tblK[i], raw[i]);
    __m512 kn0[2], kn1[2], vn0[2], vn1[2];
    for (int i = 0; i < npk; ++i) c.block_norms(t0, i, &kn0[i], &kn1[i]);
    for (int i = 0; i < npv; ++i) c.block_norms(t0, npk + i, &vn0[i], &vn1[i]);
    // A sliding window's start inside this block (Shape::first, or each query's Shape::firsts;
    // the call's first block only): the lanes before it are masked in the query's rows.
    __mmask16 keep0 = 0xFFFF, keep1 = 0xFFFF;
    auto set_keep = [&](int first) {
      keep0 = first > t0 ? _mm512_cmpge_epi32_mask(lane, _mm512_set1_epi32(first - t0)) : 0xFFFF;
      keep1 = first > t0 ? _mm512_cmpge_epi32_mask(lane, _mm512_set1_epi32(first - t0 - 16)) : 0xFFFF;
    };
    if (!sh.firsts) set_keep(sh.first);
    bool any_w[2] = {false, false};
    bool live[kMaxRows];
    float wsc[2][kMaxRows];
    for (int r = 0; r < rows; ++r) {
      live[r] = t0 < row_end[r];  // rows of queries that stop before this block: weights 0, state kept
      if (!live[r]) {
        for (int i = 0; i < npv; ++i) std::memset(w8[i] + r * 32, 0, 32);
        continue;
      }
      const int ntr = std::min(kBlock, row_end[r] - t0);
      if (sh.firsts && r % G == 0) set_keep(sh.firsts[q0 + r / G]);
      const __mmask16 valid0 = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(ntr)) & keep0;
      const __mmask16 valid1 = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(ntr - 16)) & keep1;
      __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
      for (int i = 0; i < npk; ++i) {
        const __m512 off = _mm512_set1_ps(qoff[i][r]), ks = _mm512_set1_ps(kscale[i][r]);
        const __m512 x0 = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_load_si512(raw[i] + r * 32)), off);
        const __m512 x1 = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_load_si512(raw[i] + r * 32 + 16)), off);
        s0 = _mm512_fmadd_ps(_mm512_mul_ps(x0, ks), kn0[i], s0);
        s1 = _mm512_fmadd_ps(_mm512_mul_ps(x1, ks), kn1[i], s1);
      }
      if (sh.rope_mc) {  // RoPE-rotating K mean: its logit terms (rope_block_terms)
        const int F = rope_fast_pairs(c.sk), bi = t0 / kBlock - c.a / kBlock;
        const float* rt = rterms + (size_t)r * rope_terms_stride();
        const float* tx = c.sk.centre.rope_j + (size_t)F * 2 * kBlock;  // x, x^2
        const __m512 cc = _mm512_set1_ps(rt[bi]), d = _mm512_set1_ps(rt[kRopeMaxBlocks + bi]),
                     e = _mm512_set1_ps(rt[2 * kRopeMaxBlocks + bi]);
        __m512 m0 = _mm512_fmadd_ps(d, _mm512_loadu_ps(tx), cc), m1 = _mm512_fmadd_ps(d, _mm512_loadu_ps(tx + 16), cc);
        __m512 n0 = _mm512_mul_ps(e, _mm512_loadu_ps(tx + kBlock)), n1 = _mm512_mul_ps(e, _mm512_loadu_ps(tx + kBlock + 16));
        for (int i = 0; i < F; ++i) {
          const float* tj = c.sk.centre.rope_j + (size_t)i * 2 * kBlock;
          const float* ri = rt + (size_t)(kRopeSlowRows + 2 * i) * kRopeMaxBlocks + bi;
          const __m512 va = _mm512_set1_ps(ri[0]), vb2 = _mm512_set1_ps(ri[kRopeMaxBlocks]);
          m0 = _mm512_fmadd_ps(va, _mm512_loadu_ps(tj), m0);
          m1 = _mm512_fmadd_ps(va, _mm512_loadu_ps(tj + 16), m1);
          n0 = _mm512_fmadd_ps(vb2, _mm512_loadu_ps(tj + kBlock), n0);
          n1 = _mm512_fmadd_ps(vb2, _mm512_loadu_ps(tj + kBlock + 16), n1);
        }
        const __m512 vs = _mm512_set1_ps(sh.scale);
        s0 = _mm512_fmadd_ps(_mm512_add_ps(m0, n0), vs, s0);
        s1 = _mm512_fmadd_ps(_mm512_add_ps(m1, n1), vs, s1);
      }
      s0 = _mm512_mask_mov_ps(ninf, valid0, s0);
      s1 = _mm512_mask_mov_ps(ninf, valid1, s1);
      const float mb = hmax(_mm512_max_ps(s0, s1));
      float& m = st.m(r);
      const float m_new = std::max(m, mb);
      alpha[r] = m == neg_inf ? 0.f : m_new == m ? 1.f : std::exp(m - m_new);  // exp(0) = 1 exactly
      m = m_new;
      const __m512 vm = _mm512_set1_ps(m_new);
      const __m512 p0 = _mm512_maskz_mov_ps(valid0, exp512(_mm512_sub_ps(s0, vm)));
      const __m512 p1 = _mm512_maskz_mov_ps(valid1, exp512(_mm512_sub_ps(s1, vm)));
      st.l(r) = st.l(r) * alpha[r] + hsum(_mm512_add_ps(p0, p1));
      for (int i = 0; i < npv; ++i) {
        const __m512 w0 = _mm512_mul_ps(p0, vn0[i]), w1 = _mm512_mul_ps(p1, vn1[i]);
        const float wmax = hmax(_mm512_max_ps(w0, w1));
        if (wmax > 0) {
          const __m512 f = _mm512_set1_ps(255.f / wmax);
          const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(w0, f));
          const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(w1, f));
          _mm_store_si128(reinterpret_cast<__m128i*>(w8[i] + r * 32), _mm512_cvtusepi32_epi8(i0));
          _mm_store_si128(reinterpret_cast<__m128i*>(w8[i] + r * 32 + 16), _mm512_cvtusepi32_epi8(i1));
          wsc[i][r] = wmax / 255.f * c.cv[i];
          any_w[i] = true;
        } else {
          std::memset(w8[i] + r * 32, 0, 32);
          wsc[i][r] = 0;
        }
      }
    }
    for (int i = 0; i < npv; ++i) {
      const Part& P = pv[i];
      if (any_w[i]) {
        VOut out;
        for (int r = 0; r < rows; ++r) {
          out.o[r] = live[r] ? st.acc(r) + P.off : nullptr;
          out.al[r] = alpha[r];
          out.ws[r] = wsc[i][r];
        }
        k.accum[i](vb + P.tiles_off, P.dim, nt, reinterpret_cast<const int32_t*>(w8[i]), c.tblV[i], out);
        continue;
      }
      for (int r = 0; r < rows; ++r) {  // no weight in this block: o * alpha
        if (!live[r] || alpha[r] == 1.f) continue;
        float* o = st.acc(r) + P.off;
        const __m512 al = _mm512_set1_ps(alpha[r]);
        for (int d = 0; d < P.dim; d += 16) _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), al));
      }
    }
  }
}

// nq queries over [a, b): groups of kMaxRows / G queries through the wide kernels (the last
// few one at a time); the norms of the range decoded once when several queries read them.
bool run(const Shape& sh, const Stream& sk, const Stream& sv, int nq, const float* qd, const int* limits, int a,
         int b, const States& st) {
  const int G = sh.G;
  Call c(sh, sk, sv, qd, limits, a, b, st);
  const int R = nq > 1 ? std::max(1, kMaxRows / G) : 1;  // queries per group
  Kernels k1, kR;
  if (!c.kernels(G, &k1) || (R > 1 && !c.kernels(R * G, &kR))) return false;
  for (int i = 0; i < c.npk; ++i) byte_table(c.pk[i].cb, c.pk[i].tc, true, c.tblK[i], &c.ck[i]);
  for (int i = 0; i < c.npv; ++i) byte_table(c.pv[i].cb, c.pv[i].tc, false, c.tblV[i], &c.cv[i]);
  if (nq > 1) {
    int end = a;
    for (int i = 0; i < nq; ++i) end = std::max(end, std::min(b, limits[i]));
    thread_local std::vector<float> buf;
    const int nparts = c.npk + c.npv;
    buf.resize((size_t)((end - a + kBlock - 1) / kBlock) * nparts * kBlock);  // end >= a
    for (int t0 = a; t0 < end; t0 += kBlock) {
      float* p = buf.data() + (size_t)((t0 - a) / kBlock) * nparts * kBlock;
      for (int i = 0; i < nparts; ++i, p += kBlock) {
        __m512 n0, n1;
        c.block_norms(t0, i, &n0, &n1);
        _mm512_storeu_ps(p, n0);
        _mm512_storeu_ps(p + 16, n1);
      }
    }
    c.norms = buf.data();
    if (sh.rope_mc && end > a) {  // the blocks' angles, turned once for all the queries
      thread_local std::vector<float> angles;
      angles.resize(rope_angles_floats(sk));
      rope_block_angles(sk, a / kBlock, (end - a + kBlock - 1) / kBlock, angles.data());
      c.angles = angles.data();
    }
  }
  int q = 0;
  if (R > 1)
    for (; q + R <= nq; q += R) run_rows(c, q, R * G, kR);
  for (; q < nq; ++q) run_rows(c, q, G, k1);
  return true;
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace

bool lut8_host_ok() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                         __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vbmi2");
  return ok;
}

bool decode_tq_lut8(const Shape& sh, const Stream& sk, const Stream& sv, int nq, const float* qd,
                    const int* limits, int a, int b, const States& st) {
  return run(sh, sk, sv, nq, qd, limits, a, b, st);
}

}  // namespace tq::kv
