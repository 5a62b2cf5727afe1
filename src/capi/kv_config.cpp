#include "capi/kv_config.h"

#include "tq/error.h"
#include "tq/eval.h"

namespace tq::capi {

KvSpec kv_options(const std::string& label) { return parse_kv_spec_or_file(label); }

KvCacheConfig kv_cache_config(const std::string& label, int n_layers, int n_kv_heads, int head_dim,
                              int max_tokens, float rope_base, int rope_dim, bool rope_neox) {
  return kv_cache_config(kv_options(label), label, n_layers, n_kv_heads, head_dim, max_tokens, rope_base, rope_dim,
                         rope_neox);
}

KvCacheConfig kv_cache_config(const KvSpec& kv, const std::string& label, int n_layers, int n_kv_heads,
                              int head_dim, int max_tokens, float rope_base, int rope_dim, bool rope_neox) {
  TQ_CHECK(n_layers >= 1 && n_kv_heads >= 1 && head_dim >= 1 && max_tokens >= 1,
           "kv cache: n_layers (%d), n_kv_heads (%d), head_dim (%d) and max_tokens (%d) must be >= 1",
           n_layers, n_kv_heads, head_dim, max_tokens);
  KvCacheConfig shape;
  shape.n_layers = n_layers;
  shape.n_kv_heads = n_kv_heads;
  shape.head_dim = head_dim;
  shape.max_tokens = max_tokens;
  shape.rope_base = rope_base;
  shape.rope_dim = rope_dim;
  shape.rope_neox = rope_neox;
  TQ_CHECK(rope_base > 0 || !kv.resolved().center_rope,
           "kv cache '%s': the K mean rotates with RoPE (center=...,rope, part of a tq K type's automatic "
           "protection), which needs the keys' RoPE: give rope_base and rope_dim, or add 'plain' (no "
           "automatic protection) or an explicit centring such as 'center=k' to the label",
           short_label(label).c_str());
  return kv.resolve(shape);
}

}  // namespace tq::capi
