// KvCache: the table of formats, storage, the write (quantize) path and memory accounting.
// Layouts are described in kv_internal.h and docs/design.md.
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <exception>
#include <numeric>

#include "kv/attention_kernels.h"
#include "kv/kv_internal.h"
#include "tq/error.h"
#include "tq/simd.h"

namespace tq {
namespace kv {

// ------------------------------------------------------------------ table of formats
namespace {
using F = KvFormat;
constexpr uint8_t kRowsOnly = kKvKernelRows;
constexpr uint8_t kTqKernels(int max_bits) {  // the fused tq kernels: float <= 8 bits, lut8 <= 6
  return kKvKernelRows | kKvKernelTqFloat | (max_bits <= 6 ? kKvKernelTqLut8 : 0);
}
constexpr KvTypeTraits values(F id, const char* name, KvLayout l, bool rot, uint8_t bits, KvNorm n, int mult,
                              uint8_t kern, const char* desc) {
  return {id, name, l, rot, 1, {{bits, 4, n}, {}}, KvChannels::all, mult, kern, kern, desc};
}
constexpr KvTypeTraits tq(F id, const char* name, uint8_t bits, KvNorm n, const char* desc) {
  return {id, name, n == KvNorm::log8 ? KvLayout::tq_n8 : KvLayout::tq, true, 1, {{bits, 4, n}, {}},
          KvChannels::all, 16, kTqKernels(bits), kTqKernels(bits), desc};
}
constexpr KvTypeTraits split(F id, const char* name, uint8_t lo, uint8_t hi, KvNorm n, const char* desc) {
  return {id, name, KvLayout::tq_split, true, 2, {{hi, 1, n}, {lo, 3, n}}, KvChannels::query_weighted, 64,
          kTqKernels(hi), kTqKernels(hi), desc};
}
constexpr KvNorm kH = KvNorm::fp16, kL = KvNorm::log8;
}  // namespace

static constexpr KvTypeTraits kFormats[] = {
    values(F::f32, "f32", KvLayout::f32, false, 32, KvNorm::none, 16, kRowsOnly, "IEEE binary32 rows"),
    values(F::f16, "f16", KvLayout::f16, false, 16, KvNorm::none, 16, kKvKernelRows | kKvKernelF16,
           "IEEE binary16 (K blocks dim-major, V rows)"),
    values(F::q8_0, "q8_0", KvLayout::q8_0, false, 8, KvNorm::fp16_per32, 32, kRowsOnly, "ggml q8_0: 32 int8 + fp16 scale"),
    values(F::q4_0, "q4_0", KvLayout::q4_0, false, 4, KvNorm::fp16_per32, 32, kRowsOnly, "ggml q4_0: 32 nibbles + fp16 scale"),
    values(F::q8_0h, "q8_0h", KvLayout::q8_0, true, 8, KvNorm::fp16_per32, 32, kRowsOnly, "q8_0 of the Hadamard-rotated row"),
    values(F::q4_0h, "q4_0h", KvLayout::q4_0, true, 4, KvNorm::fp16_per32, 32, kRowsOnly, "q4_0 of the Hadamard-rotated row"),
    tq(F::tq1, "tq1", 1, kH, "TurboQuant mse 1 bit + fp16 corrected norm"),
    tq(F::tq2, "tq2", 2, kH, "TurboQuant mse 2 bits + fp16 corrected norm"),
    tq(F::tq3, "tq3", 3, kH, "TurboQuant mse 3 bits + fp16 corrected norm"),
    tq(F::tq4, "tq4", 4, kH, "TurboQuant mse 4 bits + fp16 corrected norm"),
    tq(F::tq5, "tq5", 5, kH, "TurboQuant mse 5 bits + fp16 corrected norm"),
    tq(F::tq6, "tq6", 6, kH, "TurboQuant mse 6 bits + fp16 corrected norm"),
    tq(F::tq7, "tq7", 7, kH, "TurboQuant mse 7 bits + fp16 corrected norm"),
    tq(F::tq8, "tq8", 8, kH, "TurboQuant mse 8 bits + fp16 corrected norm"),
    split(F::tq2h3, "tq2h3", 2, 3, kH, "D/4 query-weighted channels at 3 bits + rest at 2, 2 fp16 norms"),
    split(F::tq3h4, "tq3h4", 3, 4, kH, "D/4 query-weighted channels at 4 bits + rest at 3, 2 fp16 norms"),
    split(F::tq2h4, "tq2h4", 2, 4, kH, "D/4 query-weighted channels at 4 bits + rest at 2, 2 fp16 norms"),
    split(F::tq2h5, "tq2h5", 2, 5, kH, "D/4 query-weighted channels at 5 bits + rest at 2, 2 fp16 norms"),
    split(F::tq3h5, "tq3h5", 3, 5, kH, "D/4 query-weighted channels at 5 bits + rest at 3, 2 fp16 norms"),
    split(F::tq3h6, "tq3h6", 3, 6, kH, "D/4 query-weighted channels at 6 bits + rest at 3, 2 fp16 norms"),
    split(F::tq4h5, "tq4h5", 4, 5, kH, "D/4 query-weighted channels at 5 bits + rest at 4, 2 fp16 norms"),
    split(F::tq4h6, "tq4h6", 4, 6, kH, "D/4 query-weighted channels at 6 bits + rest at 4, 2 fp16 norms"),
    split(F::tq2h6n8, "tq2h6n8", 2, 6, kL, "D/4 query-weighted channels at 6 bits + rest at 2, 2 8-bit log-coded norms (+ 2 int16 exponents per 32 tokens)"),
    split(F::tq2h4n8, "tq2h4n8", 2, 4, kL, "tq2h4 with 8-bit log-coded norms (+ 2 int16 exponents per 32 tokens)"),
    split(F::tq2h5n8, "tq2h5n8", 2, 5, kL, "tq2h5 with 8-bit log-coded norms (+ 2 int16 exponents per 32 tokens)"),
    split(F::tq3h4n8, "tq3h4n8", 3, 4, kL, "tq3h4 with 8-bit log-coded norms (+ 2 int16 exponents per 32 tokens)"),
    split(F::tq3h5n8, "tq3h5n8", 3, 5, kL, "tq3h5 with 8-bit log-coded norms (+ 2 int16 exponents per 32 tokens)"),
    split(F::tq3h6n8, "tq3h6n8", 3, 6, kL, "tq3h6 with 8-bit log-coded norms (+ 2 int16 exponents per 32 tokens)"),
    split(F::tq4h5n8, "tq4h5n8", 4, 5, kL, "tq4h5 with 8-bit log-coded norms (+ 2 int16 exponents per 32 tokens)"),
    split(F::tq4h6n8, "tq4h6n8", 4, 6, kL, "tq4h6 with 8-bit log-coded norms (+ 2 int16 exponents per 32 tokens)"),
    tq(F::tq2n8, "tq2n8", 2, kL, "tq2 with an 8-bit log-coded norm (+ int16 exponent per 32 tokens)"),
    tq(F::tq3n8, "tq3n8", 3, kL, "tq3 with an 8-bit log-coded norm (+ int16 exponent per 32 tokens)"),
    tq(F::tq4n8, "tq4n8", 4, kL, "tq4 with an 8-bit log-coded norm (+ int16 exponent per 32 tokens)"),
    tq(F::tq5n8, "tq5n8", 5, kL, "tq5 with an 8-bit log-coded norm (+ int16 exponent per 32 tokens)"),
};
constexpr int kNumFormats = (int)KvFormat::count;
static_assert(sizeof(kFormats) / sizeof(kFormats[0]) == kNumFormats, "one row per KvFormat");
constexpr bool rows_in_enum_order() {
  for (int i = 0; i < kNumFormats; ++i)
    if ((int)kFormats[i].id != i) return false;
  return true;
}
static_assert(rows_in_enum_order(), "kFormats[i].id == i");

const Format& format(KvType t) {
  TQ_ASSERT(t.id < kNumFormats);
  return kFormats[t.id];
}

// ------------------------------------------------------------------ bit-plane tiles
// K tiles: tile (s, k) = s * (D/4) + k; bit 4 i + j: token 16 s + i, dim 4 k + j.
// V tiles: tile (e, r) = e * 8 + r;     bit 4 i + j: dim 16 e + i, token 4 r + j.

// Bits p of 16 codes -> 16-bit mask (bit i = bit p of c[i]).
static inline unsigned plane16(const uint8_t* c, int p) noexcept {
#if defined(__SSE2__)
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c));
  return (unsigned)_mm_movemask_epi8(_mm_slli_epi16(v, 7 - p));
#else
  unsigned m = 0;
  for (int i = 0; i < 16; ++i) m |= ((c[i] >> p) & 1u) << i;
  return m;
#endif
}
// 16 bits -> every 4th bit of a 64-bit word (bit i -> bit 4 i).
static inline uint64_t spread4(uint64_t x) noexcept {
  x &= 0xFFFFull;
  x = (x | (x << 24)) & 0x000000FF000000FFull;
  x = (x | (x << 12)) & 0x000F000F000F000Full;
  x = (x | (x << 6)) & 0x0303030303030303ull;
  x = (x | (x << 3)) & 0x1111111111111111ull;
  return x;
}

