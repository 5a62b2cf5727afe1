// Quantized KV cache for transformer inference (contract used by src/llm; implemented in
// src/kv). One table of formats (kv_types), each selectable independently for K and V.
//
// Data layout handed in and out: for one layer, k/v are n_tokens * n_kv_heads * head_dim
// floats, token-major then head (exactly what a fused QKV projection produces after RoPE).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tq {

// Cache element formats: one row of the traits table (kv_types()) per format, indexed by
// KvFormat; `tq kv-types [--json]` prints it.
enum class KvFormat : uint8_t {
  f32, f16, q8_0, q4_0, q8_0h, q4_0h,
  tq1, tq2, tq3, tq4, tq5, tq6, tq7, tq8,
  tq2h3, tq3h4, tq2h4, tq2h5, tq3h5, tq3h6, tq4h5, tq4h6,
  tq2h6n8, tq2h4n8, tq2h5n8, tq3h4n8, tq3h5n8, tq3h6n8, tq4h5n8, tq4h6n8,
  tq2n8, tq3n8, tq4n8, tq5n8,
  count
};
// How a 32-token block is laid out (kv_internal.h, docs/design.md "Storage layout").
enum class KvLayout : uint8_t {
  f32,       // rows of binary32
  f16,       // binary16: K blocks dim-major, V rows
  q8_0,      // ggml q8_0 rows (fp16 scale per 32 values)
  q4_0,      // ggml q4_0 rows
  tq,        // [32 fp16 norms][bit-plane tiles of one mse part]
  tq_split,  // two mse parts (D/4 selected channels, 3D/4 others), each its norms and tiles
  tq_n8,     // tq with 8-bit log-coded norms ([int16 exponent][32 codes] per block)
};
// The scale stored with a part.
enum class KvNorm : uint8_t {
  none,        // f32 / f16 values
  fp16_per32,  // one fp16 scale per 32 values (ggml blocks)
  fp16,        // one fp16 norm per token and part
  log8,        // one 8-bit log-coded norm per token and part + one int16 exponent per block
};
// Which channels a split layout's first part takes (frozen at the stream's first quantized token).
enum class KvChannels : uint8_t {
  all,             // one part: every channel
  query_weighted,  // the D/8 RoPE pairs of largest K energy x query energy (observe_queries)
};
// Decode kernels that can read a format (bit mask): rows = dequantized rows then float
// attention (every format), f16 / tq-float / tq-lut8 = the fused kernels (attention_kernel()).
enum KvKernelBits : uint8_t {
  kKvKernelRows = 1, kKvKernelF16 = 2, kKvKernelTqFloat = 4, kKvKernelTqLut8 = 8,
};
struct KvPart {
  uint8_t bits = 0;      // bits per value (index bits for codebook parts)
  uint8_t quarters = 0;  // channels: quarters * head_dim / 4
  KvNorm norm = KvNorm::none;
};
struct KvTypeTraits {
  KvFormat id;
  const char* name;
  KvLayout layout;
  bool rotated;            // stored in a rotated domain: Q rotated, output inverse-rotated
  int n_parts;
  KvPart parts[2];         // tq_split: selected channels, then the rest
  KvChannels channels;
  int dim_multiple;        // head_dim: a multiple of this in [16, 1024]
  uint8_t kernels_k;       // KvKernelBits reading it as K
  uint8_t kernels_v;       // ... as V
  const char* desc;

