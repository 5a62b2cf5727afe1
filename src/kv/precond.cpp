// The preconditioners of a cache stream (kv_internal.h, Precond): mean centring (with
// per-segment and RoPE-rotating means), query-weighted K scaling and the split layouts'
// channel selection, and the RoPE angle tables of the rotating mean.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kv/kv_internal.h"
#include "tq/error.h"

namespace tq::kv {

// ------------------------------------------------------------------ RoPE-rotating mean: angles
// y = x with RoPE pair (2i, 2i + 1), i < freq.size(), turned by the angle whose (cos, sin)
// turn(i) gives; the other dims copied.
template <class Turn>
static void turn_pairs(const std::vector<double>& freq, int D, const float* x, float* y, Turn turn) {
  std::memcpy(y, x, sizeof(float) * D);
  for (size_t i = 0; i < freq.size(); ++i) {
    const auto [c, sn] = turn(i);
    const double x0 = x[2 * i], x1 = x[2 * i + 1];
    y[2 * i] = (float)(x0 * c - x1 * sn);
    y[2 * i + 1] = (float)(x0 * sn + x1 * c);
  }
}

// (cos, sin) of pair i's angle: from a RopeTurns entry when there is one, else from `angle`.
static std::pair<double, double> turn_of(const double* tab, size_t i, double angle) {
  if (tab) return {tab[2 * i], tab[2 * i + 1]};
  return {std::cos(angle), std::sin(angle)};
}

// Angle positions of the RoPE-rotating mean: the token's own for the kRopeExactPairs fastest
// pairs, its block's centre for the rest (what the kernels' per-block terms assume).
static double rope_mean_pos(int pos0, int j, size_t pair) {
  return (int)pair < kRopeExactPairs ? (double)(pos0 + j) : pos0 + (j / kBlock) * kBlock + 0.5 * (kBlock - 1);
}

// A slow pair's offset from its block's centre, in tokens: -15.5 ... 15.5.
static double rope_block_offset(int j) { return (j % kBlock) - 0.5 * (kBlock - 1); }

static void put_turn(double* cs, double angle) { cs[0] = std::cos(angle), cs[1] = std::sin(angle); }

void RopeTurns::cover(const std::vector<double>& freq, int q0, int first, int count) {
  if (first == p0 && count == n && q0 == pos0 && (int)freq.size() == P) return;
  P = (int)freq.size();
  p0 = first;
  n = count;
  pos0 = q0;
  fwd.resize((size_t)n * P * 2);
  back.resize((size_t)n * P * 2);
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < P; ++i) {
      const double a = (double)(p0 + r) * freq[i];
      put_turn(&fwd[((size_t)r * P + i) * 2], a);
      put_turn(&back[((size_t)r * P + i) * 2], -a);
    }
  // Block centres of the stream indices p - pos0 >= 0 of these positions.
  const int j0 = std::max(0, p0 - pos0), j1 = p0 + n - 1 - pos0;
  nc = j1 >= j0 ? j1 / kBlock - j0 / kBlock + 1 : 0;
  c0 = nc ? rope_mean_pos(pos0, j0 / kBlock * kBlock, kRopeExactPairs) : 0;
  centre.resize((size_t)nc * P * 2);
  for (int k = 0; k < nc; ++k)
    for (int i = 0; i < P; ++i)
      put_turn(&centre[((size_t)k * P + i) * 2],
               rope_mean_pos(pos0, (j0 / kBlock + k) * kBlock, kRopeExactPairs) * freq[i]);
}

// Layer l's pair frequencies (KvCacheConfig: rope_base, layer_rope_base, layer_rope_scale,
// rope_freq_factors).
static std::vector<double> layer_rope_freq(const KvCacheConfig& cfg, int l) {
  const double base = !cfg.layer_rope_base.empty() && cfg.layer_rope_base[l] > 0 ? cfg.layer_rope_base[l] : cfg.rope_base;
  const double scale = !cfg.layer_rope_scale.empty() && cfg.layer_rope_scale[l] > 0 ? cfg.layer_rope_scale[l] : 1.0;
  std::vector<double> w(cfg.rope_dim / 2);
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = std::pow(base, -2.0 * (double)i / cfg.rope_dim) * scale;
    if (!cfg.rope_freq_factors.empty()) w[i] /= cfg.rope_freq_factors[i];
  }
  return w;
}

