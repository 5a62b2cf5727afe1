// Internals of tq::Index shared by index.cpp (build, search) and io.cpp (persistence).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "tq/bitpack.h"
#include "tq/codebook.h"
#include "tq/index.h"
#include "tq/quantizer.h"
#include "tq/rotation.h"
#include "tq/trellis.h"

namespace tq {

// A run of rotated channels [begin, begin + len) quantized with `bits` bits each. voff: the
// byte offset of its packed codes in a record's codes (the segments' packed bytes in order, as
// the file holds them and the vector layout's rows).
struct Segment {
  int begin = 0, len = 0, bits = 0;
  const Codebook* cb = nullptr;
  size_t voff = 0;
};

// The bits-bit code (bits <= 8) at bit `bit` of p, in include/tq/bitpack.h's order; only the
// one or two bytes holding it are read.
inline unsigned read_code(const uint8_t* p, size_t bit, int bits) noexcept {
  const unsigned sh = static_cast<unsigned>(bit & 7);
  unsigned v = p[bit >> 3];
  if (sh + static_cast<unsigned>(bits) > 8) v |= static_cast<unsigned>(p[(bit >> 3) + 1]) << 8;
  return (v >> sh) & ((1u << bits) - 1);
}

// Channels [dim0, dim0 + ndims) of one segment, bpd bits each, read as one group code
// code = sum_t idx[dim0 + t] << (t * bpd); one lookup table per group.
struct Group {
  int dim0 = 0, ndims = 0, bpd = 0;
  int gbits() const noexcept { return ndims * bpd; }
};

// A uint8 LUT entry from its scaled value x: std::nearbyint(x) (to nearest, ties to even)
// clamped to [0, 255], NaN to 0 (a LUT of a query against extreme finite centroids or scales
// of a loaded file can hold inf or NaN), without the library call and without branches: x is
// clamped first (rounding is monotone, 0 and 255 are integers), then within [0, 255] adding
// and subtracting 1.5 * 2^23 rounds exactly so (this code is built without fast-math).
inline uint8_t lut_u8(float x) noexcept {
  const float c = std::min(255.f, std::max(0.f, x));  // max(0, NaN) is 0
  return static_cast<uint8_t>((c + 12582912.f) - 12582912.f);
}

constexpr size_t kBlock = 32;         // vectors per fast-scan block
constexpr uint32_t kFileVersion = 1;     // io.cpp: flat index files
constexpr uint32_t kFileVersionIvf = 2;  // io.cpp: IVF index files
constexpr uint32_t kFileVersionIvfRerank = 3;  // io.cpp: IVF index files with an independent second-stage code
constexpr uint32_t kFileVersionIvfRefine = 4;  // io.cpp: IVF index files with a refining second-stage code
constexpr uint32_t kFileVersionTrellis = 5;    // io.cpp: flat index files of trellis codes

// While any is alive, OpenBLAS runs single-threaded (for GEMMs that each OpenMP thread calls
// on its own tile); the setting the first one found is restored when the last one ends. The
// count is process-wide (kmeans.cpp), so concurrent searches leave the setting as they found it.
class BlasSingleThread {
 public:
  BlasSingleThread();
  ~BlasSingleThread();
  BlasSingleThread(const BlasSingleThread&) = delete;
  BlasSingleThread& operator=(const BlasSingleThread&) = delete;
};

// IVF fast-scan order (index.cpp): per query (each query scans its probed lists, best
// first) or list-major (a chunk of queries is inverted to list -> queries and each probed
// list is scanned once for all the queries of the chunk probing it). Both return the same
// results; `automatic` picks by batch size. Tests and benchmarks force one with this
// process-wide override (default automatic).
enum class IvfScanOrder : int { automatic = 0, per_query = 1, list_major = 2 };
void set_ivf_scan_order(IvfScanOrder o) noexcept;
IvfScanOrder ivf_scan_order() noexcept;

// Two-level search (index.cpp, docs/design.md "Two-level scan"): a vector is re-scored
// with its full code when its sign-plane estimate plus eps * its error bound reaches the
// shortlist's bar. kTwoLevelEps is the default eps; tests raise it (every vector re-scored: the
// float-LUT search's result) with this process-wide override (<= 0: the default).
constexpr float kTwoLevelEps = 1.9f;
// Fast-scan indexes of at least this dimension (flat; IVF: kTwoLevelMinDimIvf) with at least
// this many bits per channel (every segment) keep the sign plane (memory) and search in two
// levels by default (SearchParams::two_level -1). At 2 bits the plane would add half the codes'
// memory for a smaller gain (two channels a table lookup already); below these dimensions the
// two-level scan was slower or level (docs/design.md; bench/results/two_level/gate_vl.sh
// measures against a build with the dimensions lowered to 2).
constexpr int kTwoLevelMinDim = 320;
constexpr int kTwoLevelMinDimIvf = 192;
constexpr int kTwoLevelMinBits = 3;
void set_two_level_eps(float eps) noexcept;
float two_level_eps() noexcept;

// IVF coarse quantizer (kmeans.cpp). nearest_centroids: out[i] = argmin_j ||x_i - c_j||^2
// (ties: lowest j) for x: n * dim, c: k * dim, cn2: k squared norms; best_out (optional):
// 2 <x_i, c> - ||c||^2 of the winner. kmeans: k centroids (k * dim floats) of the rows of x
// (n >= k) after `iters` Lloyd iterations on a seeded sample of at most 256 k rows.
// on_rows (optional): called on the calling thread as rows are done, with the count so far
// (nearest_centroids: rows assigned, up to n; kmeans: rows assigned over all iterations, up to
// iters * sample size, the total passed as its second argument). It returns false to stop:
// the rows left are skipped and nearest_centroids returns false (out incomplete), kmeans an
// empty vector. It must not throw (it runs inside an OpenMP region).
bool nearest_centroids(size_t n, int dim, const float* x, int k, const float* c, const float* cn2,
                       uint32_t* out, float* best_out, const std::function<bool(size_t)>& on_rows = {});
std::vector<float> kmeans(size_t n, int dim, const float* x, int k, int iters, uint64_t seed,
                          const std::function<bool(size_t, size_t)>& on_rows = {});

struct Index::Impl {
  IndexConfig cfg;
  int d = 0;
  int bits_x2 = 0;
  std::unique_ptr<Rotation> rot;
  std::vector<Segment> segs;
  std::vector<Group> groups;
  size_t m = 0;        // groups
  size_t mp = 0;       // groups padded to a multiple of 4 (fast layout)
  bool fast_ok = false;  // every group has <= 4 bits
  size_t lut_stride = 16;  // float LUT entries per group
  size_t norm_bytes = 2;   // 2 (f16) or 4 (f32)
  bool has_norm = false;   // l2: ||x|| kept per vector
  size_t seg_bytes = 0;    // packed code bytes of all segments
  size_t code_bytes = 0;   // persisted bytes per vector

