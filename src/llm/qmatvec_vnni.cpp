// Int8-activation matvec kernels on AVX-512 VNNI (see qmatvec.h): the decode path's block
// products at the avx3_dl level on a host with VNNI (qmv8_rows_simd picks them; every other
// level uses the Highway kernels of qmatvec_simd.cpp, the scalar level the reference).
//
// Per 32-value block of a weight row the codes are made unsigned bytes u = c + off (Q8_0: the
// int8 xor 0x80, off 128; Q4_0 nibbles, off 8; Q5_0 nibbles plus the fifth bit from qh as one
// masked byte add, off 16; Q6_K 6-bit values, off 32; Q4_1 / Q4_K nibbles, off 0) in one
// 256-bit vector, and one vpdpbusd per row of x adds u_j q_j over 4 bytes into 8 int32 lanes,
// starting from X8::bias = -off * (sum of the 4 codes of q), so each lane holds sum c_j q_j of
// its 4 values exactly. The lanes are converted to float and multiplied by d dx of the block
// (Q6_K: d sc of each 16-value half, 4 lanes each) into a float accumulator; Q4_1 / Q4_K add
// m * (dx sum q) as a scalar. One horizontal sum per output row and row of x.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "llm/qmatvec.h"

namespace tq::llm::detail {
namespace {

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,avx512f,avx512vl,avx512dq,avx512bw,avx512vnni")

inline float h2f(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline float hsum(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}

// Software prefetch distance in bytes of the weight stream: the Gemma 3 270M output matrix
// (178 MB of Q8_0, one thread, bench_qmatvec GemmaHead/1) ran 1.42x faster with 4096 bytes
// ahead than without, as fast as a plain read of the same bytes (GemmaHeadRead/1); 1024: 1.26x.
constexpr int kPrefetch = 4096;
inline void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetch, _MM_HINT_T0); }

inline __m256i ld(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// The 32 nibbles of a Q4 block's 16 code bytes in value order (low nibbles, then high).
inline __m256i nibbles32(const uint8_t* qs) {
  const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  const __m256i sh = _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
  return _mm256_and_si256(_mm256_srlv_epi16(v, sh), _mm256_set1_epi8(0x0f));
}

// kType: 0 Q8_0, 1 Q4_0, 2 Q4_1, 3 Q5_0 (32-value blocks with one fp16 d).
template <int NR, int kType>
void rows_b32(const uint8_t* w, int in, const X8& x, int o0, int o1, float* y, int ldy) {
  const int nb = in / 32;
  constexpr size_t kBB = kType == 0 ? sizeof(BlockQ8_0)
                         : kType == 1 ? sizeof(BlockQ4_0)
                         : kType == 2 ? sizeof(BlockQ4_1)
                                      : sizeof(BlockQ5_0);
  const size_t rb = kBB * static_cast<size_t>(nb);
  const size_t in4 = static_cast<size_t>(in) / 4;
  for (int o = o0; o < o1; ++o) {
    const uint8_t* blk = w + static_cast<size_t>(o) * rb;
    __m256 acc[NR];
    float macc[NR];
    for (int r = 0; r < NR; ++r) {
      acc[r] = _mm256_setzero_ps();
      macc[r] = 0.0f;
    }
    for (int b = 0; b < nb; ++b, blk += kBB) {
      prefetch(blk);
      const float d = h2f(blk);
      __m256i u;
      if constexpr (kType == 0) {
        u = _mm256_xor_si256(ld(blk + 2), _mm256_set1_epi8(static_cast<char>(0x80)));
      } else if constexpr (kType == 1) {
        u = nibbles32(blk + 2);
      } else if constexpr (kType == 2) {
        u = nibbles32(blk + 4);
      } else {
        uint32_t qh;
        std::memcpy(&qh, blk + 2, 4);
        u = nibbles32(blk + 6);
        u = _mm256_mask_add_epi8(u, _cvtu32_mask32(qh), u, _mm256_set1_epi8(16));
      }
      for (int r = 0; r < NR; ++r) {
        const size_t k = static_cast<size_t>(r) * nb + b;
        const __m256i start = kType == 2 ? _mm256_setzero_si256() : ld(x.bias + r * in4 + 8 * static_cast<size_t>(b));
        const __m256i s = _mm256_dpbusd_epi32(start, u, ld(x.q + static_cast<size_t>(r) * in + 32 * static_cast<size_t>(b)));
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * x.d[k]), _mm256_cvtepi32_ps(s), acc[r]);
        if constexpr (kType == 2) macc[r] += h2f(blk + 2) * x.s[k];
      }
    }
    for (int r = 0; r < NR; ++r) y[static_cast<size_t>(r) * ldy + o] = hsum(acc[r]) + macc[r];
  }
}

