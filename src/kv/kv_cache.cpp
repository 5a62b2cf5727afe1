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
static inline void tile_pos_k(int dim, int tok, int d, int& tile, int& bit) {
  tile = (tok >> 4) * (dim >> 2) + (d >> 2);
  bit = 4 * (tok & 15) + (d & 3);
}
static inline void tile_pos_v(int dim, int tok, int d, int& tile, int& bit) {
  (void)dim;
  tile = (d >> 4) * 8 + (tok >> 2);
  bit = 4 * (d & 15) + (tok & 3);
}

template <bool kIsK>
static void get_codes(const uint8_t* tiles, int dim, int bits, int tok, uint8_t* codes) noexcept {
  for (int d = 0; d < dim; ++d) {
    int tile, bit;
    if (kIsK) tile_pos_k(dim, tok, d, tile, bit); else tile_pos_v(dim, tok, d, tile, bit);
    const uint8_t* t = tiles + (size_t)tile * bits * 8;
    unsigned c = 0;
    for (int p = 0; p < bits; ++p) c |= ((t[p * 8 + (bit >> 3)] >> (bit & 7)) & 1u) << p;
    codes[d] = (uint8_t)c;
  }
}
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
void get_tile_codes_k(const uint8_t* t, int dim, int bits, int tok, uint8_t* c) noexcept { get_codes<true>(t, dim, bits, tok, c); }
void get_tile_codes_v(const uint8_t* t, int dim, int bits, int tok, uint8_t* c) noexcept { get_codes<false>(t, dim, bits, tok, c); }
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
  for (const auto& r : kRemovedFormats) TQ_CHECK(name != r.name, "kv cache type %s: %s", r.name, r.why);
  std::string valid;
  for (int i = 0; i < kNumFormats; ++i) valid += std::string(i ? ", " : "") + kFormats[i].name;
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

static void decode_tq_part(const Codebook& cb, const TrellisCode* tc, int dim, int side, const uint8_t* tiles,
                           int slot, float norm, uint8_t* idx, float* out) {
  if (side == 0) get_tile_codes_k(tiles, dim, cb.bits, slot, idx);
  else get_tile_codes_v(tiles, dim, cb.bits, slot, idx);
  tq_part_values(cb, tc, dim, idx, norm, out);
}

// Selected channels of the split types (tqBhH), chosen online when the stream's first token
// is quantized, over every token it has seen then (appended, window included), and frozen
// from then on: the logit error a channel adds is its K error times its query energy, so the
// D/8 adjacent channel pairs (2i, 2i+1) with the largest (sum of (k - mu)^2) x (sum of q^2
// over the group's query heads, from observe_queries) take the high bits (ties: lower index);
// pairs, because RoPE rotates each pair by the position and moves energy between its two
// channels. Position 0 (BOS) is left out of both sums. Without observed queries: K energy
// alone. Costs D bits per stream (counted in bytes_used).
static void freeze_split(Stream& s) {
  constexpr int g = 2;  // channels per unit: RoPE pairs
  const bool weigh = s.q_n > 0;
  std::vector<double> w(s.dim / g, 0.0), qw(w.size(), 0.0);
  for (int d = 0; d < s.dim; ++d) {
    w[d / g] += s.chan_energy[d];
    if (weigh) qw[d / g] += s.q_energy[d];
  }
  if (weigh)
    for (size_t u = 0; u < w.size(); ++u) w[u] *= qw[u];
  std::vector<int> units(w.size());
  std::iota(units.begin(), units.end(), 0);
  std::stable_sort(units.begin(), units.end(), [&](int a, int b) { return w[a] > w[b]; });
  std::vector<int> order;
  for (int u : units)
    for (int j = 0; j < g; ++j) order.push_back(u * g + j);
  std::vector<int> hi(order.begin(), order.begin() + s.d_hi), lo(order.begin() + s.d_hi, order.end());
  std::sort(hi.begin(), hi.end());
  std::sort(lo.begin(), lo.end());
  s.perm = hi;
  s.perm.insert(s.perm.end(), lo.begin(), lo.end());
  s.split_frozen = true;
  s.domain = Domain::split;
}

// y = x with RoPE pair (2i, 2i + 1), i < freq.size(), turned by the angle whose (cos, sin)
// turn(i) gives; the other dims copied.
template <class Turn>
static void turn_pairs(const std::vector<double>& freq, int D, const float* x, float* y, Turn turn) {
  std::memcpy(y, x, sizeof(float) * D);
  for (size_t i = 0; i < freq.size(); ++i) {
    const auto [c, sn] = turn(i);
    const double x0 = x[2 * i], x1 = x[2 * i + 1];
    y[2 * i] = (float)(x0 * c - x1 * sn);
    y[2 * i + 1] = (float)(x0 * sn + x1 * c);
  }
}

// (cos, sin) of pair i's angle: from a RopeTurns entry when there is one, else from `angle`.
static std::pair<double, double> turn_of(const double* tab, size_t i, double angle) {
  if (tab) return {tab[2 * i], tab[2 * i + 1]};
  return {std::cos(angle), std::sin(angle)};
}

