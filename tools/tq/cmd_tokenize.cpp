// `tq tokenize`: text -> token ids with the model's tokenizer (and the decode round trip).
#include <chrono>
#include <cstdio>
#include <ctime>

#include "llm_cli.h"

namespace {

void setup(CLI::App& app) {
  auto* s = tq::cli::subcommand(app, "tokenize",
                                "Tokenize text with a GGUF model's tokenizer.\n"
                                "Example: tq tokenize -p 'Hello world' --json");
  auto model = std::make_shared<std::string>();
  auto prompt = std::make_shared<std::string>();
  auto file = std::make_shared<std::string>();
  auto special = std::make_shared<bool>(false);
  auto json = std::make_shared<bool>(false);
  auto ids_only = std::make_shared<bool>(false);
  auto no_bos = std::make_shared<bool>(false);
  s->add_option("-m,--model", *model, "GGUF model (default: models/SmolLM2-135M-Instruct.Q4_1.gguf)");
  s->add_option("-p,--prompt", *prompt, "text");
  s->add_option("-f,--file", *file, "text file (instead of -p)");
  s->add_flag("--parse-special", *special, "recognise special tokens such as <|im_start|> in the text");
  s->add_flag("--no-bos", *no_bos, "do not add the BOS / EOS tokens the model asks for (add_bos / add_eos)");
  s->add_flag("--ids", *ids_only, "print only the ids, one line, space separated");
  s->add_flag("--json", *json, "print one JSON object on stdout");
  s->callback([=] {
    auto g = tq::GgufFile::open(tq::cli::resolve_model(*model));
    tq::Tokenizer tok(g);
    const std::string text = file->empty() ? *prompt : tq::read_text_file(*file);
    const auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    const std::vector<int32_t> ids = *no_bos ? tok.encode(text, *special) : tok.encode_with_bos(text, *special);
    const double cpu_ms = 1000.0 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // Round trip of the text itself: without the BOS / EOS that encode_with_bos added.
    std::vector<int32_t> body = ids;
    if (!*no_bos && tok.add_eos() && !body.empty()) body.pop_back();
    if (!*no_bos && tok.add_bos() && !body.empty()) body.erase(body.begin());
    const bool round_trip = tok.decode(body, *special) == text;
    if (*json) {
      tq::cli::print_json({{"n_tokens", ids.size()}, {"ids", ids}, {"round_trip", round_trip},
                           {"model", tok.model_type()}, {"pre", tok.pre_type()}, {"tokenize_ms", ms}, {"tokenize_cpu_ms", cpu_ms}});
    } else if (*ids_only) {
      for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
      std::printf("\n");
    } else {
      for (int32_t id : ids) std::printf("%6d  '%s'\n", id, tok.token_to_piece(id, true).c_str());
      std::printf("%zu tokens, decode round trip %s\n", ids.size(), round_trip ? "exact" : "DIFFERS");
    }
  });
}

tq::cli::Registrar reg("tokenize", setup);

}  // namespace
