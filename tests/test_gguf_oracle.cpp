// GgufOracle.*: tq's dequantizers against an oracle nobody here wrote, the numpy dequantizers
// of the `gguf` PyPI package (tests/gguf_dequant_oracle.py, run with TQ_TEST_PYTHON, the test
// venv of `make venv`), bit for bit:
//  - random blocks of every type tq reads (random codes, random finite fp16 scales incl.
//    subnormals and signed zeros), written by gguf.GGUFWriter, read by tq::GgufFile: the
//    scalar reference and dequantize_row at every SIMD level of the host give gguf's bits;
//  - every tensor of the real Gemma 3 270M Q4_K_M file (models/gemma-3-270m-q4_k_m.gguf, when
//    present: make test fetches it) at every SIMD level: two position-weighted checksums of
//    the f32 bit patterns equal those of gguf's dequantization (any one differing value
//    changes the first, see the script).
// Skipped, saying why, without the venv or the model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llm_test_util.h"
#include "tq/gguf.h"
#include "tq/simd.h"

namespace {

std::string python() { return TQ_TEST_PYTHON; }

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs the oracle script with `args`; "" on success, else what went wrong.
std::string run_oracle(const std::string& args) {
  const std::string cmd = quote(python()) + " " + quote(tq_test::source_path("tests/gguf_dequant_oracle.py")) + " " +
                          args + " > /dev/null";
  const int rc = std::system(cmd.c_str());
  return rc == 0 ? "" : "command failed (" + std::to_string(rc) + "): " + cmd;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("tq_oracle_" + std::to_string(::getpid()) + "_" + name)).string();
}

// c1, c2 of the module docstring of tests/gguf_dequant_oracle.py (uint64 arithmetic wraps).
void checksums(const std::vector<float>& f, uint64_t& c1, uint64_t& c2) {
  c1 = c2 = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &f[i], 4);
    c1 += static_cast<uint64_t>(u) * (2 * static_cast<uint64_t>(i) + 1);
    c2 += static_cast<uint64_t>(u) * u;
  }
}

}  // namespace

TEST(GgufOracle, RandomBlocksBitExactAtEveryLevel) {
  if (!tq_test::file_exists(python())) GTEST_SKIP() << python() << " missing: run make venv (make test does)";
  const std::string path = temp_path("random.gguf");
  ASSERT_EQ(run_oracle("random --seed 31 --out " + quote(path)), "");
  const tq::GgufFile g = tq::GgufFile::open(path);
  std::remove(path.c_str());
  int types = 0;
  for (tq::GgmlType t : tq::kGgmlTypes) {
    const std::string name = tq::ggml_type_name(t);
    const tq::GgufTensor& b = g.tensor(name + ".blocks");
    const tq::GgufTensor& e = g.tensor(name + ".expected");
    ASSERT_EQ(b.type, t) << name;
    ASSERT_EQ(e.type, tq::GgmlType::F32) << name;
    ASSERT_EQ(b.ne, e.ne) << name;
    const size_t cols = b.ne[0], rows = b.rows(), rb = tq::ggml_row_bytes(t, cols);
    ASSERT_GE(rows * cols / static_cast<size_t>(tq::ggml_block_size(t)), 288u) << name;
    const float* want = reinterpret_cast<const float*>(e.data);
    std::vector<float> y(cols);
    for (size_t r = 0; r < rows; ++r) {
      std::fill(y.begin(), y.end(), -1.0f);
      tq::dequantize_row_ref(t, b.data + r * rb, y.data(), cols);
      ASSERT_EQ(0, std::memcmp(y.data(), want + r * cols, cols * sizeof(float))) << name << " reference, row " << r;
    }
    for (const auto& level : tq::simd::available_levels()) {
      tq::simd::ScopedLevel sl(level);
      for (size_t r = 0; r < rows; ++r) {
        std::fill(y.begin(), y.end(), -1.0f);
        tq::dequantize_row(t, b.data + r * rb, y.data(), cols);
        ASSERT_EQ(0, std::memcmp(y.data(), want + r * cols, cols * sizeof(float))) << name << " at " << level
                                                                                     << ", row " << r;
      }
      const std::vector<float> all = g.tensor_f32(b);
      ASSERT_EQ(0, std::memcmp(all.data(), want, all.size() * sizeof(float))) << name << " tensor_f32 at " << level;
    }
    ++types;
  }
  EXPECT_EQ(types, 11);
}

TEST(GgufOracle, GemmaTensorsBitExactAtEveryLevel) {
  const std::string model = tq_test::source_path("models/gemma-3-270m-q4_k_m.gguf");
  if (!tq_test::file_exists(model))
    GTEST_SKIP() << model << " missing: run scripts/fetch-model.sh gemma3-270m (make test does)";
  if (!tq_test::file_exists(python())) GTEST_SKIP() << python() << " missing: run make venv (make test does)";
  const std::string out = temp_path("gemma.json");
  ASSERT_EQ(run_oracle("model --model " + quote(model) + " --out " + quote(out)), "");
  nlohmann::json want;
  {
    std::ifstream f(out);
    f >> want;
  }
  std::remove(out.c_str());
  const tq::GgufFile g = tq::GgufFile::open(model);
  ASSERT_EQ(want.size(), g.tensors().size());
  int kquant = 0;
  for (const auto& level : tq::simd::available_levels()) {
    tq::simd::ScopedLevel sl(level);
    for (const tq::GgufTensor& t : g.tensors()) {
      ASSERT_TRUE(want.contains(t.name)) << t.name;
      const auto& w = want[t.name];
      ASSERT_EQ(w["type"].get<std::string>(), tq::ggml_type_name(t.type)) << t.name;
      ASSERT_EQ(w["n"].get<size_t>(), t.n_elements) << t.name;
      uint64_t c1, c2;
      checksums(g.tensor_f32(t), c1, c2);
      ASSERT_EQ(std::to_string(c1), w["c1"].get<std::string>()) << t.name << " (" << tq::ggml_type_name(t.type)
                                                                 << ") at " << level;
      ASSERT_EQ(std::to_string(c2), w["c2"].get<std::string>()) << t.name << " at " << level;
      if (level == "scalar" && (t.type == tq::GgmlType::Q4_K || t.type == tq::GgmlType::Q6_K)) ++kquant;
    }
  }
  EXPECT_EQ(kquant, 27 + 9);  // the file's Q4_K and Q6_K tensors
}