// Un-rotates a row of position pos: R(pos)^-1 x (the pre-RoPE key the means are taken of).
static void unrope_row(const Stream& s, int pos, const float* x, float* y) {
  const double* tab = s.turns ? s.turns->at_back(pos) : nullptr;
  turn_pairs(s.rope_freq, s.dim, x, y, [&](size_t i) { return turn_of(tab, i, -(double)pos * s.rope_freq[i]); });
}

// Angle positions of the RoPE-rotating mean: the token's own for the kRopeExactPairs fastest
// pairs, its block's centre for the rest (what the kernels' per-block terms assume).
static double rope_mean_pos(int pos0, int j, size_t pair) {
  return (int)pair < kRopeExactPairs ? (double)(pos0 + j) : pos0 + (j / kBlock) * kBlock + 0.5 * (kBlock - 1);
}

void RopeTurns::cover(const std::vector<double>& freq, int q0, int first, int count) {
  if (first == p0 && count == n && q0 == pos0 && (int)freq.size() == P) return;
  P = (int)freq.size();
  p0 = first;
  n = count;
  pos0 = q0;
  fwd.resize((size_t)n * P * 2);
  back.resize((size_t)n * P * 2);
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < P; ++i) {
      const double a = (double)(p0 + r) * freq[i], b = -(double)(p0 + r) * freq[i];
      double* f = &fwd[((size_t)r * P + i) * 2];
      double* g = &back[((size_t)r * P + i) * 2];
      f[0] = std::cos(a), f[1] = std::sin(a);
      g[0] = std::cos(b), g[1] = std::sin(b);
    }
  // Block centres of the stream indices p - pos0 >= 0 of these positions.
  const int j0 = std::max(0, p0 - pos0), j1 = p0 + n - 1 - pos0;
  nc = j1 >= j0 ? j1 / kBlock - j0 / kBlock + 1 : 0;
  c0 = nc ? rope_mean_pos(pos0, j0 / kBlock * kBlock, kRopeExactPairs) : 0;
  centre.resize((size_t)nc * P * 2);
  for (int k = 0; k < nc; ++k)
    for (int i = 0; i < P; ++i) {
      const double a = rope_mean_pos(pos0, (j0 / kBlock + k) * kBlock, kRopeExactPairs) * freq[i];
      centre[((size_t)k * P + i) * 2] = std::cos(a);
      centre[((size_t)k * P + i) * 2 + 1] = std::sin(a);
    }
}

// A slow pair's offset from its block's centre, in tokens: -15.5 ... 15.5.
static double rope_block_offset(int j) { return (j % kBlock) - 0.5 * (kBlock - 1); }

void Stream::drop_all() {
  if (blocks_per_chunk == 1) {  // a sliding-window stream: every chunk back to the spares
    for (auto& c : chunks)
      if (c) spare.push_back(std::move(c));
    chunks.clear();
  }
  n_dropped = 0;
}

void Stream::drop_before(int j) {
  const int b_end = j / kBlock;  // blocks [0, b_end) are wholly before j
  for (int c = n_dropped / kBlock / blocks_per_chunk; c < (int)chunks.size() && (c + 1) * blocks_per_chunk <= b_end; ++c)
    if (chunks[c]) spare.push_back(std::move(chunks[c]));
  n_dropped = std::max(n_dropped, b_end / blocks_per_chunk * blocks_per_chunk * kBlock);
}

void Stream::mean_at(int j, float* out) const noexcept {
  if (!rope_mu) {
    std::memcpy(out, mu_of(j), sizeof(float) * dim);
    return;
  }
  const double* fast = turns ? turns->at(pos0 + j) : nullptr;
  const double* slow = turns && rope_freq.size() > (size_t)kRopeExactPairs
                           ? turns->at_centre(rope_mean_pos(pos0, j, kRopeExactPairs))
                           : nullptr;
  turn_pairs(rope_freq, dim, mu_of(j), out, [&](size_t i) {
    return turn_of((int)i < kRopeExactPairs ? fast : slow, i, rope_mean_pos(pos0, j, i) * rope_freq[i]);
  });
  // Slow pairs: u = R(centre) mu turned on by x = w * offset to second order,
  // (1 - x^2 / 2) u + x R(pi / 2) u, so that the kernels add it as two terms per token.
  const double dj = rope_block_offset(j);
  for (size_t i = kRopeExactPairs; i < rope_freq.size(); ++i) {
    const double x = rope_freq[i] * dj, c = 1.0 - 0.5 * x * x, u0 = out[2 * i], u1 = out[2 * i + 1];
    out[2 * i] = (float)(c * u0 - x * u1);
    out[2 * i + 1] = (float)(c * u1 + x * u0);
  }
}

