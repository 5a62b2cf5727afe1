// Shared helpers for the libFuzzer targets in fuzz/fuzz_*.cpp.
//
// Seed corpora: every target can write its own seeds with the project's writers. Run a
// target with TQ_FUZZ_WRITE_SEEDS=<dir> (scripts/run-fuzz.sh does this with -runs=0) and
// LLVMFuzzerInitialize writes the seed files into <dir> before fuzzing starts.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace tq_fuzz {

// The directory to write seeds into, or "" when seeds are not requested.
inline std::string seed_dir() {
  const char* d = std::getenv("TQ_FUZZ_WRITE_SEEDS");
  return d && *d ? std::string(d) : std::string();
}

inline void write_seed(const std::string& dir, const std::string& name, const void* data, size_t n) {
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::fprintf(stderr, "fuzz: cannot write seed %s\n", path.c_str());
    std::abort();
  }
  if (n) std::fwrite(data, 1, n, f);
  std::fclose(f);
}
inline void write_seed(const std::string& dir, const std::string& name, const std::vector<uint8_t>& b) {
  write_seed(dir, name, b.data(), b.size());
}

// A failed property: print it and abort, so libFuzzer records the input as a crash.
[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what);
  std::abort();
}
#define TQ_FUZZ_REQUIRE(cond)                          \
  do {                                                 \
    if (!(cond)) ::tq_fuzz::fail(#cond " (" __FILE__ ")"); \
  } while (0)

// Reads little pieces off the front of the input.
class Reader {
 public:
  Reader(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  uint8_t u8() { return pos_ < n_ ? d_[pos_++] : 0; }
  const uint8_t* rest() const { return d_ + pos_; }
  size_t rest_size() const { return n_ - pos_; }
 private:
  const uint8_t* d_;
  size_t n_;
  size_t pos_ = 0;
};

}  // namespace tq_fuzz
