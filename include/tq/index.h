// tq::Index: a nearest-neighbour index whose database is TurboQuant codes, scored directly on
// the codes (no decoding), persisted in a checksummed versioned file. Flat (exhaustive scan)
// by default; IVF (IndexConfig::nlist > 0: coarse k-means lists of residual codes, nprobe
// lists scanned per query) as an option, see docs/design.md "IVF".
//
// Encoding (codec mse, the default): for each vector x (normalised first for cosine),
//   y = Pi x / ||x||   (Pi: seeded rotation, randomized Hadamard by default)
//   idx_j = nearest Lloyd-Max centroid of y_j (codebook for (dim, bits)),  c = cent[idx]
//   scale = ||x|| / ||c||          (ScaleMode::corrected, "norm correction", default)
//         | ||x||                  (plain: the paper's stored norm)
//         | ||x|| / <y, c>         (eden: EDEN's unbiased scale)
//         | ||x|| <y, c> / ||c||^2 (lsq: least-squares optimal scale)
//   <q, x> ~= scale * <Pi q, c>;   l2: ||q - x||^2 ~= ||q||^2 + ||x||^2 - 2 <q, x>.
// Fractional widths b + 0.5 split the rotated channels: the first ceil(d/2) channels get
// b + 1 bits, the rest b bits (two independent codebooks; see docs/design.md).
// Codec prod stores TurboQuant_prod codes (tq::Quantizer, kind prod) for comparison and is
// scored with Quantizer::score (no fast scan).
//
// Search: the query is rotated once; per-query lookup tables (LUT) over groups of code bits
// (4 bits per group: one 4-bit channel, two 2-bit channels or four 1-bit channels; a 3-bit
// channel uses a 16-entry table with 8 live entries) are quantized to uint8 and scanned
// with SIMD byte shuffles over blocks of 32 vectors ("fast scan"); the best `rerank`
// candidates are then re-scored with the exact float LUT (still from codes), or, for an IVF
// index with a second-stage code (rerank_bits), with the first code refined by the second;
// optionally followed by an exact re-rank with full vectors when they are kept (keep_vectors).
// Widths above 4 bits per channel use float LUTs (no fast scan); trellis codes their own
// uint8 scan (256-entry tables, trellis_scan_u8).
//
// Scores returned: inner product (ip), cosine similarity (cosine) — higher is nearer — or
// squared L2 distance (l2) — lower is nearer. Missing results (k > size) get id -1.
// Errors (bad config, wrong dimension, NaN/Inf input, corrupt file): tq::Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tq/codebook.h"
#include "tq/quantizer.h"
#include "tq/rotation.h"

