// Fused decode attention for TurboQuant mse codes (tq1..tq4 for K and V) on AVX-512 VNNI.
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
// Accuracy: int8 query and int8 weights; the attention error this adds is reported by
// `tq bench attention` and tested against a named threshold (tests/test_kv_cache.cpp);
// AttentionParams::exact selects the float path instead.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kv/attention_kernels.h"
#include "tq/simd.h"

namespace tq::kv {
namespace {

#pragma GCC push_options
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Base target of every function here: AVX-512 F/BW/DQ/VL (the float kernel). The int8
// kernels add VNNI and VBMI in their own target region below.
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,avx512f,avx512vl,avx512dq,avx512bw")

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

// 64 codes of one tile (B bit planes of 8 bytes) -> 64 bytes.
template <int B>
inline __m512i tile_codes(const uint64_t* pl) {
  __m512i idx = _mm512_maskz_mov_epi8(_cvtu64_mask64(pl[0]), _mm512_set1_epi8(1));
  if constexpr (B > 1) idx = _mm512_mask_add_epi8(idx, _cvtu64_mask64(pl[1]), idx, _mm512_set1_epi8(2));
  if constexpr (B > 2) idx = _mm512_mask_add_epi8(idx, _cvtu64_mask64(pl[2]), idx, _mm512_set1_epi8(4));
  if constexpr (B > 3) idx = _mm512_mask_add_epi8(idx, _cvtu64_mask64(pl[3]), idx, _mm512_set1_epi8(8));
  if constexpr (B > 4) idx = _mm512_mask_add_epi8(idx, _cvtu64_mask64(pl[4]), idx, _mm512_set1_epi8(16));
  if constexpr (B > 5) idx = _mm512_mask_add_epi8(idx, _cvtu64_mask64(pl[5]), idx, _mm512_set1_epi8(32));
  if constexpr (B > 6) idx = _mm512_mask_add_epi8(idx, _cvtu64_mask64(pl[6]), idx, _mm512_set1_epi8(64));
  if constexpr (B > 7) idx = _mm512_mask_add_epi8(idx, _cvtu64_mask64(pl[7]), idx, (__m512i)_mm512_set1_epi8((char)128));
  return idx;
}
#pragma GCC push_options
#pragma GCC target("avx512vnni,avx512vbmi")
// Codes -> centroid bytes: vpshufb over a 16-entry table in every 128-bit lane (B <= 4), or
// vpermb over a 64-entry table (B = 5, 6; AVX-512 VBMI).
template <int B>
inline __m512i lookup(__m512i tbl, __m512i idx) {
  if constexpr (B <= 4) return _mm512_shuffle_epi8(tbl, idx);
  else return _mm512_permutexvar_epi8(idx, tbl);
}

// K: raw[g][32] = sum_d q8[g][d] * tblK[code(t, d)] for the nt tokens of a block.
template <int G, int B>
void score_block(const uint8_t* tiles, int D, int nt, const int32_t* q32, __m512i tbl, int32_t* raw) {
  const int nq = D / 4;
  const uint64_t* t64 = reinterpret_cast<const uint64_t*>(tiles);
  for (int s = 0; s < 2; ++s) {
    __m512i acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_si512();
    if (s * 16 < nt) {
      const uint64_t* pl = t64 + (size_t)s * nq * B;
      for (int k = 0; k < nq; ++k, pl += B) {
        const __m512i vals = lookup<B>(tbl, tile_codes<B>(pl));
        for (int g = 0; g < G; ++g)
          acc[g] = _mm512_dpbusd_epi32(acc[g], vals, _mm512_set1_epi32(q32[g * nq + k]));
      }
    }
    for (int g = 0; g < G; ++g) _mm512_store_si512(raw + g * 32 + s * 16, acc[g]);
  }
}

// V: accv[g][d] = sum_t w8[g][t] * tblV[code(t, d)].
template <int G, int B>
void accum_block(const uint8_t* tiles, int D, int nt, const int32_t* w32, __m512i tbl, int32_t* accv) {
  const uint64_t* t64 = reinterpret_cast<const uint64_t*>(tiles);
  const int nr = (nt + 3) / 4;
  for (int e = 0; e < D / 16; ++e) {
    __m512i acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_si512();
    const uint64_t* pl = t64 + (size_t)e * 8 * B;
    for (int r = 0; r < nr; ++r, pl += B) {
      const __m512i vals = lookup<B>(tbl, tile_codes<B>(pl));
      for (int g = 0; g < G; ++g) acc[g] = _mm512_dpbusd_epi32(acc[g], _mm512_set1_epi32(w32[g * 8 + r]), vals);
    }
    for (int g = 0; g < G; ++g) _mm512_store_si512(accv + (size_t)g * D + e * 16, acc[g]);
  }
}

#pragma GCC pop_options

// ---- float kernels: the same tiles, centroids as floats (vpermps over a table of 2^B floats
// in registers), float FMAs: equal to the reference up to float summation order.
struct FTable {
  __m512 t[16];  // 2^B floats, 16 per register (B <= 8)
};
// Centroids of the codes in the low byte of each dword of idx (upper bytes ignored).
template <int B>
inline __m512 lookup_f(const FTable& T, __m512i idx) {
  if constexpr (B <= 4) {
    return _mm512_permutexvar_ps(idx, T.t[0]);
  } else if constexpr (B == 5) {
    return _mm512_permutex2var_ps(T.t[0], idx, T.t[1]);
  } else {
    // 32-entry slices selected by the code's bits 5 and up.
    const __m512i hi = _mm512_srli_epi32(_mm512_and_si512(idx, _mm512_set1_epi32(0xff)), 5);
    __m512 r = _mm512_permutex2var_ps(T.t[0], idx, T.t[1]);
    for (int h = 1; h < (1 << (B - 5)); ++h)
      r = _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(hi, _mm512_set1_epi32(h)), r,
                               _mm512_permutex2var_ps(T.t[2 * h], idx, T.t[2 * h + 1]));
    return r;
  }
}
// Byte i of every dword of idx moved to byte 0.
template <int I>
inline __m512i byte_of(__m512i idx) {
  if constexpr (I == 0) return idx;
  else return _mm512_srli_epi32(idx, 8 * I);
}

// K: raw[g][32] = sum_d qf[g][d] * c(code(t, d)) for the 32 token slots of a block (slots
// past nt score zero codes; the caller masks them). Both 16-token halves at once: 2 G
// independent FMA chains.
template <int G, int B>
void score_block_f(const uint8_t* tiles, int D, const float* qf, const FTable& T, float* raw) {
  const int nq = D / 4;
  const uint64_t* p0 = reinterpret_cast<const uint64_t*>(tiles);
  const uint64_t* p1 = p0 + (size_t)nq * B;
  __m512 a0[G], a1[G];
  for (int g = 0; g < G; ++g) a0[g] = a1[g] = _mm512_setzero_ps();
  auto step = [&](auto I, int k, __m512i i0, __m512i i1) {
    const __m512 c0 = lookup_f<B>(T, byte_of<decltype(I)::value>(i0));
    const __m512 c1 = lookup_f<B>(T, byte_of<decltype(I)::value>(i1));
    for (int g = 0; g < G; ++g) {
      const __m512 q = _mm512_set1_ps(qf[(size_t)g * D + 4 * k + decltype(I)::value]);
      a0[g] = _mm512_fmadd_ps(c0, q, a0[g]);
      a1[g] = _mm512_fmadd_ps(c1, q, a1[g]);
    }
  };
  for (int k = 0; k < nq; ++k, p0 += B, p1 += B) {
    const __m512i i0 = tile_codes<B>(p0), i1 = tile_codes<B>(p1);
    step(std::integral_constant<int, 0>{}, k, i0, i1);
    step(std::integral_constant<int, 1>{}, k, i0, i1);
    step(std::integral_constant<int, 2>{}, k, i0, i1);
    step(std::integral_constant<int, 3>{}, k, i0, i1);
  }
  for (int g = 0; g < G; ++g) {
    _mm512_store_ps(raw + g * 32, a0[g]);
    _mm512_store_ps(raw + g * 32 + 16, a1[g]);
  }
}

// V: accv[g][d] = sum_t w[g][t] * c(code(t, d)), w = softmax weight * V norm (0 past nt).
// Two 16-dim columns at once: 2 G independent FMA chains.
template <int G, int B>
void accum_block_f(const uint8_t* tiles, int D, int nt, const float* w, const FTable& T, float* accv) {
  const uint64_t* t64 = reinterpret_cast<const uint64_t*>(tiles);
  const int nr = (nt + 3) / 4;
  const int ne = D / 16;
  for (int e = 0; e < ne; e += 2) {
    const bool two = e + 1 < ne;
    __m512 a0[G], a1[G];
    for (int g = 0; g < G; ++g) a0[g] = a1[g] = _mm512_setzero_ps();
    const uint64_t* p0 = t64 + (size_t)e * 8 * B;
    const uint64_t* p1 = two ? p0 + (size_t)8 * B : p0;
    auto step = [&](auto I, int r, __m512i i0, __m512i i1) {
      const __m512 c0 = lookup_f<B>(T, byte_of<decltype(I)::value>(i0));
      const __m512 c1 = lookup_f<B>(T, byte_of<decltype(I)::value>(i1));
      for (int g = 0; g < G; ++g) {
        const __m512 wv = _mm512_set1_ps(w[g * 32 + 4 * r + decltype(I)::value]);
        a0[g] = _mm512_fmadd_ps(wv, c0, a0[g]);
        a1[g] = _mm512_fmadd_ps(wv, c1, a1[g]);
      }
    };
    for (int r = 0; r < nr; ++r, p0 += B, p1 += B) {
      const __m512i i0 = tile_codes<B>(p0), i1 = tile_codes<B>(p1);
      step(std::integral_constant<int, 0>{}, r, i0, i1);
      step(std::integral_constant<int, 1>{}, r, i0, i1);
      step(std::integral_constant<int, 2>{}, r, i0, i1);
      step(std::integral_constant<int, 3>{}, r, i0, i1);
    }
    for (int g = 0; g < G; ++g) {
      _mm512_store_ps(accv + (size_t)g * D + e * 16, a0[g]);
      if (two) _mm512_store_ps(accv + (size_t)g * D + (e + 1) * 16, a1[g]);
    }
  }
}

// Kernel tables: [G][bits] for the int8 (lut8) and float kernels.
using ScoreFn = void (*)(const uint8_t*, int, int, const int32_t*, __m512i, int32_t*);
using AccumFn = void (*)(const uint8_t*, int, int, const int32_t*, __m512i, int32_t*);
using ScoreFnF = void (*)(const uint8_t*, int, const float*, const FTable&, float*);
using AccumFnF = void (*)(const uint8_t*, int, int, const float*, const FTable&, float*);
constexpr int kMaxBitsLut8 = 6;  // vpermb tables hold 64 bytes
constexpr int kMaxBitsFloat = 8;

template <int G, int B>
struct Fns {
  static constexpr ScoreFn score = B <= kMaxBitsLut8 ? score_block<G, (B <= kMaxBitsLut8 ? B : 1)> : nullptr;
  static constexpr AccumFn accum = B <= kMaxBitsLut8 ? accum_block<G, (B <= kMaxBitsLut8 ? B : 1)> : nullptr;
  static constexpr ScoreFnF score_f = score_block_f<G, B>;
  static constexpr AccumFnF accum_f = accum_block_f<G, B>;
};
template <int G, int B = 1>
void pick_bits(int bits, ScoreFn* s, AccumFn* a, ScoreFnF* sf, AccumFnF* af) {
  if constexpr (B <= kMaxBitsFloat) {
    if (bits == B) {
      *s = Fns<G, B>::score;
      *a = Fns<G, B>::accum;
      *sf = Fns<G, B>::score_f;
      *af = Fns<G, B>::accum_f;
      return;
    }
    pick_bits<G, B + 1>(bits, s, a, sf, af);
  }
}
// All four kernels for G heads per kv head and a codebook of `bits` (nullptr: none).
void pick(int G, int bits, ScoreFn* s, AccumFn* a, ScoreFnF* sf, AccumFnF* af) {
  *s = nullptr, *a = nullptr, *sf = nullptr, *af = nullptr;
  switch (G) {
    case 1: return pick_bits<1>(bits, s, a, sf, af);
    case 2: return pick_bits<2>(bits, s, a, sf, af);
    case 3: return pick_bits<3>(bits, s, a, sf, af);
    case 4: return pick_bits<4>(bits, s, a, sf, af);
    case 8: return pick_bits<8>(bits, s, a, sf, af);
  }
}

const std::vector<float>& table_values(const Codebook* cb) {
  static const std::vector<float> kSigns = {-1.f, 1.f};
  return cb ? cb->centroids : kSigns;
}
// Byte tables of a codebook: centroid * 127 / max|centroid|, K unsigned (+128), V signed.
__m512i byte_table(const Codebook* cb, bool offset, float* cscale) {
  const std::vector<float>& cs = table_values(cb);
  float cmax = 0;
  for (float c : cs) cmax = std::max(cmax, std::fabs(c));
  alignas(64) int8_t t[64] = {};
  for (int j = 0; j < (int)cs.size() && j < 64; ++j) {
    const int v = (int)std::lrint(cs[j] * 127.0 / cmax);
    t[j] = (int8_t)(offset ? v + 128 : v);
  }
  *cscale = cmax / 127.f;
  if (cs.size() > 16) return _mm512_load_si512(t);  // vpermb table
  return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
}
// Float table of a codebook: the centroids themselves (zero padded).
FTable float_table(const Codebook* cb) {
  const std::vector<float>& cs = table_values(cb);
  alignas(64) float t[256] = {};
  for (size_t j = 0; j < cs.size() && j < 256; ++j) t[j] = cs[j];
  FTable T;
  for (int r = 0; r < 16; ++r) T.t[r] = _mm512_load_ps(t + 16 * r);
  return T;
}

inline float hmax(__m512 v) { return _mm512_reduce_max_ps(v); }
inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

// A tq stream is one part (tqB) or two (tq2.5 / tq3.5: outlier and regular channels), each
// with its own codebook, fp16 norms and bit-plane tiles, covering dims [off, off + dim) of
// the stream's domain.
//
// prod K (tq3p / tq4p) is two K parts over all D dims: the (b-1)-bit mse indices scored
// against Pi q with norm s, and the QJL signs (a 1-bit "codebook" {-1, +1}) scored against
// S Pi q with norm s * gamma * sqrt(pi/2) / D: exactly the codec's prod estimator.
struct Part {
  int off = 0, dim = 0, bits = 0;
  const Codebook* cb = nullptr;        // nullptr: the sign table {-1, +1}
  size_t norm_off = 0, tiles_off = 0;  // bytes within a block
  int qoff = 0;                        // query slice (K)
  size_t norm2_off = 0;                // != 0: norm multiplied by this second fp16 norm ...
  float norm_mul = 1.f;                // ... and this constant
};
int parts_of(const Stream& s, Part* p) {
  if (s.fmt->kind == Kind::tq) {
    p[0] = Part{0, s.dim, s.cb->bits, s.cb, 0, s.norms_bytes, 0};
    return 1;
  }
  if (s.fmt->kind == Kind::tq_prod) {
    const int D = s.dim;
    p[0] = Part{0, D, s.cb->bits, s.cb, 0, s.norms_bytes, 0};
    p[1] = Part{0, D, 1, nullptr, 0, s.norms_bytes + s.tiles_hi_bytes, D, kBlock * 2,
                (float)(1.2533141373155003 / D)  /* sqrt(pi/2) / D */};
    return 2;
  }
  p[0] = Part{0, s.d_hi, s.cb_hi->bits, s.cb_hi, 0, s.norms_bytes, 0};
  p[1] = Part{s.d_hi, s.d_lo, s.cb->bits, s.cb, kBlock * 2, s.norms_bytes + s.tiles_hi_bytes, s.d_hi};
  return 2;
}

inline __m512 load_norms16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// One driver for both kernels. kLut8: int8 query and softmax weights against byte tables
// (vpdpbusd); otherwise float centroids and float FMAs (no rounding beyond float sums).
template <bool kLut8>
bool run(const Shape& sh, const Stream& sk, const Stream& sv, const float* qd, int limit, int a, int b,
         const States& st) {
  const int G = sh.G;
  Part pk[2], pv[2];
  const int npk = parts_of(sk, pk), npv = parts_of(sv, pv);
  ScoreFn score[2] = {};
  AccumFn accum[2] = {};
  ScoreFnF score_f[2] = {};
  AccumFnF accum_f[2] = {};
  for (int i = 0; i < npk; ++i) {
    ScoreFn s;
    AccumFn a_;
    ScoreFnF sf;
    AccumFnF af;
    pick(G, pk[i].bits, &s, &a_, &sf, &af);
    score[i] = s, score_f[i] = sf;
    if (kLut8 ? !s : !sf) return false;
  }
  for (int i = 0; i < npv; ++i) {
    ScoreFn s;
    AccumFn a_;
    ScoreFnF sf;
    AccumFnF af;
    pick(G, pv[i].bits, &s, &a_, &sf, &af);
    accum[i] = a_, accum_f[i] = af;
    if (kLut8 ? !a_ : !af) return false;
  }
  constexpr int kMaxG = 8;
  // lut8: int8 query per K part (G x dim), int32 raw scores, uint8 weights, int32 V sums.
  // float: the query slices are read in place, float raw scores / weights / V sums.
  alignas(64) int8_t q8[kLut8 ? kMaxG * 2 * kMaxHeadDim : 64];
  alignas(64) int32_t raw[2][kMaxG * 32];
  alignas(64) float rawf[2][kMaxG * 32];
  alignas(64) uint8_t w8[2][kMaxG * 32];
  alignas(64) float wf[2][kMaxG * 32];
  alignas(64) int32_t accv[kLut8 ? kMaxG * kMaxHeadDim : 16];
  alignas(64) float accvf[kLut8 ? 16 : kMaxG * kMaxHeadDim];
  alignas(64) float qf[kLut8 ? 16 : kMaxG * 2 * kMaxHeadDim];
  float kscale[2][kMaxG], qoff[2][kMaxG], alpha[kMaxG];
  __m512i tblK[2], tblV[2];
  FTable ftK[2], ftV[2];
  float ck[2] = {1.f, 1.f}, cv[2] = {1.f, 1.f};
  for (int i = 0; i < npk; ++i) {
    if constexpr (kLut8) tblK[i] = byte_table(pk[i].cb, true, &ck[i]);
    else ftK[i] = float_table(pk[i].cb);
  }
  for (int i = 0; i < npv; ++i) {
    if constexpr (kLut8) tblV[i] = byte_table(pv[i].cb, false, &cv[i]);
    else ftV[i] = float_table(pv[i].cb);
  }
  size_t q_off[2] = {0, 0};
  for (int i = 0; i < npk; ++i) {
    q_off[i] = i == 0 ? 0 : (size_t)G * pk[0].dim;
    for (int g = 0; g < G; ++g) {
      const float* qg = qd + (size_t)g * sh.qstride + pk[i].qoff;
      if constexpr (!kLut8) {
        std::memcpy(qf + q_off[i] + (size_t)g * pk[i].dim, qg, sizeof(float) * pk[i].dim);
        kscale[i][g] = sh.scale;
        qoff[i][g] = 0;
        continue;
      }
      int8_t* out = q8 + q_off[i] + (size_t)g * pk[i].dim;
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
      kscale[i][g] = sq * ck[i] * sh.scale;
      qoff[i][g] = 128.f * (float)sum;
    }
  }
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const __m512 ninf = _mm512_set1_ps(neg_inf);
  const int end = std::min(b, limit);
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (int t0 = a; t0 < end; t0 += kBlock) {
    const int nt = std::min(kBlock, end - t0);
    const uint8_t* kb = sk.block(t0 / kBlock);
    const uint8_t* vb = sv.block(t0 / kBlock);
    for (int i = 0; i < npk; ++i) {
      if constexpr (kLut8)
        score[i](kb + pk[i].tiles_off, pk[i].dim, nt, reinterpret_cast<const int32_t*>(q8 + q_off[i]), tblK[i],
                 raw[i]);
      else
        score_f[i](kb + pk[i].tiles_off, pk[i].dim, qf + q_off[i], ftK[i], rawf[i]);
    }
    const __mmask16 valid0 = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(nt));
    const __mmask16 valid1 = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(nt - 16));
    __m512 kn0[2], kn1[2], vn0[2], vn1[2];
    for (int i = 0; i < npk; ++i) {
      kn0[i] = load_norms16(kb + pk[i].norm_off);
      kn1[i] = load_norms16(kb + pk[i].norm_off + 32);
      if (pk[i].norm2_off) {
        const __m512 mul = _mm512_set1_ps(pk[i].norm_mul);
        kn0[i] = _mm512_mul_ps(_mm512_mul_ps(kn0[i], load_norms16(kb + pk[i].norm2_off)), mul);
        kn1[i] = _mm512_mul_ps(_mm512_mul_ps(kn1[i], load_norms16(kb + pk[i].norm2_off + 32)), mul);
      }
    }
    for (int i = 0; i < npv; ++i) {
      vn0[i] = load_norms16(vb + pv[i].norm_off);
      vn1[i] = load_norms16(vb + pv[i].norm_off + 32);
    }
    bool any_w[2] = {false, false};
    float wsc[2][kMaxG];
    for (int g = 0; g < G; ++g) {
      __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
      for (int i = 0; i < npk; ++i) {
        const __m512 ks = _mm512_set1_ps(kscale[i][g]);
        __m512 r0, r1;
        if constexpr (kLut8) {
          const __m512 off = _mm512_set1_ps(qoff[i][g]);
          r0 = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_load_si512(raw[i] + g * 32)), off);
          r1 = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_load_si512(raw[i] + g * 32 + 16)), off);
        } else {
          r0 = _mm512_load_ps(rawf[i] + g * 32);
          r1 = _mm512_load_ps(rawf[i] + g * 32 + 16);
        }
        s0 = _mm512_fmadd_ps(_mm512_mul_ps(r0, ks), kn0[i], s0);
        s1 = _mm512_fmadd_ps(_mm512_mul_ps(r1, ks), kn1[i], s1);
      }
      s0 = _mm512_mask_mov_ps(ninf, valid0, s0);
      s1 = _mm512_mask_mov_ps(ninf, valid1, s1);
      const float mb = hmax(_mm512_max_ps(s0, s1));
      float& m = st.m(g);
      const float m_new = std::max(m, mb);
      alpha[g] = m == neg_inf ? 0.f : std::exp(m - m_new);
      m = m_new;
      const __m512 vm = _mm512_set1_ps(m_new);
      const __m512 p0 = _mm512_maskz_mov_ps(valid0, exp512(_mm512_sub_ps(s0, vm)));
      const __m512 p1 = _mm512_maskz_mov_ps(valid1, exp512(_mm512_sub_ps(s1, vm)));
      st.l(g) = st.l(g) * alpha[g] + hsum(_mm512_add_ps(p0, p1));
      for (int i = 0; i < npv; ++i) {
        const __m512 w0 = _mm512_mul_ps(p0, vn0[i]), w1 = _mm512_mul_ps(p1, vn1[i]);
        if constexpr (!kLut8) {
          _mm512_store_ps(wf[i] + g * 32, w0);
          _mm512_store_ps(wf[i] + g * 32 + 16, w1);
          wsc[i][g] = 1.f;
          any_w[i] = true;
          continue;
        }
        const float wmax = hmax(_mm512_max_ps(w0, w1));
        if (wmax > 0) {
          const __m512 f = _mm512_set1_ps(255.f / wmax);
          const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(w0, f));
          const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(w1, f));
          _mm_store_si128(reinterpret_cast<__m128i*>(w8[i] + g * 32), _mm512_cvtusepi32_epi8(i0));
          _mm_store_si128(reinterpret_cast<__m128i*>(w8[i] + g * 32 + 16), _mm512_cvtusepi32_epi8(i1));
          wsc[i][g] = wmax / 255.f * cv[i];
          any_w[i] = true;
        } else {
          std::memset(w8[i] + g * 32, 0, 32);
          wsc[i][g] = 0;
        }
      }
    }
    for (int i = 0; i < npv; ++i) {
      const Part& P = pv[i];
      if (any_w[i]) {
        if constexpr (kLut8)
          accum[i](vb + P.tiles_off, P.dim, nt, reinterpret_cast<const int32_t*>(w8[i]), tblV[i], accv);
        else
          accum_f[i](vb + P.tiles_off, P.dim, nt, wf[i], ftV[i], accvf);
      }
      for (int g = 0; g < G; ++g) {
        float* o = st.acc(g) + P.off;
        const __m512 al = _mm512_set1_ps(alpha[g]), ws = _mm512_set1_ps(wsc[i][g]);
        for (int d = 0; d < P.dim; d += 16) {
          __m512 x = _mm512_mul_ps(_mm512_loadu_ps(o + d), al);
          if (any_w[i]) {
            if constexpr (kLut8)
              x = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(accv + (size_t)g * P.dim + d)), ws, x);
            else
              x = _mm512_add_ps(x, _mm512_load_ps(accvf + (size_t)g * P.dim + d));
          }
          _mm512_storeu_ps(o + d, x);
        }
      }
    }
  }
  return true;
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

