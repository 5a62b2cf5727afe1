// Measuring a quantizer on random data (the `tq distortion` command and the tests).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tq/quantizer.h"

namespace tq {

struct DistortionResult {
  double mse = 0;       // mean ||u - u_hat||^2 over unit vectors u
  double ip_bias = 0;   // mean(estimate - truth) of <q, u>, q at cosine 0.5 to u
  double ip_rmse = 0;   // sqrt(mean((estimate - truth)^2))
  double ip_slope = 0;  // sum(est * truth) / sum(truth^2): 1 = unbiased scale, < 1 = shrink
};

// n uniformly random unit vectors (seeded), each with its own unit query q = 0.5 u +
// sqrt(0.75) w (w a random unit vector orthogonal to u), so that a multiplicative shrink of
// inner products shows as a negative ip_bias. Estimates come from prepare_query + score.
// data == "unit": isotropic (uniform on the sphere; every rotation gives the same law).
// data == "outlier": anisotropic like transformer keys: N(0, 1) with 1/16 of the channels
// (at least one, fixed per seed) scaled by 10, then normalized to unit length.
DistortionResult measure_distortion(const Quantizer& q, size_t n, uint64_t seed, const char* data = "unit");

// n random unit vectors of dimension d, row-major (seeded, deterministic).
void random_unit_vectors(size_t n, int d, uint64_t seed, float* out);
void random_outlier_vectors(size_t n, int d, uint64_t seed, float* out);

}  // namespace tq
