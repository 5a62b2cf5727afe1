// Lloyd-Max scalar codebooks for the coordinates of a uniformly random point on S^{d-1}
// after a random rotation.
//
// Law::beta : the exact density f(t) ~ (1 - t^2)^((d-3)/2) on [-1, 1] (any d >= 2).
// Law::gauss: its large-d limit N(0, 1/d).
// Codebooks are computed by numerical integration (see docs/design.md) to convergence,
// are deterministic, and are cached per (d, bits, law) for the life of the process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tq {

enum class Law : uint8_t { beta = 0, gauss = 1 };
Law parse_law(const std::string& s);  // "beta" | "gauss"; throws tq::Error
const char* law_name(Law law) noexcept;

struct Codebook {
  int dim = 0;
  int bits = 0;
  Law law = Law::beta;
  std::vector<float> centroids;   // 2^bits values, ascending, in units of t (not t*sqrt(d))
  std::vector<float> boundaries;  // 2^bits - 1 decision thresholds (midpoints), ascending
  double mse_per_coord = 0;       // E[(t - c(t))^2] for one coordinate
  double mse_per_vector = 0;      // dim * mse_per_coord = E||u - u_hat||^2 for unit u
  int iterations = 0;             // Lloyd iterations used

  int levels() const noexcept { return 1 << bits; }
  // Index of the nearest centroid (ties go up). NaN maps to 0.
  uint8_t quantize(float t) const noexcept {
    int lo = 0, hi = static_cast<int>(boundaries.size());
    while (lo < hi) {  // first boundary > t
      int mid = (lo + hi) >> 1;
      if (boundaries[mid] <= t) lo = mid + 1; else hi = mid;
    }
    return static_cast<uint8_t>(lo);
  }
};

// The cached codebook for (dim, bits, law). dim >= 2, 1 <= bits <= 8; else tq::Error.
// Thread-safe; the reference stays valid for the life of the process.
const Codebook& get_codebook(int dim, int bits, Law law = Law::beta);

// Compute without the cache (tests, the `tq codebook` command).
Codebook compute_codebook(int dim, int bits, Law law = Law::beta);

}  // namespace tq
