// Integer-activation matvec kernels on AVX-512 (F, BW, VL; see qmatvec.h): the decode path's
// block products at the avx3 and avx3_dl levels (qmv16_rows_simd picks them; sse4 / avx2 use
// the Highway kernels of qmatvec_simd.cpp, the scalar level the reference).
//
// Per 32-value block of a weight row the signed codes c (Q8_0: the int8; Q4_0: nibble - 8;
// Q4_1 / Q4_K: nibble; Q5_0: nibble plus the fifth bit from qh (one masked add) - 16; Q6_K:
// 6-bit value - 32) are widened to the 32 int16 lanes of one 512-bit vector, and one vpmaddwd
// per row of x multiplies them with the 32 16-bit activation codes q into 16 int32 lanes
// (each the sum of 2 products of at most 128 * 32767: exact in int32 and in float). The
// lanes are converted to float and multiplied by d dx of the block (Q6_K: d sc of each
// 16-value half, 8 lanes each) into a float accumulator; Q4_1 / Q4_K add m * (dx sum q) as a
// scalar. One horizontal sum per output row and row of x. The weight stream is prefetched
// 4 KB ahead.
//
// Also the prefill GEMM (qgemm16_rows_avx512, "Prefill GEMM" below: weight tiles unpacked once
// to 16-bit codes, then vpdpwssd / vpmaddwd with output rows in the lanes) and quantize_x16 on
// AVX-512 (quantize_x16_avx512: the reference's bits).
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "llm/qmatvec.h"

namespace tq::llm::detail {
namespace {

#pragma GCC push_options
#pragma GCC diagnostic push
// GCC 12's AVX-512 headers leave the upper half of _mm512_castsi256_si512 and of the
// reductions "uninitialized" on purpose (attention_vnni.cpp silences the same).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,avx512f,avx512vl,avx512dq,avx512bw")

inline float h2f(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// The weight stream, kWeightPrefetch bytes ahead (qmatvec.h).
inline void prefetch(const uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p) + kWeightPrefetch, _MM_HINT_T0);
}

inline __m512i ldq(const int16_t* p) { return _mm512_loadu_si512(p); }

// The 32 nibbles of a Q4 block's 16 code bytes in value order (low nibbles, then high).
inline __m512i nibbles32(const uint8_t* qs) {
  const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  const __m256i m15 = _mm256_set1_epi16(15);
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m15)), _mm256_srli_epi16(v, 4), 1);
}

// kType: 0 Q8_0, 1 Q4_0, 2 Q4_1, 3 Q5_0 (32-value blocks with one fp16 d).
// The block's 32 signed codes (Q4_1: unsigned; its offset m is applied by the caller).
template <int kType>
inline __m512i b32_codes(const uint8_t* blk) {
  if constexpr (kType == 0) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)));
  } else if constexpr (kType == 1) {
    return _mm512_sub_epi16(nibbles32(blk + 2), _mm512_set1_epi16(8));
  } else if constexpr (kType == 2) {
    return nibbles32(blk + 4);
  } else {
    uint32_t qh;
    std::memcpy(&qh, blk + 2, 4);
    const __m512i c = nibbles32(blk + 6);
    return _mm512_sub_epi16(_mm512_mask_add_epi16(c, _cvtu32_mask32(qh), c, _mm512_set1_epi16(16)),
                            _mm512_set1_epi16(16));
  }
}

// Q6_K: per half h and quarter g, 32 values (one block of x) as one vector: 4 bits from ql,
// 2 from qh, minus 32; lanes 0-7 are the first 16-value group (scale sc[2 (4h + g)]), lanes
// 8-15 the second.
inline __m512i q6k_codes(const uint8_t* blk, int h, int g) {
  const __m512i qh = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h)));
  const __m512i ql =
      _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32 * (g & 1))));
  const __m512i lq = _mm512_and_si512(_mm512_srl_epi16(ql, _mm_cvtsi32_si128(4 * (g >> 1))), _mm512_set1_epi16(15));
  const __m512i hq = _mm512_and_si512(_mm512_srl_epi16(qh, _mm_cvtsi32_si128(2 * g)), _mm512_set1_epi16(3));
  return _mm512_sub_epi16(_mm512_or_si512(lq, _mm512_slli_epi16(hq, 4)), _mm512_set1_epi16(32));
}

