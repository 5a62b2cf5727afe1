// Lloyd-Max codebooks for the post-rotation coordinate law (include/tq/codebook.h).
//
// Method: tabulate the cumulative mass F, first moment M1 and second moment M2 of the
// density on a fine uniform grid of a smooth variable v, then run Lloyd iterations
// (boundaries = midpoints, centroids = conditional means) reading cell integrals from the
// tables by linear interpolation. For the Beta law v = theta with t = sin(theta), where the
// weight cos(theta)^(d-2) is smooth for every d >= 2 (the t-density has endpoint
// singularities at d = 2); for the Gaussian law v = t. Both grids cover at most +-40 sigma,
// beyond which the mass underflows double precision.
#include "tq/codebook.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "tq/error.h"

namespace tq {

Law parse_law(const std::string& s) {
  if (s == "beta") return Law::beta;
  if (s == "gauss" || s == "gaussian") return Law::gauss;
  TQ_CHECK(false, "unknown coordinate law '%s' (valid: beta, gauss)", s.c_str());
  return Law::beta;
}

const char* law_name(Law law) noexcept { return law == Law::beta ? "beta" : "gauss"; }

namespace {

constexpr int kGrid = 1 << 17;

struct Tables {
  Law law;
  double v0, h;                 // grid start and step
  std::vector<double> F, M1, M2;  // cumulative integrals, normalized so F.back() == 1

  double v_of_t(double t) const {
    if (law == Law::beta) return std::asin(std::clamp(t, -1.0, 1.0));
    return t;
  }
  double t_of_v(double v) const { return law == Law::beta ? std::sin(v) : v; }

  // Interpolated cumulative values at t.
  void at(double t, double& f, double& m1, double& m2) const {
    double p = (v_of_t(t) - v0) / h;
    if (!(p > 0)) { f = m1 = m2 = 0; return; }
    if (p >= kGrid) { f = F[kGrid]; m1 = M1[kGrid]; m2 = M2[kGrid]; return; }
    int k = static_cast<int>(p);
    double a = p - k;
    f = F[k] + a * (F[k + 1] - F[k]);
    m1 = M1[k] + a * (M1[k + 1] - M1[k]);
    m2 = M2[k] + a * (M2[k + 1] - M2[k]);
  }

