// Fast-scan kernel: uint8 lookup tables applied with 16-entry byte shuffles (Highway
// TableLookupBytes, which shuffles within each 128-bit block) over blocks of 32 vectors.
//
// Layout of one block (m_groups * 16 bytes): for group g, 16 bytes; byte j holds the 4-bit
// group code of vector j in its low nibble and that of vector j + 16 in its high nibble.
// The LUT of group g is 16 bytes at lut + 16 g. One vector register of N bytes covers
// N / 16 consecutive groups (1 on SSE4, 2 on AVX2, 4 on AVX-512), so both codes and LUTs
// are consumed in their natural order and each 128-bit block is a different group.
//
// Accumulation: per uint16 lane, the whole lane (even byte + 256 * odd byte, wrapping) and the
// odd byte (shift) are summed; the even-byte sum is all - (odd << 8), exact mod 2^16; every 64 iterations the partial sums of the N / 16 blocks are
// added together (<= 4 * 64 * 255 < 65536), interleaved back into vector order and flushed
// into uint32, so the results are exact integers for any m_groups and are identical
// to fast_scan_u8_ref. HWY_SCALAR (1-byte vectors) falls back to the reference.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "search/fast_scan_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <limits>
#include <vector>

#include "search/index_internal.h"
#include "tq/index.h"
#include "tq/simd.h"

#ifndef TQ_FAST_SCAN_REF_ONCE
#define TQ_FAST_SCAN_REF_ONCE
namespace tq {
void fast_scan_u8_ref(size_t n_blocks, size_t m_groups, const uint8_t* codes, const uint8_t* lut,
                      uint32_t* out) noexcept {
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk = codes + b * m_groups * 16;
    uint32_t* o = out + b * 32;
    for (int v = 0; v < 32; ++v) o[v] = 0;
    for (size_t g = 0; g < m_groups; ++g) {
      const uint8_t* c = blk + g * 16;
      const uint8_t* t = lut + g * 16;
      for (int j = 0; j < 16; ++j) {
        o[j] += t[c[j] & 15];
        o[j + 16] += t[c[j] >> 4];
      }
    }
  }
}

void fast_scan_u8_multi_ref(size_t n_blocks, size_t m_groups, const uint8_t* codes, size_t nq,
                            const uint8_t* const* luts, uint32_t* const* outs) noexcept {
  for (size_t i = 0; i < nq; ++i) fast_scan_u8_ref(n_blocks, m_groups, codes, luts[i], outs[i]);
}

void fast_scan_scores_ref(size_t n, const uint32_t* acc, const float* scale, const float* norm,
                          float bias, float step, float* out, float* block_max) noexcept {
  for (size_t b = 0; b * 32 < n; ++b) {
    float mx = -std::numeric_limits<float>::infinity();
    for (size_t r = b * 32; r < std::min(n, b * 32 + 32); ++r) {
      const float dot = bias + step * static_cast<float>(acc[r]);
      out[r] = norm ? 2.f * scale[r] * dot - norm[r] * norm[r] : scale[r] * dot;
      mx = std::max(mx, out[r]);
    }
    block_max[b] = mx;
  }
}

void trellis_scan_u8_ref(size_t n_blocks, size_t d, const uint8_t* codes, const uint8_t* lut,
                         uint32_t* out) noexcept {
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk = codes + b * d * 64;
    uint32_t* o = out + b * 64;
    for (int v = 0; v < 64; ++v) o[v] = 0;
    for (size_t j = 0; j < d; ++j)
      for (int v = 0; v < 64; ++v) o[v] += lut[j * 256 + blk[j * 64 + v]];
  }
}

size_t first_at_least_ref(const float* v, size_t n, float thr) noexcept {
  for (size_t i = 0; i < n; ++i)
    if (v[i] >= thr) return i;
  return n;
}

uint32_t mask_at_least_ref(const float* v, size_t n, float off, float thr) noexcept {
  uint32_t mask = 0;
  for (size_t r = 0; r < n; ++r) mask |= static_cast<uint32_t>(v[r] + off >= thr) << r;
  return mask;
}