template <int NR, int kType>
void rows_b32(const uint8_t* w, int in, const X16& x, int o0, int o1, float* y, int ldy) {
  const int nb = in / 32;
  constexpr size_t kBB = kType == 0 ? sizeof(BlockQ8_0)
                         : kType == 1 ? sizeof(BlockQ4_0)
                         : kType == 2 ? sizeof(BlockQ4_1)
                                      : sizeof(BlockQ5_0);
  const size_t rb = kBB * static_cast<size_t>(nb);
  for (int o = o0; o < o1; ++o) {
    const uint8_t* blk = w + static_cast<size_t>(o) * rb;
    __m512 acc[NR];
    float macc[NR];
    for (int r = 0; r < NR; ++r) {
      acc[r] = _mm512_setzero_ps();
      macc[r] = 0.0f;
    }
    for (int b = 0; b < nb; ++b, blk += kBB) {
      prefetch(blk);
      const float d = h2f(blk);
      const __m512i c = b32_codes<kType>(blk);
      for (int r = 0; r < NR; ++r) {
        const size_t k = static_cast<size_t>(r) * nb + b;
        const __m512i s = _mm512_madd_epi16(c, ldq(x.q + static_cast<size_t>(r) * in + 32 * static_cast<size_t>(b)));
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(d * x.d[k]), _mm512_cvtepi32_ps(s), acc[r]);
        if constexpr (kType == 2) macc[r] += h2f(blk + 2) * x.s[k];
      }
    }
    for (int r = 0; r < NR; ++r) y[static_cast<size_t>(r) * ldy + o] = _mm512_reduce_add_ps(acc[r]) + macc[r];
  }
}

template <int NR>
void rows_q4k(const uint8_t* w, int in, const X16& x, int o0, int o1, float* y, int ldy) {
  const int nsb = in / kQK, nb = in / 32;
  const size_t rb = sizeof(BlockQ4_K) * static_cast<size_t>(nsb);
  const __m512i m15 = _mm512_set1_epi16(15);
  for (int o = o0; o < o1; ++o) {
    const uint8_t* blk = w + static_cast<size_t>(o) * rb;
    __m512 acc[NR];
    float macc[NR];
    for (int r = 0; r < NR; ++r) {
      acc[r] = _mm512_setzero_ps();
      macc[r] = 0.0f;
    }
    for (int b = 0; b < nsb; ++b, blk += sizeof(BlockQ4_K)) {
      const float d = h2f(blk), dmin = h2f(blk + 2);
      for (int c = 0; c < 4; ++c) {
        prefetch(blk + 32 * c);
        const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c)));
        const __m512i lo = _mm512_and_si512(v, m15), hi = _mm512_srli_epi16(v, 4);
        int sc0, mn0, sc1, mn1;
        kquant_scale_min(blk + 4, 2 * c, sc0, mn0);
        kquant_scale_min(blk + 4, 2 * c + 1, sc1, mn1);
        const float ds0 = d * static_cast<float>(sc0), ds1 = d * static_cast<float>(sc1);
        const float m0 = dmin * static_cast<float>(mn0), m1 = dmin * static_cast<float>(mn1);
        const int k0 = b * 8 + 2 * c;
        for (int r = 0; r < NR; ++r) {
          const size_t k = static_cast<size_t>(r) * nb + k0;
          const int16_t* q = x.q + static_cast<size_t>(r) * in + 32 * static_cast<size_t>(k0);
          const __m512i s0 = _mm512_madd_epi16(lo, ldq(q)), s1 = _mm512_madd_epi16(hi, ldq(q + 32));
          acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(ds0 * x.d[k]), _mm512_cvtepi32_ps(s0), acc[r]);
          macc[r] -= m0 * x.s[k];
          acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(ds1 * x.d[k + 1]), _mm512_cvtepi32_ps(s1), acc[r]);
          macc[r] -= m1 * x.s[k + 1];
        }
      }
    }
    for (int r = 0; r < NR; ++r) y[static_cast<size_t>(r) * ldy + o] = _mm512_reduce_add_ps(acc[r]) + macc[r];
  }
}

