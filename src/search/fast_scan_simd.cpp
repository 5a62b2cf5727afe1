// Fast-scan kernel: uint8 lookup tables applied with 16-entry byte shuffles (Highway
// TableLookupBytes, which shuffles within each 128-bit block) over blocks of 32 vectors.
//
// Layout of one block (m_groups * 16 bytes): for group g, 16 bytes; byte j holds the 4-bit
// group code of vector j in its low nibble and that of vector j + 16 in its high nibble.
// The LUT of group g is 16 bytes at lut + 16 g. One vector register of N bytes covers
// N / 16 consecutive groups (1 on SSE4, 2 on AVX2, 4 on AVX-512), so both codes and LUTs
// are consumed in their natural order and each 128-bit block is a different group.
//
// Accumulation: the shuffled bytes are split into even / odd bytes as uint16 lanes (mask and
// shift) and summed in uint16; every 256 iterations (256 * 255 < 65536) the partial sums are
// flushed into uint32, so the results are exact integers for any m_groups and are identical
// to fast_scan_u8_ref. HWY_SCALAR (1-byte vectors) falls back to the reference.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "search/fast_scan_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

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
}  // namespace tq
#endif

HWY_BEFORE_NAMESPACE();
namespace tq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void FastScanU8(size_t n_blocks, size_t m_groups, const uint8_t* HWY_RESTRICT codes,
                const uint8_t* HWY_RESTRICT lut, uint32_t* HWY_RESTRICT out) {
#if HWY_TARGET == HWY_SCALAR
  fast_scan_u8_ref(n_blocks, m_groups, codes, lut, out);
#else
  const hn::CappedTag<uint8_t, 64> d8;
  const hn::Repartition<uint16_t, decltype(d8)> d16;
  const size_t N = hn::Lanes(d8);
  const size_t G = N / 16;  // groups per register
  if (G == 0 || m_groups % G != 0) {
    fast_scan_u8_ref(n_blocks, m_groups, codes, lut, out);
    return;
  }
  const size_t iters = m_groups / G;
  const auto mask4 = hn::Set(d8, 0x0F);
  const auto mask8 = hn::Set(d16, 0x00FF);
  HWY_ALIGN uint16_t le[32], lo[32], he[32], ho[32];
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* HWY_RESTRICT blk = codes + b * m_groups * 16;
    uint32_t* HWY_RESTRICT o = out + b * 32;
    for (int v = 0; v < 32; ++v) o[v] = 0;
    size_t it = 0;
    while (it < iters) {
      const size_t end = iters - it > 256 ? it + 256 : iters;
      auto acc_le = hn::Zero(d16), acc_lo = hn::Zero(d16);
      auto acc_he = hn::Zero(d16), acc_ho = hn::Zero(d16);
      for (; it < end; ++it) {
        const auto c = hn::LoadU(d8, blk + it * N);
        const auto t = hn::LoadU(d8, lut + it * N);
        const auto c_lo = hn::And(c, mask4);
        const auto c_hi = hn::And(hn::BitCast(d8, hn::ShiftRight<4>(hn::BitCast(d16, c))), mask4);
        const auto r_lo = hn::BitCast(d16, hn::TableLookupBytes(t, c_lo));
        const auto r_hi = hn::BitCast(d16, hn::TableLookupBytes(t, c_hi));
        acc_le = hn::Add(acc_le, hn::And(r_lo, mask8));
        acc_lo = hn::Add(acc_lo, hn::ShiftRight<8>(r_lo));
        acc_he = hn::Add(acc_he, hn::And(r_hi, mask8));
        acc_ho = hn::Add(acc_ho, hn::ShiftRight<8>(r_hi));
      }
      hn::Store(acc_le, d16, le);
      hn::Store(acc_lo, d16, lo);
      hn::Store(acc_he, d16, he);
      hn::Store(acc_ho, d16, ho);
      // u16 lane l: 128-bit block l / 8 (a group), byte pair 2 (l % 8), 2 (l % 8) + 1.
      for (size_t l = 0; l < N / 2; ++l) {
        const size_t w = 2 * (l & 7);
        o[w] += le[l];
        o[w + 1] += lo[l];
        o[16 + w] += he[l];
        o[17 + w] += ho[l];
      }
    }
  }
#endif
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace tq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tq {
HWY_EXPORT(FastScanU8);

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