void lut_to_u8_ref(size_t m, size_t st, const float* lut, const float* mins, float inv, uint8_t* q8) noexcept {
  for (size_t g = 0; g < m; ++g)
    for (size_t c = 0; c < st; ++c) q8[g * st + c] = lut_u8((lut[g * st + c] - mins[g]) * inv);
}
}  // namespace tq
#endif

HWY_BEFORE_NAMESPACE();
namespace tq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR
// The fast scan for Q lookup tables at once (Q = 1: FastScanU8): each 64-byte row of codes is
// loaded and split into nibbles once, then looked up in the Q tables, with Q sets of
// accumulators (4 Q + 4 vector registers). The sums are exact integers.
template <size_t Q>
void FastScanU8Q(size_t n_blocks, size_t m_groups, const uint8_t* HWY_RESTRICT codes, const uint8_t* const* luts,
                 uint32_t* const* outs) {
  const hn::CappedTag<uint8_t, 64> d8;
  const hn::Repartition<uint16_t, decltype(d8)> d16;
  using V16 = hn::Vec<decltype(d16)>;
  const size_t N = hn::Lanes(d8);
  const size_t G = N / 16;  // groups per register (the caller checked G > 0, m_groups % G == 0)
  const size_t iters = m_groups / G;
  const auto mask4 = hn::Set(d8, 0x0F);
  // 128-bit views for the flush: the G blocks of a register hold the same 16 vectors.
  const hn::FixedTag<uint16_t, 8> h16;
  const hn::FixedTag<uint32_t, 4> h32;
  HWY_ALIGN uint16_t le[32], lo[32], he[32], ho[32];
  auto sum_blocks = [&](const uint16_t* a) {
    auto s = hn::Load(h16, a);
    for (size_t k = 1; k < G; ++k) s = hn::Add(s, hn::Load(h16, a + 8 * k));
    return s;
  };
  // o[base + 0..15] += the 16 sums whose even/odd vectors are in e / od.
  auto flush16 = [&](uint32_t* HWY_RESTRICT o, const uint16_t* e, const uint16_t* od) {
    const auto se = sum_blocks(e), so = sum_blocks(od);
    const auto v0 = hn::InterleaveLower(h16, se, so);  // vectors 0..7
    const auto v1 = hn::InterleaveUpper(h16, se, so);  // vectors 8..15
    const hn::FixedTag<uint16_t, 4> q16;
    hn::StoreU(hn::Add(hn::LoadU(h32, o + 0), hn::PromoteTo(h32, hn::LowerHalf(q16, v0))), h32, o + 0);
    hn::StoreU(hn::Add(hn::LoadU(h32, o + 4), hn::PromoteTo(h32, hn::UpperHalf(q16, v0))), h32, o + 4);
    hn::StoreU(hn::Add(hn::LoadU(h32, o + 8), hn::PromoteTo(h32, hn::LowerHalf(q16, v1))), h32, o + 8);
    hn::StoreU(hn::Add(hn::LoadU(h32, o + 12), hn::PromoteTo(h32, hn::UpperHalf(q16, v1))), h32, o + 12);
  };
  // At most 64 iterations per flush: a u16 lane then holds <= 64 * 255 and the sum over
  // G <= 4 blocks stays <= 65280.
  constexpr size_t kFlush = 64;
  // The codes are read once, from memory: each block's rows are prefetched two blocks ahead
  // (one line of block b + 2 per iteration of block b, when b + 2 is in the range).
  const size_t stride = m_groups * 16;
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* HWY_RESTRICT blk = codes + b * stride;
    const uint8_t* pf = b + 2 < n_blocks ? blk + 2 * stride : blk;
    for (size_t q = 0; q < Q; ++q)
      for (int v = 0; v < 32; ++v) outs[q][b * 32 + v] = 0;
    size_t it = 0;
    while (it < iters) {
      const size_t end = iters - it > kFlush ? it + kFlush : iters;
      V16 a_le[Q], a_lo[Q], a_he[Q], a_ho[Q];
      for (size_t q = 0; q < Q; ++q) a_le[q] = a_lo[q] = a_he[q] = a_ho[q] = hn::Zero(d16);
      for (; it < end; ++it) {
        if (N >= 64 || it % (64 / N) == 0) __builtin_prefetch(pf + it * N);
        const auto c = hn::LoadU(d8, blk + it * N);
        const auto c_lo = hn::And(c, mask4);
        const auto c_hi = hn::And(hn::BitCast(d8, hn::ShiftRight<4>(hn::BitCast(d16, c))), mask4);
        for (size_t q = 0; q < Q; ++q) {
          const auto t = hn::LoadU(d8, luts[q] + it * N);
          const auto r_lo = hn::BitCast(d16, hn::TableLookupBytes(t, c_lo));
          const auto r_hi = hn::BitCast(d16, hn::TableLookupBytes(t, c_hi));
          // Whole uint16 lanes (even byte + 256 * odd byte, mod 2^16) and the odd bytes alone;
          // the even-byte sums are recovered below as all - (odd << 8).
          a_le[q] = hn::Add(a_le[q], r_lo);
          a_lo[q] = hn::Add(a_lo[q], hn::ShiftRight<8>(r_lo));
          a_he[q] = hn::Add(a_he[q], r_hi);
          a_ho[q] = hn::Add(a_ho[q], hn::ShiftRight<8>(r_hi));
        }
      }
      for (size_t q = 0; q < Q; ++q) {
        hn::Store(hn::Sub(a_le[q], hn::ShiftLeft<8>(a_lo[q])), d16, le);
        hn::Store(a_lo[q], d16, lo);
        hn::Store(hn::Sub(a_he[q], hn::ShiftLeft<8>(a_ho[q])), d16, he);
        hn::Store(a_ho[q], d16, ho);
        flush16(outs[q] + b * 32, le, lo);
        flush16(outs[q] + b * 32 + 16, he, ho);
      }
    }
  }
}
#endif