// Q6_K: 32 codes at a time (q6k_codes), lanes 0-7 scaled by sc[2 (4h + g)], 8-15 by the next.
template <int NR>
void rows_q6k(const uint8_t* w, int in, const X16& x, int o0, int o1, float* y, int ldy) {
  const int nsb = in / kQK, nb = in / 32;
  const size_t rb = sizeof(BlockQ6_K) * static_cast<size_t>(nsb);
  for (int o = o0; o < o1; ++o) {
    const uint8_t* blk = w + static_cast<size_t>(o) * rb;
    __m512 acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nsb; ++b, blk += sizeof(BlockQ6_K)) {
      prefetch(blk);
      prefetch(blk + 64);
      prefetch(blk + 128);
      prefetch(blk + 192);
      const float d = h2f(blk + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
      for (int h = 0; h < 2; ++h) {
        for (int g = 0; g < 4; ++g) {
          const __m512i c = q6k_codes(blk, h, g);
          const int grp = 2 * (4 * h + g);
          const __m512 dsc = _mm512_insertf32x8(_mm512_set1_ps(d * static_cast<float>(sc[grp])),
                                                _mm256_set1_ps(d * static_cast<float>(sc[grp + 1])), 1);
          const int kx = b * 8 + 4 * h + g;
          for (int r = 0; r < NR; ++r) {
            const size_t k = static_cast<size_t>(r) * nb + kx;
            const __m512i s = _mm512_madd_epi16(c, ldq(x.q + static_cast<size_t>(r) * in + 32 * static_cast<size_t>(kx)));
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dsc, _mm512_set1_ps(x.d[k])), _mm512_cvtepi32_ps(s), acc[r]);
          }
        }
      }
    }
    for (int r = 0; r < NR; ++r) y[static_cast<size_t>(r) * ldy + o] = _mm512_reduce_add_ps(acc[r]);
  }
}

template <int NR>
void rows_nr(GgmlType t, const uint8_t* w, int in, const X16& x, int o0, int o1, float* y, int ldy) {
  switch (t) {
    case GgmlType::Q8_0: return rows_b32<NR, 0>(w, in, x, o0, o1, y, ldy);
    case GgmlType::Q4_0: return rows_b32<NR, 1>(w, in, x, o0, o1, y, ldy);
    case GgmlType::Q4_1: return rows_b32<NR, 2>(w, in, x, o0, o1, y, ldy);
    case GgmlType::Q5_0: return rows_b32<NR, 3>(w, in, x, o0, o1, y, ldy);
    case GgmlType::Q4_K: return rows_q4k<NR>(w, in, x, o0, o1, y, ldy);
    case GgmlType::Q6_K: return rows_q6k<NR>(w, in, x, o0, o1, y, ldy);
    default: return;
  }
}

void rows_any(GgmlType t, const uint8_t* w, int in, const X16& x, int n, int o0, int o1, float* y, int ldy) {
  for (int r0 = 0; r0 < n; r0 += 8) {
    const X16 xr = x.from(r0, in);
    float* yr = y + static_cast<size_t>(r0) * ldy;
    switch (std::min(8, n - r0)) {
      case 1: rows_nr<1>(t, w, in, xr, o0, o1, yr, ldy); break;
      case 2: rows_nr<2>(t, w, in, xr, o0, o1, yr, ldy); break;
      case 3: rows_nr<3>(t, w, in, xr, o0, o1, yr, ldy); break;
      case 4: rows_nr<4>(t, w, in, xr, o0, o1, yr, ldy); break;
      case 5: rows_nr<5>(t, w, in, xr, o0, o1, yr, ldy); break;
      case 6: rows_nr<6>(t, w, in, xr, o0, o1, yr, ldy); break;
      case 7: rows_nr<7>(t, w, in, xr, o0, o1, yr, ldy); break;
      default: rows_nr<8>(t, w, in, xr, o0, o1, yr, ldy); break;
    }
  }
}


