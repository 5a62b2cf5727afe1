// GGUF reader on files the tests write themselves: every value type, arrays, tensors of each
// weight type, alignment, v2 and v3; truncated / corrupt / wrong-magic / huge-count rejected.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tq/common.h"
#include "tq/error.h"
#include "tq/gguf.h"

namespace {

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  tq::Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(r.normal()) * scale;
  return v;
}

tq::GgufWriter sample_writer(uint32_t version) {
  tq::GgufWriter w(version);
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 3);
  w.set_i32("some.i32", -7);
  w.set_u64("some.u64", 1ull << 40);
  w.set_f32("some.f32", 1.5f);
  w.set_f64("some.f64", -2.25);
  w.set_bool("some.bool", true);
  w.set_str_array("some.strs", {"a", "", "héllo"});
  w.set_i32_array("some.ints", {1, -2, 3});
  w.set_f32_array("some.floats", {0.5f, -1.0f});
  return w;
}

std::string temp_path(const char* name) {
  return std::string(::testing::TempDir()) + "/tq_gguf_" + name + ".gguf";
}

std::string error_of(const std::vector<uint8_t>& b) {
  try {
    tq::GgufFile::from_bytes(b.data(), b.size());
  } catch (const tq::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Gguf, MetadataAllTypesV2AndV3) {
  for (uint32_t version : {2u, 3u}) {
    auto w = sample_writer(version);
    const std::string path = temp_path(version == 2 ? "v2" : "v3");
    w.write(path);
    auto g = tq::GgufFile::open(path);
    EXPECT_EQ(g.version(), version);
    EXPECT_EQ(g.get_string("general.architecture"), "llama");
    EXPECT_EQ(g.get_uint("llama.block_count"), 3u);
    EXPECT_EQ(g.get("some.i32").i, -7);
    EXPECT_THROW(g.get_uint("some.i32"), tq::Error);  // negative
    EXPECT_EQ(g.get_uint("some.u64"), 1ull << 40);
    EXPECT_FLOAT_EQ(g.get_float("some.f32"), 1.5f);
    EXPECT_DOUBLE_EQ(g.get_float("some.f64"), -2.25);
    EXPECT_TRUE(g.get_bool("some.bool"));
    EXPECT_EQ(g.get_str_array("some.strs"), (std::vector<std::string>{"a", "", "héllo"}));
    EXPECT_EQ(g.get_int_array("some.ints"), (std::vector<int64_t>{1, -2, 3}));
    EXPECT_EQ(g.get("some.floats").arr_float, (std::vector<double>{0.5, -1.0}));
    EXPECT_THROW(g.get_string("llama.block_count"), tq::Error);  // wrong type
    EXPECT_THROW(g.get("missing.key"), tq::Error);
    EXPECT_EQ(g.get_uint_or("missing.key", 42), 42u);
    std::remove(path.c_str());
  }
}

TEST(Gguf, TensorsEachTypeRoundTrip) {
  tq::GgufWriter w;
  w.set_alignment(64);
  const auto x = randn(64 * 3, 11);
  struct Case { tq::GgmlType t; float tol; };
  // Tolerances relative to the max |x| (about 3): fp16 ~1e-3, 8-bit ~1/127, 4-bit ~1/8.
  const Case cases[] = {{tq::GgmlType::F32, 0}, {tq::GgmlType::F16, 2e-3f}, {tq::GgmlType::BF16, 2e-2f},
                        {tq::GgmlType::Q8_0, 0.03f}, {tq::GgmlType::Q4_0, 0.5f}, {tq::GgmlType::Q4_1, 0.3f}};
  for (auto& c : cases) w.add_tensor(std::string("t.") + tq::ggml_type_name(c.t), {64, 3}, c.t, x.data());
  const auto bytes = w.bytes();
  auto g = tq::GgufFile::from_bytes(bytes.data(), bytes.size());
  EXPECT_EQ(g.alignment(), 64u);
  ASSERT_EQ(g.tensors().size(), 6u);
  for (auto& c : cases) {
    const auto& t = g.tensor(std::string("t.") + tq::ggml_type_name(c.t));
    EXPECT_EQ(t.type, c.t);
    EXPECT_EQ(t.ne, (std::vector<uint64_t>{64, 3}));
    EXPECT_EQ(t.rows(), 3u);
    EXPECT_EQ(t.offset % 64, 0u);
    auto y = g.tensor_f32(t);
    ASSERT_EQ(y.size(), x.size());
    double max_err = 0;
    for (size_t i = 0; i < x.size(); ++i) max_err = std::max(max_err, (double)std::fabs(x[i] - y[i]));
    EXPECT_LE(max_err, c.tol) << tq::ggml_type_name(c.t);
  }
  EXPECT_EQ(g.find_tensor("nope"), nullptr);
  EXPECT_THROW(g.tensor("nope"), tq::Error);
}

TEST(Gguf, BlockLayoutsExact) {
  // Q4_0: d = 0.5 (fp16 0x3800), nibbles j -> (j - 8) * d.
  uint8_t q40[18] = {0x00, 0x38};
  for (int j = 0; j < 16; ++j) q40[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  tq::dequantize_row(tq::GgmlType::Q4_0, q40, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 0.5f);
    EXPECT_EQ(y[j + 16], (15 - j - 8) * 0.5f);
  }
  // Q4_1: d = 2 (0x4000), m = -1 (0xBC00): x = nib * 2 - 1.
  uint8_t q41[20] = {0x00, 0x40, 0x00, 0xBC};
  for (int j = 0; j < 16; ++j) q41[4 + j] = static_cast<uint8_t>(j | (j << 4));
  tq::dequantize_row(tq::GgmlType::Q4_1, q41, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j * 2.0f - 1.0f);
    EXPECT_EQ(y[j + 16], j * 2.0f - 1.0f);
  }
  // Q8_0: d = 0.25 (0x3400), x = q * d.
  uint8_t q80[34] = {0x00, 0x34};
  for (int j = 0; j < 32; ++j) q80[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
  tq::dequantize_row(tq::GgmlType::Q8_0, q80, y, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], (j - 16) * 0.25f);
}

