// Evaluation harness for a Llama model on a quantized KV cache: perplexity (with an f16
// reference run on the same tokens for KLD / top-1 agreement), needle-in-a-haystack, and
// prefill/decode speed. Used by `tq perplexity`, `tq niah`, `tq bench model` and the tests.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tq/kv_cache.h"
#include "tq/kv_spec.h"
#include "tq/model.h"

namespace tq {

class Tokenizer;

// Cache choice as the CLI spells it (-ctk, -ctv, --kv-window, --kv-boundary-layers, ...).
struct KvOptions {
  std::string type_k = "f16";
  std::string type_v = "f16";
  int window = 0;
  // Automatic protection: a tq K type with neither a sink nor centring given (and not `plain`)
  // gets kAutoSink f16 sink token and K centring, one mean per center_segment tokens if given,
  // else per kAutoSegment, the means rotating with RoPE (center_rope) (resolved()).
  int sink = -1;             // --kv-sink: first tokens kept in f16 (-1: not given)
  bool center_k = false;     // --kv-center k|v|kv|none: per-stream mean centring
  bool center_v = false;
  bool center_set = false;   // centring given (--kv-center, label ck/cv/ckv/c0)
  int center_segment = -1;   // --kv-center-segment: one mean per N quantized tokens (label csN; -1: not given)
  bool plain = false;        // --kv-plain (label "plain"): no automatic protection
  bool scale_k = false;      // --kv-scale-k: query-weighted K scaling (label ks)
  bool trellis = false;      // --kv-trellis: trellis-coded tq codes (label tc)
  bool center_rope = false;  // --kv-center-rope: the K mean rotates with RoPE (label cr)
  int boundary_layers = 0;
  std::string boundary_type_k = "f16";
  std::string boundary_type_v = "f16";
  // --kv-layer-type: "LAYERS:K[/V]" each, LAYERS a comma list of layers and ranges ("0,3,10-12");
  // applied in order after the boundary rule (label "L0,3,10-12:tq6/tq3").
  std::vector<std::string> layer_types;
  uint64_t seed = 0x5eed;
  static constexpr int kAutoSink = 1;
  static constexpr int kAutoSegment = 512;
  // True when the automatic protection applies (tq K type, no sink or centring given, not plain).
  bool auto_protected() const;
  // A copy with the defaults filled in: sink, centring and segment as they will run.
  KvOptions resolved() const;
  // Of resolved(), e.g. "tq4/tq3 w128 s4 ckv b2:f16 L5:tq6"; "tq3 plain" for a tq K type
  // run without the automatic protection (so that the label parses back to the same cache).
  std::string label() const;
};
// Parses a label as written by KvOptions::label():
// "K[/V] [wN] [sN] [ck|cv|ckv|c0] [csN] [cr] [ks] [tc] [plain] [bN:T[/T]] [LLAYERS:T[/T]]...".
// A removed form (ck:N) or type (tq3p, ...) is a tq::Error saying what to use instead.
KvOptions parse_kv_label(const std::string& label);
KvCacheConfig make_kv_config(const LlamaModel& m, const KvOptions& kv, int max_tokens);
// The same from the model's config alone (LlamaModel::read_config: before the weights load).
KvCacheConfig make_kv_config(const LlamaConfig& mc, const KvOptions& kv, int max_tokens);
// The same on a cache of any shape: `shape` gives n_layers, n_kv_heads, head_dim, max_tokens
// (and rope_base / rope_dim for center_rope); the cache choice comes from `kv` (the C API and
// the Python bindings build stand-alone caches from a label this way).
KvCacheConfig make_kv_config(const KvCacheConfig& shape, const KvOptions& kv);
// Expands --kv-layer-type specs ("LAYERS:K[/V]", LAYERS e.g. "0,3,10-12,5.1") onto
// cfg.layer_type_k / layer_type_v (cfg.n_layers entries) and, for LAYER.HEAD items (one KV
// head), cfg.head_type_k / head_type_v (n_layers * n_kv_heads; they win over whole-layer
// entries); a bad layer list, an out-of-range layer or head or an unknown type throws.
void apply_layer_types(const std::vector<std::string>& specs, KvCacheConfig& cfg);
// Average stored bits per cached value (K and V, all layers, norms/scales counted).
double kv_bits_per_value(const LlamaModel& m, double bytes_per_token);

using ProgressFn = std::function<void(size_t done, size_t total)>;

struct PerplexityOptions {
  int n_ctx = 512;
  int n_chunks = 0;          // 0: as many as the text holds
  bool compare = false;      // also run the reference cache on the same tokens
  KvOptions kv;
  KvOptions ref;             // the reference (f16 by default)
  ProgressFn progress;
};

struct PerplexityResult {
  int n_ctx = 0;
  int n_chunks = 0;
  size_t n_scored = 0;       // tokens scored: the second half of every chunk (llama.cpp style)
  double ppl = 0, ppl_ref = 0;
  double kld_mean = 0;       // mean over scored tokens of KL(P_ref || P_ours), nats
  double kld_p99 = 0;
  double top1_agreement = 0; // fraction of scored tokens where both argmaxes agree
  double kv_bytes_per_token = 0, kv_bytes_per_token_ref = 0;
  double bits_per_value = 0;   // from bytes_per_token (a token's cost once quantized)
  // Everything counted: bytes_used() of the cache holding a full window of n_ctx tokens
  // (f16 sinks and window rows, centring means, channel masks included) per cached value.
  double bits_per_value_all = 0;
  size_t kv_bytes_used = 0;    // bytes_used() at that point
  double seconds = 0;
  std::vector<double> chunk_ppl;
  std::vector<int32_t> top1;  // argmax of every scored row, in order (for outside references)
};

// Perplexity over non-overlapping windows of n_ctx tokens; in each window the first half is
// context and tokens n_ctx/2 .. n_ctx-1 are scored (the llama.cpp `perplexity` convention).
PerplexityResult perplexity(const LlamaModel& m, const std::vector<int32_t>& tokens,
                            const PerplexityOptions& opt);
// Several cache configs on the same windows, sharing one reference pass per window (when
// opt.compare): results in the order of `configs` (opt.kv is ignored).
std::vector<PerplexityResult> perplexity_multi(const LlamaModel& m, const std::vector<int32_t>& tokens,
                                               const PerplexityOptions& opt,
                                               const std::vector<KvOptions>& configs);

struct NiahOptions {
  int context = 2048;
  std::vector<double> depths = {0.1, 0.5, 0.9};
  int trials = 2;
  KvOptions kv;
  uint64_t seed = 42;
  ProgressFn progress;
};
struct NiahTrial {
  double depth = 0;
  int trial = 0;
  std::string passphrase, answer;
  bool passed = false;
};
struct NiahResult {
  int trials = 0, passed = 0;
  std::vector<NiahTrial> details;
  double seconds = 0;
};
// Haystack from `corpus` (random offset per trial), the needle " The secret number of the blue
// dragon is NNNNNN. " at the depth, then "\n\nThe secret number of the blue dragon is" and
// greedy decoding must reproduce the six random digits.
NiahResult niah(const LlamaModel& m, const Tokenizer& tok, const std::string& corpus,
                const NiahOptions& opt);

struct SpeedResult {
  int context = 0;
  double prefill_tok_s = 0;   // prefill of `context` tokens
  double decode_tok_s = 0;    // decode steps right after it
  int decode_tokens = 0;
  double kv_bytes = 0;        // cache bytes held at the end (KvCache::bytes_used)
  double kv_bytes_per_token = 0;  // KvCache::bytes_per_token: one token in every layer
  int kv_tokens = 0;          // tokens appended: context + decode_tokens
};
SpeedResult bench_speed(const LlamaModel& m, const std::vector<int32_t>& tokens, int context,
                        int decode_tokens, const KvOptions& kv);

// Reads a whole text file (tq::Error when missing).
std::string read_text_file(const std::string& path);

}  // namespace tq