// ---- Prefill GEMM (qgemm16_avx512) ----
//
// A tile is 16 output rows; its weights are unpacked once per call into `units` of 32 values
// (one block of x; Q4_K: a 32-value sub-block; Q6_K: a quarter of a half, two 16-value
// groups). A unit holds the 32 signed codes of each of the 16 rows, transposed so that 32-bit
// word 16 j + i is row i's codes 2j and 2j + 1 (one vector per pair of x values), the float
// scales of the 16 rows (Q6_K: one per 16-value group, lo and hi) and the offset coefficient
// m (Q4_1: m; Q4_K: -dmin mn). The kernel multiplies a tile with NR rows of x: per unit and
// row of x, 16 vpdpwssd (avx3_dl; vpmaddwd + vpaddd at avx3) of the weight-pair vectors with
// the broadcast pair of 16-bit x codes give the 16 rows' exact int32 sums (at most 32 products
// of 128 * 32767 per lane); they are converted and added into a float accumulator lane per
// output row: acc = fma(float(isum), d * dx, acc) (+ fma(m, dx sum q, acc) for the offset).
constexpr int kUnitW = 256;                      // int32 words of codes per unit
constexpr int kUnitInts = kUnitW + 3 * 16;       // + d lo, d hi, m
constexpr int kTile = 16;
static_assert(kUnitInts * 4 == kQGemm16UnitBytes, "unit size in qmatvec.h");

// kKind: 0 one scale per unit, 1 one scale and the offset m, 2 two scales (Q6_K).
int unit_kind(GgmlType t) {
  return t == GgmlType::Q6_K ? 2 : (t == GgmlType::Q4_1 || t == GgmlType::Q4_K) ? 1 : 0;
}

// Writes the codes of row i of a tile for one unit (32 int16 in value order, as 16 words).
inline void put_codes(int32_t* unit, int i, __m512i c) {
  const __m512i idx = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
  _mm512_i32scatter_epi32(unit + i, idx, c, 4);
}
inline void put_scales(int32_t* unit, int i, float lo, float hi, float m) {
  float* f = reinterpret_cast<float*>(unit + kUnitW);
  f[i] = lo;
  f[16 + i] = hi;
  f[32 + i] = m;
}