// Writes the codes of token `tok` (dim multiple of 16). K: the 4 dims of a quad are one
// nibble of a plane; V: the 16 dims of a group are every 4th bit of a plane word.
template <bool kIsK>
static void set_codes(uint8_t* tiles, int dim, int bits, int tok, const uint8_t* codes) noexcept {
  if (kIsK) {
    const int nq = dim >> 2, i = tok & 15, sh = (i & 1) * 4;
    uint8_t* base = tiles + (size_t)(tok >> 4) * nq * bits * 8 + (i >> 1);
    for (int d16 = 0; d16 < dim; d16 += 16)
      for (int p = 0; p < bits; ++p) {
        const unsigned m = plane16(codes + d16, p);
        for (int q = 0; q < 4; ++q) {
          uint8_t& byte = base[((size_t)((d16 >> 2) + q) * bits + p) * 8];
          byte = (uint8_t)((byte & ~(0xF << sh)) | (((m >> (4 * q)) & 0xF) << sh));
        }
      }
  } else {
    const int j = tok & 3;
    const uint64_t clear = ~(0x1111111111111111ull << j);
    for (int e = 0; e < dim / 16; ++e) {
      uint8_t* t = tiles + ((size_t)e * 8 + (tok >> 2)) * bits * 8;
      for (int p = 0; p < bits; ++p) {
        uint64_t w;
        std::memcpy(&w, t + p * 8, 8);
        w = (w & clear) | (spread4(plane16(codes + 16 * e, p)) << j);
        std::memcpy(t + p * 8, &w, 8);
      }
    }
  }
}
void set_tile_codes_k(uint8_t* t, int dim, int bits, int tok, const uint8_t* c) noexcept { set_codes<true>(t, dim, bits, tok, c); }
void set_tile_codes_v(uint8_t* t, int dim, int bits, int tok, const uint8_t* c) noexcept { set_codes<false>(t, dim, bits, tok, c); }

// All codes of one block's tiles -> codes[32][dim] (row = token). Fast path of get_codes:
// each plane byte is spread to 8 code bytes with a table.
static const uint64_t* spread8_table() {
  static const auto* t = [] {
    auto* a = new uint64_t[256];
    for (int v = 0; v < 256; ++v) {
      uint64_t x = 0;
      for (int i = 0; i < 8; ++i) x |= (uint64_t)((v >> i) & 1) << (8 * i);
      a[v] = x;
    }
    return a;
  }();
  return t;
}
static void expand_tiles(const uint8_t* tiles, int dim, int bits, bool is_k, uint8_t* codes) {
  const uint64_t* sp = spread8_table();
  const int ntiles = kBlock * dim / 64;
  for (int ti = 0; ti < ntiles; ++ti) {
    const uint8_t* pl = tiles + (size_t)ti * bits * 8;
    for (int g = 0; g < 8; ++g) {  // byte g of each plane: positions 8 g .. 8 g + 7
      uint64_t c = 0;
      for (int p = 0; p < bits; ++p) c |= sp[pl[p * 8 + g]] << p;
      if (is_k) {  // tile (s, k): position 4 i + j = token 16 s + i, dim 4 k + j
        const int s = ti / (dim / 4), k = ti % (dim / 4), tok = 16 * s + 2 * g;
        const uint32_t lo = (uint32_t)c, hi = (uint32_t)(c >> 32);
        std::memcpy(codes + (size_t)tok * dim + 4 * k, &lo, 4);
        std::memcpy(codes + (size_t)(tok + 1) * dim + 4 * k, &hi, 4);
      } else {  // tile (e, r): position 4 i + j = dim 16 e + i, token 4 r + j
        const int e = ti / 8, r = ti % 8;
        for (int x = 0; x < 8; ++x)
          codes[(size_t)(4 * r + (x & 3)) * dim + 16 * e + 2 * g + (x >> 2)] = (uint8_t)(c >> (8 * x));
      }
    }
  }
}

