// Fuzz target: the saved-index loader (tq::Index::from_bytes, src/search/io.cpp), then a
// search over whatever it loaded.
//
// Input: byte 0 is a mode, the rest is the file. When mode bit 0 is set the two XXH3
// checksums of the header (bytes 112..127) are recomputed over the mutated bytes before
// loading, so the fuzzer gets past the checksums and exercises the field validation and the
// code decoding behind them; otherwise the bytes are loaded as they are (the checksum path).
// A malformed file must be a tq::Error. When a file loads:
//   - a k-NN search (fast scan or float LUTs, with and without re-ranking; k from the mode
//     byte) runs on two seeded queries, and every returned id is -1 or an id of the file;
//   - the index reports the dimension and size of its header;
//   - flat files of trellis codes (version 5) search like any flat file (float LUTs);
//   - IVF files (version 2, and 3 with a second-stage code): the search probes
//     1 + (mode >> 4) % nlist lists; mode & 4 turns the re-rank stage (float LUT or second
//     stage) off;
//   - remove_ids of the first result's id removes every vector holding it, and the search
//     then no longer returns it.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <unordered_set>
#include <vector>

#include "fuzz_util.h"
#include "search/index_internal.h"
#include "tq/codebook.h"
#include "tq/common.h"
#include "tq/distortion.h"
#include "tq/error.h"
#include "tq/fileio.h"
#include "tq/index.h"

namespace {

void store64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t load32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
uint64_t load64(const uint8_t* p) { return load32(p) | static_cast<uint64_t>(load32(p + 4)) << 32; }

}  // namespace

// Codebooks of more than 5 bits take seconds each to compute under the sanitizers (and a
// file may name any dimension), which made single inputs time out. Those widths are fuzzed
// at these dimensions only, with their codebooks computed before fuzzing starts; every
// dimension is fuzzed at 1..5 bits (and 5.5, whose channels use 5 and 6 bits, at these).
constexpr uint32_t kWideDims[] = {8, 17, 33};

