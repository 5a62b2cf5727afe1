// `tq generate`: run a GGUF model on a prompt with the chosen KV cache; streams the text,
// then prints prompt / generation speed and KV memory.
#include <chrono>
#include <cstdio>
#include <iostream>

#include "llm_cli.h"
#include "tq/common.h"

namespace {

void setup(CLI::App& app) {
  auto* s = tq::cli::subcommand(app, "generate",
                                "Generate text with a GGUF (llama) model on a quantized KV cache.\n"
                                "Example: tq generate -p 'What is Debian?' --chat -n 64 -ctk tq4 -ctv tq4");
  auto o = std::make_shared<tq::cli::ModelOpts>();
  auto prompt = std::make_shared<std::string>();
  auto n_predict = std::make_shared<int>(64);
  auto chat = std::make_shared<bool>(false);
  auto sp = std::make_shared<tq::SamplerParams>();
  tq::cli::add_model_opts(s, *o, 2048);
  tq::cli::add_kv_opts(s, *o);
  s->add_option("-p,--prompt", *prompt, "prompt text")->required();
  s->add_option("-n,--n-predict", *n_predict, "tokens to generate")->capture_default_str();
  s->add_flag("--chat", *chat, "wrap the prompt in the model's chat template (instruct models)");
  s->add_option("--temp", sp->temperature, "temperature (0 = greedy)")->capture_default_str();
  s->add_option("--top-p", sp->top_p, "nucleus sampling mass")->capture_default_str();
  s->add_option("--top-k", sp->top_k, "keep the k most likely tokens (0 = off)")->capture_default_str();
  s->add_option("--seed", sp->seed, "sampling seed")->capture_default_str();
  s->callback([=] {
    auto L = tq::cli::load_model(*o);
    std::string text = *prompt;
    if (*chat) text = L->tok.apply_chat_template({{"user", *prompt}}, true);
    std::vector<int32_t> ids = tq::cli::model_tokens(*L, text, /*parse_special=*/*chat);
    TQ_CHECK(!ids.empty(), "empty prompt");
    TQ_CHECK(*n_predict >= 0, "-n must be >= 0");
    const int cap = static_cast<int>(ids.size()) + *n_predict;
    TQ_CHECK(cap <= o->ctx, "prompt (%zu tokens) + %d new tokens exceed the context %d (-c)", ids.size(),
             *n_predict, o->ctx);
    tq::KvCache cache(o->kv.resolve(L->model.config(), o->ctx));
    tq::Sampler sampler(*sp);
    double t0 = tq::wall_seconds();
    std::vector<float> lg = L->model.forward_last(cache, ids);
    const double t_prompt = tq::wall_seconds() - t0;
    std::vector<int32_t> out;
    std::string gen;
    t0 = tq::wall_seconds();
    for (int i = 0; i < *n_predict; ++i) {
      const int32_t id = sampler.sample(lg.data(), static_cast<int>(lg.size()));
      if (L->tok.is_end_of_generation(id)) break;
      out.push_back(id);
      const std::string piece = L->tok.token_to_piece(id);
      gen += piece;
      if (!o->json) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      }
      if (i + 1 < *n_predict) lg = L->model.forward_last(cache, {id});
    }
    const double t_gen = tq::wall_seconds() - t0;
    const double gen_tps = out.empty() ? 0 : out.size() / t_gen;
    if (o->json) {
      tq::cli::print_json({{"prompt", *prompt}, {"chat", *chat}, {"text", gen},
                           {"prompt_tokens", ids.size()}, {"generated_tokens", out.size()},
                           {"prompt_tok_s", ids.size() / t_prompt}, {"gen_tok_s", gen_tps},
                           {"threads", L->model.threads()}, {"blas_core", tq::cli::blas_core()}, {"prefill_matmul", tq::cli::prefill_matmul()}, {"kv", tq::cli::kv_json(o->kv, L->model.config())},
                           {"kv_bytes", cache.bytes_used()}, {"kv_bytes_per_token", cache.bytes_per_token()},
                           {"kv_bits_per_value", tq::kv_bits_per_value(L->model, cache.bytes_per_token())}});
    } else {
      std::printf("\n");
      std::fflush(stdout);
      std::fprintf(stderr,
                   "prompt: %zu tokens, %.1f tok/s | generation: %zu tokens, %.1f tok/s | threads %d\n"
                   "kv cache %s: %zu bytes held, %.1f bytes/token (%.2f bits/value)\n",
                   ids.size(), ids.size() / t_prompt, out.size(), gen_tps, L->model.threads(),
                   tq::cli::kv_label(o->kv, L->model.config()).c_str(), cache.bytes_used(), cache.bytes_per_token(),
                   tq::kv_bits_per_value(L->model, cache.bytes_per_token()));
    }
  });
}

tq::cli::Registrar reg("generate", setup);

}  // namespace