// Mean centring, chosen online: when a centred stream's first token is quantized, mu is the
// mean of every token the stream has seen so far (sinks, window and the whole batch being
// appended) except position 0 (the BOS / attention-sink token, an outlier in most models),
// rounded to fp16 and frozen from then on. If position 0 is the only token seen (token-by-token
// from an empty cache with no sink and no window), mu = 0: no centring for that stream.
static void freeze_mu(Stream& s) {
  const int D = s.dim, n = s.stat_n - 1;  // position 0 excluded
  s.mu.assign(D, 0.f);
  s.n_mu = 1;
  if (n > 0)
    for (int d = 0; d < D; ++d)
      s.mu[d] = fp16_to_fp32(fp32_to_fp16((float)((s.stat_sum[d] - s.stat_x0[d]) / n)));
  s.mu_frozen = true;
  if (s.stats_open()) {
    // Outlier channels and K scaling use the centred rows: sum (x - mu)^2 over the same tokens.
    // rope_mu: chan_sum holds un-rotated rows; a pair's energy is rotation invariant, so its
    // correction is exact per pair and split evenly over the pair's two channels.
    if (s.rope_mu) {
      for (int d = 0; d + 1 < D; d += 2) {
        const double c = -2.0 * (s.mu[d] * s.chan_sum[d] + s.mu[d + 1] * s.chan_sum[d + 1]) +
                         (double)s.chan_n * (s.mu[d] * s.mu[d] + s.mu[d + 1] * s.mu[d + 1]);
        s.chan_energy[d] += c / 2;
        s.chan_energy[d + 1] += c / 2;
      }
    } else {
      for (int d = 0; d < D; ++d)
        s.chan_energy[d] += -2.0 * s.mu[d] * s.chan_sum[d] + (double)s.chan_n * s.mu[d] * s.mu[d];
    }
  }
}

// K scaling (KvCacheConfig::scale_k), chosen when the stream's first token is quantized. For
// an isotropic quantizer of y = w * k (rotation + codebook: error variance per coordinate
// proportional to |y|^2), the q.k error variance is proportional to
//   (sum_d w_d^2 E[k_d^2]) (sum_d E[q_d^2] / w_d^2),
// smallest (Cauchy-Schwarz) at w_d^2 proportional to sqrt(E[q_d^2] / E[k_d^2]). One weight per
// RoPE pair (RoPE moves energy between the pair's channels), from the centred K energy and
// the query energy of the n tokens seen before freezing, the exponent shrunk by n / (n + 16)
// (a short prompt is a noisy estimate: the weights move toward 1); clamped to [1/4, 4] x the geometric
// mean (a pair nearly empty then can grow later without swamping the rest), scaled so that
// sum_d w_d^2 E[k_d^2] = sum_d E[k_d^2] (norms keep their range), rounded to fp16: D / 2
// stored values (counted in bytes_used).
static void freeze_kscale(Stream& s) {
  s.kscale_frozen = true;
  s.kw.clear();
  if (s.q_n == 0 || s.chan_n == 0) return;  // no queries seen: identity
  const int P = s.dim / 2;
  std::vector<double> ke(P), w(P);
  double kmax = 0, qmax = 0;
  for (int u = 0; u < P; ++u) {
    ke[u] = std::max(0.0, s.chan_energy[2 * u] + s.chan_energy[2 * u + 1]);
    kmax = std::max(kmax, ke[u]);
    qmax = std::max(qmax, s.q_energy[2 * u] + s.q_energy[2 * u + 1]);
  }
  if (!(kmax > 0) || !(qmax > 0)) return;
  const double n = std::min(s.q_n, s.chan_n), expo = 0.25 * n / (n + 16);
  double lsum = 0;
  for (int u = 0; u < P; ++u) {
    const double q = std::max(s.q_energy[2 * u] + s.q_energy[2 * u + 1], 1e-9 * qmax);
    w[u] = std::pow(q / std::max(ke[u], 1e-9 * kmax), expo);
    lsum += std::log(w[u]);
  }
  const double gm = std::exp(lsum / P);
  double e0 = 0, e1 = 0;
  for (int u = 0; u < P; ++u) {
    w[u] = std::clamp(w[u], gm / 4, gm * 4);
    e0 += ke[u];
    e1 += w[u] * w[u] * ke[u];
  }
  const double c = std::sqrt(e0 / e1);
  s.kw.resize(s.dim);
  for (int u = 0; u < P; ++u) s.kw[2 * u] = s.kw[2 * u + 1] = fp16_to_fp32(fp32_to_fp16((float)(w[u] * c)));
}

// ------------------------------------------------------------------ Impl: transforms
void KvCache::Impl::query_to_domain(const Stream& s, int n, const float* q, float* y) const {
  if (s.kw.empty()) return to_domain(s, n, q, y);
  const int D = s.dim;
  std::vector<float> t((size_t)n * D);
  for (int r = 0; r < n; ++r)
    for (int d = 0; d < D; ++d) t[(size_t)r * D + d] = q[(size_t)r * D + d] / s.kw[d];
  to_domain(s, n, t.data(), y);
}

