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

// Progress on stderr for long runs (every tq command that reports progress uses this).
// On a terminal, a bar redrawn in place: "label [=====>    ] 42% (done/total)". When stderr
// is not a terminal (nohup, CI, a pipe, a file), plain lines instead:
// "label: 40% (400/1000), 2m10s elapsed, ETA 3m15s", one at the first step, at each further
// 10% and at least every 30 s while it advances, and at 100%. TQ_PROGRESS overrides the
// choice: 0 = nothing, 1 = the bar, lines = the lines.
class Progress {
 public:
  enum class Mode { off, bar, lines };
  // The clock starts here: construct it when the work starts; total may come with the first
  // update (the library's callbacks pass it).
  explicit Progress(std::string label, size_t total = 0);
  void update(size_t done);
  void update(size_t done, size_t total) {
    total_ = total;
    update(done);
  }
  void finish();
  ~Progress();
  // The mode TQ_PROGRESS and stderr select.
  static Mode mode_from_env();
 private:
  std::string label_;
  size_t total_;
  Mode mode_;
  double t0_;
  int last_pct_ = -1;
  double last_line_ = 0;  // wall time of the last plain line
  size_t last_done_ = 0;
  bool finished_ = false;
};

}  // namespace tq::cli
