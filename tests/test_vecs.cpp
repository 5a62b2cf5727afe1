// Vecs.*: .fvecs/.ivecs/.bvecs/.npy readers reject every malformed input with tq::Error;
// FileIo.*: atomic writes leave either the old or the new file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "tq/error.h"
#include "tq/fileio.h"
#include "tq/vecs.h"

namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path dir;
  TempDir() {
    dir = fs::temp_directory_path() / ("tq_vecs_test_" + std::to_string(::getpid()) + "_" +
                                       std::to_string(reinterpret_cast<uintptr_t>(this)));
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
};

void put32(std::vector<uint8_t>& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void putf(std::vector<uint8_t>& b, float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  put32(b, u);
}
std::vector<uint8_t> make_fvecs(size_t n, size_t d, float base = 0.f) {
  std::vector<uint8_t> b;
  for (size_t i = 0; i < n; ++i) {
    put32(b, static_cast<uint32_t>(d));
    for (size_t j = 0; j < d; ++j) putf(b, base + static_cast<float>(i * 10 + j));
  }
  return b;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

TEST(Vecs, FvecsRoundTrip) {
  TempDir t;
  const size_t n = 5, d = 7;
  std::vector<float> x(n * d);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i)) * 3.f;
  tq::write_fvecs(t.path("a.fvecs"), n, d, x.data());
  auto m = tq::read_fvecs(t.path("a.fvecs"));
  ASSERT_EQ(m.n, n);
  ASSERT_EQ(m.d, d);
  EXPECT_EQ(m.data, x);
  auto m2 = tq::read_fvecs(t.path("a.fvecs"), 2);
  EXPECT_EQ(m2.n, 2u);
  EXPECT_EQ(tq::file_size(t.path("a.fvecs")), n * (4 + 4 * d));
  // Generic reader by extension.
  EXPECT_EQ(tq::read_vectors(t.path("a.fvecs")).data, x);
}

TEST(Vecs, IvecsAndBvecsRoundTrip) {
  TempDir t;
  std::vector<int32_t> ids = {1, -2, 3, 400000, 5, 6};
  tq::write_ivecs(t.path("g.ivecs"), 2, 3, ids.data());
  auto m = tq::read_ivecs(t.path("g.ivecs"));
  ASSERT_EQ(m.n, 2u);
  ASSERT_EQ(m.d, 3u);
  EXPECT_EQ(m.data, ids);
  std::vector<uint8_t> bytes = {0, 1, 255, 7};
  tq::write_bvecs(t.path("b.bvecs"), 2, 2, bytes.data());
  auto bm = tq::read_bvecs(t.path("b.bvecs"));
  ASSERT_EQ(bm.n, 2u);
  EXPECT_EQ(bm.data, (std::vector<float>{0.f, 1.f, 255.f, 7.f}));
}

TEST(Vecs, NpyRoundTripAndHeaderChecks) {
  TempDir t;
  std::vector<float> x = {1.5f, -2.f, 3.f, 4.f, 5.f, 6.25f};
  tq::write_npy(t.path("a.npy"), 3, 2, x.data());
  auto m = tq::read_npy(t.path("a.npy"));
  ASSERT_EQ(m.n, 3u);
  ASSERT_EQ(m.d, 2u);
  EXPECT_EQ(m.data, x);
  EXPECT_EQ(tq::read_vectors(t.path("a.npy")).data, x);

  std::string raw = slurp(t.path("a.npy"));
  auto parse = [](const std::string& s) {
    return tq::parse_npy(reinterpret_cast<const uint8_t*>(s.data()), s.size(), "mem.npy");
  };
  EXPECT_NO_THROW(parse(raw));
  // Every truncation is rejected.
  for (size_t len = 0; len < raw.size(); ++len) EXPECT_THROW(parse(raw.substr(0, len)), tq::Error) << len;
  // Wrong dtype, Fortran order, 3-D shape, bad magic, trailing garbage.
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = raw;
    auto p = s.find(from);
    EXPECT_NE(p, std::string::npos);
    s.replace(p, from.size(), to);
    return s;
  };
  EXPECT_THROW(parse(replace("'<f4'", "'<f8'")), tq::Error);
  EXPECT_THROW(parse(replace("'<f4'", "'>f4'")), tq::Error);
  EXPECT_THROW(parse(replace("False", "True ")), tq::Error);
  EXPECT_THROW(parse(replace("(3, 2)", "(3,2,1)")), tq::Error);
  EXPECT_THROW(parse(replace("(3, 2)", "(4, 2)")), tq::Error);
  EXPECT_THROW(parse(replace("NUMPY", "NUMPZ")), tq::Error);
  EXPECT_THROW(parse(raw + "xxxx"), tq::Error);
  // NaN in the data.
  std::vector<float> bad = x;
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  tq::write_npy(t.path("nan.npy"), 3, 2, bad.data());
  EXPECT_THROW(tq::read_npy(t.path("nan.npy")), tq::Error);
}

