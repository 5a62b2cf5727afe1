// Fuzz target: the vector file readers (include/tq/vecs.h): .fvecs, .ivecs, .bvecs, .npy.
//
// Input: byte 0 picks the format (low 2 bits) and the max_rows limit (bits 2..7: 0 means
// no limit, else that many rows); the rest is the file. A malformed file must be a
// tq::Error. When it parses: rows == min(records, max_rows), data.size() == n * d,
// 1 <= d <= kMaxVecsDim, float data finite, and the values match the bytes of the file.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "tq/common.h"
#include "tq/error.h"
#include "tq/fileio.h"
#include "tq/vecs.h"

namespace {

const char* kExt[] = {"fvecs", "ivecs", "bvecs", "npy"};

template <class M>
void check_shape(const M& m) {
  TQ_FUZZ_REQUIRE(m.data.size() == m.n * m.d);
  TQ_FUZZ_REQUIRE(m.n == 0 || (m.d >= 1 && m.d <= tq::kMaxVecsDim));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string dir = tq_fuzz::seed_dir();
  if (dir.empty()) return 0;
  // Seeds: files written by the project's writers, then prefixed with the selector byte.
  tq::Rng rng(3);
  int k = 0;
  for (size_t n : {1u, 3u})
    for (size_t d : {1u, 4u, 17u}) {
      std::vector<float> f(n * d);
      std::vector<int32_t> iv(n * d);
      std::vector<uint8_t> bv(n * d);
      for (size_t i = 0; i < n * d; ++i) {
        f[i] = static_cast<float>(rng.normal());
        iv[i] = static_cast<int32_t>(rng.below(1000000));
        bv[i] = static_cast<uint8_t>(rng.below(256));
      }
      for (int fmt = 0; fmt < 4; ++fmt) {
        const std::string tmp = dir + "/.tmp_seed." + kExt[fmt];
        if (fmt == 0) tq::write_fvecs(tmp, n, d, f.data());
        if (fmt == 1) tq::write_ivecs(tmp, n, d, iv.data());
        if (fmt == 2) tq::write_bvecs(tmp, n, d, bv.data());
        if (fmt == 3) tq::write_npy(tmp, n, d, f.data());
        std::vector<uint8_t> b = tq::read_file_bytes(tmp);
        std::remove(tmp.c_str());
        for (uint8_t limit : {0, 2}) {
          b.insert(b.begin(), static_cast<uint8_t>(fmt | (limit << 2)));
          tq_fuzz::write_seed(dir, std::string(kExt[fmt]) + "_" + std::to_string(k++), b);
          b.erase(b.begin());
        }
      }
    }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int fmt = data[0] & 3;
  const size_t limit = data[0] >> 2;
  const size_t max_rows = limit == 0 ? SIZE_MAX : limit;
  const std::vector<uint8_t> file(data + 1, data + size);  // exact-size heap copy
  const std::string name = std::string("fuzz.") + kExt[fmt];
  try {
    if (fmt == 0 || fmt == 3) {
      const tq::FloatMatrix m = fmt == 0 ? tq::parse_fvecs(file.data(), file.size(), name, max_rows)
                                         : tq::parse_npy(file.data(), file.size(), name, max_rows);
      check_shape(m);
      TQ_FUZZ_REQUIRE(m.n <= max_rows);
      TQ_FUZZ_REQUIRE(tq::all_finite(m.data.size(), m.data.data()));
      if (fmt == 0) {
        TQ_FUZZ_REQUIRE(m.n == std::min(max_rows, file.size() / (4 + 4 * m.d)));
        for (size_t i = 0; i < m.n; ++i)
          TQ_FUZZ_REQUIRE(std::memcmp(m.row(i), file.data() + i * (4 + 4 * m.d) + 4, 4 * m.d) == 0);
      }
    } else if (fmt == 1) {
      const tq::IntMatrix m = tq::parse_ivecs(file.data(), file.size(), name, max_rows);
      check_shape(m);
      TQ_FUZZ_REQUIRE(m.n == std::min(max_rows, file.size() / (4 + 4 * m.d)));
      for (size_t i = 0; i < m.n; ++i)
        TQ_FUZZ_REQUIRE(std::memcmp(m.row(i), file.data() + i * (4 + 4 * m.d) + 4, 4 * m.d) == 0);
    } else {
      const tq::FloatMatrix m = tq::parse_bvecs(file.data(), file.size(), name, max_rows);
      check_shape(m);
      TQ_FUZZ_REQUIRE(m.n == std::min(max_rows, file.size() / (4 + m.d)));
      for (size_t i = 0; i < m.n; ++i)
        for (size_t j = 0; j < m.d; ++j)
          TQ_FUZZ_REQUIRE(m.row(i)[j] == static_cast<float>(file[i * (4 + m.d) + 4 + j]));
    }
  } catch (const tq::Error&) {
  }
  return 0;
}