  // Bytes of one token (norms/scales included), and of a 32-token block (+ its log8 exponents).
  size_t row_bytes(int head_dim) const noexcept;
  size_t block_bytes(int head_dim) const noexcept;
  bool supports(int head_dim) const noexcept;
  bool log8_norms() const noexcept { return parts[0].norm == KvNorm::log8; }
  // TurboQuant codes (tq, tq_split, tq_n8: mse parts on bit-plane tiles): the types the
  // automatic protection, K scaling and trellis codes are for.
  bool turboquant() const noexcept { return layout >= KvLayout::tq; }
  // Not kept as floats (centring applies).
  bool quantized() const noexcept { return layout != KvLayout::f32 && layout != KvLayout::f16; }
};
struct KvType {
  uint8_t id = 0;  // index into the format table (== KvFormat)
  bool operator==(const KvType& o) const noexcept { return id == o.id; }
  bool operator!=(const KvType& o) const noexcept { return id != o.id; }
};
// The table, in KvFormat order.
const std::vector<KvTypeTraits>& kv_types();
const KvTypeTraits& kv_type_traits(KvType t);
inline KvType kv_type(KvFormat f) { return KvType{(uint8_t)f}; }
// Unknown: tq::Error listing the valid names; a removed one (tq3p, tq2.5, ...): tq::Error saying
// what to use instead.
KvType parse_kv_type(const std::string& name);
// The row of a name, or nullptr when no format has it.
const KvTypeTraits* find_kv_type(const std::string& name) noexcept;
std::string kv_type_name(KvType t);
std::vector<std::string> kv_type_names();
const char* kv_layout_name(KvLayout l);
const char* kv_norm_name(KvNorm n);
const char* kv_channels_name(KvChannels c);
KvType kv_f16();
// Bytes to store one head vector of head_dim values in format t (norms/scales included);
// throws tq::Error when the type does not support head_dim.
size_t kv_type_bytes(KvType t, int head_dim);

