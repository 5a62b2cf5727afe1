// Index persistence: one versioned, checksummed, little-endian file, written atomically.
//
// File layout (all integers little-endian):
//   [IndexFileHeader: 128 bytes]  version 1: flat index; version 2: IVF (flags & 8);
//                                 version 3: IVF with an independent second-stage re-rank code
//                                 version 4: IVF with a refining second-stage code (same layout
//                                 as version 3; the second stage's indices refine the first's)
//   [center: dim * 4]             float32 mean, only when flags & 4 and count > 0
//   [ivf: 16 (+ nlist * dim * 4 + nlist * 8 when count > 0)], versions 2 and 3 only:
//     u32 nlist (1..2^20), u32 kmeans_iters (1..1000), u32 trained (count > 0),
//     u32 rerank_bits (version 2: 0; versions 3 and 4: 1..8),
//     float32 centroids nlist * dim, u64 list sizes nlist (summing to count);
//     the records, ids and vectors below are then in list order (list 0 first)
//   [codes: count * code_bytes]   per vector, see record layout below
//   [ids:   count * 8]            int64
//   [vectors: count * dim * 4]    float32, only when flags & 1 (keep_vectors)
//   version 5: flat index of trellis codes (IndexConfig::trellis; the layout of version 1,
//   each record's packed codes being the trellis code stream, bitpack.h order)
// (flags bit 1 records fit_scale, which only changes how later add() calls encode;
// flags bit 2 records center; bit 3 IVF; bit 4 ivf_list_mean, informational like fit_scale)
// Flat indexes are still written as version 1, so files of earlier builds and of this one
// load in both.
// Per-vector record, codec mse: [scale: f16|f32] [norm ||x||: f16|f32, l2 only]
//   [segment codes: bitpack.h stream of the segment's channel indices, one per segment]
//   versions 3 and 4 then: [second-stage scale: f16|f32] [bitpack.h stream of dim rerank_bits-bit indices]
// codec prod: [tq::Quantizer prod code] [norm, l2 only].
// Load checks, in order, before allocating or building anything: size >= 128, magic,
// version, header size, header checksum, every enum/parameter, count <= 2^32 - 1, each
// section's offset and size recomputed from the parameters with overflow checks, total
// size == file size, payload checksum; then every stored float is checked to be finite and
// within the magnitude a search keeps finite (kMaxStored below): the IVF centroids and the
// center row by row (their norms), each record's scale, norm and second-stage scale, and each
// kept vector (its norm). These are checked as they are decoded: a compare per scale or norm,
// a vectorized sum of squares per centroid, center or kept vector (a 1M x 100 file with kept
// vectors loaded in about the time it took before these norm checks); the packed codes and ids
// are not floats and are not checked.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "search/index_internal.h"
#include "tq/bitpack.h"
#include "tq/common.h"
#include "tq/error.h"
#include "tq/fileio.h"
#include "tq/index.h"

