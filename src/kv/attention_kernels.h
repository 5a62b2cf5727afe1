// Shared between attention.cpp (driver) and attention_simd.cpp (fused kernels).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kv/kv_internal.h"
#include "tq/error.h"

namespace tq::kv {

constexpr int kChunkTokens = 2048;  // KV-length split (multiple of kBlock): fixed, so results
                                    // do not depend on the thread count

// GQA ratios with tq kernel instances (DecodeTq, lut8). fused_decode runs the others (5, 6, 7,
// 9+ query heads per kv head) as subgroups of these sizes; DecodeF16 takes any G.
inline bool has_kernel_instance(int G) noexcept { return G == 1 || G == 2 || G == 3 || G == 4 || G == 8; }
// The size of the next subgroup when `left` heads of a group remain: the largest instance that fits.
inline int kernel_subgroup(int left) noexcept { return left >= 8 ? 8 : left >= 4 ? 4 : left; }

struct Shape {
  int D, H, KVH, G, n_q, n_tokens, n_quant;
  float scale;
  // RoPE-rotating K mean (Centre::rope): rope_mean_coefs of the call's query rows (query i,
  // head g at row i G + g, rope_mc_stride floats apart) for the mean of the tokens scored; null
  // when K has no such mean.
  const float* rope_mc = nullptr;
  // A sliding window's start inside the first block of a call (stream index): the tokens of
  // [a, first) are masked out. 0 (or <= a): none. firsts: one such start per query of the call
  // (in place of `first`; null: none). Only the lut8 kernel reads them; run_attention passes
  // them to no other kernel.
  int first = 0;
  const int* firsts = nullptr;
};

// RoPE-rotating K mean. A token's mean m = R mu (Centre::mean_at) adds q.m to its logit
// (before the scale): per pair i, A_i cos(a) + B_i sin(a) with A_i = q_2i mu_2i + q_2i+1 mu_2i+1,
// B_i = q_2i+1 mu_2i - q_2i mu_2i+1 and a the pair's angle; dims past the RoPE pairs add C0 =
// sum q_d mu_d. mc per head: [A (P)][B (P)][C0], stride 2 P + 1.
inline int rope_mc_stride(const Stream& s) noexcept { return 2 * (int)s.centre.rope_freq.size() + 1; }
inline int rope_fast_pairs(const Stream& s) noexcept {
  return std::min((int)s.centre.rope_freq.size(), kRopeExactPairs);
}
inline void rope_mean_coefs(const Stream& s, int G, const float* q, const float* mu, float* mc) noexcept {
  const int D = s.dim, P = (int)s.centre.rope_freq.size(), st = rope_mc_stride(s);
  for (int g = 0; g < G; ++g) {
    const float* qg = q + (size_t)g * D;
    float* m = mc + (size_t)g * st;
    for (int i = 0; i < P; ++i) {
      m[i] = qg[2 * i] * mu[2 * i] + qg[2 * i + 1] * mu[2 * i + 1];
      m[P + i] = qg[2 * i + 1] * mu[2 * i] - qg[2 * i] * mu[2 * i + 1];
    }
    float c0 = 0;
    for (int d = 2 * P; d < D; ++d) c0 += qg[d] * mu[d];
    m[2 * P] = c0;
  }
}
// The mean's terms for blocks [b0, b0 + nb) (nb <= kRopeMaxBlocks) and the G heads of mc, from
// the block tables (Centre::rope_seed / rope_lane, v_i = A_i cos + B_i sin and
// u_i = B_i cos - A_i sin at each block's angle): head g's row of out (stride
// rope_terms_stride()) holds [c (64)][d (64)][e (64)] then for each fast pair i
// [a2 (64)][b2 (64)], indexed by block - b0, where c = C0 + the slow pairs' v_i,
// d = sum_slow w_i u_i, e = -sum_slow w_i^2 v_i / 2 (Centre::mean_at's second-order turn),
// a2 = v_i and b2 = u_i. Token j of block b then gets, with x = j - 15.5,
// c + d x + e x^2 + sum_{i < F} a2_i cos(j w_i) + b2_i sin(j w_i) (Centre::rope_j). Highway,
// vectorized over blocks (attention_tq_simd.cpp); both tq kernels call it once per query (or
// group of rows) of a call. cs: the blocks' angles from rope_block_angles(s, b0, nb' >= nb,
// cs), which a call of several queries turns once for all of them; null: turned here (the
// same floats).
constexpr int kRopeMaxBlocks = kChunkTokens / kBlock;
constexpr int kRopeSlowRows = 3;  // c, d, e
constexpr int rope_terms_stride() noexcept { return (kRopeSlowRows + 2 * kRopeExactPairs) * kRopeMaxBlocks; }
void rope_block_terms(const Stream& s, const float* mc, int G, int b0, int nb, float* out,
                      const float* cs = nullptr);
// cos / sin of every RoPE pair's angle at blocks [b0, b0 + nb) (nb <= kRopeMaxBlocks): pair i's
// cosines at cs[rope_angle_row(i, 0) + k], sines at cs[rope_angle_row(i, 1) + k], k < nb
// rounded up to the vector width (rope_angles_floats(s) floats).
constexpr size_t rope_angle_row(int pair, int sine) noexcept { return (size_t)(2 * pair + sine) * kRopeMaxBlocks; }
inline size_t rope_angles_floats(const Stream& s) noexcept { return rope_angle_row((int)s.centre.rope_freq.size(), 0); }
void rope_block_angles(const Stream& s, int b0, int nb, float* cs);

// Online-softmax states of n rows (query x head): [m, l, pad..., acc[D]] each, stride D + 16.
struct States {
  float* base = nullptr;
  int D = 0;
  size_t stride() const noexcept { return (size_t)D + 16; }
  float& m(int k) const noexcept { return base[k * stride()]; }
  float& l(int k) const noexcept { return base[k * stride() + 1]; }
  float* acc(int k) const noexcept { return base + k * stride() + 16; }
  void reset(int k) const noexcept {
    m(k) = -std::numeric_limits<float>::infinity();
    l(k) = 0;
    for (int d = 0; d < D; ++d) acc(k)[d] = 0;
  }
};

// The kernels that read a KV head's quantized tokens. pick_kernel (attention.cpp) is the one
// place that chooses among them, from the caller's AttnKernel, the types, the shape and the
// SIMD level; the ISA files only define them.
enum class Kernel : uint8_t {
  rows,      // rows decoded to float in the stream's domain, then float attention (every format)
  f16,       // DecodeF16 (attention_simd.cpp): f16 K and V
  tq_float,  // DecodeTq (attention_tq_simd.cpp): tq K and V, float centroids from the codes
  tq_lut8,   // attention_vnni.cpp: tq K and V of <= 6 bits, int8 lookup tables (AttnKernel::lut8)
};
const char* kernel_name(Kernel k);  // "rows", "f16", "tq-float", "tq-lut8"
Kernel pick_kernel(const Shape& sh, const Stream& sk, const Stream& sv, AttnKernel want);

// Fused attention of nq queries (G heads of one kv head each) over quantized tokens [a, b) (a
// block aligned) with kernel k (not rows). Query i: rows i G .. i G + G - 1 of qd (D floats
// apart, K domain), sees the tokens before limits[i], updates rows i G .. of st (V domain).
// Decode is nq = 1; prefill passes its queries together, so the kernels read each block once
// for several queries. Returns false (st untouched) when the kernel does not run here (then
// the caller takes the rows path). A G without a kernel instance runs as subgroups of heads
// (kernel_subgroup), each over copies of its rows: the tokens are read once per subgroup
// (the f16 kernel takes any G in one call).
bool fused_decode(const Shape& sh, const Stream& sk, const Stream& sv, Kernel k, int nq, const float* qd,
                  const int* limits, int a, int b, const States& st);

// The kernels, with fused_decode's arguments for a G with a kernel instance (has_kernel_instance);
// false when the current target cannot run them.
// f16 K and V (attention_simd.cpp, Highway; several queries' rows share each block's reads).
bool decode_f16(const Shape& sh, const Stream& sk, const Stream& sv, int nq, const float* qd, const int* limits,
                int a, int b, const States& st);
// tq K (mse 1..8 bits, split) and tq V: float centroids from the codes and float FMAs
// (attention_tq_simd.cpp, Highway; several queries share each block's float tiles).
bool decode_tq_float(const Shape& sh, const Stream& sk, const Stream& sv, int nq, const float* qd,
                     const int* limits, int a, int b, const States& st);
int decode_tq_float_lanes();  // float lanes of the float kernel at the current target (scalar: 1)
// tq K and V of <= 6 bits with int8 tables on AVX-512 VNNI/VBMI/VBMI2 (attention_vnni.cpp; up
// to 12 query rows per block pass).
bool decode_tq_lut8(const Shape& sh, const Stream& sk, const Stream& sv, int nq, const float* qd,
                    const int* limits, int a, int b, const States& st);
bool lut8_host_ok();  // the CPU has what decode_tq_lut8 needs

// tq_n8 norms (kv_cache.cpp, set_n8_norm): norm = 2^(e / 32) * table[c] with the block's int16
// exponent e and the token's code c; table[c] = 2^(-n8_offset(c) / 32), table[255] = 0 (a zero norm).
inline const float* n8_pow_table() {
  static const auto* t = [] {
    auto* p = new float[256];
    for (int c = 0; c < 256; ++c) p[c] = c == 255 ? 0.f : std::exp2((float)-n8_offset(c) * (1.0f / kN8Steps));
    return p;
  }();
  return t;
}
// The block factor 2^(e / 32) of a tq_n8 part, from its header (int16 e, then the 32 codes).
// Exponents in [-kN8BaseTable, kN8BaseTable) come from a table of the same exp2 values (the
// kernels take one per block and part: exp2f was 2-3% of a 32K decode call).
constexpr int kN8BaseTable = 4096;
inline float n8_block_base(const uint8_t* hdr) {
  int16_t e;
  std::memcpy(&e, hdr, 2);
  static const float* t = [] {
    auto* p = new float[2 * kN8BaseTable];
    for (int i = 0; i < 2 * kN8BaseTable; ++i) p[i] = std::exp2((float)(i - kN8BaseTable) * (1.0f / kN8Steps));
    return p;
  }();
  if (e >= -kN8BaseTable && e < kN8BaseTable) return t[e + kN8BaseTable];
  return std::exp2((float)e * (1.0f / kN8Steps));
}

// A tq stream is one part (tqB, tqBn8) or two (tqBhH: selected and regular channels), each
// with its own codebook, norms and bit-plane tiles, covering dims [off, off + dim) of the
// stream's domain.
struct Part {
  int off = 0, dim = 0, bits = 0;
  const Codebook* cb = nullptr;
  size_t norm_off = 0, tiles_off = 0;  // bytes within a block
  bool n8 = false;                     // tq_n8 / split n8: norms are [int16 e][32 uint8 log codes] at norm_off
  const TrellisCode* tc = nullptr;     // trellis codes (KvCacheConfig::trellis): values lut[window]
};
inline int parts_of(const Stream& s, Part* p) {
  const bool n8 = s.fmt->log8_norms();
  if (!s.split()) {
    p[0] = Part{0, s.dim, s.cb->bits, s.cb, 0, s.norms_bytes, n8, s.tc};
    return 1;
  }
  p[0] = Part{0, s.d_hi, s.cb_hi->bits, s.cb_hi, 0, s.norms_bytes, n8, s.tc_hi};
  p[1] = Part{s.d_hi, s.d_lo, s.cb->bits, s.cb, n8 ? kN8HeaderBytes : kBlock * 2, s.norms_bytes + s.tiles_hi_bytes, n8,
              s.tc};
  return 2;
}

// SIMD (Highway) pieces of the generic path. kR, vR: nt x D floats (rows in the stream domain).
void attend_rows(int D, int G, float scale, const float* qd, const float* kR, const float* vR, int nt,
                 const States& st);
void decode_q8_rows(int D, int n, const uint8_t* rows, float* out);  // n rows of D/32 BlockQ8_0
void decode_q4_rows(int D, int n, const uint8_t* rows, float* out);  // n rows of D/32 BlockQ4_0

// binary16 <-> binary32 (round to nearest even), SIMD; the scalar level uses tq::fp*_n.
void f32_to_f16(int n, const float* x, uint16_t* h);
void f16_to_f32(int n, const uint16_t* h, float* x);

}  // namespace tq::kv
