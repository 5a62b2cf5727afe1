// Internals of the quantized KV cache (src/kv). Not a public header.
//
// Storage: per (layer, kv head, side K|V) one Stream; tokens that have left the f16 window
// live in blocks of kBlock = 32 tokens, one contiguous byte range each, laid out per format as
// docs/design.md "Storage layout" says (ggml blocks, bit-plane tiles, norm headers).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
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
// RoPE-rotating K mean: the largest angle (radians) a slow pair turns from its block's centre
// (w_i * 15.5) for it to keep a mean (Centre::drop_unturnable). Gemma 3 270M, ctx 512, 4
// windows, KLD of auto / tq3 / tq4: no limit 0.0184 / 0.0964 / 0.0229, 2 rad the same, 1 rad
// 0.0179 / 0.0825 / 0.0204, 0.5 rad 0.0201 / 0.0931 / 0.0217 (docs/design.md).
constexpr double kRopeTurnMax = 1.0;
constexpr int kRopeSeedBlocks = 16;  // its block tables: one (cos, sin) seed per 16 blocks (Centre::rope_seed)
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
// [int16 e][32 uint8 codes], norm = 2^((e - n8_offset(c)) / 32) (c = 255: zero); e and the
// re-coding when a larger norm arrives: docs/design.md "tqBn8".

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

// cos / sin of the RoPE-rotating mean's angles for the positions of one append: every K
// stream of the layers sharing a set of frequencies (RopeTables) appends the same positions and
// turns the same angles, so KvCache::append computes them once per position range and set (not
// once per stream and layer: 90 streams for the default model) and the streams look them up. Entries are the doubles Centre::unrope_row /
// mean_at would compute in place; a position outside the range is computed in place.
struct RopeTurns {
  int P = 0;                   // pairs
  int p0 = 0, n = 0;           // positions [p0, p0 + n)
  int pos0 = -1;               // the streams' position of index 0 the centres are for
  std::vector<double> fwd;     // [(p - p0) * P + i] as (cos, sin) of p * freq[i]
  std::vector<double> back;    // the same for -p * freq[i] (Centre::unrope_row)
  double c0 = 0;               // first block centre held (mean_at's slow pairs)
  int nc = 0;                  // centres c0, c0 + 32, ...
  std::vector<double> centre;  // [k * P + i] as (cos, sin) of (c0 + 32 k) * freq[i]
  // Fills the table for positions [p0, p0 + n) and the block centres of stream indices
  // p - pos0 (a stream's position of index 0); keeps it when it already holds them.
  void cover(const std::vector<double>& freq, int pos0, int p0, int n);
  // (cos, sin) pairs for angle p * freq[i] (inverse: -p * freq[i]), i < P, or nullptr when p is not held.
  const double* at(int p, bool inverse = false) const noexcept {
    return p >= p0 && p - p0 < n ? &(inverse ? back : fwd)[(size_t)(p - p0) * P * 2] : nullptr;
  }
  const double* at_centre(double c) const noexcept {
    const double k = (c - c0) / kBlock;
    if (!(k >= 0 && k < nc) || k != (double)(int)k) return nullptr;
    return &centre[(size_t)k * P * 2];
  }
};

// The pair frequencies w_i of one set of layers and the kernels' tables of their RoPE-rotating
// K mean (Centre::rope_seed ...; build_rope_tables).
struct RopeTables {
  std::vector<double> freq;               // w_i, rope_dim / 2 of them
  std::vector<double> seed, lane;
  std::vector<float> j;
  RopeTurns turns;                        // the angles at the positions of the current append
};

struct Stream;

// Rows appended to a stream, as its preconditioners observe them before they freeze.
struct Rows {
  int pos = 0, n = 0;              // layer positions [pos, pos + n)
  const float* x = nullptr;        // original domain, `stride` floats apart
  size_t stride = 0;
  const float* unroped = nullptr;  // RoPE-rotating K mean: the rows turned back to position 0 (D apart)
};

