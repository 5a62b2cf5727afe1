// The `tq` command line: each subcommand lives in its own cmd_*.cpp and registers itself
// with a static Registrar, so adding a command touches no other file.
//
//   static void setup(CLI::App& app) {
//     auto* sub = tq::cli::subcommand(app, "codebook", "Print a Lloyd-Max codebook");
//     ...; sub->callback([=] { ... });
//   }
//   static tq::cli::Registrar reg("codebook", setup);
//
// Nested commands (`tq bench codec`, `tq index build`) get their parent with
// tq::cli::group(app, "bench", "...").
// Errors: throw tq::Error; main() prints `tq: error: <message>` on one line and exits 1.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace tq::cli {

using SetupFn = void (*)(CLI::App& app);

struct Registrar {
  Registrar(const char* key, SetupFn fn);
};
// Every registered (key, setup) pair, in registration order.
std::vector<std::pair<std::string, SetupFn>>& registry();

// A subcommand of `parent` (created once; later calls return the same object).
CLI::App* group(CLI::App& parent, const std::string& name, const std::string& help);
// A new leaf subcommand.
CLI::App* subcommand(CLI::App& parent, const std::string& name, const std::string& help);

// Print one JSON object on stdout (for --json). Strings that are not valid UTF-8 (model text
// can end inside a multi-byte character: byte-level tokens) get U+FFFD for each bad byte
// instead of failing the whole output.
void print_json(const nlohmann::json& j);

// Progress on stderr for long runs: "label [=====>    ] 42% (done/total)"; silent when
// stderr is not a terminal unless TQ_PROGRESS=1.
class Progress {
 public:
  Progress(std::string label, size_t total);
  void update(size_t done);
  void finish();
  ~Progress();
 private:
  std::string label_;
  size_t total_;
  bool enabled_;
  int last_pct_ = -1;
  bool finished_ = false;
};

}  // namespace tq::cli