void KvCache::Impl::to_domain(const Stream& s, int n, const float* x, float* y) const {
  const int D = s.dim;
  switch (s.domain) {
    case Domain::orig:
      if (y != x) std::memcpy(y, x, sizeof(float) * (size_t)n * D);
      return;
    case Domain::rot:
      rot->forward((size_t)n, x, y);
      return;
    case Domain::split: {
      std::vector<float> a((size_t)n * s.d_hi), b((size_t)n * s.d_lo);
      for (int r = 0; r < n; ++r) {
        for (int i = 0; i < s.d_hi; ++i) a[(size_t)r * s.d_hi + i] = x[(size_t)r * D + s.perm[i]];
        for (int i = 0; i < s.d_lo; ++i) b[(size_t)r * s.d_lo + i] = x[(size_t)r * D + s.perm[s.d_hi + i]];
      }
      rot_hi->forward((size_t)n, a.data(), a.data());
      rot_lo->forward((size_t)n, b.data(), b.data());
      for (int r = 0; r < n; ++r) {
        std::memcpy(y + (size_t)r * D, &a[(size_t)r * s.d_hi], sizeof(float) * s.d_hi);
        std::memcpy(y + (size_t)r * D + s.d_hi, &b[(size_t)r * s.d_lo], sizeof(float) * s.d_lo);
      }
      return;
    }
  }
}

void KvCache::Impl::to_orig(const Stream& s, int n, float* x) const {
  const int D = s.dim;
  switch (s.domain) {
    case Domain::orig: break;
    case Domain::rot: rot->inverse((size_t)n, x, x); break;
    case Domain::split: {
      std::vector<float> a((size_t)n * s.d_hi), b((size_t)n * s.d_lo);
      for (int r = 0; r < n; ++r) {
        std::memcpy(&a[(size_t)r * s.d_hi], x + (size_t)r * D, sizeof(float) * s.d_hi);
        std::memcpy(&b[(size_t)r * s.d_lo], x + (size_t)r * D + s.d_hi, sizeof(float) * s.d_lo);
      }
      rot_hi->inverse((size_t)n, a.data(), a.data());
      rot_lo->inverse((size_t)n, b.data(), b.data());
      for (int r = 0; r < n; ++r) {
        for (int i = 0; i < s.d_hi; ++i) x[(size_t)r * D + s.perm[i]] = a[(size_t)r * s.d_hi + i];
        for (int i = 0; i < s.d_lo; ++i) x[(size_t)r * D + s.perm[s.d_hi + i]] = b[(size_t)r * s.d_lo + i];
      }
      break;
    }
  }
  if (!s.kw.empty())
    for (int r = 0; r < n; ++r)
      for (int d = 0; d < D; ++d) x[(size_t)r * D + d] /= s.kw[d];
}

