// The test binary's main: the tests run with the OpenBLAS kernels `tq` runs with. Where OpenBLAS
// did not know the CPU model and fell back to its SSE3 Prescott kernels on a CPU with AVX2,
// `tq` and the Python package set OPENBLAS_CORETYPE before OpenBLAS loads
// (src/common/blas_core.h); this binary links OpenBLAS, so it sets the variable and executes
// itself again. TQ_TEST_BLAS_SET names what it set, so that tests starting `tq` can give it
// the environment the user gave (tq_test::run_tq) and see the launcher make the same choice.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "common/blas_core.h"
#include "tq/simd.h"

int main(int argc, char** argv) {
  if (!std::getenv("OPENBLAS_CORETYPE"))
    if (const char* core = tq::blas_core_for_cpu(tq::simd::blas_core())) {
      setenv("OPENBLAS_CORETYPE", core, 1);
      setenv("TQ_TEST_BLAS_SET", core, 1);
      execv("/proc/self/exe", argv);
      std::fprintf(stderr, "tq_tests: could not re-execute with OPENBLAS_CORETYPE=%s; running with %s\n", core,
                   tq::simd::blas_core());
    }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
