// The subcommand registry, JSON output and progress reporting of the `tq` CLI (cli.h).
// Kept apart from main() so that the CLI fuzz target can link the same registry.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "cli.h"
#include "tq/common.h"
#include "tq/error.h"

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

Progress::Mode Progress::mode_from_env() {
  const char* env = std::getenv("TQ_PROGRESS");
  if (env) {
    const std::string e(env);
    if (e == "0") return Mode::off;
    if (e == "1") return Mode::bar;
    if (e == "lines") return Mode::lines;
  }
  return isatty(2) != 0 ? Mode::bar : Mode::lines;
}

Progress::Progress(std::string label, size_t total)
    : label_(std::move(label)), total_(total), mode_(mode_from_env()), t0_(tq::wall_seconds()) {}

namespace {
// "4.2s", "2m10s", "1h05m".
std::string duration(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  if (s < 60) return strprintf("%.1fs", s);
  const long t = static_cast<long>(s + 0.5);
  if (t < 3600) return strprintf("%ldm%02lds", t / 60, t % 60);
  return strprintf("%ldh%02ldm", t / 3600, t / 60 % 60);
}
}  // namespace

void Progress::update(size_t done) {
  if (mode_ == Mode::off || total_ == 0) return;
  done = std::min(done, total_);
  const int pct = static_cast<int>(100.0 * done / total_);
  if (mode_ == Mode::bar) {
    if (pct == last_pct_) return;
    last_pct_ = pct;
    int bar = pct / 4;
    std::fprintf(stderr, "\r%s [%.*s%s%*s] %3d%% (%zu/%zu)", label_.c_str(), bar,
                 "=========================", bar < 25 ? ">" : "", 24 - bar > 0 ? 24 - bar : 0, "",
                 pct, done, total_);
    std::fflush(stderr);
    return;
  }
  // Lines: the first step, each new 10%, 100% once, and at least every 30 s while it advances.
  if (finished_) return;
  const double now = tq::wall_seconds();
  const bool first = last_pct_ < 0, step = pct / 10 > last_pct_ / 10;
  const bool end = done == total_ && last_pct_ < 100;
  const bool timed = done > last_done_ && now - last_line_ >= 30;
  if (!(first || step || end || timed)) return;
  last_pct_ = pct;
  last_done_ = done;
  last_line_ = now;
  const double el = now - t0_;
  const std::string eta = done == total_ ? "done" : done == 0 ? "ETA ?" : "ETA " + duration(el * (total_ - done) / done);
  std::fprintf(stderr, "%s: %d%% (%zu/%zu), %s elapsed, %s\n", label_.c_str(), pct, done, total_,
               duration(el).c_str(), eta.c_str());
  std::fflush(stderr);
}
void Progress::finish() {
  if (mode_ == Mode::bar && !finished_ && last_pct_ >= 0) std::fprintf(stderr, "\n");
  finished_ = true;
}
Progress::~Progress() { finish(); }

}  // namespace tq::cli
