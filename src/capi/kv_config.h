// The one place where the bindings (C API, Python) build a KvCacheConfig: a stand-alone
// cache of a given shape whose cache choice is a label parsed by the library
// (tq::KvSpec::parse, the syntax of `tq perplexity --kv-config`), mapped onto the config
// by KvSpec::resolve.
#pragma once

#include <string>

#include "tq/kv_cache.h"

#include "tq/kv_spec.h"

namespace tq::capi {

// A cache label (tq::KvSpec syntax), or "@PATH" for a cache config file
// (tq::read_kv_label_file), as `tq perplexity --sweep` takes them.
KvSpec kv_options(const std::string& label);

// rope_base / rope_dim: the keys' RoPE, needed by labels whose K mean rotates with RoPE ("cr",
// part of a tq K type's automatic protection); 0: none. rope_neox: the rotated pairs are
// (i, i + rope_dim / 2) (GPT-NeoX / Qwen / Gemma) rather than (2i, 2i + 1).
KvCacheConfig kv_cache_config(const std::string& label, int n_layers, int n_kv_heads, int head_dim,
                              int max_tokens, float rope_base = 0, int rope_dim = 0, bool rope_neox = false);
// The same for a label already parsed (`label`: its text, for messages).
KvCacheConfig kv_cache_config(const KvSpec& kv, const std::string& label, int n_layers, int n_kv_heads,
                              int head_dim, int max_tokens, float rope_base = 0, int rope_dim = 0,
                              bool rope_neox = false);

}  // namespace tq::capi