// ------------------------------------------------------------------ ggml blocks
static void quantize_q8_0(int n, const float* x, BlockQ8_0* y) {
  for (int b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.f;
    const float id = d ? 1.f / d : 0.f;
    y[b].d = fp32_to_fp16(d);
    for (int j = 0; j < 32; ++j) y[b].qs[j] = (int8_t)std::lrintf(x[b * 32 + j] * id);
  }
}
static void dequantize_q8_0(int n, const BlockQ8_0* y, float* x) {
  for (int b = 0; b < n / 32; ++b) {
    const float d = fp16_to_fp32(y[b].d);
    for (int j = 0; j < 32; ++j) x[b * 32 + j] = d * y[b].qs[j];
  }
}
// ggml q4_0: d = max / -8 where max is the signed value of largest magnitude.
static void quantize_q4_0(int n, const float* x, BlockQ4_0* y) {
  for (int b = 0; b < n / 32; ++b) {
    float amax = 0, mx = 0;
    for (int j = 0; j < 32; ++j) {
      const float v = x[b * 32 + j];
      if (std::fabs(v) > amax) { amax = std::fabs(v); mx = v; }
    }
    const float d = mx / -8.f;
    const float id = d ? 1.f / d : 0.f;
    y[b].d = fp32_to_fp16(d);
    for (int j = 0; j < 16; ++j) {
      const float x0 = x[b * 32 + j] * id, x1 = x[b * 32 + 16 + j] * id;
      const int q0 = std::min(15, (int)(x0 + 8.5f)), q1 = std::min(15, (int)(x1 + 8.5f));
      y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
  }
}
static void dequantize_q4_0(int n, const BlockQ4_0* y, float* x) {
  for (int b = 0; b < n / 32; ++b) {
    const float d = fp16_to_fp32(y[b].d);
    for (int j = 0; j < 16; ++j) {
      x[b * 32 + j] = d * ((y[b].qs[j] & 15) - 8);
      x[b * 32 + 16 + j] = d * ((y[b].qs[j] >> 4) - 8);
    }
  }
}

static void check_dim(const Format& f, int D) {
  TQ_CHECK(f.supports(D), "kv type %s: head_dim %d not supported (need a multiple of %d in [16, %d])", f.name, D,
           f.dim_multiple, kMaxHeadDim);
}

}  // namespace kv

using namespace kv;

// ------------------------------------------------------------------ public format API
size_t KvTypeTraits::row_bytes(int D) const noexcept {
  size_t bytes = 0;
  for (int p = 0; p < n_parts; ++p) {
    const size_t ch = (size_t)D * parts[p].quarters / 4;
    bytes += ch * parts[p].bits / 8;
    switch (parts[p].norm) {
      case KvNorm::none: break;
      case KvNorm::fp16_per32: bytes += ch / 32 * 2; break;
      case KvNorm::fp16: bytes += 2; break;
      case KvNorm::log8: bytes += 1; break;  // + the block's int16 exponent (block_bytes)
    }
  }
  return bytes;
}
size_t KvTypeTraits::block_bytes(int D) const noexcept {
  return kBlock * row_bytes(D) + (log8_norms() ? 2 * (size_t)n_parts : 0);
}
bool KvTypeTraits::supports(int D) const noexcept {
  return D >= 16 && D <= kMaxHeadDim && D % 16 == 0 && D % dim_multiple == 0;
}

const std::vector<KvTypeTraits>& kv_types() {
  static const std::vector<KvTypeTraits> t(std::begin(kFormats), std::end(kFormats));
  return t;
}
const KvTypeTraits& kv_type_traits(KvType t) {
  TQ_CHECK(t.id < kNumFormats, "invalid kv type id %d", (int)t.id);
  return kFormats[t.id];
}
const KvTypeTraits* find_kv_type(const std::string& name) noexcept {
  for (const auto& f : kFormats)
    if (name == f.name) return &f;
  return nullptr;
}
// Formats that were in the table once, and what to use instead (docs/design.md, "Removed, and why").
static constexpr struct {
  const char* name;
  const char* why;
} kRemovedFormats[] = {
    {"tq3p", "the QJL K types were removed from the KV cache (tq4p +5% to +40% perplexity, tq3p +22% to +298%); "
             "use tq3h6 or tq4"},
    {"tq4p", "the QJL K types were removed from the KV cache (tq4p +5% to +40% perplexity, tq3p +22% to +298%); "
             "use tq3h6 or tq4"},
    {"tq2.5", "removed (the same bits with channels chosen by K energy alone; tq2h3 chooses them by the queries too, "
              "KLD 0.124 vs 0.139); use tq2h3"},
    {"tq3.5", "removed (the same bits with channels chosen by K energy alone, as good as tq3h4: KLD 0.0209 vs "
              "0.0210); use tq3h4"},
};

KvType parse_kv_type(const std::string& name) {
  if (const KvTypeTraits* f = find_kv_type(name)) return kv_type(f->id);
  std::string valid;
  for (int i = 0; i < kNumFormats; ++i) valid += std::string(i ? ", " : "") + kFormats[i].name;
  for (const auto& r : kRemovedFormats)
    TQ_CHECK(name != r.name, "kv cache type %s: %s (valid: %s)", r.name, r.why, valid.c_str());
  TQ_CHECK(false, "unknown kv cache type '%s' (valid: %s)", name.c_str(), valid.c_str());
  return {};
}
std::string kv_type_name(KvType t) { return kv_type_traits(t).name; }
std::vector<std::string> kv_type_names() {
  std::vector<std::string> r;
  for (const auto& f : kFormats) r.push_back(f.name);
  return r;
}
const char* kv_layout_name(KvLayout l) {
  static const char* const n[] = {"f32", "f16", "q8_0", "q4_0", "tq", "tq_split", "tq_n8"};
  return n[(int)l];
}
const char* kv_norm_name(KvNorm n) {
  static const char* const s[] = {"none", "fp16_per32", "fp16", "log8"};
  return s[(int)n];
}
const char* kv_channels_name(KvChannels c) {
  static const char* const s[] = {"all", "query_weighted"};
  return s[(int)c];
}
KvType kv_f16() { return kv_type(KvFormat::f16); }
size_t kv_type_bytes(KvType t, int head_dim) {
  const KvTypeTraits& f = kv_type_traits(t);
  check_dim(f, head_dim);
  return f.row_bytes(head_dim);
}