// Unpacks weight row `row` (in values) as row i of the tile whose units start at `tile`.
void unpack_row(GgmlType t, const uint8_t* row, int in, int32_t* tile, int i) {
  const int nu = in / 32;
  switch (t) {
    case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: {
      const size_t bb = t == GgmlType::Q8_0 ? sizeof(BlockQ8_0)
                        : t == GgmlType::Q4_0 ? sizeof(BlockQ4_0)
                        : t == GgmlType::Q4_1 ? sizeof(BlockQ4_1)
                                              : sizeof(BlockQ5_0);
      for (int u = 0; u < nu; ++u, row += bb) {
        int32_t* unit = tile + static_cast<size_t>(u) * kUnitInts;
        const float d = h2f(row);
        const float m = t == GgmlType::Q4_1 ? h2f(row + 2) : 0.0f;
        put_codes(unit, i, t == GgmlType::Q8_0   ? b32_codes<0>(row)
                           : t == GgmlType::Q4_0 ? b32_codes<1>(row)
                           : t == GgmlType::Q4_1 ? b32_codes<2>(row)
                                                 : b32_codes<3>(row));
        put_scales(unit, i, d, d, m);
      }
      return;
    }
    case GgmlType::Q4_K: {
      const __m512i m15 = _mm512_set1_epi16(15);
      for (int b = 0; b < in / kQK; ++b, row += sizeof(BlockQ4_K)) {
        const float d = h2f(row), dmin = h2f(row + 2);
        for (int c = 0; c < 4; ++c) {
          const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16 + 32 * c)));
          for (int half = 0; half < 2; ++half) {
            int sc, mn;
            kquant_scale_min(row + 4, 2 * c + half, sc, mn);
            int32_t* unit = tile + static_cast<size_t>(b * 8 + 2 * c + half) * kUnitInts;
            put_codes(unit, i, half ? _mm512_srli_epi16(v, 4) : _mm512_and_si512(v, m15));
            const float ds = d * static_cast<float>(sc);
            put_scales(unit, i, ds, ds, -(dmin * static_cast<float>(mn)));
          }
        }
      }
      return;
    }
    case GgmlType::Q6_K: {
      for (int b = 0; b < in / kQK; ++b, row += sizeof(BlockQ6_K)) {
        const float d = h2f(row + 208);
        const int8_t* sc = reinterpret_cast<const int8_t*>(row + 192);
        for (int h = 0; h < 2; ++h) {
          for (int g = 0; g < 4; ++g) {
            const int grp = 2 * (4 * h + g);
            int32_t* unit = tile + static_cast<size_t>(b * 8 + 4 * h + g) * kUnitInts;
            put_codes(unit, i, q6k_codes(row, h, g));
            put_scales(unit, i, d * static_cast<float>(sc[grp]), d * static_cast<float>(sc[grp + 1]), 0.0f);
          }
        }
      }
      return;
    }
    default:
      return;
  }
}

// A zero row (past the end of the matrix) in a tile.
void zero_row(int nu, int32_t* tile, int i) {
  for (int u = 0; u < nu; ++u) {
    int32_t* unit = tile + static_cast<size_t>(u) * kUnitInts;
    put_codes(unit, i, _mm512_setzero_si512());
    put_scales(unit, i, 0.0f, 0.0f, 0.0f);
  }
}

// acc + the pairwise products of w with the pair of 16-bit codes at p broadcast to every lane.
template <bool kVnni>
inline __m512i dp(__m512i acc, __m512i w, const int16_t* p) {
  if constexpr (kVnni) {
    // vpdpwssd (AVX512_VNNI) with an embedded broadcast, as inline assembly: this translation
    // unit is compiled for the avx3 level, which does not have it; only called at avx3_dl.
    asm("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(p)));
    return acc;
  } else {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(w, _mm512_set1_epi32(v)));
  }
}

template <int NR, int kKind, bool kVnni>
void tile_rows(const int32_t* tile, int nu, const X16& x, int in, float* y, int ldy, __mmask16 valid) {
  __m512 f[NR];
  for (int r = 0; r < NR; ++r) f[r] = _mm512_setzero_ps();
  for (int u = 0; u < nu; ++u) {
    const int32_t* unit = tile + static_cast<size_t>(u) * kUnitInts;
    const float* sc = reinterpret_cast<const float*>(unit + kUnitW);
    constexpr int kParts = kKind == 2 ? 2 : 1;
    for (int part = 0; part < kParts; ++part) {
      __m512i a[NR];
      for (int r = 0; r < NR; ++r) a[r] = _mm512_setzero_si512();
      constexpr int kPairs = 16 / kParts;
      for (int j = part * kPairs; j < (part + 1) * kPairs; ++j) {
        const __m512i w = _mm512_loadu_si512(unit + 16 * j);
        for (int r = 0; r < NR; ++r)
          a[r] = dp<kVnni>(a[r], w, x.q + static_cast<size_t>(r) * in + 32 * static_cast<size_t>(u) + 2 * j);
      }
      const __m512 d = _mm512_loadu_ps(sc + 16 * part);
      for (int r = 0; r < NR; ++r) {
        const size_t k = static_cast<size_t>(r) * nu + u;
        f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[r]), _mm512_mul_ps(d, _mm512_set1_ps(x.d[k])), f[r]);
      }
    }
    if constexpr (kKind == 1) {
      const __m512 m = _mm512_loadu_ps(sc + 32);
      for (int r = 0; r < NR; ++r)
        f[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(x.s[static_cast<size_t>(r) * nu + u]), f[r]);
    }
  }
  for (int r = 0; r < NR; ++r) _mm512_mask_storeu_ps(y + static_cast<size_t>(r) * ldy, valid, f[r]);
}

