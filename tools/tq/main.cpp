// `tq`: the turboquant command-line tool (this module; tools/tq_launcher is the executable
// that loads it). Subcommands register themselves (cli.h).
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <vector>

#include "cli.h"
#include "tq/error.h"
#include "tq/simd.h"
#include "tq/tq.h"



// For the launcher's probe (a child process): the kernel set OpenBLAS picked in this environment.
extern "C" __attribute__((visibility("default"))) const char* tq_cli_blas_core() { return tq::simd::blas_core(); }

// The entry point the launcher (tools/tq_launcher) calls once the module is loaded.
extern "C" __attribute__((visibility("default"))) int tq_cli_main(int argc, char** argv) {
  CLI::App app{
      "tq: TurboQuant vector quantization, quantized KV cache and compressed vector search.\n"
      "Run `tq <command> --help` for the options of each command."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("turboquant ") + tq_version());
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
