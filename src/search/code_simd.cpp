// Kernels of the vector layout (src/search/index_internal.h, Index::Impl::vl): each vector's
// channel indices together, each segment's packed at its width (3 or 4 bits, the file's bit
// order: include/tq/bitpack.h).
//
// bits3_to_nibbles: 3-bit indices widened to nibbles, 16 in each 64-bit lane of a register
// (four rounds of masks and shifts that each move the upper half of every field group up: 48
// bits -> 2 x 24 at 0 and 32 -> 4 x 12 -> 8 x 6 -> 16 x 3 at every nibble), the step before
// the transpose for indexes with 3-bit segments; the scalar target runs the reference.
//
// vector_to_fast_layout: the fast-scan layout of blocks of 32 vectors of nibbles (the
// single-level scans read it), a byte transpose of 16 vectors at a time: 16 registers of N
// bytes, one per vector, go through four rounds of InterleaveLower / InterleaveUpper of
// registers i and i + 8 (each round rotates the 8-bit index (register, byte) of a 16 x 16 byte
// tile left by one bit, so four rounds transpose it: register t then holds byte t of the 16
// vectors), in every 128-bit block of the registers at once; the two halves of the block's 32
// vectors then become the low and high nibbles of the fast layout's rows. Byte moves only: the
// reference's bytes.
//
// code_dot_lanes: the float dot product of a query with a vector's codes (its channels'
// centroids), in 16 partial sums (channel g in sum g % 16, in increasing g); with 16 float
// lanes (AVX-512) one table lookup of 16 centroids (TableLookupLanes) per 16 channels, their
// indices read from 8 bytes of nibbles or 6 bytes of 3-bit codes (a byte shuffle gives each
// index's two bytes to its lane, a shift and a mask the index). The same products and
// additions in the same order as the reference (this file is built without contraction into
// fused multiply-adds), so the same floats.
//
// derive_block: what an index derives from a block of 32 slots' codes (the sign plane, ||c||^2,
// sum |c_j|, and IVF's <Pi c_l, c> and <Pi c_l, sign(c)>), the slots in 2 (AVX-512) or 4 (AVX2)
// sets of float lanes, a table lookup per digit and table; the reference's sums in its order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "search/code_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "search/index_internal.h"
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
inline unsigned code_at(const uint8_t* p, size_t t, int bits) noexcept {
  return read_code(p, t * static_cast<size_t>(bits), bits);
}

// Bytes 0..5 of p, and byte 6 when sh > 0 (16 3-bit codes from bit sh < 8 of p end in it), in
// a word (byte i at bits 8 i), no byte past them read; assembled in registers (bytes copied
// into a word in memory and read back whole would stall the load on the stores).
inline uint64_t load_codes3(const uint8_t* p, unsigned sh) noexcept {
  uint32_t lo;
  uint16_t hi;
  std::memcpy(&lo, p, 4);
  std::memcpy(&hi, p + 4, 2);
  uint64_t x = lo | (static_cast<uint64_t>(hi) << 32);
  if (sh > 0) x |= static_cast<uint64_t>(p[6]) << 48;
  return x;
}

// For 16 3-bit codes from bit sh (< 8) of a word: per sh, the byte shuffle that puts code k's
// two bytes (b = (sh + 3 k) / 8 and b + 1) in the low half of 32-bit lane k of a 512-bit
// register (lane k is in 128-bit block k / 4, each block holding the word in its bytes 0..7;
// 0x80 zeroes a byte), and each lane's right shift (sh + 3 k) % 8.
struct Codes3Tables {
  alignas(64) uint8_t bytes[8][64];
  alignas(64) uint32_t shift[8][16];
};
constexpr Codes3Tables make_codes3_tables() {
  Codes3Tables t{};
  for (unsigned sh = 0; sh < 8; ++sh)
    for (unsigned k = 0; k < 16; ++k) {
      const unsigned pos = sh + 3 * k;
      t.bytes[sh][4 * k] = static_cast<uint8_t>(pos / 8);
      t.bytes[sh][4 * k + 1] = static_cast<uint8_t>(pos / 8 + 1);
      t.bytes[sh][4 * k + 2] = t.bytes[sh][4 * k + 3] = 0x80;
      t.shift[sh][k] = pos % 8;
    }
  return t;
}
constexpr Codes3Tables kCodes3 = make_codes3_tables();
constexpr const uint8_t (&kCodes3Bytes)[8][64] = kCodes3.bytes;
constexpr const uint32_t (&kCodes3Shift)[8][16] = kCodes3.shift;