// The kernels' tables of one set of frequencies (Centre::rope_seed, rope_lane, rope_j).
static void fill_rope_tables(const KvCacheConfig& cfg, RopeTables& T) {
  const int P = (int)T.freq.size(), F = std::min(P, kRopeExactPairs);
  const int nb = cfg.max_tokens / kBlock + 1, ns = (nb + kRopeSeedBlocks - 1) / kRopeSeedBlocks;
  T.seed.assign((size_t)ns * P * 2, 0.0);
  T.lane.assign((size_t)P * 4 * kRopeSeedBlocks, 0.0);
  T.j.resize((size_t)(F + 1) * 2 * kBlock);
  for (int i = 0; i < P; ++i) {
    for (int s = 0; s < ns; ++s) {  // fast pairs: the block's first token
      const double a = rope_mean_pos(cfg.sink, s * kRopeSeedBlocks * kBlock, i) * T.freq[i];
      T.seed[((size_t)s * P + i) * 2] = std::cos(a);
      T.seed[((size_t)s * P + i) * 2 + 1] = std::sin(a);
    }
    for (int k = 0; k < 2 * kRopeSeedBlocks; ++k) {
      const double a = (double)k * kBlock * T.freq[i];
      T.lane[(size_t)i * 4 * kRopeSeedBlocks + k] = std::cos(a);
      T.lane[(size_t)i * 4 * kRopeSeedBlocks + 2 * kRopeSeedBlocks + k] = std::sin(a);
    }
    if (i < F)
      for (int j = 0; j < kBlock; ++j) {
        T.j[(size_t)i * 2 * kBlock + j] = (float)std::cos(j * T.freq[i]);
        T.j[(size_t)i * 2 * kBlock + kBlock + j] = (float)std::sin(j * T.freq[i]);
      }
  }
  for (int j = 0; j < kBlock; ++j) {  // the slow pairs' token offsets and their squares
    T.j[(size_t)F * 2 * kBlock + j] = (float)rope_block_offset(j);
    T.j[(size_t)F * 2 * kBlock + kBlock + j] = (float)(rope_block_offset(j) * rope_block_offset(j));
  }
}

void build_rope_tables(KvCache::Impl& I) {
  const KvCacheConfig& cfg = I.cfg;
  I.neox_to_pairs = cfg.rope_neox && (cfg.center_rope || cfg.scale_k);
  if (!cfg.center_rope) return;
  I.layer_rope.resize(cfg.n_layers);
  for (int l = 0; l < cfg.n_layers; ++l) {
    std::vector<double> w = layer_rope_freq(cfg, l);
    size_t t = 0;
    while (t < I.rope.size() && I.rope[t].freq != w) ++t;
    if (t == I.rope.size()) {
      I.rope.emplace_back();
      I.rope.back().freq = std::move(w);
      fill_rope_tables(cfg, I.rope.back());
    }
    I.layer_rope[l] = (int)t;
  }
}

const float* in_pair_order(const KvCache::Impl& I, const float* x, size_t rows, std::vector<float>& buf) {
  if (!I.neox_to_pairs || !x) return x;
  const int D = I.cfg.head_dim, H = I.cfg.rope_dim / 2;
  buf.resize(rows * D);
  for (size_t r = 0; r < rows; ++r) {
    const float* a = x + r * D;
    float* b = buf.data() + r * D;
    for (int i = 0; i < H; ++i) {
      b[2 * i] = a[i];
      b[2 * i + 1] = a[i + H];
    }
    std::memcpy(b + 2 * H, a + 2 * H, sizeof(float) * (D - 2 * H));
  }
  return buf.data();
}

// ------------------------------------------------------------------ Centre
void Centre::configure(const Stream& s, const KvCacheConfig& cfg, const KvCache::Impl& I) {
  // Centring buys nothing for the float formats: only quantized streams are centred.
  on = (s.side == 0 ? cfg.center_k : cfg.center_v) && s.fmt->quantized();
  dim_ = s.dim;
  segment = on ? cfg.center_segment : 0;
  rope = on && s.side == 0 && cfg.center_rope;
  if (!rope) return;
  pos0 = cfg.sink;
  const RopeTables& T = I.rope[I.layer_rope[s.layer]];
  rope_freq = T.freq;
  rope_seed = T.seed.data();
  rope_lane = T.lane.data();
  rope_j = T.j.data();
  turns = &T.turns;
}

void Centre::reset(int dim) {
  frozen = false;
  n_mu = 0;
  stat_n = 0;
  if (!on) return;
  stat_sum.assign(dim, 0.0);
  stat_x0.assign(dim, 0.f);
  if (segment > 0) seg_sum.assign(dim, 0.0);
}

