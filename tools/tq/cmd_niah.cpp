// `tq niah`: needle in a haystack on the corpus with a chosen KV cache.
#include <cmath>
#include <cstdio>
#include <sstream>

#include "llm_cli.h"

namespace {

void setup(CLI::App& app) {
  auto* s = tq::cli::subcommand(
      app, "niah",
      "Needle in a haystack: corpus text of --context tokens (the model's BOS first, if it asks\n"
      "for one) with 'The secret number of the blue dragon is NNNNNN.' inserted at each depth;\n"
      "greedy decoding must return the 6 digits. Each trial reports its margin: the smallest\n"
      "logit lead of the answer's next token over the best other, along the answer (negative:\n"
      "a miss; near 0: a coin flip that any change to the cache can turn). Example:\n"
      "  tq niah --context 4096 --depths 0.1,0.5,0.9 --trials 2 -ctk tq4 -ctv tq4");
  auto o = std::make_shared<tq::cli::ModelOpts>();
  auto no = std::make_shared<tq::NiahOptions>();
  auto file = std::make_shared<std::string>(tq::cli::kDefaultCorpus);
  auto depths = std::make_shared<std::vector<double>>(std::vector<double>{0.1, 0.5, 0.9});
  tq::cli::add_model_opts(s, *o, 2048);
  tq::cli::add_kv_opts(s, *o);
  s->add_option("--context", o->ctx, "haystack length in tokens (same as -c)");
  s->add_option("--depths", *depths, "needle depths in [0, 1]")->delimiter(',')->capture_default_str();
  s->add_option("--trials", no->trials, "trials per depth")->capture_default_str();
  s->add_option("--seed", no->seed, "seed for offsets and passphrases")->capture_default_str();
  s->add_option("-f,--file", *file, "haystack text")->capture_default_str();
  s->callback([=] {
    auto L = tq::cli::load_model(*o);
    const std::string text = tq::read_text_file(*file);
    no->context = o->ctx;
    no->depths = *depths;
    no->kv = o->kv;
    tq::cli::Progress pb("niah " + tq::short_label(o->kv.resolved(L->model.config()).to_string(), 32));
    no->progress = [&](size_t d, size_t t) { pb.update(d, t); };
    const tq::NiahResult r = tq::niah(L->model, L->tok, text, *no);
    pb.finish();
    nlohmann::json per = nlohmann::json::array();
    for (double d : *depths) {
      int tr = 0, ok = 0;
      for (auto& t : r.details)
        if (t.depth == d) { ++tr; ok += t.passed; }
      per.push_back({{"depth", d}, {"trials", tr}, {"passed", ok}});
    }
    nlohmann::json det = nlohmann::json::array();
    for (auto& t : r.details)
      det.push_back({{"depth", t.depth}, {"trial", t.trial}, {"passphrase", t.passphrase},
                     {"answer", t.answer}, {"passed", t.passed},
                      {"margin", std::isfinite(t.margin) ? nlohmann::json(t.margin) : nlohmann::json()}});
    if (o->json) {
      tq::cli::print_json({{"context", o->ctx}, {"kv", tq::cli::kv_json(o->kv, L->model.config())}, {"trials", r.trials},
                           {"passed", r.passed}, {"per_depth", per}, {"details", det},
                           {"seconds", r.seconds}, {"threads", L->model.threads()},
                           {"blas_core", tq::cli::blas_core()}, {"prefill_matmul", tq::cli::prefill_matmul()}});
      return;
    }
    std::printf("niah context %d, kv %s: %d / %d passed (%.1f s)\n", o->ctx, tq::cli::kv_label(o->kv, L->model.config()).c_str(), r.passed,
                r.trials, r.seconds);
    for (auto& t : r.details)
      std::printf("  depth %.2f trial %d: %s -> '%s' %s (margin %.3f)\n", t.depth, t.trial, t.passphrase.c_str(),
                  t.answer.c_str(), t.passed ? "ok" : "MISS", t.margin);
  });
}

tq::cli::Registrar reg("niah", setup);

}  // namespace
