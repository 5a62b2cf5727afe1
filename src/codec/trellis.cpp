// Trellis-coded quantization with a bit-shift trellis (include/tq/trellis.h).
#include "tq/trellis.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "tq/common.h"
#include "tq/error.h"

namespace tq {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Scratch of the encoder (one per thread; sized on first use).
struct Work {
  std::vector<float> cost, next, cw, rolled;
  std::vector<uint8_t> back;
};

// One Viterbi pass, the reference (and the scalar level's): plain loops, any (bits, state
// bits). start < 0: every initial state free; else only `start`. end < 0: the best final
// state; else `end`. Writes the codes, returns the final state.
int viterbi_any(const TrellisCode& tc, const float* u, int start, int end, uint8_t* codes, Work& wk) {
  const int D = tc.dim, k = tc.bits, s = tc.state_bits;
  const int S = 1 << s, K = 1 << k;
  wk.cost.assign(S, start < 0 ? 0.f : kInf);
  if (start >= 0) wk.cost[start] = 0.f;
  wk.next.resize(S);
  wk.cw.resize((size_t)S * K);
  wk.back.resize((size_t)D * S);
  const float* __restrict lut = tc.lut.data();
  float* __restrict cost = wk.cost.data();
  float* __restrict next = wk.next.data();
  float* __restrict cw = wk.cw.data();
  for (int i = 0; i < D; ++i) {
    const float x = std::isnan(u[i]) ? 0.f : u[i];
    uint8_t* __restrict bk = wk.back.data() + (size_t)i * S;
    // Window w = (h << s) | n: new state n = the low s bits, h = the top k bits; the old state
    // is w >> k. Every new state has K predecessors (h = 0 .. K-1).
    for (int o = 0; o < S; ++o)
      for (int c = 0; c < K; ++c) {
        const float e = x - lut[o * K + c];
        cw[o * K + c] = cost[o] + e * e;
      }
    for (int n = 0; n < S; ++n) {
      next[n] = cw[n];
      bk[n] = 0;
    }
    for (int h = 1; h < K; ++h) {
      const float* __restrict ch = cw + h * S;
      for (int n = 0; n < S; ++n) {
        const bool lt = ch[n] < next[n];
        next[n] = lt ? ch[n] : next[n];
        bk[n] = lt ? (uint8_t)h : bk[n];
      }
    }
    std::swap(cost, next);
  }
  int st = end;
  if (st < 0) st = (int)(std::min_element(cost, cost + S) - cost);
  const int fin = st;
  for (int i = D - 1; i >= 0; --i) {
    const int w = (wk.back[(size_t)i * S + st] << s) | st;
    codes[i] = (uint8_t)(w & (K - 1));
    st = w >> k;
  }
  return fin;
}

// The SIMD pass (trellis_simd.cpp); -1 at the scalar level or when the vector length does not
// divide the state count.
int viterbi_fast(const TrellisCode& tc, const float* u, int start, int end, uint8_t* codes, Work& wk) {
  const size_t S = (size_t)1 << tc.state_bits;
  wk.cost.resize(S + 64);
  wk.next.resize(S + 64);
  wk.back.resize((size_t)tc.dim * S);
  const int r = detail::viterbi_pass_simd(tc, tc.dim, u, start, end, codes, wk.cost.data(), wk.next.data(),
                                          wk.back.data());
  return r >= 0 ? r : viterbi_any(tc, u, start, end, codes, wk);
}

void encode_with(const TrellisCode& tc, const float* u, uint8_t* codes, Work& wk, bool ref = false) {
  const auto viterbi = [ref](const TrellisCode& t, const float* x, int start, int end, uint8_t* c, Work& w) {
    return ref ? viterbi_any(t, x, start, end, c, w) : viterbi_fast(t, x, start, end, c, w);
  };
  const int D = tc.dim, s = tc.state_bits;
  if (s == 0) {  // no state: the nearest table entry
    viterbi(tc, u, 0, 0, codes, wk);
    return;
  }
  // Tail-biting: the state before code 0 is the last S bits of the stream, as the decoder
  // reads it. A free pass over the vector rolled by D/2 puts that boundary in the middle of the
  // path, where the best path's state is decided by both sides; the second pass starts and
  // ends in it.
  wk.rolled.resize(D);
  const int need = (s + tc.bits - 1) / tc.bits;  // codes that hold a state
  const int h = std::min(D / 2, D - need);        // >= 1: dim * bits >= S + bits
  for (int i = 0; i < D; ++i) wk.rolled[i] = u[(i + h) % D];
  viterbi(tc, wk.rolled.data(), -1, -1, codes, wk);
  // rolled index D - h - 1 is u[D - 1]: the state after it is the boundary state.
  unsigned st = 0;
  for (int sh = 0, j = D - h - 1; sh < s; sh += tc.bits, --j) st |= (unsigned)codes[j] << sh;
  st &= (1u << s) - 1;
  viterbi(tc, u, (int)st, (int)st, codes, wk);
}

void check_params(int dim, int bits, int state_bits) {
  TQ_CHECK(bits >= 1 && bits <= 8, "trellis code: bits must be 1..8, got %d", bits);
  TQ_CHECK(state_bits >= 0 && bits + state_bits <= 8,
           "trellis code: bits + state bits must be at most 8, got %d + %d", bits, state_bits);
  TQ_CHECK(dim >= 2 && dim * bits >= bits + state_bits,
           "trellis code: dimension %d too small for a %d-bit window", dim, bits + state_bits);
}

// Unit vectors of `dim` coordinates (a random point on the sphere: normalized Gaussians).
std::vector<float> sample_sphere(int dim, int n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x((size_t)n * dim);
  for (int v = 0; v < n; ++v) {
    double e = 0;
    float* r = x.data() + (size_t)v * dim;
    for (int i = 0; i < dim; ++i) {
      r[i] = (float)rng.normal();
      e += (double)r[i] * r[i];
    }
    const float inv = (float)(1.0 / std::sqrt(e));
    for (int i = 0; i < dim; ++i) r[i] *= inv;
  }
  return x;
}

double mse_of(const TrellisCode& tc, const std::vector<float>& x) {
  const int n = (int)(x.size() / tc.dim);
  std::vector<uint8_t> codes(tc.dim);
  std::vector<float> out(tc.dim);
  Work wk;
  double e = 0;
  for (int v = 0; v < n; ++v) {
    const float* r = x.data() + (size_t)v * tc.dim;
    encode_with(tc, r, codes.data(), wk);
    trellis_decode(tc, codes.data(), out.data());
    for (int i = 0; i < tc.dim; ++i) e += (double)(r[i] - out[i]) * (r[i] - out[i]);
  }
  return e / ((double)n * tc.dim);
}

}  // namespace

