#include "capi/kv_config.h"

#include "tq/error.h"
#include "tq/eval.h"

namespace tq::capi {

KvOptions kv_options(const std::string& label) {
  if (!label.empty() && label[0] == '@') return parse_kv_label(read_kv_label_file(label.substr(1)));
  return parse_kv_label(label);
}

KvCacheConfig kv_cache_config(const std::string& label, int n_layers, int n_kv_heads, int head_dim,
                              int max_tokens, float rope_base, int rope_dim) {
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
  const KvOptions kv = kv_options(label);
  TQ_CHECK(rope_base > 0 || !kv.resolved().center_rope,
           "kv cache '%s': the K mean rotates with RoPE (label 'cr', part of a tq K type's automatic "
           "protection), which needs the keys' RoPE: give rope_base and rope_dim, or add 'plain' (no "
           "automatic protection) or an explicit centring such as 'ck' to the label",
           short_label(label).c_str());
  return make_kv_config(shape, kv);
}

}  // namespace tq::capi
