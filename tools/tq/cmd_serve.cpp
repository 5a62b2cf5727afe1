// `tq serve`: an OpenAI-compatible HTTP server (chat and text completions, SSE streaming,
// /v1/models, /health, /metrics, a chat page at /) over N slots with their own KV caches,
// batched decode and admission by KV bytes. The HTTP edge and the scheduler live in src/serve/.
#include <filesystem>

#include "llm_cli.h"
#include "serve/server.h"

namespace {

// "256M", "1G", "1048576": bytes (K/M/G binary).
size_t parse_bytes(const std::string& s) {
  TQ_CHECK(!s.empty(), "--kv-budget: empty value");
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &pos);
  } catch (...) {
    TQ_CHECK(false, "--kv-budget: '%s' is not a byte count (e.g. 268435456, 256M, 1G)", s.c_str());
  }
  TQ_CHECK(s[0] != '-', "--kv-budget: '%s' is negative", s.c_str());
  const std::string unit = s.substr(pos);
  unsigned long long mul = 1;
  if (unit == "K" || unit == "KB" || unit == "KiB") mul = 1ull << 10;
  else if (unit == "M" || unit == "MB" || unit == "MiB") mul = 1ull << 20;
  else if (unit == "G" || unit == "GB" || unit == "GiB") mul = 1ull << 30;
  else TQ_CHECK(unit.empty(), "--kv-budget: unknown unit '%s' (K, M, G)", unit.c_str());
  TQ_CHECK(v <= (1ull << 50) / mul, "--kv-budget: '%s' is too large", s.c_str());
  return static_cast<size_t>(v * mul);
}

void setup(CLI::App& app) {
  auto* s = tq::cli::subcommand(app, "serve",
                                "OpenAI-compatible HTTP server on a quantized KV cache.\n"
                                "Example: tq serve --parallel 4 -c 4096 --kv-config configs/smollm2-135m-kv4.25.kv --attn-lut8");
  auto o = std::make_shared<tq::cli::ModelOpts>();
  auto so = std::make_shared<tq::serve::ServerOptions>();
  auto sched = std::make_shared<tq::serve::SchedulerOptions>();
  auto budget = std::make_shared<std::string>("0");
  auto no_reuse = std::make_shared<bool>(false);
  tq::cli::add_model_opts(s, *o, 4096);
  tq::cli::add_kv_opts(s, *o);
  s->add_option("--host", so->host, "address to bind (127.0.0.1: this machine only)")->capture_default_str();
  s->add_option("--port", so->port, "TCP port (0: any free port, printed on stderr)")->capture_default_str()
      ->check(CLI::Range(0, 65535));
  s->add_option("--parallel", sched->parallel, "slots: conversations decoded together, each with its own KV cache")
      ->capture_default_str();
  s->add_option("--kv-budget", *budget,
                "KV bytes the admitted requests may reserve together (prompt + max_tokens each; K/M/G suffixes; "
                "0: no limit); a request waits in the queue until it fits")
      ->capture_default_str();
  s->add_option("--queue", sched->queue_max, "requests that may wait for a slot; beyond it 503 with Retry-After")
      ->capture_default_str();
  s->add_option("--api-key", so->api_key, "require 'Authorization: Bearer KEY' on /v1/* and /metrics (default: $TQ_API_KEY)");
  s->add_option("--max-body", so->max_body, "request body limit in bytes (413 beyond)")->capture_default_str();
  s->add_option("--prefill-chunk", sched->prefill_chunk, "prompt tokens per scheduler step between decode steps")
      ->capture_default_str();
  s->add_flag("--no-prefix-reuse", *no_reuse, "always prefill the whole prompt (for A/B runs)");
  s->add_option("--model-id", so->model_id, "model name for /v1/models and requests (default: the GGUF file name)");
  s->callback([=] {
    sched->ctx = o->ctx;
    sched->kv_budget = parse_bytes(*budget);
    sched->prefix_reuse = !*no_reuse;
    TQ_CHECK(sched->prefill_chunk >= 1, "--prefill-chunk must be >= 1");
    TQ_CHECK(so->max_body >= 1024, "--max-body must be >= 1024");
    if (so->api_key.empty())
      if (const char* k = std::getenv("TQ_API_KEY")) so->api_key = k;
    auto L = tq::cli::load_model(*o);
    TQ_CHECK(o->ctx <= L->model.config().n_ctx_train * 4, "-c %d is more than 4x the model's training context %d",
             o->ctx, L->model.config().n_ctx_train);
    if (so->model_id.empty()) {
      std::string name = std::filesystem::path(tq::cli::resolve_model(o->model)).filename().string();
      if (name.size() > 5 && name.substr(name.size() - 5) == ".gguf") name.resize(name.size() - 5);
      so->model_id = name;
    }
    std::fprintf(stderr, "tq serve: kv cache %s, %d threads\n", tq::cli::kv_label(o->kv, L->model.config()).c_str(),
                 L->model.threads());
    const int rc = tq::serve::run_server(*so, L->model, L->tok, o->kv, *sched);
    if (rc != 0) std::exit(rc);
  });
}

tq::cli::Registrar reg("serve", setup);

}  // namespace