namespace tq {

enum class Metric : uint8_t { ip = 0, l2 = 1, cosine = 2 };
Metric parse_metric(const std::string& s);  // "ip" | "l2" | "cosine"
const char* metric_name(Metric m) noexcept;

enum class ScaleMode : uint8_t { plain = 0, corrected = 1, eden = 2, lsq = 3 };
ScaleMode parse_scale_mode(const std::string& s);  // "plain" | "corrected" | "eden" | "lsq"
const char* scale_mode_name(ScaleMode m) noexcept;

struct IndexConfig {
  int dim = 0;
  Metric metric = Metric::cosine;
  double bits = 4;                      // 1..8, or a half-integer in 1.5..7.5
  QuantizerKind codec = QuantizerKind::mse;  // mse or prod
  ScaleMode scale = ScaleMode::corrected;    // mse only
  NormFormat norm = NormFormat::f16;    // storage of the per-vector scale and norm
  RotationSpec rotation{};              // default randomized Hadamard
  uint64_t seed = 0x5eed;
  Law law = Law::beta;
  bool keep_vectors = false;            // also keep the float vectors (for rerank_full)
  // Per-vector grid fit (encode time only, no extra bytes): quantize t * y for the 9 grid
  // scales t = 0.80, 0.85, ..., 1.20 and keep the codes whose centroid vector has the best
  // cosine with y (the idea of extended RaBitQ's per-vector rescaling, applied to the
  // Lloyd-Max codebook). About 9x the quantization work at build time.
  bool fit_scale = false;
  // Subtract the mean of the first added batch (after normalisation for cosine) before
  // quantizing, as RaBitQ does with its centroid: the codes then spend their precision on
  // x - mean. Scores add <q, mean> back (ip/cosine); l2 is translation invariant.
  // Costs dim floats per index, nothing per vector.
  bool center = false;
  // Trellis-coded channels (codec mse, integer bits 1..4, flat index; docs/design.md
  // "Trellis codes in the index"): the same bits per channel, but the codes of a vector are
  // chosen together by a Viterbi search (tq/trellis.h, the KV cache's trellis) and channel j
  // reconstructs to a 256-entry table value indexed by the last 8 bits of the code stream up
  // to code j: about 0.68x the scalar code's squared error at 4 bits. Memory holds that index,
  // one byte per channel, in blocks of 64 vectors (the file the packed codes); search scans
  // them with uint8 tables of 256 entries per channel (trellis_scan_u8) and re-ranks the
  // shortlist with the float tables, as the fast scan does. Files are written as version 5.
  bool trellis = false;
  // IVF (inverted file): nlist > 0 clusters the first added batch with a seeded k-means
  // (kmeans_iters Lloyd iterations on at most 256 * nlist sampled vectors, BLAS GEMM
  // assignments; deterministic for a seed, whatever the thread count), stores each vector in the
  // list of its nearest centroid and quantizes its residual x - c (after normalisation for
  // cosine); search scans the nprobe lists whose centroids are nearest to the query.
  // Not with codec prod or center (the list centroid replaces the global mean).
  int nlist = 0;
  int kmeans_iters = 10;
  // Residual reference: false: the k-means centroid; true: the mean of the vectors of the
  // first batch actually assigned to the list (measured in docs/design.md).
  bool ivf_list_mean = false;
  // IVF second stage (docs/design.md "Second-stage re-rank code"): rerank_bits > 0 also
  // stores, per vector, a second code of the same residual at rerank_bits bits per channel
  // (1..8; by default a refinement of the first code, see rerank_refine) with its own scale
  // (the index's scale mode). It is read only for the shortlist: the `rerank` best fast-scan candidates are re-scored with it instead
  // of with the float LUT of the first code. 0: none. IVF (nlist > 0) only.
  int rerank_bits = 0;
  // Second stage as a refinement of the first code (docs/design.md "Refining second stage"):
  // instead of an independent code, each channel's rerank_bits bits split the Lloyd-Max cell
  // of its first-stage index into 2^rerank_bits equal parts (the outer cells closed at twice
  // their inner half-width beyond the centroid); the re-rank decodes first and second code together,
  // so 4 + 4 bits rank like a 256-level code at the bytes of a 4-bit one. Same record size as
  // the independent code ([scale][packed bits]); written as file version 4. false: the
  // independent code of earlier builds (file version 3, which still loads); it ranked worse at
  // equal bytes on every set measured, so the CLI no longer builds it; kept for the tests of
  // the version-3 search path.
  bool rerank_refine = true;
};

struct SearchParams {
  int k = 10;
  int n_threads = 0;    // 0: OpenMP default
  bool fast_scan = true;  // uint8-LUT SIMD scan where the width allows; false: float LUTs
  int rerank = -1;      // fast-scan candidates re-scored with exact float LUTs, or with the
                        // second-stage code when the index has one (IndexConfig::rerank_bits);
                        // -1: auto (k + 16); 0: return the scan scores
  int rerank_full = 0;  // candidates re-scored with the kept float vectors (0: off)
  int nprobe = 1;       // IVF: lists scanned per query, 1..nlist (a flat index: 1, other values an error)
  // Two-level scan (docs/design.md "Two-level scan"): a first pass over the sign of each
  // channel's code (1 bit per dimension) estimates every score with an error bound, and only
  // vectors whose bound reaches the current k-th best are scored with their full code (exact
  // float LUTs; the re-rank stage then has nothing to add, a second-stage code still re-ranks).
  // -1: auto, on where the index keeps the sign plane (fast-scan indexes of dim >= 320, IVF >= 192,
  // with 3 to 4 bits per channel, unless release_sign_plane() freed it; p.fast_scan); 0: off; 1: on
  // (an error where the index has no sign plane, and in search_candidates).
  int two_level = -1;
};

class Index {
 public:
  explicit Index(const IndexConfig& cfg);
  ~Index();
  Index(Index&&) noexcept;
  Index& operator=(Index&&) noexcept;

  const IndexConfig& config() const noexcept;
  int dim() const noexcept;
  size_t size() const noexcept;