void FastScanU8(size_t n_blocks, size_t m_groups, const uint8_t* HWY_RESTRICT codes,
                const uint8_t* HWY_RESTRICT lut, uint32_t* HWY_RESTRICT out) {
#if HWY_TARGET == HWY_SCALAR
  fast_scan_u8_ref(n_blocks, m_groups, codes, lut, out);
#else
  const hn::CappedTag<uint8_t, 64> d8;
  const size_t G = hn::Lanes(d8) / 16;  // groups per register
  if (G == 0 || m_groups % G != 0) {
    fast_scan_u8_ref(n_blocks, m_groups, codes, lut, out);
    return;
  }
  const uint8_t* luts[1] = {lut};
  uint32_t* outs[1] = {out};
  FastScanU8Q<1>(n_blocks, m_groups, codes, luts, outs);
#endif
}

void FastScanU8Multi(size_t n_blocks, size_t m_groups, const uint8_t* HWY_RESTRICT codes, size_t nq,
                     const uint8_t* const* luts, uint32_t* const* outs) {
#if HWY_TARGET == HWY_SCALAR
  fast_scan_u8_multi_ref(n_blocks, m_groups, codes, nq, luts, outs);
#else
  const hn::CappedTag<uint8_t, 64> d8;
  const size_t G = hn::Lanes(d8) / 16;
  if (G == 0 || m_groups % G != 0) {
    fast_scan_u8_multi_ref(n_blocks, m_groups, codes, nq, luts, outs);
    return;
  }
  // Tables per pass: each takes 4 accumulators, so 4 tables (16 accumulators beside the codes,
  // nibbles and lookups) fit the 32 vector registers of AVX-512 but spill on x86 targets with
  // 16 (AVX2, SSE4), where IVF searches with 2 a pass took 0.89-0.94x the time
  // (docs/design.md, "List-major scan").
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
  constexpr size_t kPass = 2;
#else
  constexpr size_t kPass = 4;
#endif
  for (size_t i = 0; i < nq; i += kPass) {
    switch (std::min<size_t>(kPass, nq - i)) {
      case 1: FastScanU8Q<1>(n_blocks, m_groups, codes, luts + i, outs + i); break;
      case 2: FastScanU8Q<2>(n_blocks, m_groups, codes, luts + i, outs + i); break;
      case 3: FastScanU8Q<3>(n_blocks, m_groups, codes, luts + i, outs + i); break;
      default: FastScanU8Q<4>(n_blocks, m_groups, codes, luts + i, outs + i); break;
    }
  }
#endif
}