  double quantile(double q) const {  // t with F(t) = q
    auto it = std::lower_bound(F.begin(), F.end(), q);
    int k = static_cast<int>(it - F.begin());
    if (k <= 0) return t_of_v(v0);
    if (k > kGrid) return t_of_v(v0 + kGrid * h);
    double a = (q - F[k - 1]) / std::max(F[k] - F[k - 1], 1e-300);
    return t_of_v(v0 + (k - 1 + a) * h);
  }
};

Tables make_tables(int dim, Law law) {
  Tables T;
  T.law = law;
  const double sigma = 1.0 / std::sqrt(static_cast<double>(dim));
  double vmax;
  if (law == Law::beta) {
    vmax = (40 * sigma >= 1.0) ? M_PI / 2 : std::asin(40 * sigma);
  } else {
    vmax = 40 * sigma;
  }
  T.v0 = -vmax;
  T.h = 2 * vmax / kGrid;
  std::vector<double> w(kGrid + 1), t(kGrid + 1);
  for (int k = 0; k <= kGrid; ++k) {
    double v = T.v0 + k * T.h;
    if (law == Law::beta) {
      double c = std::cos(v);
      t[k] = std::sin(v);
      w[k] = (dim == 2) ? 1.0 : (c <= 0 ? 0.0 : std::exp((dim - 2) * std::log(c)));
    } else {
      t[k] = v;
      w[k] = std::exp(-0.5 * (v / sigma) * (v / sigma));
    }
  }
  T.F.assign(kGrid + 1, 0);
  T.M1.assign(kGrid + 1, 0);
  T.M2.assign(kGrid + 1, 0);
  for (int k = 1; k <= kGrid; ++k) {  // trapezoid rule
    double a = w[k - 1], b = w[k];
    T.F[k] = T.F[k - 1] + 0.5 * T.h * (a + b);
    T.M1[k] = T.M1[k - 1] + 0.5 * T.h * (a * t[k - 1] + b * t[k]);
    T.M2[k] = T.M2[k - 1] + 0.5 * T.h * (a * t[k - 1] * t[k - 1] + b * t[k] * t[k]);
  }
  const double Z = T.F[kGrid];
  for (int k = 0; k <= kGrid; ++k) {
    T.F[k] /= Z;
    T.M1[k] /= Z;
    T.M2[k] /= Z;
  }
  return T;
}

}  // namespace

Codebook compute_codebook(int dim, int bits, Law law) {
  TQ_CHECK(dim >= 2, "codebook dimension must be >= 2 (got %d)", dim);
  TQ_CHECK(dim <= (1 << 24), "codebook dimension %d is too large (max %d)", dim, 1 << 24);
  TQ_CHECK(bits >= 1 && bits <= 8, "codebook bits must be in 1..8 (got %d)", bits);
  const Tables T = make_tables(dim, law);
  const int K = 1 << bits;
  const double sigma = 1.0 / std::sqrt(static_cast<double>(dim));
  const double lo = T.t_of_v(T.v0), hi = T.t_of_v(T.v0 + kGrid * T.h);

  std::vector<double> c(K), b(K + 1);
  for (int j = 0; j < K; ++j) c[j] = T.quantile((j + 0.5) / K);
  int it = 0;
  const int max_iter = 100000;
  for (; it < max_iter; ++it) {
    b[0] = lo;
    b[K] = hi;
    for (int j = 1; j < K; ++j) b[j] = 0.5 * (c[j - 1] + c[j]);
    double f0, m10, m20, f1, m11, m21;
    T.at(b[0], f0, m10, m20);
    double change = 0;
    std::vector<double> nc(K);
    for (int j = 0; j < K; ++j) {
      T.at(b[j + 1], f1, m11, m21);
      double mass = f1 - f0;
      nc[j] = mass > 1e-300 ? (m11 - m10) / mass : c[j];
      f0 = f1; m10 = m11; m20 = m21;
    }
    for (int j = 0; j < K / 2; ++j) {  // the law is symmetric: keep the codebook symmetric
      double s = 0.5 * (nc[K - 1 - j] - nc[j]);
      nc[j] = -s;
      nc[K - 1 - j] = s;
    }
    for (int j = 0; j < K; ++j) change = std::max(change, std::fabs(nc[j] - c[j]));
    c = nc;
    if (change < 1e-13 * sigma) break;
  }

  Codebook cb;
  cb.dim = dim;
  cb.bits = bits;
  cb.law = law;
  cb.iterations = it + 1;
  cb.centroids.resize(K);
  cb.boundaries.resize(K - 1);
  for (int j = 0; j < K; ++j) cb.centroids[j] = static_cast<float>(c[j]);
  for (int j = 1; j < K; ++j) cb.boundaries[j - 1] = static_cast<float>(0.5 * (c[j - 1] + c[j]));
  // Distortion of the float codebook with its float boundaries.
  double mse = 0;
  double f0, m10, m20, f1, m11, m21;
  T.at(lo, f0, m10, m20);
  for (int j = 0; j < K; ++j) {
    double bj = (j + 1 < K) ? static_cast<double>(cb.boundaries[j]) : hi;
    T.at(bj, f1, m11, m21);
    double cj = cb.centroids[j];
    mse += (m21 - m20) - 2 * cj * (m11 - m10) + cj * cj * (f1 - f0);
    f0 = f1; m10 = m11; m20 = m21;
  }
  cb.mse_per_coord = mse;
  cb.mse_per_vector = mse * dim;
  return cb;
}

const Codebook& get_codebook(int dim, int bits, Law law) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int>, std::unique_ptr<Codebook>> cache;
  auto key = std::make_tuple(dim, bits, static_cast<int>(law));
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return *it->second;
  }
  auto cb = std::make_unique<Codebook>(compute_codebook(dim, bits, law));
  std::lock_guard<std::mutex> lock(mu);
  auto [it, inserted] = cache.emplace(key, std::move(cb));
  return *it->second;
}

}  // namespace tq