  // x: n * dim floats (row-major), finite. ids: n int64 (nullptr: next_id(), next_id() + 1, ...).
  void add(size_t n, const float* x, const int64_t* ids = nullptr);
  // The same, reporting its progress: progress(stage, done, total) on the calling thread, done
  // rising to total within each stage: "k-means" (an IVF index's first add: rows assigned over
  // all Lloyd iterations), "assign" (IVF: vectors given their list), "encode" (vectors coded,
  // ending with done == total before the add commits). An exception thrown by progress cancels
  // the add: the work left is skipped, the index stays as it was (no vectors, fits or lists
  // from this add) and the exception is rethrown. So a caller can stop a long build (Python:
  // Ctrl-C) without losing the index.
  using AddProgress = std::function<void(const char* stage, size_t done, size_t total)>;
  void add(size_t n, const float* x, const int64_t* ids, const AddProgress& progress);
  // The first id add() gives when it is passed no ids: one past the largest id held, 0 for an
  // empty index (size() while no ids were passed and none removed).
  int64_t next_id() const;
  // Removes every vector whose id is one of ids[0..n) (ids absent from the index are skipped,
  // repeats count once) and returns how many vectors went. The others keep their codes, ids
  // and order, so the index then searches, saves and loads exactly as one that was given only
  // those vectors with what it had fitted (center, IVF centroids, which stay). O(size()) per
  // call: batch the ids. Not concurrent with search() or add().
  size_t remove_ids(size_t n, const int64_t* ids);
  // Frees the sign plane of the two-level scan where the index keeps one (fast-scan widths of 3
  // or 4 bits, dim >= 320, IVF >= 192) and returns its codes to the fast layout: it then searches in one
  // level only (SearchParams::two_level 1 is an error there), at the single-level scan's full
  // speed, in less memory (d = 784, 4 bits: 106 B a vector less). For an index that never
  // searches in two levels, as a ShardedIndex shard (search_candidates). Adds, removes and saves
  // work as before and write the same file; a loaded index holds a plane again. A no-op where
  // there is none. Not concurrent with search() or add().
  void release_sign_plane();
  // Whether the index holds the sign plane (and searches in two levels by default).
  bool has_sign_plane() const noexcept;
  // The ids held, size() of them, in slot order: a flat index's insertion order (the slots
  // search_candidates returns index it), an IVF index's list by list.
  std::vector<int64_t> ids() const;
  // Fits what the first add() would fit from its batch (center: the mean of the rows of x,
  // normalised for cosine, bit for bit the same) without adding them, so that several
  // indexes can share one fit (set_center). Nothing to fit (center off) is a no-op.
  // Errors: a non-empty index, a fit already made, IVF (its k-means runs in the first add()).
  void train(size_t n, const float* x);
  // The fitted center (dim floats; empty before the fit or without the center option).
  const std::vector<float>& center() const noexcept;
  // Sets the center of an empty index built with the center option (dim finite floats),
  // e.g. another index's center(): the shards of a ShardedIndex all encode with one center.
  void set_center(const float* mean);

  // q: nq * dim finite floats. scores, ids: nq * k each (row per query, best first).
  void search(size_t nq, const float* q, const SearchParams& p, float* scores,
              int64_t* ids) const;

  // Sharded search (docs/design.md "Sharding"; flat indexes only). A search keeps the best
  // r = candidates_per_query(p) vectors by its scan score, re-ranks them (float LUTs, then
  // kept vectors when p.rerank_full > 0) and returns the best k. search_candidates returns,
  // per query and best first by scan score, those r candidates with their score at every
  // stage (internal scores, higher is better; a stage that does not run repeats the previous
  // one), the score search() would report for each were it returned, its id and its slot
  // (insertion position). Indexes that share their parameters (seed, center) and whose slots
  // interleave into one insertion order merge into exactly search()'s result on one index
  // holding every vector: best r by (scan, position), of those the best max(k, rerank_full)
  // by (rerank, position), of those the best k by (full, position). Missing rows: id and
  // slot -1, stage scores -inf. Each array has nq * r entries.
  size_t candidates_per_query(const SearchParams& p) const;
  void search_candidates(size_t nq, const float* q, const SearchParams& p, float* scan,
                         float* rerank, float* full, float* scores, int64_t* ids,
                         int64_t* slots) const;
  // The same, checking that the queries have query_dim == dim() components.
  void search(size_t nq, size_t query_dim, const float* q, const SearchParams& p, float* scores,
              int64_t* ids) const;

