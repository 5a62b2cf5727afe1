#include "tq/common.h"

#include <chrono>
#include <cstdlib>
#include <ctime>

#include "tq/error.h"

namespace tq {

double wall_seconds() noexcept {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double cpu_seconds() noexcept {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

uint16_t fp32_to_fp16(float f) noexcept {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // Inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0));
  }
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: Inf
  if (ax < 0x38800000u) {  // subnormal half (or zero): value = m * 2^-24
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to 0
    const uint32_t e = ax >> 23;
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14 + (113 - e) ... bits to drop: (125 - e) + 1
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  // normal: rebias exponent, round mantissa 23 -> 10 bits to nearest even
  uint32_t h = ((ax >> 13) - (112u << 10));
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

void fp32_to_fp16_n(size_t n, const float* x, uint16_t* h) noexcept {
  for (size_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(x[i]);
}
void fp16_to_fp32_n(size_t n, const uint16_t* h, float* x) noexcept {
  for (size_t i = 0; i < n; ++i) x[i] = fp16_to_fp32(h[i]);
}

static uint64_t splitmix64(uint64_t& s) noexcept {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static inline uint64_t rotl(uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }

Rng::Rng(uint64_t seed) noexcept {
  uint64_t s = seed;
  for (auto& w : s_) w = splitmix64(s);
}
uint64_t Rng::next_u64() noexcept {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}
double Rng::uniform() noexcept { return (next_u64() >> 11) * 0x1.0p-53; }
double Rng::normal() noexcept {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1;
  do { u1 = uniform(); } while (u1 <= 0.0);
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double a = 6.283185307179586476925 * u2;
  spare_ = r * std::sin(a);
  has_spare_ = true;
  return r * std::cos(a);
}
uint32_t Rng::below(uint32_t n) noexcept {
  return static_cast<uint32_t>((static_cast<unsigned __int128>(next_u64() >> 32) * n) >> 32);
}

void AlignedFree::operator()(void* p) const noexcept { std::free(p); }
void* aligned_alloc_bytes(size_t bytes) {
  size_t rounded = checked_add(bytes, 63, "aligned allocation size") & ~static_cast<size_t>(63);
  if (rounded == 0) rounded = 64;
  void* p = std::aligned_alloc(64, rounded);
  TQ_CHECK(p != nullptr, "out of memory allocating %zu bytes", bytes);
  return p;
}

bool all_finite(size_t n, const float* x) noexcept {
  uint32_t bad = 0;  // branch-free so that it vectorizes
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, &x[i], 4);
    bad |= static_cast<uint32_t>((b & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

}  // namespace tq
