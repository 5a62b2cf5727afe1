// Matrix-vector products from GGUF weight blocks: argument checks, the per-block sums of x,
// the OpenMP split over output rows and the scalar reference kernels (see qmatvec.h; the
// Highway kernels are in qmatvec_simd.cpp).
#include "llm/qmatvec.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tq/error.h"
#include "tq/simd.h"

namespace tq::llm {

bool qmatvec_int16(GgmlType t) noexcept {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q8_0: case GgmlType::Q4_K:
    case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

bool qmatvec_needs_block_sums(GgmlType t) noexcept {
  switch (t) {
    case GgmlType::Q5_1: case GgmlType::Q5_K:
      return true;
    default:
      return false;
  }
}

bool qmatvec_supported(GgmlType t) noexcept {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q4_0: case GgmlType::Q4_1:
    case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0: case GgmlType::Q4_K: case GgmlType::Q5_K:
    case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

namespace detail {

namespace {
inline uint16_t rd16(const uint8_t* p) noexcept {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
}  // namespace

void qmv_block_sums(const float* x, int n, int in, float* xs) noexcept {
  const int nb = in / 32;
  for (int r = 0; r < n; ++r)
    for (int b = 0; b < nb; ++b) {
      const float* v = x + static_cast<size_t>(r) * in + static_cast<size_t>(b) * 32;
      float s = 0;
      for (int j = 0; j < 32; ++j) s += v[j];
      xs[static_cast<size_t>(r) * nb + b] = s;
    }
}

// One output row for one row of x. Every type sums 32 values at a time and accumulates the
// per-block results (the same grouping as the SIMD kernels, so the error bound is shared).
namespace {
float row_dot_ref(GgmlType t, const uint8_t* row, int in, const float* x, const float* xs) noexcept {
  const int nb = in / 32;
  float acc = 0;
  switch (t) {
    case GgmlType::Q5_1: {
      const bool q51 = true;
      const size_t bb = sizeof(BlockQ5_1);
      for (int b = 0; b < nb; ++b, row += bb) {
        const float d = fp16_to_fp32(rd16(row));
        const float m = q51 ? fp16_to_fp32(rd16(row + 2)) : -16.0f * d;
        uint32_t qh;
        std::memcpy(&qh, row + (q51 ? 4 : 2), 4);
        const uint8_t* qs = row + (q51 ? 8 : 6);
        const float* xb = x + static_cast<size_t>(b) * 32;
        float s = 0;
        for (int j = 0; j < 16; ++j)
          s += static_cast<float>((qs[j] & 0xf) | (((qh >> j) & 1) << 4)) * xb[j];
        for (int j = 0; j < 16; ++j)
          s += static_cast<float>((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) * xb[16 + j];
        acc += d * s + m * xs[b];
      }
      return acc;
    }
    case GgmlType::Q5_K: {  // per 32-value sub-block: (d sc) sum q x - (dmin mn) sum x
      const bool q5 = true;
      const size_t bb = sizeof(BlockQ5_K);
      for (int b = 0; b < in / kQK; ++b, row += bb) {
        const float d = fp16_to_fp32(rd16(row));
        const float dmin = fp16_to_fp32(rd16(row + 2));
        const uint8_t* qh = row + 16;
        const uint8_t* qs = row + (q5 ? 48 : 16);
        for (int sb = 0; sb < 8; ++sb) {
          int sc, mn;
          kquant_scale_min(row + 4, sb, sc, mn);
          const uint8_t* q = qs + 32 * (sb / 2);
          const int shift = 4 * (sb % 2);
          const float* xb = x + static_cast<size_t>(b) * kQK + 32 * sb;
          float s = 0;
          for (int l = 0; l < 32; ++l) {
            int v = (q[l] >> shift) & 0xf;
            if (q5) v |= ((qh[l] >> sb) & 1) << 4;
            s += static_cast<float>(v) * xb[l];
          }
          acc += (d * static_cast<float>(sc)) * s - (dmin * static_cast<float>(mn)) * xs[b * 8 + sb];
        }
      }
      return acc;
    }
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::F32: {
      for (int i0 = 0; i0 < in; i0 += 32) {
        const int i1 = std::min(in, i0 + 32);
        float s = 0;
        for (int i = i0; i < i1; ++i) {
          float wv;
          if (t == GgmlType::F16) {
            wv = fp16_to_fp32(rd16(row + 2 * static_cast<size_t>(i)));
          } else if (t == GgmlType::BF16) {
            const uint32_t u = static_cast<uint32_t>(rd16(row + 2 * static_cast<size_t>(i))) << 16;
            std::memcpy(&wv, &u, 4);
          } else {
            std::memcpy(&wv, row + 4 * static_cast<size_t>(i), 4);
          }
          s += wv * x[i];
        }
        acc += s;
      }
      return acc;
    }
    default:
      break;
  }
  TQ_ASSERT(false);
  return 0;
}
}  // namespace

void quantize_x16(const float* x, int n, int in, int16_t* q, float* d, float* s) noexcept {
  const int nb = in / 32;
  for (int r = 0; r < n; ++r)
    for (int b = 0; b < nb; ++b) {
      const size_t i0 = static_cast<size_t>(r) * in + static_cast<size_t>(b) * 32;
      const size_t k = static_cast<size_t>(r) * nb + b;
      float amax = 0.0f;
      bool finite = true;
      for (int j = 0; j < 32; ++j) {
        amax = std::max(amax, std::fabs(x[i0 + j]));
        finite = finite && std::isfinite(x[i0 + j]);
      }
      if (!finite) {  // inf or NaN inside
        for (int j = 0; j < 32; ++j) q[i0 + j] = 0;
        d[k] = s[k] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      const float dx = amax / 32767.0f;
      const float id = dx > 0.0f ? 1.0f / dx : 0.0f;
      int sum = 0;
      for (int j = 0; j < 32; ++j) {
        const float v = std::nearbyint(x[i0 + j] * id);  // |v| <= 32767 (+1 ulp of rounding at most)
        const int c = std::clamp(static_cast<int>(v), -32767, 32767);
        q[i0 + j] = static_cast<int16_t>(c);
        sum += c;
      }
      d[k] = dx;
      s[k] = dx * static_cast<float>(sum);
    }
}

// Integer activations: one output row for one row of quantize_x16 output. Per unit (a 32-value
// block; a 16-value group for Q6_K) the integer sum of the signed weight codes times q, then
// acc += (d dx) * sum and, for Q4_1 / Q4_K, macc += m * (dx sum q); y = acc + macc. The SIMD
// kernels split each integer sum over lanes (exact) and add the lanes at the end: the same
// terms in another float order.
namespace {
float row_dot16_ref(GgmlType t, const uint8_t* row, int in, const int16_t* q, const float* xd,
                   const float* xs) noexcept {
  const int nb = in / 32;
  float acc = 0, macc = 0;
  switch (t) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1: {
      const bool q41 = t == GgmlType::Q4_1;
      const size_t bb = q41 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
      const int off = q41 ? 0 : 8;
      for (int b = 0; b < nb; ++b, row += bb) {
        const float d = fp16_to_fp32(rd16(row));
        const uint8_t* qs = row + (q41 ? 4 : 2);
        const int16_t* qb = q + static_cast<size_t>(b) * 32;
        int isum = 0;
        for (int j = 0; j < 16; ++j) isum += ((qs[j] & 0xf) - off) * qb[j];
        for (int j = 0; j < 16; ++j) isum += ((qs[j] >> 4) - off) * qb[16 + j];
        acc += (d * xd[b]) * static_cast<float>(isum);
        if (q41) macc += fp16_to_fp32(rd16(row + 2)) * xs[b];
      }
      break;
    }
    case GgmlType::Q5_0:
      for (int b = 0; b < nb; ++b, row += sizeof(BlockQ5_0)) {
        const float d = fp16_to_fp32(rd16(row));
        uint32_t qh;
        std::memcpy(&qh, row + 2, 4);
        const uint8_t* qs = row + 6;
        const int16_t* qb = q + static_cast<size_t>(b) * 32;
        int isum = 0;
        for (int j = 0; j < 16; ++j) isum += (((qs[j] & 0xf) | (((qh >> j) & 1) << 4)) - 16) * qb[j];
        for (int j = 0; j < 16; ++j) isum += (((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16) * qb[16 + j];
        acc += (d * xd[b]) * static_cast<float>(isum);
      }
      break;
    case GgmlType::Q8_0:
      for (int b = 0; b < nb; ++b, row += sizeof(BlockQ8_0)) {
        const float d = fp16_to_fp32(rd16(row));
        const int8_t* qs = reinterpret_cast<const int8_t*>(row + 2);
        const int16_t* qb = q + static_cast<size_t>(b) * 32;
        int isum = 0;
        for (int j = 0; j < 32; ++j) isum += qs[j] * qb[j];
        acc += (d * xd[b]) * static_cast<float>(isum);
      }
      break;
    case GgmlType::Q4_K:  // per 32-value sub-block: (d sc dx) sum c q - (dmin mn) (dx sum q)
      for (int b = 0; b < in / kQK; ++b, row += sizeof(BlockQ4_K)) {
        const float d = fp16_to_fp32(rd16(row));
        const float dmin = fp16_to_fp32(rd16(row + 2));
        for (int sb = 0; sb < 8; ++sb) {
          int sc, mn;
          kquant_scale_min(row + 4, sb, sc, mn);
          const uint8_t* qs = row + 16 + 32 * (sb / 2);
          const int shift = 4 * (sb % 2);
          const int k = b * 8 + sb;
          const int16_t* qb = q + static_cast<size_t>(k) * 32;
          int isum = 0;
          for (int l = 0; l < 32; ++l) isum += ((qs[l] >> shift) & 0xf) * qb[l];
          acc += ((d * static_cast<float>(sc)) * xd[k]) * static_cast<float>(isum);
          macc -= (dmin * static_cast<float>(mn)) * xs[k];
        }
      }
      break;
    case GgmlType::Q6_K:  // per 16-value group: (d sc dx) sum (c - 32) q
      for (int b = 0; b < in / kQK; ++b, row += sizeof(BlockQ6_K)) {
        const uint8_t* ql = row;
        const uint8_t* qh = row + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(row + 192);
        const float d = fp16_to_fp32(rd16(row + 208));
        for (int grp = 0; grp < 16; ++grp) {
          int isum = 0;
          for (int i = 16 * grp; i < 16 * grp + 16; ++i) {
            const int h = i / 128, g = (i / 32) % 4, l = i % 32;
            const int c = ((ql[64 * h + 32 * (g & 1) + l] >> (4 * (g >> 1))) & 0xf) |
                          (((qh[32 * h + l] >> (2 * g)) & 3) << 4);
            isum += (c - 32) * q[static_cast<size_t>(b) * kQK + i];
          }
          acc += ((d * static_cast<float>(sc[grp])) * xd[b * 8 + grp / 2]) * static_cast<float>(isum);
        }
      }
      break;
    default:
      TQ_ASSERT(false);
  }
  return acc + macc;
}
}  // namespace

void qmv16_rows_ref(GgmlType t, const uint8_t* w, int in, const X16& x, int n, int o0, int o1, float* y,
                    int ldy) noexcept {
  const size_t rb = ggml_row_bytes(t, static_cast<size_t>(in));
  const int nb = in / 32;
  for (int o = o0; o < o1; ++o)
    for (int r = 0; r < n; ++r)
      y[static_cast<size_t>(r) * ldy + o] =
          row_dot16_ref(t, w + static_cast<size_t>(o) * rb, in, x.q + static_cast<size_t>(r) * in,
                        x.d + static_cast<size_t>(r) * nb, x.s + static_cast<size_t>(r) * nb);
}

void qmv16_rows_simd(GgmlType t, const uint8_t* w, int in, const X16& x, int n, int o0, int o1, float* y,
                     int ldy) noexcept {
  if (qmv16_avx512_host_ok()) {
    const std::string level = simd::current_level();
    if (level == "avx3" || level == "avx3_dl") return qmv16_rows_avx512(t, w, in, x, n, o0, o1, y, ldy);
  }
  qmv16_rows_highway(t, w, in, x, n, o0, o1, y, ldy);
}

void qmv_rows_ref(GgmlType t, const uint8_t* w, int in, const float* x, const float* xs, int n, int o0, int o1,
                  float* y, int ldy) noexcept {
  const size_t rb = ggml_row_bytes(t, static_cast<size_t>(in));
  const int nb = in / 32;
  for (int o = o0; o < o1; ++o)
    for (int r = 0; r < n; ++r)
      y[static_cast<size_t>(r) * ldy + o] =
          row_dot_ref(t, w + static_cast<size_t>(o) * rb, in, x + static_cast<size_t>(r) * in,
                      xs ? xs + static_cast<size_t>(r) * nb : nullptr);
}

}  // namespace detail

namespace {

bool qgemm_supported(GgmlType t) noexcept { return qmatvec_supported(t); }

void check_args(GgmlType t, const void* w, int in, int out, const float* x, int n, const float* y, int ldy,
                bool gemm = false) {
  TQ_CHECK(gemm ? qgemm_supported(t) : qmatvec_supported(t),
           "qmatvec: weight type %s is not supported (%s)", ggml_type_name(t), ggml_supported_types());
  const int bs = ggml_block_size(t);
  TQ_CHECK(in > 0 && in % bs == 0, "qmatvec: input length %d is not a positive multiple of the %s block size %d", in,
           ggml_type_name(t), bs);
  TQ_CHECK(out >= 0 && n >= 0, "qmatvec: negative size (out %d, rows %d)", out, n);
  TQ_CHECK(ldy >= out, "qmatvec: output stride %d is less than the %d outputs", ldy, out);
  TQ_CHECK((out == 0 || n == 0) || (w && x && y), "qmatvec: null pointer");
}

template <class Kernel, class Kernel16>
void run(GgmlType t, const void* w, int in, int out, const float* x, int n, float* y, int ldy, int n_threads,
         Kernel kernel, Kernel16 kernel16) {
  if (out == 0 || n == 0) return;
  const int nb = in / 32;
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  if (qmatvec_int16(t)) {  // x rounded to 16 bits once per call, read by every thread
    thread_local std::vector<int16_t> xq;
    thread_local std::vector<float> xd, xs;
    xq.resize(static_cast<size_t>(n) * in);
    xd.resize(static_cast<size_t>(n) * nb);
    xs.resize(xd.size());
    // The AVX-512 rounding where the AVX-512 kernels run (the same bits; the scalar loop was
    // ~1.3% of a 1-thread Gemma 3 decode step, about as much as argmax over the vocabulary).
    if (kernel16 != detail::qmv16_rows_ref && qgemm_int16(t))
      detail::quantize_x16_avx512(x, n, in, xq.data(), xd.data(), xs.data());
    else
      detail::quantize_x16(x, n, in, xq.data(), xd.data(), xs.data());
    const detail::X16 xq16{xq.data(), xd.data(), xs.data()};
    // The rows of x go through the kernels in passes of at most kQMatvecMaxRows.
    parallel_rows(out, n_threads, [&](int o0, int o1) {
      for (int r0 = 0; r0 < n; r0 += kQMatvecMaxRows)
        kernel16(t, wb, in, xq16.from(r0, in), std::min(kQMatvecMaxRows, n - r0), o0, o1,
                 y + static_cast<size_t>(r0) * ldy, ldy);
    });
    return;
  }
  std::vector<float> xs;
  if (qmatvec_needs_block_sums(t)) {
    xs.resize(static_cast<size_t>(n) * nb);
    detail::qmv_block_sums(x, n, in, xs.data());
  }
  const float* xsp = xs.empty() ? nullptr : xs.data();
  parallel_rows(out, n_threads, [&](int o0, int o1) {
    for (int r0 = 0; r0 < n; r0 += kQMatvecMaxRows) {
      const int nr = std::min(kQMatvecMaxRows, n - r0);
      kernel(t, wb, in, x + static_cast<size_t>(r0) * in, xsp ? xsp + static_cast<size_t>(r0) * nb : nullptr, nr,
             o0, o1, y + static_cast<size_t>(r0) * ldy, ldy);
    }
  });
}

}  // namespace

void qmatvec(GgmlType t, const void* w, int in, int out, const float* x, int n, float* y, int ldy,
             int n_threads) {
  check_args(t, w, in, out, x, n, y, ldy);
  if (simd::use_scalar()) run(t, w, in, out, x, n, y, ldy, n_threads, detail::qmv_rows_ref, detail::qmv16_rows_ref);
  else run(t, w, in, out, x, n, y, ldy, n_threads, detail::qmv_rows_simd, detail::qmv16_rows_simd);
}

void qmatvec_ref(GgmlType t, const void* w, int in, int out, const float* x, int n, float* y, int ldy) {
  check_args(t, w, in, out, x, n, y, ldy);
  run(t, w, in, out, x, n, y, ldy, 1, detail::qmv_rows_ref, detail::qmv16_rows_ref);
}

int qgemm_panel_rows(int in) noexcept {
  const int p = kQGemmPanelFloats / std::max(1, in) / 16 * 16;
  return std::max(16, p);
}

int qgemm16_panel_rows(int in) noexcept {
  const size_t tile_bytes = static_cast<size_t>(std::max(1, in / 32)) * detail::kQGemm16UnitBytes;
  return 16 * static_cast<int>(std::max<size_t>(1, kQGemm16PanelBytes / tile_bytes));
}

bool qgemm_int16(GgmlType t) noexcept {
  if (!qmatvec_int16(t) || simd::use_scalar() || !detail::qmv16_avx512_host_ok()) return false;
  const std::string level = simd::current_level();
  return level == "avx3" || level == "avx3_dl";
}

void qgemm(GgmlType t, const void* w, int in, int out, const float* x, int n, float* y, int ldy, int n_threads,
           int panel_rows) {
  check_args(t, w, in, out, x, n, y, ldy, true);
  if (out == 0 || n == 0) return;
  if (qgemm_int16(t)) {  // integer activations: x rounded to 16 bits once, then the AVX-512 GEMM
    const bool vnni = simd::current_level() == "avx3_dl";
    const int nb = in / 32;
    thread_local std::vector<int16_t> xq;
    thread_local std::vector<float> xd, xs;
    xq.resize(static_cast<size_t>(n) * in);
    xd.resize(static_cast<size_t>(n) * nb);
    xs.resize(xd.size());
    int16_t* qp = xq.data();
    float* dp = xd.data();
    float* sp = xs.data();
#pragma omp parallel for num_threads(std::max(1, n_threads)) schedule(static) if (n_threads > 1 && n >= 16)
    for (int r = 0; r < n; ++r)
      detail::quantize_x16_avx512(x + static_cast<size_t>(r) * in, 1, in, qp + static_cast<size_t>(r) * in,
                                  dp + static_cast<size_t>(r) * nb, sp + static_cast<size_t>(r) * nb);
    const detail::X16 x16{qp, dp, sp};
    const int P = panel_rows > 0 ? panel_rows : qgemm16_panel_rows(in);
    const uint8_t* wb = static_cast<const uint8_t*>(w);
    parallel_rows(out, n_threads, [&](int o0, int o1) {
      detail::qgemm16_rows_avx512(t, wb, in, x16, n, o0, o1, y, ldy, P, vnni);
    });
    return;
  }
  const int P = panel_rows > 0 ? panel_rows : qgemm_panel_rows(in);
  const size_t rb = ggml_row_bytes(t, static_cast<size_t>(in));
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  parallel_rows(out, n_threads, [&](int o0, int o1) {
    if (t == GgmlType::F32) {  // already floats: one sgemm over the chunk
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, o1 - o0, in, 1.0f, x, in,
                  reinterpret_cast<const float*>(wb + static_cast<size_t>(o0) * rb), in, 0.0f, y + o0, ldy);
      return;
    }
    // One buffer per thread, kept between calls (a fresh 1 MB allocation per projection
    // would be an mmap + page faults every time).
    thread_local std::vector<float> panel;
    if (panel.size() < static_cast<size_t>(P) * in) panel.resize(static_cast<size_t>(P) * in);
    for (int p0 = o0; p0 < o1; p0 += P) {
      const int p1 = std::min(o1, p0 + P);
      for (int o = p0; o < p1; ++o)
        dequantize_row(t, wb + static_cast<size_t>(o) * rb, panel.data() + static_cast<size_t>(o - p0) * in,
                       static_cast<size_t>(in));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, p1 - p0, in, 1.0f, x, in, panel.data(), in, 0.0f,
                  y + p0, ldy);
    }
  });
}

}  // namespace tq::llm
