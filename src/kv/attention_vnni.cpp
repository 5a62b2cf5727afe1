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
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,avx512f,avx512vl,avx512dq,avx512bw,avx512vnni")

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
  return idx;
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
        const __m512i vals = _mm512_shuffle_epi8(tbl, tile_codes<B>(pl));
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
      const __m512i vals = _mm512_shuffle_epi8(tbl, tile_codes<B>(pl));
      for (int g = 0; g < G; ++g) acc[g] = _mm512_dpbusd_epi32(acc[g], _mm512_set1_epi32(w32[g * 8 + r]), vals);
    }
    for (int g = 0; g < G; ++g) _mm512_store_si512(accv + (size_t)g * D + e * 16, acc[g]);
  }
}

using ScoreFn = void (*)(const uint8_t*, int, int, const int32_t*, __m512i, int32_t*);
using AccumFn = void (*)(const uint8_t*, int, int, const int32_t*, __m512i, int32_t*);

template <int G>
ScoreFn pick_score(int bits) {
  switch (bits) {
    case 1: return score_block<G, 1>;
    case 2: return score_block<G, 2>;
    case 3: return score_block<G, 3>;
    case 4: return score_block<G, 4>;
  }
  return nullptr;
}
template <int G>
AccumFn pick_accum(int bits) {
  switch (bits) {
    case 1: return accum_block<G, 1>;
    case 2: return accum_block<G, 2>;
    case 3: return accum_block<G, 3>;
    case 4: return accum_block<G, 4>;
  }
  return nullptr;
}

// Byte tables of a codebook: centroid * 127 / max|centroid|, K unsigned (+128), V signed.
__m512i byte_table(const Codebook& cb, bool offset, float* cscale) {
  float cmax = 0;
  for (float c : cb.centroids) cmax = std::max(cmax, std::fabs(c));
  alignas(16) int8_t t[16] = {};
  for (int j = 0; j < cb.levels() && j < 16; ++j) {
    const int v = (int)std::lrint(cb.centroids[j] * 127.0 / cmax);
    t[j] = (int8_t)(offset ? v + 128 : v);
  }
  *cscale = cmax / 127.f;
  return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
}

inline float hmax(__m512 v) { return _mm512_reduce_max_ps(v); }
inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

