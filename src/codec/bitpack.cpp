// Bit packing (include/tq/bitpack.h). The fast path packs groups of 8 indices (8 * b bits
// = b bytes) through a 64-bit little-endian word; the tail and the references go bit by bit.
#include "tq/bitpack.h"

#include <bit>
#include <cstring>

#include "tq/error.h"

static_assert(std::endian::native == std::endian::little, "turboquant assumes a little-endian host");

namespace tq {

size_t packed_bytes(size_t n, int bits) {
  TQ_CHECK(bits >= 1 && bits <= 8, "bit width must be in 1..8 (got %d)", bits);
  return checked_add(checked_mul(n, static_cast<size_t>(bits), "packed bits"), 7, "packed bits") / 8;
}

void pack_bits_ref(size_t n, int bits, const uint8_t* idx, uint8_t* out) noexcept {
  const size_t nbytes = (n * bits + 7) / 8;
  if (nbytes == 0) return;  // out may be null for n == 0 (memset(nullptr, 0, 0) is UB)
  std::memset(out, 0, nbytes);
  for (size_t j = 0; j < n; ++j)
    for (int k = 0; k < bits; ++k) {
      const size_t bit = j * bits + k;
      if ((idx[j] >> k) & 1u) out[bit >> 3] |= static_cast<uint8_t>(1u << (bit & 7));
    }
}

void unpack_bits_ref(size_t n, int bits, const uint8_t* in, uint8_t* idx) noexcept {
  for (size_t j = 0; j < n; ++j) {
    unsigned v = 0;
    for (int k = 0; k < bits; ++k) {
      const size_t bit = j * bits + k;
      v |= ((in[bit >> 3] >> (bit & 7)) & 1u) << k;
    }
    idx[j] = static_cast<uint8_t>(v);
  }
}

namespace {

// Groups of 8 indices <-> `B` bytes through one 64-bit word; B is a compile-time constant so
// the memcpy calls inline to plain loads and stores.
template <int B>
void pack_groups(size_t n, const uint8_t* idx, uint8_t* out) noexcept {
  constexpr uint64_t mask = (1u << B) - 1;
  for (size_t g = 0; g + 8 <= n; g += 8) {
    uint64_t w = 0;
    for (int k = 0; k < 8; ++k) w |= (idx[g + k] & mask) << (k * B);
    std::memcpy(out + (g / 8) * B, &w, B);
  }
}

template <int B>
void unpack_groups(size_t n, const uint8_t* in, uint8_t* idx) noexcept {
  constexpr uint64_t mask = (1u << B) - 1;
  for (size_t g = 0; g + 8 <= n; g += 8) {
    uint64_t w = 0;
    std::memcpy(&w, in + (g / 8) * B, B);
    for (int k = 0; k < 8; ++k) idx[g + k] = static_cast<uint8_t>((w >> (k * B)) & mask);
  }
}

}  // namespace

void pack_bits(size_t n, int bits, const uint8_t* idx, uint8_t* out) noexcept {
  const uint64_t mask = (1u << bits) - 1;
  size_t g = 0;
  if (bits == 8) {
    if (n) std::memcpy(out, idx, n);  // n == 0 may come with null pointers
    return;
  }
  if (bits == 4) {  // SWAR: 8 indices (one word) -> 4 bytes
    for (; g + 8 <= n; g += 8) {
      uint64_t w;
      std::memcpy(&w, idx + g, 8);
      w &= 0x0F0F0F0F0F0F0F0Full;
      w = (w | (w >> 4)) & 0x00FF00FF00FF00FFull;
      w = (w | (w >> 8)) & 0x0000FFFF0000FFFFull;
      w = (w | (w >> 16)) & 0x00000000FFFFFFFFull;
      const uint32_t v = static_cast<uint32_t>(w);
      std::memcpy(out + g / 2, &v, 4);
    }
    for (; g + 2 <= n; g += 2) out[g / 2] = static_cast<uint8_t>((idx[g] & 0xF) | (idx[g + 1] << 4));
    if (g < n) out[g / 2] = idx[g] & 0xF;
    return;
  }
  switch (bits) {
    case 1: pack_groups<1>(n, idx, out); break;
    case 2: pack_groups<2>(n, idx, out); break;
    case 3: pack_groups<3>(n, idx, out); break;
    case 5: pack_groups<5>(n, idx, out); break;
    case 6: pack_groups<6>(n, idx, out); break;
    case 7: pack_groups<7>(n, idx, out); break;
    default: break;
  }
  g = n & ~static_cast<size_t>(7);
  if (g < n) {
    uint64_t w = 0;
    for (size_t k = 0; g + k < n; ++k) w |= (idx[g + k] & mask) << (k * bits);
    std::memcpy(out + (g / 8) * bits, &w, ((n - g) * bits + 7) / 8);
  }
}

void unpack_bits(size_t n, int bits, const uint8_t* in, uint8_t* idx) noexcept {
  const uint64_t mask = (1u << bits) - 1;
  size_t g = 0;
  if (bits == 8) {
    if (n) std::memcpy(idx, in, n);  // n == 0 may come with null pointers
    return;
  }
  if (bits == 4) {  // common case: two indices per byte
    for (; g + 2 <= n; g += 2) {
      idx[g] = in[g / 2] & 0xF;
      idx[g + 1] = in[g / 2] >> 4;
    }
    if (g < n) idx[g] = in[g / 2] & 0xF;
    return;
  }
  switch (bits) {
    case 1: unpack_groups<1>(n, in, idx); break;
    case 2: unpack_groups<2>(n, in, idx); break;
    case 3: unpack_groups<3>(n, in, idx); break;
    case 5: unpack_groups<5>(n, in, idx); break;
    case 6: unpack_groups<6>(n, in, idx); break;
    case 7: unpack_groups<7>(n, in, idx); break;
    default: break;
  }
  g = n & ~static_cast<size_t>(7);
  if (g < n) {
    uint64_t w = 0;
    std::memcpy(&w, in + (g / 8) * bits, ((n - g) * bits + 7) / 8);
    for (size_t k = 0; g + k < n; ++k) idx[g + k] = static_cast<uint8_t>((w >> (k * bits)) & mask);
  }
}

}  // namespace tq