struct KvCacheConfig {
  int n_layers = 1;
  int n_kv_heads = 1;
  int head_dim = 128;
  int max_tokens = 4096;          // capacity; appending past it is a tq::Error
  // Element formats (names are parsed at the edges: KvSpec, CLI, bindings, files).
  KvFormat type_k = KvFormat::f16;
  KvFormat type_v = KvFormat::f16;
  int window = 0;                 // most recent tokens kept in f16, quantized on leaving
  // Sliding-window layers: empty, or n_layers entries; layer_window[l] > 0 means layer l's
  // queries see only their last layer_window[l] positions (AttentionParams::sliding_window),
  // so the cache drops that layer's quantized blocks once no later query can see them: each
  // append first drops the blocks wholly before (tokens held - layer_window[l] + 1). What is
  // held stays near the window plus one append (bytes_used counts only that); attention that
  // would need a dropped token is a tq::Error.
  std::vector<int> layer_window;
  int sink = 0;                   // first tokens of every stream kept in f16 for good
                                  // (attention sinks); never quantized
  // Per-stream mean centring: quantize x - mu with mu (per layer, kv head, side; D values,
  // fp16-rounded, counted in bytes_used) chosen online when the stream's first token is
  // quantized: the mean of every token the stream has seen then (sink, window and the batch
  // being appended) except position 0; mu = 0 when position 0 is all it has seen.
  bool center_k = false;
  bool center_v = false;
  // > 0 (a multiple of 32, at most 2048): one mean per segment of this many quantized tokens.
  // Segment 0 uses the rule above; segment g >= 1 uses the mean of segment g - 1's tokens
  // (always fully seen before g starts: the same in prefill and token-by-token decode).
  int center_segment = 0;
  // With center_k: the K mean rotates with RoPE. mu is then the mean of the keys un-rotated
  // to position 0 (R(pos)^-1 k, pos = the token's index in the cache), and token pos stores
  // codes of k - R(pos) mu, so a constant pre-RoPE component of the keys (which RoPE spins
  // at its pair's frequency, out of reach of a constant mean) is removed too, except in the
  // pairs that turn by more than 1 radian across a 32-token block without being among the 8
  // fastest (their mean stays 0: the kernels turn it per block). Needs rope_base.
  bool center_rope = false;
  // The keys' RoPE as the model applies it: pair i < rope_dim / 2 (normal mode: dims 2i and
  // 2i + 1; rope_neox: i and i + rope_dim / 2) turned by pos * w_i(l) in layer l, with
  //   w_i(l) = base(l)^(-2i / rope_dim) * scale(l) / rope_freq_factors[i],
  // base(l) = layer_rope_base[l] (0 or empty: rope_base), scale(l) = layer_rope_scale[l]
  // (0 or empty: 1), the factor 1 where rope_freq_factors is empty. center_rope turns each
  // layer's K mean at that layer's w_i; scale_k gives each pair one weight. Both work on pairs
  // at (2i, 2i + 1): with rope_neox and either of them on, the cache permutes every K row and
  // query it is given to that order on entry (the same permutation for both: q.k and the
  // attention output are unchanged; only the quantized domain changes).
  float rope_base = 0;
  int rope_dim = 0;
  bool rope_neox = false;
  std::vector<float> layer_rope_base;    // empty or n_layers (Gemma 3: 1e4 windowed, 1e6 global)
  std::vector<float> layer_rope_scale;   // empty or n_layers: 1 / linear scaling factor
  std::vector<float> rope_freq_factors;  // empty or rope_dim / 2 (Llama 3 rope_freqs), each > 0
  // Query-weighted K scaling (K of the tq types: tqB, tqBn8, tqBhH): each stream
  // quantizes w * (k - mu) and divides the queries by w, w one weight per RoPE channel pair
  // (as rope_neox above says) chosen online when its first token is quantized: w^4 proportional to (query
  // energy of the KV head's query group) / (centred K energy) over the tokens seen then
  // (position 0 left out; queries from observe_queries; the exponent shrunk by n / (n + 16)
  // for n tokens seen), clamped to 1/4..4x their geometric mean and normalized to keep the K
  // energy. This minimizes the q.k error of an isotropic quantizer (Cauchy-Schwarz); q.k
  // itself is unchanged. No queries seen: no scaling. Other types: ignored.
  bool scale_k = false;
  // Trellis-coded codes (tq types, every part of 1-4 bits; include/tq/trellis.h): the same
  // bytes, the codes of a token chosen together by a Viterbi search over a 256-entry window
  // table, ~30% less squared error than the scalar Lloyd-Max code. Costs write time (the
  // search) and some attention time (the float kernel, with 8+ float lanes, gathers every
  // value; lut8 looks up 256-entry byte tables with two vpermi2b instead of one vpshufb).
  bool trellis = false;
  int boundary_layers = 0;        // first and last N layers use the boundary types
  KvFormat boundary_type_k = KvFormat::f16;
  KvFormat boundary_type_v = KvFormat::f16;
  // Per-layer types, applied after the boundary rule: layer l uses layer_type_k[l] /
  // layer_type_v[l] where that entry is set. Each vector is empty or n_layers long.
  std::vector<std::optional<KvFormat>> layer_type_k, layer_type_v;
  // Per-stream types, applied after the per-layer ones: KV head h of layer l uses
  // head_type_k[l * n_kv_heads + h] (V: head_type_v) where that entry is set. Each vector is
  // empty or n_layers * n_kv_heads long.
  std::vector<std::optional<KvFormat>> head_type_k, head_type_v;
  uint64_t seed = 0x5eed;         // rotations
};