// ------------------------------------------------------------------ tq parts
static double norm2(const float* x, int n) {
  double e = 0;
  for (int i = 0; i < n; ++i) e += (double)x[i] * x[i];
  return std::sqrt(e);
}

// One TurboQuant mse part of a row: y = the rotated part (dim values), s = ||x part||.
// Writes the corrected norm s / ||c[idx]|| (fp16) and the codes into the block's tiles.
// tc: trellis codes instead of the scalar codebook's (reconstruction lut[window]).
static double encode_tq_part(const Codebook& cb, const TrellisCode* tc, int dim, int side, const float* y,
                             double s, uint16_t* norm, uint8_t* tiles, int slot, uint8_t* idx, float* u) {
  const float inv = s > 0 ? (float)(1.0 / s) : 0.f;
  for (int i = 0; i < dim; ++i) u[i] = y[i] * inv;
  double c2 = 0;
  if (tc) {
    trellis_encode(*tc, u, idx);
    for (int i = 0; i < dim; ++i) {
      const double c = tc->lut[tc->window(idx, i)];
      c2 += c * c;
    }
  } else {
    quantize_rotated(cb, (size_t)dim, u, idx);
    for (int i = 0; i < dim; ++i) c2 += (double)cb.centroids[idx[i]] * cb.centroids[idx[i]];
  }
  const double stored = (s > 0 && c2 > 0) ? s / std::sqrt(c2) : 0.0;
  if (norm) *norm = fp32_to_fp16((float)stored);
  if (side == 0) set_tile_codes_k(tiles, dim, cb.bits, slot, idx);
  else set_tile_codes_v(tiles, dim, cb.bits, slot, idx);
  return stored;
}

// tq_n8 norms: [int16 e][32 codes]; e = INT16_MIN while the block holds no nonzero norm.
constexpr int16_t kN8NoExp = INT16_MIN;
static void set_n8_norm(uint8_t* blk, int slot, double norm) {
  int16_t e;
  std::memcpy(&e, blk, 2);
  if (slot == 0) e = kN8NoExp;
  uint8_t* codes = blk + 2;
  if (!(norm > 0)) {
    codes[slot] = 255;
  } else {
    const double L = (double)kN8Steps * std::log2(norm);
    const int ce = kN8CoarseUnits * (int)std::ceil(L / kN8CoarseUnits);  // shifts stay whole coarse steps
    if (e == kN8NoExp) {
      e = (int16_t)ce;
    } else if (ce > e) {  // raise the block exponent: re-code the earlier norms
      for (int j = 0; j < slot; ++j)
        if (codes[j] != 255) codes[j] = (uint8_t)n8_code((double)n8_offset(codes[j]) + (ce - e));
      e = (int16_t)ce;
    }
    codes[slot] = (uint8_t)n8_code(std::max(0.0, e - L));
  }
  std::memcpy(blk, &e, 2);
}

float kv::tq_block_norm(const Stream& s, const uint8_t* blk, int part, int slot) noexcept {
  if (s.fmt->log8_norms()) {
    blk += (size_t)part * kN8HeaderBytes;
    const uint8_t c = blk[2 + slot];
    if (c == 255) return 0.f;
    int16_t e;
    std::memcpy(&e, blk, 2);
    return std::exp2((float)(e - n8_offset(c)) * (1.0f / kN8Steps));
  }
  return fp16_to_fp32(reinterpret_cast<const uint16_t*>(blk)[part * kBlock + slot]);
}

// Values of one part from its codes (dim values, scaled by the part's norm).
static inline void tq_part_values(const Codebook& cb, const TrellisCode* tc, int dim, const uint8_t* codes,
                                  float norm, float* out) noexcept {
  if (tc) {
    trellis_decode_scaled(*tc, codes, norm, out);
  } else {
    for (int i = 0; i < dim; ++i) out[i] = norm * cb.centroids[codes[i]];
  }
}


// ------------------------------------------------------------------ Stream
Stream::Stream(const Format& f, int side_, int layer_, bool sliding, const KvCacheConfig& cfg, const KvCache::Impl& I)
    : fmt(&f), dim(cfg.head_dim), row_bytes(f.row_bytes(dim)), block_bytes(f.block_bytes(dim)), side(side_),
      layer(layer_) {
  const int D = dim;
  // Sliding-window layers hold about a window of blocks: chunks of one block each, so that
  // dropping is exact to the block.
  if (sliding) blocks_per_chunk = 1;
  const KvPart& p0 = f.parts[0];
  if (f.turboquant()) {  // tq, tq_n8: one part over D; tq_split: selected channels, then the rest
    norms_bytes = f.n_parts * (f.log8_norms() ? kN8HeaderBytes : kBlock * 2);
    if (f.n_parts == 1) {
      cb = &get_codebook(D, p0.bits);
    } else {
      d_hi = D * p0.quarters / 4;
      d_lo = D - d_hi;
      cb_hi = &get_codebook(d_hi, p0.bits);
      cb = &get_codebook(d_lo, f.parts[1].bits);
      tiles_hi_bytes = tiles_bytes(d_hi, p0.bits);
    }
    TQ_ASSERT(block_bytes == norms_bytes + tiles_hi_bytes + tiles_bytes(D - d_hi, cb->bits));
    if (cfg.trellis) {  // parts of 1-4 bits (at 5+ the table trains to codes no better than Lloyd-Max)
      if (cb->bits <= 4) tc = &get_trellis(D - d_hi, cb->bits);
      if (cb_hi && cb_hi->bits <= 4) tc_hi = &get_trellis(d_hi, cb_hi->bits);
    }
  }
  if (f.rotated && !split()) rot = I.rot.get();
  if (f.rotated && split()) rot_hi = I.rot_hi.get(), rot_lo = I.rot_lo.get();
  window = cfg.window;
  if (window > 0) ring = make_aligned<uint16_t>((size_t)window * D);
  sink = cfg.sink;
  if (sink > 0) sink_rows = make_aligned<uint16_t>((size_t)sink * D);
  for (Precond* p : chain()) {
    p->configure(*this, cfg, I);
    p->reset(D);
  }
}