namespace tq {

namespace {

constexpr char kMagic[8] = {'T', 'Q', 'I', 'N', 'D', 'E', 'X', '\0'};

// The largest stored magnitude a load accepts: 2^64 = sqrt(FLT_MAX). A search multiplies a
// stored value (a centroid's or the center's norm, a scale, a norm) by a query-side value of
// the same order as a vector norm, so both below 2^64 keep the product, and the lookup tables
// built from it, finite. A file holding a larger but finite centroid made a query's lookup
// table inf - inf = NaN (fuzz seed fuzz/corpus/fuzz_index/regress_nan_lut); such a file is
// rejected at load instead, naming the field. Norms are compared squared, in double.
constexpr double kMaxStored = 18446744073709551616.0;  // 2^64
constexpr double kMaxStoredSq = kMaxStored * kMaxStored;

// The norm in double, for error messages (no overflow for finite floats).
double exact_norm(const float* x, size_t d) {
  double s = 0;
  for (size_t j = 0; j < d; ++j) s += static_cast<double>(x[j]) * x[j];
  return std::sqrt(s);
}

// The header as a documented struct; it is (de)serialized field by field in explicit
// little-endian order, so the in-memory struct layout never reaches the disk.
struct IndexFileHeader {
  char magic[8];            //   0 "TQINDEX\0"
  uint32_t version;         //   8 kFileVersion
  uint32_t header_bytes;    //  12 128
  uint32_t dim;             //  16 2..65536
  uint8_t metric;           //  20 Metric
  uint8_t codec;            //  21 QuantizerKind (mse | prod)
  uint8_t scale_mode;       //  22 ScaleMode
  uint8_t norm_format;      //  23 NormFormat
  uint8_t rotation_kind;    //  24 RotationKind
  uint8_t law;              //  25 Law
  uint8_t bits_x2;          //  26 2 * bits, 2..16
  uint8_t flags;            //  27 bit 0: keep_vectors, bit 1: fit_scale, bit 2: center, 3: ivf, 4: list mean
  uint32_t rotation_block;  //  28 block width for RotationKind::block, else 0
  uint64_t seed;            //  32 rotation seed (the rotation is rebuilt from it)
  uint64_t count;           //  40 vectors
  uint64_t code_bytes;      //  48 bytes per vector record
  uint64_t codes_offset;    //  56 = 128 + center bytes (dim * 4 when centred and count > 0) + ivf bytes
  uint64_t codes_size;      //  64 = count * code_bytes
  uint64_t ids_offset;      //  72 = codes_offset + codes_size
  uint64_t ids_size;        //  80 = count * 8
  uint64_t vectors_offset;  //  88 = ids_offset + ids_size
  uint64_t vectors_size;    //  96 = count * dim * 4 or 0
  uint64_t file_size;       // 104 = vectors_offset + vectors_size
  uint64_t payload_xxh3;    // 112 XXH3-64 of bytes [128, file_size)
  uint64_t header_xxh3;     // 120 XXH3-64 of bytes [0, 120)
};
static_assert(sizeof(IndexFileHeader) == 128, "index file header is 128 bytes");
static_assert(offsetof(IndexFileHeader, seed) == 32, "layout");
static_assert(offsetof(IndexFileHeader, payload_xxh3) == 112, "layout");
static_assert(offsetof(IndexFileHeader, header_xxh3) == 120, "layout");

struct Out {
  std::vector<uint8_t> b;
  void u8(uint8_t v) { b.push_back(v); }
  void u32(uint32_t v) { for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i))); }
  void u64(uint64_t v) { for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i))); }
};
uint32_t ld32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}
uint64_t ld64(const uint8_t* p) { return ld32(p) | static_cast<uint64_t>(ld32(p + 4)) << 32; }
void st16(uint8_t* p, uint16_t v) { p[0] = static_cast<uint8_t>(v); p[1] = static_cast<uint8_t>(v >> 8); }
void st32(uint8_t* p, uint32_t v) { for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i)); }
uint32_t f2u(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float u2f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

void put_norm(uint8_t* p, float v, NormFormat f) {
  if (f == NormFormat::f16) st16(p, fp32_to_fp16(v));
  else st32(p, f2u(v));
}
float get_norm(const uint8_t* p, NormFormat f) {
  if (f == NormFormat::f16) return fp16_to_fp32(static_cast<uint16_t>(p[0] | p[1] << 8));
  return u2f(ld32(p));
}

void serialize_header(const IndexFileHeader& h, uint8_t* out) {
  Out o;
  for (char c : h.magic) o.u8(static_cast<uint8_t>(c));
  o.u32(h.version); o.u32(h.header_bytes); o.u32(h.dim);
  o.u8(h.metric); o.u8(h.codec); o.u8(h.scale_mode); o.u8(h.norm_format);
  o.u8(h.rotation_kind); o.u8(h.law); o.u8(h.bits_x2); o.u8(h.flags);
  o.u32(h.rotation_block); o.u64(h.seed); o.u64(h.count); o.u64(h.code_bytes);
  o.u64(h.codes_offset); o.u64(h.codes_size); o.u64(h.ids_offset); o.u64(h.ids_size);
  o.u64(h.vectors_offset); o.u64(h.vectors_size); o.u64(h.file_size); o.u64(h.payload_xxh3);
  o.u64(h.header_xxh3);
  TQ_ASSERT(o.b.size() == 128);
  std::memcpy(out, o.b.data(), 128);
}

IndexFileHeader parse_header(const uint8_t* p) {
  IndexFileHeader h;
  std::memcpy(h.magic, p, 8);
  h.version = ld32(p + 8); h.header_bytes = ld32(p + 12); h.dim = ld32(p + 16);
  h.metric = p[20]; h.codec = p[21]; h.scale_mode = p[22]; h.norm_format = p[23];
  h.rotation_kind = p[24]; h.law = p[25]; h.bits_x2 = p[26]; h.flags = p[27];
  h.rotation_block = ld32(p + 28); h.seed = ld64(p + 32); h.count = ld64(p + 40);
  h.code_bytes = ld64(p + 48); h.codes_offset = ld64(p + 56); h.codes_size = ld64(p + 64);
  h.ids_offset = ld64(p + 72); h.ids_size = ld64(p + 80); h.vectors_offset = ld64(p + 88);
  h.vectors_size = ld64(p + 96); h.file_size = ld64(p + 104); h.payload_xxh3 = ld64(p + 112);
  h.header_xxh3 = ld64(p + 120);
  return h;
}

}  // namespace