  // Bytes per vector as stored in the file: codes + scale (+ norm for l2), without the id.
  size_t code_bytes() const noexcept;
  // Bytes of the file save() writes (header, centroids, records, ids, kept vectors).
  uint64_t file_bytes() const;
  // Bytes held in memory per vector (fast-scan layout, floats, id, kept vectors; IVF: list
  // padding and centroid tables spread over the vectors).
  double memory_bytes_per_vector() const noexcept;
  // IVF: lists (0 for a flat index) and the number of vectors in list l.
  int nlist() const noexcept;
  size_t list_size(int l) const;
  // Human-readable description, e.g. "mse 4 bits hadamard corrected f16 cosine".
  std::string describe() const;
  // The description of a search with p: "fast-scan" only when p uses the uint8 SIMD scan
  // (the layout allows it and p.fast_scan), "trellis-scan" for trellis codes with p.fast_scan
  // (trellis_scan_u8), "float-lut" otherwise; IVF adds "nprobe N".
  std::string describe_search(const SearchParams& p) const;

  // Persistence (see docs/design.md "File format"): atomic save; load validates
  // every field and the xxHash checksum before building anything, then every stored float
  // (finite; scales and norms, and the norms of centroids, center and kept vectors, <= 2^64):
  // tq::Error naming the field otherwise.
  void save(const std::string& path) const;
  static Index load(const std::string& path);
  static Index from_bytes(const uint8_t* data, size_t size, const std::string& name);