void Stream::clear() {
  n_quant = 0;
  if (blocks_per_chunk == 1) {  // a sliding-window stream: every chunk back to the spares
    for (auto& c : chunks)
      if (c) spare.push_back(std::move(c));
    chunks.clear();
  }
  n_dropped = 0;
  for (Precond* p : chain()) p->reset(dim);
}

void Stream::drop_before(int j) {
  const int b_end = j / kBlock;  // blocks [0, b_end) are wholly before j
  for (int c = n_dropped / kBlock / blocks_per_chunk; c < (int)chunks.size() && (c + 1) * blocks_per_chunk <= b_end; ++c)
    if (chunks[c]) spare.push_back(std::move(chunks[c]));
  n_dropped = std::max(n_dropped, b_end / blocks_per_chunk * blocks_per_chunk * kBlock);
}

void Stream::rotate(int n, const float* x, float* y, bool inverse) const {
  if (rot) return inverse ? rot->inverse((size_t)n, x, y) : rot->forward((size_t)n, x, y);
  if (!rot_hi) {
    if (y != x) std::memcpy(y, x, sizeof(float) * (size_t)n * dim);
    return;
  }
  // Split: each part's columns (dims [off, off + d) of every row) gathered, rotated, put back.
  for (auto [R, off, d] : {std::tuple{rot_hi, 0, d_hi}, std::tuple{rot_lo, d_hi, d_lo}}) {
    std::vector<float> v((size_t)n * d);
    for (int r = 0; r < n; ++r) std::memcpy(&v[(size_t)r * d], x + (size_t)r * dim + off, sizeof(float) * d);
    inverse ? R->inverse((size_t)n, v.data(), v.data()) : R->forward((size_t)n, v.data(), v.data());
    for (int r = 0; r < n; ++r) std::memcpy(y + (size_t)r * dim + off, &v[(size_t)r * d], sizeof(float) * d);
  }
}

void Stream::query_to_domain(int n, const float* q, float* y) const {
  std::memcpy(y, q, sizeof(float) * (size_t)n * dim);
  for (const Precond* p : chain()) p->query(n, y, dim);
  rotate(n, y, y);
}

void Stream::to_orig(int j0, int n, float* x) const {
  rotate(n, x, x, true);
  const auto c = chain();
  for (auto p = c.rbegin(); p != c.rend(); ++p) (*p)->inverse(j0, n, x, dim);
}

// ------------------------------------------------------------------ Stream: encode / decode
void Stream::encode_rows(int n, const float* x, size_t stride) {
  const int D = dim;
  if (n <= 0) return;
  for (Precond* p : chain())
    if (p->open()) p->freeze(*this);
  const bool rotated = rot || rot_hi;
  std::vector<float> xb((size_t)kBlock * D), yb((size_t)kBlock * D), u((size_t)D);
  std::vector<uint8_t> idx((size_t)D);
  std::vector<uint16_t> h((size_t)D);
  Part parts[2];
  const int np = fmt->turboquant() ? parts_of(*this, parts) : 0;
  int r = 0;
  while (r < n) {  // segments that stay inside one block
    const int t = n_quant;
    const int b = t / kBlock, slot0 = t % kBlock;
    const int m = std::min(n - r, kBlock - slot0);
    const int c = b / blocks_per_chunk;
    if (c >= (int)chunks.size()) chunks.resize((size_t)c + 1);
    if (!chunks[c]) {
      if (!spare.empty()) {
        chunks[c] = std::move(spare.back());
        spare.pop_back();
      } else {
        chunks[c] = make_aligned<uint8_t>(checked_mul(block_bytes, blocks_per_chunk, "kv chunk bytes"));
      }
    }
    uint8_t* blk = block(b);
    if (slot0 == 0) std::memset(blk, 0, block_bytes);
    for (int j = 0; j < m; ++j) std::memcpy(&xb[(size_t)j * D], x + (size_t)(r + j) * stride, sizeof(float) * D);
    for (Precond* p : chain()) p->forward(t, m, xb.data(), D);
    if (rotated) rotate(m, xb.data(), yb.data());
    for (int j = 0; j < m; ++j) {
      const int slot = slot0 + j;
      const float* xr = &xb[(size_t)j * D];  // preconditioned
      const float* yr = &yb[(size_t)j * D];  // and rotated
      uint8_t* row = blk + (size_t)slot * row_bytes;
      switch (fmt->layout) {
        case KvLayout::f32: std::memcpy(row, xr, sizeof(float) * D); break;
        case KvLayout::f16:
          if (side == 0) {  // K: dim-major within the block (32 tokens of one dim contiguous)
            f32_to_f16(D, xr, h.data());
            uint16_t* kb = reinterpret_cast<uint16_t*>(blk);
            for (int d = 0; d < D; ++d) kb[(size_t)d * kBlock + slot] = h[d];
          } else {
            f32_to_f16(D, xr, reinterpret_cast<uint16_t*>(row));
          }
          break;
        case KvLayout::q8_0: quantize_q8_0(D, rotated ? yr : xr, reinterpret_cast<BlockQ8_0*>(row)); break;
        case KvLayout::q4_0: quantize_q4_0(D, rotated ? yr : xr, reinterpret_cast<BlockQ4_0*>(row)); break;
        case KvLayout::tq:
        case KvLayout::tq_n8:
        case KvLayout::tq_split:  // split: xr holds the d_hi selected channels first (Channels)
          for (int i = 0; i < np; ++i) {
            const Part& p = parts[i];
            uint8_t* nb = blk + p.norm_off;  // fp16 norms, or the n8 header
            const double nrm = encode_tq_part(*p.cb, p.tc, p.dim, side, yr + p.off, norm2(xr + p.off, p.dim),
                                              p.n8 ? nullptr : reinterpret_cast<uint16_t*>(nb) + slot,
                                              blk + p.tiles_off, slot, idx.data(), u.data());
            if (p.n8) set_n8_norm(nb, slot, nrm);
          }
          break;
      }
    }
    n_quant += m;
    r += m;
  }
}