void FastScanScores(size_t n, const uint32_t* HWY_RESTRICT acc, const float* HWY_RESTRICT scale,
                    const float* HWY_RESTRICT norm, float bias, float step, float* HWY_RESTRICT out,
                    float* HWY_RESTRICT block_max) {
  const hn::CappedTag<float, 16> df;
  const hn::RebindToSigned<decltype(df)> di;
  const size_t N = hn::Lanes(df);
  if (N > 32 || 32 % N != 0 || n % 32 != 0) {
    fast_scan_scores_ref(n, acc, scale, norm, bias, step, out, block_max);
    return;
  }
  const auto vb = hn::Set(df, bias), vs = hn::Set(df, step), two = hn::Set(df, 2.f);
  for (size_t b = 0; b * 32 < n; ++b) {
    auto mx = hn::Set(df, -std::numeric_limits<float>::infinity());
    for (size_t r = b * 32; r < b * 32 + 32; r += N) {
      // acc < 2^31 always (m_groups * 255), so the signed conversion is exact.
      const auto a = hn::ConvertTo(df, hn::BitCast(di, hn::LoadU(hn::RebindToUnsigned<decltype(df)>(), acc + r)));
      const auto dot = hn::MulAdd(vs, a, vb);
      auto sc = hn::Mul(hn::LoadU(df, scale + r), dot);
      if (norm) {
        const auto nr = hn::LoadU(df, norm + r);
        sc = hn::NegMulAdd(nr, nr, hn::Mul(two, sc));
      }
      hn::StoreU(sc, df, out + r);
      mx = hn::Max(mx, sc);
    }
    block_max[b] = hn::GetLane(hn::MaxOfLanes(df, mx));
  }
}