TEST(Vecs, FvecsRejectsMalformed) {
  auto parse = [](const std::vector<uint8_t>& b) {
    return tq::parse_fvecs(b.data(), b.size(), "mem.fvecs");
  };
  auto good = make_fvecs(3, 4);
  EXPECT_EQ(parse(good).n, 3u);
  // Empty file.
  EXPECT_THROW(parse({}), tq::Error);
  // Truncated at every byte offset.
  for (size_t len = 0; len < good.size(); ++len) {
    std::vector<uint8_t> b(good.begin(), good.begin() + static_cast<long>(len));
    if (len % (4 + 16) == 0 && len > 0) {
      EXPECT_EQ(parse(b).n, len / 20);  // whole records: a valid shorter file
    } else {
      EXPECT_THROW(parse(b), tq::Error) << "length " << len;
    }
  }
  // Inconsistent d in a later record.
  auto b = good;
  b[20] = 5;
  EXPECT_THROW(parse(b), tq::Error);
  // d = 0, negative d, absurd d.
  b = good;
  b[0] = 0;
  EXPECT_THROW(parse(b), tq::Error);
  b = good;
  b[3] = 0x80;
  EXPECT_THROW(parse(b), tq::Error);
  b = good;
  b[3] = 0x10;
  EXPECT_THROW(parse(b), tq::Error);
  // NaN and Inf values.
  for (float v : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    b = good;
    uint32_t u;
    std::memcpy(&u, &v, 4);
    for (int i = 0; i < 4; ++i) b[20 + 4 + 8 + i] = static_cast<uint8_t>(u >> (8 * i));
    EXPECT_THROW(parse(b), tq::Error);
  }
}

TEST(Vecs, IvecsAndBvecsRejectMalformed) {
  std::vector<uint8_t> b;
  put32(b, 2);
  put32(b, 7);
  put32(b, 8);
  put32(b, 3);  // inconsistent d
  put32(b, 1);
  put32(b, 1);
  put32(b, 1);
  EXPECT_THROW(tq::parse_ivecs(b.data(), b.size(), "mem.ivecs"), tq::Error);
  b.resize(12);
  EXPECT_EQ(tq::parse_ivecs(b.data(), b.size(), "mem.ivecs").n, 1u);
  b.resize(11);
  EXPECT_THROW(tq::parse_ivecs(b.data(), b.size(), "mem.ivecs"), tq::Error);
  std::vector<uint8_t> bv = {3, 0, 0, 0, 1, 2, 3, 3, 0, 0, 0, 4, 5};
  EXPECT_THROW(tq::parse_bvecs(bv.data(), bv.size(), "mem.bvecs"), tq::Error);
  bv.push_back(6);
  EXPECT_EQ(tq::parse_bvecs(bv.data(), bv.size(), "mem.bvecs").n, 2u);
}

TEST(Vecs, MissingFileAndUnknownExtension) {
  TempDir t;
  EXPECT_THROW(tq::read_fvecs(t.path("nope.fvecs")), tq::Error);
  tq::atomic_write_file(t.path("x.txt"), "abc", 3);
  EXPECT_THROW(tq::read_vectors(t.path("x.txt")), tq::Error);
  tq::atomic_write_file(t.path("empty.fvecs"), "", 0);
  EXPECT_THROW(tq::read_fvecs(t.path("empty.fvecs")), tq::Error);
}

TEST(FileIo, AtomicWriteReplacesAndCleansUp) {
  TempDir t;
  const std::string p = t.path("f.bin");
  tq::atomic_write_file(p, "old contents", 12);
  EXPECT_EQ(slurp(p), "old contents");
  tq::atomic_write_file(p, "new", 3);
  EXPECT_EQ(slurp(p), "new");
  // A writer that throws leaves the old file and no temporary behind.
  EXPECT_THROW(tq::atomic_write_file(p, [](tq::FileWriter& w) {
                 w.write("partial", 7);
                 throw tq::Error("writer failed");
               }),
               tq::Error);
  EXPECT_EQ(slurp(p), "new");
  size_t files = 0;
  for (auto& e : fs::directory_iterator(t.dir)) (void)e, ++files;
  EXPECT_EQ(files, 1u);
  // Unwritable directory.
  EXPECT_THROW(tq::atomic_write_file(t.path("no/such/dir/f.bin"), "x", 1), tq::Error);
  EXPECT_THROW(tq::read_file_bytes(p, 2), tq::Error);  // over the size limit
}

TEST(FileIo, SimulatedCrashLeavesOldFile) {
  TempDir t;
  const std::string p = t.path("f.bin");
  tq::atomic_write_file(p, "old contents", 12);
  for (auto f : {tq::AtomicWriteFault::after_partial_write, tq::AtomicWriteFault::before_rename}) {
    tq::set_atomic_write_fault(f);
    EXPECT_THROW(tq::atomic_write_file(p, "brand new contents", 18), tq::Error);
    tq::set_atomic_write_fault(tq::AtomicWriteFault::none);
    EXPECT_EQ(slurp(p), "old contents");
  }
  // The crash left temporary files behind (as a real crash would), never at `path`.
  size_t tmp = 0;
  for (auto& e : fs::directory_iterator(t.dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) ++tmp;
  EXPECT_EQ(tmp, 2u);
}
