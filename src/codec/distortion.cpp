#include "tq/distortion.h"

#include <algorithm>
#include <string>
#include <cmath>
#include <vector>

#include "tq/common.h"
#include "tq/error.h"

namespace tq {

void random_unit_vectors(size_t n, int d, uint64_t seed, float* out) {
  Rng rng(seed ^ 0x554e49545645434bull);
  for (size_t i = 0; i < n; ++i) {
    float* u = out + i * d;
    double s = 0;
    do {
      s = 0;
      for (int j = 0; j < d; ++j) {
        u[j] = static_cast<float>(rng.normal());
        s += static_cast<double>(u[j]) * u[j];
      }
    } while (s < 1e-20);
    const double inv = 1.0 / std::sqrt(s);
    for (int j = 0; j < d; ++j) u[j] = static_cast<float>(u[j] * inv);
  }
}

void random_outlier_vectors(size_t n, int d, uint64_t seed, float* out) {
  std::vector<float> scale(d, 1.0f);
  Rng pick(seed ^ 0x4f55544c49455253ull);
  for (int k = 0; k < std::max(1, d / 16); ++k) scale[pick.below(static_cast<uint32_t>(d))] = 10.0f;
  Rng rng(seed ^ 0x4f55544c56454353ull);
  for (size_t i = 0; i < n; ++i) {
    float* u = out + i * d;
    double s = 0;
    for (int j = 0; j < d; ++j) {
      u[j] = static_cast<float>(rng.normal()) * scale[j];
      s += static_cast<double>(u[j]) * u[j];
    }
    const double inv = s > 0 ? 1.0 / std::sqrt(s) : 0.0;
    for (int j = 0; j < d; ++j) u[j] = static_cast<float>(u[j] * inv);
  }
}

DistortionResult measure_distortion(const Quantizer& q, size_t n, uint64_t seed, const char* data) {
  TQ_CHECK(n >= 1, "need at least one vector");
  const std::string kind = data ? data : "unit";
  TQ_CHECK(kind == "unit" || kind == "outlier", "unknown data kind '%s' (valid: unit, outlier)", kind.c_str());
  const int d = q.dim();
  const size_t batch = 4096;
  std::vector<float> u(batch * d), uh(batch * d), qv(d), state(q.query_state_floats());
  std::vector<uint8_t> codes(batch * q.code_bytes());
  Rng qrng(seed ^ 0x5155455259ull);
  double se = 0, sb = 0, sb2 = 0, set = 0, stt = 0;
  for (size_t i0 = 0; i0 < n; i0 += batch) {
    const size_t m = std::min(batch, n - i0);
    if (kind == "unit") random_unit_vectors(m, d, seed + i0 * 0x9e3779b97f4a7c15ull, u.data());
    else random_outlier_vectors(m, d, seed + i0 * 0x9e3779b97f4a7c15ull, u.data());
    q.encode(m, u.data(), codes.data());
    q.decode(m, codes.data(), uh.data());
    for (size_t r = 0; r < m; ++r) {
      const float* ur = u.data() + r * d;
      const float* hr = uh.data() + r * d;
      double e = 0;
      for (int j = 0; j < d; ++j) e += (static_cast<double>(ur[j]) - hr[j]) * (static_cast<double>(ur[j]) - hr[j]);
      se += e;
      // query at cosine 0.5: 0.5 u + sqrt(0.75) w, w unit and orthogonal to u
      double dot = 0, wn = 0;
      for (int j = 0; j < d; ++j) { qv[j] = static_cast<float>(qrng.normal()); dot += qv[j] * ur[j]; }
      for (int j = 0; j < d; ++j) { qv[j] = static_cast<float>(qv[j] - dot * ur[j]); wn += static_cast<double>(qv[j]) * qv[j]; }
      const double k = wn > 0 ? std::sqrt(0.75 / wn) : 0;
      double truth = 0;
      for (int j = 0; j < d; ++j) {
        qv[j] = static_cast<float>(0.5 * ur[j] + k * qv[j]);
        truth += static_cast<double>(qv[j]) * ur[j];
      }
      q.prepare_query(qv.data(), state.data());
      float est;
      q.score(state.data(), 1, codes.data() + r * q.code_bytes(), &est);
      const double err = est - truth;
      sb += err;
      sb2 += err * err;
      set += est * truth;
      stt += truth * truth;
    }
  }
  DistortionResult res;
  res.mse = se / n;
  res.ip_bias = sb / n;
  res.ip_rmse = std::sqrt(sb2 / n);
  res.ip_slope = stt > 0 ? set / stt : 0;
  return res;
}

}  // namespace tq