// Trellis scan (trellis_scan_u8, tq/index.h): per channel, the 64 table indices of a block
// looked up in the channel's 256-byte table by two two-table byte permutes (vpermi2b, 128
// entries each, index bits 0-6) and a blend on bit 7, widened to uint16 sums, flushed to
// uint32 every 256 channels (256 * 255 < 2^16): exact, equal to the reference. The permute
// needs AVX-512 VBMI (the AVX3_DL target). The other x86 targets (AVX3, AVX2, SSE4) look the
// table up 16 entries at a time with in-block byte shuffles (TrellisScanShuffle: x86's shuffle
// semantics); the rest run the reference.
#define TQ_TRELLIS_SHUFFLE (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4)
#if TQ_TRELLIS_SHUFFLE
// The table as 16 rows of 16 entries (row r: the indices with high nibble r). x86's byte
// shuffle (pshufb) reads an index's low 4 bits and gives 0 where its bit 7 is set. In each half
// of the table (rows 0-7 on the index, rows 8-15 on the index with bit 7 flipped) the selector
// s_h = index + 16 (7 - h), saturated, for h = 7, 6, ..., 0 (each from the one before by a
// saturating add of 16) has bit 7 clear exactly for rows r <= h, so the shuffle of row table
// D_h = T_h ^ T_{h+1} (D_7 = T_7) with it, XORed over h, gives T_r's entry: the XORs of D_r..D_7
// telescope. 3 operations per row (add, shuffle, XOR) instead of a row select and a shuffle.
// The D tables are made per call (d * 256 bytes). Sums as FastScanU8Q's: whole uint16 lanes
// and their odd bytes, the even bytes recovered at the flush (every 256 channels: 256 * 255 < 2^16).
void TrellisScanShuffle(size_t n_blocks, size_t d, const uint8_t* HWY_RESTRICT codes, const uint8_t* HWY_RESTRICT lut,
                        uint32_t* HWY_RESTRICT out) {
  const hn::CappedTag<uint8_t, 64> d8;
  const hn::Repartition<uint16_t, decltype(d8)> d16;
  const hn::FixedTag<uint8_t, 16> d128;
  using V8 = hn::Vec<decltype(d8)>;
  using V16 = hn::Vec<decltype(d16)>;
  const size_t N = hn::Lanes(d8);
  thread_local std::vector<uint8_t> diff;
  diff.resize(d * 256);
  for (size_t j = 0; j < d; ++j)
    for (size_t h = 0; h < 16; ++h) {
      const auto t = hn::LoadU(d128, lut + j * 256 + 16 * h);
      const auto d_h = h % 8 == 7 ? t : hn::Xor(t, hn::LoadU(d128, lut + j * 256 + 16 * (h + 1)));
      hn::StoreU(d_h, d128, diff.data() + j * 256 + 16 * h);
    }
  const auto c10 = hn::Set(d8, 0x10), c80 = hn::Set(d8, 0x80);
  HWY_ALIGN uint16_t all[64 / 2], odd[64 / 2];
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk = codes + b * d * 64;
    uint32_t* o = out + b * 64;
    for (int v = 0; v < 64; ++v) o[v] = 0;
    // One register of indices (N vectors) at a time through the channels: few live registers.
    for (size_t r = 0; r < 64 / N; ++r)
      for (size_t j0 = 0; j0 < d; j0 += 256) {
        const size_t j1 = std::min(d, j0 + 256);
        V16 a_all = hn::Zero(d16), a_odd = hn::Zero(d16);
        for (size_t j = j0; j < j1; ++j) {
          const uint8_t* tb = diff.data() + j * 256;
          V8 lo = hn::LoadU(d8, blk + j * 64 + r * N);
          V8 hi = hn::Xor(lo, c80);
          V8 v = hn::Xor(hn::TableLookupBytesOr0(hn::LoadDup128(d8, tb + 16 * 7), lo),
                         hn::TableLookupBytesOr0(hn::LoadDup128(d8, tb + 16 * 15), hi));
          for (size_t h = 7; h-- > 0;) {
            lo = hn::SaturatedAdd(lo, c10);
            hi = hn::SaturatedAdd(hi, c10);
            v = hn::Xor(v, hn::Xor(hn::TableLookupBytesOr0(hn::LoadDup128(d8, tb + 16 * h), lo),
                                   hn::TableLookupBytesOr0(hn::LoadDup128(d8, tb + 16 * (h + 8)), hi)));
          }
          const auto w = hn::BitCast(d16, v);
          a_all = hn::Add(a_all, w);
          a_odd = hn::Add(a_odd, hn::ShiftRight<8>(w));
        }
        hn::Store(hn::Sub(a_all, hn::ShiftLeft<8>(a_odd)), d16, all);  // even bytes
        hn::Store(a_odd, d16, odd);
        for (size_t i = 0; i < N / 2; ++i) {
          o[r * N + 2 * i] += all[i];
          o[r * N + 2 * i + 1] += odd[i];
        }
      }
  }
}
#endif