TrellisCode train_trellis(int dim, int bits, int state_bits, uint64_t seed, int n_train, int iters) {
  check_params(dim, bits, state_bits);
  TQ_CHECK(n_train >= 1 && iters >= 0, "trellis code: need training vectors");
  const std::vector<float> x = sample_sphere(dim, n_train, seed);
  std::vector<uint8_t> codes(dim);
  Work wk;
  TrellisCode tc;
  tc.dim = dim;
  tc.bits = bits;
  tc.state_bits = state_bits;
  const int W = 1 << (bits + state_bits);
  // Start: W draws of the coordinate law in random order (the Viterbi search, not the order,
  // decides which windows they serve). This finds better codes at 1-4 bits than growing the
  // table one state bit at a time from the Lloyd-Max code (0.72 against 0.80 of its MSE at
  // D = 64, 2 bits), which is why the cached codes stop at 4 bits (see get_trellis).
  {
    Rng rng(seed ^ 0x7472656c6c6973ull);
    tc.lut.resize(W);
    const double sd = 1.0 / std::sqrt((double)dim);
    for (auto& v : tc.lut) v = (float)(sd * rng.normal());
  }
  std::vector<double> sum(W);
  std::vector<long> cnt(W);
  for (int it = 0; it < iters; ++it) {
    std::fill(sum.begin(), sum.end(), 0.0);
    std::fill(cnt.begin(), cnt.end(), 0L);
    for (int v = 0; v < n_train; ++v) {
      const float* r = x.data() + (size_t)v * dim;
      encode_with(tc, r, codes.data(), wk);
      for (int i = 0; i < dim; ++i) {
        const unsigned w = tc.window(codes.data(), i);
        sum[w] += r[i];
        ++cnt[w];
      }
    }
    for (int w = 0; w < W; ++w)
      if (cnt[w] > 0) tc.lut[w] = (float)(sum[w] / (double)cnt[w]);
  }
  tc.mse_per_coord = mse_of(tc, sample_sphere(dim, std::max(64, n_train / 4), seed + 1));
  return tc;
}

const TrellisCode& get_trellis(int dim, int bits) {
  TQ_CHECK(bits >= 1 && bits <= 4, "trellis code: bits must be 1..4, got %d", bits);
  const int state_bits = 8 - bits;
  check_params(dim, bits, state_bits);
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::unique_ptr<TrellisCode>> cache;
  const auto key = std::make_pair(dim, bits);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return *it->second;
  }
  // ~2^16 training coordinates whatever the dimension; training outside the lock (another
  // thread may train the same code: the result is identical, the first one stays).
  const int n_train = std::max(256, (1 << 16) / dim);
  auto tc = std::make_unique<TrellisCode>(train_trellis(dim, bits, state_bits, 0x54510000u + (uint64_t)dim * 16 + bits,
                                                        n_train, 16));
  std::lock_guard<std::mutex> lock(mu);
  auto [it, inserted] = cache.emplace(key, std::move(tc));
  return *it->second;
}

void trellis_encode(const TrellisCode& tc, const float* u, uint8_t* codes) {
  thread_local Work wk;
  encode_with(tc, u, codes, wk);
}

void trellis_encode_ref(const TrellisCode& tc, const float* u, uint8_t* codes) {
  Work wk;
  encode_with(tc, u, codes, wk, true);
}

void trellis_decode(const TrellisCode& tc, const uint8_t* codes, float* out) noexcept {
  for (int i = 0; i < tc.dim; ++i) out[i] = tc.lut[tc.window(codes, i)];
}

}  // namespace tq
