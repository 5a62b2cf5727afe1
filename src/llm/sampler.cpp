// Greedy and temperature / top-k / top-p sampling, plus log-softmax and argmax helpers.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "tq/common.h"
#include "tq/error.h"
#include "tq/model.h"

namespace tq {

// The result of `best = 0; for i: if (x[i] > x[best]) best = i` (the first index of the largest
// value, NaNs never chosen, 0 when x[0] is NaN), in two passes the compiler vectorizes: the
// maximum over 8 lanes (`x > m ? x : m` is maxps), then the first index holding it (-0 and +0
// compare equal, as in the loop). The loop compiles to one loop-carried maxss (and a cmov) per
// value: over Gemma 3's 262,144 logits ~1.2% of a 1-thread decode step in perf; this takes
// about half its CPU time (bench_qmatvec Argmax262144; tests/test_model.cpp,
// ArgmaxIsTheFirstLoopOnes, checks the bits against the loop).
int32_t argmax(const float* x, int n) noexcept {
  if (n <= 1 || std::isnan(x[0])) return 0;
  constexpr int L = 8;
  float lane[L];
  for (int j = 0; j < L; ++j) lane[j] = x[0];
  int i = 0;
  for (; i + L <= n; i += L)
    for (int j = 0; j < L; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  float m = x[0];
  for (int j = 0; j < L; ++j) m = lane[j] > m ? lane[j] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (int k = 0; k < n; ++k)
    if (x[k] == m) return k;
  return 0;  // not reached: m is one of the values
}

double log_softmax(const float* x, int n, float* out) noexcept {
  float mx = x[0];
  for (int i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(static_cast<double>(x[i] - mx));
  const double lse = mx + std::log(s);
  for (int i = 0; i < n; ++i) out[i] = static_cast<float>(x[i] - lse);
  return lse;
}

struct Sampler::State {
  Rng rng;
  std::vector<std::pair<float, int32_t>> cand;
  explicit State(uint64_t s) : rng(s) {}
};

Sampler::Sampler(const SamplerParams& p) : p_(p), st_(std::make_unique<State>(p.seed)) {
  TQ_CHECK(p.top_p > 0 && p.top_p <= 1, "top_p must be in (0, 1], got %g", p.top_p);
  TQ_CHECK(p.top_k >= 0, "top_k must be >= 0");
}
Sampler::~Sampler() = default;

int32_t Sampler::sample(const float* logits, int n) {
  if (p_.temperature <= 0) return argmax(logits, n);
  auto& c = st_->cand;
  c.resize(n);
  for (int i = 0; i < n; ++i) c[i] = {logits[i] / p_.temperature, i};
  std::sort(c.begin(), c.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  size_t keep = c.size();
  if (p_.top_k > 0) keep = std::min(keep, static_cast<size_t>(p_.top_k));
  const float mx = c[0].first;
  double z = 0;
  std::vector<double> pr(keep);
  for (size_t i = 0; i < keep; ++i) z += pr[i] = std::exp(static_cast<double>(c[i].first - mx));
  double cum = 0;
  size_t cut = keep;
  for (size_t i = 0; i < keep; ++i) {
    cum += pr[i] / z;
    if (cum >= p_.top_p) { cut = i + 1; break; }
  }
  double zz = 0;
  for (size_t i = 0; i < cut; ++i) zz += pr[i];
  double r = st_->rng.uniform() * zz;
  for (size_t i = 0; i < cut; ++i) {
    r -= pr[i];
    if (r <= 0) return c[i].second;
  }
  return c[cut - 1].second;
}

}  // namespace tq