void TrellisScanU8(size_t n_blocks, size_t d, const uint8_t* HWY_RESTRICT codes, const uint8_t* HWY_RESTRICT lut,
                   uint32_t* HWY_RESTRICT out) {
#if HWY_TARGET == HWY_AVX3_DL
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* blk = codes + b * d * 64;
    __m512i t[4];
    for (int q = 0; q < 4; ++q) t[q] = _mm512_setzero_si512();  // uint32 totals, 16 vectors each
    for (size_t j0 = 0; j0 < d; j0 += 256) {
      const size_t j1 = std::min(d, j0 + 256);
      __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();  // uint16: vectors 0-31, 32-63
      for (size_t j = j0; j < j1; ++j) {
        const __m512i idx = _mm512_loadu_si512(blk + j * 64);
        const uint8_t* tb = lut + j * 256;
        const __m512i lo = _mm512_permutex2var_epi8(_mm512_loadu_si512(tb), idx, _mm512_loadu_si512(tb + 64));
        const __m512i hi =
            _mm512_permutex2var_epi8(_mm512_loadu_si512(tb + 128), idx, _mm512_loadu_si512(tb + 192));
        const __m512i v = _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi);
        a0 = _mm512_add_epi16(a0, _mm512_cvtepu8_epi16(_mm512_castsi512_si256(v)));
        a1 = _mm512_add_epi16(a1, _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(v, 1)));
      }
      t[0] = _mm512_add_epi32(t[0], _mm512_cvtepu16_epi32(_mm512_castsi512_si256(a0)));
      t[1] = _mm512_add_epi32(t[1], _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(a0, 1)));
      t[2] = _mm512_add_epi32(t[2], _mm512_cvtepu16_epi32(_mm512_castsi512_si256(a1)));
      t[3] = _mm512_add_epi32(t[3], _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(a1, 1)));
    }
    for (int q = 0; q < 4; ++q) _mm512_storeu_si512(out + b * 64 + 16 * q, t[q]);
  }
#elif TQ_TRELLIS_SHUFFLE
  TrellisScanShuffle(n_blocks, d, codes, lut, out);
#else
  trellis_scan_u8_ref(n_blocks, d, codes, lut, out);
#endif
}
#undef TQ_TRELLIS_SHUFFLE

// The uint8 LUTs (lut_to_u8, tq/index.h): lut_u8's steps on whole vectors. NaN is zeroed
// explicitly (x86 min / max pick an operand by position when one is NaN), then the clamps to
// [0, 255] (exact for any other operands, -0 included: it rounds to 0), the round-off by
// adding and subtracting 1.5 * 2^23 (exact in [0, 255]), an exact conversion and a narrowing
// of values 0..255: the reference's bytes for every input.
void LutToU8(size_t m, size_t st, const float* HWY_RESTRICT lut, const float* HWY_RESTRICT mins, float inv,
             uint8_t* HWY_RESTRICT q8) {
  const hn::CappedTag<float, 16> df;
  const hn::Rebind<int32_t, decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const size_t N = hn::Lanes(df);
  if (st % N != 0) {
    lut_to_u8_ref(m, st, lut, mins, inv, q8);
    return;
  }
  const auto vinv = hn::Set(df, inv), zero = hn::Zero(df), top = hn::Set(df, 255.f), magic = hn::Set(df, 12582912.f);
  for (size_t g = 0; g < m; ++g) {
    const auto mn = hn::Set(df, mins[g]);
    for (size_t c = 0; c < st; c += N) {
      auto x = hn::Mul(hn::Sub(hn::LoadU(df, lut + g * st + c), mn), vinv);
      x = hn::IfThenElseZero(hn::Eq(x, x), x);
      x = hn::Min(hn::Max(x, zero), top);
      x = hn::Sub(hn::Add(x, magic), magic);
      hn::StoreU(hn::DemoteTo(d8, hn::ConvertTo(di, x)), d8, q8 + g * st + c);
    }
  }
}

size_t FirstAtLeast(const float* HWY_RESTRICT v, size_t n, float thr) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  const auto t = hn::Set(df, thr);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto m = hn::Ge(hn::LoadU(df, v + i), t);  // false for NaN, as v >= thr
    if (!hn::AllFalse(df, m)) return i + hn::FindKnownFirstTrue(df, m);
  }
  return i + first_at_least_ref(v + i, n - i, thr);
}

