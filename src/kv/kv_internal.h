// Internals of the quantized KV cache (src/kv). Not a public header.
//
// Storage: per (layer, kv head, side K|V) one Stream. Tokens that have left the f16 window
// live in blocks of kBlock = 32 tokens; each block is one contiguous byte range whose
// layout depends on the format (see docs/design.md "Layouts"):
//
//   f32    32 rows x D floats, row-major                              (32 bits / value)
//   f16    V: 32 rows x D binary16, row-major; K: dim-major (D x 32 tokens) so that one
//          vector load gives one dim of 16 tokens (scores without horizontal sums) (16 bits)
//   q8_0   32 rows x D/32 BlockQ8_0 {fp16 d; int8 qs[32]}             (8.5 bits / value)
//   q4_0   32 rows x D/32 BlockQ4_0 {fp16 d; uint8 qs[16]}            (4.5 bits / value)
//          q4_0: value j in low nibble of qs[j], value j+16 in the high nibble (ggml order)
//   q8_0h, q4_0h: same, of the Hadamard-rotated row
//   tqB    [32 fp16 corrected norms] [bit-plane tiles of the B-bit codebook indices]
//   tqBhH  [32 fp16 norms, selected part] [32 fp16 norms, regular part]
//          [tiles of the D/4 selected channels at H bits] [tiles of the 3D/4 others at B bits]
//   tqBn8  [int16 exponent][32 uint8 log norms][bit-plane tiles] (see kN8Steps)
//   tqBhHn8 [n8 header, selected part][n8 header, regular part][tiles as tqBhH] (log8 norms)
//
// Bit-plane tiles (tq types). A tile holds 64 codes as `bits` little-endian 64-bit planes;
// bit (4*i + j) of plane p is bit p of code (lane i, sub j), i < 16, j < 4. Expanding a
// tile's planes into 64 bytes (one AVX-512 register) puts lane i in 32-bit lane i, so
//   K tiles: lane = token, sub = dim    tile (s, k) at s * (D/4) + k   (s: token half, k: dim quad)
//            token 16 s + i, dim 4 k + j: scores 16 tokens per vpdpbusd over 4 dims
//   V tiles: lane = dim, sub = token    tile (e, r) at e * 8 + r       (e: 16-dim group, r: token quad)
//            dim 16 e + i, token 4 r + j: accumulates 16 dims over 4 tokens per vpdpbusd
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "tq/codebook.h"
#include "tq/common.h"
#include "tq/kv_cache.h"
#include "tq/quantizer.h"
#include "tq/rotation.h"
#include "tq/trellis.h"

