// Coarse k-means of the IVF index: seeded initialisation, Lloyd iterations whose
// assignments are one BLAS GEMM per batch of points, centroid sums accumulated in a fixed
// order (double), so the result is a function of (data, k, iterations, seed, thread count)
// alone. Empty clusters are re-seeded by splitting the largest one (as FAISS does).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "search/index_internal.h"
#include "tq/common.h"
#include "tq/error.h"

namespace tq {

void nearest_centroids(size_t n, int dim, const float* x, int k, const float* c, const float* cn2,
                       uint32_t* out, float* best_out) {
  if (n == 0) return;
  const size_t d = static_cast<size_t>(dim), kk = static_cast<size_t>(k);
  // Blocks of rows so the score matrix stays in cache-sized pieces: rows * k floats.
  const size_t rows = std::max<size_t>(64, std::min<size_t>(4096, (size_t{1} << 22) / kk));
  std::vector<float> s(rows * kk);
  for (size_t r0 = 0; r0 < n; r0 += rows) {
    const size_t m = std::min(rows, n - r0);
    // s = x c^T  (m x k)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), k, dim, 1.0f,
                x + r0 * d, dim, c, dim, 0.0f, s.data(), k);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < m; ++i) {
      const float* si = s.data() + i * kk;
      // nearest in l2: max 2 <x, c> - ||c||^2 (ties: lowest index)
      float best = -std::numeric_limits<float>::infinity();
      uint32_t arg = 0;
      for (size_t j = 0; j < kk; ++j) {
        const float v = 2.f * si[j] - cn2[j];
        if (v > best) {
          best = v;
          arg = static_cast<uint32_t>(j);
        }
      }
      out[r0 + i] = arg;
      if (best_out) best_out[r0 + i] = best;
    }
  }
}

std::vector<float> kmeans(size_t n, int dim, const float* x, int k, int iters, uint64_t seed) {
  TQ_CHECK(k >= 1, "kmeans: k = %d", k);
  TQ_CHECK(n >= static_cast<size_t>(k), "IVF: %d lists need at least %d vectors in the first add (got %zu)",
           k, k, n);
  const size_t d = static_cast<size_t>(dim), kk = static_cast<size_t>(k);
  Rng rng(seed ^ 0x6b6d65616e73ull);  // "kmeans"
  // Training sample: at most 256 points per centroid (partial Fisher-Yates, seeded).
  const size_t ns = std::min(n, kk * 256);
  std::vector<uint32_t> perm(n);
  for (size_t i = 0; i < n; ++i) perm[i] = static_cast<uint32_t>(i);
  for (size_t i = 0; i < ns; ++i) {
    const size_t j = i + static_cast<size_t>(rng.next_u64() % (n - i));
    std::swap(perm[i], perm[j]);
  }
  std::sort(perm.begin(), perm.begin() + static_cast<std::ptrdiff_t>(ns));  // sample in data order
  std::vector<float> xs(ns * d);
  for (size_t i = 0; i < ns; ++i) std::memcpy(xs.data() + i * d, x + perm[i] * d, d * sizeof(float));
  // Initialisation: k distinct sample points chosen by the seed.
  std::vector<uint32_t> pick(ns);
  for (size_t i = 0; i < ns; ++i) pick[i] = static_cast<uint32_t>(i);
  for (size_t i = 0; i < kk; ++i) {
    const size_t j = i + static_cast<size_t>(rng.next_u64() % (ns - i));
    std::swap(pick[i], pick[j]);
  }
  std::vector<float> c(kk * d), cn2(kk);
  for (size_t j = 0; j < kk; ++j) std::memcpy(c.data() + j * d, xs.data() + pick[j] * d, d * sizeof(float));
  std::vector<uint32_t> asg(ns);
  std::vector<double> sum(kk * d);
  std::vector<size_t> cnt(kk);
  for (int it = 0; it < iters; ++it) {
    for (size_t j = 0; j < kk; ++j) {
      double s = 0;
      for (size_t t = 0; t < d; ++t) s += static_cast<double>(c[j * d + t]) * c[j * d + t];
      cn2[j] = static_cast<float>(s);
    }
    nearest_centroids(ns, dim, xs.data(), k, c.data(), cn2.data(), asg.data(), nullptr);
    std::fill(sum.begin(), sum.end(), 0.0);
    std::fill(cnt.begin(), cnt.end(), size_t{0});
    for (size_t i = 0; i < ns; ++i) {
      const size_t a = asg[i];
      ++cnt[a];
      double* sa = sum.data() + a * d;
      const float* xi = xs.data() + i * d;
      for (size_t t = 0; t < d; ++t) sa[t] += xi[t];
    }
    for (size_t j = 0; j < kk; ++j)
      if (cnt[j] > 0)
        for (size_t t = 0; t < d; ++t) c[j * d + t] = static_cast<float>(sum[j * d + t] / static_cast<double>(cnt[j]));
    // Empty clusters: take the largest cluster's centroid, nudge the two copies apart.
    for (size_t j = 0; j < kk; ++j) {
      if (cnt[j] > 0) continue;
      const size_t big = static_cast<size_t>(std::max_element(cnt.begin(), cnt.end()) - cnt.begin());
      if (cnt[big] < 2) break;
      for (size_t t = 0; t < d; ++t) {
        const float v = c[big * d + t];
        const float e = (t % 2 ? 1.f : -1.f) * 1e-3f * (std::fabs(v) + 1e-6f);
        c[j * d + t] = v + e;
        c[big * d + t] = v - e;
      }
      cnt[j] = cnt[big] / 2;
      cnt[big] -= cnt[j];
    }
  }
  return c;
}

}  // namespace tq