// A preconditioner: a transform of a stream's rows between the original domain and what its
// format codes, chosen online from the rows (and queries) seen until the stream's first
// quantized token and frozen then (freeze, in the order of Stream::chain()). Off (on = false):
// every method is the identity. On the write path each one's forward runs in chain order;
// queries of a K stream go through each one's query (q.k unchanged) and rows read back through
// each one's inverse in reverse order. The stream's format rotation comes after all of them.
struct Precond {
  bool on = false;
  bool frozen = false;
  virtual ~Precond() = default;
  bool open() const noexcept { return on && !frozen; }
  virtual void configure(const Stream& s, const KvCacheConfig& cfg, const KvCache::Impl& I) = 0;
  virtual void reset(int dim) = 0;  // construction and KvCache::clear(): nothing chosen or seen
  virtual bool wants_queries() const noexcept { return false; }
  virtual void observe(const Rows&, int /*dim*/) {}
  // Queries of tokens [pos, pos + n) of the KV head's group (group rows D apart, tokens `stride` apart).
  virtual void observe_queries(int /*pos*/, int /*n*/, const float* /*q*/, size_t /*stride*/, int /*group*/,
                               int /*dim*/) {}
  virtual void freeze(const Stream& s) = 0;
  // Rows of stream indices [j0, j0 + n) (D apart) to store, in place (may update what is kept
  // while writing, e.g. the next segment's mean).
  virtual void forward(int /*j0*/, int /*n*/, float* /*x*/, int /*dim*/) {}
  // The inverse of forward. j0 < 0: the rows are not tokens but sums of weighted rows (attention
  // states): a per-token term (a mean) is left to the caller.
  virtual void inverse(int /*j0*/, int /*n*/, float* /*x*/, int /*dim*/) const {}
  virtual void query(int /*n*/, float* /*q*/, int /*dim*/) const {}  // queries of a K stream
  virtual size_t bytes(int /*dim*/) const noexcept { return 0; }   // kept per stream (bytes_used)
};

// Mean centring (KvCacheConfig::center_k / center_v; quantized streams): the blocks hold codes of
// x - mu. Statistics of every token seen before freezing (sum over all positions, and the
// position-0 row to exclude it).
struct Centre final : Precond {
  std::vector<float> mu;            // n_mu x D values (fp16-exact): one mean per segment
  int n_mu = 0;
  int segment = 0;                  // tokens per segment (0: one mean)
  std::vector<double> seg_sum;      // sum of the current segment's (uncentred) rows
  std::vector<double> stat_sum;     // sum of x per channel over tokens seen
  std::vector<float> stat_x0;       // the row at position 0
  int stat_n = 0;                   // tokens seen (position 0 included)
  const float* mu_of(int j) const noexcept {  // mean of quantized token j (stream index)
    return mu.data() + (size_t)(segment > 0 ? j / segment : 0) * dim_;
  }
  // RoPE-rotating mean (KvCacheConfig::center_rope, K): mu holds pre-RoPE means (mu_of(j) for
  // token j); token j at cache position p = pos0 + j has the mean R(p) mu_of(j), where pair i
  // turns by p * rope_freq[i] for the kRopeExactPairs fastest pairs; the slower ones turn by
  // pc * rope_freq[i] (pc: the centre of j's 32-token block) and then on by x = (p - pc) *
  // rope_freq[i] to second order in x, so that the attention kernels add the mean's logit
  // from per-block terms and two per-token tables (mean_at is the one definition). A slow pair
  // with |x| up to more than kRopeTurnMax keeps a zero mean (drop_unturnable).
  bool rope = false;
  int pos0 = 0;                     // cache position of stream index 0 (the sink count)
  std::vector<double> rope_freq;    // rope_dim / 2 = P angles per position
  // Pair i's angle above at block b's first token (fast pairs) or centre (slow pairs) is
  // a_i(b) = a_i(s) + 32 k w_i with s = b - k a multiple of kRopeSeedBlocks. Seeds: cos, sin of
  // a_i(s) at rope_seed[((s / kRopeSeedBlocks) P + i) 2 + {0, 1}]; turns: cos(32 k w_i) at
  // rope_lane[i 4 kRopeSeedBlocks + k] and sin(32 k w_i) at [.. + 2 kRopeSeedBlocks + k], k < 32.
  // So the kernels take cos / sin of a_i(b) for a vector of blocks from one seed and one turn
  // (rope_block_terms), reading P seeds per 16 blocks, not a full-size table from memory.
  // Doubles, rounded to float after the turn: the floats of cos / sin of a_i(b) themselves
  // (bar a value within ~1e-12 of a rounding boundary), as the full-size float tables were.
  const double* rope_seed = nullptr;
  const double* rope_lane = nullptr;
  // Fast pair i < F: [cos(j w_i), j < 32][sin(j w_i), j < 32]; then at F: the slow pairs'
  // offsets from the block centre [j - 15.5, j < 32][(j - 15.5)^2, j < 32].
  const float* rope_j = nullptr;
  const RopeTurns* turns = nullptr;  // the cache's angle table for the current append (or null)
  // The mean of quantized token j in the original domain: mu_of(j), rotated for rope.
  void mean_at(int j, float* out) const noexcept;
  // Un-rotates a row of position pos: R(pos)^-1 x (the pre-RoPE key the means are taken of).
  void unrope_row(int pos, const float* x, float* y) const;
  void drop_unturnable(float* m) const;