namespace tq::kv {

constexpr int kBlock = 32;          // tokens per storage block
constexpr int kBlocksPerChunk = 64; // blocks per allocation chunk (2048 tokens)
constexpr int kMaxHeadDim = 1024;
constexpr int kRopeTurnsMax = 1024;  // positions RopeTurns holds (32 B per position and pair)
constexpr int kRopeExactPairs = 8;  // RoPE-rotating K mean: pairs turned per token (the rest per block)
// tq_n8 norm codes (see kN8Steps): offsets below the block exponent in 1/kN8Steps octave
// units, one code per unit for the first kN8FineCodes, then one per kN8CoarseUnits units.
constexpr int kN8Steps = 32;
constexpr int kN8FineCodes = 192;  // 6 octaves at 2^(1/32) (relative step 2.2%)
constexpr int kN8CoarseUnits = 4;  // codes 193..254: 2^(1/8) steps, 7.75 more octaves
constexpr int n8_offset(int c) noexcept {  // code 0..254 -> offset in units
  return c <= kN8FineCodes ? c : kN8FineCodes + kN8CoarseUnits * (c - kN8FineCodes);
}
inline int n8_code(double off) noexcept {  // offset in units (>= 0) -> nearest code, saturating at 254
  if (off <= kN8FineCodes + 0.5 * kN8CoarseUnits)
    return std::min(kN8FineCodes, (int)std::lrint(off));
  const long c = kN8FineCodes + std::lrint((off - kN8FineCodes) / kN8CoarseUnits);
  return c > 254 ? 254 : (int)c;
}

// tq_n8 norm codes (KvLayout::tq_n8, and tq_split with log8 norms): block header
// [int16 e][32 uint8 codes], norm = 2^((e - n8_offset(c)) / 32) (c = 255: zero), e = the
// block's largest norm exponent in 1/32 octaves, rounded up to a multiple of 4. Norms within
// 6 octaves (64x) of the block's largest have relative steps of 2.2%, smaller ones 9% steps
// down to 2^-13.75 of it (below: saturated at code 254; their absolute error is < 1e-4 of the
// block's largest norm). A larger norm arriving in a partly filled block raises e by whole
// coarse steps and re-codes the earlier norms: exact, except once for a norm moving from the
// fine into the coarse range.

// One row of the table of formats (architecture.md point 4): include/tq/kv_cache.h.
using Format = KvTypeTraits;
const Format& format(KvType t);

// ggml block layouts.
struct BlockQ8_0 {
  uint16_t d;      // fp16 scale
  int8_t qs[32];   // values = d * qs
};
static_assert(sizeof(BlockQ8_0) == 34, "q8_0 block is 34 bytes (8.5 bits per value)");
struct BlockQ4_0 {
  uint16_t d;      // fp16 scale
  uint8_t qs[16];  // values = d * (nibble - 8)
};
static_assert(sizeof(BlockQ4_0) == 18, "q4_0 block is 18 bytes (4.5 bits per value)");

// Domain transform of one stream: what the cache stores is T(x); attention rotates Q with
// T_K and applies T_V^{-1} to the output.
enum class Domain : uint8_t { orig, rot, split };

// cos / sin of the RoPE-rotating mean's angles for the positions of one append: every K
// stream of every layer appends the same positions and turns the same angles, so KvCache::append
// computes them once per position range (not once per stream and layer: 90 streams for the
// default model) and the streams look them up. Entries are the doubles unrope_row / mean_at
// would compute in place; a position outside the range is computed in place.
struct RopeTurns {
  int P = 0;                   // pairs
  int p0 = 0, n = 0;           // positions [p0, p0 + n)
  int pos0 = -1;               // the streams' position of index 0 the centres are for
  std::vector<double> fwd;     // [(p - p0) * P + i] as (cos, sin) of p * freq[i]
  std::vector<double> back;    // the same for -p * freq[i] (unrope_row)
  double c0 = 0;               // first block centre held (mean_at's slow pairs)
  int nc = 0;                  // centres c0, c0 + 32, ...
  std::vector<double> centre;  // [k * P + i] as (cos, sin) of (c0 + 32 k) * freq[i]
  // Fills the table for positions [p0, p0 + n) and the block centres of stream indices
  // p - pos0 (a stream's position of index 0); keeps it when it already holds them.
  void cover(const std::vector<double>& freq, int pos0, int p0, int n);
  // (cos, sin) pairs for angle p * freq[i], i < P, or nullptr when p is not held.
  const double* at(int p) const noexcept {
    return p >= p0 && p - p0 < n ? &fwd[(size_t)(p - p0) * P * 2] : nullptr;
  }
  const double* at_back(int p) const noexcept {
    return p >= p0 && p - p0 < n ? &back[(size_t)(p - p0) * P * 2] : nullptr;
  }
  const double* at_centre(double c) const noexcept {
    const double k = (c - c0) / kBlock;
    if (!(k >= 0 && k < nc) || k != (double)(int)k) return nullptr;
    return &centre[(size_t)k * P * 2];
  }
};

struct Stream {
  const Format* fmt = nullptr;
  int dim = 0;
  size_t row_bytes = 0;    // exact bytes per token (norms/scales included; tq_n8: + 2 B per block)
  size_t block_bytes = 0;  // kBlock * row_bytes (tq_n8: + 2)
  Domain domain = Domain::orig;
  int side = 0;            // 0: K (K tile layout), 1: V (V tile layout); every transform and
                           // code path of a stream reads its side from here
  int n_quant = 0;         // tokens in blocks
  // Blocks live in chunks of blocks_per_chunk; a sliding-window layer (KvCacheConfig::
  // layer_window) drops its oldest blocks: chunks wholly before block n_dropped / kBlock are
  // null, their buffers kept in `spare` for the next chunks.
  std::vector<AlignedPtr<uint8_t>> chunks;
  std::vector<AlignedPtr<uint8_t>> spare;
  int blocks_per_chunk = kBlocksPerChunk;
  int n_dropped = 0;       // quantized tokens dropped (whole blocks from the first)
  // tq / tq_split
  const Codebook* cb = nullptr;     // regular (or only) codebook
  const Codebook* cb_hi = nullptr;  // tq_split selected-channel codebook
  // KvCacheConfig::trellis: the trellis code of the regular / outlier part (null: scalar codes)
  const TrellisCode* tc = nullptr;
  const TrellisCode* tc_hi = nullptr;
  bool trellis_coded() const noexcept { return tc || tc_hi; }  // any part stores trellis codes
  int d_hi = 0, d_lo = 0;           // tq_split channel counts
  size_t norms_bytes = 0;           // per block: 32 (tq) or 64 (split) fp16 norms
  size_t tiles_hi_bytes = 0;        // per block (split: the selected channels' tiles)
  // tq_split: channel selection (online, frozen at the first quantized token). The channel
  // statistics below also feed the K scaling (kscale); see stats_open().
  bool split_frozen = false;
  std::vector<double> chan_energy;  // sum of x^2 per channel over tokens seen before freezing
  std::vector<double> chan_sum;     // sum of x per channel, same tokens (centred streams only)
  int chan_n = 0;                   // tokens counted in chan_energy
  std::vector<int> perm;            // D entries: selected channels first (ascending), then the rest
  std::vector<double> q_energy;     // split / kscale: sum of q^2 per channel (the group's query heads)
  int q_n = 0;                      // query rows counted in q_energy
  // Query-weighted K scaling (KvCacheConfig::scale_k; K streams of the tq kinds): the blocks
  // hold codes of w * (x - mu), w one weight per RoPE pair frozen with the first quantized
  // token; queries are divided by w, so q.k is unchanged and only the quantization error moves.
  bool kscale = false;
  bool kscale_frozen = false;
  std::vector<float> kw;            // D fp16-exact weights, equal within each pair (D / 2 stored);
                                    // empty: identity (none chosen yet, or no queries seen)
  // Channel / query statistics still being gathered (split selection or K scaling pending);
  // both weigh by the queries and leave position 0 out.
  bool split() const noexcept { return fmt->layout == KvLayout::tq_split; }
  bool stats_open() const noexcept { return (split() && !split_frozen) || (kscale && !kscale_frozen); }
  bool wants_queries() const noexcept { return stats_open(); }
  // Empty statistics for a stream that gathers them (construction and clear()).
  void reset_stats() {
    if (!stats_open()) return;
    chan_energy.assign(dim, 0.0);
    chan_sum.assign(dim, 0.0);
    chan_n = 0;
    if (wants_queries()) q_energy.assign(dim, 0.0);
    q_n = 0;
  }
  // f16 window (original domain): ring of `window` rows; token at absolute position t >= sink
  // sits in slot (t - sink) % window
  int window = 0;
  AlignedPtr<uint16_t> ring;
  // f16 sinks (original domain): the first `sink` tokens, rows 0..sink-1, never quantized.
  // Absolute positions: [0, sink) sinks, [sink, sink + n_quant) blocks, then the window.
  int sink = 0;
  AlignedPtr<uint16_t> sink_rows;
  // Mean centring (original domain): blocks hold codes of x - mu. Statistics of every token
  // seen before freezing (sum over all positions, and the position-0 row to exclude it).
  bool center = false;
  bool mu_frozen = false;           // segment 0's mean is chosen
  std::vector<float> mu;            // n_mu x D values (fp16-exact): one mean per segment
  int n_mu = 0;
  int mu_segment = 0;               // tokens per segment (0: one mean)
  std::vector<double> seg_sum;      // sum of the current segment's (uncentred) rows
  const float* mu_of(int j) const noexcept {  // mean of quantized token j (stream index)
    return mu.data() + (size_t)(mu_segment > 0 ? j / mu_segment : 0) * dim;
  }
  // RoPE-rotating mean (KvCacheConfig::center_rope): mu holds pre-RoPE means (mu_of(j) for
  // token j); token j at cache position p = pos0 + j has the mean R(p) mu_of(j), where pair i
  // turns by p * rope_freq[i] for the kRopeExactPairs fastest pairs; the slower ones turn by
  // pc * rope_freq[i] (pc: the centre of j's 32-token block) and then on by x = (p - pc) *
  // rope_freq[i] to second order in x, so that the attention kernels add the mean's logit
  // from per-block terms and two per-token tables (mean_at is the one definition).
  bool rope_mu = false;
  int pos0 = 0;                     // cache position of stream index 0 (the sink count)
  std::vector<double> rope_freq;    // rope_dim / 2 = P angles per position
  // Pair-major tables: cos / sin of pair i's angle above at block b's first token (fast pairs)
  // or centre (slow pairs) at [i * rope_nbs + b] (rope_nbs >= blocks + 16, zero padded).
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  int rope_nbs = 0;
  // Fast pair i < F: [cos(j w_i), j < 32][sin(j w_i), j < 32]; then at F: the slow pairs'
  // offsets from the block centre [j - 15.5, j < 32][(j - 15.5)^2, j < 32].
  const float* rope_j = nullptr;
  const RopeTurns* turns = nullptr;  // the cache's angle table for the current append (or null)
  // The mean of quantized token j in the original domain: mu_of(j), rotated for rope_mu.
  void mean_at(int j, float* out) const noexcept;
  std::vector<double> stat_sum;     // sum of x per channel over tokens seen
  std::vector<float> stat_x0;       // the row at position 0
  int stat_n = 0;                   // tokens seen (position 0 included)