void Stream::decode_domain(int t0, int n, float* out) const {
  const Stream& s = *this;
  const int D = dim;
  TQ_ASSERT(t0 >= s.n_dropped && t0 + n <= s.n_quant);
  // SIMD q8_0 / q4_0 rows (contiguous within a block) and tq blocks (the tiles expanded once,
  // then the rows emitted) go a block at a time.
  const bool q_rows = (s.fmt->layout == KvLayout::q8_0 || s.fmt->layout == KvLayout::q4_0) && !simd::use_scalar();
  if (q_rows || fmt->turboquant()) {
    Part parts[2];
    const int np = q_rows ? 0 : parts_of(s, parts);
    std::vector<uint8_t> codes(np ? (size_t)kBlock * D : 0);
    for (int r = 0; r < n;) {
      const int t = t0 + r, first = t % kBlock, m = std::min(n - r, kBlock - first);
      const uint8_t* blk = block(t / kBlock);
      const uint8_t* rows = blk + (size_t)first * s.row_bytes;
      if (s.fmt->layout == KvLayout::q8_0) decode_q8_rows(D, m, rows, out + (size_t)r * D);
      if (s.fmt->layout == KvLayout::q4_0) decode_q4_rows(D, m, rows, out + (size_t)r * D);
      for (int i = 0; i < np; ++i) {
        const Part& p = parts[i];
        expand_tiles(blk + p.tiles_off, p.dim, p.bits, side == 0, codes.data());
        for (int j = 0; j < m; ++j)
          tq_part_values(*p.cb, p.tc, p.dim, codes.data() + (size_t)(first + j) * p.dim,
                         tq_block_norm(s, blk, i, first + j), out + (size_t)(r + j) * D + p.off);
      }
      r += m;
    }
    return;
  }
  for (int r = 0; r < n; ++r) {
    const int t = t0 + r;
    const uint8_t* blk = s.block(t / kBlock);
    const uint8_t* row = blk + (size_t)(t % kBlock) * s.row_bytes;
    float* o = out + (size_t)r * D;
    switch (s.fmt->layout) {
      case KvLayout::f32: std::memcpy(o, row, sizeof(float) * D); break;
      case KvLayout::f16:
        if (s.side == 0) {
          const uint16_t* kb = reinterpret_cast<const uint16_t*>(blk);
          for (int d = 0; d < D; ++d) o[d] = fp16_to_fp32(kb[(size_t)d * kBlock + t % kBlock]);
        } else {
          f16_to_f32(D, reinterpret_cast<const uint16_t*>(row), o);
        }
        break;
      case KvLayout::q8_0: dequantize_q8_0(D, reinterpret_cast<const BlockQ8_0*>(row), o); break;
      case KvLayout::q4_0: dequantize_q4_0(D, reinterpret_cast<const BlockQ4_0*>(row), o); break;
      default: TQ_ASSERT(false);  // tq layouts: above
    }
  }
}