  void configure(const Stream& s, const KvCacheConfig& cfg, const KvCache::Impl& I) override;
  void reset(int dim) override;
  void observe(const Rows& r, int dim) override;
  void freeze(const Stream& s) override;
  void forward(int j0, int n, float* x, int dim) override;
  void inverse(int j0, int n, float* x, int dim) const override;
  size_t bytes(int dim) const noexcept override { return on ? (size_t)n_mu * dim * 2 : 0; }

 private:
  int dim_ = 0;
};

// Channel statistics of the query-weighted preconditioners (KScale, Channels), over the tokens
// seen before freezing, position 0 left out: K energy per channel, the sum of the rows the
// centring takes (to centre the energy at freeze), and the query energy of the KV head's group.
struct QueryWeighted : Precond {
  std::vector<double> energy, sum, q_energy;
  int n = 0, q_n = 0;
  void reset(int dim) override;
  bool wants_queries() const noexcept override { return open(); }
  void observe(const Rows& r, int dim) override;
  void observe_queries(int pos, int n, const float* q, size_t stride, int group, int dim) override;
  // energy about the stream's frozen K mean (Centre::freeze ran first): sum (x - mu)^2.
  void centre_energy(const Stream& s);
};

// Query-weighted K scaling (KvCacheConfig::scale_k; K streams of the tq kinds): the blocks
// hold codes of w * (x - mu), w one weight per RoPE pair frozen with the first quantized
// token; queries are divided by w, so q.k is unchanged and only the quantization error moves.
struct KScale final : QueryWeighted {
  std::vector<float> w;  // D fp16-exact weights, equal within each pair (D / 2 stored);
                         // empty: identity (none chosen yet, or no queries seen)
  void configure(const Stream& s, const KvCacheConfig& cfg, const KvCache::Impl& I) override;
  void reset(int dim) override;
  void freeze(const Stream& s) override;
  void forward(int j0, int n, float* x, int dim) override;
  void inverse(int j0, int n, float* x, int dim) const override;
  void query(int n, float* q, int dim) const override;
  size_t bytes(int) const noexcept override { return w.size(); }
};

// Channel selection of the split layouts (tqBhH): the rows are permuted so that the d_hi
// selected channels come first (ascending), then the rest; the format codes the two parts apart.
struct Channels final : QueryWeighted {
  int d_hi = 0;
  std::vector<int> perm;  // D entries once frozen
  void configure(const Stream& s, const KvCacheConfig& cfg, const KvCache::Impl& I) override;
  void reset(int dim) override;
  void freeze(const Stream& s) override;
  void forward(int j0, int n, float* x, int dim) override;
  void inverse(int j0, int n, float* x, int dim) const override;
  void query(int n, float* q, int dim) const override;
  size_t bytes(int dim) const noexcept override { return on ? (size_t)(dim + 7) / 8 : 0; }  // channel mask
};

// One (layer, kv head, side) of the cache: storage (blocks, f16 window ring, f16 sinks) and the
// preconditioners its rows pass through before the format's rotation and codes.
struct Stream {
  const Format* fmt = nullptr;
  int dim = 0;
  size_t row_bytes = 0;    // exact bytes per token (norms/scales included; tq_n8: + 2 B per block)
  size_t block_bytes = 0;  // kBlock * row_bytes (tq_n8: + 2)
  int side = 0;            // 0: K (K tile layout), 1: V (V tile layout)
  int layer = 0;
  int n_quant = 0;         // tokens in blocks
  // Blocks live in chunks of blocks_per_chunk; a sliding-window layer (KvCacheConfig::
  // layer_window) drops its oldest blocks: chunks wholly before block n_dropped / kBlock are
  // null, their buffers kept in `spare` for the next chunks.
  std::vector<AlignedPtr<uint8_t>> chunks;
  std::vector<AlignedPtr<uint8_t>> spare;
  int blocks_per_chunk = kBlocksPerChunk;
  int n_dropped = 0;       // quantized tokens dropped (whole blocks from the first)
  // The format's rotation (rotated formats): one over D, or (tq_split) one over the first d_hi
  // dims of the permuted row and one over the rest.
  const Rotation* rot = nullptr;
  const Rotation* rot_hi = nullptr;
  const Rotation* rot_lo = nullptr;
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
  // f16 window (original domain): ring of `window` rows; token at absolute position t >= sink
  // sits in slot (t - sink) % window
  int window = 0;
  AlignedPtr<uint16_t> ring;
  // f16 sinks (original domain): the first `sink` tokens, rows 0..sink-1, never quantized.
  // Absolute positions: [0, sink) sinks, [sink, sink + n_quant) blocks, then the window.
  int sink = 0;
  AlignedPtr<uint16_t> sink_rows;