  struct Impl;
  const Impl& impl() const noexcept { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Exact (brute force, float) search for ground truth and tests; same score conventions.
void exact_search(Metric metric, size_t n, int dim, const float* x, size_t nq, const float* q,
                  int k, float* scores, int64_t* ids, int n_threads = 0);

// Fast-scan kernels over blocks of 32 vectors (exposed for tests and benchmarks).
// codes: n_blocks * m_groups * 16 bytes (layout in docs/design.md); lut: m_groups *
// 16 uint8; out: n_blocks * 32 exact integer sums. m_groups is a multiple of 4.
void fast_scan_u8(size_t n_blocks, size_t m_groups, const uint8_t* codes, const uint8_t* lut,
                  uint32_t* out) noexcept;
void fast_scan_u8_ref(size_t n_blocks, size_t m_groups, const uint8_t* codes, const uint8_t* lut,
                      uint32_t* out) noexcept;
// The same sums for nq lookup tables over the same codes: outs[i] (n_blocks * 32) gets
// luts[i]'s, equal to fast_scan_u8's; the codes are read once for every 4 tables (every 2 on
// x86 targets without AVX-512, whose 16 vector registers cannot hold 4 tables' sums).
void fast_scan_u8_multi(size_t n_blocks, size_t m_groups, const uint8_t* codes, size_t nq,
                        const uint8_t* const* luts, uint32_t* const* outs) noexcept;
void fast_scan_u8_multi_ref(size_t n_blocks, size_t m_groups, const uint8_t* codes, size_t nq,
                            const uint8_t* const* luts, uint32_t* const* outs) noexcept;

// The fast layout (codes above) of n_blocks blocks of 32 vectors of nibbles: vector v of block
// b at vec + (b * 32 + v) * m_groups / 2, group g in nibble g % 2 (low for even g) of its byte
// g / 2. fast: n_blocks * m_groups * 16 bytes. m_groups is a multiple of 4.
void vector_to_fast_layout(size_t n_blocks, size_t m_groups, const uint8_t* vec, uint8_t* fast) noexcept;
void vector_to_fast_layout_ref(size_t n_blocks, size_t m_groups, const uint8_t* vec, uint8_t* fast) noexcept;
// n 3-bit indices packed as pack_bits packs them (in: packed_bytes(n, 3) bytes, none read past)
// as n nibbles (index t in nibble t % 2 of out[t / 2]; out: (n + 1) / 2 bytes, a last odd
// nibble's partner 0). SIMD (16 indices a 64-bit lane), else the reference, index by index.
void bits3_to_nibbles(size_t n, const uint8_t* in, uint8_t* out) noexcept;
void bits3_to_nibbles_ref(size_t n, const uint8_t* in, uint8_t* out) noexcept;
// The dot product of y with a vector's centroids, in 16 partial sums: lanes[g % 16] +=
// y[g] * cent[code g] for g in [g0, g1), each lane in increasing g; code g is index g - g0 of
// the bits-bit codes at codes, packed as pack_bits packs them (bits 3 or 4 on the SIMD path;
// cent: 16 floats, entries past the codebook's never read; no byte past the codes is read).
// SIMD with 16 float lanes (AVX-512) for 3-bit codes and for 4-bit codes whose channels from
// the first multiple of 16 start on a whole byte, else the reference; the same floats either way.
// reduce_lanes16: their sum, lanes i and i + w added for w = 8, 4, 2, 1 (the same order).
void code_dot_lanes(size_t g0, size_t g1, int bits, const float* y, const uint8_t* codes, const float* cent,
                    float* lanes) noexcept;
void code_dot_lanes_ref(size_t g0, size_t g1, int bits, const float* y, const uint8_t* codes, const float* cent,
                        float* lanes) noexcept;
float reduce_lanes16(const float* lanes) noexcept;
// What an index derives from its codes over one block of 32 slots in the fast layout (fb: rows
// of 16 bytes, slot v's group code in the low nibble of byte v of a row for v < 16, else the
// high nibble of byte v - 16): for each digit in order, slot v's channel index
// c = (code >> sh) & mask of row `row` adds tabs[16 (3 tab) + c] (its squared centroid) to cc[v],
// tabs[16 (3 tab + 1) + c] (|centroid|) to ca[v], rc[j] * tabs[16 (3 tab + 2) + c] (rc[j] times
// the centroid) to ct[v], and rc[j] or -rc[j] (as bit `top` of c, its sign, is 1 or 0) to cu[v];
// the signs make the plane cb (rows of 16 bytes, channel j's bit j % 4 of row j / 4's nibble
// of slot v as above), each row written when its last channel (j % 4 == 3 or j == d - 1) is
// done. cb null: no plane (cc, ca, cu and the signs untouched, digits in any channel order);
// rc null: no ct, cu. SIMD with 16 or 8 float lanes (AVX-512, AVX2), else the reference; the same floats.
struct PlaneDigit {
  uint32_t row = 0, j = 0;
  uint8_t sh = 0, mask = 15, top = 3, tab = 0;
};
void derive_block(const uint8_t* fb, size_t nd, const PlaneDigit* dg, const float* tabs, const float* rc,
                  size_t d, float* cc, float* ca, float* ct, float* cu, uint8_t* cb) noexcept;
void derive_block_ref(const uint8_t* fb, size_t nd, const PlaneDigit* dg, const float* tabs, const float* rc,
                      size_t d, float* cc, float* ca, float* ct, float* cu, uint8_t* cb) noexcept;

// Trellis scan over blocks of 64 vectors (an index with trellis codes): codes: n_blocks * d * 64
// bytes, for channel j the 64 vectors' table indices (windows); lut: d * 256 uint8; out:
// n_blocks * 64 exact sums of lut[j * 256 + window]. SIMD on x86 (byte permutes with AVX-512
// VBMI, 16-entry byte shuffles on AVX-512, AVX2 and SSE4), else the reference.
void trellis_scan_u8(size_t n_blocks, size_t d, const uint8_t* codes, const uint8_t* lut, uint32_t* out) noexcept;
void trellis_scan_u8_ref(size_t n_blocks, size_t d, const uint8_t* codes, const uint8_t* lut,
                         uint32_t* out) noexcept;

// The uint8 lookup tables of a query from its float ones: m tables of st entries,
// q8[g st + c] = round((lut[g st + c] - mins[g]) * inv) to nearest, ties to even, clamped to
// [0, 255], NaN to 0 (tq::lut_u8, src/search/index_internal.h). SIMD, the reference's bytes.
void lut_to_u8(size_t m, size_t st, const float* lut, const float* mins, float inv, uint8_t* q8) noexcept;
void lut_to_u8_ref(size_t m, size_t st, const float* lut, const float* mins, float inv, uint8_t* q8) noexcept;

// The first i < n with v[i] >= thr (NaN never is), n when there is none: the coarse step's
// skip over lists below the bar of the nprobe best. SIMD, the reference's answer.
size_t first_at_least(const float* v, size_t n, float thr) noexcept;
size_t first_at_least_ref(const float* v, size_t n, float thr) noexcept;

// Bit r (r < n <= 32) set when v[r] + off >= thr (the sum rounded to float; NaN never is): a
// block's scores at or above the worst kept one, the scan's candidates. SIMD, the reference's bits.
uint32_t mask_at_least(const float* v, size_t n, float off, float thr) noexcept;
uint32_t mask_at_least_ref(const float* v, size_t n, float off, float thr) noexcept;

// Scores of n fast-scan sums (n a multiple of 32 for the SIMD path): dot = bias + step * acc,
// out = scale * dot (norm == nullptr) or 2 scale dot - norm^2 (l2); block_max[b] = the best
// of out[32 b .. 32 b + 31]. Float results may differ from the reference by FMA rounding.
void fast_scan_scores(size_t n, const uint32_t* acc, const float* scale, const float* norm,
                      float bias, float step, float* out, float* block_max) noexcept;
void fast_scan_scores_ref(size_t n, const uint32_t* acc, const float* scale, const float* norm,
                          float bias, float step, float* out, float* block_max) noexcept;

}  // namespace tq