// ------------------------------------------------------------------ Impl: encode / decode
void KvCache::Impl::encode_rows(Stream& s, int n, const float* x, size_t stride) {
  const int D = s.dim;
  if (n <= 0) return;
  if (s.center && !s.mu_frozen) freeze_mu(s);
  if (s.kscale && !s.kscale_frozen) freeze_kscale(s);
  if (s.fmt->layout == KvLayout::tq_split && !s.split_frozen) freeze_split(s);
  std::vector<float> xb((size_t)kBlock * D), yb((size_t)kBlock * D), u((size_t)D);
  std::vector<uint8_t> idx((size_t)D);
  std::vector<uint16_t> h((size_t)D);
  int r = 0;
  while (r < n) {  // segments that stay inside one block
    const int t = s.n_quant;
    const int b = t / kBlock, slot0 = t % kBlock;
    const int m = std::min(n - r, kBlock - slot0);
    const int c = b / s.blocks_per_chunk;
    if (c >= (int)s.chunks.size()) s.chunks.resize((size_t)c + 1);
    if (!s.chunks[c]) {
      if (!s.spare.empty()) {
        s.chunks[c] = std::move(s.spare.back());
        s.spare.pop_back();
      } else {
        s.chunks[c] = make_aligned<uint8_t>(checked_mul(s.block_bytes, s.blocks_per_chunk, "kv chunk bytes"));
      }
    }
    uint8_t* blk = s.block(b);
    if (slot0 == 0) std::memset(blk, 0, s.block_bytes);
    for (int j = 0; j < m; ++j)
      std::memcpy(&xb[(size_t)j * D], x + (size_t)(r + j) * stride, sizeof(float) * D);
    if (s.center) {
      // Segmented means: segment g >= 1 starts here: its mean is that of segment g - 1.
      if (s.mu_segment > 0 && t / s.mu_segment >= s.n_mu) {
        TQ_ASSERT(t % s.mu_segment == 0 && t / s.mu_segment == s.n_mu);
        s.mu.resize((size_t)(s.n_mu + 1) * D);
        for (int d = 0; d < D; ++d)
          s.mu[(size_t)s.n_mu * D + d] = fp16_to_fp32(fp32_to_fp16((float)(s.seg_sum[d] / s.mu_segment)));
        ++s.n_mu;
        std::fill(s.seg_sum.begin(), s.seg_sum.end(), 0.0);
      }
      if (s.mu_segment > 0)
        for (int j = 0; j < m; ++j) {
          const float* xr = &xb[(size_t)j * D];
          if (s.rope_mu) {
            unrope_row(s, s.pos0 + t + j, xr, u.data());
            xr = u.data();
          }
          for (int d = 0; d < D; ++d) s.seg_sum[d] += xr[d];
        }
    }
    if (s.center)
      for (int j = 0; j < m; ++j) {
        s.mean_at(t + j, u.data());
        for (int d = 0; d < D; ++d) xb[(size_t)j * D + d] -= u[d];
      }
    if (!s.kw.empty())
      for (int j = 0; j < m; ++j)
        for (int d = 0; d < D; ++d) xb[(size_t)j * D + d] *= s.kw[d];
    if (s.domain != Domain::orig) to_domain(s, m, xb.data(), yb.data());
    for (int j = 0; j < m; ++j) {
      const int slot = slot0 + j;
      const float* xr = &xb[(size_t)j * D];
      const float* yr = &yb[(size_t)j * D];
      uint8_t* row = blk + (size_t)slot * s.row_bytes;
      switch (s.fmt->layout) {
        case KvLayout::f32: std::memcpy(row, xr, sizeof(float) * D); break;
        case KvLayout::f16:
          if (s.side == 0) {  // K: dim-major within the block (32 tokens of one dim contiguous)
            f32_to_f16(D, xr, h.data());
            uint16_t* kb = reinterpret_cast<uint16_t*>(blk);
            for (int d = 0; d < D; ++d) kb[(size_t)d * kBlock + slot] = h[d];
          } else {
            f32_to_f16(D, xr, reinterpret_cast<uint16_t*>(row));
          }
          break;
        case KvLayout::q8_0:
        case KvLayout::q4_0: {
          const float* src = s.domain == Domain::rot ? yr : xr;
          if (s.fmt->layout == KvLayout::q8_0) quantize_q8_0(D, src, reinterpret_cast<BlockQ8_0*>(row));
          else quantize_q4_0(D, src, reinterpret_cast<BlockQ4_0*>(row));
          break;
        }
        case KvLayout::tq:
          encode_tq_part(*s.cb, s.tc, D, s.side, yr, norm2(xr, D), reinterpret_cast<uint16_t*>(blk) + slot,
                         blk + s.norms_bytes, slot, idx.data(), u.data());
          break;
        case KvLayout::tq_n8:
          set_n8_norm(blk, slot, encode_tq_part(*s.cb, s.tc, D, s.side, yr, norm2(xr, D), nullptr,
                                                blk + s.norms_bytes, slot, idx.data(), u.data()));
          break;
        case KvLayout::tq_split: {
          double e_hi = 0, e_lo = 0;
          for (int i = 0; i < s.d_hi; ++i) e_hi += (double)xr[s.perm[i]] * xr[s.perm[i]];
          for (int i = s.d_hi; i < D; ++i) e_lo += (double)xr[s.perm[i]] * xr[s.perm[i]];
          const bool n8 = s.fmt->log8_norms();
          uint16_t* h = reinterpret_cast<uint16_t*>(blk);
          const double n_hi = encode_tq_part(*s.cb_hi, s.tc_hi, s.d_hi, s.side, yr, std::sqrt(e_hi), n8 ? nullptr : h + slot,
                                             blk + s.norms_bytes, slot, idx.data(), u.data());
          const double n_lo = encode_tq_part(*s.cb, s.tc, s.d_lo, s.side, yr + s.d_hi, std::sqrt(e_lo),
                                             n8 ? nullptr : h + kBlock + slot, blk + s.norms_bytes + s.tiles_hi_bytes,
                                             slot, idx.data(), u.data());
          if (n8) {
            set_n8_norm(blk, slot, n_hi);
            set_n8_norm(blk + kN8HeaderBytes, slot, n_lo);
          }
          break;
        }
      }
    }
    s.n_quant += m;
    r += m;
  }
}

