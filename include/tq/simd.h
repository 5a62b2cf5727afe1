// SIMD level selection. Kernels are chosen per batch call through Highway's dynamic
// dispatch (HWY_DYNAMIC_DISPATCH); the scalar reference (`*_ref`) is used instead when
// the level is "scalar". The initial level comes from the environment variable TQ_SIMD
// (scalar | sse4 | avx2 | avx3 | avx3_dl | auto); tests switch levels with set_level().
#pragma once

#include <string>
#include <vector>

namespace tq::simd {

// Names of the levels this host can run, best first, always ending in "scalar".
std::vector<std::string> available_levels();
// Restrict dispatch to `level` (one of available_levels(), or "auto"). Throws tq::Error.
void set_level(const std::string& level);
// Name of the level in use: e.g. "avx3_dl" or "scalar".
std::string current_level();
// True when the scalar reference kernels must be used.
bool use_scalar() noexcept;
// The Highway target HWY_DYNAMIC_DISPATCH calls now, lower case (e.g. "avx2"); at level
// "scalar" still the best one (the `_ref` kernels run instead of dispatching).
std::string dispatched_target();
// The kernel set OpenBLAS (which the float GEMMs of k-means, IVF, rotations and prefill call)
// picked when it was loaded, in its own words (e.g. "SkylakeX", "Haswell", "Prescott"): float
// summation order, hence results' last digits, and GEMM speed depend on it. It reads
// OPENBLAS_CORETYPE when loaded; `tq` and the Python package set that variable when OpenBLAS
// fell back to its SSE3 "Prescott" kernels on a CPU with AVX2 (docs/design.md).
const char* blas_core() noexcept;

// RAII: switch level for a scope (tests).
class ScopedLevel {
 public:
  explicit ScopedLevel(const std::string& level);
  ~ScopedLevel();
 private:
  std::string prev_;
};

}  // namespace tq::simd