class KvCache {
 public:
  explicit KvCache(const KvCacheConfig& cfg);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheConfig& config() const noexcept;
  // Append n_tokens tokens to one layer (quantized on write, or into the f16 window).
  // k, v: n_tokens * n_kv_heads * head_dim floats. n_threads > 1: appends of 16+ tokens
  // encode the layer's streams (K and V of each kv head) on up to that many OpenMP threads;
  // the stored bytes do not depend on it. Not safe to call concurrently on one cache, even
  // for different layers (the layers share the RoPE angle table of the current append).
  void append(int layer, int n_tokens, const float* k, const float* v, int n_threads = 1);
  // Query statistics for the query-weighted types (tq2h4, tq3h5, ...: their high-precision
  // channels are chosen by K energy times query energy) and for scale_k: call with the
  // queries of the tokens about to be appended to this layer (q: n_tokens * n_heads *
  // head_dim, heads grouped as in attention()), before append(). Counted until a stream's
  // channels are frozen (its first quantized token); a no-op for every other stream.
  void observe_queries(int layer, int n_tokens, const float* q, int n_heads);
  int n_tokens(int layer) const;
  void clear();  // drop all tokens, keep allocations
  // Exact storage cost of one token over all layers, K and V, norms/scales included,
  // as it will be once it has left the window (the window's and sinks' f16 rows and the
  // centring means are reported apart: see bytes_used).
  double bytes_per_token() const;
  // Everything held now: quantized rows, f16 window and sink rows, outlier channel masks,
  // centring means.
  size_t bytes_used() const;

  struct Impl;
  Impl& impl() noexcept { return *impl_; }
  const Impl& impl() const noexcept { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Which kernel attention() runs: the one choice, set by the caller (the model commands: --attn,
// else the environment variable TQ_ATTN, else fused; attn_kernel_from_env).
enum class AttnKernel : uint8_t {
  reference,  // attention_ref: every cached row dequantized, then exact attention (the oracle)
  fused,      // the fused kernels, float arithmetic from the codes (default): equal to
              // attention_ref up to float summation order (tested <= 1e-5 relative)
  lut8,       // tq K and V of <= 6 bits: int8 lookup tables for Q.K and uint8 softmax weights
              // for V (AVX-512 VNNI/VBMI/VBMI2 at the avx3_dl level): faster decode at about 2e-2
              // relative error vs attention_ref (docs/design.md); fused where it cannot run
};
const char* attn_kernel_name(AttnKernel k);  // "reference", "fused", "lut8"
// A name as attn_kernel_name spells it; anything else: tq::Error listing the three.
AttnKernel parse_attn_kernel(const std::string& name);
// TQ_ATTN when it is set and not empty (parse_attn_kernel; a bad value is a tq::Error), else
// `fallback`.
AttnKernel attn_kernel_from_env(AttnKernel fallback = AttnKernel::fused);

struct AttentionParams {
  int n_heads = 1;        // query heads; a multiple of n_kv_heads (GQA)
  float scale = 0;        // 0: 1/sqrt(head_dim)
  int pos0 = -1;          // absolute position of the first query; -1: n_tokens - n_q
  int n_threads = 0;      // 0: OpenMP default
  AttnKernel kernel = AttnKernel::fused;
  // > 0: sliding-window attention (gemma3's local layers): the query at position p sees only
  // the cache tokens max(0, p - sliding_window + 1) .. p (sinks included: outside the window
  // they are not seen). 0: every token up to p.
  int sliding_window = 0;
};

// Causal attention of n_q queries against one layer of the cache: query i (at absolute
// position pos0 + i) attends to cache tokens 0..pos0+i (with p.sliding_window = W > 0:
// max(0, pos0+i-W+1)..pos0+i). q, out: n_q * n_heads * head_dim. Runs p.kernel
// (AttnKernel::reference: attention_ref).
void attention(const KvCache& cache, int layer, int n_q, const float* q, float* out,
               const AttentionParams& p);
// The decode kernel attention() runs over the quantized tokens of this layer with these
// params at the current SIMD level: "f16", "tq-float", "tq-lut8" (fused kernels), "rows"
// (rows dequantized to float, then float attention) or "reference" (attention_ref); when the
// layer's KV heads have types that run different kernels (per-head types), the distinct names
// in head order joined by '+', e.g. "tq-float+f16".
std::string attention_kernel(const KvCache& cache, int layer, const AttentionParams& p);
// Reference: dequantize every cached row, then exact f32 attention. The test oracle.
void attention_ref(const KvCache& cache, int layer, int n_q, const float* q, float* out,
                   const AttentionParams& p);

}  // namespace tq
