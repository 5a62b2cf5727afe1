// `tq`: the turboquant command-line tool. Subcommands register themselves (cli.h).
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <vector>

#include "cli.h"
#include "tq/error.h"
#include "tq/simd.h"

namespace tq::cli {

namespace {
std::vector<std::pair<std::string, SetupFn>>& registry() {
  static std::vector<std::pair<std::string, SetupFn>> r;
  return r;
}
}  // namespace

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

void print_json(const nlohmann::json& j) { std::cout << j.dump(2) << std::endl; }

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

int main(int argc, char** argv) {
  CLI::App app{
      "tq: TurboQuant vector quantization, quantized KV cache and compressed vector search.\n"
      "Run `tq <command> --help` for the options of each command."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "turboquant 0.1.0");
  std::string simd_level;
  app.add_option("--simd", simd_level,
                 "SIMD level: auto (default), scalar, or one the host supports (also env TQ_SIMD)");
  auto& reg = tq::cli::registry();
  std::sort(reg.begin(), reg.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [key, fn] : reg) fn(app);
  app.parse_complete_callback([&] {
    if (!simd_level.empty()) tq::simd::set_level(simd_level);
  });
  // llama.cpp-style multi-letter short flags (CLI11 only takes one-letter short names).
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-ctk") argv[i] = const_cast<char*>("--cache-type-k");
    if (a == "-ctv") argv[i] = const_cast<char*>("--cache-type-v");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    std::cerr << "tq: error: " << what << " (see tq --help)" << std::endl;
    return 2;
  } catch (const tq::Error& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    std::cerr << "tq: error: " << what << std::endl;
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "tq: error: out of memory" << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "tq: error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
