// Running the built `tq` binary (TQ_CLI_PATH) from tests: test_cli_bad_input.cpp, test_kv_cache.cpp.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace tq_test {

// A whole file as bytes in a string ("" when it cannot be read).
inline std::string slurp_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

struct RunResult {
  int status = -1;  // exit code, or 128 + signal
  std::string out, err;
};

// The OPENBLAS_CORETYPE the user set (nullptr if none; tests/test_main.cpp may set one too).
inline const char* user_blas_core() {
  const char* c = ::getenv("OPENBLAS_CORETYPE");
  return ::getenv("TQ_TEST_BLAS_SET") || !c || !*c ? nullptr : c;
}

// Runs `tq args...` (no shell: arguments passed verbatim) in cwd (or the current directory),
// with the user's OPENBLAS_CORETYPE (none if only tests/test_main.cpp set it), stdin from
// /dev/null, TQ_PROGRESS=progress (default "0": no progress output; nullptr: unset, so tq
// picks by stderr, here a file), stdout and stderr captured through temp files.
inline RunResult run_tq(const std::vector<std::string>& args, const std::string& cwd = "",
                        const char* progress = "0") {
  static int counter = 0;
  const std::string base = (std::filesystem::temp_directory_path() /
                            ("tq_cli_run_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
                               .string();
  const std::string out_path = base + ".out", err_path = base + ".err";
  std::vector<std::string> argv_s{TQ_CLI_PATH};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0) ::_exit(127);
    ::dup2(o, 1);
    ::dup2(e, 2);
    const int in = ::open("/dev/null", O_RDONLY);
    if (in >= 0) ::dup2(in, 0);
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(127);
    if (::getenv("TQ_TEST_BLAS_SET")) {  // set by tests/test_main.cpp, not by the user: tq chooses
      ::unsetenv("OPENBLAS_CORETYPE");
      ::unsetenv("TQ_TEST_BLAS_SET");
    }
    if (progress) ::setenv("TQ_PROGRESS", progress, 1);
    else ::unsetenv("TQ_PROGRESS");
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  RunResult r;
  int st = 0;
  if (pid > 0 && ::waitpid(pid, &st, 0) == pid) r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp_text(out_path);
  r.err = slurp_text(err_path);
  std::remove(out_path.c_str());
  std::remove(err_path.c_str());
  return r;
}

// True when err is exactly one line `tq: error: ...`.
inline bool one_error_line(const std::string& err) {
  return err.rfind("tq: error: ", 0) == 0 && err.find('\n') == err.size() - 1;
}

// True when r is a clean failure: non-zero exit (no signal), nothing on stdout, one line
// `tq: error: ...` on stderr.
inline bool failed_cleanly(const RunResult& r) {
  return r.status > 0 && r.status < 128 && r.out.empty() && one_error_line(r.err);
}

}  // namespace tq_test