bool has_avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return ok;
}
bool has_vnni_vbmi() {
  static const bool ok = has_avx512() && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
  return ok;
}

}  // namespace

bool decode_tq_supported(const Shape& sh, const Stream& sk, const Stream& sv, bool lut8) {
  const int max_bits = lut8 ? kMaxBitsLut8 : kMaxBitsFloat;
  if (sk.fmt->kind == Kind::tq_prod) {
    if (sk.cb->bits > max_bits || sv.fmt->kind == Kind::tq_prod) return false;
  }
  for (const Stream* s : {&sk, &sv}) {
    if (s == &sk && s->fmt->kind == Kind::tq_prod) continue;
    if (s->fmt->kind != Kind::tq && s->fmt->kind != Kind::tq_split) return false;
    if (s->cb->bits > max_bits || (s->cb_hi && s->cb_hi->bits > max_bits)) return false;
    if (s->fmt->kind == Kind::tq_split && !s->split_frozen) return false;
  }
  if (sh.D % 16 != 0 || sh.D > kMaxHeadDim) return false;
  if (sh.G != 1 && sh.G != 2 && sh.G != 3 && sh.G != 4 && sh.G != 8) return false;
  // The SIMD level (TQ_SIMD / --simd) caps what runs: avx3 (AVX-512 F/BW/DQ/VL) for the float
  // kernel, avx3_dl (adds VNNI, VBMI) for the int8 one.
  const std::string level = simd::current_level();
  if (lut8) return has_vnni_vbmi() && level == "avx3_dl";
  return has_avx512() && (level == "avx3" || level == "avx3_dl");
}

bool decode_tq(const Shape& sh, const Stream& sk, const Stream& sv, const float* qd, int limit, int a, int b,
               const States& st, bool lut8) {
  if (!decode_tq_supported(sh, sk, sv, lut8)) return false;
  return lut8 ? run<true>(sh, sk, sv, qd, limit, a, b, st) : run<false>(sh, sk, sv, qd, limit, a, b, st);
}

}  // namespace tq::kv
