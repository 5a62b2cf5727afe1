// Shared options and loading for the model subcommands (generate, perplexity, niah,
// bench model): llama.cpp-style flags -m -t -c -ctk -ctv plus window / boundary options.
#pragma once

#include <sys/stat.h>

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
  KvOptions kv;
};

inline void add_model_opts(CLI::App* s, ModelOpts& o, int default_ctx) {
  o.ctx = default_ctx;
  s->add_option("-m,--model", o.model,
                std::string("GGUF model (default: $TQ_MODEL or ") + kDefaultModel + ")");
  s->add_option("-t,--threads", o.threads, "threads (default: all cores)");
  s->add_option("-c,--ctx-size", o.ctx, "context size in tokens")->capture_default_str();
  s->add_flag("--json", o.json, "print one JSON object on stdout");
}

inline void add_kv_opts(CLI::App* s, KvOptions& kv) {
  s->add_option("--cache-type-k", kv.type_k, "-ctk: KV cache type for K (f16, q8_0, q4_0, q4_0h, tq2..tq4, tq2.5, tq3.5, ...)")
      ->capture_default_str();
  s->add_option("--cache-type-v", kv.type_v, "-ctv: KV cache type for V")->capture_default_str();
  s->add_option("--kv-window", kv.window, "most recent tokens kept in f16 (quantized when they leave)")
      ->capture_default_str();
  s->add_option("--kv-boundary-layers", kv.boundary_layers,
                "first and last N layers use --kv-boundary-type")->capture_default_str();
  s->add_option("--kv-boundary-type", kv.boundary_type_k, "cache type of the boundary layers (K and V)")
      ->capture_default_str();
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

inline std::unique_ptr<Loaded> load_model(ModelOpts& o) {
  o.kv.boundary_type_v = o.kv.boundary_type_k;
  auto g = GgufFile::open(resolve_model(o.model));
  Tokenizer tok(g);
  LlamaModel m = LlamaModel::load(g);
  m.set_threads(o.threads);
  return std::unique_ptr<Loaded>(new Loaded{std::move(g), std::move(tok), std::move(m)});
}

inline nlohmann::json kv_json(const KvOptions& kv) {
  return {{"type_k", kv.type_k}, {"type_v", kv.type_v}, {"window", kv.window},
          {"boundary_layers", kv.boundary_layers}, {"boundary_type", kv.boundary_type_k},
          {"label", kv.label()}};
}

}  // namespace tq::cli
