// Limits.*: sizes that overflow or would exceed memory are rejected with a clear tq::Error
// before anything is allocated (dimension x count, tensor shapes, array lengths, header
// counts). Under ASan a huge allocation would abort the test, so passing there also shows
// that nothing tried to allocate.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tq/bitpack.h"
#include "tq/codebook.h"
#include "tq/common.h"
#include "tq/error.h"
#include "tq/gguf.h"
#include "tq/quantizer.h"
#include "tq/rotation.h"
#include "tq/vecs.h"

namespace {

constexpr size_t kMax = std::numeric_limits<size_t>::max();

// Runs f, which must throw tq::Error whose message contains `needle`.
template <class F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const tq::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
  }
}

void put32(std::vector<uint8_t>& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put64(std::vector<uint8_t>& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_str(std::vector<uint8_t>& b, const std::string& s) {
  put64(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}
std::vector<uint8_t> gguf_head(uint64_t n_tensors, uint64_t n_kv) {
  std::vector<uint8_t> b;
  put32(b, 0x46554747u);
  put32(b, 3);
  put64(b, n_tensors);
  put64(b, n_kv);
  return b;
}
std::string gguf_error(const std::vector<uint8_t>& b) {
  try {
    tq::GgufFile::from_bytes(b.data(), b.size());
  } catch (const tq::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Limits, CheckedArithmeticNamesTheQuantity) {
  expect_error([] { tq::checked_mul(kMax / 2 + 1, 2, "rows x dim"); }, "rows x dim");
  expect_error([] { tq::checked_add(kMax, 1, "header + data"); }, "header + data");
  EXPECT_EQ(tq::checked_mul(1u << 20, 1u << 20, "x"), size_t(1) << 40);
  EXPECT_EQ(tq::checked_add(kMax - 1, 1, "x"), kMax);
}

TEST(Limits, PackedBytesOverflowAndWidth) {
  expect_error([] { tq::packed_bytes(kMax, 8); }, "overflow");
  expect_error([] { tq::packed_bytes(kMax / 4, 5); }, "overflow");
  expect_error([] { tq::packed_bytes(10, 0); }, "bit width");
  expect_error([] { tq::packed_bytes(10, 9); }, "bit width");
  EXPECT_EQ(tq::packed_bytes(kMax / 8, 8), kMax / 8);  // the largest that fits
}

TEST(Limits, AlignedAllocationOverflow) {
  expect_error([] { tq::aligned_alloc_bytes(kMax); }, "overflow");
  expect_error([] { tq::aligned_alloc_bytes(kMax - 10); }, "overflow");
}

TEST(Limits, CodecDimensionLimits) {
  tq::QuantizerConfig cfg;
  cfg.bits = 4;
  cfg.dim = (1 << 20) + 1;
  expect_error([&] { tq::make_quantizer(tq::QuantizerKind::mse, cfg); }, "too large");
  cfg.dim = std::numeric_limits<int>::max();
  expect_error([&] { tq::make_quantizer(tq::QuantizerKind::mse, cfg); }, "too large");
  cfg.dim = -1;
  expect_error([&] { tq::make_quantizer(tq::QuantizerKind::mse, cfg); }, "dimension");
  // The dense QJL matrix (d x d floats) is bounded: 16385^2 * 4 bytes is refused up front.
  cfg.dim = 16385;
  expect_error([&] { tq::make_quantizer(tq::QuantizerKind::prod, cfg); }, "16384");
  expect_error([&] { tq::make_quantizer(tq::QuantizerKind::qjl, cfg); }, "16384");
  // Dense Haar rotation: d x d, refused above 8192.
  expect_error([] { tq::make_rotation(tq::parse_rotation("haar"), 8193, 1); }, "8192");
  expect_error([] { tq::make_rotation(tq::parse_rotation("hadamard"), (1 << 24) + 1, 1); }, "too large");
  expect_error([] { tq::make_rotation(tq::parse_rotation("hadamard"), 0, 1); }, "dimension");
  expect_error([] { tq::get_codebook((1 << 24) + 1, 4); }, "too large");
  expect_error([] { tq::get_codebook(1, 4); }, "dimension");
  expect_error([] { tq::get_codebook(64, 9); }, "bits");
  tq::RotationSpec bad{tq::RotationKind::block, 48};
  expect_error([&] { tq::make_rotation(bad, 96, 1); }, "block");
}

TEST(Limits, GgufImpossibleCountsRejectedBeforeAllocation) {
  // 2^62 metadata entries or tensors in a 24-byte file.
  EXPECT_NE(gguf_error(gguf_head(0, uint64_t(1) << 62)).find("metadata count"), std::string::npos);
  EXPECT_NE(gguf_error(gguf_head(uint64_t(1) << 62, 0)).find("tensor count"), std::string::npos);
  // An array claiming 2^61 u64 elements.
  auto b = gguf_head(0, 1);
  put_str(b, "big.array");
  put32(b, 9);   // ARRAY
  put32(b, 10);  // of U64
  put64(b, uint64_t(1) << 61);
  put64(b, 0);
  EXPECT_NE(gguf_error(b).find("does not fit"), std::string::npos) << gguf_error(b);
  // A string claiming 2^63 bytes.
  b = gguf_head(0, 1);
  put_str(b, "big.string");
  put32(b, 8);
  put64(b, uint64_t(1) << 63);
  EXPECT_NE(gguf_error(b).find("beyond the end"), std::string::npos) << gguf_error(b);
}

TEST(Limits, GgufTensorShapeOverflow) {
  // ne = 2^40 x 2^40 x 2^40: the element count overflows size_t.
  auto b = gguf_head(1, 0);
  put_str(b, "huge");
  put32(b, 3);
  for (int i = 0; i < 3; ++i) put64(b, uint64_t(1) << 40);
  put32(b, 0);  // F32
  put64(b, 0);
  b.resize(b.size() + 64, 0);
  const std::string e = gguf_error(b);
  EXPECT_NE(e.find("overflow"), std::string::npos) << e;
  // 2^40 x 2^20 F32 = 2^62 bytes: no overflow of the count, but far beyond the file.
  b = gguf_head(1, 0);
  put_str(b, "big");
  put32(b, 2);
  put64(b, uint64_t(1) << 40);
  put64(b, uint64_t(1) << 20);
  put32(b, 0);
  put64(b, 0);
  b.resize(b.size() + 64, 0);
  const std::string e2 = gguf_error(b);
  EXPECT_FALSE(e2.empty());
  EXPECT_TRUE(e2.find("overflow") != std::string::npos || e2.find("ends past") != std::string::npos) << e2;
}

TEST(Limits, NpyShapeOverflowAndDimension) {
  auto npy = [](const std::string& shape) {
    std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
    while ((10 + h.size() + 1) % 64) h.push_back(' ');
    h.push_back('\n');
    // Magic, version 1.0, little-endian header length, header, 16 bytes of data; assembled as
    // one string (GCC 12 misreads a vector insert of string iterators as an overread).
    std::string f = "\x93NUMPY";
    f += '\x01';
    f += '\0';
    f += static_cast<char>(h.size() & 0xFF);
    f += static_cast<char>(h.size() >> 8);
    f += h;
    f.append(16, '\0');
    return std::vector<uint8_t>(f.begin(), f.end());
  };
  auto err = [](const std::vector<uint8_t>& b) {
    try {
      tq::parse_npy(b.data(), b.size(), "x.npy");
    } catch (const tq::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // n * d * 4 overflows size_t.
  EXPECT_NE(err(npy("(4611686018427387904, 1024)")).find("overflow"), std::string::npos);
  // A shape number that does not fit size_t at all.
  EXPECT_NE(err(npy("(99999999999999999999999, 4)")).find("overflow"), std::string::npos);
  // d above kMaxVecsDim.
  EXPECT_NE(err(npy("(1, 2000000)")).find("row length"), std::string::npos);
  // A plausible shape whose data is not in the file: refused before allocating n * d.
  EXPECT_NE(err(npy("(1000000000, 1000)")).find("needs"), std::string::npos);
}

TEST(Limits, VecsDimensionHeader) {
  std::vector<uint8_t> b;
  put32(b, 0x7fffffff);  // d = 2^31 - 1
  b.resize(64, 0);
  try {
    tq::parse_fvecs(b.data(), b.size(), "x.fvecs");
    ADD_FAILURE() << "accepted d = 2^31 - 1";
  } catch (const tq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("dimension"), std::string::npos) << e.what();
  }
}

// Regression (fuzz_bitpack, inputs in fuzz/corpus/fuzz_bitpack/regress_*): zero values with
// null buffers (an empty std::vector's data()) passed null to memset / memcpy, which is
// undefined behaviour that UBSan reports, for every width including the 8-bit memcpy path.
TEST(Limits, ZeroLengthBitpackWithNullBuffers) {
  for (int bits = 1; bits <= 8; ++bits) {
    EXPECT_EQ(tq::packed_bytes(0, bits), 0u);
    tq::pack_bits(0, bits, nullptr, nullptr);
    tq::pack_bits_ref(0, bits, nullptr, nullptr);
    tq::unpack_bits(0, bits, nullptr, nullptr);
    tq::unpack_bits_ref(0, bits, nullptr, nullptr);
  }
}