TEST(Gguf, RejectsBadFiles) {
  auto w = sample_writer(3);
  const auto x = randn(64, 3);
  w.add_tensor("w", {32, 2}, tq::GgmlType::Q8_0, x.data());
  const auto good = w.bytes();
  ASSERT_EQ(error_of(good), "");

  // Wrong magic.
  auto b = good;
  b[0] = 'X';
  EXPECT_NE(error_of(b).find("not a GGUF file"), std::string::npos) << error_of(b);
  // Unsupported version (1 and a byte-swapped 3).
  b = good;
  b[4] = 1;
  EXPECT_NE(error_of(b).find("unsupported GGUF version"), std::string::npos);
  b = good;
  b[4] = 0; b[7] = 3;
  EXPECT_NE(error_of(b).find("unsupported GGUF version"), std::string::npos);
  // Huge tensor count / metadata count.
  b = good;
  std::memset(b.data() + 8, 0xff, 8);
  EXPECT_NE(error_of(b).find("tensor count"), std::string::npos) << error_of(b);
  b = good;
  std::memset(b.data() + 16, 0x7f, 8);
  EXPECT_NE(error_of(b).find("metadata count"), std::string::npos) << error_of(b);
  // Huge key length.
  b = good;
  std::memset(b.data() + 24, 0xee, 8);
  EXPECT_NE(error_of(b).find("beyond the end"), std::string::npos) << error_of(b);
  // Unknown value type for the first key ("general.architecture", 20 bytes).
  b = good;
  b[24 + 8 + 20] = 99;
  EXPECT_NE(error_of(b).find("unknown value type"), std::string::npos) << error_of(b);
  // Truncation at every length: always a clean tq::Error, never a crash.
  for (size_t n = 0; n < good.size(); n += (n < 200 ? 1 : 7)) {
    std::vector<uint8_t> t(good.begin(), good.begin() + n);
    EXPECT_NE(error_of(t), "") << "prefix of " << n << " bytes accepted";
  }
  // Tensor with an unknown ggml type, a misaligned offset, data past the end.
  const size_t tinfo = good.size() - 64 /*pad+data region*/;
  (void)tinfo;
  // Locate the tensor info: name "w" (u64 len 1, 'w'), n_dims, ne0, ne1, type, offset.
  size_t at = 0;
  for (size_t i = 0; i + 9 < good.size(); ++i)
    if (good[i] == 1 && std::memcmp(&good[i + 1], "\0\0\0\0\0\0\0w", 8) == 0) { at = i + 9; break; }
  ASSERT_NE(at, 0u);
  const size_t type_at = at + 4 + 16, off_at = type_at + 4;
  b = good;
  b[type_at] = 10;  // Q2_K: not supported
  EXPECT_NE(error_of(b).find("tensor 'w' has ggml type 10 (Q2_K)"), std::string::npos) << error_of(b);
  b[type_at] = 77;  // no ggml type at all
  EXPECT_NE(error_of(b).find("tensor 'w' has ggml type 77 (?)"), std::string::npos) << error_of(b);
  b = good;
  b[off_at] = 3;
  EXPECT_NE(error_of(b).find("alignment"), std::string::npos) << error_of(b);
  b = good;
  b[off_at + 1] = 1;  // +256: past the end
  EXPECT_NE(error_of(b).find("ends past"), std::string::npos) << error_of(b);
  b = good;
  b[at] = 9;  // 9 dimensions
  EXPECT_NE(error_of(b).find("dimensions"), std::string::npos) << error_of(b);
  b = good;
  b[at + 4] = 33;  // ne0 = 33: not a multiple of the Q8_0 block
  EXPECT_NE(error_of(b).find("block size"), std::string::npos) << error_of(b);
  // Overflowing element count.
  b = good;
  std::memset(b.data() + at + 4, 0xff, 5);
  EXPECT_NE(error_of(b), "");
  // Missing file, empty file.
  EXPECT_THROW(tq::GgufFile::open("/nonexistent/x.gguf"), tq::Error);
  const std::string empty = temp_path("empty");
  std::fclose(std::fopen(empty.c_str(), "wb"));
  EXPECT_THROW(tq::GgufFile::open(empty), tq::Error);
  std::remove(empty.c_str());
}

