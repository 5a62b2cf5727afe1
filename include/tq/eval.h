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

// Average stored bits per cached value (K and V, all layers, norms/scales counted).
double kv_bits_per_value(const LlamaModel& m, double bytes_per_token);

using ProgressFn = std::function<void(size_t done, size_t total)>;

struct PerplexityOptions {
  int n_ctx = 512;
  int n_chunks = 0;          // 0: as many as the text holds
  bool compare = false;      // also run the reference cache on the same tokens
  KvSpec kv;
  KvSpec ref;                // the reference (f16 by default)
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
  // With a reference: the KLD of each scored row position (row n_ctx/2 + i at i), summed over
  // the windows (divide by n_chunks for the mean); where in the window the loss sits.
  std::vector<double> kld_by_row;
};

// Perplexity over non-overlapping windows of n_ctx tokens; in each window the first half is
// context and tokens n_ctx/2 .. n_ctx-1 are scored (the llama.cpp `perplexity` convention).
PerplexityResult perplexity(const LlamaModel& m, const std::vector<int32_t>& tokens,
                            const PerplexityOptions& opt);
// Several cache configs on the same windows, sharing one reference pass per window (when
// opt.compare): results in the order of `configs` (opt.kv is ignored).
std::vector<PerplexityResult> perplexity_multi(const LlamaModel& m, const std::vector<int32_t>& tokens,
                                               const PerplexityOptions& opt,
                                               const std::vector<KvSpec>& configs);

struct NiahOptions {
  int context = 2048;
  std::vector<double> depths = {0.1, 0.5, 0.9};
  int trials = 2;
  KvSpec kv;
  uint64_t seed = 42;
  ProgressFn progress;
};
struct NiahTrial {
  double depth = 0;
  int trial = 0;
  std::string passphrase, answer;
  bool passed = false;
  // How sure the pass or miss was: the smallest, over the answer's tokens (" NNNNNN.") up to
  // the first one greedy decoding did not pick, of that token's logit minus the best other
  // logit. Negative for a miss; near 0 a coin flip. NaN when the digits came out on another
  // tokenization.
  double margin = 0;
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
// One trial's prompt, exactly `context` tokens: the model's BOS if its tokenizer asks for one
// (add_bos), `hay` from offset pick_offset(n) (n = the number of possible offsets) with the
// needle for `passphrase` at `depth` of the haystack, then the question. Throws when `hay` is
// too short.
std::vector<int32_t> niah_prompt(const Tokenizer& tok, const std::vector<int32_t>& hay, int context,
                                 double depth, const std::string& passphrase,
                                 const std::function<size_t(size_t)>& pick_offset);

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
                        int decode_tokens, const KvSpec& kv);

// Reads a whole text file (tq::Error when missing).
std::string read_text_file(const std::string& path);

}  // namespace tq
