// `tq`: a small launcher. The commands live in the module tq_cli (tools/tq, built as
// libtq_cli.so), loaded with dlopen once the run-time settings that libgomp and OpenBLAS read
// when they are loaded are in the environment. This executable links neither, so nothing has
// read the environment yet when it sets them; the CLI does not re-execute itself.
//
// Unless TQ_NO_REEXEC is set to something other than 0 (the settings as given):
//  - for the model commands (generate, perplexity, niah, logits, serve, calibrate, bench model /
//    attention), OMP_WAIT_POLICY=passive with GOMP_SPINCOUNT=3000 (only when the user set
//    neither): an idle OpenMP worker spins briefly (libgomp: 3000 polls, tens of microseconds),
//    then sleeps. Decode forks and joins ~250 parallel regions per token; sleeping at once
//    (passive, no spin) made 2-thread decode slower than 1 thread (63 vs 92 tok/s on a quiet
//    machine, 512 context), the short spin gives 141 tok/s; unbounded spinning (active) starved
//    the working thread when other jobs shared the 2 cores (1.7 vs 10.2 tok/s). With a busy
//    process on one of the 2 cores the short spin still loses to pure passive (44 vs 75 tok/s):
//    set OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=0 on an oversubscribed machine (docs/design.md).
//  - for every command, OPENBLAS_CORETYPE (src/common/blas_core.h): OpenBLAS picks kernels from
//    the CPU model and on models it does not know falls back to its Prescott (SSE3) kernels.
//    Unless the user set it, a child process (fork, no exec) loads the module and asks OpenBLAS
//    which kernels it chose; on Prescott with AVX-512 (AVX2 + FMA) this process sets SkylakeX
//    (Haswell) before loading the module itself. The probe costs about 13 ms per run.
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/blas_core.h"

namespace {

std::string exe_dir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<size_t>(n));
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

// Next to the executable (the build tree), else where `make install` puts it.
void* load_cli(const std::string& dir, std::string* err) {
  for (const std::string& p : {dir + "/" TQ_CLI_MODULE, dir + "/" TQ_CLI_MODULE_FROM_BIN "/" TQ_CLI_MODULE}) {
    if (void* h = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    if (err && err->empty()) *err = dlerror();
  }
  return nullptr;
}

bool model_command(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--simd") {
      ++i;
      continue;
    }
    if (a.empty() || a[0] == '-') continue;
    if (a == "bench") {
      const std::string b = i + 1 < argc ? argv[i + 1] : "";
      return b == "model" || b == "attention";
    }
    return a == "generate" || a == "perplexity" || a == "niah" || a == "logits" || a == "serve" || a == "calibrate";
  }
  return false;
}

// The kernel set OpenBLAS picks in this environment, asked in a child process ("" if unknown).
std::string blas_core_of_child(const std::string& dir) {
  int fd[2];
  if (pipe(fd) != 0) return "";
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fd[0]);
    close(fd[1]);
    return "";
  }
  if (pid == 0) {
    close(fd[0]);
    if (void* h = load_cli(dir, nullptr))
      if (auto core = reinterpret_cast<const char* (*)()>(dlsym(h, "tq_cli_blas_core"))) {
        const char* c = core();
        if (c && write(fd[1], c, strlen(c)) < 0) _exit(1);
      }
    _exit(0);
  }
  close(fd[1]);
  std::string out;
  char buf[64];
  for (ssize_t n; (n = read(fd[0], buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return out;
}

void set_runtime_env(const std::string& dir, bool model) {
  if (tq::env_as_given()) return;
  if (model && !std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT")) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    setenv("GOMP_SPINCOUNT", "3000", 1);
  }
  // The probe only where the fallback would be replaced: a CPU with AVX2 and FMA.
  if (std::getenv("OPENBLAS_CORETYPE") || !tq::blas_core_for_cpu("Prescott")) return;
  if (const char* core = tq::blas_core_for_cpu(blas_core_of_child(dir).c_str())) setenv("OPENBLAS_CORETYPE", core, 1);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = exe_dir();
  set_runtime_env(dir, model_command(argc, argv));
  std::string err;
  void* h = load_cli(dir, &err);
  auto cli_main = h ? reinterpret_cast<int (*)(int, char**)>(dlsym(h, "tq_cli_main")) : nullptr;
  if (!cli_main) {
    std::fprintf(stderr, "tq: error: cannot load the tq commands (%s): %s\n", TQ_CLI_MODULE,
                 h ? "no tq_cli_main" : err.c_str());
    return 1;
  }
  return cli_main(argc, argv);
}