// ------------------------------------------------------------------ KvCache
KvCache::KvCache(const KvCacheConfig& cfg) : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.cfg = cfg;
  TQ_CHECK(cfg.n_layers >= 1 && cfg.n_layers <= 4096, "kv cache: n_layers %d out of range [1, 4096]", cfg.n_layers);
  TQ_CHECK(cfg.n_kv_heads >= 1 && cfg.n_kv_heads <= 1024, "kv cache: n_kv_heads %d out of range [1, 1024]", cfg.n_kv_heads);
  TQ_CHECK(cfg.max_tokens >= 1 && cfg.max_tokens <= (1 << 24), "kv cache: max_tokens %d out of range [1, 2^24]", cfg.max_tokens);
  TQ_CHECK(cfg.window >= 0 && cfg.window <= 65536 && cfg.window <= cfg.max_tokens,
           "kv cache: window %d out of range [0, min(65536, max_tokens=%d)]", cfg.window, cfg.max_tokens);
  TQ_CHECK(cfg.sink >= 0 && cfg.sink <= 65536 && cfg.sink <= cfg.max_tokens,
           "kv cache: sink %d out of range [0, min(65536, max_tokens=%d)]", cfg.sink, cfg.max_tokens);
  TQ_CHECK(cfg.layer_window.empty() || static_cast<int>(cfg.layer_window.size()) == cfg.n_layers,
           "kv cache: layer_window has %zu entries for %d layers", cfg.layer_window.size(), cfg.n_layers);
  for (int w : cfg.layer_window)
    TQ_CHECK(w >= 0, "kv cache: layer_window entry %d is negative", w);
  TQ_CHECK(!cfg.center_rope || (cfg.center_k && std::isfinite(cfg.rope_base) && cfg.rope_base > 0),
           "kv cache: center_rope needs center_k and rope_base > 0 (got base %g)", (double)cfg.rope_base);
  TQ_CHECK(!(cfg.center_rope || cfg.rope_neox) ||
               (cfg.rope_dim >= 2 && cfg.rope_dim % 2 == 0 && cfg.rope_dim <= cfg.head_dim),
           "kv cache: center_rope and rope_neox need an even rope_dim in [2, head_dim] (got %d)", cfg.rope_dim);
  for (auto [list, name] : {std::pair{&cfg.layer_rope_base, "layer_rope_base"},
                            std::pair{&cfg.layer_rope_scale, "layer_rope_scale"}}) {
    TQ_CHECK(list->empty() || static_cast<int>(list->size()) == cfg.n_layers,
             "kv cache: %s has %zu entries for %d layers", name, list->size(), cfg.n_layers);
    for (float x : *list)
      TQ_CHECK(std::isfinite(x) && x >= 0, "kv cache: %s holds %g (must be finite and >= 0; 0: the default)",
               name, (double)x);
  }
  TQ_CHECK(cfg.rope_freq_factors.empty() || (int)cfg.rope_freq_factors.size() * 2 == cfg.rope_dim,
           "kv cache: rope_freq_factors has %zu entries for rope_dim %d (needs rope_dim / 2)",
           cfg.rope_freq_factors.size(), cfg.rope_dim);
  for (float x : cfg.rope_freq_factors)
    TQ_CHECK(std::isfinite(x) && x > 0, "kv cache: rope_freq_factors holds %g (must be finite and > 0)", (double)x);
  TQ_CHECK(cfg.center_segment >= 0 && cfg.center_segment % kBlock == 0 && cfg.center_segment <= kChunkTokens,
           "kv cache: center_segment %d must be a multiple of %d in [0, %d]", cfg.center_segment, kBlock,
           kChunkTokens);
  TQ_CHECK(cfg.boundary_layers >= 0 && 2 * cfg.boundary_layers <= cfg.n_layers + 1,
           "kv cache: boundary_layers %d too large for %d layers", cfg.boundary_layers, cfg.n_layers);
  const int D = cfg.head_dim;
  for (KvFormat f : {cfg.type_k, cfg.type_v, cfg.boundary_type_k, cfg.boundary_type_v})
    TQ_CHECK(f < KvFormat::count, "kv cache: invalid format %d", (int)f);
  const KvType tk = kv_type(cfg.type_k), tv = kv_type(cfg.type_v);
  const KvType bk = kv_type(cfg.boundary_type_k), bv = kv_type(cfg.boundary_type_v);
  const size_t n_streams = (size_t)cfg.n_layers * cfg.n_kv_heads;
  for (auto [list, name] :
       {std::pair{&cfg.layer_type_k, "layer_type_k"}, std::pair{&cfg.layer_type_v, "layer_type_v"}})
    TQ_CHECK(list->empty() || static_cast<int>(list->size()) == cfg.n_layers,
             "kv cache: %s has %zu entries for %d layers", name, list->size(), cfg.n_layers);
  for (auto [list, name] : {std::pair{&cfg.head_type_k, "head_type_k"}, std::pair{&cfg.head_type_v, "head_type_v"}})
    TQ_CHECK(list->empty() || list->size() == n_streams, "kv cache: %s has %zu entries for %zu streams", name,
             list->size(), n_streams);
  // types[l * n_kv_heads + h][side]: boundary rule first, then the per-layer, then the per-head overrides
  std::vector<std::array<KvType, 2>> types(n_streams);
  std::vector<KvType> used = {tk, tv, bk, bv};
  for (int l = 0; l < cfg.n_layers; ++l) {
    const bool boundary = l < cfg.boundary_layers || l >= cfg.n_layers - cfg.boundary_layers;
    for (int h = 0; h < cfg.n_kv_heads; ++h) {
      const size_t i = (size_t)l * cfg.n_kv_heads + h;
      types[i] = {boundary ? bk : tk, boundary ? bv : tv};
      for (int side = 0; side < 2; ++side) {
        const auto& over = side == 0 ? cfg.layer_type_k : cfg.layer_type_v;
        const auto& head = side == 0 ? cfg.head_type_k : cfg.head_type_v;
        const std::optional<KvFormat> f = !head.empty() && head[i] ? head[i] : !over.empty() ? over[l] : std::nullopt;
        if (f) {
          TQ_CHECK(*f < KvFormat::count, "kv cache: invalid format %d", (int)*f);
          types[i][side] = kv_type(*f);
          used.push_back(types[i][side]);
        }
      }
    }
  }
  for (KvType t : used) check_dim(format(t), D);
  for (KvType t : used) {
    const Format& f = format(t);
    if (f.rotated && f.layout != KvLayout::tq_split && !I.rot)
      I.rot = make_rotation(RotationSpec{RotationKind::hadamard}, D, cfg.seed);
    if (f.layout == KvLayout::tq_split && !I.rot_hi) {
      I.rot_hi = make_rotation(RotationSpec{RotationKind::hadamard}, D / 4, cfg.seed + 1);
      I.rot_lo = make_rotation(RotationSpec{RotationKind::hadamard}, D - D / 4, cfg.seed + 2);
    }
  }

  build_rope_tables(I);
  I.layers.resize(cfg.n_layers);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const bool sliding = !cfg.layer_window.empty() && cfg.layer_window[l] > 0;
    for (int side = 0; side < 2; ++side) {
      auto& vec = side == 0 ? I.layers[l].k : I.layers[l].v;
      vec.reserve(cfg.n_kv_heads);
      for (int h = 0; h < cfg.n_kv_heads; ++h)
        vec.emplace_back(format(types[(size_t)l * cfg.n_kv_heads + h][side]), side, l, sliding, cfg, I);
    }
  }
}

KvCache::~KvCache() = default;

const KvCacheConfig& KvCache::config() const noexcept { return impl_->cfg; }

int KvCache::n_tokens(int layer) const {
  TQ_CHECK(layer >= 0 && layer < impl_->cfg.n_layers, "kv cache: layer %d out of range [0, %d)", layer,
           impl_->cfg.n_layers);
  return impl_->layers[layer].n_tokens;
}

void KvCache::clear() {
  for (auto& L : impl_->layers) {
    L.n_tokens = 0;
    for (auto* vec : {&L.k, &L.v})
      for (auto& s : *vec) s.clear();
  }
}

void KvCache::observe_queries(int layer, int n_tokens, const float* q, int n_heads) {
  Impl& I = *impl_;
  const auto& cfg = I.cfg;
  TQ_CHECK(layer >= 0 && layer < cfg.n_layers, "kv cache observe_queries: layer %d out of range [0, %d)", layer,
           cfg.n_layers);
  TQ_CHECK(n_tokens >= 0, "kv cache observe_queries: negative token count %d", n_tokens);
  const int D = cfg.head_dim, H = cfg.n_kv_heads;
  TQ_CHECK(n_heads >= H && n_heads % H == 0, "kv cache observe_queries: %d query heads for %d kv heads", n_heads, H);
  Layer& L = I.layers[layer];
  const int group = n_heads / H;
  std::vector<float> q_pairs;  // q in the cache's pair order, made once
  bool ordered = false;
  for (int h = 0; h < H; ++h) {
    Stream& s = L.k[h];
    if (!s.wants_queries()) continue;
    TQ_CHECK(q, "kv cache observe_queries: null q");
    if (!ordered) q = in_pair_order(I, q, (size_t)n_tokens * n_heads, q_pairs), ordered = true;
    for (Precond* p : s.chain())
      if (p->wants_queries())
        p->observe_queries(L.n_tokens, n_tokens, q + (size_t)h * group * D, (size_t)n_heads * D, group, D);
  }
}

