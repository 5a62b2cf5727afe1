// The test binary's main: the tests run with the OpenBLAS kernels `tq` runs with. Where OpenBLAS
// did not know the CPU model and fell back to its SSE3 Prescott kernels on a CPU with AVX2,
// `tq` and the Python package set OPENBLAS_CORETYPE before OpenBLAS loads
// (src/common/blas_core.h); this binary links OpenBLAS, so it sets the variable and executes
// itself again (not with TQ_NO_REEXEC=1). TQ_TEST_BLAS_SET names what it set, so that tests
// starting `tq` can give it the environment the user gave (tq_test::run_tq) and see the
// launcher make the same choice.
#include <gtest/gtest.h>

#include "common/blas_core.h"
#include "tq/simd.h"

int main(int argc, char** argv) {
  tq::rerun_with_blas_kernels(argv, tq::simd::blas_core(), "TQ_TEST_BLAS_SET");
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