  uint8_t* block(int b) noexcept {
    return chunks[b / blocks_per_chunk].get() + (size_t)(b % blocks_per_chunk) * block_bytes;
  }
  const uint8_t* block(int b) const noexcept {
    return chunks[b / blocks_per_chunk].get() + (size_t)(b % blocks_per_chunk) * block_bytes;
  }
  // Drops the blocks wholly before stream index j (sliding window), keeping their buffers.
  void drop_before(int j);
  void drop_all();  // clear(): no blocks held, none dropped (buffers kept)
};

struct Layer {
  int n_tokens = 0;
  std::vector<Stream> k, v;  // per kv head
};

}  // namespace tq::kv

namespace tq {
struct KvCache::Impl {
  KvCacheConfig cfg;
  std::vector<kv::Layer> layers;
  std::unique_ptr<Rotation> rot;        // D-dim randomized Hadamard (rotated formats)
  std::unique_ptr<Rotation> rot_hi;     // split: D/4
  std::unique_ptr<Rotation> rot_lo;     // split: 3D/4
  std::vector<float> rope_cos, rope_sin, rope_j;  // tables of the RoPE-rotating K mean (Stream::rope_cos ...)
  std::vector<double> rope_freq;                  // its pair frequencies (empty: no rotating mean)
  kv::RopeTurns turns;                            // its angles at the positions of the current append
  mutable std::mutex alloc_mu;

