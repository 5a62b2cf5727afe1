// Per-KV-head cache allocation fitted to a model (include/tq/calibrate.h).
#include "tq/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <sstream>
#include <utility>

#include "tq/common.h"
#include "tq/error.h"
#include "tq/fileio.h"
#include "tq/kv_cache.h"

namespace tq {

std::vector<int> solve_mckp(const std::vector<std::vector<McOption>>& groups, int64_t cap, double* value,
                            int64_t* cost) {
  int64_t base = 0;
  std::vector<int64_t> cmin(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    TQ_CHECK(!groups[g].empty() && groups[g].size() <= 127, "knapsack: group %zu has %zu options (1 to 127)", g,
             groups[g].size());
    cmin[g] = std::numeric_limits<int64_t>::max();
    for (const McOption& o : groups[g]) {
      TQ_CHECK(o.cost >= 0 && std::isfinite(o.value), "knapsack: an option with cost < 0 or a value not finite");
      cmin[g] = std::min(cmin[g], o.cost);
    }
    base += cmin[g];
  }
  TQ_CHECK(base <= cap, "knapsack: the cheapest options cost %lld, above the cap %lld", (long long)base,
           (long long)cap);
  const int64_t room = cap - base;
  const size_t width = static_cast<size_t>(room) + 1;
  TQ_CHECK(static_cast<double>(width) * std::max<size_t>(groups.size(), 1) <= double(1 << 28),
           "knapsack: %zu groups x %lld cost units is too large a table", groups.size(), (long long)room);
  const double inf = std::numeric_limits<double>::infinity();
  // best[x]: least summed value of the groups so far with extra cost x above their cheapest.
  std::vector<double> best(width, inf), nb(width);
  best[0] = 0;
  std::vector<std::vector<int8_t>> picks(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    std::fill(nb.begin(), nb.end(), inf);
    std::vector<int8_t>& pk = picks[g];
    pk.assign(width, -1);
    for (size_t i = 0; i < groups[g].size(); ++i) {
      const int64_t e = groups[g][i].cost - cmin[g];
      if (e > room) continue;
      const double v0 = groups[g][i].value;
      for (int64_t x = room - e; x >= 0; --x) {
        const double v = best[x] + v0;
        if (v < nb[x + e]) {
          nb[x + e] = v;
          pk[x + e] = static_cast<int8_t>(i);
        }
      }
    }
    std::swap(best, nb);
  }
  int64_t x = 0;
  for (int64_t i = 1; i <= room; ++i)
    if (best[i] < best[x]) x = i;
  if (value) *value = best[x];
  std::vector<int> choice(groups.size());
  int64_t total = 0;
  for (size_t g = groups.size(); g-- > 0;) {
    const int i = picks[g][x];
    choice[g] = i;
    total += groups[g][i].cost;
    x -= groups[g][i].cost - cmin[g];
  }
  if (cost) *cost = total;
  return choice;
}

namespace {
// A unit as a layers= item: the layer when the model has one KV head per layer, else LAYER.HEAD.
KvLayerItem unit_item(int l, int h, int n_kv_heads) {
  return n_kv_heads == 1 ? KvLayerItem{l, l, std::nullopt} : KvLayerItem{l, l, h};
}
}  // namespace

AllocResult allocate_heads(const AllocInput& in) {
  const int n_units = in.n_layers * in.n_kv_heads;
  TQ_CHECK(n_units >= 1, "allocation: no KV heads");
  TQ_CHECK(in.sens_k.size() == (size_t)n_units && in.sens_v.size() == (size_t)n_units,
           "allocation: %zu K and %zu V sensitivities for %d KV heads", in.sens_k.size(), in.sens_v.size(), n_units);
  TQ_CHECK(!in.k_types.empty() && !in.v_types.empty(), "allocation: no candidate types");
  TQ_CHECK(in.kld_k.size() == in.k_types.size() && in.cost_k.size() == in.k_types.size() &&
               in.kld_v.size() == in.v_types.size() && in.cost_v.size() == in.v_types.size(),
           "allocation: a KLD and a cost for every candidate type");
  TQ_CHECK(in.unit_scale.empty() || in.unit_scale.size() == (size_t)n_units,
           "allocation: %zu unit cost scales for %d KV heads", in.unit_scale.size(), n_units);
  for (int64_t x : in.unit_scale) TQ_CHECK(x >= 1, "allocation: a unit cost scale below 1");
  // Every measurement: the first (in's own fields) and `more`.
  std::vector<AllocInput::Measure> ms{{in.sens_k, in.sens_v, in.kld_k, in.kld_v, in.weight}};
  for (const auto& m : in.more) {
    TQ_CHECK(m.sens_k.size() == (size_t)n_units && m.sens_v.size() == (size_t)n_units &&
                 m.kld_k.size() == in.k_types.size() && m.kld_v.size() == in.v_types.size(),
             "allocation: a further measurement of %zu K and %zu V heads and %zu + %zu types (want %d and %zu + %zu)",
             m.sens_k.size(), m.sens_v.size(), m.kld_k.size(), m.kld_v.size(), n_units, in.k_types.size(),
             in.v_types.size());
    TQ_CHECK(std::isfinite(m.weight) && m.weight > 0, "allocation: a measurement weight that is not > 0");
    ms.push_back(m);
  }
  // value[m][side][u][t]: measurement m's predicted KLD of unit u's side at type t.
  auto predicted = [&](const AllocInput::Measure& m, int side, int u, size_t t) {
    const auto& sens = side == 0 ? m.sens_k : m.sens_v;
    const auto& kld = side == 0 ? m.kld_k : m.kld_v;
    double tot = 0;
    for (double x : sens) tot += x;
    const double share = tot > 0 ? sens[u] / tot : 1.0 / n_units;
    return share * kld[t];
  };
  std::vector<std::vector<McOption>> groups;
  for (int side = 0; side < 2; ++side) {
    const auto& cost = side == 0 ? in.cost_k : in.cost_v;
    for (int u = 0; u < n_units; ++u) {
      const int64_t sc = in.unit_scale.empty() ? 1 : in.unit_scale[u];
      std::vector<McOption> og;
      for (size_t t = 0; t < cost.size(); ++t) {
        double v = 0;
        if (ms.size() == 1) v = predicted(ms[0], side, u, t);  // unweighted, as before `more`
        else for (const auto& m : ms) v += m.weight * predicted(m, side, u, t);
        og.push_back({v, cost[t] * sc});
      }
      groups.push_back(std::move(og));
    }
  }
  AllocResult r;
  const std::vector<int> pick = solve_mckp(groups, in.budget, &r.predicted_kld, &r.cost);
  if (ms.size() > 1)
    for (const auto& m : ms) {
      double p = 0;
      for (int u = 0; u < n_units; ++u) p += predicted(m, 0, u, pick[u]) + predicted(m, 1, u, pick[n_units + u]);
      r.predicted_each.push_back(p);
    }
  std::vector<int> count_k(in.k_types.size()), count_v(in.v_types.size());
  for (int u = 0; u < n_units; ++u) {
    r.k_type.push_back(in.k_types[pick[u]]);
    r.v_type.push_back(in.v_types[pick[n_units + u]]);
    count_k[pick[u]]++;
    count_v[pick[n_units + u]]++;
  }
  // The base type of a side: the one most units take; ties go to the cheaper, then the earlier.
  auto base_of = [](const std::vector<int>& count, const std::vector<int64_t>& cost) {
    size_t b = 0;
    for (size_t t = 1; t < count.size(); ++t)
      if (count[t] > count[b] || (count[t] == count[b] && cost[t] < cost[b])) b = t;
    return b;
  };
  const std::string bk = in.k_types[base_of(count_k, in.cost_k)], bv = in.v_types[base_of(count_v, in.cost_v)];
  std::vector<std::pair<std::string, std::string>> pairs;  // distinct (K, V), first appearance
  std::vector<std::vector<KvLayerItem>> members;
  for (int u = 0; u < n_units; ++u) {
    if (r.k_type[u] == bk && r.v_type[u] == bv) continue;
    const auto kv = std::make_pair(r.k_type[u], r.v_type[u]);
    const size_t at = std::find(pairs.begin(), pairs.end(), kv) - pairs.begin();
    const KvLayerItem item = unit_item(u / in.n_kv_heads, u % in.n_kv_heads, in.n_kv_heads);
    if (at == pairs.size()) {
      pairs.push_back(kv);
      members.push_back({item});
    } else {
      members[at].push_back(item);
    }
  }
  KvSpec spec = KvSpec::parse("k=" + bk + " v=" + bv + in.suffix);
  for (size_t p = 0; p < pairs.size(); ++p)
    spec.layers.push_back({members[p], parse_kv_format(pairs[p].first), parse_kv_format(pairs[p].second)});
  r.label = spec.to_string();
  return r;
}

std::vector<std::string> default_calib_k_types() {
  return {"tq2h4n8", "tq2h5n8", "tq2h6n8", "tq3h4n8", "tq3h5n8", "tq3h6n8", "tq4n8", "tq4h5n8", "tq4h6n8"};
}
std::vector<std::string> default_calib_v_types() {
  return {"tq2h5n8", "tq3n8", "tq3h4n8", "tq4n8", "tq4h5n8", "tq4h6n8", "tq5n8"};
}

KvSpec calib_protection(const std::string& protect, uint64_t seed) {
  const KvSpec kv = KvSpec::parse("k=tq3 v=tq3 " + protect);
  TQ_CHECK(kv.k == KvFormat::tq3 && kv.v == KvFormat::tq3 && kv.layers.empty() && kv.boundary_layers == 0 &&
               kv.window == 0 && kv.seed == KvSpec::kDefaultSeed,
           "--protect '%s': only protection tokens (sink=N, center=..., plain, scale-k, trellis; or sN, ck/cv/ckv, c0, "
           "csN, cr, ks, tc), no types, window, boundary, layers or seed", protect.c_str());
  KvSpec r = kv.resolved();  // the automatic protection of a tq K type, spelled out
  r.k = r.v = KvFormat::f16;  // (protection none stays none: the types set later are tq ones)
  r.seed = seed;
  return r;
}

namespace {
// Whether layer l's heads get the one-head probes (every layer unless opt.probe_layers says).
bool layer_probed(const CalibOptions& opt, int l) {
  return !opt.probe_layers || std::find(opt.probe_layers->begin(), opt.probe_layers->end(), l) != opt.probe_layers->end();
}
}  // namespace

std::vector<KvSpec> calib_configs(const LlamaConfig& mc, const CalibOptions& opt,
                                     const std::vector<std::string>& k_types,
                                     const std::vector<std::string>& v_types) {
  const KvSpec p = calib_protection(opt.protect, opt.seed);
  std::vector<KvSpec> out;
  const KvFormat probe_k = parse_kv_format(opt.probe_k), probe_v = parse_kv_format(opt.probe_v);
  if (opt.probe_layers)
    for (int l : *opt.probe_layers)
      TQ_CHECK(l >= 0 && l < mc.n_layers, "calibrate: probe layer %d out of range (the model has %d layers)", l,
               mc.n_layers);
  for (int side = 0; side < 2; ++side)
    for (int l = 0; l < mc.n_layers; ++l)
      for (int h = 0; h < mc.n_kv_heads && layer_probed(opt, l); ++h) {
        KvSpec o = p;
        o.layers = {{{{l, l, h}}, side == 0 ? probe_k : KvFormat::f16, side == 0 ? KvFormat::f16 : probe_v}};
        out.push_back(o);
      }
  for (const auto& t : k_types) {
    KvSpec o = p;
    o.k = parse_kv_format(t);
    out.push_back(o);
  }
  for (const auto& t : v_types) {
    KvSpec o = p;
    o.v = parse_kv_format(t);
    out.push_back(o);
  }
  return out;
}

namespace {
struct Stopped {};
}  // namespace

CalibSensitivity calibrate_measure(const LlamaModel& m, const std::vector<int32_t>& tokens, const CalibOptions& opt) {
  const LlamaConfig& mc = m.config();
  TQ_CHECK(opt.n_ctx >= 16, "calibrate: context %d too small (>= 16)", opt.n_ctx);
  const int avail = static_cast<int>(tokens.size() / opt.n_ctx);
  TQ_CHECK(avail >= 1, "calibrate: the calibration text has %zu tokens, fewer than one window of %d (-c)",
           tokens.size(), opt.n_ctx);
  const std::vector<std::string> kt = opt.k_types.empty() ? default_calib_k_types() : opt.k_types;
  const std::vector<std::string> vt = opt.v_types.empty() ? default_calib_v_types() : opt.v_types;
  const std::vector<KvSpec> configs = calib_configs(mc, opt, kt, vt);
  const int n_units = mc.n_layers * mc.n_kv_heads;
  CalibSensitivity s;
  s.n_layers = mc.n_layers;
  s.n_kv_heads = mc.n_kv_heads;
  s.head_dim = mc.head_dim;
  s.n_ctx = opt.n_ctx;
  s.windows_requested = opt.n_chunks > 0 ? std::min(opt.n_chunks, avail) : avail;
  s.probe_k = opt.probe_k;
  s.probe_v = opt.probe_v;
  s.protect = opt.protect;
  s.k_types = kt;
  s.v_types = vt;
  const size_t nc = configs.size(), per_window = nc + 1;
  const size_t total = static_cast<size_t>(s.windows_requested) * per_window;
  std::vector<double> kld_sum(nc, 0);
  double nll_ref = 0;
  const double t0 = tq::wall_seconds();
  for (int w = 0; w < s.windows_requested; ++w) {
    const std::vector<int32_t> win(tokens.begin() + static_cast<size_t>(w) * opt.n_ctx,
                                   tokens.begin() + static_cast<size_t>(w + 1) * opt.n_ctx);
    PerplexityOptions po;
    po.n_ctx = opt.n_ctx;
    po.n_chunks = 1;
    po.compare = true;
    po.ref.seed = opt.seed;
    po.progress = [&](size_t d, size_t t) {
      if (opt.progress) opt.progress(static_cast<size_t>(w) * per_window + d, total);
      if (d < t && opt.stop && opt.stop()) throw Stopped{};
    };
    std::vector<PerplexityResult> res;
    try {
      res = perplexity_multi(m, win, po, configs);
    } catch (const Stopped&) {
      break;
    }
    for (size_t c = 0; c < nc; ++c) kld_sum[c] += res[c].kld_mean * static_cast<double>(res[c].n_scored);
    nll_ref += std::log(res[0].ppl_ref) * static_cast<double>(res[0].n_scored);
    s.n_scored += res[0].n_scored;
    s.windows++;
    if (opt.stop && opt.stop()) break;
  }
  s.seconds = tq::wall_seconds() - t0;
  if (s.n_scored == 0) return s;
  const double n = static_cast<double>(s.n_scored);
  // The probed units in order (calib_configs' order); the others stay -1.
  std::vector<int> units;
  for (int u = 0; u < n_units; ++u) {
    const int l = u / mc.n_kv_heads;
    if (layer_probed(opt, l)) units.push_back(u);
  }
  const size_t np = units.size();
  s.sens_k.assign(n_units, -1);
  s.sens_v.assign(n_units, -1);
  for (size_t i = 0; i < np; ++i) {
    s.sens_k[units[i]] = kld_sum[i] / n;
    s.sens_v[units[i]] = kld_sum[np + i] / n;
  }
  for (size_t t = 0; t < kt.size(); ++t) s.kld_k.push_back(kld_sum[2 * np + t] / n);
  for (size_t t = 0; t < vt.size(); ++t) s.kld_v.push_back(kld_sum[2 * np + kt.size() + t] / n);
  s.ppl_ref = std::exp(nll_ref / n);
  return s;
}

std::vector<int> calib_layers_growing(const LlamaConfig& mc, int short_ctx, int long_ctx) {
  TQ_CHECK(short_ctx >= 1 && long_ctx > short_ctx, "calibrate: contexts %d and %d (the second must be longer)",
           short_ctx, long_ctx);
  std::vector<int> out;
  for (int l = 0; l < mc.n_layers; ++l) {
    auto seen = [&](int c) { return mc.layer_is_swa(l) ? std::min(c, mc.sliding_window) : c; };
    if (seen(long_ctx) > seen(short_ctx)) out.push_back(l);
  }
  return out;
}

void calib_reuse_sens(CalibSensitivity& at_long, const CalibSensitivity& at_short, const std::vector<int>& probed) {
  CalibSensitivity& a = at_long;
  const CalibSensitivity& b = at_short;
  TQ_CHECK(a.n_layers == b.n_layers && a.n_kv_heads == b.n_kv_heads && a.head_dim == b.head_dim &&
               a.k_types == b.k_types && a.v_types == b.v_types && a.protect == b.protect && a.probe_k == b.probe_k &&
               a.probe_v == b.probe_v,
           "calibrate: the sensitivities at ctx %d and ctx %d were measured on another model or with other candidates, "
           "probes or protection: cannot reuse one's for the other", b.n_ctx, a.n_ctx);
  TQ_CHECK(b.n_ctx < a.n_ctx, "calibrate: reusing sensitivities of ctx %d at ctx %d (must be a shorter context)",
           b.n_ctx, a.n_ctx);
  const size_t n = static_cast<size_t>(a.n_layers) * a.n_kv_heads;
  TQ_CHECK(a.sens_k.size() == n && a.sens_v.size() == n && b.sens_k.size() == n && b.sens_v.size() == n,
           "calibrate: sensitivities of %zu units expected", n);
  a.reused_layers.clear();
  for (int l = 0; l < a.n_layers; ++l) {
    if (std::find(probed.begin(), probed.end(), l) != probed.end()) continue;
    for (int h = 0; h < a.n_kv_heads; ++h) {
      const size_t u = static_cast<size_t>(l) * a.n_kv_heads + h;
      a.sens_k[u] = b.sens_k[u];
      a.sens_v[u] = b.sens_v[u];
    }
    a.reused_layers.push_back(l);
  }
  a.reused_from_ctx = a.reused_layers.empty() ? 0 : b.n_ctx;
  for (size_t u = 0; u < n; ++u)
    TQ_CHECK(a.sens_k[u] >= 0 && a.sens_v[u] >= 0, "calibrate: unit %zu has no sensitivity at ctx %d", u, a.n_ctx);
}

namespace {
// Bytes a cache of `cfg` holds after n_ctx tokens of random K / V (and queries, for the online
// choices) appended in batches of `ubatch` across all layers.
size_t bytes_after_filling(const LlamaConfig& mc, const KvCacheConfig& cfg, int n_ctx, int ubatch) {
  KvCache cache(cfg);
  Rng r(0xca1b);
  const int D = mc.head_dim;
  const int nb = std::min(ubatch, n_ctx);
  std::vector<float> q(static_cast<size_t>(nb) * mc.n_heads * D);
  std::vector<float> k(static_cast<size_t>(nb) * mc.n_kv_heads * D), v(k.size());
  for (int p0 = 0; p0 < n_ctx; p0 += nb) {
    const int n = std::min(nb, n_ctx - p0);
    for (int l = 0; l < mc.n_layers; ++l) {
      for (auto* buf : {&q, &k, &v})
        for (float& x : *buf) x = static_cast<float>(r.normal());
      cache.observe_queries(l, n, q.data(), mc.n_heads);
      cache.append(l, n, k.data(), v.data());
    }
  }
  return cache.bytes_used();
}
}  // namespace

size_t calib_bytes_used(const LlamaConfig& mc, const KvSpec& kv, int n_ctx) {
  KvCacheConfig cfg = kv.resolve(mc, n_ctx);
  cfg.layer_window.clear();  // every layer holds every token
  return bytes_after_filling(mc, cfg, n_ctx, n_ctx);
}

size_t calib_bytes_held(const LlamaConfig& mc, const KvSpec& kv, int n_ctx, int ubatch) {
  TQ_CHECK(n_ctx >= 1 && ubatch >= 1, "calibrate: context %d, batch %d", n_ctx, ubatch);
  return bytes_after_filling(mc, kv.resolve(mc, n_ctx), n_ctx, ubatch);
}

namespace {
// Bytes of one stream per 32 tokens once quantized (KvCache::bytes_per_token's unit, x 32).
int64_t block_cost(const std::string& t, int head_dim) {
  const KvTypeTraits& f = kv_type_traits(parse_kv_type(t));
  TQ_CHECK(f.supports(head_dim), "cache type %s does not support head_dim %d", t.c_str(), head_dim);
  return static_cast<int64_t>(f.block_bytes(head_dim));
}
size_t cheapest(const std::vector<std::string>& types, int head_dim) {
  size_t b = 0;
  for (size_t t = 1; t < types.size(); ++t)
    if (block_cost(types[t], head_dim) < block_cost(types[b], head_dim)) b = t;
  return b;
}
KvSpec label_kv(const std::string& label, uint64_t seed) {
  KvSpec kv = KvSpec::parse(label);
  kv.seed = seed;
  return kv;
}
}  // namespace

double calib_cheapest_bits(const LlamaConfig& mc, const std::vector<std::string>& k_types,
                           const std::vector<std::string>& v_types, const std::string& protect, int n_ctx,
                           uint64_t seed) {
  TQ_CHECK(!k_types.empty() && !v_types.empty(), "calibrate: no candidate types");
  const std::string label =
      k_types[cheapest(k_types, mc.head_dim)] + "/" + v_types[cheapest(v_types, mc.head_dim)] + " " + protect;
  const double values = 2.0 * mc.n_layers * mc.n_kv_heads * mc.head_dim * n_ctx;
  return 8.0 * static_cast<double>(calib_bytes_used(mc, label_kv(label, seed), n_ctx)) / values;
}

namespace {
// The knapsack's input from one measurement: its sensitivities, types, whole-model KLDs, each
// type's bytes per block and the protection as the label suffix.
AllocInput alloc_input(const LlamaConfig& mc, const CalibSensitivity& s) {
  const int D = mc.head_dim;
  AllocInput in;
  in.n_layers = mc.n_layers;
  in.n_kv_heads = mc.n_kv_heads;
  in.sens_k = s.sens_k;
  in.sens_v = s.sens_v;
  in.k_types = s.k_types;
  in.v_types = s.v_types;
  in.kld_k = s.kld_k;
  in.kld_v = s.kld_v;
  for (const auto& t : s.k_types) in.cost_k.push_back(block_cost(t, D));
  for (const auto& t : s.v_types) in.cost_v.push_back(block_cost(t, D));
  in.suffix = s.protect.empty() ? "" : " " + s.protect;
  return in;
}
}  // namespace

CalibAllocation calibrate_allocate(const LlamaConfig& mc, const CalibSensitivity& s, double bits, int n_ctx,
                                   uint64_t seed) {
  TQ_CHECK(s.n_layers == mc.n_layers && s.n_kv_heads == mc.n_kv_heads && s.head_dim == mc.head_dim,
           "calibrate: the sensitivities are of a model with %d layers x %d KV heads of %d dims, this one has "
           "%d x %d of %d", s.n_layers, s.n_kv_heads, s.head_dim, mc.n_layers, mc.n_kv_heads, mc.head_dim);
  TQ_CHECK(s.n_scored > 0 && !s.sens_k.empty(), "calibrate: no measured sensitivities");
  TQ_CHECK(std::isfinite(bits) && bits > 0, "calibrate: bits per value %g is not > 0", bits);
  TQ_CHECK(n_ctx >= 1, "calibrate: context %d", n_ctx);
  const int D = mc.head_dim;
  AllocInput in = alloc_input(mc, s);
  const std::string& suffix = in.suffix;
  const double values_per_token = 2.0 * mc.n_layers * mc.n_kv_heads * D;
  const double allowed = std::floor(bits * values_per_token * n_ctx / 8.0 + 1e-9);  // bytes at n_ctx tokens
  const int64_t n_units = static_cast<int64_t>(mc.n_layers) * mc.n_kv_heads;
  const size_t ck = cheapest(s.k_types, D), cv = cheapest(s.v_types, D);
  const int64_t base_cost = n_units * (in.cost_k[ck] + in.cost_v[cv]);
  CalibAllocation out;
  out.n_ctx = n_ctx;
  const size_t bytes_cheapest =
      calib_bytes_used(mc, label_kv(s.k_types[ck] + "/" + s.v_types[cv] + suffix, seed), n_ctx);
  out.bits_cheapest = 8.0 * static_cast<double>(bytes_cheapest) / (values_per_token * n_ctx);
  TQ_CHECK(static_cast<double>(bytes_cheapest) <= allowed,
           "--bits %g is below the cheapest candidates (K %s, V %s on every head): %.4f bits per value, everything "
           "counted at ctx %d", bits, s.k_types[ck].c_str(), s.v_types[cv].c_str(), out.bits_cheapest, n_ctx);
  // The fixed part (sink rows, means, scales, masks) at n_ctx tokens, from the cheapest
  // allocation first, then from each allocation that did not fit.
  double fixed = static_cast<double>(bytes_cheapest) - n_ctx * static_cast<double>(base_cost) / 32.0;
  int64_t cap = std::numeric_limits<int64_t>::max();
  for (int iter = 0; iter < 64; ++iter) {
    const int64_t want = static_cast<int64_t>(std::floor((allowed - fixed) * 32.0 / n_ctx + 1e-9));
    cap = std::max(base_cost, std::min(want, cap == std::numeric_limits<int64_t>::max() ? want : cap - 1));
    in.budget = cap;
    out.alloc = allocate_heads(in);
    out.bytes_used = calib_bytes_used(mc, label_kv(out.alloc.label, seed), n_ctx);
    out.bits_all = 8.0 * static_cast<double>(out.bytes_used) / (values_per_token * n_ctx);
    if (static_cast<double>(out.bytes_used) <= allowed) return out;
    TQ_CHECK(cap > base_cost, "calibrate: no allocation fits %g bits per value", bits);
    fixed = static_cast<double>(out.bytes_used) - n_ctx * static_cast<double>(out.alloc.cost) / 32.0;
  }
  TQ_CHECK(false, "calibrate: no allocation within %g bits per value found", bits);
  return out;
}

CalibAllocation calibrate_allocate_multi(const LlamaConfig& mc, const std::vector<CalibSensitivity>& ss, double bits,
                                         int n_ctx, uint64_t seed) {
  TQ_CHECK(!ss.empty(), "calibrate: no measured sensitivities");
  const CalibSensitivity& s0 = ss[0];
  for (const CalibSensitivity& s : ss) {
    TQ_CHECK(s.n_layers == mc.n_layers && s.n_kv_heads == mc.n_kv_heads && s.head_dim == mc.head_dim,
             "calibrate: the sensitivities at ctx %d are of a model with %d layers x %d KV heads of %d dims, this one "
             "has %d x %d of %d", s.n_ctx, s.n_layers, s.n_kv_heads, s.head_dim, mc.n_layers, mc.n_kv_heads,
             mc.head_dim);
    TQ_CHECK(s.n_scored > 0 && !s.sens_k.empty(), "calibrate: no measured sensitivities at ctx %d", s.n_ctx);
    TQ_CHECK(s.k_types == s0.k_types && s.v_types == s0.v_types && s.protect == s0.protect,
             "calibrate: the sensitivities at ctx %d and ctx %d were measured with different candidate types or "
             "protection (measure both with the same --k-types, --v-types, --protect)", s0.n_ctx, s.n_ctx);
  }
  TQ_CHECK(std::isfinite(bits) && bits > 0, "calibrate: bits per value %g is not > 0", bits);
  TQ_CHECK(n_ctx >= 1, "calibrate: context %d", n_ctx);
  const int D = mc.head_dim;
  const size_t ck = cheapest(s0.k_types, D), cv = cheapest(s0.v_types, D);
  AllocInput in = alloc_input(mc, s0);
  const std::string& suffix = in.suffix;
  if (ss.size() > 1) {
    // Each measurement relative to its predicted KLD with the cheapest types everywhere.
    auto w_of = [&](const CalibSensitivity& s) {
      const double base = s.kld_k[ck] + s.kld_v[cv];
      TQ_CHECK(std::isfinite(base) && base > 0, "calibrate: the cheapest types' KLD at ctx %d is not > 0", s.n_ctx);
      return 1.0 / base;
    };
    in.weight = w_of(s0);
    for (size_t i = 1; i < ss.size(); ++i)
      in.more.push_back({ss[i].sens_k, ss[i].sens_v, ss[i].kld_k, ss[i].kld_v, w_of(ss[i])});
  }
  // The contexts the budget holds at: every measured one and n_ctx; the knapsack counts bytes at
  // the smallest, where a layer holds min(ctx, its window) tokens.
  std::vector<int> ctxs{n_ctx};
  for (const auto& s : ss) ctxs.push_back(s.n_ctx);
  std::sort(ctxs.begin(), ctxs.end());
  ctxs.erase(std::unique(ctxs.begin(), ctxs.end()), ctxs.end());
  const int c0 = ctxs.front();
  std::vector<int64_t> held(mc.n_layers);
  int64_t g = 0;
  for (int l = 0; l < mc.n_layers; ++l) {
    held[l] = mc.layer_is_swa(l) ? std::min(c0, mc.sliding_window) : c0;
    g = std::gcd(g, held[l]);
  }
  const int64_t n_units = static_cast<int64_t>(mc.n_layers) * mc.n_kv_heads;
  int64_t scale_sum = 0;
  for (int64_t u = 0; u < n_units; ++u) {
    in.unit_scale.push_back(held[u / mc.n_kv_heads] / g);
    scale_sum += in.unit_scale.back();
  }
  const double values_per_token = 2.0 * mc.n_layers * mc.n_kv_heads * D;
  auto allowed_at = [&](int c) { return std::floor(bits * values_per_token * c / 8.0 + 1e-9); };
  auto bits_at = [&](size_t bytes, int c) { return 8.0 * static_cast<double>(bytes) / (values_per_token * c); };
  CalibAllocation out;
  out.n_ctx = n_ctx;
  const KvSpec cheap = label_kv(s0.k_types[ck] + "/" + s0.v_types[cv] + suffix, seed);
  for (int c : ctxs) {
    const size_t b = calib_bytes_held(mc, cheap, c);
    if (c == n_ctx) out.bits_cheapest = bits_at(b, c);
    TQ_CHECK(static_cast<double>(b) <= allowed_at(c),
             "--bits %g is below the cheapest candidates (K %s, V %s on every head): %.4f bits per value, everything "
             "counted at ctx %d", bits, s0.k_types[ck].c_str(), s0.v_types[cv].c_str(), bits_at(b, c), c);
  }
  // Bytes at c0 = fixed + g / 32 x (summed unit cost x scale); the fixed part (sinks, means,
  // scales) from the cheapest allocation first, then from each allocation that did not fit.
  const int64_t base_cost = scale_sum * (in.cost_k[ck] + in.cost_v[cv]);
  double fixed = static_cast<double>(calib_bytes_held(mc, cheap, c0)) - g * static_cast<double>(base_cost) / 32.0;
  int64_t cap = std::numeric_limits<int64_t>::max();
  for (int iter = 0; iter < 256; ++iter) {
    const int64_t want = static_cast<int64_t>(std::floor((allowed_at(c0) - fixed) * 32.0 / g + 1e-9));
    cap = std::max(base_cost, std::min(want, cap == std::numeric_limits<int64_t>::max() ? want : cap - 1));
    in.budget = cap;
    out.alloc = allocate_heads(in);
    const KvSpec kv = label_kv(out.alloc.label, seed);
    out.check_ctx.clear();
    out.check_bits.clear();
    double worst = 1;  // the largest bytes / allowed over the contexts
    bool first_over = false;
    for (int c : ctxs) {
      const size_t b = calib_bytes_held(mc, kv, c);
      out.check_ctx.push_back(c);
      out.check_bits.push_back(bits_at(b, c));
      if (c == n_ctx) {
        out.bytes_used = b;
        out.bits_all = bits_at(b, c);
      }
      worst = std::max(worst, static_cast<double>(b) / allowed_at(c));
      if (c == c0 && static_cast<double>(b) > allowed_at(c)) {
        first_over = true;
        fixed = static_cast<double>(b) - g * static_cast<double>(out.alloc.cost) / 32.0;
      }
    }
    if (worst <= 1) {
      if (ss.size() == 1) out.alloc.predicted_each = {out.alloc.predicted_kld};
      return out;
    }
    TQ_CHECK(cap > base_cost, "calibrate: no allocation fits %g bits per value", bits);
    // Over at a larger context only: shrink the cap by the overshoot (at least one unit).
    if (!first_over) cap = std::max(base_cost + 1, cap - std::max<int64_t>(0, static_cast<int64_t>(
                                                            std::ceil((cap - base_cost) * (1 - 1 / worst)))) + 1);
  }
  TQ_CHECK(false, "calibrate: no allocation within %g bits per value found", bits);
  return out;
}

void write_kv_config_file(const std::string& path, const std::vector<std::string>& comments,
                          const std::string& label) {
  std::string text;
  for (const auto& c : comments) text += "# " + c + "\n";
  std::istringstream words(label);
  std::string tok, head, entries;
  while (words >> tok) {
    if (tok.rfind("layers=", 0) == 0 || (tok.size() > 1 && tok[0] == 'L' && tok.find(':') != std::string::npos))
      entries += tok + "\n";
    else head += (head.empty() ? "" : " ") + tok;
  }
  text += head + "\n" + entries;
  atomic_write_file(path, text.data(), text.size());
}

}  // namespace tq