// code_dot_lanes_ref over channels [gs, ge) of the range that starts at g0.
void dot_lanes_part(size_t g0, size_t gs, size_t ge, int bits, const float* y, const uint8_t* codes,
                    const float* cent, float* lanes) noexcept {
  for (size_t g = gs; g < ge; ++g) lanes[g % 16] += y[g] * cent[code_at(codes, g - g0, bits)];
}
}  // namespace

void vector_to_fast_layout_ref(size_t n_blocks, size_t m_groups, const uint8_t* vec, uint8_t* fast) noexcept {
  const size_t vb = m_groups / 2;  // bytes per vector
  for (size_t b = 0; b < n_blocks; ++b)
    for (size_t h = 0; h < vb; ++h) transpose_byte(vec + b * 32 * vb, vb, h, fast + b * m_groups * 16);
}

void code_dot_lanes_ref(size_t g0, size_t g1, int bits, const float* y, const uint8_t* codes, const float* cent,
                        float* lanes) noexcept {
  dot_lanes_part(g0, g0, g1, bits, y, codes, cent, lanes);
}

void bits3_to_nibbles_ref(size_t n, const uint8_t* in, uint8_t* out) noexcept {
  for (size_t t = 0; t < n; t += 2)
    out[t / 2] = static_cast<uint8_t>(code_at(in, t, 3) | (t + 1 < n ? code_at(in, t + 1, 3) << 4 : 0u));
}