void Centre::observe(const Rows& r, int dim) {
  for (int i = 0; i < r.n; ++i) {
    const float* xr = r.unroped ? r.unroped + (size_t)i * dim : r.x + (size_t)i * r.stride;
    for (int d = 0; d < dim; ++d) stat_sum[d] += xr[d];
    if (r.pos + i == 0) std::memcpy(stat_x0.data(), xr, sizeof(float) * dim);
    ++stat_n;
  }
}

// Chosen online: when a centred stream's first token is quantized, mu is the mean of every
// token the stream has seen so far (sinks, window and the whole batch being appended) except
// position 0 (the BOS / attention-sink token, an outlier in most models), rounded to fp16 and
// frozen from then on. If position 0 is the only token seen (token-by-token from an empty cache
// with no sink and no window), mu = 0: no centring for that stream.
void Centre::freeze(const Stream&) {
  const int D = dim_, n = stat_n - 1;  // position 0 excluded
  mu.assign(D, 0.f);
  n_mu = 1;
  if (n > 0)
    for (int d = 0; d < D; ++d) mu[d] = fp16_to_fp32(fp32_to_fp16((float)((stat_sum[d] - stat_x0[d]) / n)));
  drop_unturnable(mu.data());
  frozen = true;
}

// A slow pair whose angle moves by more than kRopeTurnMax between its block's centre and the
// block's ends keeps no mean: mean_at's second-order turn would be wrong there (at 1.5 rad its
// cosine term is -0.125 instead of 0.07), and the stored rows would carry that error.
void Centre::drop_unturnable(float* m) const {
  if (!rope) return;
  for (size_t i = kRopeExactPairs; i < rope_freq.size(); ++i)
    if (rope_freq[i] * 0.5 * (kBlock - 1) > kRopeTurnMax) m[2 * i] = m[2 * i + 1] = 0.f;
}

void Centre::unrope_row(int pos, const float* x, float* y) const {
  const double* tab = turns ? turns->at(pos, true) : nullptr;
  turn_pairs(rope_freq, dim_, x, y, [&](size_t i) { return turn_of(tab, i, -(double)pos * rope_freq[i]); });
}

void Centre::mean_at(int j, float* out) const noexcept {
  if (!rope) {
    std::memcpy(out, mu_of(j), sizeof(float) * dim_);
    return;
  }
  const double* fast = turns ? turns->at(pos0 + j) : nullptr;
  const double* slow = turns && rope_freq.size() > (size_t)kRopeExactPairs
                           ? turns->at_centre(rope_mean_pos(pos0, j, kRopeExactPairs))
                           : nullptr;
  turn_pairs(rope_freq, dim_, mu_of(j), out, [&](size_t i) {
    return turn_of((int)i < kRopeExactPairs ? fast : slow, i, rope_mean_pos(pos0, j, i) * rope_freq[i]);
  });
  // Slow pairs: u = R(centre) mu turned on by x = w * offset to second order,
  // (1 - x^2 / 2) u + x R(pi / 2) u, so that the kernels add it as two terms per token.
  const double dj = rope_block_offset(j);
  for (size_t i = kRopeExactPairs; i < rope_freq.size(); ++i) {
    const double x = rope_freq[i] * dj, c = 1.0 - 0.5 * x * x, u0 = out[2 * i], u1 = out[2 * i + 1];
    out[2 * i] = (float)(c * u0 - x * u1);
    out[2 * i + 1] = (float)(c * u1 + x * u0);
  }
}

// Segmented means: segment g >= 1 (it starts at a block) takes the mean of segment g - 1.
void Centre::forward(int t, int m, float* x, int D) {
  if (!on) return;
  std::vector<float> u((size_t)D);
  if (segment > 0) {
    if (t / segment >= n_mu) {
      TQ_ASSERT(t % segment == 0 && t / segment == n_mu);
      mu.resize((size_t)(n_mu + 1) * D);
      for (int d = 0; d < D; ++d) mu[(size_t)n_mu * D + d] = fp16_to_fp32(fp32_to_fp16((float)(seg_sum[d] / segment)));
      drop_unturnable(&mu[(size_t)n_mu * D]);
      ++n_mu;
      std::fill(seg_sum.begin(), seg_sum.end(), 0.0);
    }
    for (int j = 0; j < m; ++j) {
      const float* xr = x + (size_t)j * D;
      if (rope) {
        unrope_row(pos0 + t + j, xr, u.data());
        xr = u.data();
      }
      for (int d = 0; d < D; ++d) seg_sum[d] += xr[d];
    }
  }
  for (int j = 0; j < m; ++j) {
    mean_at(t + j, u.data());
    for (int d = 0; d < D; ++d) x[(size_t)j * D + d] -= u[d];
  }
}