  size_t n = 0;
  std::vector<uint8_t> blocks;  // fast or vector layout: ceil(n / 32) * block_bytes()
  std::vector<uint8_t> gcodes;  // other widths: n * m bytes
  std::vector<float> scale;     // n (padded with zeros to whole blocks): multiplies <Pi q, c>
  std::vector<float> norm;      // n (padded likewise): ||x|| (l2 only)
  std::vector<int64_t> ids;     // n
  std::vector<float> vectors;   // n * d when keep_vectors (normalised for cosine)
  std::vector<float> center;    // d floats once the first batch is added (cfg.center), else empty
  // IVF (cfg.nlist > 0). Storage slots are grouped by list: list l holds slots
  // [list_begin[l], list_begin[l] + list_size[l]), list_begin[l] a multiple of 32 (whole
  // fast-scan blocks); the padding slots up to list_begin[l + 1] have scale 0 and id -1.
  // A flat index has slots == n.
  size_t slots = 0;
  std::vector<float> centroids;   // nlist * d (cosine: in the space of unit vectors); empty until trained
  std::vector<float> rcentroids;  // nlist * d: the rotated centroids Pi c (l2 LUTs)
  std::vector<float> cnorm2;      // nlist: ||c||^2
  std::vector<size_t> list_begin;  // nlist + 1
  std::vector<size_t> list_size;   // nlist
  bool ivf() const noexcept { return cfg.nlist > 0; }
  // List of slot s (IVF).
  size_t list_of(size_t s) const noexcept;
  // IVF second-stage code (cfg.rerank_bits > 0): per slot rbytes packed rerank_bits-bit
  // channel indices (bitpack.h order) of the rotated unit residual, codebook rcb, and its
  // scale (rscale, padded like scale). Empty otherwise.
  const Codebook* rcb = nullptr;
  size_t rbytes = 0;             // packed bytes per slot
  std::vector<uint8_t> rcodes;   // slots * rbytes
  std::vector<float> rscale;     // slots (padded to whole blocks)
  // Refining second stage (cfg.rerank_refine): per segment, the reconstruction of (first
  // index c, refinement index k) at rtab[seg][(c << rerank_bits) | k], in codebook units.
  std::vector<std::vector<float>> rtab;
  std::vector<std::vector<float>> rlo, rwid;  // per segment: each first-stage cell's low end and width
  // Refinement index of value z (codebook units) in the cell of first index c of segment sg.
  uint8_t refine_index(size_t sg, uint8_t c, float z) const noexcept;
  // Trellis codes (cfg.trellis): the cached code for (d, bits); gcodes then holds, per slot
  // and channel, the channel's table index (window) rather than a group code.
  const TrellisCode* tc = nullptr;
  // gcodes layout of trellis codes: blocks of 64 slots, within a block channel by channel
  // (64 bytes: the slots' table indices), the layout trellis_scan_u8 reads.
  static constexpr size_t kTrellisBlock = 64;
  uint8_t* trellis_row(size_t i) noexcept {
    return gcodes.data() + (i / kTrellisBlock) * m * kTrellisBlock + i % kTrellisBlock;
  }
  const uint8_t* trellis_row(size_t i) const noexcept {
    return gcodes.data() + (i / kTrellisBlock) * m * kTrellisBlock + i % kTrellisBlock;
  }
  // Slots per storage block: scale and norm are padded to whole blocks.
  size_t pad_block() const noexcept { return tc ? kTrellisBlock : kBlock; }
  // Sign plane of the two-level scan (coarse): a fast-layout index (flat or IVF) whose segments
  // all have >= 3 bits and whose dim is >= kTwoLevelMinDim (IVF: kTwoLevelMinDimIvf) keeps, per
  // slot, the top bit of each channel's index (the sign of its centroid: Lloyd-Max codebooks are
  // symmetric and sorted) in the fast layout, four channels a group (cm groups, padded to cmp, a
  // multiple of 4), and two factors of its code c (codebook units): the estimate of the internal score from
  // S = sum_j (Pi q)_j sign_j is cA * S (l2: 2 cA S - norm^2, as the fast-scan scorer forms it),
  // cA = scale ||c||^2 / sum_j |c_j|, and eps ||Pi q|| cB bounds its error (RaBitQ's bound for a
  // 1-bit code of c: cB = (l2 ? 2 : 1) scale ||c|| sqrt(1 - a^2) / (a sqrt(d - 1)),
  // a = sum |c_j| / (||c|| sqrt d)). Derived from the stored codes (derive): not in the file.
  // IVF: one set of sign tables per query, of Pi q, serves every list. The estimate is formed
  // for the list query Pi (q - c_l) (c_l the slot's list centroid), whose norm bounds the error
  // (l2 scores Pi (q - c_l); ip and cosine score scale <Pi q, c> = scale <Pi c_l, c> +
  // scale <Pi (q - c_l), c>, and ||q - c_l|| is well below ||q|| when the lists fit the data):
  // with u = <Pi c_l, sign(c)>, sum_j (Pi (q - c_l))_j sign_j = S - u, so the scan's cA S (l2:
  // 2 cA S - norm^2) plus the list term cL = (ip, cosine: scale <Pi c_l, c>) - (l2 ? 2 : 1) cA u
  // is the estimate.
  bool coarse_ok = false;
  // The vector layout, held exactly while the index keeps a sign plane: blocks holds slot i's
  // channel indices together at vrow(i), each segment packed at its width from its voff (3 or 4
  // bits a channel: one channel a group; the bytes of its file record's codes), so the second
  // pass of the two-level scan reads a kept vector's codes from seg_bytes contiguous bytes
  // instead of one byte in each of mp 16-byte rows of its block (196 cache lines at d = 784),
  // and 3-bit channels take 3 bits (the fast layout gives each a nibble). The uint8 scans of the
  // full codes (single-level search) read it widened to nibbles and transposed block by block
  // (fast_blocks).
  bool vl() const noexcept { return coarse_ok; }
  // The float-LUT score sums channel g into partial sum g % 16 (as the vector layout's
  // exact_code_score does) where the configuration keeps a sign plane, released or not
  // (Index::release_sign_plane), so a released index scores exactly as one that keeps it.
  bool lanes16 = false;
  std::vector<std::array<float, 16>> cent16;  // lanes16: each segment's centroids, padded with zeros to 16
  size_t cm = 0, cmp = 0;
  std::vector<uint8_t> cblocks;  // ceil(slots / 32) * cmp * 16 bytes
  std::vector<float> cA, cB, cL;  // slots, padded with zeros to whole blocks (cL: IVF only)
  // IVF with l2, fast layout: the scan scores 2 scale <Pi (q - c_l), c> - ||x - c_l||^2 as
  // 2 scale <Pi q, c> - ||x - c_l||^2 + l2term, l2term = -2 scale <Pi c_l, c> (c_l the slot's
  // list centroid), so one set of uint8 tables per query, of Pi q, serves every list (otherwise
  // each probed list needs its own tables of Pi (q - c_l)). Empty otherwise.
  std::vector<float> l2term;  // slots, padded with zeros to whole blocks
  bool has_l2term() const noexcept { return ivf() && fast_ok && cfg.metric == Metric::l2; }
  // Everything derived from the stored codes, scales and norms (after add, remove and load), in
  // one block-wise pass over the fast layout: the sign plane and factors of slots [from, slots)
  // where the index keeps one, and the l2 list terms (IVF adds pass from = 0: they move slots).
  void derive(size_t from);
  // codec prod
  std::unique_ptr<Quantizer> quant;
  std::vector<uint8_t> pcodes;  // n * quant->code_bytes()