void derive_block_ref(const uint8_t* fb, size_t nd, const PlaneDigit* dg, const float* tabs, const float* rc,
                      size_t d, float* cc, float* ca, float* ct, float* cu, uint8_t* cb) noexcept {
  uint8_t sbits[32] = {};
  for (size_t k = 0; k < nd; ++k) {
    const PlaneDigit& g = dg[k];
    const uint8_t* row = fb + static_cast<size_t>(g.row) * 16;
    const float* q2 = tabs + 48 * static_cast<size_t>(g.tab);
    const float *qa = q2 + 16, *qv = q2 + 32;
    const unsigned t = g.j & 3;
    for (size_t v = 0; v < 32; ++v) {
      const unsigned code = v < 16 ? row[v] & 15u : row[v - 16] >> 4;
      const unsigned c = (code >> g.sh) & g.mask, sgn = c >> g.top;
      if (rc != nullptr) {
        ct[v] += rc[g.j] * qv[c];
        if (cb != nullptr) cu[v] += sgn ? rc[g.j] : -rc[g.j];
      }
      if (cb == nullptr) continue;
      cc[v] += q2[c];
      ca[v] += qa[c];
      sbits[v] = static_cast<uint8_t>(sbits[v] | (sgn << t));
    }
    if (cb != nullptr && (t == 3 || g.j + 1 == d)) {
      uint8_t* o = cb + static_cast<size_t>(g.j / 4) * 16;
      for (size_t v = 0; v < 16; ++v) o[v] = static_cast<uint8_t>(sbits[v] | (sbits[v + 16] << 4));
      std::memset(sbits, 0, sizeof sbits);
    }
  }
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

// 16 indices (6 bytes) per 64-bit lane: a register of 32-bit words from 6 N64 input bytes is
// permuted so that 64-bit lane j holds words 3 (j / 2) and 3 (j / 2) + 1 (j even) or the two
// after them shifted down by 16 bits (j odd): bytes 6 j .. 6 j + 5 at its bottom; then four
// rounds of masks and shifts in every lane (file comment). The last register's input and output
// go through a buffer, so no byte past either is touched.
void Bits3ToNibbles(size_t n, const uint8_t* HWY_RESTRICT in, uint8_t* HWY_RESTRICT out) {
#if HWY_TARGET == HWY_SCALAR
  bits3_to_nibbles_ref(n, in, out);
#else
  const hn::ScalableTag<uint64_t> d64;
  const hn::Repartition<uint32_t, decltype(d64)> d32;
  const hn::Repartition<uint8_t, decltype(d64)> d8;
  static_assert(hn::MaxLanes(d64) <= 8, "the tables below hold 8 64-bit lanes");
  HWY_ALIGN static constexpr uint32_t kPerm[16] = {0, 1, 1, 2, 3, 4, 4, 5, 6, 7, 7, 8, 9, 10, 10, 11};
  HWY_ALIGN static constexpr uint64_t kShift[8] = {0, 16, 0, 16, 0, 16, 0, 16};
  const size_t L8 = hn::Lanes(d8), per = 2 * L8;  // input bytes read, indices per register
  const auto pv = hn::IndicesFromVec(d32, hn::Load(d32, kPerm));
  const auto sv = hn::Load(d64, kShift);
  const auto m48 = hn::Set(d64, 0xFFFFFFFFFFFFull);
  const size_t in_bytes = (3 * n + 7) / 8;
  HWY_ALIGN uint8_t buf[hn::MaxLanes(d8)];
  for (size_t t = 0; t < n; t += per) {
    const size_t ib = t / 8 * 3;
    const uint8_t* src = in + ib;
    if (ib + L8 > in_bytes) {  // the last input bytes, zero-padded (their indices 0)
      std::memset(buf, 0, sizeof buf);
      std::memcpy(buf, src, in_bytes - ib);
      src = buf;
    }
    const auto words = hn::BitCast(d32, hn::LoadU(d8, src));
    auto x = hn::And(hn::BitCast(d64, hn::TableLookupLanes(words, pv)) >> sv, m48);
    x = hn::Or(hn::And(x, hn::Set(d64, 0xFFFFFFull)), hn::ShiftLeft<8>(hn::And(x, hn::Set(d64, 0xFFFFFF000000ull))));
    x = hn::Or(hn::And(x, hn::Set(d64, 0x00000FFF00000FFFull)),
               hn::ShiftLeft<4>(hn::And(x, hn::Set(d64, 0x00FFF00000FFF000ull))));
    x = hn::Or(hn::And(x, hn::Set(d64, 0x003F003F003F003Full)),
               hn::ShiftLeft<2>(hn::And(x, hn::Set(d64, 0x0FC00FC00FC00FC0ull))));
    x = hn::Or(hn::And(x, hn::Set(d64, 0x0707070707070707ull)),
               hn::ShiftLeft<1>(hn::And(x, hn::Set(d64, 0x3838383838383838ull))));
    if (t + per <= n) {
      hn::StoreU(hn::BitCast(d8, x), d8, out + t / 2);
    } else {  // the last (n - t + 1) / 2 output bytes
      hn::Store(hn::BitCast(d8, x), d8, buf);
      std::memcpy(out + t / 2, buf, (n - t + 1) / 2);
    }
  }
#endif
}

// Sums with 16 float lanes: the AVX-512 targets. Others run the reference.
void CodeDotLanes(size_t g0, size_t g1, int bits, const float* HWY_RESTRICT y, const uint8_t* HWY_RESTRICT codes,
                  const float* HWY_RESTRICT cent, float* HWY_RESTRICT lanes) {
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET > HWY_AVX3 || !HWY_ARCH_X86
  code_dot_lanes_ref(g0, g1, bits, y, codes, cent, lanes);
#else
  const hn::FixedTag<float, 16> df;
  const hn::FixedTag<uint32_t, 16> du;
  const hn::FixedTag<uint8_t, 16> d8;
  const hn::FixedTag<uint8_t, 64> d8x64;
  const hn::FixedTag<uint64_t, 8> d64x8;
  const size_t a = (g0 + 15) / 16 * 16, z = g1 / 16 * 16;
  // The chunks [a + 16 k, a + 16 k + 16) start at bit sh of a byte, the same for all of them
  // (16 codes are 6 or 8 whole bytes); 4-bit codes are read as 8 whole bytes (sh 0).
  const size_t bit0 = (a - g0) * static_cast<size_t>(bits);
  const unsigned sh = static_cast<unsigned>(bit0 & 7);
  if (a >= z || (bits != 3 && (bits != 4 || sh != 0))) {
    code_dot_lanes_ref(g0, g1, bits, y, codes, cent, lanes);
    return;
  }
  dot_lanes_part(g0, g0, a, bits, y, codes, cent, lanes);  // the head, into lanes g % 16 first
  auto acc = hn::LoadU(df, lanes);
  const auto tab = hn::LoadU(df, cent);
  const uint8_t* p = codes + bit0 / 8;
  if (bits == 4) {
    HWY_ALIGN static constexpr uint32_t kShift[16] = {0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4};
    const auto shv = hn::Load(du, kShift);  // even lanes the low nibble
    const auto m15 = hn::Set(du, 15);
    const hn::FixedTag<uint8_t, 8> h8;
    for (size_t g = a; g < z; g += 16, p += 8) {
      const auto b8 = hn::LoadU(h8, p);  // 16 codes
      const auto dup = hn::InterleaveLower(d8, hn::ZeroExtendVector(d8, b8), hn::ZeroExtendVector(d8, b8));
      const auto idx = hn::And(hn::PromoteTo(du, dup) >> shv, m15);
      const auto c = hn::TableLookupLanes(tab, hn::IndicesFromVec(df, idx));
      acc = hn::Add(acc, hn::Mul(hn::LoadU(df, y + g), c));
    }
  } else {
    // 16 codes from bit sh of 7 bytes, broadcast to every 64-bit lane; lane k (block k / 4)
    // takes bytes b and b + 1 of them (b = (sh + 3 k) / 8, the bytes its 3 bits are in) by a
    // byte shuffle within 128-bit blocks, then shifts right by (sh + 3 k) % 8 and keeps 3 bits.
    const auto from = hn::Load(d8x64, kCodes3Bytes[sh]);
    const auto shv = hn::Load(du, kCodes3Shift[sh]);
    const auto m7 = hn::Set(du, 7);
    // Whole 8-byte loads while the 8 bytes lie within the codes (packed_bytes(g1 - g0, 3)).
    const size_t extent = (3 * (g1 - g0) + 7) / 8;
    for (size_t g = a; g < z; g += 16, p += 6) {
      uint64_t x;
      if (static_cast<size_t>(p - codes) + 8 <= extent) std::memcpy(&x, p, 8);
      else x = load_codes3(p, sh);
      const auto bytes = hn::BitCast(d8x64, hn::Set(d64x8, x));
      const auto w = hn::BitCast(du, hn::TableLookupBytesOr0(bytes, from));
      const auto idx = hn::And(w >> shv, m7);
      const auto c = hn::TableLookupLanes(tab, hn::IndicesFromVec(df, idx));
      acc = hn::Add(acc, hn::Mul(hn::LoadU(df, y + g), c));
    }
  }
  hn::StoreU(acc, df, lanes);
  dot_lanes_part(g0, z, g1, bits, y, codes, cent, lanes);  // the tail
#endif
}

// The block's 32 slots in K = 32 / N sets of N float lanes (N = 16 on AVX-512, 8 on AVX2; set s
// holds slots s N .. s N + N - 1, the low nibbles of a row's bytes for slots below 16, the high
// ones above): each digit's index, widened to 32-bit lanes, looks up 16-float tables
// (TableLookupLanes; with 8 lanes each half of the table and a select on the index's bit 3);
// the sign bits gather in 32-bit lanes and leave as bytes. The reference's additions in its
// order: the same floats. Narrower targets run the reference.
template <class DF>
HWY_INLINE hn::Vec<DF> Lookup16(DF df, const float* HWY_RESTRICT tab, hn::Vec<hn::RebindToUnsigned<DF>> i) {
  if constexpr (hn::MaxLanes(df) >= 16) {
    return hn::TableLookupLanes(hn::LoadU(df, tab), hn::IndicesFromVec(df, i));
  } else {
    const hn::RebindToUnsigned<DF> du;
    const auto lo = hn::IndicesFromVec(df, hn::And(i, hn::Set(du, 7)));
    const auto upper = hn::RebindMask(df, hn::Gt(i, hn::Set(du, 7)));
    return hn::IfThenElse(upper, hn::TableLookupLanes(hn::LoadU(df, tab + 8), lo),
                          hn::TableLookupLanes(hn::LoadU(df, tab), lo));
  }
}

#if HWY_TARGET != HWY_SCALAR && HWY_TARGET <= HWY_AVX2 && HWY_ARCH_X86
// kRc: IVF's list terms (ct, cu); kCb: the plane (cc, ca, cu, the signs). Fixed per call, so the
// loop over the digits has no branches on them.
template <bool kRc, bool kCb>
HWY_INLINE void DeriveBlockT(const uint8_t* HWY_RESTRICT fb, size_t nd, const PlaneDigit* HWY_RESTRICT dg,
                             const float* HWY_RESTRICT tabs, const float* HWY_RESTRICT rc, size_t d,
                             float* HWY_RESTRICT cc, float* HWY_RESTRICT ca, float* HWY_RESTRICT ct,
                             float* HWY_RESTRICT cu, uint8_t* HWY_RESTRICT cb) {
  const hn::CappedTag<float, 16> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  using VF = hn::Vec<decltype(df)>;
  using VU = hn::Vec<decltype(du)>;
  constexpr size_t N = hn::MaxLanes(df), K = 32 / N;
  static_assert(N == 8 || N == 16, "AVX2 or AVX-512");
  VF vcc[K], vca[K], vct[K], vcu[K];
  VU sb[K];
  const VU m15 = hn::Set(du, 15), zero = hn::Zero(du);
  for (size_t s = 0; s < K; ++s) {
    vcc[s] = vca[s] = vct[s] = vcu[s] = hn::Zero(df);
    sb[s] = zero;
    if constexpr (kCb) {
      vcc[s] = hn::LoadU(df, cc + s * N);
      vca[s] = hn::LoadU(df, ca + s * N);
    }
    if constexpr (kRc) {
      vct[s] = hn::LoadU(df, ct + s * N);
      if constexpr (kCb) vcu[s] = hn::LoadU(df, cu + s * N);
    }
  }
  for (size_t k = 0; k < nd; ++k) {
    const PlaneDigit& g = dg[k];
    const uint8_t* row = fb + static_cast<size_t>(g.row) * 16;
    const float* q2 = tabs + 48 * static_cast<size_t>(g.tab);
    const VU mask = hn::Set(du, g.mask);
    const unsigned t = g.j & 3;
    VU code[K];  // bytes h N.. of the row give sets h (low nibbles) and h + K / 2 (high)
    for (size_t h = 0; h < K / 2; ++h) {
      const VU x = hn::PromoteTo(du, hn::LoadU(d8, row + h * N));
      code[h] = hn::And(x, m15);
      code[h + K / 2] = hn::ShiftRight<4>(x);
    }
    for (size_t s = 0; s < K; ++s) {
      const VU i = hn::And(hn::ShiftRightSame(code[s], g.sh), mask);
      const VU sgn = hn::ShiftRightSame(i, g.top);
      if constexpr (kRc) {
        const VF r = hn::Set(df, rc[g.j]);
        vct[s] = hn::Add(vct[s], hn::Mul(r, Lookup16(df, q2 + 32, i)));
        if constexpr (kCb)
          vcu[s] = hn::Add(vcu[s], hn::IfThenElse(hn::RebindMask(df, hn::Ne(sgn, zero)), r, hn::Neg(r)));
      }
      if constexpr (kCb) {
        vcc[s] = hn::Add(vcc[s], Lookup16(df, q2, i));
        vca[s] = hn::Add(vca[s], Lookup16(df, q2 + 16, i));
        sb[s] = hn::Or(sb[s], hn::ShiftLeftSame(sgn, static_cast<int>(t)));
      }
    }
    if constexpr (kCb) {
      if (t == 3 || g.j + 1 == d) {
        uint8_t* o = cb + static_cast<size_t>(g.j / 4) * 16;
        for (size_t s = 0; s < K / 2; ++s) {  // slots s N.. (low nibbles) and 16 + s N.. (high)
          const VU w = hn::Or(sb[s], hn::ShiftLeft<4>(sb[s + K / 2]));
          hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di, w)), d8, o + s * N);
        }
        for (size_t s = 0; s < K; ++s) sb[s] = zero;
      }
    }
  }
  for (size_t s = 0; s < K; ++s) {
    if constexpr (kCb) {
      hn::StoreU(vcc[s], df, cc + s * N);
      hn::StoreU(vca[s], df, ca + s * N);
    }
    if constexpr (kRc) {
      hn::StoreU(vct[s], df, ct + s * N);
      if constexpr (kCb) hn::StoreU(vcu[s], df, cu + s * N);
    }
  }
}
#endif

