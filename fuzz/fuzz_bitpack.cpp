// Fuzz target: bit unpacking of arbitrary code bytes (include/tq/bitpack.h).
//
// Input: byte 0 picks the width b = 1 + (byte0 % 8); the rest is a packed stream, of which
// n = floor(8 * len / b) indices are unpacked. Properties checked on every input:
//   - unpack_bits (word-at-a-time fast path) == unpack_bits_ref (bit by bit);
//   - every unpacked index is < 2^b;
//   - pack_bits and pack_bits_ref of those indices agree and give back the input bytes
//     (the unused pad bits of the last byte cleared);
//   - pack_bits ignores bits above b: indices with junk high bits pack to the same bytes;
//   - the output buffers are exactly packed_bytes(n, b) / n long, so ASan catches any
//     read or write past them.
#include <cstring>
#include <vector>

#include "fuzz_util.h"
#include "tq/bitpack.h"
#include "tq/common.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string dir = tq_fuzz::seed_dir();
  if (dir.empty()) return 0;
  // Seeds: packed streams written by pack_bits for each width and a few lengths.
  tq::Rng rng(1);
  for (int bits = 1; bits <= 8; ++bits)
    for (size_t n : {1u, 7u, 8u, 9u, 64u, 129u}) {
      std::vector<uint8_t> idx(n);
      for (auto& v : idx) v = static_cast<uint8_t>(rng.below(1u << bits));
      std::vector<uint8_t> out(1 + tq::packed_bytes(n, bits));
      out[0] = static_cast<uint8_t>(bits - 1);
      tq::pack_bits(n, bits, idx.data(), out.data() + 1);
      tq_fuzz::write_seed(dir, "b" + std::to_string(bits) + "_n" + std::to_string(n), out);
    }
  std::vector<uint8_t> ones(1 + 17, 0xff);  // all-0xFF codes, 3 bits
  ones[0] = 2;
  tq_fuzz::write_seed(dir, "b3_all_ff", ones);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int bits = 1 + data[0] % 8;
  const std::vector<uint8_t> in(data + 1, data + size);  // exact-size heap copy
  const size_t n = in.size() * 8 / static_cast<size_t>(bits);
  const size_t nb = tq::packed_bytes(n, bits);
  TQ_FUZZ_REQUIRE(nb <= in.size());
  TQ_FUZZ_REQUIRE(nb * 8 >= n * static_cast<size_t>(bits) && (nb == 0 || (nb - 1) * 8 < n * static_cast<size_t>(bits)));

  std::vector<uint8_t> idx(n), idx_ref(n);
  tq::unpack_bits(n, bits, in.data(), idx.data());
  tq::unpack_bits_ref(n, bits, in.data(), idx_ref.data());
  TQ_FUZZ_REQUIRE(idx == idx_ref);
  for (uint8_t v : idx) TQ_FUZZ_REQUIRE(v < (1u << bits));

  std::vector<uint8_t> packed(nb), packed_ref(nb);
  tq::pack_bits(n, bits, idx.data(), packed.data());
  tq::pack_bits_ref(n, bits, idx.data(), packed_ref.data());
  TQ_FUZZ_REQUIRE(packed == packed_ref);
  std::vector<uint8_t> expect(in.begin(), in.begin() + static_cast<long>(nb));
  const size_t used = n * static_cast<size_t>(bits) % 8;
  if (used) expect[nb - 1] &= static_cast<uint8_t>((1u << used) - 1);
  TQ_FUZZ_REQUIRE(packed == expect);

  // Junk in the high bits of the indices must be ignored.
  std::vector<uint8_t> junk(n);
  for (size_t j = 0; j < n; ++j) junk[j] = static_cast<uint8_t>(idx[j] | (in[j % in.size()] << bits));
  std::vector<uint8_t> packed_junk(nb);
  tq::pack_bits(n, bits, junk.data(), packed_junk.data());
  TQ_FUZZ_REQUIRE(packed_junk == packed);
  return 0;
}