TEST(Gguf, DuplicateKeysRejected) {
  tq::GgufWriter w;
  w.set_u32("a", 1);
  w.set_u32("a", 2);
  const auto b = w.bytes();
  EXPECT_NE(error_of(b).find("duplicate"), std::string::npos);
}

// Types without a quantizer here (Q5_0, Q5_1, K-quants) are written from their bytes
// (add_tensor_raw, size checked); add_tensor / quantize_row on them is a clear error.
TEST(Gguf, RawTensorsOfTypesWithoutQuantizer) {
  for (tq::GgmlType t : {tq::GgmlType::Q5_0, tq::GgmlType::Q5_1, tq::GgmlType::Q4_K, tq::GgmlType::Q5_K,
                         tq::GgmlType::Q6_K}) {
    EXPECT_FALSE(tq::ggml_has_quantizer(t));
    const size_t n = 512, rb = tq::ggml_row_bytes(t, n);
    std::vector<uint8_t> raw(rb * 2);
    for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>(i * 37 + 11);
    std::vector<float> x(n * 2, 0.5f);
    tq::GgufWriter w;
    EXPECT_THROW(w.add_tensor("q", {n, 2}, t, x.data()), tq::Error) << tq::ggml_type_name(t);
    EXPECT_THROW(w.add_tensor_raw("q", {n, 2}, t, raw.data(), raw.size() - 1), tq::Error);
    w.add_tensor_raw("q", {n, 2}, t, raw.data(), raw.size());
    const auto bytes = w.bytes();
    const auto g = tq::GgufFile::from_bytes(bytes.data(), bytes.size());
    const auto& q = g.tensor("q");
    EXPECT_EQ(q.type, t);
    EXPECT_EQ(q.n_bytes, raw.size());
    EXPECT_EQ(0, std::memcmp(q.data, raw.data(), raw.size()));
  }
  std::vector<float> x(256);
  std::vector<uint8_t> out(1024);
  try {
    tq::quantize_row(tq::GgmlType::Q4_K, x.data(), out.data(), 256);
    FAIL() << "no error";
  } catch (const tq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no quantizer for Q4_K"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tq::ggml_block_size(tq::GgmlType::Q6_K), 256);
  EXPECT_EQ(tq::ggml_block_bytes(tq::GgmlType::Q6_K), 210);
  EXPECT_EQ(tq::ggml_row_bytes(tq::GgmlType::Q4_K, 512), 288u);
  EXPECT_THROW(tq::ggml_row_bytes(tq::GgmlType::Q5_K, 640), tq::Error);  // 640 is not a multiple of 256
}
