// Helpers shared by the LLM tests: paths of the fetched model/corpus, a tiny random llama.
#pragma once

#include <sys/stat.h>

#include <string>
#include <vector>

#include "tq/common.h"
#include "tq/gguf.h"

namespace tq_test {

inline std::string source_path(const std::string& rel) { return std::string(TQ_SOURCE_DIR) + "/" + rel; }
inline bool file_exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}
inline std::string real_model_path() { return source_path("models/SmolLM2-135M-Instruct.Q4_1.gguf"); }
inline std::string corpus_path() { return source_path("data/debian-reference.en.txt"); }

struct TinyLlama {
  int n_layers = 2, n_embd = 64, n_heads = 4, n_kv_heads = 2, n_ff = 96, n_vocab = 61, rope_dim = 16;
  float rope_base = 10000.0f, eps = 1e-5f;
  bool tied = true;
};

inline std::vector<float> randn(size_t n, tq::Rng& r, float scale, float offset = 0.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = offset + scale * static_cast<float>(r.normal());
  return v;
}

// A random-weight llama GGUF (no tokenizer) with weights stored as `wtype`.
inline tq::GgufWriter tiny_llama_gguf(const TinyLlama& c, tq::GgmlType wtype, uint64_t seed) {
  tq::Rng r(seed);
  tq::GgufWriter w(3);
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", c.n_layers);
  w.set_u32("llama.embedding_length", c.n_embd);
  w.set_u32("llama.feed_forward_length", c.n_ff);
  w.set_u32("llama.attention.head_count", c.n_heads);
  w.set_u32("llama.attention.head_count_kv", c.n_kv_heads);
  w.set_u32("llama.rope.dimension_count", c.rope_dim);
  w.set_f32("llama.rope.freq_base", c.rope_base);
  w.set_f32("llama.attention.layer_norm_rms_epsilon", c.eps);
  w.set_u32("llama.context_length", 256);
  const uint64_t E = c.n_embd, F = c.n_ff, KV = c.n_kv_heads * (c.n_embd / c.n_heads), V = c.n_vocab;
  auto add = [&](const std::string& name, std::vector<uint64_t> ne, float scale, float offset, tq::GgmlType t) {
    size_t n = 1;
    for (auto d : ne) n *= d;
    auto x = randn(n, r, scale, offset);
    w.add_tensor(name, ne, t, x.data());
  };
  add("token_embd.weight", {E, V}, 0.5f, 0, wtype);
  add("output_norm.weight", {E}, 0.1f, 1.0f, tq::GgmlType::F32);
  if (!c.tied) add("output.weight", {E, V}, 0.3f, 0, wtype);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {E}, 0.1f, 1.0f, tq::GgmlType::F32);
    add(p + "attn_q.weight", {E, E}, 0.3f, 0, wtype);
    add(p + "attn_k.weight", {E, KV}, 0.3f, 0, wtype);
    add(p + "attn_v.weight", {E, KV}, 0.3f, 0, wtype);
    add(p + "attn_output.weight", {E, E}, 0.1f, 0, wtype);
    add(p + "ffn_norm.weight", {E}, 0.1f, 1.0f, tq::GgmlType::F32);
    add(p + "ffn_gate.weight", {E, F}, 0.2f, 0, wtype);
    add(p + "ffn_up.weight", {E, F}, 0.2f, 0, wtype);
    add(p + "ffn_down.weight", {F, E}, 0.1f, 0, wtype);
  }
  return w;
}

}  // namespace tq_test