// One stream (side 0 = K / 1 = V, kv head h) of KvCache::append: statistics, sinks, window,
// encoding. Streams share nothing they write (L.n_tokens moves after all of them), so append
// may run them in any order or in parallel.
static void append_stream(KvCache::Impl& I, Layer& L, int side, int h, int n_tokens, const float* k,
                          const float* v) {
  const auto& cfg = I.cfg;
  const int D = cfg.head_dim, W = cfg.window;
  const size_t stride = (size_t)cfg.n_kv_heads * D;
  Stream& s = (side == 0 ? L.k : L.v)[h];
  const float* xh = (side == 0 ? k : v) + (size_t)h * D;
  // The preconditioners still choosing see the rows; a RoPE-rotating mean takes them turned
  // back to position 0, once.
  bool open = false;
  for (const Precond* p : s.chain()) open = open || p->open();
  if (open) {
    std::vector<float> unrot;
    if (s.centre.rope) {
      unrot.resize((size_t)n_tokens * D);
      for (int r = 0; r < n_tokens; ++r) s.centre.unrope_row(L.n_tokens + r, xh + (size_t)r * stride, &unrot[(size_t)r * D]);
    }
    const Rows rows{L.n_tokens, n_tokens, xh, stride, unrot.empty() ? nullptr : unrot.data()};
    for (Precond* p : s.chain())
      if (p->open()) p->observe(rows, D);
  }
  // Sinks: the first S positions stay in f16 for good.
  const int S = cfg.sink;
  const int r0 = std::clamp(S - L.n_tokens, 0, n_tokens);
  for (int r = 0; r < r0; ++r)
    f32_to_f16(D, xh + (size_t)r * stride, s.sink_rows.get() + (size_t)(L.n_tokens + r) * D);
  if (r0 == n_tokens) return;
  if (W == 0) {
    s.encode_rows(n_tokens - r0, xh + (size_t)r0 * stride, stride);
    return;
  }
  std::vector<float> tmp((size_t)D);
  for (int r = r0; r < n_tokens; ++r) {
    const int t = L.n_tokens + r - S;  // position of the new token after the sinks
    uint16_t* slot = s.ring.get() + (size_t)(t % W) * D;
    if (t >= W) {  // token t - W (after the sinks) leaves the window: quantize it
      f16_to_f32(D, slot, tmp.data());
      s.encode_rows(1, tmp.data(), (size_t)D);
    }
    f32_to_f16(D, xh + (size_t)r * stride, slot);
  }
}

void KvCache::append(int layer, int n_tokens, const float* k, const float* v, int n_threads) {
  Impl& I = *impl_;
  const auto& cfg = I.cfg;
  TQ_CHECK(layer >= 0 && layer < cfg.n_layers, "kv cache append: layer %d out of range [0, %d)", layer,
           cfg.n_layers);
  TQ_CHECK(n_tokens >= 0, "kv cache append: negative token count %d", n_tokens);
  Layer& L = I.layers[layer];
  TQ_CHECK(n_tokens <= cfg.max_tokens - L.n_tokens,
           "kv cache append: layer %d holds %d tokens, appending %d exceeds capacity %d", layer,
           L.n_tokens, n_tokens, cfg.max_tokens);
  if (n_tokens == 0) return;
  TQ_CHECK(k && v, "kv cache append: null k or v");
  const int H = cfg.n_kv_heads;
  if (!cfg.layer_window.empty() && cfg.layer_window[layer] > 0) {
    // The first query of this append (position L.n_tokens) sees from L.n_tokens - W + 1 on;
    // every later one from further on. In stream indices (after the sinks):
    const int keep = L.n_tokens - cfg.layer_window[layer] + 1 - std::min(L.n_tokens, cfg.sink);
    for (auto* vec : {&L.k, &L.v})
      for (auto& s : *vec) s.drop_before(std::min(keep, s.n_quant));
  }
  const size_t stride = (size_t)H * cfg.head_dim;
  TQ_CHECK(all_finite((size_t)n_tokens * stride, k) && all_finite((size_t)n_tokens * stride, v),
           "kv cache append: layer %d: k/v contain NaN or Inf", layer);
  // Prefill-sized appends encode the 2 H streams in parallel (trellis codes: two Viterbi
  // passes per token and part; scalar codes: the rotation and the code search).
  const bool parallel = n_threads > 1 && n_tokens >= 16;
  // The angle table holds at most kRopeTurnsMax positions (1-2 MB); an append of more computes
  // the rest in place.
  if (!I.layer_rope.empty()) {
    RopeTables& T = I.rope[I.layer_rope[layer]];
    T.turns.cover(T.freq, cfg.sink, L.n_tokens, std::min(n_tokens, kRopeTurnsMax));
  }
  std::vector<float> k_pairs;
  k = in_pair_order(I, k, (size_t)n_tokens * H, k_pairs);
  std::exception_ptr err;
  auto job_fn = [&](int job) {
    try {
      append_stream(I, L, job / H, job % H, n_tokens, k, v);
    } catch (...) {
#pragma omp critical(tq_kv_append_error)
      if (!err) err = std::current_exception();
    }
  };
  if (parallel) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads)
    for (int job = 0; job < 2 * H; ++job) job_fn(job);
  } else {  // no OpenMP region: an `if (false)` one still costs ~0.7 us (a decode step's appends)
    for (int job = 0; job < 2 * H; ++job) job_fn(job);
  }
  if (err) std::rethrow_exception(err);
  L.n_tokens += n_tokens;
}

double KvCache::bytes_per_token() const {
  const Impl& I = *impl_;
  double total = 0;
  for (const auto& L : I.layers)
    for (const auto* vec : {&L.k, &L.v})
      for (const auto& s : *vec) total += (double)s.block_bytes / kBlock;  // tq_n8: block header shared
  return total;
}

size_t KvCache::bytes_used() const {
  const Impl& I = *impl_;
  size_t total = 0;
  for (const auto& L : I.layers)
    for (const auto* vec : {&L.k, &L.v})
      for (const auto& s : *vec) {
        total += (size_t)(s.n_quant - s.n_dropped) * s.row_bytes;
        if (s.fmt->log8_norms())  // exponents: one per part and block held
          total += (size_t)((s.n_quant + kBlock - 1) / kBlock - s.n_dropped / kBlock) * 2 * s.fmt->n_parts;
        const int n_sink = std::min(L.n_tokens, s.sink);
        total += (size_t)n_sink * s.dim * 2;                                  // f16 sink rows
        total += (size_t)std::min(L.n_tokens - n_sink, s.window) * s.dim * 2;  // f16 window rows
        for (const Precond* p : s.chain()) total += p->bytes(s.dim);  // means, K scales, channel masks
      }
  return total;
}

}  // namespace tq
