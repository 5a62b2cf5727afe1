// Matrix-vector products straight from GGUF weight blocks (internal to the library; used by
// the decode path of LlamaModel, tested in tests/test_qmatvec.cpp).
//
//   y[r * ldy + o] = sum_i W[o, i] x[r * in + i]      o < out, r < n (a few rows of x)
//
// W is `out` rows of `in` values stored as ggml type t (every type of tq/gguf.h: F32, F16,
// BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; the block layouts are there), row o at
// w + o * ggml_row_bytes(t, in).
//
// Integer activations (the types of qmatvec_int16: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, the
// ones Gemma 3 and SmolLM2 GGUFs decode with). Each row of x is first rounded per 32-value
// block to 16-bit codes, x16_j = dx q_j with dx = max|x_j| / 32767 and q_j = round(x_j / dx)
// in [-32767, 32767] (quantize_x16), so |x_j - x16_j| <= dx / 2. Then per block an integer
// dot product of the weight codes with q (int16 pairs into int32 lanes: exact), scaled in
// float:
//   sum_j (d c_j + m) x16_j = (d dx) * sum_j c_j q_j + m * (dx sum_j q_j)
// with c_j the signed codes (Q4_0: nibble - 8, Q5_0: 5-bit value - 16, Q8_0: the int8, Q6_K:
// 6-bit value - 32 with d = d sc per 16-value group) and m the offset of Q4_1 (m of the block)
// and Q4_K (-dmin mn of the 32-value sub-block; d = d sc). The result is the product of the
// dequantized weights with x16 up to float rounding (~(nb + 40) ulps of sum |terms|, nb = in /
// 32), and differs from the float product with x by at most sum_b (dx_b / 2) sum_{j in b}
// |W[o, j]| (the rounding of the activations, 2^-16 of max|x| per value; see docs/design.md
// for why 16 bits and not llama.cpp's 8).
//
// The other types (Q5_1, Q5_K, F16, BF16, F32): float arithmetic throughout (x is not
// quantized), sum_j (d q_j + m) x_j = d * sum_j q_j x_j + m * sum_j x_j with the per-32 sums
// of x computed once per call; each block (32 values; 32-value chunks for the float types) is
// summed on its own and the block results are accumulated, so the rounding error is at most
// ~(32 + 8 + nb) ulps of sum |terms| at every SIMD level and in the scalar reference.
//
// The SIMD kernels (qmatvec_simd.cpp, Highway dynamic dispatch) read up to 8 rows of x per
// pass over W (4 on targets with 16 vector registers); simd::use_scalar() selects the plain
// scalar reference qmatvec_ref (the same 16-bit rounding of x, the same integer sums).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "tq/common.h"
#include "tq/gguf.h"

