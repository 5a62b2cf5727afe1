// Helpers shared by the KV cache tests (test_kv_cache.cpp, test_kv_quality.cpp).
#pragma once

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "tq/kv_cache.h"
#include "tq/kv_spec.h"

namespace tq_test {

// ||a - b|| / ||b|| (or ||a - b|| when b is zero).
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double)(a[i] - b[i]) * (a[i] - b[i]);
    den += (double)b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// A cache config with the shape and the K / V types set, everything else default.
inline tq::KvCacheConfig kv_config(int n_layers, int n_kv_heads, int head_dim, int max_tokens,
                                   const std::string& type_k, const std::string& type_v) {
  tq::KvCacheConfig cfg;
  cfg.n_layers = n_layers;
  cfg.n_kv_heads = n_kv_heads;
  cfg.head_dim = head_dim;
  cfg.max_tokens = max_tokens;
  cfg.type_k = tq::parse_kv_format(type_k);
  cfg.type_v = tq::parse_kv_format(type_v);
  return cfg;
}

// K centred by a RoPE-rotating mean over all head_dim dimensions, with `sink` tokens kept exact.
inline void rope_centred_k(tq::KvCacheConfig& cfg, float rope_base, int sink) {
  cfg.center_k = cfg.center_rope = true;
  cfg.rope_base = rope_base;
  cfg.rope_dim = cfg.head_dim;
  cfg.sink = sink;
}

// Per-layer / per-head types from names ("": not set), and back.
inline std::vector<std::optional<tq::KvFormat>> formats(const std::vector<std::string>& names) {
  std::vector<std::optional<tq::KvFormat>> r;
  for (const std::string& n : names) r.push_back(n.empty() ? std::nullopt : std::optional(tq::parse_kv_format(n)));
  return r;
}
inline std::vector<std::string> names(const std::vector<std::optional<tq::KvFormat>>& f) {
  std::vector<std::string> r;
  for (const auto& x : f) r.push_back(x ? tq::kv_format_name(*x) : "");
  return r;
}

}  // namespace tq_test
