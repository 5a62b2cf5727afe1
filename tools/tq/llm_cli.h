// Shared options and loading for the model subcommands (generate, perplexity, niah,
// bench model): llama.cpp-style flags -m -t -c -ctk -ctv plus window / boundary options.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <vector>

#include <cstdlib>
#include <memory>
#include <string>

#include "cli.h"
#include "tq/error.h"
#include "tq/eval.h"
#include "tq/gguf.h"
#include "tq/model.h"
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
  KvOptions kv;
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

inline KvOptions label_options(const std::string& label, const KvOptions& global, const std::string& source = "");

// Every KV cache type name from the traits table, comma-separated (the -ctk / -ctv help).
inline std::string kv_type_list() {
  std::string s;
  for (const auto& n : kv_type_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

inline void add_kv_opts(CLI::App* s, KvOptions& kv) {
  // -1 means "not given" inside KvOptions, so a negative value must not reach it.
  const auto non_negative = [](const std::string& v) {
    return v.find_first_not_of(" ") != std::string::npos && v[v.find_first_not_of(" ")] == '-'
               ? std::string("must be >= 0, got ") + v
               : std::string();
  };
  // Defined first: CLI11 applies options in the order they are defined, so every flag given
  // beside --kv-config overrides what the file says.
  s->add_option_function<std::string>(
      "--kv-config",
      [&kv](const std::string& path) { kv = label_options("@" + path, kv); },
      "cache config file: one cache label in the --sweep syntax over any lines, '#' comments (e.g. "
      "configs/smollm2-135m-kv4.25.kv, a per-head allocation for the default model); other --kv-*/-ctk/-ctv "
      "flags given beside it override it");
  s->add_option("--cache-type-k", kv.type_k, "-ctk: KV cache type for K: " + kv_type_list() + " (tq kv-types describes them)")
      ->capture_default_str();
  s->add_option("--cache-type-v", kv.type_v, "-ctv: KV cache type for V")->capture_default_str();
  s->add_option("--kv-window", kv.window, "most recent tokens kept in f16 (quantized when they leave)")
      ->capture_default_str();
  s->add_option("--kv-sink", kv.sink,
                "first N tokens of every layer kept in f16 for good (attention sinks; default: 1 with a tq K type, "
                "see --kv-plain, else 0)")
      ->check(non_negative);
  s->add_option_function<std::string>(
      "--kv-center",
      [&kv](const std::string& w) {
        TQ_CHECK(w == "k" || w == "v" || w == "kv" || w == "none",
                 "--kv-center: '%s' is not one of k, v, kv, none", w.c_str());
        kv.center_set = true;
        kv.center_k = w == "k" || w == "kv";
        kv.center_v = w == "v" || w == "kv";
      },
      "per-stream mean centring of the quantized K and/or V: k, v, kv or none (mean chosen online; default: k "
      "with a tq K type, see --kv-plain, else none)");
  add_removed_opt(s, "--kv-center-tokens", true, kRemovedCenterTokens);
  s->add_option("--kv-center-segment", kv.center_segment,
                "with --kv-center: one mean per N quantized tokens (multiple of 32, <= 2048), each the mean of the previous "
                "segment; 0: one mean (default: 512 with the automatic K centring, which this option does not turn off; else 0)")
      ->check(non_negative);
  s->add_flag("--kv-plain", kv.plain,
              "no automatic protection: by default a tq K cache given neither --kv-sink nor --kv-center "
              "keeps 1 sink token in f16 and centres K with one RoPE-rotating mean per 512 tokens (or "
              "--kv-center-segment N; same as --kv-sink 1 --kv-center k --kv-center-segment 512 --kv-center-rope); "
              "--kv-plain runs the bare format");
  s->add_flag("--kv-center-rope", kv.center_rope,
              "with K centring: the K mean rotates with RoPE (mean of the keys turned back to position 0, "
              "turned to each key's position), so constant pre-RoPE components are removed too (part of the "
              "automatic protection; add it yourself when giving --kv-sink or --kv-center)");
  s->add_flag("--kv-scale-k", kv.scale_k,
              "query-weighted K scaling (tq types): scale K's RoPE channel pairs by (query energy / K energy)^(1/4), "
              "chosen online from the first tokens, and the queries by the inverse, so less K error lands where "
              "the queries look");
  s->add_flag("--kv-trellis", kv.trellis,
              "trellis-coded tq codes (parts of 1-4 bits): the same bytes, each token's codes chosen together by a "
              "Viterbi search, ~30% less squared error than the scalar codes; slower to write, and slower to read "
              "(the float kernel gathers every value; --attn-lut8 reads 256-entry byte tables)");
  s->add_option("--kv-boundary-layers", kv.boundary_layers,
                "first and last N layers use --kv-boundary-type")->capture_default_str();
  s->add_option("--kv-boundary-type", kv.boundary_type_k, "cache type of the boundary layers (K and V)")
      ->capture_default_str();
  s->add_option("--kv-layer-type", kv.layer_types,
                "LAYERS:K[/V] (repeatable): these layers use these cache types, e.g. 0,3,10-12:tq6/tq3 "
                "(layers count from 0; applied after --kv-boundary-layers); LAYER.HEAD is one KV head of a layer, "
                "e.g. 3.1:tq3h5n8/tq3n8, and wins over whole-layer entries");
  s->add_option("--kv-seed", kv.seed, "seed of the cache rotations")->capture_default_str();
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

// Two runtime settings are read from the environment before main() runs, so when they are
// missing this command re-runs itself once with them set (TQ_NO_REEXEC=1 disables this):
//  - OPENBLAS_CORETYPE: OpenBLAS (DYNAMIC_ARCH) picks kernels from the CPU model; on CPUs it
//    does not know (VMs report a generic "Intel Xeon Processor") it falls back to Prescott
//    (SSE3) kernels: 12 GFLOPS vs 62 with its SkylakeX kernels, measured on this machine.
//  - OMP_WAIT_POLICY=passive with GOMP_SPINCOUNT=3000 (set only when the user set neither):
//    an idle OpenMP worker spins briefly (libgomp: 3000 polls, tens of microseconds), then
//    sleeps. Decode forks and joins ~250 parallel regions per token; sleeping at once
//    (passive, no spin) made 2-thread decode slower than 1 thread (63 vs 92 tok/s on a quiet
//    machine, 512 context), the short spin gives 141 tok/s; unbounded spinning (active)
//    starved the working thread when other jobs shared the 2 cores (1.7 vs 10.2 tok/s).
//    With a busy process on one of the 2 cores the short spin still loses to pure passive
//    (44 vs 75 tok/s): set OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=0 on an oversubscribed
//    machine (docs/design.md).
extern "C" char* openblas_get_corename(void);
// The kernel set OpenBLAS runs with (its own name for it), for the JSON of model commands:
// float summation, hence results in their last digits, and prefill speed depend on it.
inline std::string blas_core() { return openblas_get_corename(); }

inline void ensure_runtime_env() {
  if (std::getenv("TQ_NO_REEXEC")) return;
  bool need = false;
  if (!std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT")) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    setenv("GOMP_SPINCOUNT", "3000", 1);
    need = true;
  }
  const std::string core = openblas_get_corename();
  if (!std::getenv("OPENBLAS_CORETYPE") && (core == "Prescott" || core == "prescott")) {
    __builtin_cpu_init();
    const char* want = nullptr;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
      want = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      want = "Haswell";
    if (want) {
      setenv("OPENBLAS_CORETYPE", want, 1);
      need = true;
    }
  }
  if (!need) return;
  setenv("TQ_NO_REEXEC", "1", 1);  // never loop
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t b = 0; b < all.size();) {
    size_t e = all.find('\0', b);
    if (e == std::string::npos) e = all.size();
    args.push_back(all.substr(b, e - b));
    b = e + 1;
  }
  if (args.empty()) return;
  std::vector<char*> argv;
  for (auto& x : args) argv.push_back(x.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  execv("/proc/self/exe", argv.data());
  // exec failed: carry on with the current settings
}

inline std::unique_ptr<Loaded> load_model(ModelOpts& o) {
  ensure_runtime_env();
  const AttnKernel kernel = o.kernel();  // a bad TQ_ATTN fails before anything is read
  o.kv.boundary_type_v = o.kv.boundary_type_k;
  auto g = GgufFile::open(resolve_model(o.model));
  // The cache config against the model's shape before anything large is read: layer / head
  // specs in range (make_kv_config), then every type it uses against head_dim.
  const LlamaConfig mc = LlamaModel::read_config(g);
  {
    const KvCacheConfig kc = make_kv_config(mc, o.kv, 1);
    std::vector<std::string> types = {kc.type_k, kc.type_v};
    if (kc.boundary_layers > 0) types.insert(types.end(), {kc.boundary_type_k, kc.boundary_type_v});
    for (const auto* list : {&kc.layer_type_k, &kc.layer_type_v, &kc.head_type_k, &kc.head_type_v})
      for (const std::string& t : *list)
        if (!t.empty()) types.push_back(t);
    for (const std::string& t : types) {
      const KvType kt = parse_kv_type(t);  // unknown or removed names: their own message
      try {
        kv_type_bytes(kt, mc.head_dim);
      } catch (const Error& e) {
        throw Error(std::string(e.what()) + " (the model " + g.path() + " has head_dim " +
                    std::to_string(mc.head_dim) + ")");
      }
    }
  }
  Tokenizer tok(g);
  LlamaModel m = LlamaModel::load(g);
  m.set_threads(o.threads);
  m.set_attention_kernel(kernel);
  return std::unique_ptr<Loaded>(new Loaded{std::move(g), std::move(tok), std::move(m)});
}

// One entry of --sweep / --caches: a whole label, with the command's --kv-seed and --kv-plain;
// "@FILE" reads the label from a cache config file (see --kv-config). `source` names where the
// label came from in errors.
inline KvOptions label_options(const std::string& label, const KvOptions& global, const std::string& source) {
  if (!label.empty() && label[0] == '@') {
    const std::string path = label.substr(1);
    return label_options(read_kv_label_file(path), global, path);
  }
  KvOptions kv;
  try {
    kv = parse_kv_label(label);
  } catch (const Error& e) {
    if (source.empty()) throw;
    throw Error(source + ": " + e.what());
  }
  kv.seed = global.seed;
  kv.plain = kv.plain || global.plain;
  return kv;
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

inline nlohmann::json kv_json(const KvOptions& opts) {
  const KvOptions kv = opts.resolved();
  return {{"type_k", kv.type_k}, {"type_v", kv.type_v}, {"window", kv.window}, {"sink", kv.sink},
          {"center_k", kv.center_k}, {"center_v", kv.center_v}, {"center_segment", kv.center_segment}, {"center_rope", kv.center_rope}, {"scale_k", kv.scale_k}, {"trellis", kv.trellis},
          {"boundary_layers", kv.boundary_layers}, {"boundary_type", kv.boundary_type_k},
          {"layer_types", kv.layer_types}, {"auto_protected", opts.auto_protected()},
          {"label", opts.label()}};
}

}  // namespace tq::cli
