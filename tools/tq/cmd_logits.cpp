// `tq logits`: the next-token logits of a GGUF model on given token ids (or a prompt), as JSON:
// what the outside-reference scripts compare with llama.cpp and with a float64 reference.
#include <cstdio>
#include <sstream>

#include "llm_cli.h"

namespace {

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::string t = s;
  for (char& ch : t)
    if (ch == ',') ch = ' ';
  std::istringstream in(t);
  long long v;
  while (in >> v) {
    TQ_CHECK(v >= 0 && v < (1ll << 31), "--ids: %lld is not a token id", v);
    ids.push_back(static_cast<int32_t>(v));
  }
  TQ_CHECK(in.eof(), "--ids: '%s' is not a list of token ids", s.c_str());
  return ids;
}

void setup(CLI::App& app) {
  auto* s = tq::cli::subcommand(app, "logits",
                                "Print the next-token logits of a GGUF model on token ids (JSON).\n"
                                "Example: tq logits -m model.gguf --ids 1,2,3 --all-rows");
  auto o = std::make_shared<tq::cli::ModelOpts>();
  auto ids_s = std::make_shared<std::string>();
  auto prompt = std::make_shared<std::string>();
  auto all_rows = std::make_shared<bool>(false);
  auto decode = std::make_shared<bool>(false);
  auto ubatch = std::make_shared<int>(512);
  tq::cli::add_model_opts(s, *o, 0);
  tq::cli::add_kv_opts(s, *o);
  s->add_option("--ids", *ids_s, "token ids, separated by spaces or commas (no BOS is added)");
  s->add_option("-p,--prompt", *prompt, "text instead of --ids (tokenized with BOS)");
  s->add_flag("--all-rows", *all_rows, "the logits of every position (default: the last one)");
  s->add_flag("--decode", *decode, "feed the tokens one at a time (decode path) instead of one prefill");
  s->add_option("--ubatch", *ubatch, "prefill micro-batch")->capture_default_str();
  s->callback([=] {
    auto L = tq::cli::load_model(*o);
    TQ_CHECK(ids_s->empty() != prompt->empty(), "give exactly one of --ids and -p");
    const std::vector<int32_t> ids = ids_s->empty() ? tq::cli::model_tokens(*L, *prompt) : parse_ids(*ids_s);
    TQ_CHECK(!ids.empty(), "no tokens");
    const int n = static_cast<int>(ids.size());
    const int ctx = o->ctx > 0 ? o->ctx : n;
    TQ_CHECK(n <= ctx, "%d tokens exceed the context %d (-c)", n, ctx);
    L->model.set_ubatch(*ubatch);
    tq::KvCache cache(o->kv.resolve(L->model.config(), ctx));
    const auto& c = L->model.config();
    std::vector<float> hidden(static_cast<size_t>(n) * c.n_embd);
    if (*decode) {
      for (int i = 0; i < n; ++i) L->model.forward(cache, &ids[i], 1, hidden.data() + static_cast<size_t>(i) * c.n_embd);
    } else {
      L->model.forward(cache, ids.data(), n, hidden.data());
    }
    const int first = *all_rows ? 0 : n - 1;
    std::vector<float> lg(static_cast<size_t>(n - first) * c.n_vocab);
    L->model.logits(hidden.data() + static_cast<size_t>(first) * c.n_embd, n - first, lg.data());
    nlohmann::json rows = nlohmann::json::array();
    for (int r = 0; r < n - first; ++r)
      rows.push_back(std::vector<float>(lg.begin() + static_cast<size_t>(r) * c.n_vocab,
                                        lg.begin() + static_cast<size_t>(r + 1) * c.n_vocab));
    tq::cli::print_json({{"arch", c.arch}, {"n_vocab", c.n_vocab}, {"n_tokens", n}, {"first_row", first},
                         {"head_dim", c.head_dim}, {"kv", tq::cli::kv_json(o->kv, c)},
                         {"prefill_matmul", tq::cli::prefill_matmul()}, {"logits", rows}});
  });
}

tq::cli::Registrar reg("logits", setup);

}  // namespace
