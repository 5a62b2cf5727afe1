// Helpers shared by the LLM tests: paths of the fetched model/corpus, a tiny random llama.
#pragma once

#include <sys/stat.h>

#include <cstring>
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

// Random blocks of a type without a quantizer here (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K): n values
// (a multiple of the block size), random codes and sub-block scales, fp16 scales chosen so the
// values spread over about +-2 * scale (all zero for scale 0).
inline std::vector<uint8_t> random_blocks(tq::GgmlType t, size_t n, tq::Rng& r, float scale) {
  std::vector<uint8_t> b(tq::ggml_row_bytes(t, n));
  for (auto& v : b) v = static_cast<uint8_t>(r.next_u64());
  const size_t bs = static_cast<size_t>(tq::ggml_block_size(t)), bb = static_cast<size_t>(tq::ggml_block_bytes(t));
  auto put = [&](size_t at, float f) {
    const uint16_t h = tq::fp32_to_fp16(f);
    std::memcpy(b.data() + at, &h, 2);
  };
  auto jitter = [&] { return static_cast<float>(0.5 + r.uniform()); };
  for (size_t k = 0; k < n / bs; ++k) {
    const size_t at = k * bb;
    switch (t) {
      case tq::GgmlType::Q5_0: put(at, scale / 8 * jitter()); break;
      case tq::GgmlType::Q5_1: put(at, scale / 8 * jitter()); put(at + 2, -2 * scale * jitter()); break;
      case tq::GgmlType::Q4_K: put(at, 4 * scale / (15 * 48) * jitter()); put(at + 2, 2 * scale / 48 * jitter()); break;
      case tq::GgmlType::Q5_K: put(at, 4 * scale / (31 * 48) * jitter()); put(at + 2, 2 * scale / 48 * jitter()); break;
      case tq::GgmlType::Q6_K: put(at + 208, scale / (32 * 64) * jitter()); break;
      default: break;
    }
  }
  return b;
}

// n values of type t for a fixture: quantized from x when the type has a quantizer, else
// random blocks of about the same spread (random_blocks, scale = the spread of x).
inline std::vector<uint8_t> fixture_bytes(tq::GgmlType t, const std::vector<float>& x, tq::Rng& r, float scale) {
  if (tq::ggml_has_quantizer(t)) {
    std::vector<uint8_t> b(tq::ggml_row_bytes(t, x.size()));
    tq::quantize_row(t, x.data(), b.data(), x.size());
    return b;
  }
  return random_blocks(t, x.size(), r, scale);
}

// A random-weight llama GGUF (no tokenizer) with weights stored as `wtype` (types without a
// quantizer: random blocks, see fixture_bytes; their rows need n_embd and n_ff multiples of
// the block size, e.g. 256 for the K-quants). `type_of`, when given, picks the type of each
// matrix by tensor name instead (mixed files, like Gemma's Q5_0 / Q4_K / Q6_K / Q8_0).
inline tq::GgufWriter tiny_llama_gguf(const TinyLlama& c, tq::GgmlType wtype, uint64_t seed,
                                      tq::GgmlType (*type_of)(const std::string&) = nullptr) {
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
    if (type_of && t != tq::GgmlType::F32) t = type_of(name);
    if (tq::ggml_has_quantizer(t)) {
      w.add_tensor(name, ne, t, x.data());
    } else {
      const auto b = fixture_bytes(t, x, r, scale);
      w.add_tensor_raw(name, ne, t, b.data(), b.size());
    }
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