uint64_t Index::file_bytes() const {
  const Impl& I = *impl_;
  const uint64_t n = I.n, d = static_cast<uint64_t>(I.d), L = I.ivf() ? static_cast<uint64_t>(I.cfg.nlist) : 0;
  uint64_t b = 128 + (I.cfg.center && n > 0 ? 4 * d : 0);
  if (I.ivf()) b += 16 + (n > 0 ? L * d * 4 + L * 8 : 0);
  b += n * I.code_bytes + n * 8 + (I.cfg.keep_vectors ? n * d * 4 : 0);
  return b;
}

void Index::save(const std::string& path) const {
  const Impl& I = *impl_;
  const size_t n = I.n, d = static_cast<size_t>(I.d);
  IndexFileHeader h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = I.tc            ? kFileVersionTrellis
              : !I.ivf()      ? kFileVersion
              : I.rbytes == 0 ? kFileVersionIvf
              : I.cfg.rerank_refine ? kFileVersionIvfRefine
                                    : kFileVersionIvfRerank;
  h.header_bytes = 128;
  h.dim = static_cast<uint32_t>(I.d);
  h.metric = static_cast<uint8_t>(I.cfg.metric);
  h.codec = static_cast<uint8_t>(I.cfg.codec);
  h.scale_mode = static_cast<uint8_t>(I.cfg.scale);
  h.norm_format = static_cast<uint8_t>(I.cfg.norm);
  h.rotation_kind = static_cast<uint8_t>(I.cfg.rotation.kind);
  h.law = static_cast<uint8_t>(I.cfg.law);
  h.bits_x2 = static_cast<uint8_t>(I.bits_x2);
  h.flags = static_cast<uint8_t>((I.cfg.keep_vectors ? 1 : 0) | (I.cfg.fit_scale ? 2 : 0) |
                                 (I.cfg.center ? 4 : 0) | (I.ivf() ? 8 : 0) |
                                 (I.ivf() && I.cfg.ivf_list_mean ? 16 : 0));
  h.rotation_block = static_cast<uint32_t>(I.cfg.rotation.kind == RotationKind::block ? I.cfg.rotation.block : 0);
  h.seed = I.cfg.seed;
  h.count = n;
  h.code_bytes = I.code_bytes;
  const size_t center_bytes = I.cfg.center && n > 0 ? 4 * d : 0;
  const size_t L = I.ivf() ? static_cast<size_t>(I.cfg.nlist) : 0;
  const size_t ivf_bytes = I.ivf() ? 16 + (n > 0 ? checked_add(checked_mul(checked_mul(L, d, "ivf"), 4, "ivf"), L * 8, "ivf") : 0) : 0;
  h.codes_offset = 128 + center_bytes + ivf_bytes;
  h.codes_size = checked_mul(n, I.code_bytes, "index codes");
  h.ids_offset = h.codes_offset + h.codes_size;
  h.ids_size = checked_mul(n, 8, "index ids");
  h.vectors_offset = h.ids_offset + h.ids_size;
  h.vectors_size = I.cfg.keep_vectors ? checked_mul(checked_mul(n, d, "vectors"), 4, "vectors") : 0;
  h.file_size = h.vectors_offset + h.vectors_size;

  // Record order: storage slots of the real vectors (flat: 0..n-1; IVF: list by list).
  std::vector<size_t> order(n);
  if (I.ivf()) {
    size_t r = 0;
    for (size_t l = 0; l < L; ++l)
      for (size_t t = 0; t < I.list_size[l]; ++t) order[r++] = I.list_begin[l] + t;
    TQ_ASSERT(r == n);
  } else {
    for (size_t i = 0; i < n; ++i) order[i] = i;
  }

  std::vector<uint8_t> buf(h.file_size);
  for (size_t j = 0; j < center_bytes / 4; ++j) st32(buf.data() + 128 + 4 * j, f2u(I.center[j]));
  if (I.ivf()) {
    uint8_t* v = buf.data() + 128 + center_bytes;
    st32(v, static_cast<uint32_t>(L));
    st32(v + 4, static_cast<uint32_t>(I.cfg.kmeans_iters));
    st32(v + 8, n > 0 ? 1u : 0u);
    st32(v + 12, static_cast<uint32_t>(I.cfg.rerank_bits));
    if (n > 0) {
      for (size_t j = 0; j < L * d; ++j) st32(v + 16 + 4 * j, f2u(I.centroids[j]));
      uint8_t* sz = v + 16 + L * d * 4;
      for (size_t l = 0; l < L; ++l) {
        st32(sz + 8 * l, static_cast<uint32_t>(I.list_size[l]));
        st32(sz + 8 * l + 4, static_cast<uint32_t>(static_cast<uint64_t>(I.list_size[l]) >> 32));
      }
    }
  }
  uint8_t* codes = buf.data() + h.codes_offset;
  std::vector<uint8_t> idx(d);
  for (size_t r = 0; r < n; ++r) {
    const size_t i = order[r];
    uint8_t* rec = codes + r * I.code_bytes;
    if (I.quant) {
      const size_t qb = I.quant->code_bytes();
      std::memcpy(rec, I.pcodes.data() + i * qb, qb);
      if (I.has_norm) put_norm(rec + qb, I.norm[i], I.cfg.norm);
      continue;
    }
    put_norm(rec, I.scale[i], I.cfg.norm);
    rec += I.norm_bytes;
    if (I.has_norm) {
      put_norm(rec, I.norm[i], I.cfg.norm);
      rec += I.norm_bytes;
    }
    if (I.vl()) {  // the row is the record's codes
      std::memcpy(rec, I.vrow(i), I.seg_bytes);
      rec += I.seg_bytes;
    } else {
      I.get_indices(i, idx.data());
      for (const Segment& s : I.segs) {
        pack_bits(static_cast<size_t>(s.len), s.bits, idx.data() + s.begin, rec);
        rec += packed_bytes(static_cast<size_t>(s.len), s.bits);
      }
    }
    if (I.rbytes > 0) {
      put_norm(rec, I.rscale[i], I.cfg.norm);
      std::memcpy(rec + I.norm_bytes, I.rcodes.data() + i * I.rbytes, I.rbytes);
    }
  }
  uint8_t* idp = buf.data() + h.ids_offset;
  for (size_t r = 0; r < n; ++r) {
    const uint64_t v = static_cast<uint64_t>(I.ids[order[r]]);
    st32(idp + 8 * r, static_cast<uint32_t>(v));
    st32(idp + 8 * r + 4, static_cast<uint32_t>(v >> 32));
  }
  if (I.cfg.keep_vectors) {
    uint8_t* vp = buf.data() + h.vectors_offset;
    for (size_t r = 0; r < n; ++r)
      for (size_t j = 0; j < d; ++j) st32(vp + 4 * (r * d + j), f2u(I.vectors[order[r] * d + j]));
  }
  h.payload_xxh3 = checksum64(buf.data() + 128, buf.size() - 128);
  serialize_header(h, buf.data());
  h.header_xxh3 = checksum64(buf.data(), 120);
  serialize_header(h, buf.data());
  atomic_write_file(path, buf.data(), buf.size());
}

