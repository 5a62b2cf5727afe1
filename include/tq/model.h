// Decoder-only transformer forward pass (llama, qwen2, qwen3, gemma3) on top of tq::KvCache +
// tq::attention. One forward; what differs between the architectures is data (ArchTraits, one
// row per architecture, plus what the GGUF metadata and tensors say), following llama.cpp's
// llama-model.cpp / llama-graph.cpp:
//
// Per layer: h = rms(x) (attn_norm);  q, k, v = Wq h + bq, Wk h + bk, Wv h + bv (biases when the
//            file has them: qwen2); q, k = rms_head(q), rms_head(k) (QK-norm, per head over
//            head_dim: qwen3, gemma3); q, k = rope(q), rope(k); a = Wo attn(q, k, v);
//            a = rms(a) (post-attention norm: gemma3); x += a;
//            h = rms(x) (ffn_norm); f = Wd (act(Wg h) * Wu h), act = SiLU (llama, qwen) or
//            GELU-tanh (gemma3); f = rms(f) (post-FFN norm: gemma3); x += f.
// Input x = embedding row * embd_scale (sqrt(n_embd) for gemma3, else 1); logits =
// E_out rms(x) (E_out = token_embd when output.weight is absent: tied), optionally soft-capped.
// RoPE: llama.cpp's "normal" mode for llama (adjacent pairs (2i, 2i+1) rotate; GGUF converters
// permute Wq/Wk for it), "neox" mode for qwen2 / qwen3 / gemma3 (pairs (i, i + rope_dim/2));
// angle pos * freq_scale * base^(-2i/rope_dim) / ff[i] with freq_scale = 1 / rope.scaling.factor
// (linear scaling) and ff the rope_freqs.weight tensor (Llama 3 scaling, as llama.cpp reads it).
// Sliding-window layers (gemma3: every layer but each sixth) attend to the last
// sliding_window positions only and use RoPE base rope_base_swa (10000) with no scaling.
// Gemma's RMSNorm weights are stored in the GGUF with the +1 already added by the converter,
// so every norm here is y = x / rms(x) * w.
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

// What differs between the supported architectures, as data: one row per architecture
// (arch_traits), the rest read from the GGUF (see LlamaConfig).
struct ArchTraits {
  const char* name = "llama";
  bool rope_neox = false;     // RoPE pairs (i, i + rope_dim/2) instead of (2i, 2i+1)
  bool qk_norm = false;       // attn_q_norm / attn_k_norm (RMSNorm per head) before RoPE
  bool post_norms = false;    // post_attention_norm and post_ffw_norm before each residual add
  bool gelu = false;          // FFN gate GELU (tanh approximation) instead of SiLU
  bool embd_scale_sqrt = false;  // input embeddings times sqrt(n_embd)
  bool qkv_bias = false;      // attn_q/k/v.bias required (otherwise used when present)
  int swa_pattern = 0;        // > 0: layer l is sliding-window unless l % swa_pattern == swa_pattern - 1
  float rope_base_swa = 0;    // RoPE base of the sliding-window layers (0: the model's base)
};
// The supported architectures; nullptr for others.
const ArchTraits* arch_traits(const std::string& arch);
std::string supported_architectures();  // "llama, qwen2, qwen3, gemma3"

struct LlamaConfig {
  std::string arch = "llama";
  ArchTraits traits;
  int n_layers = 0;
  int n_embd = 0;
  int n_ff = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;           // key_length (= value_length) when present, else n_embd / n_heads
  int rope_dim = 0;
  int n_vocab = 0;
  int n_ctx_train = 0;
  float rope_base = 10000.0f;
  float rope_freq_scale = 1.0f;   // 1 / rope.scaling.factor (linear); 1 without scaling
  std::vector<float> rope_freq_factors;  // rope_freqs.weight (Llama 3 scaling): rope_dim / 2, empty: none
  float rms_eps = 1e-5f;
  float embd_scale = 1.0f;
  float attn_scale = 0;           // query scale (0: 1 / sqrt(head_dim))
  float final_softcap = 0;        // > 0: logits = c tanh(logits / c)
  int sliding_window = 0;         // > 0: the window of the sliding-window layers
  bool tied_output = false;
  int q_dim() const noexcept { return n_heads * head_dim; }
  bool layer_is_swa(int l) const noexcept {
    return sliding_window > 0 && traits.swa_pattern > 0 && l % traits.swa_pattern != traits.swa_pattern - 1;
  }
  float layer_rope_base(int l) const noexcept {
    return layer_is_swa(l) && traits.rope_base_swa > 0 ? traits.rope_base_swa : rope_base;
  }
  float layer_rope_scale(int l) const noexcept { return layer_is_swa(l) ? 1.0f : rope_freq_scale; }
};

// A cache config with this model shape (layers, kv heads, head_dim, RoPE) and max_tokens.
KvCacheConfig kv_config_for(const LlamaConfig& c, int max_tokens);


class LlamaModel {
 public:
  // Reads the architecture's metadata only (no tensor data): tq::Error naming the supported
  // architectures for another one, or on bad values. Lets a caller check a cache type against
  // head_dim before the weights load.
  static LlamaConfig read_config(const GgufFile& gguf);
  // Reads <arch>.* metadata and all weights: matrices of a type with a block kernel (F16, Q4_0,
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
  // The attention kernel (AttentionParams::kernel, tq/kv_cache.h; default fused).
  void set_attention_kernel(AttnKernel k) noexcept;
  AttnKernel attention_kernel() const noexcept;
  void set_ubatch(int n) noexcept;                 // prefill micro-batch (default 512)
  // true: dequantizes every block matrix to an f32 copy (538 MB more for SmolLM2-135M) and
  // every projection uses OpenBLAS on it, decode included (sgemv), as before the block
  // kernels; the tests' check of the block kernels. false (the default) drops the copies.
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
