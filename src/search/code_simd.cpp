// Kernels of the vector layout (src/search/index_internal.h, Index::Impl::vl): each vector's
// 4-bit group codes together, two a byte (group g: nibble g % 2 of byte g / 2).
//
// vector_to_fast_layout: the fast-scan layout of blocks of 32 such vectors (the single-level
// scans read it), a byte transpose of 16 vectors at a time: 16 registers of N bytes, one per
// vector, go through four rounds of InterleaveLower / InterleaveUpper of registers i and i + 8
// (each round rotates the 8-bit index (register, byte) of a 16 x 16 byte tile left by one bit,
// so four rounds transpose it: register t then holds byte t of the 16 vectors), in every
// 128-bit block of the registers at once; the two halves of the block's 32 vectors then become
// the low and high nibbles of the fast layout's rows. Byte moves only: the reference's bytes.
//
// code_dot_lanes: the float dot product of a query with a vector's codes (its channels'
// centroids), in 16 partial sums (channel g in sum g % 16, in increasing g); with 16 float
// lanes (AVX-512) one table lookup of 16 centroids (TableLookupLanes) per 16 channels. The
// same products and additions in the same order as the reference (this file is built without
// contraction into fused multiply-adds), so the same floats.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "search/code_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "tq/index.h"
#include "tq/simd.h"

#ifndef TQ_CODE_SIMD_REF_ONCE
#define TQ_CODE_SIMD_REF_ONCE
namespace tq {
namespace {
// Byte h of the 32 vectors at v (vb bytes each), groups 2h (low nibbles) and 2h + 1 (high),
// into the fast layout's rows 2h and 2h + 1 at o.
void transpose_byte(const uint8_t* v, size_t vb, size_t h, uint8_t* o) noexcept {
  for (size_t j = 0; j < 16; ++j) {
    const unsigned lo = v[j * vb + h], hi = v[(j + 16) * vb + h];
    o[2 * h * 16 + j] = static_cast<uint8_t>((lo & 15u) | (hi << 4));
    o[(2 * h + 1) * 16 + j] = static_cast<uint8_t>((lo >> 4) | (hi & 0xF0u));
  }
}
}  // namespace

void vector_to_fast_layout_ref(size_t n_blocks, size_t m_groups, const uint8_t* vec, uint8_t* fast) noexcept {
  const size_t vb = m_groups / 2;  // bytes per vector
  for (size_t b = 0; b < n_blocks; ++b)
    for (size_t h = 0; h < vb; ++h) transpose_byte(vec + b * 32 * vb, vb, h, fast + b * m_groups * 16);
}

void code_dot_lanes_ref(size_t g0, size_t g1, const float* y, const uint8_t* codes, const float* cent,
                        float* lanes) noexcept {
  for (size_t g = g0; g < g1; ++g) lanes[g % 16] += y[g] * cent[(codes[g / 2] >> ((g & 1) * 4)) & 15];
}

float reduce_lanes16(const float* lanes) noexcept {
  float t[16];
  std::memcpy(t, lanes, sizeof t);
  for (size_t w = 8; w >= 1; w /= 2)
    for (size_t i = 0; i < w; ++i) t[i] = t[i] + t[i + w];
  return t[0];
}
}  // namespace tq
#endif