// The file is memory-mapped read-only (no copy of it in the heap; pages are read as the
// checksum and the decoding reach them), validated and decoded into the index's in-memory
// layout, then unmapped. Files that cannot be mapped (pipes, ...) are read instead.
Index Index::load(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TQ_CHECK(fd >= 0, "cannot open index '%s': %s", path.c_str(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
    ::close(fd);
    const auto bytes = read_file_bytes(path);
    return from_bytes(bytes.data(), bytes.size(), path);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) {
    const auto bytes = read_file_bytes(path);
    return from_bytes(bytes.data(), bytes.size(), path);
  }
  ::madvise(map, size, MADV_SEQUENTIAL);
  struct Unmap {
    void* p;
    size_t n;
    ~Unmap() { ::munmap(p, n); }
  } guard{map, size};
  return from_bytes(static_cast<const uint8_t*>(map), size, path);
}

Index Index::from_bytes(const uint8_t* data, size_t size, const std::string& name) {
  const char* nm = name.c_str();
  TQ_CHECK(size > 0, "%s: empty file (0 bytes), not a tq index", nm);
  TQ_CHECK(size >= 128, "%s: %zu bytes, too short for the 128-byte tq index header (truncated?)", nm, size);
  const IndexFileHeader h = parse_header(data);
  TQ_CHECK(std::memcmp(h.magic, kMagic, 8) == 0, "%s: bad magic, not a tq index file", nm);
  TQ_CHECK(h.version == kFileVersion || h.version == kFileVersionIvf || h.version == kFileVersionIvfRerank ||
               h.version == kFileVersionIvfRefine || h.version == kFileVersionTrellis,
           "%s: tq index file version %u, this build reads versions %u (flat), %u (IVF), %u (IVF with an "
           "independent second-stage code), %u (IVF with a refining second-stage code) and %u (flat, "
           "trellis codes)",
           nm, h.version, kFileVersion, kFileVersionIvf, kFileVersionIvfRerank, kFileVersionIvfRefine,
           kFileVersionTrellis);
  TQ_CHECK(h.header_bytes == 128, "%s: header size %u, expected 128", nm, h.header_bytes);
  TQ_CHECK(checksum64(data, 120) == h.header_xxh3, "%s: header checksum mismatch (corrupted header)", nm);
  TQ_CHECK(h.dim >= 2 && h.dim <= 65536, "%s: dim %u outside [2, 65536]", nm, h.dim);
  TQ_CHECK(h.metric <= 2, "%s: unknown metric code %u", nm, h.metric);
  TQ_CHECK(h.codec <= 1, "%s: unknown codec code %u", nm, h.codec);
  TQ_CHECK(h.scale_mode <= 3, "%s: unknown scale mode %u", nm, h.scale_mode);
  TQ_CHECK(h.norm_format <= 1, "%s: unknown norm format %u", nm, h.norm_format);
  TQ_CHECK(h.rotation_kind <= 5, "%s: unknown rotation kind %u", nm, h.rotation_kind);
  TQ_CHECK(h.law <= 1, "%s: unknown codebook law %u", nm, h.law);
  TQ_CHECK(h.bits_x2 >= 2 && h.bits_x2 <= 16, "%s: bits*2 = %u outside [2, 16]", nm, h.bits_x2);
  const bool second = h.version == kFileVersionIvfRerank || h.version == kFileVersionIvfRefine;
  const bool ivf = h.version == kFileVersionIvf || second;
  if (ivf)
    TQ_CHECK(h.flags <= 31 && (h.flags & 8) != 0, "%s: flags 0x%x invalid for a version %u (IVF) file", nm, h.flags,
             h.version);
  else TQ_CHECK(h.flags <= 7, "%s: flags 0x%x invalid for a version %u (flat) file", nm, h.flags, h.version);
  const auto rk = static_cast<RotationKind>(h.rotation_kind);
  if (rk == RotationKind::block)
    TQ_CHECK(h.rotation_block == 32 || h.rotation_block == 64 || h.rotation_block == 128,
             "%s: rotation block %u not 32, 64 or 128", nm, h.rotation_block);
  else
    TQ_CHECK(h.rotation_block == 0, "%s: rotation block %u given for a non-block rotation", nm, h.rotation_block);
  TQ_CHECK(h.count < (uint64_t{1} << 32), "%s: absurd vector count %llu", nm,
           static_cast<unsigned long long>(h.count));

  IndexConfig cfg;
  cfg.dim = static_cast<int>(h.dim);
  cfg.metric = static_cast<Metric>(h.metric);
  cfg.codec = static_cast<QuantizerKind>(h.codec);
  cfg.scale = static_cast<ScaleMode>(h.scale_mode);
  cfg.norm = static_cast<NormFormat>(h.norm_format);
  cfg.rotation.kind = rk;
  cfg.rotation.block = static_cast<int>(h.rotation_block);
  cfg.law = static_cast<Law>(h.law);
  cfg.bits = h.bits_x2 / 2.0;
  cfg.seed = h.seed;
  cfg.keep_vectors = (h.flags & 1) != 0;
  cfg.fit_scale = (h.flags & 2) != 0;
  cfg.center = (h.flags & 4) != 0;
  cfg.ivf_list_mean = (h.flags & 16) != 0;
  cfg.trellis = h.version == kFileVersionTrellis;
  if (cfg.trellis)
    TQ_CHECK(h.codec == static_cast<uint8_t>(QuantizerKind::mse) && h.bits_x2 % 2 == 0 && h.bits_x2 <= 8 &&
                 h.dim * (h.bits_x2 / 2) >= 8,
             "%s: trellis codes with codec %u, bits %g, dim %u (they need codec mse, 1 to 4 bits, dim * bits >= 8)",
             nm, h.codec, cfg.bits, h.dim);
  const size_t n = static_cast<size_t>(h.count), d = h.dim;
  // Record size implied by the parameters (before anything is built from them).
  const size_t nb = cfg.norm == NormFormat::f16 ? 2 : 4;
  const bool l2 = cfg.metric == Metric::l2;
  size_t expect_code = 0;
  if (cfg.codec == QuantizerKind::prod) {
    TQ_CHECK(h.bits_x2 % 2 == 0 && h.bits_x2 >= 4, "%s: codec prod with bits %g", nm, cfg.bits);
    expect_code = 2 * nb + packed_bytes(d, h.bits_x2 / 2 - 1) + packed_bytes(d, 1) + (l2 ? nb : 0);
  } else if (h.bits_x2 % 2 == 0) {
    expect_code = nb * (l2 ? 2 : 1) + packed_bytes(d, h.bits_x2 / 2);
  } else {
    const size_t n_hi = (d + 1) / 2;
    expect_code = nb * (l2 ? 2 : 1) + packed_bytes(n_hi, h.bits_x2 / 2 + 1) +
                  packed_bytes(d - n_hi, h.bits_x2 / 2);
  }
  // Version 3: the IVF section's last word is the second stage's width, and its records
  // carry [scale][packed codes] after the first code.
  cfg.rerank_refine = h.version == kFileVersionIvfRefine;
  if (second) {
    const uint64_t off = 128 + (cfg.center && h.count > 0 ? 4 * static_cast<uint64_t>(d) : 0);
    TQ_CHECK(size >= off + 16, "%s: %zu bytes, too short for the IVF section (truncated?)", nm, size);
    const uint32_t rb = ld32(data + off + 12);
    TQ_CHECK(rb >= 1 && rb <= 8, "%s: second-stage code width %u outside [1, 8] in a version %u file", nm, rb,
             h.version);
    TQ_CHECK(cfg.codec == QuantizerKind::mse, "%s: second-stage code with codec prod", nm);
    cfg.rerank_bits = static_cast<int>(rb);
    expect_code += nb + packed_bytes(d, static_cast<int>(rb));
  }
  TQ_CHECK(h.code_bytes == expect_code, "%s: record size %llu, parameters imply %zu", nm,
           static_cast<unsigned long long>(h.code_bytes), expect_code);
  const size_t code_bytes = expect_code;
  const uint64_t codes_size = checked_mul(n, code_bytes, "codes size");
  const uint64_t ids_size = checked_mul(n, 8, "ids size");
  const uint64_t vec_size = cfg.keep_vectors ? checked_mul(checked_mul(n, d, "vectors"), 4, "vectors") : 0;
  const uint64_t center_bytes = cfg.center && n > 0 ? 4 * static_cast<uint64_t>(d) : 0;
  TQ_CHECK(!(cfg.center && cfg.codec == QuantizerKind::prod), "%s: center with codec prod", nm);
  uint64_t ivf_bytes = 0;
  const uint64_t ivf_offset = 128 + center_bytes;
  if (ivf) {
    TQ_CHECK(!cfg.center && cfg.codec == QuantizerKind::mse, "%s: IVF file with center or codec prod", nm);
    TQ_CHECK(size >= ivf_offset + 16, "%s: %zu bytes, too short for the IVF section (truncated?)", nm, size);
    const uint32_t nl = ld32(data + ivf_offset), it = ld32(data + ivf_offset + 4);
    const uint32_t trained = ld32(data + ivf_offset + 8), reserved = ld32(data + ivf_offset + 12);
    TQ_CHECK(nl >= 1 && nl <= (1u << 20), "%s: IVF nlist %u outside [1, 2^20]", nm, nl);
    TQ_CHECK(it >= 1 && it <= 1000, "%s: IVF kmeans_iters %u outside [1, 1000]", nm, it);
    TQ_CHECK(trained == (n > 0 ? 1u : 0u) && reserved == static_cast<uint32_t>(cfg.rerank_bits),
             "%s: IVF section flags inconsistent", nm);
    cfg.nlist = static_cast<int>(nl);
    cfg.kmeans_iters = static_cast<int>(it);
    ivf_bytes = 16;
    if (n > 0)
      ivf_bytes = checked_add(ivf_bytes, checked_add(checked_mul(checked_mul(nl, d, "ivf"), 4, "ivf"),
                                                     static_cast<uint64_t>(nl) * 8, "ivf"), "ivf");
  }
  TQ_CHECK(h.codes_offset == 128 + center_bytes + ivf_bytes && h.codes_size == codes_size, "%s: codes section [%llu, +%llu) inconsistent",
           nm, static_cast<unsigned long long>(h.codes_offset), static_cast<unsigned long long>(h.codes_size));
  TQ_CHECK(h.ids_offset == h.codes_offset + codes_size && h.ids_size == ids_size,
           "%s: ids section inconsistent", nm);
  TQ_CHECK(h.vectors_offset == h.ids_offset + ids_size && h.vectors_size == vec_size,
           "%s: vectors section inconsistent", nm);
  const uint64_t total = checked_add(h.vectors_offset, vec_size, "file size");
  TQ_CHECK(h.file_size == total, "%s: header file size %llu, sections add up to %llu", nm,
           static_cast<unsigned long long>(h.file_size), static_cast<unsigned long long>(total));
  TQ_CHECK(size == total, "%s: file is %zu bytes, header says %llu (%s)", nm, size,
           static_cast<unsigned long long>(total), size < total ? "truncated" : "trailing bytes");
  TQ_CHECK(checksum64(data + 128, size - 128) == h.payload_xxh3,
           "%s: payload checksum mismatch (corrupted codes, ids or vectors)", nm);

  // Everything checked: build (codebooks, rotation), then fill.
  Index index(cfg);
  Impl& I = *index.impl_;
  TQ_CHECK(I.code_bytes == code_bytes, "%s: record size mismatch with this build", nm);
  // Storage slot of record r: r (flat) or its place in its list (IVF, lists block-padded).
  std::vector<size_t> order(n);
  if (ivf && n > 0) {
    const size_t L = static_cast<size_t>(cfg.nlist);
    const uint8_t* cp = data + ivf_offset + 16;
    std::vector<float> cent(L * d);
    for (size_t j = 0; j < L * d; ++j) {
      cent[j] = u2f(ld32(cp + 4 * j));
      TQ_CHECK(std::isfinite(cent[j]), "%s: IVF centroid %zu, component %zu is not finite", nm, j / d, j % d);
    }
    const uint8_t* sp = cp + L * d * 4;
    uint64_t total_n = 0;
    for (size_t l = 0; l < L; ++l) {
      const uint64_t ls = ld64(sp + 8 * l);
      TQ_CHECK(ls <= n - total_n, "%s: IVF list sizes add up to more than the %zu vectors", nm, n);
      total_n += ls;
      I.list_size[l] = static_cast<size_t>(ls);
    }
    TQ_CHECK(total_n == n, "%s: IVF list sizes add up to %llu, the file has %zu vectors", nm,
             static_cast<unsigned long long>(total_n), n);
    for (size_t l = 0; l < L; ++l)
      I.list_begin[l + 1] = I.list_begin[l] + (I.list_size[l] + kBlock - 1) / kBlock * kBlock;
    TQ_CHECK(I.list_begin[L] < (size_t{1} << 32), "%s: IVF lists need too many slots", nm);
    for (size_t l = 0; l < L; ++l)
      TQ_CHECK(sqnorm((int)d, cent.data() + l * d) <= kMaxStoredSq,
               "%s: IVF centroid %zu has norm %.3g, above the 2^64 a search keeps finite", nm, l,
               exact_norm(cent.data() + l * d, d));
    I.set_centroids(std::move(cent));
    size_t r = 0;
    for (size_t l = 0; l < L; ++l)
      for (size_t t = 0; t < I.list_size[l]; ++t) order[r++] = I.list_begin[l] + t;
    I.resize(I.list_begin[L]);
    std::fill(I.ids.begin(), I.ids.end(), int64_t{-1});
  } else {
    for (size_t i = 0; i < n; ++i) order[i] = i;
    I.resize(n);
  }
  if (center_bytes > 0) {
    I.center.resize(d);
    for (size_t j = 0; j < d; ++j) {
      I.center[j] = u2f(ld32(data + 128 + 4 * j));
      TQ_CHECK(std::isfinite(I.center[j]), "%s: center component %zu is not finite", nm, j);
    }
    TQ_CHECK(sqnorm((int)d, I.center.data()) <= kMaxStoredSq,
             "%s: center has norm %.3g, above the 2^64 a search keeps finite", nm,
             exact_norm(I.center.data(), d));
  }
  // The records, decoded in parallel by chunks of 64 storage slots (whole fast-scan and trellis
  // blocks, each written by one thread; a fast-layout block is written row by row from its
  // slots' group codes, a vector-layout row is the record's code bytes). Their stored floats
  // are checked afterwards, record by record, so the first bad record is the one named.
  std::vector<size_t> rec(I.slots, SIZE_MAX);  // record of each slot (SIZE_MAX: list padding)
  for (size_t ri = 0; ri < n; ++ri) rec[order[ri]] = ri;
  const size_t chunk = 64, chunks = (I.slots + chunk - 1) / chunk;
#pragma omp parallel
  {
    std::vector<uint8_t> idx(d), gc(I.fast_ok && !I.vl() ? chunk * I.m : 0);
#pragma omp for schedule(static)
    for (size_t c = 0; c < chunks; ++c) {
      const size_t t0 = c * chunk, t1 = std::min(I.slots, t0 + chunk);
      std::fill(gc.begin(), gc.end(), uint8_t{0});
      for (size_t t = t0; t < t1; ++t) {
        if (rec[t] == SIZE_MAX) continue;
        const uint8_t* r = data + h.codes_offset + rec[t] * I.code_bytes;
        if (I.quant) {
          const size_t qb = I.quant->code_bytes();
          std::memcpy(I.pcodes.data() + t * qb, r, qb);
          I.scale[t] = 1.f;
          if (I.has_norm) I.norm[t] = get_norm(r + qb, cfg.norm);
          continue;
        }
        I.scale[t] = get_norm(r, cfg.norm);
        r += I.norm_bytes;
        if (I.has_norm) {
          I.norm[t] = get_norm(r, cfg.norm);
          r += I.norm_bytes;
        }
        if (I.vl()) {  // the row is the record's codes, less the bits past each segment's last code
          uint8_t* row = I.vrow(t);
          std::memcpy(row, r, I.seg_bytes);
          for (const Segment& s : I.segs) {
            const size_t used = static_cast<size_t>(s.len) * static_cast<size_t>(s.bits);
            if (used % 8 != 0) row[s.voff + used / 8] &= static_cast<uint8_t>((1u << (used % 8)) - 1);
          }
          r += I.seg_bytes;
        } else {
          for (const Segment& s : I.segs) {
            unpack_bits(static_cast<size_t>(s.len), s.bits, r, idx.data() + s.begin);
            r += packed_bytes(static_cast<size_t>(s.len), s.bits);
          }
          if (I.fast_ok) {
            for (size_t g = 0; g < I.m; ++g) gc[(t - t0) * I.m + g] = I.pack_group(idx.data(), g);
          } else {
            I.set_indices(t, idx.data());
          }
        }
        if (I.rbytes > 0) {
          I.rscale[t] = get_norm(r, cfg.norm);
          std::memcpy(I.rcodes.data() + t * I.rbytes, r + I.norm_bytes, I.rbytes);
        }
      }
      if (I.fast_ok && !I.vl())
        for (size_t b0 = t0; b0 < t1; b0 += kBlock) I.write_block(b0, gc.data() + (b0 - t0) * I.m);
    }
  }
  for (size_t ri = 0; ri < n; ++ri) {
    const size_t i = order[ri];
    if (I.rbytes > 0) {
      TQ_CHECK(std::isfinite(I.rscale[i]), "%s: vector %zu has a non-finite second-stage scale", nm, ri);
      TQ_CHECK(std::fabs(I.rscale[i]) <= kMaxStored,
               "%s: vector %zu has second-stage scale %.3g, above the 2^64 a search keeps finite", nm, ri,
               static_cast<double>(I.rscale[i]));
    }
    TQ_CHECK(std::isfinite(I.scale[i]), "%s: vector %zu has a non-finite scale", nm, ri);
    TQ_CHECK(std::fabs(I.scale[i]) <= kMaxStored, "%s: vector %zu has scale %.3g, above the 2^64 a search keeps finite",
             nm, ri, static_cast<double>(I.scale[i]));
    if (I.has_norm) {
      TQ_CHECK(std::isfinite(I.norm[i]) && I.norm[i] >= 0, "%s: vector %zu has a bad norm", nm, ri);
      TQ_CHECK(I.norm[i] <= kMaxStored, "%s: vector %zu has norm %.3g, above the 2^64 a search keeps finite", nm, ri,
               static_cast<double>(I.norm[i]));
    }
  }
  const uint8_t* idp = data + h.ids_offset;
  for (size_t r = 0; r < n; ++r) I.ids[order[r]] = static_cast<int64_t>(ld64(idp + 8 * r));
  if (cfg.keep_vectors) {
    const uint8_t* vp = data + h.vectors_offset;
    for (size_t r = 0; r < n; ++r) {
      float* row = I.vectors.data() + order[r] * d;
      for (size_t j = 0; j < d; ++j) row[j] = u2f(ld32(vp + 4 * (r * d + j)));
      // One vectorized pass: a non-finite component or a norm past 2^64 fails it; then the
      // error says which.
      const double s2 = sqnorm((int)d, row);
      if (!(s2 <= kMaxStoredSq)) {
        for (size_t j = 0; j < d; ++j) TQ_CHECK(std::isfinite(row[j]), "%s: kept vector %zu is not finite", nm, r);
        TQ_CHECK(false, "%s: kept vector %zu has norm %.3g, above the 2^64 a search keeps finite", nm, r,
                 exact_norm(row, d));
      }
    }
  }
  I.n = n;
  I.derive(0);
  return index;
}

}  // namespace tq
