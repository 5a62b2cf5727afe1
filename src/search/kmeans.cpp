// Coarse k-means of the IVF index: seeded initialisation, Lloyd iterations whose
// assignments are single-threaded BLAS GEMMs over fixed tiles of points, centroid sums
// accumulated in a fixed order (double), so the result is a function of (data, k,
// iterations, seed) alone, whatever the thread count. Empty clusters are re-seeded by
// splitting the largest one (as FAISS does).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <vector>

#include "search/index_internal.h"
#include "tq/common.h"
#include "tq/error.h"

extern "C" int openblas_get_num_threads(void);
extern "C" void openblas_set_num_threads(int num_threads);

namespace tq {

namespace {
std::mutex g_blas_mutex;
int g_blas_users = 0, g_blas_saved = 1;
}  // namespace

BlasSingleThread::BlasSingleThread() {
  std::lock_guard<std::mutex> lock(g_blas_mutex);
  if (g_blas_users++ == 0) {
    g_blas_saved = openblas_get_num_threads();
    openblas_set_num_threads(1);
  }
}

BlasSingleThread::~BlasSingleThread() {
  std::lock_guard<std::mutex> lock(g_blas_mutex);
  if (--g_blas_users == 0) openblas_set_num_threads(g_blas_saved);
}

namespace {

// Index of the largest v_j = 2 s_j - cn2_j over j < k (ties: lowest j; best = -inf and 0 when
// none exceeds -inf, NaN never wins), exactly as one sequential strict-greater scan, but with
// 16 independent running maxima (one per j mod 16, each keeping its first maximum) so that the
// compiler vectorizes it; the lanes are merged by value, then lowest index, and the tail
// j >= k - k % 16 (all above every lane's indices) continues the sequential scan.
uint32_t argmax_2s_minus_c(size_t k, const float* s, const float* cn2, float* best_out) {
  constexpr size_t W = 16;
  float bv[W];
  uint32_t bi[W];
  for (size_t t = 0; t < W; ++t) {
    bv[t] = -std::numeric_limits<float>::infinity();
    bi[t] = 0;
  }
  const size_t kw = k / W * W;
  for (size_t j = 0; j < kw; j += W)
    for (size_t t = 0; t < W; ++t) {
      const float v = 2.f * s[j + t] - cn2[j + t];
      const bool gt = v > bv[t];
      bv[t] = gt ? v : bv[t];
      bi[t] = gt ? static_cast<uint32_t>(j + t) : bi[t];
    }
  float best = -std::numeric_limits<float>::infinity();
  uint32_t arg = 0;
  bool found = false;
  for (size_t t = 0; t < W; ++t)
    if (bv[t] > best) best = bv[t];
  for (size_t t = 0; t < W; ++t)
    if (bv[t] == best && bv[t] > -std::numeric_limits<float>::infinity() && (!found || bi[t] < arg)) {
      arg = bi[t];
      found = true;
    }
  if (found)
    for (size_t t = 0; t < W; ++t)
      if (bi[t] == arg) best = bv[t];  // the first maximum's own value (+0 / -0 as the scan)
  for (size_t j = kw; j < k; ++j) {
    const float v = 2.f * s[j] - cn2[j];
    if (v > best) {
      best = v;
      arg = static_cast<uint32_t>(j);
    }
  }
  if (best_out) *best_out = best;
  return arg;
}

}  // namespace

bool nearest_centroids(size_t n, int dim, const float* x, int k, const float* c, const float* cn2,
                       uint32_t* out, float* best_out, const std::function<bool(size_t)>& on_rows) {
  if (n == 0) return true;
  const size_t d = static_cast<size_t>(dim), kk = static_cast<size_t>(k);
  // Tiles of rows at fixed offsets, each scored by single-threaded GEMMs (s = x c^T) against
  // column chunks of at most 512 centroids (the tile's scores stay in cache) and its argmax
  // carried across the chunks in column order, all by one OpenMP thread: no BLAS threads
  // beside OpenMP's (which would spin waiting while BLAS runs, on the same cores), and every
  // row's scores come from the same calls whatever the thread count, so the assignment does
  // not depend on it. A later chunk wins only with a strictly larger score, as in one scan.
  const size_t rows = 256, cols = std::min<size_t>(kk, 512);
  const size_t tiles = (n + rows - 1) / rows;
  const BlasSingleThread one_blas_thread;
  std::atomic<size_t> rows_done{0};
  std::atomic<bool> stop{false};
#pragma omp parallel
  {
    std::vector<float> s(rows * cols), best(rows);
#pragma omp for schedule(dynamic, 1)
    for (size_t t = 0; t < tiles; ++t) {
      // The team's thread 0 is the caller's thread.
      if (stop.load(std::memory_order_relaxed)) continue;
      if (on_rows && omp_get_thread_num() == 0 && !on_rows(rows_done.load(std::memory_order_relaxed))) {
        stop.store(true, std::memory_order_relaxed);
        continue;
      }
      const size_t r0 = t * rows, m = std::min(rows, n - r0);
      for (size_t j0 = 0; j0 < kk; j0 += cols) {
        const size_t nc = std::min(cols, kk - j0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(nc), dim, 1.0f,
                    x + r0 * d, dim, c + j0 * d, dim, 0.0f, s.data(), static_cast<int>(nc));
        for (size_t i = 0; i < m; ++i) {
          float b;
          const uint32_t a = argmax_2s_minus_c(nc, s.data() + i * nc, cn2 + j0, &b);
          if (j0 == 0 || b > best[i]) {
            best[i] = b;
            out[r0 + i] = static_cast<uint32_t>(j0) + a;
          }
        }
      }
      if (best_out)
        for (size_t i = 0; i < m; ++i) best_out[r0 + i] = best[i];
      rows_done.fetch_add(m, std::memory_order_relaxed);
    }
  }
  if (stop.load()) return false;
  return on_rows ? on_rows(n) : true;
}

std::vector<float> kmeans(size_t n, int dim, const float* x, int k, int iters, uint64_t seed,
                          const std::function<bool(size_t, size_t)>& on_rows) {
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
    const size_t before = static_cast<size_t>(it) * ns, total = static_cast<size_t>(iters) * ns;
    std::function<bool(size_t)> rows_of_it;
    if (on_rows) rows_of_it = [&](size_t r) { return on_rows(before + r, total); };
    if (!nearest_centroids(ns, dim, xs.data(), k, c.data(), cn2.data(), asg.data(), nullptr, rows_of_it)) return {};
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
