// `tq bench model`: prefill and decode speed of a model at given context lengths, for one or
// more KV cache types in the same process (ratios to the first type).
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "llm_cli.h"

namespace {

void setup(CLI::App& app) {
  auto* bench = tq::cli::group(app, "bench", "Benchmarks");
  auto* s = tq::cli::subcommand(
      *bench, "model",
      "Prefill and decode tok/s of a GGUF model at each context, per cache config (runs alternate;\n"
      "medians over --reps). Example:\n"
      "  tq bench model -t 2 --contexts 512,4096,8192 --caches f16,tq4 --decode 32 --reps 3");
  auto o = std::make_shared<tq::cli::ModelOpts>();
  auto contexts = std::make_shared<std::vector<int>>(std::vector<int>{512, 4096, 8192});
  auto caches_arg = std::make_shared<std::string>("f16,tq4");
  auto decode = std::make_shared<int>(32);
  auto reps = std::make_shared<int>(1);
  auto file = std::make_shared<std::string>(tq::cli::kDefaultCorpus);
  tq::cli::add_model_opts(s, *o, 0);
  tq::cli::add_kv_opts(s, *o);
  s->add_option("--contexts", *contexts, "prompt lengths")->delimiter(',')->capture_default_str();
  s->add_option("--caches", *caches_arg,
                "cache configs separated by ',' (or by ';' when the list holds one, for labels with commas):\n"
                "types (K=V), K/V pairs like tq4/tq3 (with the --kv-* flags), whole cache specs like\n"
                "\"k=tq3h6 v=tq4n8 sink=1 center=k scale-k\" (an entry with a space: its own settings; of the --kv-* flags\n"
                "only --kv-seed and --kv-plain apply to it) or @FILE, a --kv-config file (a whole spec)")
      ->capture_default_str();
  s->add_option("--decode", *decode, "decode steps after the prefill")->capture_default_str();
  s->add_option("--reps", *reps, "repetitions (median reported)")->capture_default_str();
  s->add_option("-f,--file", *file, "text used as the prompt")->capture_default_str();
  s->callback([=] {
    const std::vector<std::string> caches =
        tq::cli::split_configs(*caches_arg, caches_arg->find(';') != std::string::npos ? ';' : ',');
    TQ_CHECK(!caches.empty(), "--caches: no cache config given");
    auto L = tq::cli::load_model(*o);
    const auto tokens = tq::cli::model_tokens(*L, tq::read_text_file(*file));  // BOS first, as perplexity
    nlohmann::json rows = nlohmann::json::array();
    const size_t total = contexts->size() * caches.size() * std::max(1, *reps);
    std::vector<tq::KvSpec> kvs;  // parsed before the first run: a bad label fails at once
    for (const std::string& cs : caches) {
      const tq::KvSpec parsed = tq::cli::label_options(cs, *o);
      if (cs.find(' ') != std::string::npos || cs[0] == '@') {
        kvs.push_back(parsed);
      } else {  // types only (or auto): the --kv-* flags apply
        kvs.push_back(tq::KvSpec::parse(o->kv_label + (parsed.auto_types ? std::string(" auto")
                                                                          : std::string(" k=") + tq::kv_format_name(parsed.k) +
                                                                                " v=" + tq::kv_format_name(parsed.v))));
      }
    }
    // The 1-minute load average at the start and the end (the run's own threads count in it): a
    // figure measured beside other jobs says so in its file.
    auto load1 = [] {
      double l[1] = {-1.0};
      return getloadavg(l, 1) == 1 ? l[0] : -1.0;
    };
    const double load_start = load1();
    tq::cli::Progress pb("bench model", total);
    size_t done = 0;
    for (int ctx : *contexts) {
      std::vector<std::vector<tq::SpeedResult>> runs(caches.size());
      for (int r = 0; r < std::max(1, *reps); ++r)
        for (size_t ci = 0; ci < caches.size(); ++ci) {
          runs[ci].push_back(tq::bench_speed(L->model, tokens, ctx, *decode, kvs[ci]));
          pb.update(++done);
        }
      for (size_t ci = 0; ci < caches.size(); ++ci) {
        auto each = [&](size_t c, double tq::SpeedResult::*f) {
          std::vector<double> v;
          for (auto& x : runs[c]) v.push_back(x.*f);
          return v;
        };
        auto med = [&](size_t c, double tq::SpeedResult::*f) {
          std::vector<double> v = each(c, f);
          std::sort(v.begin(), v.end());
          return v[v.size() / 2];
        };
        const double pf = med(ci, &tq::SpeedResult::prefill_tok_s);
        const double dc = med(ci, &tq::SpeedResult::decode_tok_s);
        rows.push_back({{"context", ctx}, {"cache", caches[ci]}, {"kv", kvs[ci].resolved(L->model.config()).to_string()}, {"prefill_tok_s", pf}, {"decode_tok_s", dc},
                        {"prefill_vs_first", pf / med(0, &tq::SpeedResult::prefill_tok_s)},
                        {"decode_vs_first", dc / med(0, &tq::SpeedResult::decode_tok_s)},
                        {"prefill_tok_s_each", each(ci, &tq::SpeedResult::prefill_tok_s)},
                        {"decode_tok_s_each", each(ci, &tq::SpeedResult::decode_tok_s)},
                        {"kv_bytes", runs[ci].back().kv_bytes},
                        {"kv_bytes_per_token", runs[ci].back().kv_bytes_per_token},
                        {"kv_tokens", runs[ci].back().kv_tokens}, {"decode_tokens", *decode}, {"reps", runs[ci].size()}});
      }
    }
    pb.finish();
    if (o->json) {
      tq::cli::print_json({{"threads", L->model.threads()}, {"blas_core", tq::cli::blas_core()}, {"prefill_matmul", tq::cli::prefill_matmul()},
                            {"attention", tq::attn_kernel_name(L->model.attention_kernel())},
                            {"prompt_bos", !tokens.empty() && L->tok.add_bos() && tokens[0] == L->tok.bos()},
                            {"load_average_1min", {{"start", load_start}, {"end", load1()}}}, {"rows", rows}});
      return;
    }
    // The resolved label: what ran, automatic sink and K means included (shortened).
    auto shown = [](const nlohmann::json& r) { return tq::short_label(r["kv"].get<std::string>()); };
    int w = 12;
    for (auto& r : rows) w = std::max(w, static_cast<int>(shown(r).size()));
    std::printf("%8s %-*s %12s %12s %9s %9s %12s\n", "context", w, "cache", "prefill t/s", "decode t/s", "pf ratio",
                "dec ratio", "kv MiB");
    for (auto& r : rows)
      std::printf("%8d %-*s %12.1f %12.2f %9.2f %9.2f %12.2f\n", r["context"].get<int>(), w,
                  shown(r).c_str(), r["prefill_tok_s"].get<double>(),
                  r["decode_tok_s"].get<double>(), r["prefill_vs_first"].get<double>(),
                  r["decode_vs_first"].get<double>(), r["kv_bytes"].get<double>() / 1048576.0);
    std::printf("threads %d, prefill matmul %s, OpenBLAS kernels %s\n", L->model.threads(),
                tq::cli::prefill_matmul().c_str(), tq::cli::blas_core().c_str());
  });
}

tq::cli::Registrar reg("bench-model", setup);

}  // namespace
