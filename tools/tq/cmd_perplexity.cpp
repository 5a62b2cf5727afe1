// `tq perplexity`: perplexity of a model on a text file with a chosen KV cache; with
// --compare f16 also the f16 cache on the same tokens: KLD, top-1 agreement.
#include <cstdio>

#include "llm_cli.h"

namespace {

void setup(CLI::App& app) {
  auto* s = tq::cli::subcommand(
      app, "perplexity",
      "Perplexity over non-overlapping windows of -c tokens (the second half of each window is\n"
      "scored, as llama.cpp does). Example:\n"
      "  tq perplexity -f data/debian-reference.en.txt -c 512 --chunks 8 -ctk tq4 -ctv tq4 --compare f16");
  auto o = std::make_shared<tq::cli::ModelOpts>();
  auto file = std::make_shared<std::string>(tq::cli::kDefaultCorpus);
  auto chunks = std::make_shared<int>(0);
  auto compare = std::make_shared<std::string>();
  tq::cli::add_model_opts(s, *o, 512);
  tq::cli::add_kv_opts(s, o->kv);
  s->add_option("-f,--file", *file, "text file")->capture_default_str();
  s->add_option("--chunks", *chunks, "number of windows (0 = all)")->capture_default_str();
  s->add_option("--compare", *compare, "also run this cache type (e.g. f16) on the same tokens");
  s->callback([=] {
    auto L = tq::cli::load_model(*o);
    const std::string text = tq::read_text_file(*file);
    const std::vector<int32_t> tokens = L->tok.encode_with_bos(text);
    tq::PerplexityOptions po;
    po.n_ctx = o->ctx;
    po.n_chunks = *chunks;
    po.kv = o->kv;
    if (!compare->empty()) {
      po.compare = true;
      po.ref.type_k = po.ref.type_v = *compare;
    }
    std::unique_ptr<tq::cli::Progress> pb;
    po.progress = [&](size_t d, size_t t) {
      if (!pb) pb = std::make_unique<tq::cli::Progress>("perplexity " + o->kv.label(), t);
      pb->update(d);
    };
    const tq::PerplexityResult r = tq::perplexity(L->model, tokens, po);
    if (pb) pb->finish();
    nlohmann::json j = {{"file", *file}, {"text_tokens", tokens.size()}, {"ctx", r.n_ctx},
                        {"chunks", r.n_chunks}, {"scored_tokens", r.n_scored}, {"kv", tq::cli::kv_json(o->kv)},
                        {"ppl", r.ppl}, {"kv_bytes_per_token", r.kv_bytes_per_token},
                        {"bits_per_value", r.bits_per_value}, {"threads", L->model.threads()},
                        {"seconds", r.seconds}, {"chunk_ppl", r.chunk_ppl}};
    if (po.compare) {
      j["compare"] = *compare;
      j["ppl_f16"] = r.ppl_ref;
      j["ppl_delta_pct"] = 100.0 * (r.ppl / r.ppl_ref - 1.0);
      j["kld_mean"] = r.kld_mean;
      j["kld_p99"] = r.kld_p99;
      j["top1_agreement"] = r.top1_agreement;
      j["kv_bytes_per_token_f16"] = r.kv_bytes_per_token_ref;
    }
    if (o->json) {
      tq::cli::print_json(j);
      return;
    }
    std::printf("model %s, text %s: %zu tokens, %d chunks of %d (%zu scored)\n", tq::cli::resolve_model(o->model).c_str(),
                file->c_str(), tokens.size(), r.n_chunks, r.n_ctx, r.n_scored);
    std::printf("kv %-24s ppl %.4f   %.1f bytes/token (%.3f bits/value)\n", o->kv.label().c_str(), r.ppl,
                r.kv_bytes_per_token, r.bits_per_value);
    if (po.compare)
      std::printf("kv %-24s ppl %.4f   delta %+.2f%%  KLD %.5f (p99 %.4f)  top-1 agreement %.2f%%\n",
                  compare->c_str(), r.ppl_ref, 100.0 * (r.ppl / r.ppl_ref - 1.0), r.kld_mean, r.kld_p99,
                  100.0 * r.top1_agreement);
    std::printf("%.1f s, %d threads\n", r.seconds, L->model.threads());
  });
}

tq::cli::Registrar reg("perplexity", setup);

}  // namespace
