// `tq tokenize`: text -> token ids with the model's tokenizer (and the decode round trip).
#include <cstdio>

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
  s->add_option("-m,--model", *model, "GGUF model (default: models/SmolLM2-135M-Instruct.Q4_1.gguf)");
  s->add_option("-p,--prompt", *prompt, "text");
  s->add_option("-f,--file", *file, "text file (instead of -p)");
  s->add_flag("--parse-special", *special, "recognise special tokens such as <|im_start|> in the text");
  s->add_flag("--ids", *ids_only, "print only the ids, one line, space separated");
  s->add_flag("--json", *json, "print one JSON object on stdout");
  s->callback([=] {
    auto g = tq::GgufFile::open(tq::cli::resolve_model(*model));
    tq::Tokenizer tok(g);
    const std::string text = file->empty() ? *prompt : tq::read_text_file(*file);
    const std::vector<int32_t> ids = tok.encode_with_bos(text, *special);
    const bool round_trip = tok.decode(ids, *special) == text;
    if (*json) {
      tq::cli::print_json({{"n_tokens", ids.size()}, {"ids", ids}, {"round_trip", round_trip},
                           {"pre", tok.pre_type()}});
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