void DeriveBlock(const uint8_t* HWY_RESTRICT fb, size_t nd, const PlaneDigit* HWY_RESTRICT dg,
                 const float* HWY_RESTRICT tabs, const float* HWY_RESTRICT rc, size_t d, float* HWY_RESTRICT cc,
                 float* HWY_RESTRICT ca, float* HWY_RESTRICT ct, float* HWY_RESTRICT cu, uint8_t* HWY_RESTRICT cb) {
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET > HWY_AVX2 || !HWY_ARCH_X86
  derive_block_ref(fb, nd, dg, tabs, rc, d, cc, ca, ct, cu, cb);
#else
  if (rc != nullptr && cb != nullptr) DeriveBlockT<true, true>(fb, nd, dg, tabs, rc, d, cc, ca, ct, cu, cb);
  else if (cb != nullptr) DeriveBlockT<false, true>(fb, nd, dg, tabs, rc, d, cc, ca, ct, cu, cb);
  else if (rc != nullptr) DeriveBlockT<true, false>(fb, nd, dg, tabs, rc, d, cc, ca, ct, cu, cb);
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace tq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tq {
HWY_EXPORT(VectorToFastLayout);
HWY_EXPORT(CodeDotLanes);
HWY_EXPORT(Bits3ToNibbles);
HWY_EXPORT(DeriveBlock);

void derive_block(const uint8_t* fb, size_t nd, const PlaneDigit* dg, const float* tabs, const float* rc, size_t d,
                  float* cc, float* ca, float* ct, float* cu, uint8_t* cb) noexcept {
  if (simd::use_scalar()) {
    derive_block_ref(fb, nd, dg, tabs, rc, d, cc, ca, ct, cu, cb);
    return;
  }
  HWY_DYNAMIC_DISPATCH(DeriveBlock)(fb, nd, dg, tabs, rc, d, cc, ca, ct, cu, cb);
}

void bits3_to_nibbles(size_t n, const uint8_t* in, uint8_t* out) noexcept {
  if (simd::use_scalar()) {
    bits3_to_nibbles_ref(n, in, out);
    return;
  }
  HWY_DYNAMIC_DISPATCH(Bits3ToNibbles)(n, in, out);
}

void vector_to_fast_layout(size_t n_blocks, size_t m_groups, const uint8_t* vec, uint8_t* fast) noexcept {
  if (simd::use_scalar()) {
    vector_to_fast_layout_ref(n_blocks, m_groups, vec, fast);
    return;
  }
  HWY_DYNAMIC_DISPATCH(VectorToFastLayout)(n_blocks, m_groups, vec, fast);
}

void code_dot_lanes(size_t g0, size_t g1, int bits, const float* y, const uint8_t* codes, const float* cent,
                    float* lanes) noexcept {
  if (simd::use_scalar()) {
    code_dot_lanes_ref(g0, g1, bits, y, codes, cent, lanes);
    return;
  }
  HWY_DYNAMIC_DISPATCH(CodeDotLanes)(g0, g1, bits, y, codes, cent, lanes);
}
}  // namespace tq
#endif
