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
  auto sweep = std::make_shared<std::string>();
  auto dump_top1 = std::make_shared<bool>(false);
  auto kld_buckets = std::make_shared<int>(0);
  tq::cli::add_model_opts(s, *o, 512);
  tq::cli::add_kv_opts(s, *o);
  s->add_option("-f,--file", *file, "text file")->capture_default_str();
  s->add_option("--chunks", *chunks, "number of windows (0 = all)")->capture_default_str();
  s->add_option("--compare", *compare, "also run this cache type (e.g. f16) on the same tokens");
  s->add_flag("--top1", *dump_top1, "with --json: include the argmax token of every scored position");
  s->add_option("--kld-buckets", *kld_buckets,
                "with --compare and --json: also the mean KLD in N equal buckets of the scored positions "
                "(kld_by_position: where in the window the loss sits)");
  s->add_option("--sweep", *sweep,
                "several cache specs separated by ';', each 'k=T v=T [window=N] [sink=N] [center=k|v|kv|none[,rope][,N]] "
                "[plain] [scale-k] [trellis] [boundary=N:T[/T]] [layers=LIST:T[/T]]...' (a bare 'T' or 'K/V' sets both types;\n"
                "'auto' instead of the types: the generic recommendation for this model's kind, e.g. 'auto;auto trellis';\n"
                "e.g. 'tq4;tq4/tq3;k=tq3 window=128 boundary=2:f16;k=tq3h6 v=tq4n8 sink=1 center=k,rope,512 scale-k';\n"
                "the short labels 'tq3 w128 s4 ckv cs512 cr ks tc plain b2:f16 L0,5-7:tq6/tq3' still parse),\n"
                "run on the same windows sharing one --compare pass (replaces -ctk/-ctv); an entry @FILE reads a --kv-config file");
  s->callback([=] {
    TQ_CHECK(*kld_buckets >= 0, "--kld-buckets must be >= 0, got %d", *kld_buckets);
    TQ_CHECK(*kld_buckets == 0 || !compare->empty(), "--kld-buckets needs --compare (the KLD is against it)");
    TQ_CHECK(*kld_buckets == 0 || o->json, "--kld-buckets is written in the JSON: give --json");
    TQ_CHECK(*kld_buckets == 0 || *kld_buckets <= o->ctx - 1 - o->ctx / 2, "--kld-buckets %d: more than the %d scored positions of a window",
             *kld_buckets, o->ctx - 1 - o->ctx / 2);
    auto L = tq::cli::load_model(*o);
    const std::string text = tq::read_text_file(*file);
    const std::vector<int32_t> tokens = tq::cli::model_tokens(*L, text);
    tq::PerplexityOptions po;
    po.n_ctx = o->ctx;
    po.n_chunks = *chunks;
    po.kv = o->kv;
    if (!compare->empty()) {
      po.compare = true;
      po.ref = tq::KvSpec::parse(*compare);
    }
    std::vector<tq::KvSpec> configs;
    if (sweep->empty()) {
      configs.push_back(o->kv);
    } else {
      for (const std::string& one : tq::cli::split_configs(*sweep, ';'))
        configs.push_back(tq::cli::label_options(one, *o));
    }
    tq::cli::Progress pb("perplexity");
    po.progress = [&](size_t d, size_t t) { pb.update(d, t); };
    const auto results = tq::perplexity_multi(L->model, tokens, po, configs);
    pb.finish();
    nlohmann::json all = nlohmann::json::array();
    for (size_t c = 0; c < configs.size(); ++c) {
      const tq::PerplexityResult& r = results[c];
      nlohmann::json j = {{"kv", tq::cli::kv_json(configs[c], L->model.config())}, {"ppl", r.ppl},
                          {"kv_bytes_per_token", r.kv_bytes_per_token}, {"bits_per_value", r.bits_per_value},
                          {"bits_per_value_all", r.bits_per_value_all}, {"kv_bytes_used", r.kv_bytes_used},
                          {"seconds", r.seconds}, {"chunk_ppl", r.chunk_ppl}};
      if (*dump_top1) j["top1"] = r.top1;
      if (po.compare) {
        j["compare"] = *compare;
        j["ppl_f16"] = r.ppl_ref;
        j["ppl_delta_pct"] = 100.0 * (r.ppl / r.ppl_ref - 1.0);
        j["kld_mean"] = r.kld_mean;
        j["kld_p99"] = r.kld_p99;
        j["top1_agreement"] = r.top1_agreement;
        j["kv_bytes_per_token_f16"] = r.kv_bytes_per_token_ref;
        if (*kld_buckets > 0) {
          // Bucket b: scored rows [lo, hi) of every window, as positions in the window (a row
          // at position p predicts the token at p + 1).
          const size_t n = r.kld_by_row.size(), first = static_cast<size_t>(r.n_ctx / 2);
          nlohmann::json bj = nlohmann::json::array();
          for (int b = 0; b < *kld_buckets; ++b) {
            const size_t lo = n * b / *kld_buckets, hi = n * (b + 1) / *kld_buckets;
            double sum = 0;
            for (size_t i = lo; i < hi; ++i) sum += r.kld_by_row[i];
            bj.push_back({{"from", first + lo}, {"to", first + hi}, {"kld_mean", sum / ((hi - lo) * r.n_chunks)}});
          }
          j["kld_by_position"] = bj;
        }
      }
      all.push_back(j);
    }
    const tq::PerplexityResult& r0 = results[0];
    nlohmann::json head = {{"model", tq::cli::resolve_model(o->model)}, {"file", *file},
                           {"text_tokens", tokens.size()}, {"ctx", r0.n_ctx}, {"chunks", r0.n_chunks},
                           {"scored_tokens", r0.n_scored}, {"threads", L->model.threads()},
                           {"blas_core", tq::cli::blas_core()}, {"prefill_matmul", tq::cli::prefill_matmul()},
                           {"attention", tq::attn_kernel_name(L->model.attention_kernel())}};
    if (o->json) {
      if (sweep->empty()) {
        nlohmann::json j = all[0];
        j.update(head);
        tq::cli::print_json(j);
      } else {
        head["results"] = all;
        tq::cli::print_json(head);
      }
      return;
    }
    std::printf("model %s, text %s: %zu tokens, %d chunks of %d (%zu scored), %d threads\n",
                tq::cli::resolve_model(o->model).c_str(), file->c_str(), tokens.size(), r0.n_chunks, r0.n_ctx,
                r0.n_scored, L->model.threads());
    if (po.compare)
      std::printf("%-26s ppl %.4f   %.1f bytes/token\n", compare->c_str(), r0.ppl_ref, r0.kv_bytes_per_token_ref);
    for (size_t c = 0; c < configs.size(); ++c) {
      const tq::PerplexityResult& r = results[c];
      std::printf("%-26s ppl %.4f   %7.1f bytes/token (%.3f bits/value, %.3f all counted)", tq::cli::kv_label(configs[c], L->model.config()).c_str(),
                  r.ppl, r.kv_bytes_per_token, r.bits_per_value, r.bits_per_value_all);
      if (po.compare)
        std::printf("  delta %+.2f%%  KLD %.5f (p99 %.4f)  top-1 %.2f%%", 100.0 * (r.ppl / r.ppl_ref - 1.0),
                    r.kld_mean, r.kld_p99, 100.0 * r.top1_agreement);
      std::printf("  %.1f s\n", r.seconds);
    }
  });
}

tq::cli::Registrar reg("perplexity", setup);

}  // namespace