uint32_t MaskAtLeast(const float* HWY_RESTRICT v, size_t n, float off, float thr) {
  const hn::CappedTag<float, 16> df;
  const size_t N = hn::Lanes(df);
  const auto o = hn::Set(df, off), t = hn::Set(df, thr);
  uint32_t mask = 0;
  size_t i = 0;
  for (; i + N <= n; i += N) {
    uint8_t bits[8] = {};
    hn::StoreMaskBits(df, hn::Ge(hn::Add(hn::LoadU(df, v + i), o), t), bits);  // false for NaN
    uint32_t b = 0;
    std::memcpy(&b, bits, sizeof b);
    mask |= (b & ((1u << N) - 1u)) << i;  // N <= 16 lanes
  }
  if (i < n) mask |= mask_at_least_ref(v + i, n - i, off, thr) << i;  // (a shift by 32 is undefined)
  return mask;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace tq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tq {
HWY_EXPORT(FastScanU8);
HWY_EXPORT(FastScanScores);
HWY_EXPORT(FastScanU8Multi);
HWY_EXPORT(TrellisScanU8);
HWY_EXPORT(LutToU8);
HWY_EXPORT(FirstAtLeast);
HWY_EXPORT(MaskAtLeast);

uint32_t mask_at_least(const float* v, size_t n, float off, float thr) noexcept {
  if (simd::use_scalar()) return mask_at_least_ref(v, n, off, thr);
  return HWY_DYNAMIC_DISPATCH(MaskAtLeast)(v, n, off, thr);
}

size_t first_at_least(const float* v, size_t n, float thr) noexcept {
  if (simd::use_scalar()) return first_at_least_ref(v, n, thr);
  return HWY_DYNAMIC_DISPATCH(FirstAtLeast)(v, n, thr);
}

void lut_to_u8(size_t m, size_t st, const float* lut, const float* mins, float inv, uint8_t* q8) noexcept {
  if (simd::use_scalar()) {
    lut_to_u8_ref(m, st, lut, mins, inv, q8);
    return;
  }
  HWY_DYNAMIC_DISPATCH(LutToU8)(m, st, lut, mins, inv, q8);
}

void trellis_scan_u8(size_t n_blocks, size_t d, const uint8_t* codes, const uint8_t* lut, uint32_t* out) noexcept {
  if (simd::use_scalar()) {
    trellis_scan_u8_ref(n_blocks, d, codes, lut, out);
    return;
  }
  HWY_DYNAMIC_DISPATCH(TrellisScanU8)(n_blocks, d, codes, lut, out);
}

void fast_scan_u8_multi(size_t n_blocks, size_t m_groups, const uint8_t* codes, size_t nq,
                        const uint8_t* const* luts, uint32_t* const* outs) noexcept {
  if (simd::use_scalar()) {
    fast_scan_u8_multi_ref(n_blocks, m_groups, codes, nq, luts, outs);
    return;
  }
  HWY_DYNAMIC_DISPATCH(FastScanU8Multi)(n_blocks, m_groups, codes, nq, luts, outs);
}

void fast_scan_scores(size_t n, const uint32_t* acc, const float* scale, const float* norm,
                      float bias, float step, float* out, float* block_max) noexcept {
  if (simd::use_scalar()) {
    fast_scan_scores_ref(n, acc, scale, norm, bias, step, out, block_max);
    return;
  }
  HWY_DYNAMIC_DISPATCH(FastScanScores)(n, acc, scale, norm, bias, step, out, block_max);
}

void fast_scan_u8(size_t n_blocks, size_t m_groups, const uint8_t* codes, const uint8_t* lut,
                  uint32_t* out) noexcept {
  if (simd::use_scalar()) {
    fast_scan_u8_ref(n_blocks, m_groups, codes, lut, out);
    return;
  }
  HWY_DYNAMIC_DISPATCH(FastScanU8)(n_blocks, m_groups, codes, lut, out);
}
}  // namespace tq
#endif