bool run(const Shape& sh, const Stream& sk, const Stream& sv, const float* qd, int limit, int a, int b,
         const States& st) {
  const int D = sh.D, G = sh.G, nq = D / 4;
  ScoreFn score = nullptr;
  AccumFn accum = nullptr;
  switch (G) {
    case 1: score = pick_score<1>(sk.cb->bits); accum = pick_accum<1>(sv.cb->bits); break;
    case 2: score = pick_score<2>(sk.cb->bits); accum = pick_accum<2>(sv.cb->bits); break;
    case 3: score = pick_score<3>(sk.cb->bits); accum = pick_accum<3>(sv.cb->bits); break;
    case 4: score = pick_score<4>(sk.cb->bits); accum = pick_accum<4>(sv.cb->bits); break;
    case 8: score = pick_score<8>(sk.cb->bits); accum = pick_accum<8>(sv.cb->bits); break;
    default: return false;
  }
  if (!score || !accum) return false;
  constexpr int kMaxG = 8;
  alignas(64) int8_t q8[kMaxG * kMaxHeadDim];
  alignas(64) int32_t raw[kMaxG * 32];
  alignas(64) uint8_t w8[kMaxG * 32];
  alignas(64) int32_t accv[kMaxG * kMaxHeadDim];
  float kscale[kMaxG], qoff[kMaxG], wscale[kMaxG], alpha[kMaxG];
  float ck, cv;
  const __m512i tblK = byte_table(*sk.cb, true, &ck);
  const __m512i tblV = byte_table(*sv.cb, false, &cv);
  for (int g = 0; g < G; ++g) {
    const float* qg = qd + (size_t)g * D;
    float amax = 0;
    for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs(qg[d]));
    const float sq = amax > 0 ? amax / 127.f : 1.f;
    const float inv = 1.f / sq;
    int sum = 0;
    for (int d = 0; d < D; ++d) {
      const int v = (int)std::lrint(qg[d] * inv);
      q8[g * D + d] = (int8_t)v;
      sum += v;
    }
    kscale[g] = sq * ck * sh.scale;
    qoff[g] = 128.f * (float)sum;
  }
  const int32_t* q32 = reinterpret_cast<const int32_t*>(q8);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int end = std::min(b, limit);
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (int t0 = a; t0 < end; t0 += kBlock) {
    const int nt = std::min(kBlock, end - t0);
    const uint8_t* kb = sk.block(t0 / kBlock);
    const uint8_t* vb = sv.block(t0 / kBlock);
    score(kb + sk.norms_bytes, D, nt, q32, tblK, raw);
    const __mmask16 valid0 = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(nt));
    const __mmask16 valid1 = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(nt - 16));
    const uint16_t* kn = reinterpret_cast<const uint16_t*>(kb);
    const uint16_t* vn = reinterpret_cast<const uint16_t*>(vb);
    const __m512 kn0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kn)));
    const __m512 kn1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kn + 16)));
    const __m512 vn0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vn)));
    const __m512 vn1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vn + 16)));
    bool any_w = false;
    for (int g = 0; g < G; ++g) {
      const __m512 off = _mm512_set1_ps(qoff[g]), ks = _mm512_set1_ps(kscale[g]);
      const __m512 ninf = _mm512_set1_ps(neg_inf);
      __m512 s0 = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_load_si512(raw + g * 32)), off);
      __m512 s1 = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_load_si512(raw + g * 32 + 16)), off);
      s0 = _mm512_mask_mul_ps(ninf, valid0, _mm512_mul_ps(s0, ks), kn0);
      s1 = _mm512_mask_mul_ps(ninf, valid1, _mm512_mul_ps(s1, ks), kn1);
      const float mb = hmax(_mm512_max_ps(s0, s1));
      float& m = st.m(g);
      const float m_new = std::max(m, mb);
      alpha[g] = m == neg_inf ? 0.f : std::exp(m - m_new);
      m = m_new;
      const __m512 vm = _mm512_set1_ps(m_new);
      const __m512 p0 = _mm512_maskz_mov_ps(valid0, exp512(_mm512_sub_ps(s0, vm)));
      const __m512 p1 = _mm512_maskz_mov_ps(valid1, exp512(_mm512_sub_ps(s1, vm)));
      st.l(g) = st.l(g) * alpha[g] + hsum(_mm512_add_ps(p0, p1));
      const __m512 w0 = _mm512_mul_ps(p0, vn0), w1 = _mm512_mul_ps(p1, vn1);
      const float wmax = hmax(_mm512_max_ps(w0, w1));
      if (wmax > 0) {
        const __m512 f = _mm512_set1_ps(255.f / wmax);
        const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(w0, f));
        const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(w1, f));
        _mm_store_si128(reinterpret_cast<__m128i*>(w8 + g * 32), _mm512_cvtusepi32_epi8(i0));
        _mm_store_si128(reinterpret_cast<__m128i*>(w8 + g * 32 + 16), _mm512_cvtusepi32_epi8(i1));
        wscale[g] = wmax / 255.f * cv;
        any_w = true;
      } else {
        std::memset(w8 + g * 32, 0, 32);
        wscale[g] = 0;
      }
    }
    if (any_w) accum(vb + sv.norms_bytes, D, nt, reinterpret_cast<const int32_t*>(w8), tblV, accv);
    for (int g = 0; g < G; ++g) {
      float* o = st.acc(g);
      const __m512 al = _mm512_set1_ps(alpha[g]), ws = _mm512_set1_ps(wscale[g]);
      for (int d = 0; d < D; d += 16) {
        __m512 x = _mm512_mul_ps(_mm512_loadu_ps(o + d), al);
        if (any_w) x = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(accv + (size_t)g * D + d)), ws, x);
        _mm512_storeu_ps(o + d, x);
      }
    }
  }
  (void)nq;
  return true;
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

bool host_ok() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  return ok;
}

}  // namespace

bool decode_tq_vnni(const Shape& sh, const Stream& sk, const Stream& sv, const float* qd, int limit, int a,
                    int b, const States& st) {
  if (!host_ok() || sk.cb->bits > 4 || sv.cb->bits > 4 || sh.D % 16 != 0 || sh.D > kMaxHeadDim) return false;
  if (simd::current_level() != "avx3_dl") return false;
  return run(sh, sk, sv, qd, limit, a, b, st);
}

}  // namespace tq::kv