  Centre centre;
  KScale kscale;
  Channels channels;
  std::array<Precond*, 3> chain() noexcept { return {&centre, &kscale, &channels}; }
  std::array<const Precond*, 3> chain() const noexcept { return {&centre, &kscale, &channels}; }

  Stream() = default;
  Stream(const Format& f, int side, int layer, bool sliding, const KvCacheConfig& cfg, const KvCache::Impl& I);
  void clear();
  bool split() const noexcept { return fmt->layout == KvLayout::tq_split; }
  bool wants_queries() const noexcept {
    for (const Precond* p : chain())
      if (p->wants_queries()) return true;
    return false;
  }
  // The format's rotation (or its inverse) of n rows (D apart): x -> y (may be equal).
  void rotate(int n, const float* x, float* y, bool inverse = false) const;
  // Original -> stored domain of n queries (K): the preconditioners' query(), then the rotation.
  void query_to_domain(int n, const float* q, float* y) const;
  // Stored domain -> original of n rows in place: the rotation undone, then the preconditioners'
  // inverse in reverse order (j0: Precond::inverse).
  void to_orig(int j0, int n, float* x) const;
  // Tokens [t0, t0 + n) of the quantized part decoded into floats in the stored domain.
  void decode_domain(int t0, int n, float* out) const;
  void encode_rows(int n, const float* x, size_t stride);  // into blocks

  uint8_t* block(int b) noexcept {
    return chunks[b / blocks_per_chunk].get() + (size_t)(b % blocks_per_chunk) * block_bytes;
  }
  const uint8_t* block(int b) const noexcept {
    return chunks[b / blocks_per_chunk].get() + (size_t)(b % blocks_per_chunk) * block_bytes;
  }
  // Drops the blocks wholly before stream index j (sliding window), keeping their buffers.
  void drop_before(int j);
};

// The pair frequencies and the kernels' tables of the RoPE-rotating K mean, per distinct set of
// layer frequencies (precond.cpp).
void build_rope_tables(KvCache::Impl& I);

// Rows of head_dim values as the cache works on them: x itself, or (KvCache::Impl::neox_to_pairs)
// a copy in buf with neox pairs (i, i + rope_dim / 2) moved to (2i, 2i + 1).
const float* in_pair_order(const KvCache::Impl& I, const float* x, size_t rows, std::vector<float>& buf);

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
  // The RoPE-rotating K mean's tables: one per distinct set of layer frequencies (Gemma 3: the
  // windowed and the global layers), rope[layer_rope[l]] for layer l; empty without center_rope.
  std::vector<kv::RopeTables> rope;
  std::vector<int> layer_rope;
  // rope_neox with center_rope or scale_k: K rows and queries enter in (2i, 2i + 1) pair order.
  bool neox_to_pairs = false;
};
}  // namespace tq

namespace tq::kv {
// Codes of one token into bit-plane tiles: codes[D].
void set_tile_codes_k(uint8_t* tiles, int dim, int bits, int tok, const uint8_t* codes) noexcept;
void set_tile_codes_v(uint8_t* tiles, int dim, int bits, int tok, const uint8_t* codes) noexcept;
inline size_t tiles_bytes(int dim, int bits) { return (size_t)kBlock * dim * bits / 8; }
constexpr size_t kN8HeaderBytes = 2 + kBlock;  // tq_n8 block header: int16 exponent + 32 codes
// Norm of token `slot` of a tq / tq_split (part 0 or 1) / tq_n8 block.
float tq_block_norm(const Stream& s, const uint8_t* blk, int part, int slot) noexcept;
}  // namespace tq::kv