template <int NR>
void rows_q4k(const uint8_t* w, int in, const X8& x, int o0, int o1, float* y, int ldy) {
  const int nsb = in / kQK, nb = in / 32;
  const size_t rb = sizeof(BlockQ4_K) * static_cast<size_t>(nsb);
  const __m256i m15 = _mm256_set1_epi8(0x0f);
  for (int o = o0; o < o1; ++o) {
    const uint8_t* blk = w + static_cast<size_t>(o) * rb;
    __m256 acc[NR];
    float macc[NR];
    for (int r = 0; r < NR; ++r) {
      acc[r] = _mm256_setzero_ps();
      macc[r] = 0.0f;
    }
    for (int b = 0; b < nsb; ++b, blk += sizeof(BlockQ4_K)) {
      const float d = h2f(blk), dmin = h2f(blk + 2);
      for (int c = 0; c < 4; ++c) {
        prefetch(blk + 32 * c);
        const __m256i v = ld(blk + 16 + 32 * c);
        const __m256i lo = _mm256_and_si256(v, m15), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m15);
        int sc0, mn0, sc1, mn1;
        kquant_scale_min(blk + 4, 2 * c, sc0, mn0);
        kquant_scale_min(blk + 4, 2 * c + 1, sc1, mn1);
        const float ds0 = d * static_cast<float>(sc0), ds1 = d * static_cast<float>(sc1);
        const float m0 = dmin * static_cast<float>(mn0), m1 = dmin * static_cast<float>(mn1);
        const int k0 = b * 8 + 2 * c;
        for (int r = 0; r < NR; ++r) {
          const size_t k = static_cast<size_t>(r) * nb + k0;
          const int8_t* q = x.q + static_cast<size_t>(r) * in + 32 * static_cast<size_t>(k0);
          const __m256i s0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, ld(q));
          const __m256i s1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), hi, ld(q + 32));
          acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(ds0 * x.d[k]), _mm256_cvtepi32_ps(s0), acc[r]);
          macc[r] -= m0 * x.s[k];
          acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(ds1 * x.d[k + 1]), _mm256_cvtepi32_ps(s1), acc[r]);
          macc[r] -= m1 * x.s[k + 1];
        }
      }
    }
    for (int r = 0; r < NR; ++r) y[static_cast<size_t>(r) * ldy + o] = hsum(acc[r]) + macc[r];
  }
}

// Q6_K: per half h and quarter g, 32 values (one block of x) as one vector: 4 bits from ql,
// 2 from qh; lanes 0-3 are the first 16-value group (scale sc[2 (4h + g)]), lanes 4-7 the
// second.
template <int NR>
void rows_q6k(const uint8_t* w, int in, const X8& x, int o0, int o1, float* y, int ldy) {
  const int nsb = in / kQK, nb = in / 32;
  const size_t rb = sizeof(BlockQ6_K) * static_cast<size_t>(nsb);
  const size_t in4 = static_cast<size_t>(in) / 4;
  const __m256i m15 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(0x03);
  for (int o = o0; o < o1; ++o) {
    const uint8_t* blk = w + static_cast<size_t>(o) * rb;
    __m256 acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nsb; ++b, blk += sizeof(BlockQ6_K)) {
      const float d = h2f(blk + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
      prefetch(blk);
      prefetch(blk + 64);
      prefetch(blk + 128);
      prefetch(blk + 192);
      for (int h = 0; h < 2; ++h) {
        const __m256i qh = ld(blk + 128 + 32 * h);
        for (int g = 0; g < 4; ++g) {
          const __m256i ql = ld(blk + 64 * h + 32 * (g & 1));
          const __m256i lq = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (g >> 1))), m15);
          const __m256i hq = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g)), m3);
          const __m256i u = _mm256_or_si256(lq, _mm256_slli_epi16(hq, 4));
          const int grp = 2 * (4 * h + g);
          const __m256 dsc = _mm256_mul_ps(
              _mm256_set1_ps(d), _mm256_set_m128(_mm_set1_ps(static_cast<float>(sc[grp + 1])),
                                                 _mm_set1_ps(static_cast<float>(sc[grp]))));
          const int kx = b * 8 + 4 * h + g;
          for (int r = 0; r < NR; ++r) {
            const size_t k = static_cast<size_t>(r) * nb + kx;
            const __m256i s = _mm256_dpbusd_epi32(ld(x.bias + r * in4 + 8 * static_cast<size_t>(kx)), u,
                                                  ld(x.q + static_cast<size_t>(r) * in + 32 * static_cast<size_t>(kx)));
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dsc, _mm256_set1_ps(x.d[k])), _mm256_cvtepi32_ps(s), acc[r]);
          }
        }
      }
    }
    for (int r = 0; r < NR; ++r) y[static_cast<size_t>(r) * ldy + o] = hsum(acc[r]);
  }
}

template <int NR>
void rows_nr(GgmlType t, const uint8_t* w, int in, const X8& x, int o0, int o1, float* y, int ldy) {
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

void rows_any(GgmlType t, const uint8_t* w, int in, const X8& x, int n, int o0, int o1, float* y, int ldy) {
  for (int r0 = 0; r0 < n; r0 += 8) {
    const X8 xr = x.from(r0, in);
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

#pragma GCC pop_options

}  // namespace

bool qmv8_vnni_host_ok() noexcept {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                         __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
  return ok;
}

void qmv8_rows_vnni(GgmlType t, const uint8_t* w, int in, const X8& x, int n, int o0, int o1, float* y,
                    int ldy) noexcept {
  rows_any(t, w, in, x, n, o0, o1, y, ldy);
}

}  // namespace tq::llm::detail
