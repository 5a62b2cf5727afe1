// Fuzz target: the CLI argument layer of `tq` (number and type-name options of every
// subcommand, parsed by CLI11 with the declarations in tools/tq/cmd_*.cpp).
//
// The real subcommand sources are compiled into this target (each in its own namespace) and
// register themselves as in the `tq` binary; the registry is tools/tq/cli.cpp, shared with the binary.
// Each input is split at NUL bytes into at most 16 arguments and parsed by a fresh app; the
// root's parse-complete callback stops before any subcommand callback, so only parsing runs.
// Property: every argument vector either parses or is rejected with a CLI11 ParseError or a
// tq::Error (the --simd level); anything else, or a sanitizer report, is a finding.
//
// When another branch adds a tools/tq/cmd_*.cpp, include it below (its headers first).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "cli.h"
#include "fuzz_util.h"
#include "llm_cli.h"
#include "tq/common.h"
#include "tq/eval.h"
#include "tq/fileio.h"
#include "tq/gguf.h"
#include "tq/index.h"
#include "tq/kv_cache.h"
#include "tq/model.h"
#include "tq/tokenizer.h"
#include "tq/vecs.h"
#include "tq/codebook.h"
#include "tq/distortion.h"
#include "tq/error.h"
#include "tq/quantizer.h"
#include "tq/simd.h"

// The registry of the tq binary itself (tools/tq/cli.cpp).
#include "cli.cpp"

// The subcommands of the tq binary (same sources).
namespace cmd_bench_codec {
#include "cmd_bench_codec.cpp"
}
namespace cmd_codebook {
#include "cmd_codebook.cpp"
}
namespace cmd_distortion {
#include "cmd_distortion.cpp"
}
namespace cmd_bench_attention {
#include "cmd_bench_attention.cpp"
}
namespace cmd_bench_model {
#include "cmd_bench_model.cpp"
}
namespace cmd_generate {
#include "cmd_generate.cpp"
}
namespace cmd_index {
#include "cmd_index.cpp"
}
namespace cmd_niah {
#include "cmd_niah.cpp"
}
namespace cmd_perplexity {
#include "cmd_perplexity.cpp"
}
namespace cmd_tokenize {
#include "cmd_tokenize.cpp"
}

namespace {

// Thrown by the root's parse-complete callback, which CLI11 runs after every option has been
// converted and validated and before any subcommand callback: so nothing but parsing runs.
struct ParsedOnly {};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string dir = tq_fuzz::seed_dir();
  if (dir.empty()) return 0;
  // Seeds: valid command lines of each subcommand and a few near misses.
  const std::vector<std::vector<std::string>> lines = {
      {"codebook", "--dim", "128", "--bits", "4", "--law", "gauss", "--json"},
      {"codebook", "-d", "2", "-b", "8", "--scaled"},
      {"distortion", "-d", "64", "-b", "3", "-n", "100", "--rotation", "haar", "--quantizer", "prod"},
      {"distortion", "--seed", "18446744073709551615", "--norm", "f32", "--no-norm-correction"},
      {"distortion", "-n", "-1"},
      {"distortion", "-n", "1e3"},
      {"bench", "codec", "--threads", "2", "--reps", "3", "-n", "1000", "--json"},
      {"bench", "codec", "--threads", "0x10"},
      {"--simd", "scalar", "codebook"},
      {"perplexity", "-m", "m.gguf", "-c", "256", "-ctk", "tq3", "-ctv", "q8_0", "--kv-window", "32"},
      {"generate", "-m", "m.gguf", "-t", "2", "--kv-boundary-layers", "2", "--kv-boundary-type", "f16"},
      {"niah", "-c", "-5"},
      {"index", "build", "--help"},
      {"index", "search", "-k", "10"},
      {"bench", "attention", "--threads", "2"},
      {"tokenize", "hello"},
      {"codebook", "--dim", "99999999999999999999"},
  };
  int k = 0;
  for (const auto& l : lines) {
    std::string b;
    for (size_t i = 0; i < l.size(); ++i) {
      if (i) b.push_back('\0');
      b += l[i];
    }
    tq_fuzz::write_seed(dir, "args_" + std::to_string(k++), b.data(), b.size());
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args{"tq"};
  {
    std::string cur;
    for (size_t i = 0; i < size && args.size() < 17; ++i) {
      if (data[i] == 0) {
        args.push_back(cur);
        cur.clear();
      } else {
        cur.push_back(static_cast<char>(data[i]));
      }
    }
    if (args.size() < 17) args.push_back(cur);
  }
  std::vector<const char*> argv;
  for (auto& a : args) {  // llama.cpp-style flags, mapped as tools/tq/main.cpp does
    if (a == "-ctk") a = "--cache-type-k";
    if (a == "-ctv") a = "--cache-type-v";
    argv.push_back(a.c_str());
  }

  CLI::App app{"tq"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "turboquant");
  std::string simd_level;
  app.add_option("--simd", simd_level, "SIMD level");
  auto& reg = tq::cli::registry();
  std::sort(reg.begin(), reg.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [key, fn] : reg) fn(app);
  app.parse_complete_callback([&] {
    if (!simd_level.empty()) tq::simd::ScopedLevel check(simd_level);  // validate, then restore
    throw ParsedOnly{};
  });
  // Help and errors would print to stdout/stderr: keep the fuzzer's output readable.
  std::ostringstream sink;
  auto* old_out = std::cout.rdbuf(sink.rdbuf());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const ParsedOnly&) {
  } catch (const CLI::Error&) {
  } catch (const tq::Error&) {
  } catch (...) {
    std::cout.rdbuf(old_out);
    throw;
  }
  std::cout.rdbuf(old_out);
  return 0;
}