template <int kKind, bool kVnni>
void tile_any(const int32_t* tile, int nu, const X16& x, int in, int nr, float* y, int ldy, __mmask16 valid) {
  switch (nr) {
    case 1: return tile_rows<1, kKind, kVnni>(tile, nu, x, in, y, ldy, valid);
    case 2: return tile_rows<2, kKind, kVnni>(tile, nu, x, in, y, ldy, valid);
    case 3: return tile_rows<3, kKind, kVnni>(tile, nu, x, in, y, ldy, valid);
    case 4: return tile_rows<4, kKind, kVnni>(tile, nu, x, in, y, ldy, valid);
    case 5: return tile_rows<5, kKind, kVnni>(tile, nu, x, in, y, ldy, valid);
    case 6: return tile_rows<6, kKind, kVnni>(tile, nu, x, in, y, ldy, valid);
    case 7: return tile_rows<7, kKind, kVnni>(tile, nu, x, in, y, ldy, valid);
    case 8: return tile_rows<8, kKind, kVnni>(tile, nu, x, in, y, ldy, valid);
    case 9: return tile_rows<9, kKind, kVnni>(tile, nu, x, in, y, ldy, valid);
    case 10: return tile_rows<10, kKind, kVnni>(tile, nu, x, in, y, ldy, valid);
    case 11: return tile_rows<11, kKind, kVnni>(tile, nu, x, in, y, ldy, valid);
    default: return tile_rows<12, kKind, kVnni>(tile, nu, x, in, y, ldy, valid);
  }
}

template <int kKind, bool kVnni>
void gemm_rows(GgmlType t, const uint8_t* w, int in, const X16& x, int n, int o0, int o1, float* y, int ldy,
               int panel_rows, std::vector<int32_t>& buf) {
  const int nu = in / 32;
  const size_t rb = ggml_row_bytes(t, static_cast<size_t>(in));
  const size_t tile_ints = static_cast<size_t>(nu) * kUnitInts;
  const int P = std::max(kTile, panel_rows / kTile * kTile);
  if (buf.size() < tile_ints * (P / kTile)) buf.resize(tile_ints * (P / kTile));
  for (int p0 = o0; p0 < o1; p0 += P) {
    const int p1 = std::min(o1, p0 + P);
    const int tiles = (p1 - p0 + kTile - 1) / kTile;
    for (int tl = 0; tl < tiles; ++tl)
      for (int i = 0; i < kTile; ++i) {
        const int o = p0 + tl * kTile + i;
        int32_t* tile = buf.data() + tl * tile_ints;
        if (o < p1) unpack_row(t, w + static_cast<size_t>(o) * rb, in, tile, i);
        else zero_row(nu, tile, i);
      }
    for (int r0 = 0; r0 < n; r0 += kQGemm16Rows) {
      const int nr = std::min(kQGemm16Rows, n - r0);
      const X16 xr = x.from(r0, in);
      for (int tl = 0; tl < tiles; ++tl) {
        const int ot = p0 + tl * kTile;
        const __mmask16 valid = static_cast<__mmask16>((1u << std::min(kTile, p1 - ot)) - 1u);
        tile_any<kKind, kVnni>(buf.data() + tl * tile_ints, nu, xr, in, nr, y + static_cast<size_t>(r0) * ldy + ot,
                               ldy, valid);
      }
    }
  }
}