HWY_BEFORE_NAMESPACE();
namespace tq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void VectorToFastLayout(size_t n_blocks, size_t m_groups, const uint8_t* HWY_RESTRICT vec, uint8_t* HWY_RESTRICT fast) {
#if HWY_TARGET == HWY_SCALAR
  vector_to_fast_layout_ref(n_blocks, m_groups, vec, fast);
#else
  const hn::CappedTag<uint8_t, 64> d8;
  using V = hn::Vec<decltype(d8)>;
  const size_t N = hn::Lanes(d8);  // bytes per register: N / 16 blocks of 16
  const size_t vb = m_groups / 2, full = N >= 16 ? vb / N * N : 0;
  const V lo4 = hn::Set(d8, 0x0F), hi4 = hn::Set(d8, 0xF0);
  HWY_ALIGN uint8_t rl[64], rh[64];
  // r[t] (t < 16), block k: byte c + 16 k + t of the 16 vectors at base (one per byte).
  auto transpose16 = [&](const uint8_t* base, size_t c, V* r) {
    for (size_t i = 0; i < 16; ++i) r[i] = hn::LoadU(d8, base + i * vb + c);
    for (int round = 0; round < 4; ++round) {
      V t[16];
      for (size_t i = 0; i < 8; ++i) {
        t[2 * i] = hn::InterleaveLower(d8, r[i], r[i + 8]);
        t[2 * i + 1] = hn::InterleaveUpper(d8, r[i], r[i + 8]);
      }
      for (size_t i = 0; i < 16; ++i) r[i] = t[i];
    }
  };
  for (size_t b = 0; b < n_blocks; ++b) {
    const uint8_t* v = vec + b * 32 * vb;
    uint8_t* o = fast + b * m_groups * 16;
    for (size_t c = 0; c < full; c += N) {
      V a[16], e[16];
      transpose16(v, c, a);            // vectors 0..15
      transpose16(v + 16 * vb, c, e);  // vectors 16..31
      for (size_t t = 0; t < 16; ++t) {
        hn::Store(hn::Or(hn::And(a[t], lo4), hn::ShiftLeft<4>(e[t])), d8, rl);   // even groups
        hn::Store(hn::Or(hn::ShiftRight<4>(a[t]), hn::And(e[t], hi4)), d8, rh);  // odd groups
        for (size_t k = 0; k < N / 16; ++k) {
          uint8_t* row = o + 32 * (c + 16 * k + t);  // rows 2h and 2h + 1
          std::memcpy(row, rl + 16 * k, 16);
          std::memcpy(row + 16, rh + 16 * k, 16);
        }
      }
    }
    for (size_t h = full; h < vb; ++h) transpose_byte(v, vb, h, o);  // the tail
  }
#endif
}

// Sums with 16 float lanes: the AVX-512 targets. Others run the reference.
void CodeDotLanes(size_t g0, size_t g1, const float* HWY_RESTRICT y, const uint8_t* HWY_RESTRICT codes,
                  const float* HWY_RESTRICT cent, float* HWY_RESTRICT lanes) {
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET > HWY_AVX3 || !HWY_ARCH_X86
  code_dot_lanes_ref(g0, g1, y, codes, cent, lanes);
#else
  const hn::FixedTag<float, 16> df;
  const hn::FixedTag<uint32_t, 16> du;
  const hn::FixedTag<uint8_t, 16> d8;
  const hn::FixedTag<uint8_t, 8> h8;
  size_t g = g0;
  const size_t a = (g0 + 15) / 16 * 16, z = g1 / 16 * 16;
  if (a >= z) {
    code_dot_lanes_ref(g0, g1, y, codes, cent, lanes);
    return;
  }
  code_dot_lanes_ref(g, a, y, codes, cent, lanes);  // the head, into lanes g % 16 first
  auto acc = hn::LoadU(df, lanes);
  const auto tab = hn::LoadU(df, cent);
  HWY_ALIGN static constexpr uint32_t kShift[16] = {0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4};
  const auto sh = hn::Load(du, kShift);  // even lanes the low nibble
  const auto m15 = hn::Set(du, 15);
  for (g = a; g < z; g += 16) {
    const auto b8 = hn::LoadU(h8, codes + g / 2);  // 16 codes
    const auto dup = hn::InterleaveLower(d8, hn::ZeroExtendVector(d8, b8), hn::ZeroExtendVector(d8, b8));
    const auto idx = hn::And(hn::PromoteTo(du, dup) >> sh, m15);
    const auto c = hn::TableLookupLanes(tab, hn::IndicesFromVec(df, idx));
    acc = hn::Add(acc, hn::Mul(hn::LoadU(df, y + g), c));
  }
  hn::StoreU(acc, df, lanes);
  code_dot_lanes_ref(z, g1, y, codes, cent, lanes);  // the tail
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace tq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tq {
HWY_EXPORT(VectorToFastLayout);
HWY_EXPORT(CodeDotLanes);

void vector_to_fast_layout(size_t n_blocks, size_t m_groups, const uint8_t* vec, uint8_t* fast) noexcept {
  if (simd::use_scalar()) {
    vector_to_fast_layout_ref(n_blocks, m_groups, vec, fast);
    return;
  }
  HWY_DYNAMIC_DISPATCH(VectorToFastLayout)(n_blocks, m_groups, vec, fast);
}

void code_dot_lanes(size_t g0, size_t g1, const float* y, const uint8_t* codes, const float* cent,
                    float* lanes) noexcept {
  if (simd::use_scalar()) {
    code_dot_lanes_ref(g0, g1, y, codes, cent, lanes);
    return;
  }
  HWY_DYNAMIC_DISPATCH(CodeDotLanes)(g0, g1, y, codes, cent, lanes);
}
}  // namespace tq
#endif