  explicit Impl(const IndexConfig& c);

  // Fast layout (!vl): group g of slot i is nibble fast_shift(i) (low for the block's first 16
  // slots, high for the rest) of byte fast_row(i)[g * 16].
  const uint8_t* fast_row(size_t i) const noexcept { return blocks.data() + (i / kBlock) * mp * 16 + (i % 16); }
  static int fast_shift(size_t i) noexcept { return (i % kBlock) < 16 ? 0 : 4; }
  // Vector layout (vl): slot i's seg_bytes bytes of codes.
  size_t vbytes() const noexcept { return seg_bytes; }
  const uint8_t* vrow(size_t i) const noexcept { return blocks.data() + i * vbytes(); }
  uint8_t* vrow(size_t i) noexcept { return blocks.data() + i * vbytes(); }
  // Bytes of a block of 32 slots in blocks (fast or vector layout).
  size_t block_bytes() const noexcept { return vl() ? kBlock * vbytes() : mp * 16; }
  // Vector layout: the bit of vector g's row where channel (group) g's code starts, and its width.
  std::pair<size_t, int> vl_bit(size_t g) const noexcept {
    const Segment& s = segs[segs.size() > 1 && g >= static_cast<size_t>(segs[1].begin) ? 1 : 0];
    return {s.voff * 8 + (g - static_cast<size_t>(s.begin)) * static_cast<size_t>(s.bits), s.bits};
  }
  // Prefetch slot i's codes (fast layout: one 64-byte line per 4 groups; vector layout: its
  // bytes' lines); nothing in the other layouts.
  void prefetch_codes(size_t i) const noexcept {
    if (vl()) {
      const uintptr_t a = reinterpret_cast<uintptr_t>(vrow(i)), e = a + vbytes();
      for (uintptr_t p = a & ~uintptr_t{63}; p < e; p += 64) __builtin_prefetch(reinterpret_cast<const void*>(p));
      return;
    }
    if (!fast_ok) return;
    const uint8_t* p = fast_row(i);
    for (size_t g = 0; g < m; g += 4) __builtin_prefetch(p + g * 16);
  }
  uint8_t group_code(size_t i, size_t g) const noexcept {
    if (vl()) {
      const auto [bit, bits] = vl_bit(g);
      return static_cast<uint8_t>(read_code(vrow(i), bit, bits));
    }
    if (fast_ok) return static_cast<uint8_t>((fast_row(i)[g * 16] >> fast_shift(i)) & 15);
    return gcodes[i * m + g];
  }
  // Fast layout or gcodes (the vector layout's rows are written whole: set_indices, write_block).
  void set_group_code(size_t i, size_t g, uint8_t c) noexcept {
    if (fast_ok) {
      uint8_t& b = blocks[(i / kBlock) * mp * 16 + g * 16 + (i % 16)];
      if ((i % kBlock) < 16) b = static_cast<uint8_t>((b & 0xF0) | (c & 15));
      else b = static_cast<uint8_t>((b & 0x0F) | (c << 4));
    } else {
      gcodes[i * m + g] = c;
    }
  }
  // Per-channel indices of vector i (d bytes) <-> group codes.
  void get_indices(size_t i, uint8_t* idx) const noexcept;
  void set_indices(size_t i, const uint8_t* idx) noexcept;
  // The code of group g of a vector whose per-channel indices are idx (d bytes).
  uint8_t pack_group(const uint8_t* idx, size_t g) const noexcept {
    const Group& gr = groups[g];
    unsigned c = 0;
    for (int t = 0; t < gr.ndims; ++t) c |= static_cast<unsigned>(idx[gr.dim0 + t]) << (t * gr.bpd);
    return static_cast<uint8_t>(c);
  }
  // Fast or vector layout: writes the whole block of slots [b0, b0 + 32) (b0 a multiple of 32)
  // from their group codes (fast layout: row by row), slot b0 + v's m codes at gc + v * m
  // (zeros for empty slots).
  void write_block(size_t b0, const uint8_t* gc) noexcept {
    if (vl()) {  // slot by slot (a group code is its channel's index: m == d)
      for (size_t v = 0; v < kBlock; ++v) set_indices(b0 + v, gc + v * m);
      return;
    }
    uint8_t* blk = blocks.data() + (b0 / kBlock) * mp * 16;
    for (size_t g = 0; g < m; ++g)
      for (size_t j = 0; j < 16; ++j) blk[g * 16 + j] = static_cast<uint8_t>(gc[j * m + g] | (gc[(j + 16) * m + g] << 4));
  }
  // The fast layout of storage blocks [b, b + nb) for the uint8 scan of the full codes: the
  // storage itself, or (vector layout) those blocks' rows widened to nibbles (nibble_row) and
  // transposed into scratch (resized to fit).
  const uint8_t* fast_blocks(size_t b, size_t nb, std::vector<uint8_t>& scratch) const;
  // Vector layout: slot i's channel indices as nibbles (mp / 2 bytes, channel g in nibble g % 2
  // of byte g / 2, the padding nibbles zero), the rows vector_to_fast_layout reads. A 4-bit
  // index's rows already are, when mp / 2 == seg_bytes (nibble_rows).
  void nibble_row(size_t i, uint8_t* out) const noexcept;
  bool nibble_rows() const noexcept { return segs.size() == 1 && segs[0].bits == 4 && vbytes() == mp / 2; }
  // Grow storage to n_new slots (zero-filled).
  void resize(size_t n_new);
  // IVF: set the centroids (nlist * d) and derived tables.
  void set_centroids(std::vector<float> c);
  // IVF: move every slot s of the first `old_slots` (list layout) and of the staged slots
  // [old_slots, old_slots + n_new) (list of staged slot j: assign[j]) into a fresh list layout.
  void relayout(size_t old_slots, size_t n_new, const uint32_t* assign);
  // New storage of src.size() slots, slot t holding the record (codes, scale, norm, second
  // stage, id, kept vector) of old slot src[t], or empty padding (id -1) for SIZE_MAX.
  void rebuild(const std::vector<size_t>& src);
  // Rounds through the persisted norm format (so a loaded index scores identically).
  float round_norm(float v) const noexcept;
};

// Whether a search with p runs in two levels (index.cpp; search_candidates never does).
bool two_level_search(const Index::Impl& I, const SearchParams& p) noexcept;

// Best-R selection over vector indices in one total order: higher score first, then the
// lower index. The kept set is the best R of everything pushed whatever the order of the
// pushes (a push equal in score to the worst kept one enters when its index is lower), so
// the IVF scan may visit a query's lists in any order and return the same candidates.
struct TopR {
  size_t cap = 0;
  std::vector<std::pair<float, uint32_t>> h;  // min-heap on score
  float threshold = -std::numeric_limits<float>::infinity();
  uint32_t threshold_id = 0;  // index of the worst kept entry once full
  void reset(size_t c) {
    cap = c;
    h.clear();
    threshold = -std::numeric_limits<float>::infinity();
    threshold_id = 0;
  }
  struct Better {
    bool operator()(const std::pair<float, uint32_t>& a, const std::pair<float, uint32_t>& b) const noexcept {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    }
  };
  static constexpr Better cmp{};
  void push(float s, uint32_t i) {
    if (h.size() < cap) {
      h.emplace_back(s, i);
      std::push_heap(h.begin(), h.end(), cmp);
      if (h.size() == cap) {
        threshold = h.front().first;
        threshold_id = h.front().second;
      }
    } else if (s > threshold || (s == threshold && i < threshold_id)) {
      replace_top(s, i);
      threshold = h.front().first;
      threshold_id = h.front().second;
    }
  }
  // A block of n <= 32 scan scores sc[r] + off of slots first + r, whose best sc is block_max:
  // every one pushed while the shortlist fills, then only those at or above the threshold,
  // found by one SIMD compare (mask_at_least) and each checked against the threshold it has
  // risen to. off = -0.f adds nothing (x + -0 is x, -0 included).
  void offer_block(const float* sc, size_t n, float off, float block_max, uint32_t first) {
    if (h.size() < cap) {
      for (size_t r = 0; r < n; ++r) push(sc[r] + off, first + static_cast<uint32_t>(r));
      return;
    }
    if (block_max + off < threshold) return;
    for (uint32_t mask = mask_at_least(sc, n, off, threshold); mask != 0; mask &= mask - 1) {
      const uint32_t r = static_cast<uint32_t>(__builtin_ctz(mask));
      const float v = sc[r] + off;
      if (v >= threshold) push(v, first + r);
    }
  }
  // The worst kept entry (the root) replaced by (s, i), which ranks above it, and sifted down:
  // one pass instead of pop_heap's and push_heap's two.
  void replace_top(float s, uint32_t i) {
    const std::pair<float, uint32_t> x{s, i};
    const size_t n = h.size();
    size_t at = 0;
    for (;;) {
      size_t c = 2 * at + 1;
      if (c >= n) break;
      if (c + 1 < n && cmp(h[c], h[c + 1])) ++c;  // the worse child
      if (!cmp(x, h[c])) break;                  // x is no better than it: x stays here
      h[at] = h[c];
      at = c;
    }
    h[at] = x;
  }
  // Sorted best first.
  std::vector<std::pair<float, uint32_t>> sorted() const {
    auto v = h;
    std::sort(v.begin(), v.end(), cmp);
    return v;
  }
};

// Sum of squares of x[0..d) with 8 independent float partial sums (vectorizes; no serial
// dependency), added in double: a NaN or Inf component, or a partial sum past FLT_MAX (a norm
// past 2^64), makes it non-finite. A sum below 2^-100 (squares that may have underflowed in
// float) is computed again in double.
double sqnorm(int d, const float* x);

// The largest norm of a vector an index takes (add, train, set_center, search queries): 2^62.
// A search adds and multiplies values of the order of two norms (||q||^2 + ||x||^2 - 2<q, x>
// for l2, <q, x> and the lookup tables for ip), which stay below FLT_MAX only when both are
// well below sqrt(FLT_MAX) = 2^64; past it a score is inf or NaN and the ranking garbage.
// The smallest nonzero norm is 2^-100: a unit vector x / ||x|| (cosine, and the direction
// every vector is coded by) multiplies by 1 / ||x||, which overflows float near 2^-127.
constexpr double kMaxInputNorm = 0x1p62;
constexpr double kMinInputNorm = 0x1p-100;
// Throws unless every component of the n rows of x is finite and every row's norm is 0 or in
// [kMinInputNorm, kMaxInputNorm]. what: the caller, e.g. "index add".
void check_rows(size_t n, int d, const float* x, const char* what);

}  // namespace tq