  void encode_rows(kv::Stream& s, int n, const float* x, size_t stride);  // into blocks
  // Decode tokens [t0, t0 + n) of the quantized part into floats in the stream's domain.
  void decode_domain(const kv::Stream& s, int t0, int n, float* out) const;
  // Domain -> original (inverse transform, then the K scaling undone) of n rows, in place.
  void to_orig(const kv::Stream& s, int n, float* x) const;
  // Original -> domain (forward transform) of n rows: x -> y. Rows to store are scaled first
  // by encode_rows; queries go through query_to_domain.
  void to_domain(const kv::Stream& s, int n, const float* x, float* y) const;
  // n queries of a K stream into its domain: q / w (K scaling), then the forward transform.
  void query_to_domain(const kv::Stream& s, int n, const float* q, float* y) const;
};
}  // namespace tq

namespace tq::kv {
// Code extraction from bit-plane tiles (reference, one token): codes[D].
void get_tile_codes_k(const uint8_t* tiles, int dim, int bits, int tok, uint8_t* codes) noexcept;
void get_tile_codes_v(const uint8_t* tiles, int dim, int bits, int tok, uint8_t* codes) noexcept;
void set_tile_codes_k(uint8_t* tiles, int dim, int bits, int tok, const uint8_t* codes) noexcept;
void set_tile_codes_v(uint8_t* tiles, int dim, int bits, int tok, const uint8_t* codes) noexcept;
inline size_t tiles_bytes(int dim, int bits) { return (size_t)kBlock * dim * bits / 8; }
constexpr size_t kN8HeaderBytes = 2 + kBlock;  // tq_n8 block header: int16 exponent + 32 codes
// Norm of token `slot` of a tq / tq_split (part 0 or 1) / tq_n8 block.
float tq_block_norm(const Stream& s, const uint8_t* blk, int part, int slot) noexcept;
}  // namespace tq::kv