namespace tq::llm {

// The split of a projection's output rows over OpenMP threads (qmatvec, qgemm, the model's
// f32 path and its grouped decode products): at most n_threads chunks of at least 64 rows,
// chunk c of row_chunks(...) covering rows [row_chunk_start(out, chunks, c), ...(c + 1)).
inline int row_chunks(int out, int n_threads) noexcept { return std::max(1, std::min(n_threads, out / 64)); }
inline int row_chunk_start(int out, int chunks, int c) noexcept {
  return static_cast<int>(static_cast<int64_t>(out) * c / chunks);
}
// f(o0, o1) runs once per chunk, chunk c on thread c. One chunk: f on the calling thread, no
// OpenMP region (an `if (false)` region still costs libgomp ~0.7 us: a team of one).
template <class F>
void parallel_rows(int out, int n_threads, F&& f) {
  const int chunks = row_chunks(out, n_threads);
  if (chunks == 1) {
    f(0, out);
    return;
  }
#pragma omp parallel for num_threads(chunks) schedule(static)
  for (int c = 0; c < chunks; ++c) f(row_chunk_start(out, chunks, c), row_chunk_start(out, chunks, c + 1));
}

// Rows of x given to one kernel call (at most; more rows: several calls). The SIMD kernel
// makes one pass over the weights for up to 8 rows with 32 vector registers (AVX-512), up to
// 4 with 16.
constexpr int kQMatvecMaxRows = 8;

// True for the types the kernels read (every GgmlType).
bool qmatvec_supported(GgmlType t) noexcept;
// True for the types whose products use integer (16-bit) activations (Q4_0, Q4_1, Q5_0, Q8_0,
// Q4_K, Q6_K).
bool qmatvec_int16(GgmlType t) noexcept;
// True for the float-activation types whose kernels take the per-32 sums of x (Q5_1, Q5_K).
bool qmatvec_needs_block_sums(GgmlType t) noexcept;

// The whole product, parallel over output rows (n_threads OpenMP threads, at most one per 64
// rows). Checks: supported type, in > 0 and a multiple of the block size, out >= 0, n >= 0,
// ldy >= out; tq::Error otherwise. Dispatches to the SIMD kernels or to qmatvec_ref.
void qmatvec(GgmlType t, const void* w, int in, int out, const float* x, int n, float* y, int ldy,
             int n_threads);

// Scalar reference, same contract, single thread.
void qmatvec_ref(GgmlType t, const void* w, int in, int out, const float* x, int n, float* y, int ldy);

// The same product for many rows of x (prefill), parallel over output rows like qmatvec
// (n_threads OpenMP threads, at most one per 64 rows), the weights kept in their GGUF blocks
// (no f32 copy of the model). Two paths:
//  - integer activations (qgemm_int16(t): the types of qmatvec_int16 at the avx3 / avx3_dl
//    levels): x rounded to 16 bits (quantize_x16, in parallel over rows), then each thread
//    unpacks `panel_rows` weight rows at a time to 16-bit codes and multiplies them with the
//    rows of x with detail::qgemm16_rows_avx512; the result and its error bound are those of
//    qmatvec for these types (the products of qmv16_rows_ref, in another float order);
//    panel_rows <= 0 picks qgemm16_panel_rows(in);
//  - float (every other type and level): each thread dequantizes `panel_rows` weight rows at a
//    time (tq::dequantize_row) into its own f32 buffer and multiplies the panel with
//    single-threaded OpenBLAS sgemm; panel_rows <= 0 picks qgemm_panel_rows(in).
// Any GgmlType. Same checks as qmatvec; tq::Error otherwise.
void qgemm(GgmlType t, const void* w, int in, int out, const float* x, int n, float* y, int ldy, int n_threads,
           int panel_rows = 0);
// Default panel height: about kQGemmPanelFloats f32 values (1 MB) per panel, a multiple of 16
// rows, at least 16. SmolLM2-135M prefill of 512 tokens at 2 threads (tq bench model, two
// alternating rounds): 16K floats 461-483 tok/s, 64K 570-602, 256K 608, 1M 601-606, the
// f32-copy GEMM 600-615: small panels starve sgemm, from 256K on it matches the full copy.
constexpr int kQGemmPanelFloats = 1 << 18;
int qgemm_panel_rows(int in) noexcept;
// True when qgemm takes the integer-activation path for type t at the current SIMD level:
// the types of qmatvec_int16 at the avx3 and avx3_dl levels (an AVX-512 host). Each row of x
// is rounded to 16 bits as in qmatvec (quantize_x16; the same error bound) and a panel of
// weight rows is unpacked once to 16-bit codes, then multiplied with the rows of x by
// detail::qgemm16_rows_avx512 (vpdpwssd at avx3_dl): the products of qmv16_rows_ref in
// another float order. Other types and levels: the float path above.
bool qgemm_int16(GgmlType t) noexcept;
// Default panel height of the integer path: about kQGemm16PanelBytes of unpacked tiles (16
// rows each), a multiple of 16 rows.
constexpr size_t kQGemm16PanelBytes = size_t{1} << 18;
int qgemm16_panel_rows(int in) noexcept;

namespace detail {
// Software prefetch distance in bytes of the weight stream in the decode kernels (every SIMD
// level): the Gemma 3 270M output matrix (178 MB of Q8_0, one thread, bench_qmatvec
// GemmaHead/1) took 1.42x less CPU time with 4096 bytes ahead than without on AVX-512, as
// little as a plain read of the same bytes (GemmaHeadRead/1); 1024 bytes: 1.26x (measured with
// the 8-bit vpdpbusd version of the AVX-512 kernels).
constexpr int kWeightPrefetch = 4096;
// The 16-bit rounding of n rows of x (in a multiple of 32) per 32-value block b: codes at
// q[r * in + i], scale dx at d[r * (in / 32) + b] and the block sum of the rounded values
// dx * sum q at s[...] (the offset term's operand). A block whose largest |x| is 0 gets dx = 0
// and codes 0; one holding inf or NaN gets codes 0 and dx = s = NaN (the product is NaN, as
// the float product would be inf or NaN).
void quantize_x16(const float* x, int n, int in, int16_t* q, float* d, float* s) noexcept;
// What the integer kernels read for n rows of x: quantize_x16's output.
struct X16 {
  const int16_t* q;
  const float* d;
  const float* s;
  // The same for the rows from r0 on.
  X16 from(int r0, int in) const noexcept {
    const size_t k = static_cast<size_t>(r0) * (in / 32);
    return {q + static_cast<size_t>(r0) * in, d + k, s + k};
  }
};
// Integer-activation kernels on output rows [o0, o1) for n rows; no checks. qmv16_rows_simd:
// the AVX-512 kernels (qmatvec_avx512.cpp) at the avx3 and avx3_dl levels, else the Highway
// ones, else the reference.
void qmv16_rows_ref(GgmlType t, const uint8_t* w, int in, const X16& x, int n, int o0, int o1, float* y,
                    int ldy) noexcept;
void qmv16_rows_simd(GgmlType t, const uint8_t* w, int in, const X16& x, int n, int o0, int o1, float* y,
                     int ldy) noexcept;
void qmv16_rows_highway(GgmlType t, const uint8_t* w, int in, const X16& x, int n, int o0, int o1, float* y,
                        int ldy) noexcept;
bool qmv16_avx512_host_ok() noexcept;
void qmv16_rows_avx512(GgmlType t, const uint8_t* w, int in, const X16& x, int n, int o0, int o1, float* y,
                       int ldy) noexcept;
// Prefill GEMM on AVX-512 (qmatvec_avx512.cpp; see qgemm): output rows [o0, o1) for n rows
// of x, in panels of panel_rows weight rows (rounded down to a multiple of 16, at least 16)
// unpacked once to 16-bit codes and reused for every kQGemm16Rows rows of x; vnni: vpdpwssd
// (the avx3_dl level), else vpmaddwd + vpaddd. Same sums as qmv16_rows_ref (its reference)
// in another float order. No checks; only for the types of qmatvec_int16, on a host where
// qmv16_avx512_host_ok() (and, with vnni, AVX512_VNNI).
constexpr int kQGemm16Rows = 12;
constexpr size_t kQGemm16UnitBytes = (256 + 3 * 16) * 4;  // one 32-value unit of a 16-row tile
void qgemm16_rows_avx512(GgmlType t, const uint8_t* w, int in, const X16& x, int n, int o0, int o1, float* y,
                         int ldy, int panel_rows, bool vnni) noexcept;
// quantize_x16 on AVX-512 (the same bits); host as above.
void quantize_x16_avx512(const float* x, int n, int in, int16_t* q, float* d, float* s) noexcept;
// Per-block (32-value) sums of n rows of x: xs[r * (in / 32) + b]. Needed by the types of
// qmatvec_needs_block_sums (Q5_1, Q5_K).
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