void KvCache::Impl::decode_domain(const Stream& s, int t0, int n, float* out) const {
  const int D = s.dim;
  TQ_ASSERT(t0 >= s.n_dropped && t0 + n <= s.n_quant);
  if ((s.fmt->layout == KvLayout::q8_0 || s.fmt->layout == KvLayout::q4_0) && !simd::use_scalar()) {
    for (int r = 0; r < n;) {  // rows are contiguous within a block
      const int t = t0 + r, m = std::min(n - r, kBlock - t % kBlock);
      const uint8_t* rows = s.block(t / kBlock) + (size_t)(t % kBlock) * s.row_bytes;
      if (s.fmt->layout == KvLayout::q8_0) decode_q8_rows(D, m, rows, out + (size_t)r * D);
      else decode_q4_rows(D, m, rows, out + (size_t)r * D);
      r += m;
    }
    return;
  }
  if (s.fmt->turboquant() && !simd::use_scalar()) {
    std::vector<uint8_t> codes((size_t)kBlock * D);
    for (int r = 0; r < n;) {  // whole blocks: expand the tiles once, then emit the rows
      const int t = t0 + r, b = t / kBlock, first = t % kBlock, m = std::min(n - r, kBlock - first);
      const uint8_t* blk = s.block(b);
      const int nparts = s.fmt->n_parts;
      for (int part = 0; part < nparts; ++part) {
        const Codebook& cb = (nparts == 2 && part == 0) ? *s.cb_hi : *s.cb;
        const TrellisCode* tc = (nparts == 2 && part == 0) ? s.tc_hi : s.tc;
        const int dim = nparts == 1 ? D : (part == 0 ? s.d_hi : s.d_lo);
        const int off = part == 1 ? s.d_hi : 0;
        const uint8_t* tiles = blk + s.norms_bytes + (part == 1 ? s.tiles_hi_bytes : 0);
        expand_tiles(tiles, dim, cb.bits, s.side == 0, codes.data());
        for (int j = 0; j < m; ++j) {
          const float nrm = tq_block_norm(s, blk, part, first + j);
          const uint8_t* c = codes.data() + (size_t)(first + j) * dim;
          float* o = out + (size_t)(r + j) * D + off;
          tq_part_values(cb, tc, dim, c, nrm, o);
        }
      }
      r += m;
    }
    return;
  }
  std::vector<uint8_t> idx((size_t)D);
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
      case KvLayout::tq:
      case KvLayout::tq_n8: {
        const uint8_t* tiles = blk + s.norms_bytes;
        decode_tq_part(*s.cb, s.tc, D, s.side, tiles, t % kBlock, tq_block_norm(s, blk, 0, t % kBlock), idx.data(), o);
        break;
      }
      case KvLayout::tq_split: {
        decode_tq_part(*s.cb_hi, s.tc_hi, s.d_hi, s.side, blk + s.norms_bytes, t % kBlock,
                       tq_block_norm(s, blk, 0, t % kBlock), idx.data(), o);
        decode_tq_part(*s.cb, s.tc, s.d_lo, s.side, blk + s.norms_bytes + s.tiles_hi_bytes, t % kBlock,
                       tq_block_norm(s, blk, 1, t % kBlock), idx.data(), o + s.d_hi);
        break;
      }
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
  TQ_CHECK(!cfg.center_rope || (cfg.center_k && std::isfinite(cfg.rope_base) && cfg.rope_base > 0 &&
                                cfg.rope_dim >= 2 && cfg.rope_dim % 2 == 0 && cfg.rope_dim <= cfg.head_dim),
           "kv cache: center_rope needs center_k, rope_base > 0 and an even rope_dim in [2, head_dim] "
           "(got base %g, dim %d)", (double)cfg.rope_base, cfg.rope_dim);
  TQ_CHECK(cfg.center_segment >= 0 && cfg.center_segment % kBlock == 0 && cfg.center_segment <= kChunkTokens,
           "kv cache: center_segment %d must be a multiple of %d in [0, %d]", cfg.center_segment, kBlock,
           kChunkTokens);
  TQ_CHECK(cfg.boundary_layers >= 0 && 2 * cfg.boundary_layers <= cfg.n_layers + 1,
           "kv cache: boundary_layers %d too large for %d layers", cfg.boundary_layers, cfg.n_layers);
  const int D = cfg.head_dim;
  const KvType tk = parse_kv_type(cfg.type_k), tv = parse_kv_type(cfg.type_v);
  const KvType bk = parse_kv_type(cfg.boundary_type_k), bv = parse_kv_type(cfg.boundary_type_v);
  TQ_CHECK(cfg.layer_type_k.empty() || static_cast<int>(cfg.layer_type_k.size()) == cfg.n_layers,
           "kv cache: layer_type_k has %zu entries for %d layers", cfg.layer_type_k.size(), cfg.n_layers);
  TQ_CHECK(cfg.layer_type_v.empty() || static_cast<int>(cfg.layer_type_v.size()) == cfg.n_layers,
           "kv cache: layer_type_v has %zu entries for %d layers", cfg.layer_type_v.size(), cfg.n_layers);
  const size_t n_streams = (size_t)cfg.n_layers * cfg.n_kv_heads;
  TQ_CHECK(cfg.head_type_k.empty() || cfg.head_type_k.size() == n_streams,
           "kv cache: head_type_k has %zu entries for %zu streams", cfg.head_type_k.size(), n_streams);
  TQ_CHECK(cfg.head_type_v.empty() || cfg.head_type_v.size() == n_streams,
           "kv cache: head_type_v has %zu entries for %zu streams", cfg.head_type_v.size(), n_streams);
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
        const std::string* name = !head.empty() && !head[i].empty() ? &head[i]
                                  : !over.empty() && !over[l].empty() ? &over[l] : nullptr;
        if (name) {
          types[i][side] = parse_kv_type(*name);
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

  // RoPE-rotating K mean: pair frequencies and the kernels' tables (see Stream::rope_cos).
  std::vector<double> rope_freq;
  const int rope_nbs = cfg.max_tokens / kBlock + 1 + 16;  // + 16: vector reads past the last block
  if (cfg.center_rope) {
    const int P = cfg.rope_dim / 2, F = std::min(P, kRopeExactPairs);
    for (int i = 0; i < P; ++i) rope_freq.push_back(std::pow((double)cfg.rope_base, -2.0 * i / cfg.rope_dim));
    I.rope_cos.assign((size_t)P * rope_nbs, 0.f);
    I.rope_sin.assign((size_t)P * rope_nbs, 0.f);
    I.rope_j.resize((size_t)(F + 1) * 2 * kBlock);
    for (int i = 0; i < P; ++i) {
      for (int b = 0; b + 16 < rope_nbs; ++b) {  // fast pairs: the block's first token
        const double a = rope_mean_pos(cfg.sink, b * kBlock, i) * rope_freq[i];
        I.rope_cos[(size_t)i * rope_nbs + b] = (float)std::cos(a);
        I.rope_sin[(size_t)i * rope_nbs + b] = (float)std::sin(a);
      }
      if (i < F)
        for (int j = 0; j < kBlock; ++j) {
          I.rope_j[(size_t)i * 2 * kBlock + j] = (float)std::cos(j * rope_freq[i]);
          I.rope_j[(size_t)i * 2 * kBlock + kBlock + j] = (float)std::sin(j * rope_freq[i]);
        }
    }
    I.rope_freq = rope_freq;
    for (int j = 0; j < kBlock; ++j) {  // the slow pairs' token offsets and their squares
      I.rope_j[(size_t)F * 2 * kBlock + j] = (float)rope_block_offset(j);
      I.rope_j[(size_t)F * 2 * kBlock + kBlock + j] = (float)(rope_block_offset(j) * rope_block_offset(j));
    }
  }
  I.layers.resize(cfg.n_layers);
  for (int l = 0; l < cfg.n_layers; ++l) {
    for (int side = 0; side < 2; ++side) {
      auto& vec = side == 0 ? I.layers[l].k : I.layers[l].v;
      vec.resize(cfg.n_kv_heads);
      for (int h = 0; h < cfg.n_kv_heads; ++h) {
        auto& s = vec[h];
        const KvType t = types[(size_t)l * cfg.n_kv_heads + h][side];
        s.fmt = &format(t);
        s.dim = D;
        const Format& f = *s.fmt;
        s.row_bytes = f.row_bytes(D);
        s.block_bytes = f.block_bytes(D);
        s.domain = f.rotated ? Domain::rot : Domain::orig;
        s.side = side;
        s.window = cfg.window;
        // Sliding-window layers hold about a window of blocks: chunks of one block each, so
        // that dropping is exact to the block.
        if (!cfg.layer_window.empty() && cfg.layer_window[l] > 0) s.blocks_per_chunk = 1;
        const KvPart& p0 = f.parts[0];
        const size_t part_norms = f.log8_norms() ? kN8HeaderBytes : kBlock * 2;  // one part's per block
        if (f.turboquant()) {  // tq, tq_n8: one part over D; tq_split: selected channels, then the rest
          s.norms_bytes = f.n_parts * part_norms;
          if (f.n_parts == 1) {
            s.cb = &get_codebook(D, p0.bits);
          } else {
            s.d_hi = D * p0.quarters / 4;
            s.d_lo = D - s.d_hi;
            s.cb_hi = &get_codebook(s.d_hi, p0.bits);
            s.cb = &get_codebook(s.d_lo, f.parts[1].bits);
            s.tiles_hi_bytes = tiles_bytes(s.d_hi, p0.bits);
            s.domain = Domain::orig;  // until the channels are chosen
          }
          TQ_ASSERT(s.block_bytes == s.norms_bytes + s.tiles_hi_bytes + tiles_bytes(D - s.d_hi, s.cb->bits));
        }
        s.rope_mu = side == 0 && cfg.center_k && cfg.center_rope && f.quantized();
        if (s.rope_mu) {
          s.pos0 = cfg.sink;
          s.rope_freq = rope_freq;
          s.rope_cos = I.rope_cos.data();
          s.rope_sin = I.rope_sin.data();
          s.rope_nbs = rope_nbs;
          s.rope_j = I.rope_j.data();
          s.turns = &I.turns;
        }
        if (cfg.trellis && f.turboquant()) {
          // Parts of 1-4 bits (at 5+ bits the table trains to codes no better than Lloyd-Max).
          if (s.cb->bits <= 4) s.tc = &get_trellis(D - s.d_hi, s.cb->bits);
          if (s.cb_hi && s.cb_hi->bits <= 4) s.tc_hi = &get_trellis(s.d_hi, s.cb_hi->bits);
        }
        s.kscale = side == 0 && cfg.scale_k && f.turboquant();
        s.reset_stats();
        if (cfg.window > 0) s.ring = make_aligned<uint16_t>((size_t)cfg.window * D);
        s.sink = cfg.sink;
        if (cfg.sink > 0) s.sink_rows = make_aligned<uint16_t>((size_t)cfg.sink * D);
        // Centring buys nothing for the float formats: only quantized streams are centred.
        s.center = (side == 0 ? cfg.center_k : cfg.center_v) && f.quantized();
        if (s.center) {
          s.stat_sum.assign(D, 0.0);
          s.stat_x0.assign(D, 0.f);
          s.mu_segment = cfg.center_segment;
          if (s.mu_segment > 0) s.seg_sum.assign(D, 0.0);
        }
      }
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
      for (auto& s : *vec) {
        s.n_quant = 0;
        s.drop_all();
        if (s.center) {
          s.mu_frozen = false;
          s.n_mu = 0;
          if (s.mu_segment > 0) s.seg_sum.assign(s.dim, 0.0);
          s.stat_sum.assign(s.dim, 0.0);
          s.stat_n = 0;
        }
        if (s.fmt->layout == KvLayout::tq_split) {
          s.split_frozen = false;
          s.domain = Domain::orig;
        }
        if (s.kscale) {
          s.kscale_frozen = false;
          s.kw.clear();
        }
        s.reset_stats();
      }
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
  for (int h = 0; h < H; ++h) {
    Stream& s = L.k[h];
    if (!s.wants_queries()) continue;
    TQ_CHECK(q, "kv cache observe_queries: null q");
    for (int r = 0; r < n_tokens; ++r) {
      if (L.n_tokens + r == 0) continue;  // BOS, as for the keys
      for (int g = 0; g < group; ++g) {
        const float* qr = q + ((size_t)r * n_heads + (size_t)h * group + g) * D;
        for (int d = 0; d < D; ++d) s.q_energy[d] += (double)qr[d] * qr[d];
      }
      ++s.q_n;
    }
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
  // The rows the centring sums take: as given, or turned back to position 0 (rope_mu), once.
  const bool centre_stats = s.center && (s.stats_open() || !s.mu_frozen);
  std::vector<float> unrot;
  if (centre_stats && s.rope_mu) {
    unrot.resize((size_t)n_tokens * D);
    for (int r = 0; r < n_tokens; ++r)
      unrope_row(s, L.n_tokens + r, xh + (size_t)r * stride, &unrot[(size_t)r * D]);
  }
  auto centre_row = [&](int r) {
    return s.rope_mu ? &unrot[(size_t)r * D] : xh + (size_t)r * stride;
  };
  if (s.stats_open())
    for (int r = 0; r < n_tokens; ++r) {
      if (L.n_tokens + r == 0) continue;  // BOS: see freeze_split
      const float* xr = xh + (size_t)r * stride;
      for (int d = 0; d < D; ++d) s.chan_energy[d] += (double)xr[d] * xr[d];
      if (s.center) {
        const float* cr = centre_row(r);
        for (int d = 0; d < D; ++d) s.chan_sum[d] += cr[d];
      }
      ++s.chan_n;
    }
  if (s.center && !s.mu_frozen)
    for (int r = 0; r < n_tokens; ++r) {
      const float* xr = centre_row(r);
      const int pos = L.n_tokens + r;
      for (int d = 0; d < D; ++d) s.stat_sum[d] += xr[d];
      if (pos == 0) std::memcpy(s.stat_x0.data(), xr, sizeof(float) * D);
      ++s.stat_n;
    }
  // Sinks: the first S positions stay in f16 for good.
  const int S = cfg.sink;
  const int r0 = std::clamp(S - L.n_tokens, 0, n_tokens);
  for (int r = 0; r < r0; ++r)
    f32_to_f16(D, xh + (size_t)r * stride, s.sink_rows.get() + (size_t)(L.n_tokens + r) * D);
  if (r0 == n_tokens) return;
  if (W == 0) {
    I.encode_rows(s, n_tokens - r0, xh + (size_t)r0 * stride, stride);
    return;
  }
  std::vector<float> tmp((size_t)D);
  for (int r = r0; r < n_tokens; ++r) {
    const int t = L.n_tokens + r - S;  // position of the new token after the sinks
    uint16_t* slot = s.ring.get() + (size_t)(t % W) * D;
    if (t >= W) {  // token t - W (after the sinks) leaves the window: quantize it
      f16_to_f32(D, slot, tmp.data());
      I.encode_rows(s, 1, tmp.data(), (size_t)D);
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
  if (!I.rope_freq.empty()) I.turns.cover(I.rope_freq, cfg.sink, L.n_tokens, std::min(n_tokens, kRopeTurnsMax));
  std::exception_ptr err;
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads) if (parallel)
  for (int job = 0; job < 2 * H; ++job) {
    try {
      append_stream(I, L, job / H, job % H, n_tokens, k, v);
    } catch (...) {
#pragma omp critical(tq_kv_append_error)
      if (!err) err = std::current_exception();
    }
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
        if (s.fmt->layout == KvLayout::tq_split) total += (size_t)(s.dim + 7) / 8;  // channel mask
        if (s.center) total += (size_t)s.n_mu * s.dim * 2;                    // fp16 means
        total += s.kw.size();                                                 // fp16 K scale per pair
      }
  return total;
}

}  // namespace tq
