// Shared options and loading for the model subcommands (generate, perplexity, niah,
// bench model): llama.cpp-style flags -m -t -c -ctk -ctv plus window / boundary options.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <vector>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "cli.h"
#include "llm/qmatvec.h"
#include "tq/error.h"
#include "tq/eval.h"
#include "tq/gguf.h"
#include "tq/model.h"
#include "tq/simd.h"
#include "tq/tokenizer.h"

namespace tq::cli {

inline const char* kDefaultModel = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
inline const char* kDefaultCorpus = "data/debian-reference.en.txt";

struct ModelOpts {
  std::string model;
  int threads = 0;
  int ctx = 0;
  bool json = false;
  std::string attn;  // --attn or one of its aliases; empty: TQ_ATTN, else fused
  // The cache: the --kv-config label and the -ctk / --kv-* flags as tokens of the KvSpec
  // grammar (kv_label, in the order CLI11 applies them), parsed into `kv` after each one.
  KvSpec kv;
  std::string kv_label;
  bool kv_plain = false;            // --kv-plain (also applied to --sweep / --caches entries)
  std::optional<uint64_t> kv_seed;  // --kv-seed (likewise)
  // The attention kernel: the one choice (--attn, else the environment variable TQ_ATTN, else fused).
  AttnKernel kernel() const { return attn.empty() ? attn_kernel_from_env() : parse_attn_kernel(attn); }
};

// A flag or option that was removed: giving it is a one-line error saying what to use instead
// (hidden from --help). takes_value: it took a value (the error comes before the value is read).
inline void add_removed_opt(CLI::App* s, const std::string& name, bool takes_value, const std::string& why) {
  const std::string msg = name + ": " + why;
  if (takes_value)
    s->add_option_function<std::string>(name, [msg](const std::string&) { throw Error(msg); })->group("");
  else
    s->add_flag_callback(name, [msg] { throw Error(msg); })->group("");
}

inline void add_model_opts(CLI::App* s, ModelOpts& o, int default_ctx) {
  o.ctx = default_ctx;
  s->add_option("-m,--model", o.model,
                std::string("GGUF model (default: $TQ_MODEL or ") + kDefaultModel + ")");
  s->add_option("-t,--threads", o.threads, "threads (default: all cores)");
  s->add_option("-c,--ctx-size", o.ctx, "context size in tokens")->capture_default_str();
  s->add_flag("--json", o.json, "print one JSON object on stdout");
  // The attention kernel: --attn or one of its spellings below, each setting it once.
  auto set_attn = [&o](const std::string& flag, const std::string& k) {
    parse_attn_kernel(k);  // a bad name fails here, listing the valid ones
    TQ_CHECK(o.attn.empty() || o.attn == k, "%s: the attention kernel is already %s", flag.c_str(), o.attn.c_str());
    o.attn = k;
  };
  s->add_option_function<std::string>(
      "--attn", [set_attn](const std::string& k) { set_attn("--attn", k); },
      "attention kernel: fused (default: float arithmetic from the codes), lut8 (tq caches: int8 lookup tables on "
      "AVX-512 VNNI, faster, ~2e-2 relative attention error; fused where it cannot run) or reference (the test "
      "oracle: every cached row dequantized, then exact attention; slow); default: $TQ_ATTN, else fused");
  s->add_flag_callback("--attn-lut8", [set_attn] { set_attn("--attn-lut8", "lut8"); }, "same as --attn lut8");
  s->add_flag_callback("--exact-attention", [set_attn] { set_attn("--exact-attention", "fused"); },
                       "same as --attn fused (over TQ_ATTN=lut8)");
  s->add_flag_callback("--reference-attention", [set_attn] { set_attn("--reference-attention", "reference"); },
                       "same as --attn reference");
  add_removed_opt(s, "--f32-decode", false,
                  "removed (f32 copies of the weights with OpenBLAS sgemv: 538 MB more, decode 4x slower than "
                  "the block kernels); the block kernels always run");
}


// Every KV cache type name from the traits table, comma-separated (the -ctk / -ctv help).
inline std::string kv_type_list() {
  std::string s;
  for (const auto& n : kv_type_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

inline void add_kv_opts(CLI::App* s, ModelOpts& o) {
  const auto non_negative = [](const std::string& v) {
    return v.find_first_not_of(" ") != std::string::npos && v[v.find_first_not_of(" ")] == '-'
               ? std::string("must be >= 0, got ") + v
               : std::string();
  };
  // Each flag adds its token(s) to the label, which is parsed again at once: a bad value fails
  // naming its flag. CLI11 applies options in the order they are defined, so --kv-config
  // (defined first) is the base that every other flag overrides.
  auto add = [&o](const std::string& flag, const std::string& tokens) {
    o.kv_label += (o.kv_label.empty() ? "" : " ") + tokens;
    try {
      o.kv = KvSpec::parse(o.kv_label);
    } catch (const Error& e) {
      const std::string m = e.what();
      throw Error(m.rfind(flag, 0) == 0 ? m : flag + ": " + m);  // the flag, once
    }
  };
  s->add_option_function<std::string>(
      "--kv-config",
      [&o](const std::string& path) {
        const std::string label = read_kv_label_file(path);
        o.kv_label += (o.kv_label.empty() ? "" : " ") + label;
        try {
          o.kv = KvSpec::parse(o.kv_label);
        } catch (const Error& e) {
          throw Error(path + ": " + e.what());
        }
      },
      "cache config file: one cache spec (the --sweep grammar) over any lines, '#' comments (e.g. "
      "configs/smollm2-135m-kv4.25.kv, a per-head allocation for the default model); other --kv-*/-ctk/-ctv "
      "flags given beside it override it");
  s->add_option_function<std::string>(
      "--cache-type-k", [add](const std::string& t) { add("--cache-type-k", t == "auto" ? t : "k=" + t); },
      "-ctk: KV cache type for K (spec k=T): " + kv_type_list() + " (tq kv-types describes them); default f16; "
      "'auto' (spec auto): K and V types of the generic recommendation for this model's kind, without -ctv");
  s->add_option_function<std::string>(
      "--cache-type-v", [add](const std::string& t) { add("--cache-type-v", "v=" + t); },
      "-ctv: KV cache type for V (spec v=T); default f16");
  s->add_option_function<std::string>(
       "--kv-window", [add](const std::string& n) { add("--kv-window", "window=" + n); },
       "most recent tokens kept in f16, quantized when they leave (spec window=N)")
      ->type_name("N")->check(non_negative);
  s->add_option_function<std::string>(
       "--kv-sink", [add](const std::string& n) { add("--kv-sink", "sink=" + n); },
       "first N tokens of every layer kept in f16 for good (attention sinks; spec sink=N; default: 1 with a tq K "
       "type, see --kv-plain, else 0)")
      ->type_name("N")->check(non_negative);
  s->add_option_function<std::string>(
      "--kv-center", [add](const std::string& w) { add("--kv-center", "center=" + w); },
      "per-stream mean centring of the quantized K and/or V: k, v, kv or none, the value of spec center= (also "
      "k,rope,512 and the like; mean chosen online; default: k with a tq K type, see --kv-plain, else none)");
  add_removed_opt(s, "--kv-center-tokens", true, kRemovedCenterTokens);
  s->add_option_function<std::string>(
       "--kv-center-segment", [add](const std::string& n) { add("--kv-center-segment", "center=" + n); },
       "with centring: one mean per N quantized tokens (multiple of 32, <= 2048), each the mean of the previous "
       "segment (spec center=k,N); 0: one mean (default: 512 with the automatic K centring, which this option "
       "does not turn off; else 0)")
      ->type_name("N")->check(non_negative);
  s->add_flag_callback(
      "--kv-plain",
      [add, &o] {
        o.kv_plain = true;
        add("--kv-plain", "plain");
      },
      "no automatic protection (spec plain): by default a tq K cache given neither --kv-sink nor --kv-center "
      "keeps 1 sink token in f16 and centres K with one RoPE-rotating mean per 512 tokens (or "
      "--kv-center-segment N; spec sink=1 center=k,rope,512), plus K scaling (scale-k) on a model with QK-normed "
      "keys (gemma3, qwen3); --kv-plain runs the bare format");
  s->add_flag_callback(
      "--kv-center-rope", [add] { add("--kv-center-rope", "center=rope"); },
      "with K centring: the K mean rotates with RoPE (spec center=k,rope: mean of the keys turned back to "
      "position 0, turned to each key's position), so constant pre-RoPE components are removed too (part of the "
      "automatic protection; add it yourself when giving --kv-sink or --kv-center)");
  s->add_flag_callback(
      "--kv-scale-k", [add] { add("--kv-scale-k", "scale-k"); },
      "query-weighted K scaling (tq types; spec scale-k): scale K's RoPE channel pairs by (query energy / K "
      "energy)^(1/4), chosen online from the first tokens, and the queries by the inverse, so less K error lands "
      "where the queries look");
  s->add_flag_callback(
      "--kv-trellis", [add] { add("--kv-trellis", "trellis"); },
      "trellis-coded tq codes (parts of 1-4 bits; spec trellis): the same bytes, each token's codes chosen together "
      "by a Viterbi search, ~30% less squared error than the scalar codes; slower to write, and slower to read "
      "(the float kernel gathers every value; --attn-lut8 reads 256-entry byte tables)");
  s->add_option_function<std::string>(
       "--kv-boundary-layers", [add](const std::string& n) { add("--kv-boundary-layers", "boundary=" + n); },
       "first and last N layers use --kv-boundary-type (spec boundary=N:T)")
      ->type_name("N")->check(non_negative);
  s->add_option_function<std::string>(
      "--kv-boundary-type", [add](const std::string& t) { add("--kv-boundary-type", "boundary=" + t); },
      "cache type of the boundary layers, K and V, or K/V (default f16)");
  s->add_option_function<std::vector<std::string>>(
      "--kv-layer-type",
      [add](const std::vector<std::string>& rules) {
        for (const std::string& r : rules) add("--kv-layer-type", "layers=" + r);
      },
      "LAYERS:K[/V] (repeatable; spec layers=LAYERS:K[/V]): these layers use these cache types, e.g. "
      "0,3,10-12:tq6/tq3 (layers count from 0; applied after --kv-boundary-layers); LAYER.HEAD is one KV head of "
      "a layer, e.g. 3.1:tq3h5n8/tq3n8, and wins over whole-layer entries");
  s->add_option_function<uint64_t>(
      "--kv-seed",
      [add, &o](uint64_t seed) {
        o.kv_seed = seed;
        add("--kv-seed", "seed=" + std::to_string(seed));
      },
      "seed of the cache rotations (spec seed=N; default 24301)");
}

inline std::string resolve_model(const std::string& m) {
  if (!m.empty()) return m;
  if (const char* e = std::getenv("TQ_MODEL")) return e;
  struct stat st;
  TQ_CHECK(stat(kDefaultModel, &st) == 0, "no model given (-m) and %s does not exist; run scripts/fetch-model.sh",
           kDefaultModel);
  return kDefaultModel;
}

struct Loaded {
  GgufFile gguf;
  Tokenizer tok;
  LlamaModel model;
};

// OMP_WAIT_POLICY / GOMP_SPINCOUNT (model commands) and OPENBLAS_CORETYPE (every command) are
// set by the launcher (tools/tq_launcher/main.cpp) before this module, libgomp and OpenBLAS
// are loaded.
// The kernel set OpenBLAS runs with (its own name for it), for the JSON of model commands:
// float summation, hence results in their last digits, and prefill speed depend on it.
inline std::string blas_core() { return tq::simd::blas_core(); }
// How prefill multiplies the weights of the integer-activation types (Q4_0, Q4_1, Q5_0, Q8_0,
// Q4_K, Q6_K; every matrix of SmolLM2 and Gemma 3), for the same JSON: "int16 <level>" (the
// integer GEMM of llm::qgemm on AVX-512 levels; blas_core does not matter for them) or
// "sgemm" (OpenBLAS on dequantized panels). Other weight types always take sgemm.
inline std::string prefill_matmul() {
  return tq::llm::qgemm_int16(tq::GgmlType::Q8_0) ? "int16 " + tq::simd::current_level() : std::string("sgemm");
}

inline std::unique_ptr<Loaded> load_model(ModelOpts& o) {
  const AttnKernel kernel = o.kernel();  // a bad TQ_ATTN fails before anything is read
  auto g = GgufFile::open(resolve_model(o.model));
  // The cache spec against the model's shape before anything large is read: layer / head
  // rules in range (resolve), then every type it uses against head_dim.
  const LlamaConfig mc = LlamaModel::read_config(g);
  o.kv.resolve(mc, 1);
  for (KvFormat f : kv_spec_formats(o.kv.resolved(mc))) {
    try {
      kv_type_bytes(kv_type(f), mc.head_dim);
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + " (the model " + g.path() + " has head_dim " + std::to_string(mc.head_dim) +
                  ")");
    }
  }
  Tokenizer tok(g);
  LlamaModel m = LlamaModel::load(g);
  m.set_threads(o.threads);
  m.set_attention_kernel(kernel);
  return std::unique_ptr<Loaded>(new Loaded{std::move(g), std::move(tok), std::move(m)});
}

// A text as the model's tokens the way every model command reads its text (prompt or corpus):
// with the BOS the model asks for first (tokenizer add_bos) and its EOS last when add_eos;
// parse_special: control-token strings in the text are those tokens (chat prompts).
inline std::vector<int32_t> model_tokens(const Loaded& L, const std::string& text, bool parse_special = false) {
  return L.tok.encode_with_bos(text, parse_special);
}

// One entry of --sweep / --caches: a whole label, with the command's --kv-seed and --kv-plain;
// "@FILE" reads the label from a cache config file (see --kv-config), whose path prefixes errors.
inline KvSpec label_options(const std::string& entry, const ModelOpts& o) {
  std::string label = entry, source;
  if (!entry.empty() && entry[0] == '@') {
    source = entry.substr(1);
    label = read_kv_label_file(source);
  }
  if (o.kv_plain) label += " plain";
  if (o.kv_seed) label += " seed=" + std::to_string(*o.kv_seed);
  try {
    return KvSpec::parse(label);
  } catch (const Error& e) {
    if (source.empty()) throw;
    throw Error(source + ": " + e.what());
  }
}

// Splits a list of cache configs (--sweep, --caches) at `sep`, dropping blank entries.
inline std::vector<std::string> split_configs(const std::string& list, char sep) {
  std::vector<std::string> out;
  size_t p0 = 0;
  while (p0 <= list.size()) {
    size_t e = list.find(sep, p0);
    if (e == std::string::npos) e = list.size();
    std::string one = list.substr(p0, e - p0);
    const size_t b = one.find_first_not_of(' '), l = one.find_last_not_of(' ');
    if (b != std::string::npos) out.push_back(one.substr(b, l - b + 1));
    p0 = e + 1;
  }
  return out;
}

inline nlohmann::json kv_json(const KvSpec& spec) { return nlohmann::json::parse(spec.to_json()); }
// What the spec is on this model (KvSpec::resolved(model): `auto` and the model-dependent
// protection applied), with the spec as asked ("spec") and the rule that chose ("model_rule").
inline nlohmann::json kv_json(const KvSpec& spec, const LlamaConfig& model) {
  return nlohmann::json::parse(spec.to_json(model));
}
// The label of what the spec is on this model, shortened for text output.
inline std::string kv_label(const KvSpec& spec, const LlamaConfig& model) {
  return short_label(spec.resolved(model).to_string());
}

}  // namespace tq::cli
