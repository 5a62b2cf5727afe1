// Llama-family transformer forward pass on top of tq::KvCache + tq::attention.
//
// Per layer: x += Wo * attn(rope(Wq rms(x)), rope(Wk rms(x)), Wv rms(x));
//            x += Wd * (silu(Wg rms(x)) * Wu rms(x)); logits = E_out * rms(x).
// RoPE: llama.cpp's "normal" mode for the llama architecture (adjacent pairs (2i, 2i+1) of
// each head rotate by pos * base^(-2i/rope_dim)); GGUF converters permute Wq/Wk for it.
// Weights (F32/F16/BF16/Q4_0/Q4_1/Q8_0 in the file) are dequantized to f32 once at load for
// the prefill GEMMs (OpenBLAS sgemm); the matrices' GGUF blocks are kept too and calls with a
// few rows (<= 8: decode, one token's logits) read them with SIMD block kernels instead (BF16: no
// block kernel, OpenBLAS throughout). K and V are written to the cache (quantized on write)
// before attention reads them, in prefill too.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tq/kv_cache.h"

namespace tq {

class GgufFile;

struct LlamaConfig {
  std::string arch = "llama";
  int n_layers = 0;
  int n_embd = 0;
  int n_ff = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int rope_dim = 0;
  int n_vocab = 0;
  int n_ctx_train = 0;
  float rope_base = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied_output = false;
};

enum class AttentionImpl { Fused, Reference };  // tq::attention vs tq::attention_ref

class LlamaModel {
 public:
  // Reads llama.* metadata and all weights: matrices of a type with a block kernel (F16, Q4_0,
  // Q4_1, Q8_0) keep their GGUF bytes, F32 and BF16 tensors are held as f32. tq::Error on any
  // mismatch.
  static LlamaModel load(const GgufFile& gguf);
  LlamaModel(LlamaModel&&) noexcept;
  LlamaModel& operator=(LlamaModel&&) noexcept;
  ~LlamaModel();

  const LlamaConfig& config() const noexcept;
  // Weight bytes held in memory: GGUF blocks, f32 tensors and, while f32 decode is on, the
  // f32 copies of the block matrices.
  size_t weight_bytes() const noexcept;
  // The GGUF block part of weight_bytes() (0 when every matrix is F32 / BF16).
  size_t block_weight_bytes() const noexcept;
  // A cache config with this model's shape (layers, kv heads, head_dim) and max_tokens.
  KvCacheConfig kv_config(int max_tokens) const;

  void set_threads(int n_threads);                 // OpenMP + OpenBLAS; 0 = all cores
  int threads() const noexcept;
  void set_attention_impl(AttentionImpl a) noexcept;
  // AttentionParams::exact / lut8 for the fused kernels (see tq/kv_cache.h).
  void set_attention_exact(bool exact) noexcept;
  void set_attention_lut8(bool lut8) noexcept;
  void set_ubatch(int n) noexcept;                 // prefill micro-batch (default 512)
  // true: dequantizes every block matrix to an f32 copy (538 MB more for SmolLM2-135M) and
  // every projection uses OpenBLAS on it, decode included (sgemv), as before the block
  // kernels; for A/B comparisons. false drops the copies. Default at load: the environment
  // variable TQ_F32_DECODE (set and not "0": true).
  void set_f32_decode(bool on);
  bool f32_decode() const noexcept;

  // Process n tokens at positions cache.n_tokens(0) ... (appends their K/V to the cache).
  // hidden_out (optional): n * n_embd final-normed hidden states, for logits().
  void forward(KvCache& cache, const int32_t* tokens, int n, float* hidden_out) const;
  // One decode step of n_seqs sequences at once: token i is appended to caches[i] (at its
  // position caches[i]->n_tokens(0)); the same per-layer code as forward(), with each weight
  // matrix read once for all rows. hidden_out (optional): n_seqs * n_embd final-normed hidden
  // states. The caches must be distinct.
  void forward_batch(KvCache* const* caches, const int32_t* tokens, int n_seqs, float* hidden_out) const;
  // logits (n * n_vocab) from final hidden states.
  void logits(const float* hidden, int n, float* out) const;
  // forward() then the logits of the last token only.
  std::vector<float> forward_last(KvCache& cache, const std::vector<int32_t>& tokens) const;

  struct Impl;
 private:
  LlamaModel();
  std::unique_ptr<Impl> impl_;
};

// Sampling: temperature <= 0 is greedy (argmax, lowest id on ties); otherwise softmax at the
// temperature, keep the smallest set of tokens with mass >= top_p, draw with the seeded Rng.
struct SamplerParams {
  float temperature = 0.0f;
  float top_p = 0.95f;
  int top_k = 0;        // 0: off
  uint64_t seed = 1;
};
class Sampler {
 public:
  explicit Sampler(const SamplerParams& p);
  ~Sampler();
  int32_t sample(const float* logits, int n_vocab);
 private:
  SamplerParams p_;
  struct State;
  std::unique_ptr<State> st_;
};
int32_t argmax(const float* x, int n) noexcept;
// log-softmax of x (n values) into out; returns log-sum-exp.
double log_softmax(const float* x, int n, float* out) noexcept;

}  // namespace tq