template <bool kVnni>
void gemm_any(GgmlType t, const uint8_t* w, int in, const X16& x, int n, int o0, int o1, float* y, int ldy,
              int panel_rows) {
  thread_local std::vector<int32_t> buf;  // kept between calls (no page faults per projection)
  switch (unit_kind(t)) {
    case 0: return gemm_rows<0, kVnni>(t, w, in, x, n, o0, o1, y, ldy, panel_rows, buf);
    case 1: return gemm_rows<1, kVnni>(t, w, in, x, n, o0, o1, y, ldy, panel_rows, buf);
    default: return gemm_rows<2, kVnni>(t, w, in, x, n, o0, o1, y, ldy, panel_rows, buf);
  }
}

void gemm_dispatch(GgmlType t, const uint8_t* w, int in, const X16& x, int n, int o0, int o1, float* y, int ldy,
                   int panel_rows, bool vnni) {
  if (vnni) gemm_any<true>(t, w, in, x, n, o0, o1, y, ldy, panel_rows);
  else gemm_any<false>(t, w, in, x, n, o0, o1, y, ldy, panel_rows);
}

// quantize_x16 on AVX-512: the reference's operations value for value (max |x|, dx = amax /
// 32767, id = 1 / dx, x * id rounded to nearest even as nearbyint does in the default rounding
// mode, clamped; the integer sum), so the same bits.
void quantize_x16_rows(const float* x, int in, int16_t* q, float* d, float* s) {
  const int nb = in / 32;
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 fmax = _mm512_set1_ps(std::numeric_limits<float>::max());
  for (int b = 0; b < nb; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
    const __m512 a0 = _mm512_and_ps(v0, absmask), a1 = _mm512_and_ps(v1, absmask);
    const __mmask16 f0 = _mm512_cmp_ps_mask(a0, fmax, _CMP_LE_OQ), f1 = _mm512_cmp_ps_mask(a1, fmax, _CMP_LE_OQ);
    if ((f0 & f1) != 0xffff) {  // inf or NaN inside
      _mm512_storeu_si512(q + 32 * b, _mm512_setzero_si512());
      d[b] = s[b] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
    const float dx = amax / 32767.0f;
    const float id = dx > 0.0f ? 1.0f / dx : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    const __m512i lo = _mm512_set1_epi32(-32767), hi = _mm512_set1_epi32(32767);
    const __m512i c0 = _mm512_min_epi32(hi, _mm512_max_epi32(lo, _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid))));
    const __m512i c1 = _mm512_min_epi32(hi, _mm512_max_epi32(lo, _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid))));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * b), _mm512_cvtepi32_epi16(c0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * b + 16), _mm512_cvtepi32_epi16(c1));
    d[b] = dx;
    s[b] = dx * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(c0, c1)));
  }
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace

// F16C from CPUID leaf 1 (ECX bit 29): clang 14 does not know "f16c" in __builtin_cpu_supports.
static bool host_has_f16c() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

bool qmv16_avx512_host_ok() noexcept {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                         host_has_f16c() && __builtin_cpu_supports("fma");
  return ok;
}

void qmv16_rows_avx512(GgmlType t, const uint8_t* w, int in, const X16& x, int n, int o0, int o1, float* y,
                       int ldy) noexcept {
  rows_any(t, w, in, x, n, o0, o1, y, ldy);
}

void qgemm16_rows_avx512(GgmlType t, const uint8_t* w, int in, const X16& x, int n, int o0, int o1, float* y,
                         int ldy, int panel_rows, bool vnni) noexcept {
  gemm_dispatch(t, w, in, x, n, o0, o1, y, ldy, panel_rows, vnni);
}

void quantize_x16_avx512(const float* x, int n, int in, int16_t* q, float* d, float* s) noexcept {
  const int nb = in / 32;
  for (int r = 0; r < n; ++r)
    quantize_x16_rows(x + static_cast<size_t>(r) * in, in, q + static_cast<size_t>(r) * in,
                      d + static_cast<size_t>(r) * nb, s + static_cast<size_t>(r) * nb);
}

}  // namespace tq::llm::detail
