// Bit packing of b-bit indices (1 <= b <= 8) into a contiguous little-endian bit stream:
// index j occupies bits [j*b, (j+1)*b) of the stream, bit k of the stream is bit (k % 8)
// of byte k / 8. So 3-bit codes put 8 indices in 3 bytes; 4-bit codes put index 2i in the
// low nibble of byte i. The last byte is zero-padded.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tq {

// Bytes for n indices of b bits: ceil(n * b / 8). Overflow-checked (throws tq::Error).
size_t packed_bytes(size_t n, int bits);

// idx: n values < 2^bits (higher bits are ignored); out: packed_bytes(n, bits) bytes.
void pack_bits(size_t n, int bits, const uint8_t* idx, uint8_t* out) noexcept;
void unpack_bits(size_t n, int bits, const uint8_t* in, uint8_t* idx) noexcept;
// Reference implementations (bit by bit), the oracle for the fast paths.
void pack_bits_ref(size_t n, int bits, const uint8_t* idx, uint8_t* out) noexcept;
void unpack_bits_ref(size_t n, int bits, const uint8_t* in, uint8_t* idx) noexcept;

}  // namespace tq
