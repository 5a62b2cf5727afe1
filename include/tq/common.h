// Small shared pieces: fp16 conversion, a portable seeded RNG, aligned buffers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace tq {

// IEEE 754 binary16 <-> binary32, round-to-nearest-even, exact for every fp16 value.
// Inf and NaN are preserved; values above the fp16 range become +-Inf.
uint16_t fp32_to_fp16(float f) noexcept;
// Inline and branch-free (the decode kernels convert block scales with it): normal values and
// Inf by rebiasing the exponent with one multiply, subnormals by a magic-number subtraction;
// Inf/NaN keep their exact bits (the multiply would quiet a signalling NaN).
inline float fp16_to_fp32(uint16_t h) noexcept {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const uint32_t nb = (two_w >> 4) + (0xE0u << 23);
  const uint32_t db = (two_w >> 17) | (126u << 23);
  float normalized, denormalized;
  std::memcpy(&normalized, &nb, 4);
  std::memcpy(&denormalized, &db, 4);
  normalized *= 0x1.0p-112f;
  denormalized -= 0.5f;
  uint32_t nbits, dbits;
  std::memcpy(&nbits, &normalized, 4);
  std::memcpy(&dbits, &denormalized, 4);
  uint32_t r = sign | (two_w < (1u << 27) ? dbits : nbits);
  if ((h & 0x7c00u) == 0x7c00u) r = sign | 0x7f800000u | (static_cast<uint32_t>(h & 0x3ffu) << 13);
  float f;
  std::memcpy(&f, &r, 4);
  return f;
}

void fp32_to_fp16_n(size_t n, const float* x, uint16_t* h) noexcept;
void fp16_to_fp32_n(size_t n, const uint16_t* h, float* x) noexcept;

// Deterministic across compilers and platforms (std::normal_distribution is not):
// splitmix64 seeding, xoshiro256** stream, Box-Muller normals.
class Rng {
 public:
  explicit Rng(uint64_t seed) noexcept;
  uint64_t next_u64() noexcept;
  double uniform() noexcept;        // [0, 1), 53 bits
  double normal() noexcept;         // N(0, 1)
  uint32_t below(uint32_t n) noexcept;  // uniform integer in [0, n)
 private:
  uint64_t s_[4];
  double spare_ = 0;
  bool has_spare_ = false;
};

// 64-byte aligned float / byte storage for SIMD kernels.
struct AlignedFree {
  void operator()(void* p) const noexcept;
};
// Seconds on the monotonic clock (for intervals), and the CPU seconds of this process (all
// threads).
double wall_seconds() noexcept;
double cpu_seconds() noexcept;
void* aligned_alloc_bytes(size_t bytes);  // throws tq::Error on failure; 64-byte aligned
template <class T>
using AlignedPtr = std::unique_ptr<T[], AlignedFree>;
template <class T>
AlignedPtr<T> make_aligned(size_t n) {
  return AlignedPtr<T>(static_cast<T*>(aligned_alloc_bytes(n * sizeof(T) + 64)));
}

// True when every value is finite.
bool all_finite(size_t n, const float* x) noexcept;

}  // namespace tq
