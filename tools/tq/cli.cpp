// The subcommand registry, JSON output and progress bar of the `tq` CLI (cli.h).
// Kept apart from main() so that the CLI fuzz target can link the same registry.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "cli.h"

namespace tq::cli {

std::vector<std::pair<std::string, SetupFn>>& registry() {
  static std::vector<std::pair<std::string, SetupFn>> r;
  return r;
}

Registrar::Registrar(const char* key, SetupFn fn) { registry().emplace_back(key, fn); }

CLI::App* group(CLI::App& parent, const std::string& name, const std::string& help) {
  for (auto* s : parent.get_subcommands([](CLI::App*) { return true; }))
    if (s->get_name() == name) return s;
  auto* g = parent.add_subcommand(name, help);
  g->require_subcommand(1);
  return g;
}

CLI::App* subcommand(CLI::App& parent, const std::string& name, const std::string& help) {
  return parent.add_subcommand(name, help);
}

void print_json(const nlohmann::json& j) {
  std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
}

Progress::Progress(std::string label, size_t total) : label_(std::move(label)), total_(total) {
  const char* env = std::getenv("TQ_PROGRESS");
  enabled_ = env ? std::string(env) == "1" : isatty(2) != 0;
}
void Progress::update(size_t done) {
  if (!enabled_ || total_ == 0) return;
  int pct = static_cast<int>(100.0 * std::min(done, total_) / total_);
  if (pct == last_pct_) return;
  last_pct_ = pct;
  int bar = pct / 4;
  std::fprintf(stderr, "\r%s [%.*s%s%*s] %3d%% (%zu/%zu)", label_.c_str(), bar,
               "=========================", bar < 25 ? ">" : "", 24 - bar > 0 ? 24 - bar : 0, "",
               pct, done, total_);
  std::fflush(stderr);
}
void Progress::finish() {
  if (enabled_ && !finished_ && last_pct_ >= 0) std::fprintf(stderr, "\n");
  finished_ = true;
}
Progress::~Progress() { finish(); }

}  // namespace tq::cli
