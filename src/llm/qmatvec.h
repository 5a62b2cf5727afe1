// Matrix-vector products straight from GGUF weight blocks (internal to the library; used by
// the decode path of LlamaModel, tested in tests/test_qmatvec.cpp).
//
//   y[r * ldy + o] = sum_i W[o, i] x[r * in + i]      o < out, r < n (a few rows of x)
//
// W is `out` rows of `in` values stored as ggml type t (every type of tq/gguf.h: F32, F16,
// BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; the block layouts are there), row o at
// w + o * ggml_row_bytes(t, in). Block types use, per block or sub-block of 32 values,
//   sum_j (d q_j + m) x_j = d * sum_j q_j x_j + m * sum_j x_j
// (Q4_1 / Q5_1: m from the block; Q4_0 / Q5_0: q unsigned, m = -8 d / -16 d; Q4_K / Q5_K:
// d = d sc, m = -dmin mn of the sub-block; Q8_0: m = 0) with the per-32 sums of x computed
// once per call; Q6_K sums each 16-value group of (q - 32) x and scales it by d sc. Float
// arithmetic throughout (x is not quantized); each block (32 values, 16 for Q6_K; 32-value
// chunks for the float types) is summed on its own and the block results are accumulated, so
// the rounding error is at most ~(32 + groups + 8) ulps of sum |terms| at every SIMD level and
// in the scalar reference (see tests/test_qmatvec.cpp for the bound).
//
// The SIMD kernels (qmatvec_simd.cpp, Highway dynamic dispatch) read up to 8 rows of x per
// pass over W (4 on targets with 16 vector registers); simd::use_scalar() selects the plain
// scalar reference qmatvec_ref.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "tq/common.h"
#include "tq/gguf.h"

namespace tq::llm {

// The split of a projection's output rows over OpenMP threads (qmatvec, qgemm and the model's
// f32 path): at most n_threads chunks of at least 64 rows; f(o0, o1) runs once per chunk.
template <class F>
void parallel_rows(int out, int n_threads, F&& f) {
  const int chunks = std::max(1, std::min(n_threads, out / 64));
#pragma omp parallel for num_threads(chunks) schedule(static) if (chunks > 1)
  for (int c = 0; c < chunks; ++c)
    f(static_cast<int>(static_cast<int64_t>(out) * c / chunks),
      static_cast<int>(static_cast<int64_t>(out) * (c + 1) / chunks));
}

// Rows of x given to one kernel call (at most; more rows: several calls). The SIMD kernel
// makes one pass over the weights for up to 8 rows with 32 vector registers (AVX-512), up to
// 4 with 16.
constexpr int kQMatvecMaxRows = 8;

// True for the types the kernels read (every GgmlType).
bool qmatvec_supported(GgmlType t) noexcept;
// True for the types whose kernels take the per-32 sums of x (an offset term m).
bool qmatvec_needs_block_sums(GgmlType t) noexcept;

// The whole product, parallel over output rows (n_threads OpenMP threads, at most one per 64
// rows). Checks: supported type, in > 0 and a multiple of the block size, out >= 0, n >= 0,
// ldy >= out; tq::Error otherwise. Dispatches to the SIMD kernels or to qmatvec_ref.
void qmatvec(GgmlType t, const void* w, int in, int out, const float* x, int n, float* y, int ldy,
             int n_threads);

// Scalar reference, same contract, single thread.
void qmatvec_ref(GgmlType t, const void* w, int in, int out, const float* x, int n, float* y, int ldy);

// The same product for many rows of x (prefill): each thread dequantizes `panel_rows` weight
// rows at a time (tq::dequantize_row) into its own f32 buffer and multiplies the panel with
// single-threaded OpenBLAS sgemm, so the weights stay in their GGUF blocks and no f32 copy of
// the model is needed. Parallel over output rows like qmatvec (n_threads OpenMP threads, at
// most one per 64 rows). Any type dequantize_row reads (every GgmlType);
// panel_rows <= 0 picks qgemm_panel_rows(in). Same checks as qmatvec; tq::Error otherwise.
void qgemm(GgmlType t, const void* w, int in, int out, const float* x, int n, float* y, int ldy, int n_threads,
           int panel_rows = 0);
// Default panel height: about kQGemmPanelFloats f32 values (1 MB) per panel, a multiple of 16
// rows, at least 16. SmolLM2-135M prefill of 512 tokens at 2 threads (tq bench model, two
// alternating rounds): 16K floats 461-483 tok/s, 64K 570-602, 256K 608, 1M 601-606, the
// f32-copy GEMM 600-615: small panels starve sgemm, from 256K on it matches the full copy.
constexpr int kQGemmPanelFloats = 1 << 18;
int qgemm_panel_rows(int in) noexcept;

namespace detail {
// Per-block (32-value) sums of n rows of x: xs[r * (in / 32) + b]. Needed by the types of
// qmatvec_needs_block_sums (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K).
void qmv_block_sums(const float* x, int n, int in, float* xs) noexcept;
// Kernel entry points on output rows [o0, o1); no checks. xs from qmv_block_sums (Q4 types).
void qmv_rows_ref(GgmlType t, const uint8_t* w, int in, const float* x, const float* xs, int n, int o0,
                  int o1, float* y, int ldy) noexcept;
void qmv_rows_simd(GgmlType t, const uint8_t* w, int in, const float* x, const float* xs, int n, int o0,
                   int o1, float* y, int ldy) noexcept;
// tq::dequantize_row's SIMD kernels (qmatvec_simd.cpp) for every block type, F16 and BF16:
// the reference's bits; false for another type (F32). No checks.
bool dequantize_row_simd(GgmlType t, const void* src, float* dst, size_t n) noexcept;
}  // namespace detail

}  // namespace tq::llm