void Centre::inverse(int j0, int n, float* x, int D) const {
  if (!on || j0 < 0) return;
  std::vector<float> m((size_t)D);
  for (int r = 0; r < n; ++r) {
    mean_at(j0 + r, m.data());
    for (int d = 0; d < D; ++d) x[(size_t)r * D + d] += m[d];
  }
}

// ------------------------------------------------------------------ query-weighted statistics
void QueryWeighted::reset(int dim) {
  frozen = false;
  n = q_n = 0;
  if (!on) return;
  energy.assign(dim, 0.0);
  sum.assign(dim, 0.0);
  q_energy.assign(dim, 0.0);
}

void QueryWeighted::observe(const Rows& r, int dim) {
  for (int i = 0; i < r.n; ++i) {
    if (r.pos + i == 0) continue;  // BOS: see Channels::freeze
    const float* xr = r.x + (size_t)i * r.stride;
    for (int d = 0; d < dim; ++d) energy[d] += (double)xr[d] * xr[d];
    const float* cr = r.unroped ? r.unroped + (size_t)i * dim : xr;
    for (int d = 0; d < dim; ++d) sum[d] += cr[d];
    ++n;
  }
}

void QueryWeighted::observe_queries(int pos, int n_tok, const float* q, size_t stride, int group, int dim) {
  for (int r = 0; r < n_tok; ++r) {
    if (pos + r == 0) continue;  // BOS, as for the keys
    for (int g = 0; g < group; ++g) {
      const float* qr = q + (size_t)r * stride + (size_t)g * dim;
      for (int d = 0; d < dim; ++d) q_energy[d] += (double)qr[d] * qr[d];
    }
    ++q_n;
  }
}

// Energies about the frozen K mean: sum (x - mu)^2 over the same tokens. RoPE-rotating mean:
// `sum` holds un-rotated rows; a pair's energy is rotation invariant, so its correction is
// exact per pair and split evenly over the pair's two channels.
void QueryWeighted::centre_energy(const Stream& s) {
  const Centre& c = s.centre;
  if (!c.on) return;
  const int D = s.dim;
  const std::vector<float>& mu = c.mu;
  if (c.rope) {
    for (int d = 0; d + 1 < D; d += 2) {
      const double e = -2.0 * (mu[d] * sum[d] + mu[d + 1] * sum[d + 1]) +
                       (double)n * (mu[d] * mu[d] + mu[d + 1] * mu[d + 1]);
      energy[d] += e / 2;
      energy[d + 1] += e / 2;
    }
  } else {
    for (int d = 0; d < D; ++d) energy[d] += -2.0 * mu[d] * sum[d] + (double)n * mu[d] * mu[d];
  }
}

// ------------------------------------------------------------------ KScale
void KScale::configure(const Stream& s, const KvCacheConfig& cfg, const KvCache::Impl&) {
  on = s.side == 0 && cfg.scale_k && s.fmt->turboquant();
}

void KScale::reset(int dim) {
  QueryWeighted::reset(dim);
  w.clear();
}

// For an isotropic quantizer of y = w * k (rotation + codebook: error variance per coordinate
// proportional to |y|^2), the q.k error variance is proportional to
//   (sum_d w_d^2 E[k_d^2]) (sum_d E[q_d^2] / w_d^2),
// smallest (Cauchy-Schwarz) at w_d^2 proportional to sqrt(E[q_d^2] / E[k_d^2]). One weight per
// RoPE pair (RoPE moves energy between the pair's channels), from the centred K energy and
// the query energy of the n tokens seen before freezing, the exponent shrunk by n / (n + 16)
// (a short prompt is a noisy estimate: the weights move toward 1); clamped to [1/4, 4] x the geometric
// mean (a pair nearly empty then can grow later without swamping the rest), scaled so that
// sum_d w_d^2 E[k_d^2] = sum_d E[k_d^2] (norms keep their range), rounded to fp16: D / 2
// stored values (counted in bytes_used).
void KScale::freeze(const Stream& s) {
  centre_energy(s);
  frozen = true;
  w.clear();
  if (q_n == 0 || n == 0) return;  // no queries seen: identity
  const int P = s.dim / 2;
  std::vector<double> ke(P), wp(P);
  double kmax = 0, qmax = 0;
  for (int u = 0; u < P; ++u) {
    ke[u] = std::max(0.0, energy[2 * u] + energy[2 * u + 1]);
    kmax = std::max(kmax, ke[u]);
    qmax = std::max(qmax, q_energy[2 * u] + q_energy[2 * u + 1]);
  }
  if (!(kmax > 0) || !(qmax > 0)) return;
  const double nn = std::min(q_n, n), expo = 0.25 * nn / (nn + 16);
  double lsum = 0;
  for (int u = 0; u < P; ++u) {
    const double q = std::max(q_energy[2 * u] + q_energy[2 * u + 1], 1e-9 * qmax);
    wp[u] = std::pow(q / std::max(ke[u], 1e-9 * kmax), expo);
    lsum += std::log(wp[u]);
  }
  const double gm = std::exp(lsum / P);
  double e0 = 0, e1 = 0;
  for (int u = 0; u < P; ++u) {
    wp[u] = std::clamp(wp[u], gm / 4, gm * 4);
    e0 += ke[u];
    e1 += wp[u] * wp[u] * ke[u];
  }
  const double c = std::sqrt(e0 / e1);
  w.resize(s.dim);
  for (int u = 0; u < P; ++u) w[2 * u] = w[2 * u + 1] = fp16_to_fp32(fp32_to_fp16((float)(wp[u] * c)));
}

