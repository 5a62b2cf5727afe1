// Which OpenBLAS kernel set to ask for on this CPU. OpenBLAS (Debian's 0.3.21, built with
// DYNAMIC_ARCH) picks its kernels from the CPU model when it is loaded; on models it does not
// know (a VM reporting a generic "Intel Xeon Processor", or CPUs newer than the library) it
// falls back to its SSE3 "Prescott" kernels: sgemm at 12 GFLOPS where its SkylakeX kernels
// reach 62 on the same VM, and an IVF build (k-means, nlist 1024) of GloVe 100k or
// Fashion-MNIST takes 3-4x the time (BENCHMARKS.md, "OpenBLAS's kernels for the index
// commands"). The variable it reads, OPENBLAS_CORETYPE, must be set before it loads, so the
// callers ask a process that has loaded it (tools/tq_launcher: a forked child;
// tests/test_main.cpp: itself, then re-executes; python/turboquant/__init__.py: a subprocess)
// and set the variable this returns; the test and benchmark binaries, which link OpenBLAS, run
// themselves again (rerun_with_blas_kernels). Header-only: the launcher links neither OpenBLAS
// nor the library.

#pragma once

#include <strings.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tq {

// The OPENBLAS_CORETYPE to set when OpenBLAS picked `detected` on this CPU, or nullptr to keep
// its choice: only the Prescott fallback on a CPU with AVX-512 (F, BW, VL, DQ: "SkylakeX") or
// AVX2 with FMA ("Haswell") is replaced.
inline const char* blas_core_for_cpu(const char* detected) {
  if (!detected || strcasecmp(detected, "Prescott") != 0) return nullptr;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

// True when TQ_NO_REEXEC is set to something other than 0: the environment stays as the user
// gave it (no OPENBLAS_CORETYPE chosen, no run again; the launcher's OpenMP settings neither).
inline bool env_as_given() {
  const char* no = std::getenv("TQ_NO_REEXEC");
  return no && *no && std::strcmp(no, "0") != 0;
}

// For a program that links OpenBLAS, given the kernel set it picked (tq::simd::blas_core()):
// unless OPENBLAS_CORETYPE is set or env_as_given(), when blas_core_for_cpu names a
// better set, sets OPENBLAS_CORETYPE to it (and `marker`, when given, to the same) and executes
// the program again with the same arguments. Returns when there is nothing to do, or when the
// exec failed (said on stderr; the run goes on with the kernels it has).
inline void rerun_with_blas_kernels(char** argv, const char* picked, const char* marker = nullptr) {
  if (env_as_given() || std::getenv("OPENBLAS_CORETYPE")) return;
  const char* core = blas_core_for_cpu(picked);
  if (!core) return;
  setenv("OPENBLAS_CORETYPE", core, 1);
  if (marker) setenv(marker, core, 1);
  execv("/proc/self/exe", argv);
  std::fprintf(stderr, "%s: could not run again with OPENBLAS_CORETYPE=%s; OpenBLAS runs %s\n", argv[0], core, picked);
}

}  // namespace tq
