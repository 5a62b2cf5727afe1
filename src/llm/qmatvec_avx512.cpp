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
#include <immintrin.h>

#include <algorithm>
#include <cstring>

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

// Software prefetch distance in bytes of the weight stream: the Gemma 3 270M output matrix
// (178 MB of Q8_0, one thread, bench_qmatvec GemmaHead/1) took 1.42x less CPU time with 4096
// bytes ahead than without, as little as a plain read of the same bytes (GemmaHeadRead/1);
// 1024 bytes: 1.26x (measured with the 8-bit vpdpbusd version of these kernels).
constexpr int kPrefetch = 4096;
inline void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetch, _MM_HINT_T0); }

inline __m512i ldq(const int16_t* p) { return _mm512_loadu_si512(p); }

// The 32 nibbles of a Q4 block's 16 code bytes in value order (low nibbles, then high).
inline __m512i nibbles32(const uint8_t* qs) {
  const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  const __m256i m15 = _mm256_set1_epi16(15);
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m15)), _mm256_srli_epi16(v, 4), 1);
}

// kType: 0 Q8_0, 1 Q4_0, 2 Q4_1, 3 Q5_0 (32-value blocks with one fp16 d).
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
      __m512i c;
      if constexpr (kType == 0) {
        c = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)));
      } else if constexpr (kType == 1) {
        c = _mm512_sub_epi16(nibbles32(blk + 2), _mm512_set1_epi16(8));
      } else if constexpr (kType == 2) {
        c = nibbles32(blk + 4);
      } else {
        uint32_t qh;
        std::memcpy(&qh, blk + 2, 4);
        c = nibbles32(blk + 6);
        c = _mm512_mask_add_epi16(c, _cvtu32_mask32(qh), c, _mm512_set1_epi16(16));
        c = _mm512_sub_epi16(c, _mm512_set1_epi16(16));
      }
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

// Q6_K: per half h and quarter g, 32 values (one block of x) as one vector: 4 bits from ql,
// 2 from qh, minus 32; lanes 0-7 are the first 16-value group (scale sc[2 (4h + g)]), lanes
// 8-15 the second.
template <int NR>
void rows_q6k(const uint8_t* w, int in, const X16& x, int o0, int o1, float* y, int ldy) {
  const int nsb = in / kQK, nb = in / 32;
  const size_t rb = sizeof(BlockQ6_K) * static_cast<size_t>(nsb);
  const __m512i m15 = _mm512_set1_epi16(15), m3 = _mm512_set1_epi16(3), k32 = _mm512_set1_epi16(32);
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
        const __m512i qh = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h)));
        for (int g = 0; g < 4; ++g) {
          const __m512i ql =
              _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32 * (g & 1))));
          const __m512i lq = _mm512_and_si512(_mm512_srl_epi16(ql, _mm_cvtsi32_si128(4 * (g >> 1))), m15);
          const __m512i hq = _mm512_and_si512(_mm512_srl_epi16(qh, _mm_cvtsi32_si128(2 * g)), m3);
          const __m512i c = _mm512_sub_epi16(_mm512_or_si512(lq, _mm512_slli_epi16(hq, 4)), k32);
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

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace

bool qmv16_avx512_host_ok() noexcept {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                         __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
  return ok;
}

void qmv16_rows_avx512(GgmlType t, const uint8_t* w, int in, const X16& x, int n, int o0, int o1, float* y,
                       int ldy) noexcept {
  rows_any(t, w, in, x, n, o0, o1, y, ldy);
}

}  // namespace tq::llm::detail