void KScale::forward(int, int n_rows, float* x, int D) {
  if (w.empty()) return;
  for (int j = 0; j < n_rows; ++j)
    for (int d = 0; d < D; ++d) x[(size_t)j * D + d] *= w[d];
}
void KScale::inverse(int, int n_rows, float* x, int D) const {
  if (w.empty()) return;
  for (int r = 0; r < n_rows; ++r)
    for (int d = 0; d < D; ++d) x[(size_t)r * D + d] /= w[d];
}
void KScale::query(int n_rows, float* q, int D) const { inverse(0, n_rows, q, D); }

// ------------------------------------------------------------------ Channels
void Channels::configure(const Stream& s, const KvCacheConfig&, const KvCache::Impl&) {
  on = s.split();
  d_hi = s.d_hi;
}

void Channels::reset(int dim) {
  QueryWeighted::reset(dim);
  perm.clear();
}

// Selected channels of the split types (tqBhH), chosen online when the stream's first token
// is quantized, over every token it has seen then (appended, window included), and frozen
// from then on: the logit error a channel adds is its K error times its query energy, so the
// D/8 adjacent channel pairs (2i, 2i+1) with the largest (sum of (k - mu)^2) x (sum of q^2
// over the group's query heads, from observe_queries) take the high bits (ties: lower index);
// pairs, because RoPE rotates each pair by the position and moves energy between its two
// channels. Position 0 (BOS) is left out of both sums. Without observed queries: K energy
// alone. Costs D bits per stream (counted in bytes_used).
void Channels::freeze(const Stream& s) {
  centre_energy(s);
  constexpr int g = 2;  // channels per unit: RoPE pairs
  const bool weigh = q_n > 0;
  std::vector<double> w(s.dim / g, 0.0), qw(w.size(), 0.0);
  for (int d = 0; d < s.dim; ++d) {
    w[d / g] += energy[d];
    if (weigh) qw[d / g] += q_energy[d];
  }
  if (weigh)
    for (size_t u = 0; u < w.size(); ++u) w[u] *= qw[u];
  std::vector<int> units(w.size());
  std::iota(units.begin(), units.end(), 0);
  std::stable_sort(units.begin(), units.end(), [&](int a, int b) { return w[a] > w[b]; });
  std::vector<int> order;
  for (int u : units)
    for (int j = 0; j < g; ++j) order.push_back(u * g + j);
  std::vector<int> hi(order.begin(), order.begin() + d_hi), lo(order.begin() + d_hi, order.end());
  std::sort(hi.begin(), hi.end());
  std::sort(lo.begin(), lo.end());
  perm = hi;
  perm.insert(perm.end(), lo.begin(), lo.end());
  frozen = true;
}

// Row r of x becomes y with y[perm[i]] = x[i] (scatter) or y[i] = x[perm[i]].
static void permute_rows(const std::vector<int>& perm, bool scatter, int n_rows, float* x, int D) {
  if (perm.empty()) return;
  std::vector<float> t((size_t)D);
  for (float* xr = x; xr < x + (size_t)n_rows * D; xr += D) {
    std::memcpy(t.data(), xr, sizeof(float) * D);
    if (scatter)
      for (int i = 0; i < D; ++i) xr[perm[i]] = t[i];
    else
      for (int i = 0; i < D; ++i) xr[i] = t[perm[i]];
  }
}
void Channels::inverse(int, int n_rows, float* x, int D) const { permute_rows(perm, true, n_rows, x, D); }
void Channels::query(int n_rows, float* q, int D) const { permute_rows(perm, false, n_rows, q, D); }
void Channels::forward(int, int n_rows, float* x, int D) { query(n_rows, x, D); }

}  // namespace tq::kv