bool too_slow(const std::vector<uint8_t>& f) {
  if (f.size() < 128) return false;
  const uint32_t dim = load32(f.data() + 16);
  const uint8_t bits_x2 = f[26];
  if (bits_x2 <= 10) return false;
  for (uint32_t d : kWideDims)
    if (d == dim) return false;
  return true;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  for (uint32_t d : kWideDims)
    for (int bits = 5; bits <= 8; ++bits) {
      tq::get_codebook(static_cast<int>(d), bits, tq::Law::beta);
      tq::get_codebook(static_cast<int>(d), bits, tq::Law::gauss);
    }
  const std::string dir = tq_fuzz::seed_dir();
  if (dir.empty()) return 0;
  // Seeds: small indexes saved by Index::save for a spread of configurations.
  struct Cfg {
    int dim;
    const char* metric;
    double bits;
    tq::QuantizerKind codec;
    const char* scale;
    tq::NormFormat norm;
    const char* rotation;
    bool keep, center;
    size_t n;
    int nlist;
    int rerank_bits;
    bool refine;  // second stage: refining (version 4) or independent (version 3)
    bool trellis;  // flat index of trellis codes (version 5)
  };
  const Cfg cfgs[] = {
      {8, "cosine", 4, tq::QuantizerKind::mse, "corrected", tq::NormFormat::f16, "hadamard", false, false, 5},
      {17, "l2", 2.5, tq::QuantizerKind::mse, "plain", tq::NormFormat::f32, "block32", true, false, 3},
      {16, "ip", 1, tq::QuantizerKind::mse, "eden", tq::NormFormat::f16, "givens", false, true, 4},
      {12, "l2", 3, tq::QuantizerKind::prod, "corrected", tq::NormFormat::f16, "iso4", false, false, 3},
      {33, "cosine", 8, tq::QuantizerKind::mse, "lsq", tq::NormFormat::f32, "haar", true, true, 2},
      {4, "ip", 1.5, tq::QuantizerKind::mse, "corrected", tq::NormFormat::f16, "identity", false, false, 40},
      {64, "cosine", 4, tq::QuantizerKind::mse, "corrected", tq::NormFormat::f16, "hadamard", false, false, 0},
      // IVF (version 2 files): lists, centroids, list sizes.
      {8, "cosine", 4, tq::QuantizerKind::mse, "corrected", tq::NormFormat::f16, "hadamard", false, false, 40, 3},
      {17, "l2", 2.5, tq::QuantizerKind::mse, "plain", tq::NormFormat::f32, "block32", true, false, 20, 4},
      {8, "ip", 8, tq::QuantizerKind::mse, "lsq", tq::NormFormat::f16, "haar", false, false, 9, 2},
      {16, "cosine", 3, tq::QuantizerKind::mse, "corrected", tq::NormFormat::f16, "hadamard", false, false, 0, 5},
      // IVF with an independent second-stage re-rank code (version 3 files).
      {8, "cosine", 4, tq::QuantizerKind::mse, "corrected", tq::NormFormat::f16, "hadamard", false, false, 40, 3, 8, false},
      {17, "l2", 2.5, tq::QuantizerKind::mse, "plain", tq::NormFormat::f32, "block32", true, false, 20, 4, 3, false},
      {8, "ip", 2, tq::QuantizerKind::mse, "lsq", tq::NormFormat::f16, "haar", false, false, 9, 2, 6, false},
      {16, "cosine", 4, tq::QuantizerKind::mse, "corrected", tq::NormFormat::f16, "hadamard", false, false, 0, 5, 5, false},
      // IVF with a refining second stage (version 4 files).
      {8, "cosine", 4, tq::QuantizerKind::mse, "corrected", tq::NormFormat::f16, "hadamard", false, false, 40, 3, 4, true},
      {17, "l2", 2.5, tq::QuantizerKind::mse, "plain", tq::NormFormat::f32, "block32", true, false, 20, 4, 8, true},
      {8, "ip", 2, tq::QuantizerKind::mse, "eden", tq::NormFormat::f16, "haar", false, false, 9, 2, 1, true},
      {16, "l2", 1.5, tq::QuantizerKind::mse, "lsq", tq::NormFormat::f32, "givens", false, false, 33, 5, 6, true},
      // Flat indexes of trellis codes (version 5 files).
      {16, "cosine", 4, tq::QuantizerKind::mse, "corrected", tq::NormFormat::f16, "hadamard", false, true, 6, 0, 0, false, true},
      {9, "l2", 2, tq::QuantizerKind::mse, "lsq", tq::NormFormat::f32, "haar", true, false, 3, 0, 0, false, true},
      {8, "ip", 1, tq::QuantizerKind::mse, "eden", tq::NormFormat::f16, "identity", false, false, 4, 0, 0, false, true},
  };
  int k = 0;
  for (const Cfg& c : cfgs) {
    tq::IndexConfig ic;
    ic.dim = c.dim;
    ic.metric = tq::parse_metric(c.metric);
    ic.bits = c.bits;
    ic.codec = c.codec;
    ic.scale = tq::parse_scale_mode(c.scale);
    ic.norm = c.norm;
    ic.rotation = tq::parse_rotation(c.rotation);
    ic.keep_vectors = c.keep;
    ic.center = c.center;
    ic.nlist = c.nlist;
    ic.rerank_bits = c.rerank_bits;
    ic.rerank_refine = c.refine;
    ic.trellis = c.trellis;
    tq::Index index(ic);
    std::vector<float> x(c.n * c.dim);
    tq::random_unit_vectors(c.n, c.dim, 10 + k, x.data());
    for (auto& v : x) v *= 3.0f;
    if (c.n) index.add(c.n, x.data());
    const std::string tmp = dir + "/.tmp_index";
    index.save(tmp);
    std::vector<uint8_t> b = tq::read_file_bytes(tmp);
    std::remove(tmp.c_str());
    for (uint8_t mode : {0, 1, 7}) {
      b.insert(b.begin(), mode);
      tq_fuzz::write_seed(dir, "index_" + std::to_string(k) + "_m" + std::to_string(mode), b);
      b.erase(b.begin());
    }
    if (c.trellis && b.size() > 128) {
      // Trellis files with their checksums recomputed: read as version 1 (scalar codes of the
      // same layout: loads), and at 5 and 0 bits (refused).
      const std::string stem = "index_" + std::to_string(k) + "_trellis_";
      auto put = [&](const std::string& name, std::vector<uint8_t> f) {
        f.insert(f.begin(), uint8_t{1});
        tq_fuzz::write_seed(dir, stem + name, f);
      };
      auto f = b;
      f[8] = 1;
      put("version1", f);
      for (uint8_t bx2 : {uint8_t{10}, uint8_t{0}}) {
        f = b;
        f[26] = bx2;
        put("bits_x2_" + std::to_string(bx2), f);
      }
    }
    if (c.nlist > 0 && b.size() > 128) {
      // Damaged IVF files, each with its checksums recomputed (mode 1) so that the loader's
      // field checks, not the checksum, meet them: cut in the IVF section, cut in the codes,
      // version 1 (an IVF file read as flat), version 2, 3 or 4 (the other IVF versions: without
      // a second stage, with an independent or a refining one), version 5 (flat trellis), one list
      // size inflated; for versions 3 and 4, second-stage widths 0 and 9 in the IVF section.
      const std::string stem = "index_" + std::to_string(k) + "_ivf_";
      auto put = [&](const std::string& name, std::vector<uint8_t> f) {
        f.insert(f.begin(), uint8_t{1});
        tq_fuzz::write_seed(dir, stem + name, f);
      };
      put("cut_header", std::vector<uint8_t>(b.begin(), b.begin() + 136));
      put("cut_half", std::vector<uint8_t>(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(b.size() / 2)));
      for (uint8_t v : {uint8_t{1}, uint8_t{2}, uint8_t{3}, uint8_t{4}, uint8_t{5}}) {
        if (v == b[8]) continue;
        auto f = b;
        f[8] = v;
        put("version" + std::to_string(v), f);
      }
      const size_t first_size = 128 + 16 + static_cast<size_t>(c.nlist) * c.dim * 4;  // after the centroids
      if (c.n > 0 && first_size < b.size()) {  // an empty IVF index has no centroids or sizes
        auto f = b;
        f[first_size] += 1;
        put("list_size", f);
      }
      if (c.rerank_bits > 0)
        for (uint8_t w : {uint8_t{0}, uint8_t{9}}) {
          auto f = b;
          f[128 + 12] = w;
          put("rerank_width" + std::to_string(w), f);
        }
    }
    ++k;
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::vector<uint8_t> file(data + 1, data + size);  // exact-size heap copy
  if ((mode & 1) && file.size() >= 128) {
    store64(file.data() + 112, tq::checksum64(file.data() + 128, file.size() - 128));
    store64(file.data() + 120, tq::checksum64(file.data(), 120));
  }
  if (too_slow(file)) return 0;
  try {
    tq::Index index = tq::Index::from_bytes(file.data(), file.size(), "fuzz.tqi");
    TQ_FUZZ_REQUIRE(index.dim() == static_cast<int>(load32(file.data() + 16)));
    TQ_FUZZ_REQUIRE(index.size() == load64(file.data() + 40));
    const int d = index.dim();
    const std::unordered_set<int64_t> known(index.impl().ids.begin(), index.impl().ids.end());
    std::vector<float> q(2 * static_cast<size_t>(d));
    tq::random_unit_vectors(2, d, 5, q.data());
    tq::SearchParams p;
    p.k = 1 + (mode >> 1) % 12;
    p.n_threads = 1;
    p.fast_scan = (mode & 2) == 0;
    p.rerank = (mode & 4) ? 0 : -1;
    p.rerank_full = (mode & 8) && index.config().keep_vectors ? p.k + 3 : 0;
    if (index.nlist() > 0) p.nprobe = 1 + (mode >> 4) % index.nlist();
    std::vector<float> scores(2 * p.k);
    std::vector<int64_t> ids(2 * p.k);
    index.search(2, q.data(), p, scores.data(), ids.data());
    for (int64_t id : ids) TQ_FUZZ_REQUIRE(id == -1 || known.count(id));
    // Fewer vectors than k: the tail of each row is id -1.
    if (index.size() < static_cast<size_t>(p.k))
      for (int r = 0; r < 2; ++r) TQ_FUZZ_REQUIRE(ids[r * p.k + p.k - 1] == -1);
    // Removing the first query's best id takes every vector holding it, and the same search
    // then returns it no more.
    const int64_t gone = ids[0];
    if (gone != -1) {
      const auto& held = index.impl().ids;
      const size_t copies = static_cast<size_t>(std::count(held.begin(), held.end(), gone));
      const size_t before = index.size();
      TQ_FUZZ_REQUIRE(index.remove_ids(1, &gone) == copies);
      TQ_FUZZ_REQUIRE(index.size() == before - copies);
      index.search(2, q.data(), p, scores.data(), ids.data());
      for (int64_t id : ids) TQ_FUZZ_REQUIRE(id != gone && (id == -1 || known.count(id)));
    }
  } catch (const tq::Error&) {
  }
  return 0;
}
