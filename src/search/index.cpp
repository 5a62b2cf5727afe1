// tq::Index: build (encode in batches) and search (fast scan + float-LUT re-rank).
// Layouts and the file format are documented in docs/design.md.
#include "tq/index.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "search/index_internal.h"
#include "tq/bitpack.h"
#include "tq/common.h"
#include "tq/error.h"
#include "tq/trellis.h"

namespace tq {

Metric parse_metric(const std::string& s) {
  if (s == "ip") return Metric::ip;
  if (s == "l2") return Metric::l2;
  if (s == "cosine") return Metric::cosine;
  TQ_CHECK(false, "unknown metric '%s' (valid: ip, l2, cosine)", s.c_str());
  return Metric::ip;
}
const char* metric_name(Metric m) noexcept {
  switch (m) {
    case Metric::ip: return "ip";
    case Metric::l2: return "l2";
    case Metric::cosine: return "cosine";
  }
  return "?";
}
ScaleMode parse_scale_mode(const std::string& s) {
  if (s == "plain") return ScaleMode::plain;
  if (s == "corrected") return ScaleMode::corrected;
  if (s == "eden") return ScaleMode::eden;
  if (s == "lsq") return ScaleMode::lsq;
  TQ_CHECK(false, "unknown scale mode '%s' (valid: plain, corrected, eden, lsq)", s.c_str());
  return ScaleMode::plain;
}
const char* scale_mode_name(ScaleMode m) noexcept {
  switch (m) {
    case ScaleMode::plain: return "plain";
    case ScaleMode::corrected: return "corrected";
    case ScaleMode::eden: return "eden";
    case ScaleMode::lsq: return "lsq";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------
// Impl: configuration, layout

Index::Impl::Impl(const IndexConfig& c) : cfg(c) {
  d = cfg.dim;
  TQ_CHECK(d >= 2 && d <= 65536, "index: dim %d outside [2, 65536]", d);
  const double b2f = cfg.bits * 2.0;
  bits_x2 = static_cast<int>(std::lround(b2f));
  TQ_CHECK(std::isfinite(b2f) && std::fabs(b2f - bits_x2) < 1e-9 && bits_x2 >= 2 && bits_x2 <= 16,
           "index: bits %g must be an integer 1..8 or a half-integer 1.5..7.5", cfg.bits);
  TQ_CHECK(cfg.codec == QuantizerKind::mse || cfg.codec == QuantizerKind::prod,
           "index: codec must be mse or prod");
  TQ_CHECK(static_cast<unsigned>(cfg.metric) <= 2, "index: bad metric");
  TQ_CHECK(static_cast<unsigned>(cfg.scale) <= 3, "index: bad scale mode");
  TQ_CHECK(cfg.norm == NormFormat::f16 || cfg.norm == NormFormat::f32, "index: bad norm format");
  norm_bytes = cfg.norm == NormFormat::f16 ? 2 : 4;
  has_norm = cfg.metric == Metric::l2;
  TQ_CHECK(cfg.nlist >= 0 && cfg.nlist <= (1 << 20), "index: nlist %d outside [0, 2^20]", cfg.nlist);
  if (cfg.nlist > 0) {
    TQ_CHECK(cfg.codec == QuantizerKind::mse, "index: IVF (nlist > 0) needs codec mse");
    TQ_CHECK(!cfg.center, "index: IVF quantizes residuals to the list centroids; center does not apply");
    TQ_CHECK(cfg.kmeans_iters >= 1 && cfg.kmeans_iters <= 1000, "index: kmeans_iters %d outside [1, 1000]",
             cfg.kmeans_iters);
    list_begin.assign(static_cast<size_t>(cfg.nlist) + 1, 0);
    list_size.assign(static_cast<size_t>(cfg.nlist), 0);
  }
  TQ_CHECK(cfg.rerank_bits >= 0 && cfg.rerank_bits <= 8, "index: rerank_bits %d outside [0, 8] (0: no second-stage code)",
           cfg.rerank_bits);
  TQ_CHECK(cfg.rerank_bits == 0 || cfg.nlist > 0, "index: a second-stage re-rank code (rerank_bits) needs IVF (nlist > 0)");
  if (cfg.codec == QuantizerKind::prod) {
    TQ_CHECK(!cfg.center && !cfg.fit_scale, "index: center and fit_scale apply to codec mse only");
    TQ_CHECK(!cfg.trellis, "index: trellis codes apply to codec mse only");
    TQ_CHECK(bits_x2 % 2 == 0 && bits_x2 >= 4,
             "index: codec prod needs an integer width of at least 2 bits (got %g)", cfg.bits);
    QuantizerConfig qc;
    qc.dim = d;
    qc.bits = bits_x2 / 2;
    qc.rotation = cfg.rotation;
    qc.seed = cfg.seed;
    qc.law = cfg.law;
    qc.norm = cfg.norm;
    qc.norm_correction = false;
    quant = make_quantizer(QuantizerKind::prod, qc);
    code_bytes = quant->code_bytes() + (has_norm ? norm_bytes : 0);
    return;
  }
  rot = make_rotation(cfg.rotation, d, cfg.seed);
  if (cfg.trellis) {
    TQ_CHECK(bits_x2 % 2 == 0 && bits_x2 >= 2 && bits_x2 <= 8,
             "index: trellis codes take an integer width of 1 to 4 bits (got %g)", cfg.bits);
    TQ_CHECK(cfg.nlist == 0, "index: trellis codes are for a flat index (not IVF)");
    TQ_CHECK(d * (bits_x2 / 2) >= 8, "index: trellis codes need dim * bits >= 8 (got %d * %d)", d, bits_x2 / 2);
    tc = &get_trellis(d, bits_x2 / 2);
    // The file holds the B-bit codes (one segment); memory holds each channel's table index
    // (the last 8 bits of the code stream up to it): one 256-entry group per channel.
    segs.push_back({0, d, bits_x2 / 2, &get_codebook(d, bits_x2 / 2, cfg.law)});
    seg_bytes = packed_bytes(static_cast<size_t>(d), bits_x2 / 2);
    for (int j = 0; j < d; ++j) groups.push_back({j, 1, tc->window_bits()});
    m = mp = groups.size();
    fast_ok = false;
    lut_stride = size_t{1} << tc->window_bits();
    code_bytes = norm_bytes * (has_norm ? 2 : 1) + seg_bytes;
    return;
  }
  if (bits_x2 % 2 == 0) {
    segs.push_back({0, d, bits_x2 / 2, nullptr});
  } else {
    const int lo = bits_x2 / 2, n_hi = (d + 1) / 2;
    segs.push_back({0, n_hi, lo + 1, nullptr});
    segs.push_back({n_hi, d - n_hi, lo, nullptr});
  }
  fast_ok = true;
  for (auto& s : segs) {
    s.cb = &get_codebook(d, s.bits, cfg.law);
    const int per = s.bits <= 4 ? 4 / s.bits : 1;
    for (int j = s.begin; j < s.begin + s.len; j += per)
      groups.push_back({j, std::min(per, s.begin + s.len - j), s.bits});
    if (s.bits > 4) fast_ok = false;
    s.voff = seg_bytes;
    seg_bytes += packed_bytes(static_cast<size_t>(s.len), s.bits);
  }
  m = groups.size();
  mp = (m + 3) / 4 * 4;
  int max_gb = 0;
  for (auto& g : groups) max_gb = std::max(max_gb, g.gbits());
  lut_stride = fast_ok ? 16 : (size_t{1} << max_gb);
  code_bytes = norm_bytes * (has_norm ? 2 : 1) + seg_bytes;
  if (cfg.rerank_bits > 0 && cfg.rerank_refine) {
    // Cell i of a segment's codebook: [b_{i-1}, b_i], the outer cells closed at twice their
    // inner half-width beyond the centroid (c_0 - 2 (b_0 - c_0), c_L + 2 (c_L - b_{L-1})). Refinement k of 2^B
    // reconstructs the middle of the k-th of 2^B equal parts.
    const int R = 1 << cfg.rerank_bits;
    for (const Segment& s : segs) {
      const std::vector<float>& c = s.cb->centroids;
      const std::vector<float>& b = s.cb->boundaries;
      const int L = static_cast<int>(c.size());
      std::vector<float> lo(L), wid(L), tab(static_cast<size_t>(L) * R);
      const float om = 2.f;  // outer cells: 1 lost recall on Fashion-MNIST, 2 and 4 did not (design.md)
      for (int i = 0; i < L; ++i) {
        const float a = i == 0 ? c[0] - om * (b[0] - c[0]) : b[i - 1];
        const float e = i == L - 1 ? c[L - 1] + om * (c[L - 1] - b[L - 2]) : b[i];
        lo[i] = a;
        wid[i] = e - a;
        for (int k = 0; k < R; ++k) tab[static_cast<size_t>(i) * R + k] = a + (e - a) * (k + 0.5f) / R;
      }
      rlo.push_back(std::move(lo));
      rwid.push_back(std::move(wid));
      rtab.push_back(std::move(tab));
    }
  } else if (cfg.rerank_bits > 0) {
    rcb = &get_codebook(d, cfg.rerank_bits, cfg.law);
  }
  if (cfg.rerank_bits > 0) {
    rbytes = packed_bytes(static_cast<size_t>(d), cfg.rerank_bits);
    code_bytes += norm_bytes + rbytes;  // the record carries the second stage: [scale][codes]
  }
  coarse_ok = fast_ok && d >= (ivf() ? kTwoLevelMinDimIvf : kTwoLevelMinDim) &&
              std::all_of(segs.begin(), segs.end(), [](const Segment& s) { return s.bits >= kTwoLevelMinBits; });
  lanes16 = coarse_ok;
  if (lanes16)
    for (const Segment& s : segs) {
      std::array<float, 16> c{};
      std::copy(s.cb->centroids.begin(), s.cb->centroids.end(), c.begin());
      cent16.push_back(c);
    }
  if (coarse_ok) {
    cm = (static_cast<size_t>(d) + 3) / 4;
    cmp = (cm + 3) / 4 * 4;
  }
}

void Index::Impl::derive(size_t from) {
  const bool plane = coarse_ok, l2t = has_l2term();
  if (!plane && !l2t) return;
  const float inv_sqrt_d = 1.f / std::sqrt(static_cast<float>(d));
  const float inv_sqrt_d1 = 1.f / std::sqrt(static_cast<float>(d - 1));
  const float mul = cfg.metric == Metric::l2 ? 2.f : 1.f;
  // Per segment: each index's squared centroid, |centroid| and centroid (derive_block's tables);
  // the top bit is the sign.
  std::vector<float> tabs(48 * segs.size(), 0.f);
  for (size_t sg = 0; sg < segs.size(); ++sg)
    for (size_t c = 0; c < segs[sg].cb->centroids.size(); ++c) {
      const float v = segs[sg].cb->centroids[c];
      tabs[48 * sg + c] = v * v;
      tabs[48 * sg + 16 + c] = std::fabs(v);
      tabs[48 * sg + 32 + c] = v;
    }
  const bool list_term = ivf();
  // Every channel as a digit of its group's code (groups never straddle segments), in channel order.
  std::vector<PlaneDigit> digits;
  digits.reserve(static_cast<size_t>(d));
  for (size_t g = 0, sg = 0; g < m; ++g) {
    const Group& gr = groups[g];
    while (gr.dim0 >= segs[sg].begin + segs[sg].len) ++sg;
    for (int u = 0; u < gr.ndims; ++u) {
      PlaneDigit pd;
      pd.row = static_cast<uint32_t>(g);
      pd.j = static_cast<uint32_t>(gr.dim0 + u);
      pd.sh = static_cast<uint8_t>(u * gr.bpd);
      pd.mask = static_cast<uint8_t>((1u << gr.bpd) - 1);
      pd.top = static_cast<uint8_t>(segs[sg].bits - 1);
      pd.tab = static_cast<uint8_t>(sg);
      digits.push_back(pd);
    }
  }
  // Whole blocks of 32 slots (derive_block); a block's slots before `from` are computed again,
  // to the same values.
  const size_t b0 = from / kBlock, b1 = (slots + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (size_t b = b0; b < b1; ++b) {
    thread_local std::vector<uint8_t> tr;
    const uint8_t* fb = fast_blocks(b, 1, tr);
    uint8_t* cb = plane ? cblocks.data() + b * cmp * 16 : nullptr;
    // ||c||^2, sum |c_j|; IVF: <Pi c_l, c> and <Pi c_l, sign(c)>
    float cc[kBlock] = {}, ca[kBlock] = {}, ct[kBlock] = {}, cu[kBlock] = {};
    // The rotated centroid of the block's list (IVF lists start on whole blocks).
    const float* rc = list_term ? rcentroids.data() + list_of(b * kBlock) * static_cast<size_t>(d) : nullptr;
    derive_block(fb, digits.size(), digits.data(), tabs.data(), rc, static_cast<size_t>(d), cc, ca, ct, cu, cb);
    for (size_t v = 0; v < kBlock && b * kBlock + v < slots; ++v) {
      const size_t i = b * kBlock + v;
      // l2's scan list term (padding slots keep their zero).
      if (l2t && ids[i] >= 0) l2term[i] = -2.f * scale[i] * ct[v];
      if (!plane) continue;
      const float a = cc[v] > 0 ? ca[v] * inv_sqrt_d / std::sqrt(cc[v]) : 0.f;  // cosine of c and its signs
      if (a > 0) {
        cA[i] = scale[i] * cc[v] / ca[v];
        cB[i] = mul * scale[i] * std::sqrt(cc[v]) * std::sqrt(std::max(0.f, 1.f - a * a)) / a * inv_sqrt_d1;
      } else {  // a zero code (no such codebook): always scored in full
        cA[i] = 0.f;
        cB[i] = std::numeric_limits<float>::max();
      }
      if (list_term) cL[i] = (mul == 1.f ? scale[i] * ct[v] : 0.f) - mul * cA[i] * cu[v];
    }
  }
}

uint8_t Index::Impl::refine_index(size_t sg, uint8_t c, float z) const noexcept {
  const int R = 1 << cfg.rerank_bits;
  const float w = rwid[sg][c];
  const float f = w > 0 ? (z - rlo[sg][c]) / w * static_cast<float>(R) : 0.f;
  if (!(f >= 0.f)) return 0;  // below the cell, or NaN
  return static_cast<uint8_t>(std::min(R - 1, static_cast<int>(f)));
}

void Index::Impl::get_indices(size_t i, uint8_t* idx) const noexcept {
  if (tc) {  // the code is the low bits of its table index
    const uint8_t mask = static_cast<uint8_t>((1u << tc->bits) - 1);
    const uint8_t* w = trellis_row(i);
    for (size_t j = 0; j < m; ++j) idx[j] = w[j * kTrellisBlock] & mask;
    return;
  }
  if (fast_ok && !vl()) {
    const uint8_t* base = fast_row(i);
    const int sh = fast_shift(i);
    for (size_t g = 0; g < m; ++g) {
      const Group& gr = groups[g];
      const uint8_t c = static_cast<uint8_t>((base[g * 16] >> sh) & 15);
      if (gr.ndims == 1) {
        idx[gr.dim0] = c;
        continue;
      }
      const uint8_t mask = static_cast<uint8_t>((1u << gr.bpd) - 1);
      for (int t = 0; t < gr.ndims; ++t) idx[gr.dim0 + t] = (c >> (t * gr.bpd)) & mask;
    }
    return;
  }
  if (vl()) {  // the row is the segments' packed codes
    for (const Segment& s : segs) unpack_bits(static_cast<size_t>(s.len), s.bits, vrow(i) + s.voff, idx + s.begin);
    return;
  }
  for (size_t g = 0; g < m; ++g) {
    const Group& gr = groups[g];
    const uint8_t c = group_code(i, g);
    const uint8_t mask = static_cast<uint8_t>((1u << gr.bpd) - 1);
    for (int t = 0; t < gr.ndims; ++t) idx[gr.dim0 + t] = (c >> (t * gr.bpd)) & mask;
  }
}

void Index::Impl::set_indices(size_t i, const uint8_t* idx) noexcept {
  if (tc) {
    uint8_t* w = trellis_row(i);
    for (size_t j = 0; j < m; ++j) w[j * kTrellisBlock] = static_cast<uint8_t>(tc->window(idx, static_cast<int>(j)));
    return;
  }
  if (vl()) {
    for (const Segment& s : segs) pack_bits(static_cast<size_t>(s.len), s.bits, idx + s.begin, vrow(i) + s.voff);
    return;
  }
  for (size_t g = 0; g < m; ++g) set_group_code(i, g, pack_group(idx, g));
}

void Index::Impl::resize(size_t n_new) {
  if (quant) {
    pcodes.resize(checked_mul(n_new, quant->code_bytes(), "index codes"), 0);
  } else if (fast_ok) {
    const size_t nb = (n_new + kBlock - 1) / kBlock;
    blocks.resize(checked_mul(nb, block_bytes(), "index blocks"), 0);
  } else if (tc) {
    const size_t nb = (n_new + kTrellisBlock - 1) / kTrellisBlock;
    gcodes.resize(checked_mul(checked_mul(nb, m, "index codes"), kTrellisBlock, "index codes"), 0);
  } else {
    gcodes.resize(checked_mul(n_new, m, "index codes"), 0);
  }
  // scale / norm are padded to whole blocks (zeros) for the block-wise scorer.
  const size_t padded = (n_new + pad_block() - 1) / pad_block() * pad_block();
  scale.resize(std::min(scale.size(), n_new));
  scale.resize(padded, 0.f);
  if (has_norm) {
    norm.resize(std::min(norm.size(), n_new));
    norm.resize(padded, 0.f);
  }
  ids.resize(n_new, 0);
  if (rbytes > 0) {
    rcodes.resize(checked_mul(n_new, rbytes, "rerank codes"), 0);
    rscale.resize(std::min(rscale.size(), n_new));
    rscale.resize(padded, 0.f);
  }
  if (cfg.keep_vectors) vectors.resize(checked_mul(n_new, static_cast<size_t>(d), "kept vectors"), 0.f);
  if (coarse_ok) {
    cblocks.resize((n_new + kBlock - 1) / kBlock * cmp * 16, 0);
    cA.resize(std::min(cA.size(), n_new));
    cA.resize(padded, 0.f);
    cB.resize(std::min(cB.size(), n_new));
    cB.resize(padded, 0.f);
    if (ivf()) cL.assign(padded, 0.f);  // all recomputed by derive
  }
  if (has_l2term()) l2term.assign(padded, 0.f);  // all recomputed by derive
  slots = n_new;
}

size_t Index::Impl::list_of(size_t s) const noexcept {
  // list_begin is non-decreasing; the list of s is the last l with list_begin[l] <= s.
  const auto it = std::upper_bound(list_begin.begin(), list_begin.end(), s);
  return static_cast<size_t>(it - list_begin.begin()) - 1;
}

void Index::Impl::set_centroids(std::vector<float> c) {
  const size_t L = static_cast<size_t>(cfg.nlist), dd = static_cast<size_t>(d);
  TQ_ASSERT(c.size() == L * dd);
  centroids = std::move(c);
  cnorm2.assign(L, 0.f);
  for (size_t l = 0; l < L; ++l) {
    double s2 = 0;
    for (size_t j = 0; j < dd; ++j) s2 += static_cast<double>(centroids[l * dd + j]) * centroids[l * dd + j];
    cnorm2[l] = static_cast<float>(s2);
  }
  rcentroids.resize(L * dd);
  rot->forward(L, centroids.data(), rcentroids.data());
}

void Index::Impl::relayout(size_t old_slots, size_t n_new, const uint32_t* assign) {
  const size_t L = static_cast<size_t>(cfg.nlist);
  std::vector<size_t> new_size(list_size), new_begin(L + 1, 0);
  for (size_t j = 0; j < n_new; ++j) ++new_size[assign[j]];
  for (size_t l = 0; l < L; ++l) {
    const size_t padded = (new_size[l] + kBlock - 1) / kBlock * kBlock;
    new_begin[l + 1] = checked_add(new_begin[l], padded, "IVF slots");
  }
  TQ_CHECK(new_begin[L] < (size_t{1} << 32), "index add: %zu IVF slots is more than 2^32 - 1", new_begin[L]);
  // Source slot of every destination slot: each list's slots in order, then the staged ones.
  std::vector<size_t> src(new_begin[L], SIZE_MAX);
  for (size_t l = 0; l < L; ++l)
    for (size_t r = 0; r < list_size[l]; ++r) src[new_begin[l] + r] = list_begin[l] + r;
  std::vector<size_t> fill(list_size);
  for (size_t j = 0; j < n_new; ++j) {
    const size_t l = assign[j];
    src[new_begin[l] + fill[l]++] = old_slots + j;
  }
  rebuild(src);
  list_begin.swap(new_begin);
  list_size.swap(new_size);
}

void Index::Impl::rebuild(const std::vector<size_t>& src) {
  const size_t dd = static_cast<size_t>(d);
  std::vector<uint8_t> old_blocks, old_gcodes, old_rcodes, old_pcodes;
  std::vector<float> old_scale, old_norm, old_vectors, old_rscale;
  std::vector<int64_t> old_ids;
  old_blocks.swap(blocks);
  old_gcodes.swap(gcodes);
  old_pcodes.swap(pcodes);
  old_scale.swap(scale);
  old_norm.swap(norm);
  old_ids.swap(ids);
  old_vectors.swap(vectors);
  old_rcodes.swap(rcodes);
  old_rscale.swap(rscale);
  resize(src.size());
  std::fill(ids.begin(), ids.end(), int64_t{-1});
  const size_t pcb = quant ? quant->code_bytes() : 0;
  // Chunks of 64 destination slots (whole fast-scan and trellis blocks): each written by one thread.
  const size_t chunk = 64, nc = (src.size() + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < nc; ++c) {
    for (size_t t = c * chunk; t < std::min(src.size(), (c + 1) * chunk); ++t) {
      const size_t s = src[t];
      if (s == SIZE_MAX) continue;
      if (quant) {
        std::memcpy(pcodes.data() + t * pcb, old_pcodes.data() + s * pcb, pcb);
      } else if (tc) {
        const uint8_t* w = old_gcodes.data() + (s / kTrellisBlock) * m * kTrellisBlock + s % kTrellisBlock;
        uint8_t* o = trellis_row(t);
        for (size_t j = 0; j < m; ++j) o[j * kTrellisBlock] = w[j * kTrellisBlock];
      } else if (vl()) {
        std::memcpy(blocks.data() + t * vbytes(), old_blocks.data() + s * vbytes(), vbytes());
      } else if (fast_ok) {
        for (size_t g = 0; g < m; ++g) {
          const uint8_t bb = old_blocks[(s / kBlock) * mp * 16 + g * 16 + (s % 16)];
          set_group_code(t, g, (s % kBlock) < 16 ? (bb & 15) : (bb >> 4));
        }
      } else {
        std::memcpy(gcodes.data() + t * m, old_gcodes.data() + s * m, m);
      }
      scale[t] = old_scale[s];
      if (has_norm) norm[t] = old_norm[s];
      if (rbytes > 0) {
        rscale[t] = old_rscale[s];
        std::memcpy(rcodes.data() + t * rbytes, old_rcodes.data() + s * rbytes, rbytes);
      }
      ids[t] = old_ids[s];
      if (cfg.keep_vectors) std::memcpy(vectors.data() + t * dd, old_vectors.data() + s * dd, dd * sizeof(float));
    }
  }
}

const uint8_t* Index::Impl::fast_blocks(size_t b, size_t nb, std::vector<uint8_t>& scratch) const {
  if (!vl()) return blocks.data() + b * mp * 16;
  const size_t fb = nb * mp * 16;  // the fast layout's bytes
  if (nibble_rows()) {
    scratch.resize(fb);
    vector_to_fast_layout(nb, mp, blocks.data() + b * block_bytes(), scratch.data());
    return scratch.data();
  }
  // Block by block, its rows widened to nibbles in the scratch past the fast layout (one
  // block's: mp * 16 bytes, in L1 when it is transposed).
  scratch.resize(fb + mp * 16);
  uint8_t* w = scratch.data() + fb;
  for (size_t k = 0; k < nb; ++k) {
    for (size_t v = 0; v < kBlock; ++v) nibble_row((b + k) * kBlock + v, w + v * (mp / 2));
    vector_to_fast_layout(1, mp, w, scratch.data() + k * mp * 16);
  }
  return scratch.data();
}

void Index::Impl::nibble_row(size_t i, uint8_t* out) const noexcept {
  std::fill(out, out + mp / 2, uint8_t{0});
  for (const Segment& s : segs) {
    const uint8_t* src = vrow(i) + s.voff;
    const size_t len = static_cast<size_t>(s.len), b = static_cast<size_t>(s.begin);
    if (b % 2 == 0 && s.bits == 4) {
      std::memcpy(out + b / 2, src, (len + 1) / 2);
    } else if (b % 2 == 0 && s.bits == 3) {
      bits3_to_nibbles(len, src, out + b / 2);
    } else {  // a segment from an odd channel (after an odd-length one, whose last high nibble is 0)
      for (size_t t = 0; t < len; ++t)
        out[(b + t) / 2] |=
            static_cast<uint8_t>(read_code(src, t * static_cast<size_t>(s.bits), s.bits) << (((b + t) & 1) * 4));
    }
  }
}

float Index::Impl::round_norm(float v) const noexcept {
  return cfg.norm == NormFormat::f16 ? fp16_to_fp32(fp32_to_fp16(v)) : v;
}

// ---------------------------------------------------------------------------------------
// Index: construction, add

Index::Index(const IndexConfig& cfg) : impl_(std::make_unique<Impl>(cfg)) {}
Index::~Index() = default;
Index::Index(Index&&) noexcept = default;
Index& Index::operator=(Index&&) noexcept = default;

const IndexConfig& Index::config() const noexcept { return impl_->cfg; }
int Index::dim() const noexcept { return impl_->d; }
size_t Index::size() const noexcept { return impl_->n; }
size_t Index::code_bytes() const noexcept { return impl_->code_bytes; }

int Index::nlist() const noexcept { return impl_->cfg.nlist; }
size_t Index::list_size(int l) const {
  TQ_CHECK(impl_->ivf() && l >= 0 && l < impl_->cfg.nlist, "index: list %d outside [0, %d)", l, impl_->cfg.nlist);
  return impl_->list_size[static_cast<size_t>(l)];
}

void Index::release_sign_plane() {
  Impl& I = *impl_;
  if (!I.coarse_ok) return;
  std::vector<uint8_t> fast;  // back to the fast layout (3-bit channels: a nibble each)
  I.fast_blocks(0, I.blocks.size() / I.block_bytes(), fast);
  fast.resize(I.blocks.size() / I.block_bytes() * I.mp * 16);  // less fast_blocks' one block of nibble rows
  fast.shrink_to_fit();
  I.blocks.swap(fast);
  I.coarse_ok = false;  // and so the vector layout
  std::vector<uint8_t>().swap(I.cblocks);
  std::vector<float>().swap(I.cA);
  std::vector<float>().swap(I.cB);
  std::vector<float>().swap(I.cL);
}

bool Index::has_sign_plane() const noexcept { return impl_->coarse_ok; }

double Index::memory_bytes_per_vector() const noexcept {
  const Impl& I = *impl_;
  double b = 0;
  if (I.quant) b += static_cast<double>(I.quant->code_bytes());
  else if (I.fast_ok) b += static_cast<double>(I.vl() ? I.vbytes() : I.mp * 16 / kBlock);
  else b += static_cast<double>(I.m);
  b += 4.0 + (I.has_norm ? 4.0 : 0.0) + 8.0;  // scale, norm, id
  if (I.rbytes > 0) b += static_cast<double>(I.rbytes) + 4.0;  // second-stage code and its scale
  if (I.coarse_ok) b += static_cast<double>(I.cmp) * 16.0 / kBlock + 8.0;  // sign plane and its factors
  if (!I.cL.empty()) b += 4.0;                                             // and the list term (IVF)
  if (!I.l2term.empty()) b += 4.0;                                         // the l2 scan's list term (IVF)
  if (I.cfg.keep_vectors) b += 4.0 * I.d;
  if (!I.ivf() || I.n == 0) return b;
  // IVF: per slot (lists padded to whole blocks) plus the centroid tables, per vector.
  const double L = I.cfg.nlist;
  const double tables = L * I.d * 8.0 + L * 4.0 + (2 * L + 1) * 8.0;  // centroids, rotated, norms, lists
  return (b * static_cast<double>(I.slots) + tables) / static_cast<double>(I.n);
}

std::string Index::describe() const {
  const Impl& I = *impl_;
  const std::string ivf = !I.ivf() ? std::string()
                         : I.rbytes > 0 ? strprintf(I.cfg.rerank_refine ? "ivf%d+refine%db " : "ivf%d+rerank%db ",
                                                    I.cfg.nlist, I.cfg.rerank_bits)
                                        : strprintf("ivf%d ", I.cfg.nlist);
  return strprintf("%s%s %g bits %s %s%s%s%s %s %s%s", ivf.c_str(),
                   quantizer_kind_name(I.cfg.codec), I.bits_x2 / 2.0,
                   rotation_name(I.cfg.rotation).c_str(),
                   I.quant ? "-" : scale_mode_name(I.cfg.scale), I.cfg.fit_scale ? "+fit" : "",
                   I.cfg.center ? "+center" : "", I.tc ? " trellis" : "",
                   I.cfg.norm == NormFormat::f16 ? "f16" : "f32", metric_name(I.cfg.metric),
                   I.fast_ok ? " fast-scan" : "");
}

std::string Index::describe_search(const SearchParams& p) const {
  const Impl& I = *impl_;
  std::string s = describe();
  const std::string fs = " fast-scan";
  if (I.fast_ok && s.size() >= fs.size() && s.compare(s.size() - fs.size(), fs.size(), fs) == 0)
    s.resize(s.size() - fs.size());
  s += I.fast_ok && p.fast_scan && !I.quant ? fs
       : I.tc && p.fast_scan                 ? std::string(" trellis-scan")
                                             : std::string(I.quant ? "" : " float-lut");
  if (two_level_search(I, p)) s += " two-level";
  if (I.ivf()) s += strprintf(" nprobe %d", p.nprobe);
  return s;
}

double sqnorm(int d, const float* x) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int j = 0;
  for (; j + 8 <= d; j += 8)
    for (int t = 0; t < 8; ++t) acc[t] += x[j + t] * x[j + t];
  double s = 0;
  for (; j < d; ++j) s += static_cast<double>(x[j]) * x[j];
  for (int t = 0; t < 8; ++t) s += acc[t];
  if (s < 0x1p-100) {  // squares may have underflowed in float: again in double
    s = 0;
    for (j = 0; j < d; ++j) s += static_cast<double>(x[j]) * x[j];
  }
  return s;
}

namespace {
constexpr double kMaxInputSq = kMaxInputNorm * kMaxInputNorm;
constexpr double kMinInputSq = kMinInputNorm * kMinInputNorm;
// A row's sum of squares an index takes: 0, or a norm in [2^-100, 2^62] (false for NaN).
bool input_sq_ok(double s2) { return s2 == 0 || (s2 >= kMinInputSq && s2 <= kMaxInputSq); }
}  // namespace

void check_rows(size_t n, int d, const float* x, const char* what) {
  for (size_t i = 0; i < n; ++i) {
    const float* r = x + i * static_cast<size_t>(d);
    if (input_sq_ok(sqnorm(d, r))) continue;
    for (int j = 0; j < d; ++j)
      TQ_CHECK(std::isfinite(r[j]), "%s: vector %zu, component %d is %s", what, i, j, std::isnan(r[j]) ? "NaN" : "Inf");
    double e = 0;  // the norm in double (the float partial sums of sqnorm may have overflowed)
    for (int j = 0; j < d; ++j) e += static_cast<double>(r[j]) * r[j];
    TQ_CHECK(e <= kMaxInputSq,
             "%s: vector %zu has norm %.3g, above the 2^62 (%.3g) an index takes (scores would overflow float)", what,
             i, std::sqrt(e), kMaxInputNorm);
    TQ_CHECK(false,
             "%s: vector %zu has norm %.3g, below the 2^-100 (%.3g) an index takes for a nonzero vector (its unit "
             "vector would overflow float)",
             what, i, std::sqrt(e), kMinInputNorm);
  }
}

namespace {

// The per-vector grid fit (fit_scale) tries the grid scales 0.80, 0.85, ..., 1.20 of the
// rotated unit vector: t = 1 (the plain code) and these kFitScales others, in this order.
constexpr int kFitScales = 8;
float fit_scale_of(int k) { return 0.80f + 0.05f * static_cast<float>(k < 4 ? k : k + 1); }

// Norms of the n rows of x (in parallel); throws naming the vector (what: the caller, e.g.
// "index add") for a NaN/Inf component or a nonzero norm outside [2^-100, 2^62].
std::vector<float> row_norms(int d, size_t n, const float* x, const char* what) {
  std::vector<float> norms(n);
  bool bad = false;
#pragma omp parallel for schedule(static) reduction(|| : bad)
  for (size_t i = 0; i < n; ++i) {
    const double s2 = sqnorm(d, x + i * static_cast<size_t>(d));
    bad |= !input_sq_ok(s2);
    norms[i] = static_cast<float>(std::sqrt(s2));
  }
  if (bad) check_rows(n, d, x, what);  // throws
  return norms;
}

// The center option's mean of the rows of x (unit rows for cosine), accumulated in double.
std::vector<float> fit_center(int d, size_t n, const float* x, const float* norms, bool cosine) {
  std::vector<double> mean(static_cast<size_t>(d), 0.0);
  for (size_t i = 0; i < n; ++i) {
    const float* xr = x + i * static_cast<size_t>(d);
    const double inv = cosine ? (norms[i] > 0 ? 1.0 / norms[i] : 0.0) : 1.0;
    for (int j = 0; j < d; ++j) mean[j] += xr[j] * inv;
  }
  std::vector<float> c(static_cast<size_t>(d));
  for (int j = 0; j < d; ++j) c[j] = static_cast<float>(mean[j] / static_cast<double>(n));
  return c;
}

}  // namespace

void Index::train(size_t n, const float* x) {
  Impl& I = *impl_;
  TQ_CHECK(!I.ivf(), "index train: an IVF index trains its k-means in its first add()");
  TQ_CHECK(I.n == 0, "index train: the index already holds %zu vectors", I.n);
  TQ_CHECK(I.center.empty(), "index train: the index is already trained");
  TQ_CHECK(n > 0, "index train: no vectors");
  TQ_CHECK(x != nullptr, "index train: null data");
  const std::vector<float> norms = row_norms(I.d, n, x, "index train");
  if (I.cfg.center) I.center = fit_center(I.d, n, x, norms.data(), I.cfg.metric == Metric::cosine);
}

const std::vector<float>& Index::center() const noexcept { return impl_->center; }

void Index::set_center(const float* mean) {
  Impl& I = *impl_;
  TQ_CHECK(I.cfg.center, "index set_center: the index was built without the center option");
  TQ_CHECK(I.n == 0, "index set_center: the index already holds %zu vectors", I.n);
  TQ_CHECK(mean != nullptr, "index set_center: null data");
  check_rows(1, I.d, mean, "index set_center");
  I.center.assign(mean, mean + I.d);
}

void Index::add(size_t n, const float* x, const int64_t* ids) { add(n, x, ids, AddProgress{}); }

void Index::add(size_t n, const float* x, const int64_t* ids, const AddProgress& progress) {
  Impl& I = *impl_;
  if (n == 0) return;
  TQ_CHECK(x != nullptr, "index add: null data");
  const std::vector<float> norms = row_norms(I.d, n, x, "index add");
  const int64_t first_id = ids ? 0 : next_id();
  TQ_CHECK(ids || first_id <= 0 || static_cast<uint64_t>(INT64_MAX - first_id) >= n - 1,
           "index add: default ids from %lld for %zu vectors pass INT64_MAX; pass ids",
           static_cast<long long>(first_id), n);
  // Encoding goes to the storage slots [n0, n1); a flat index has slots == n, an IVF index
  // stages the new vectors after its lists and moves them into their lists at the end.
  const size_t n0 = I.slots;
  const size_t n1 = checked_add(n0, n, "index size");
  TQ_CHECK(n1 < (size_t{1} << 32), "index add: %zu vectors is more than the supported 2^32 - 1", n1);
  const bool cosine_m = I.cfg.metric == Metric::cosine;
  std::vector<uint32_t> assign;  // IVF: list of each new vector
  const bool trained_here = I.ivf() && I.centroids.empty();
  const bool fitted_here = I.cfg.center && I.center.empty();
  // Puts the index back as it was before this add (storage, the fits made here).
  auto undo = [&] {
    I.resize(n0);
    if (fitted_here) I.center.clear();
    if (trained_here) {
      I.centroids.clear();
      I.rcentroids.clear();
      I.cnorm2.clear();
    }
  };
  // The caller's progress, called on this thread only. An exception from it stops the add:
  // the stages skip their remaining work, undo() runs and the exception is rethrown.
  std::exception_ptr stopped;
  std::atomic<bool> stop{false};
  auto report = [&](const char* stage, size_t done, size_t total) {
    if (!progress) return true;
    if (stopped) return false;
    try {
      progress(stage, done, total);
      return true;
    } catch (...) {
      stopped = std::current_exception();
      stop.store(true, std::memory_order_relaxed);
      return false;
    }
  };
  auto rethrow_if_stopped = [&] {
    if (!stopped) return;
    undo();
    std::rethrow_exception(stopped);
  };
  if (I.ivf()) {
    // Vectors as clustered: unit vectors for cosine, raw otherwise.
    std::vector<float> xc;
    const float* xa = x;
    if (cosine_m) {
      xc.resize(checked_mul(n, static_cast<size_t>(I.d), "IVF add"));
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < n; ++i) {
        const float inv = norms[i] > 0 ? 1.f / norms[i] : 0.f;
        for (int j = 0; j < I.d; ++j) xc[i * I.d + j] = x[i * I.d + j] * inv;
      }
      xa = xc.data();
    }
    if (trained_here) {
      std::function<bool(size_t, size_t)> kmeans_rows;
      if (progress) kmeans_rows = [&](size_t done, size_t total) { return report("k-means", done, total); };
      std::vector<float> c = kmeans(n, I.d, xa, I.cfg.nlist, I.cfg.kmeans_iters, I.cfg.seed, kmeans_rows);
      rethrow_if_stopped();
      if (I.cfg.ivf_list_mean) {
        // Reference = mean of the members actually assigned (empty lists keep the centroid).
        std::vector<float> cn2(static_cast<size_t>(I.cfg.nlist));
        for (int l = 0; l < I.cfg.nlist; ++l) {
          double s2 = 0;
          for (int j = 0; j < I.d; ++j) s2 += static_cast<double>(c[l * I.d + j]) * c[l * I.d + j];
          cn2[l] = static_cast<float>(s2);
        }
        std::vector<uint32_t> a(n);
        nearest_centroids(n, I.d, xa, I.cfg.nlist, c.data(), cn2.data(), a.data(), nullptr);
        std::vector<double> sum(c.size(), 0.0);
        std::vector<size_t> cnt(static_cast<size_t>(I.cfg.nlist), 0);
        for (size_t i = 0; i < n; ++i) {
          ++cnt[a[i]];
          for (int j = 0; j < I.d; ++j) sum[a[i] * I.d + j] += xa[i * I.d + j];
        }
        for (int l = 0; l < I.cfg.nlist; ++l)
          if (cnt[l] > 0)
            for (int j = 0; j < I.d; ++j) c[l * I.d + j] = static_cast<float>(sum[l * I.d + j] / cnt[l]);
      }
      I.set_centroids(std::move(c));
    }
    assign.resize(n);
    std::function<bool(size_t)> assign_rows;
    if (progress) assign_rows = [&](size_t done) { return report("assign", done, n); };
    nearest_centroids(n, I.d, xa, I.cfg.nlist, I.centroids.data(), I.cnorm2.data(), assign.data(), nullptr,
                      assign_rows);
    rethrow_if_stopped();
  }
  if (fitted_here) I.center = fit_center(I.d, n, x, norms.data(), cosine_m);
  I.resize(n1);
  const size_t d = static_cast<size_t>(I.d);
  const bool cosine = I.cfg.metric == Metric::cosine;
  bool overflow = false;

  // Chunks aligned to absolute multiples of 256 so that two threads never share a block.
  const size_t kChunk = 256;
  const size_t first = n0 / kChunk;
  const size_t last = (n1 + kChunk - 1) / kChunk;
  std::atomic<size_t> taken{0};  // vectors whose chunk a thread has started (progress)
#pragma omp parallel reduction(|| : overflow)
  {
    std::vector<float> u(kChunk * d), y(kChunk * d), nrm(kChunk), lens(kChunk), cvals(d), ty(d), tc(kFitScales * d);
    std::vector<uint8_t> idx(d), cidx(kChunk * d), gc(kBlock * I.m), tidx(kFitScales * d), ridx(I.rbytes > 0 ? d : 0);
#pragma omp for schedule(dynamic, 1)
    for (size_t c = first; c < last; ++c) {
      const size_t i0 = std::max(n0, c * kChunk), i1 = std::min(n1, (c + 1) * kChunk);
      const size_t cnt = i1 - i0;
      if (stop.load(std::memory_order_relaxed)) continue;
      if (omp_get_thread_num() == 0 && !report("encode", taken.load(std::memory_order_relaxed), n)) continue;
      taken.fetch_add(cnt, std::memory_order_relaxed);
      for (size_t r = 0; r < cnt; ++r) {
        const float* xr = x + (i0 + r - n0) * d;
        const double s = norms[i0 + r - n0];
        nrm[r] = static_cast<float>(s);
        const float inv = s > 0 ? static_cast<float>(1.0 / s) : 0.f;
        for (size_t j = 0; j < d; ++j) u[r * d + j] = xr[j] * inv;
        if (I.cfg.keep_vectors) {
          float* kv = I.vectors.data() + (i0 + r) * d;
          if (cosine) std::memcpy(kv, u.data() + r * d, d * sizeof(float));
          else std::memcpy(kv, xr, d * sizeof(float));
        }
        // Length carried by the scale: ||x|| (ip, l2), 1 or 0 (cosine), ||w - mean|| centred.
        lens[r] = cosine ? (s > 0 ? 1.f : 0.f) : static_cast<float>(s);
        const float* cen = I.ivf() ? I.centroids.data() + assign[i0 + r - n0] * d
                                   : (I.center.empty() ? nullptr : I.center.data());
        if (cen) {
          float* ur = u.data() + r * d;
          double l2s = 0;
          for (size_t j = 0; j < d; ++j) {
            const float w = (cosine ? ur[j] : xr[j]) - cen[j];
            ur[j] = w;
            l2s += static_cast<double>(w) * w;
          }
          const double len = std::sqrt(l2s);
          const float li = len > 0 ? static_cast<float>(1.0 / len) : 0.f;
          for (size_t j = 0; j < d; ++j) ur[j] *= li;
          lens[r] = static_cast<float>(len);
        }
      }
      if (I.quant) {
        // prod: the quantizer normalises itself; cosine encodes the unit vector.
        std::vector<float> src(cnt * d);
        for (size_t r = 0; r < cnt; ++r) {
          const float* xr = x + (i0 + r - n0) * d;
          std::memcpy(src.data() + r * d, cosine ? u.data() + r * d : xr, d * sizeof(float));
        }
        I.quant->encode(cnt, src.data(), I.pcodes.data() + i0 * I.quant->code_bytes());
        for (size_t r = 0; r < cnt; ++r) {
          I.scale[i0 + r] = 1.f;
          if (I.has_norm) {
            I.norm[i0 + r] = I.round_norm(nrm[r]);
            overflow |= !std::isfinite(I.norm[i0 + r]);
          }
        }
        continue;
      }
      I.rot->forward(cnt, u.data(), y.data());
      // Codes of the rotated values v (d) and their reconstruction: nearest centroids per
      // segment, or the trellis path (Viterbi) and its table values.
      // t: the grid scale (the codes of the float products t * v[j]).
      auto code_of = [&](const float* v, float t, uint8_t* codes, float* vals) {
        if (I.tc) {
          const float* tv = v;
          if (t != 1.f) {
            for (size_t j = 0; j < d; ++j) ty[j] = t * v[j];
            tv = ty.data();
          }
          trellis_encode(*I.tc, tv, codes);
          trellis_decode(*I.tc, codes, vals);
          return;
        }
        for (const Segment& s : I.segs) {
          quantize_rotated(*s.cb, static_cast<size_t>(s.len), v + s.begin, codes + s.begin, t);
          const float* cent = s.cb->centroids.data();
          for (int j = s.begin; j < s.begin + s.len; ++j) vals[j] = cent[codes[j]];
        }
      };
      for (size_t r = 0; r < cnt; ++r) {
        const float* yr = y.data() + r * d;
        uint8_t* ir = cidx.data() + r * d;
        code_of(yr, 1.f, ir, cvals.data());
        float tbest = 1.f;  // the grid scale the first code was chosen at (fit_scale)
        if (I.cfg.fit_scale) {
          // Best cosine(y, c) over grid scales t (t = 1 is the plain nearest-centroid code):
          // the codes at the 8 other scales, then their cosines, whose sums run side by side
          // (each in its own order over j, as one at a time would: the same floats, without
          // one long chain of dependent adds per scale), then the first best in scale order.
          for (int k = 0; k < kFitScales; ++k) {
            code_of(yr, fit_scale_of(k), tidx.data() + k * d, tc.data() + k * d);
          }
          float cc[1 + kFitScales] = {}, yc[1 + kFitScales] = {};
          for (size_t j = 0; j < d; ++j) {
            const float yj = yr[j];
            cc[0] += cvals[j] * cvals[j];
            yc[0] += cvals[j] * yj;
            for (int k = 0; k < kFitScales; ++k) {
              const float v = tc[k * d + j];
              cc[1 + k] += v * v;
              yc[1 + k] += v * yj;
            }
          }
          auto cosine = [&](int k) { return cc[k] > 0 ? yc[k] / std::sqrt(cc[k]) : -1.f; };
          float best = cosine(0);
          int kbest = -1;
          for (int k = 0; k < kFitScales; ++k) {
            const float cs = cosine(1 + k);
            if (cs > best) best = cs, kbest = k;
          }
          if (kbest >= 0) {
            tbest = fit_scale_of(kbest);
            std::memcpy(ir, tidx.data() + kbest * d, d);
            std::memcpy(cvals.data(), tc.data() + kbest * d, d * sizeof(float));
          }
        }
        float cc = 0, yc = 0;  // ||c||^2 and <y, c>
        for (size_t j = 0; j < d; ++j) {
          cc += cvals[j] * cvals[j];
          yc += cvals[j] * yr[j];
        }
        const double len = lens[r];
        // The scale of a code with ||c||^2 = cc and <y, c> = yc, by the scale mode.
        auto scale_of = [&](float cc_, float yc_) {
          double sc = len;
          if (len > 0) {
            switch (I.cfg.scale) {
              case ScaleMode::plain: sc = len; break;
              case ScaleMode::corrected: sc = cc_ > 0 ? len / std::sqrt(static_cast<double>(cc_)) : len; break;
              case ScaleMode::eden:
                sc = yc_ > 1e-6f ? len / yc_ : (cc_ > 0 ? len / std::sqrt(static_cast<double>(cc_)) : len);
                break;
              case ScaleMode::lsq: sc = cc_ > 0 ? len * yc_ / cc_ : len; break;
            }
          }
          return sc;
        };
        const size_t i = i0 + r;
        I.scale[i] = I.round_norm(static_cast<float>(scale_of(cc, yc)));
        overflow |= !std::isfinite(I.scale[i]);
        if (I.rbytes > 0) {
          float cc2 = 0, yc2 = 0;
          if (I.cfg.rerank_refine) {
            // Refining second stage: where t y_j lies inside the cell of its first index, in
            // 2^B equal parts; reconstruction and scale from first and second index together.
            const int B = I.cfg.rerank_bits;
            for (size_t sg = 0; sg < I.segs.size(); ++sg) {
              const Segment& s = I.segs[sg];
              const float* tab = I.rtab[sg].data();
              for (int j = s.begin; j < s.begin + s.len; ++j) {
                ridx[j] = I.refine_index(sg, ir[j], tbest * yr[j]);
                const float c = tab[(static_cast<size_t>(ir[j]) << B) | ridx[j]];
                cc2 += c * c;
                yc2 += c * yr[j];
              }
            }
          } else {
            // Independent second stage: the nearest-centroid code of the same rotated unit
            // residual at rerank_bits bits, with its own scale.
            quantize_rotated(*I.rcb, d, yr, ridx.data());
            const float* cent = I.rcb->centroids.data();
            for (size_t j = 0; j < d; ++j) {
              const float c = cent[ridx[j]];
              cc2 += c * c;
              yc2 += c * yr[j];
            }
          }
          I.rscale[i] = I.round_norm(static_cast<float>(scale_of(cc2, yc2)));
          overflow |= !std::isfinite(I.rscale[i]);
          pack_bits(d, I.cfg.rerank_bits, ridx.data(), I.rcodes.data() + i * I.rbytes);
        }
        if (I.has_norm) {
          I.norm[i] = I.round_norm(lens[r]);
          overflow |= !std::isfinite(I.norm[i]);
        }
      }
      // Codes. Fast or vector layout: whole fresh blocks (no earlier vector in them) are written
      // at once from the chunk's group codes (write_block); a block shared with vectors of an
      // earlier add() is updated nibble by nibble.
      size_t r = 0;
      while (r < cnt) {
        const size_t i = i0 + r;
        if (!I.fast_ok || i % kBlock != 0) {
          I.set_indices(i, cidx.data() + r * d);
          ++r;
          continue;
        }
        const size_t nv = std::min(kBlock, cnt - r);
        std::fill(gc.begin(), gc.end(), uint8_t{0});
        for (size_t v = 0; v < nv; ++v)
          for (size_t g = 0; g < I.m; ++g) gc[v * I.m + g] = I.pack_group(cidx.data() + (r + v) * d, g);
        I.write_block(i, gc.data());
        r += nv;
      }
    }
  }
  report("encode", n, n);
  rethrow_if_stopped();
  if (overflow) {
    undo();
    TQ_CHECK(false, "index add: a vector norm overflows the f16 norm format; use norm f32");
  }
  for (size_t r = 0; r < n; ++r) I.ids[n0 + r] = ids ? ids[r] : first_id + static_cast<int64_t>(r);
  if (I.ivf()) I.relayout(n0, n, assign.data());
  I.n += n;
  I.derive(I.ivf() ? 0 : n0);  // an IVF add moves every slot
}

std::vector<int64_t> Index::ids() const {
  const Impl& I = *impl_;
  if (!I.ivf()) return {I.ids.begin(), I.ids.begin() + static_cast<std::ptrdiff_t>(I.n)};
  std::vector<int64_t> out;
  out.reserve(I.n);
  for (size_t l = 0; l < I.list_size.size(); ++l) {
    const auto b = I.ids.begin() + static_cast<std::ptrdiff_t>(I.list_begin[l]);
    out.insert(out.end(), b, b + static_cast<std::ptrdiff_t>(I.list_size[l]));
  }
  return out;
}

int64_t Index::next_id() const {
  if (impl_->n == 0) return 0;
  const std::vector<int64_t> held = ids();
  const int64_t mx = *std::max_element(held.begin(), held.end());
  TQ_CHECK(mx < INT64_MAX, "index add: the index holds id INT64_MAX, so there is no next id; pass ids");
  return mx + 1;
}

size_t Index::remove_ids(size_t n, const int64_t* ids) {
  Impl& I = *impl_;
  if (n == 0) return 0;
  TQ_CHECK(ids != nullptr, "index remove_ids: null ids");
  std::vector<int64_t> gone(ids, ids + n);
  std::sort(gone.begin(), gone.end());
  gone.erase(std::unique(gone.begin(), gone.end()), gone.end());
  auto kept = [&](size_t s) { return !std::binary_search(gone.begin(), gone.end(), I.ids[s]); };
  // The kept slots in order, as the source of the new storage: a flat index's one after the
  // other, an IVF index's list by list, each list padded to whole blocks again.
  std::vector<size_t> src;
  src.reserve(I.n);
  size_t nk = 0;  // vectors kept
  if (I.ivf()) {
    const size_t L = I.list_size.size();
    std::vector<size_t> new_size(L, 0), new_begin(L + 1, 0);
    for (size_t l = 0; l < L; ++l) {
      for (size_t r = 0; r < I.list_size[l]; ++r)
        if (kept(I.list_begin[l] + r)) src.push_back(I.list_begin[l] + r);
      new_size[l] = src.size() - new_begin[l];
      new_begin[l + 1] = (src.size() + kBlock - 1) / kBlock * kBlock;
      src.resize(new_begin[l + 1], SIZE_MAX);
    }
    nk = std::accumulate(new_size.begin(), new_size.end(), size_t{0});
    if (nk == I.n) return 0;
    I.rebuild(src);
    I.list_begin.swap(new_begin);
    I.list_size.swap(new_size);
  } else {
    for (size_t s = 0; s < I.n; ++s)
      if (kept(s)) src.push_back(s);
    nk = src.size();
    if (nk == I.n) return 0;
    I.rebuild(src);
  }
  const size_t count = I.n - nk;
  I.n = nk;
  I.derive(0);
  return count;
}

// ---------------------------------------------------------------------------------------
// Search

namespace {
std::atomic<int> g_ivf_scan_order{0};
std::atomic<float> g_two_level_eps{0.f};

}  // namespace

// Whether a search with p runs in two levels (sharded candidates aside): the index keeps the
// sign plane (a flat fast-layout index, so p.fast_scan means the uint8 scan) and p allows it.
bool two_level_search(const Index::Impl& I, const SearchParams& p) noexcept {
  return I.coarse_ok && p.fast_scan && p.two_level != 0;
}

void set_two_level_eps(float eps) noexcept { g_two_level_eps.store(eps); }
float two_level_eps() noexcept {
  const float e = g_two_level_eps.load();
  return e > 0 ? e : kTwoLevelEps;
}

void set_ivf_scan_order(IvfScanOrder o) noexcept { g_ivf_scan_order.store(static_cast<int>(o)); }
IvfScanOrder ivf_scan_order() noexcept { return static_cast<IvfScanOrder>(g_ivf_scan_order.load()); }

namespace {

// Internal score of vector i, higher is better: ip/cosine: scale * dot; l2: 2 scale dot - ||x||^2.
float internal_score(const Index::Impl& I, bool l2, size_t i, float dot) {
  const float s = I.scale[i] * dot;
  return l2 ? 2.f * s - I.norm[i] * I.norm[i] : s;
}

// Exact float-LUT score of vector i, four partial sums (lanes16: sixteen, as exact_code_score).
// Fast layout: the vector's codes are one nibble every 16 bytes of its block.
float exact_lut_score(const Index::Impl& I, const float* lut, size_t i) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  const size_t m = I.m, st = I.lut_stride;
  size_t g = 0;
  if (I.tc) {
    const uint8_t* w = I.trellis_row(i);
    constexpr size_t B = Index::Impl::kTrellisBlock;
    for (; g + 4 <= m; g += 4) {
      s0 += lut[g * 256 + w[g * B]];
      s1 += lut[(g + 1) * 256 + w[(g + 1) * B]];
      s2 += lut[(g + 2) * 256 + w[(g + 2) * B]];
      s3 += lut[(g + 3) * 256 + w[(g + 3) * B]];
    }
    for (; g < m; ++g) s0 += lut[g * 256 + w[g * B]];
  } else if (I.lanes16) {  // 16 partial sums, as exact_code_score, in either layout
    float lanes[16] = {};
    if (I.vl()) {
      const uint8_t* p = I.vrow(i);
      for (const Segment& s : I.segs) {
        size_t bit = s.voff * 8;
        for (g = static_cast<size_t>(s.begin); g < static_cast<size_t>(s.begin + s.len); ++g, bit += s.bits)
          lanes[g % 16] += lut[g * 16 + read_code(p, bit, s.bits)];
      }
    } else {
      const uint8_t* p = I.fast_row(i);
      const int sh = I.fast_shift(i);
      for (; g < m; ++g) lanes[g % 16] += lut[g * 16 + ((p[g * 16] >> sh) & 15)];
    }
    return reduce_lanes16(lanes);
  } else if (I.fast_ok) {
    const uint8_t* p = I.fast_row(i);
    const int sh = I.fast_shift(i);
    for (; g + 4 <= m; g += 4) {
      s0 += lut[g * 16 + ((p[g * 16] >> sh) & 15)];
      s1 += lut[(g + 1) * 16 + ((p[(g + 1) * 16] >> sh) & 15)];
      s2 += lut[(g + 2) * 16 + ((p[(g + 2) * 16] >> sh) & 15)];
      s3 += lut[(g + 3) * 16 + ((p[(g + 3) * 16] >> sh) & 15)];
    }
    for (; g < m; ++g) s0 += lut[g * 16 + ((p[g * 16] >> sh) & 15)];
  } else {
    const uint8_t* c = I.gcodes.data() + i * m;
    for (; g + 4 <= m; g += 4) {
      s0 += lut[g * st + c[g]];
      s1 += lut[(g + 1) * st + c[g + 1]];
      s2 += lut[(g + 2) * st + c[g + 2]];
      s3 += lut[(g + 3) * st + c[g + 3]];
    }
    for (; g < m; ++g) s0 += lut[g * st + c[g]];
  }
  return (s0 + s1) + (s2 + s3);
}

// The score exact_lut_score gives slot i with the float tables build_luts makes of y, computed
// from y and the codebooks instead: for an index with a sign plane (coarse_ok: the vector
// layout, one channel of 3 or 4 bits a group, so group g is channel g). Table entry c of group g
// is 0 + y_g cent[c], the product itself (a -0 product as +0, which adds alike to a partial sum
// started at +0), and both sum channel g into partial sum g % 16 in increasing g, then add the
// 16 alike (code_dot_lanes, reduce_lanes16): the same float, with no tables to build per query,
// y and the codebooks in L1 instead of d * 16 floats of tables, and 16 channels a step.
float exact_code_score(const Index::Impl& I, const float* y, size_t i) {
  const uint8_t* p = I.vrow(i);
  alignas(64) float lanes[16] = {};
  for (size_t sg = 0; sg < I.segs.size(); ++sg) {
    const Segment& s = I.segs[sg];
    code_dot_lanes(static_cast<size_t>(s.begin), static_cast<size_t>(s.begin + s.len), s.bits, y, p + s.voff,
                   I.cent16[sg].data(), lanes);
  }
  return reduce_lanes16(lanes);
}

// Float LUTs of a rotated query y: lut[g][code] = sum_t y[dim0 + t] * cent[(code >> t bpd) & mask]
// (m * lut_stride floats; trellis codes: lut[j][w] = y[j] * tc->lut[w]). q8 != nullptr (fast
// layout or trellis scan): also the uint8 LUTs (mp * lut_stride bytes), per-group minimum as
// bias, one step for all groups: dot ~= *bias + *delta * sum q8.
void build_luts(const Index::Impl& I, const float* y, float* lut, uint8_t* q8, float* bias, float* delta) {
  if (I.tc) {  // trellis: channel j's table index w reconstructs tc->lut[w]
    const size_t st = I.lut_stride;
    const float* tl = I.tc->lut.data();
    for (size_t j = 0; j < I.m; ++j)
      for (size_t w = 0; w < st; ++w) lut[j * st + w] = y[j] * tl[w];
  } else {
    size_t g = 0;
    for (const Segment& s : I.segs) {
      const float* cent = s.cb->centroids.data();
      for (; g < I.m && I.groups[g].dim0 < s.begin + s.len; ++g) {
        const Group& gr = I.groups[g];
        const size_t nc = size_t{1} << gr.bpd;
        float* t = lut + g * I.lut_stride;
        // Entry c = sum_j y[dim0 + j] cent[digit j of c] (digit j: bits j bpd of c), channel by
        // channel: the first channel's nc products, then each further channel j adds its
        // product for digit k to the entries so far, written to entries k nc^j.. (k falling, so
        // k = 0 adds in place last): the same sums in the same order as one entry at a time
        // from 0 (0 + a product: -0 becomes +0, as there).
        const float y0 = y[gr.dim0];
        for (size_t c = 0; c < nc; ++c) t[c] = 0.f + y0 * cent[c];
        size_t have = nc;
        for (int j = 1; j < gr.ndims; ++j) {
          const float yj = y[gr.dim0 + j];
          for (size_t k = nc; k-- > 0;) {
            const float p = yj * cent[k];
            float* out = t + k * have;
            for (size_t c = 0; c < have; ++c) out[c] = t[c] + p;
          }
          have *= nc;
        }
        // Unused entries (3-bit channels, short last group) repeat entry 0: never read.
        for (size_t c = have; c < I.lut_stride; ++c) t[c] = t[0];
      }
    }
  }
  if (q8 == nullptr) return;
  // The uint8 copy (fast layout: 16 entries a group, padding groups up to mp zero; trellis:
  // 256 a channel, mp == m).
  const size_t st = I.lut_stride;
  thread_local std::vector<float> mins;
  mins.resize(I.m);
  float maxrange = 0, bsum = 0;
  for (size_t gi = 0; gi < I.m; ++gi) {
    const float* t = lut + gi * st;
    float mn = t[0], mx = t[0];  // std::min_element / max_element's picks, NaN included
    for (size_t c = 1; c < st; ++c) {
      mn = std::min(mn, t[c]);
      mx = std::max(mx, t[c]);
    }
    mins[gi] = mn;
    maxrange = std::max(maxrange, mx - mn);
    bsum += mn;
  }
  const float step = maxrange > 0 ? maxrange / 255.f : 1.f;
  std::memset(q8 + I.m * st, 0, (I.mp - I.m) * st);
  lut_to_u8(I.m, st, lut, mins.data(), 1.f / step, q8);
  *bias = bsum;
  *delta = step;
}

// The sign-plane tables of a rotated query y (two-level scan): group g (channels 4g..4g+3)
// entry c = sum_t y[4g + t] (bit t of c ? 1 : -1), to uint8 as build_luts does (per-group
// minimum -sum |y_j|, one step), so S = sum_j y_j sign_j lies within *half = cm * step / 2 of
// *bias + *step * sum q8. *eps_qn = eps ||y||. clut: cm * 16 floats, mins: cm floats (scratch);
// q8: cmp * 16 bytes.
void build_sign_lut(const Index::Impl& I, const float* y, float* clut, float* mins, uint8_t* q8, float* bias,
                    float* step, float* half, float* eps_qn) {
  const size_t d = static_cast<size_t>(I.d);
  float maxrange = 0, bsum = 0;
  for (size_t g = 0; g < I.cm; ++g) {
    float* t = clut + g * 16;
    const size_t j0 = 4 * g, nd = std::min<size_t>(4, d - j0);
    // Entry c = ((0 + s_0) + s_1) + ... + s_{nd-1}, s_u = bit u of c ? y_u : -y_u, built channel
    // by channel (the first 2^u entries hold the sums of channels < u): the same additions in
    // the same order as summing each entry on its own. Bits of c from nd up repeat entry c mod 2^nd.
    t[0] = 0.f + -y[j0];
    t[1] = 0.f + y[j0];
    size_t have = 2;
    for (size_t u = 1; u < nd; ++u, have *= 2)
      for (size_t c = 0; c < have; ++c) {
        t[c + have] = t[c] + y[j0 + u];
        t[c] = t[c] + -y[j0 + u];
      }
    for (size_t c = have; c < 16; ++c) t[c] = t[c % have];
    float a = 0;
    for (size_t u = 0; u < nd; ++u) a += std::fabs(y[j0 + u]);
    mins[g] = -a;
    bsum += -a;
    maxrange = std::max(maxrange, 2 * a);
  }
  const float st = maxrange > 0 ? maxrange / 255.f : 1.f;
  std::memset(q8 + I.cm * 16, 0, (I.cmp - I.cm) * 16);
  lut_to_u8(I.cm, 16, clut, mins, 1.f / st, q8);
  *bias = bsum;
  *step = st;
  *half = static_cast<float>(I.cm) * st * 0.5f;
  *eps_qn = two_level_eps() * static_cast<float>(std::sqrt(sqnorm(I.d, y)));
}

// Two-level scan of one query (flat or IVF). Pass 1 scans the sign plane block by block: each
// slot's estimate est and bound w = eps ||y|| cB + (l2 ? 2 : 1) cA cm step / 2 (the error bound
// plus the uint8 tables' rounding), both shifted by the offset of the slot's list (IVF; flat
// -0); the best r lower bounds est - w set a bar L that the r-th best score reaches (up to the
// bound's failures), and every slot whose upper bound est + w is not below the bar as it
// stands is kept. Pass 2 (two_level_pass2) scores those at or above the final L exactly.
struct TwoLevelQuery {
  std::vector<uint8_t> q8;  // the sign-plane uint8 tables of the query (cmp * 16 bytes)
  float bias = 0, step = 1, half = 0, eps_qn = 0;
  TopR lowk;                                   // the best lower bounds
  std::vector<std::pair<float, uint32_t>> pend;  // (upper bound, slot) of the kept slots
  size_t mark = 0;                             // pend's size after its last compaction
  void reset(size_t r) {
    lowk.reset(r);
    pend.clear();
    mark = 0;
  }
};

// Per-thread scratch of the two-level scan: a chunk of kChunkBlocks blocks, and the float tables.
struct TwoLevelScratch {
  static constexpr size_t kChunkBlocks = 64;
  std::vector<float> clut, cmins, sc, bmax, up, lo;
  std::vector<uint32_t> acc;
  explicit TwoLevelScratch(const Index::Impl& I)
      : clut(I.cm * 16), cmins(I.cm), sc(kChunkBlocks * kBlock), bmax(kChunkBlocks), up(sc.size()), lo(sc.size()),
        acc(sc.size()) {}
  // t's sign-plane tables for the rotated query y.
  void set_query(const Index::Impl& I, const float* y, TwoLevelQuery& t) {
    t.q8.resize(I.cmp * 16);
    build_sign_lut(I, y, clut.data(), cmins.data(), t.q8.data(), &t.bias, &t.step, &t.half, &t.eps_qn);
  }
  // Pass 1 over the nb <= kChunkBlocks plane blocks from block cb, of which the cnt slots from
  // cb * kBlock are offered, off added to every bound, and the list term I.cL of each slot when
  // list_term (IVF: t's tables are those of Pi q, its eps_qn that of Pi (q - c_l)).
  void pass1(const Index::Impl& I, bool l2, TwoLevelQuery& t, size_t cb, size_t nb, size_t cnt, float off,
             bool list_term = false) {
    const size_t v0 = cb * kBlock;
    fast_scan_u8(nb, I.cmp, I.cblocks.data() + cb * I.cmp * 16, t.q8.data(), acc.data());
    fast_scan_scores(nb * kBlock, acc.data(), I.cA.data() + v0, l2 ? I.norm.data() + v0 : nullptr, t.bias, t.step,
                     sc.data(), bmax.data());
    const float e = t.eps_qn, h = t.half * (l2 ? 2.f : 1.f);
    const float* cav = I.cA.data() + v0;
    const float* cbv = I.cB.data() + v0;
    if (list_term) {
      const float* ctv = I.cL.data() + v0;
      for (size_t r = 0; r < nb * kBlock; ++r) sc[r] += ctv[r];
    }
    for (size_t r = 0; r < nb * kBlock; ++r) {
      const float w = e * cbv[r] + h * cav[r];
      up[r] = sc[r] + w;
      lo[r] = sc[r] - w;
    }
    for (size_t r0 = 0; r0 < cnt; r0 += kBlock) {
      const size_t n32 = std::min(cnt, r0 + kBlock) - r0;
      float mx = lo[r0];
      for (size_t r = r0 + 1; r < r0 + n32; ++r) mx = std::max(mx, lo[r]);
      t.lowk.offer_block(lo.data() + r0, n32, off, mx, static_cast<uint32_t>(v0 + r0));
      for (uint32_t mask = mask_at_least(up.data() + r0, n32, off, t.lowk.threshold); mask != 0; mask &= mask - 1) {
        const size_t r = r0 + static_cast<size_t>(__builtin_ctz(mask));
        t.pend.emplace_back(up[r] + off, static_cast<uint32_t>(v0 + r));
      }
    }
    // Drop what the bar has since ruled out, now and then (keeps pend near its final size).
    if (t.pend.size() > 2 * t.mark + 4096) {
      drop_below(t.pend, t.lowk.threshold);
      t.mark = t.pend.size();
    }
  }
  // Keeps the kept slots whose upper bound is at or above L.
  static void drop_below(std::vector<std::pair<float, uint32_t>>& v, float L) {
    v.erase(std::remove_if(v.begin(), v.end(), [L](const std::pair<float, uint32_t>& c) { return !(c.first >= L); }),
            v.end());
  }
};

// Pass 2 of the two-level scan: the slots t kept whose upper bound is at or above the final bar,
// best upper bound first, are scored exactly (score(slot)) into top until top's bar passes the
// next upper bound (every later one is below it too).
template <class Score>
void two_level_pass2(const Index::Impl& I, TwoLevelQuery& t, TopR& top, Score score) {
  auto& pd = t.pend;
  TwoLevelScratch::drop_below(pd, t.lowk.threshold);
  std::sort(pd.begin(), pd.end(), TopR::cmp);
  for (size_t ci = 0; ci < pd.size(); ++ci) {
    if (ci + 2 < pd.size()) I.prefetch_codes(pd[ci + 2].second);
    if (top.h.size() == top.cap && !(pd[ci].first >= top.threshold)) break;
    top.push(score(pd[ci].second), pd[ci].second);
  }
  t.mark = 0;
}

// List-major chunks: at most this many queries, and at most kIvfMaxChunkPairs (query, probe)
// pairs (per thread: 8 bytes a pair, mp * 16 bytes of LUTs and r1 * 8 of candidates a query).
constexpr size_t kIvfMaxChunk = 1024;
constexpr size_t kIvfMaxChunkPairs = size_t{1} << 20;

// IVF search: coarse GEMM against the centroids, the nprobe best lists per query, fast scan
// (or float LUTs) within each list, a per-list additive offset making scores comparable
// across lists, then the same re-ranking stages as the flat index.
// Scores inside (higher is better): ip/cosine: <q, c_l> + scale <Pi q, code>;
// l2: -(||q - c_l||^2 - 2 scale <Pi (q - c_l), code> + ||x - c_l||^2), returned negated.
// qn: nq * d prepared queries (normalised for cosine), qr = Pi qn, qsq: ||q||^2.
void search_ivf(const Index::Impl& I, size_t nq, const float* q, const float* qn, const float* qr,
                const float* qsq, const SearchParams& p, float* scores, int64_t* out_ids) {
  const int L = I.cfg.nlist;
  TQ_CHECK(p.nprobe >= 1 && p.nprobe <= L, "index search: nprobe %d outside [1, nlist = %d]", p.nprobe, L);
  const size_t d = static_cast<size_t>(I.d), k = static_cast<size_t>(p.k);
  const size_t np = static_cast<size_t>(p.nprobe), LL = static_cast<size_t>(L);
  const bool l2 = I.cfg.metric == Metric::l2, cosine = I.cfg.metric == Metric::cosine;
  const bool ip = I.cfg.metric == Metric::ip;
  const float worst = l2 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
  if (I.n == 0 || I.centroids.empty()) {
    for (size_t i = 0; i < nq * k; ++i) {
      scores[i] = worst;
      out_ids[i] = -1;
    }
    return;
  }
  const bool fast = I.fast_ok && p.fast_scan;
  // two: per query, the sign planes of its lists, then exact float-LUT scores for the slots
  // they cannot rule out (as exact as a float-LUT scan).
  const bool two = two_level_search(I, p);
  const size_t rerank = p.rerank < 0 ? k + 16 : static_cast<size_t>(p.rerank);
  // Re-rank stage: the second-stage code when the index has one (any scan), else the float
  // LUT of the first code after a fast scan (a float-LUT scan is already exact).
  const bool stage2 = I.rbytes > 0 && rerank > 0;
  const size_t r2 = std::max(k, static_cast<size_t>(p.rerank_full));
  const size_t r1 = ((fast && !two) || stage2) && rerank > 0 ? std::max(r2, rerank) : r2;
  const int threads = p.n_threads > 0 ? p.n_threads : omp_get_max_threads();

  // Coarse step, in batches of queries: probes[q][0..np) best first and their offsets.
  std::vector<uint32_t> probes(checked_mul(nq, np, "IVF probes"));
  std::vector<float> poff(nq * np);
  {
    // Tiles of queries, each one single-threaded GEMM against the centroids and its selection
    // by the same OpenMP thread (no BLAS threads spinning beside OpenMP's).
    const size_t qb = std::max<size_t>(4, std::min<size_t>(256, (size_t{1} << 18) / LL));
    const size_t tiles = (nq + qb - 1) / qb;
    const BlasSingleThread one_blas_thread;
#pragma omp parallel num_threads(threads)
    {
      const std::unique_ptr<float[]> cs(new float[qb * LL]);  // every entry written by the GEMM before it is read
      // The np best lists by (score desc, list asc): one pass over 64-bit keys (the score's
      // order-preserving bits, then the complemented list index, so one integer compare
      // orders by score and, among equal scores, prefers the lower list) kept in a buffer
      // (below), then sorted; the same lists and order as a partial sort (+0 ranks above -0).
      std::vector<uint64_t> best;
      best.reserve(2 * np);
      auto key_of = [](float f, uint32_t l) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
        return (static_cast<uint64_t>(u) << 32) | (0xFFFFFFFFu - l);
      };
      auto score_of = [](uint64_t key) {
        uint32_t u = static_cast<uint32_t>(key >> 32);
        u = (u & 0x80000000u) ? (u & 0x7FFFFFFFu) : ~u;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
      };
      const auto greater = std::greater<uint64_t>();
      std::vector<float> vb(LL);
#pragma omp for schedule(dynamic, 1)
      for (size_t tile = 0; tile < tiles; ++tile) {
        const size_t q0 = tile * qb, m = std::min(qb, nq - q0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), L, I.d, 1.0f, qn + q0 * d, I.d,
                    I.centroids.data(), I.d, 0.0f, cs.get(), L);
        for (size_t i = 0; i < m; ++i) {
          const float* si = cs.get() + i * LL;
          const float* v = si;
          if (!ip) {
            for (size_t l = 0; l < LL; ++l) vb[l] = 2.f * si[l] - I.cnorm2[l];
            v = vb.data();
          }
          // Candidates at or above the np-th best score seen so far go to a buffer of 2 np
          // keys; a full buffer is cut to its np best keys (nth_element), which raises the
          // bar. The result is the np best keys whatever the cuts.
          best.clear();
          for (size_t l = 0; l < np; ++l) best.push_back(key_of(v[l], static_cast<uint32_t>(l)));
          float thr = score_of(*std::min_element(best.begin(), best.end()));
          auto cut = [&] {
            std::nth_element(best.begin(), best.begin() + (np - 1), best.end(), greater);
            best.resize(np);
            thr = score_of(best[np - 1]);
          };
          // Scores below the bar are skipped by a SIMD search for the next one at or above it.
          for (size_t l = np; l < LL; ++l) {
            l += first_at_least(v + l, LL - l, thr);
            if (l == LL) break;
            best.push_back(key_of(v[l], static_cast<uint32_t>(l)));
            if (best.size() == 2 * np) cut();
          }
          if (best.size() > np) cut();
          std::sort(best.begin(), best.end(), greater);
          for (size_t j = 0; j < np; ++j) {
            const uint32_t l = 0xFFFFFFFFu - static_cast<uint32_t>(best[j]);
            probes[(q0 + i) * np + j] = l;
            // ip/cosine: <q, c_l>; l2: -||q - c_l||^2 = 2 <q, c> - ||c||^2 - ||q||^2.
            poff[(q0 + i) * np + j] = l2 ? 2.f * si[l] - I.cnorm2[l] - qsq[q0 + i] : si[l];
          }
        }
      }
    }
  }

  const size_t kChunkBlocks = 64;
  // Scan order (IvfScanOrder): list-major in chunks of queries (nq / threads, at most
  // kIvfMaxChunk and kIvfMaxChunkPairs / nprobe), one chunk per thread at a time, when a
  // chunk's probes cover half the lists or more (2 chunk nprobe >= nlist); otherwise per query. Measured at 1M, nlist 4096,
  // nprobe 48, 1 thread (docs/design.md): per-query / list-major CPU time 0.99 at 16
  // queries a call, 1.03 at 32, 1.11 at 64, 1.31 at 128 and 256.
  const size_t chunk = std::max<size_t>(
      1, std::min({kIvfMaxChunk, kIvfMaxChunkPairs / np, (nq + threads - 1) / threads}));
  const size_t n_chunks = (nq + chunk - 1) / chunk;
  const IvfScanOrder order = ivf_scan_order();
  const bool list_major = fast && !two && (order == IvfScanOrder::list_major ||
                                   (order == IvfScanOrder::automatic && 2 * chunk * np >= LL));
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> flut(I.m * I.lut_stride), yl(d), sc(kChunkBlocks * kBlock), bmax(kChunkBlocks);
    std::vector<uint8_t> qlut(I.mp * 16), idx(d), idx1(d);
    const bool refine = I.rbytes > 0 && I.cfg.rerank_refine;
    const bool refine4 = refine && I.fast_ok && I.segs.size() == 1 && I.segs[0].bits == 4 && I.cfg.rerank_bits == 4;
    std::vector<uint32_t> acc(4 * kChunkBlocks * kBlock);
    std::vector<uint8_t> fastb;  // vector layout: the scanned blocks transposed (fast_blocks)
    std::vector<float> list_off(LL, 0.f);  // offset of each probed list of the current query
    TopR top;
    float bias = 0, delta = 1;
    TwoLevelQuery tl;
    std::unique_ptr<TwoLevelScratch> tls(two ? new TwoLevelScratch(I) : nullptr);
    auto internal = [&](size_t i, float dot) { return internal_score(I, l2, i, dot); };
    auto exact_lut_dot = [&](const float* lut, size_t i) { return exact_lut_score(I, lut, i); };
    // l2 with list terms (fast layout): the float LUTs of Pi q serve every list, as for ip.
    const bool lterm = l2 && !I.l2term.empty();
    // Score of slot s whose list has offset off from its float-LUT dot (l2: plus its list term).
    auto list_score = [&](size_t s, float dot, float off) {
      const float v = internal(s, dot);
      return (lterm ? v + I.l2term[s] : v) + off;
    };
    // The same with the dot from flut, holding Pi q's tables (ip, cosine, l2 with list terms) or
    // its list's of Pi (q - c_l) (l2 without).
    auto lut_score = [&](size_t s, float off) { return list_score(s, exact_lut_dot(flut.data(), s), off); };
    // Pi (q - c_l), in yl.
    auto residual_query = [&](const float* y, size_t l) {
      const float* rc = I.rcentroids.data() + l * d;
      for (size_t j = 0; j < d; ++j) yl[j] = y[j] - rc[j];
      return static_cast<const float*>(yl.data());
    };
    // Rotated query of list l: Pi q (ip, cosine: one LUT for every list) or Pi (q - c_l).
    auto list_query = [&](const float* y, size_t l) { return l2 ? residual_query(y, l) : y; };
    // Score of slot s in list l from its second-stage code (same form, its own scale).
    // Slot s's second-stage score from its code's dot with the list query (its own scale).
    auto stage2_of = [&](size_t s, float dot, float off) {
      const float sd = I.rscale[s] * dot;
      return (l2 ? 2.f * sd - I.norm[s] * I.norm[s] : sd) + off;
    };
    auto stage2_score = [&](const float* y, size_t s, size_t l, float off) {
      const float* yy = list_query(y, l);
      if (!refine4) unpack_bits(d, I.cfg.rerank_bits, I.rcodes.data() + s * I.rbytes, idx.data());
      if (refine4) {
        // 4-bit first code (channel j = group j: a nibble of byte j * 16 of the slot's block in
        // the fast layout, nibble j % 2 of byte j / 2 of its row in the vector layout) and a
        // 4-bit refinement (channel j: nibble j % 2 of byte j / 2), read together without
        // unpacking: tab[(c << 4) | k].
        const uint8_t* rc = I.rcodes.data() + s * I.rbytes;
        const float* tab = I.rtab[0].data();
        float d0 = 0, d1 = 0;
        size_t j = 0;
        if (I.vl()) {
          const uint8_t* base = I.vrow(s);
          for (; j + 2 <= d; j += 2) {
            const uint8_t r = rc[j / 2], c = base[j / 2];
            d0 += yy[j] * tab[((c & 15u) << 4) | (r & 15u)];
            d1 += yy[j + 1] * tab[(c & 0xF0u) | (r >> 4)];
          }
        } else {
          const uint8_t* base = I.fast_row(s);
          const int sh = I.fast_shift(s);
          for (; j + 2 <= d; j += 2) {
            const uint8_t r = rc[j / 2];
            const unsigned c0 = (base[j * 16] >> sh) & 15u, c1 = (base[(j + 1) * 16] >> sh) & 15u;
            d0 += yy[j] * tab[(c0 << 4) | (r & 15u)];
            d1 += yy[j + 1] * tab[(c1 << 4) | (r >> 4)];
          }
        }
        if (j < d) d0 += yy[j] * tab[(static_cast<unsigned>(I.group_code(s, j)) << 4) | (rc[j / 2] & 15u)];
        return stage2_of(s, d0 + d1, off);
      }
      if (refine) {
        // Refinement: first index c and second index k decode together, tab[(c << B) | k].
        I.get_indices(s, idx1.data());
        const int B = I.cfg.rerank_bits;
        float d0 = 0, d1 = 0;
        for (size_t sg = 0; sg < I.segs.size(); ++sg) {
          const Segment& seg = I.segs[sg];
          const float* tab = I.rtab[sg].data();
          int j = seg.begin;
          const int e = seg.begin + seg.len;
          for (; j + 2 <= e; j += 2) {
            d0 += yy[j] * tab[(static_cast<size_t>(idx1[j]) << B) | idx[j]];
            d1 += yy[j + 1] * tab[(static_cast<size_t>(idx1[j + 1]) << B) | idx[j + 1]];
          }
          for (; j < e; ++j) d0 += yy[j] * tab[(static_cast<size_t>(idx1[j]) << B) | idx[j]];
        }
        return stage2_of(s, d0 + d1, off);
      }
      const float* cent = I.rcb->centroids.data();
      float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
      size_t j = 0;
      for (; j + 4 <= d; j += 4) {
        d0 += yy[j] * cent[idx[j]];
        d1 += yy[j + 1] * cent[idx[j + 1]];
        d2 += yy[j + 2] * cent[idx[j + 2]];
        d3 += yy[j + 3] * cent[idx[j + 3]];
      }
      for (; j < d; ++j) d0 += yy[j] * cent[idx[j]];
      return stage2_of(s, (d0 + d1) + (d2 + d3), off);
    };

    // Fast scan of list l for g <= 4 queries at once (one pass over the codes): query u's
    // uint8 LUTs q8s[u] (bias qb[u], step qd[u]) and list offset offs[u], into its candidates
    // *ts[u]. Blocks whose best score is below a query's worst kept score are skipped for it
    // (an equal one may still enter with a lower slot, so equality is scanned).
    auto scan_list = [&](size_t g, TopR* const* ts, const uint8_t* const* q8s, const float* qb, const float* qd,
                         size_t l, const float* offs) {
      const size_t lb = I.list_begin[l], ls = I.list_size[l];
      const size_t b0 = lb / kBlock, b1 = (lb + ls + kBlock - 1) / kBlock;
      uint32_t* accs[4];
      for (size_t u = 0; u < 4; ++u) accs[u] = acc.data() + u * kChunkBlocks * kBlock;
      for (size_t cb = b0; cb < b1; cb += kChunkBlocks) {
        const size_t nb = std::min(kChunkBlocks, b1 - cb);
        const size_t v0 = cb * kBlock, v1 = std::min(lb + ls, (cb + nb) * kBlock);
        const uint8_t* codes = I.fast_blocks(cb, nb, fastb);
        if (g == 1) fast_scan_u8(nb, I.mp, codes, q8s[0], accs[0]);
        else fast_scan_u8_multi(nb, I.mp, codes, g, q8s, accs);
        const size_t cnt = v1 - v0;
        for (size_t u = 0; u < g; ++u) {
          TopR& t = *ts[u];
          const float off = offs[u];
          fast_scan_scores(nb * kBlock, accs[u], I.scale.data() + v0, l2 ? I.norm.data() + v0 : nullptr, qb[u], qd[u],
                           sc.data(), bmax.data());
          if (l2)  // the tables are Pi q's: each slot's list term, and the blocks' best again
            for (size_t bi = 0; bi < nb; ++bi) {
              float mx = -std::numeric_limits<float>::infinity();
              for (size_t r = bi * kBlock; r < (bi + 1) * kBlock; ++r) {
                sc[r] += I.l2term[v0 + r];
                mx = std::max(mx, sc[r]);
              }
              bmax[bi] = mx;
            }
          for (size_t bi = 0; bi < nb; ++bi) {
            const size_t e0 = bi * kBlock, e1 = std::min(cnt, e0 + kBlock);
            t.offer_block(sc.data() + e0, e1 - e0, off, bmax[bi], static_cast<uint32_t>(v0 + e0));
          }
        }
      }
    };

    // Re-rank stages and output of query qi from its scan candidates (best first). flut_ready:
    // flut already holds the float LUTs of qi's Pi q.
    auto finish = [&](size_t qi, std::vector<std::pair<float, uint32_t>>& cand, bool flut_ready) {
      const float* y = qr + qi * d;
      for (size_t j = 0; j < np; ++j) list_off[probes[qi * np + j]] = poff[qi * np + j];
      if (stage2) {
        // The candidates' codes are scattered: prefetch the one four ahead (its first code's
        // lines when that code is read too, and its second-stage bytes).
        auto prefetch2 = [&](size_t s) {
          if (refine) I.prefetch_codes(s);
          __builtin_prefetch(I.rcodes.data() + s * I.rbytes);
        };
        // In slot order, so candidates of one block share its rows while they are cached.
        std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
        for (size_t ci = 0; ci < cand.size() && ci < 4; ++ci) prefetch2(cand[ci].second);
        for (size_t ci = 0; ci < cand.size(); ++ci) {
          if (ci + 4 < cand.size()) prefetch2(cand[ci + 4].second);
          auto& c = cand[ci];
          const size_t l = I.list_of(c.second);
          c.first = stage2_score(y, c.second, l, list_off[l]);
        }
        std::sort(cand.begin(), cand.end(), TopR::cmp);
        if (cand.size() > r2) cand.resize(r2);
      } else if (fast && !two && rerank > 0) {
        // (a fast layout: l2 has list terms, so Pi q's float LUTs serve every metric)
        if (!flut_ready) build_luts(I, y, flut.data(), nullptr, nullptr, nullptr);
        for (auto& c : cand) c.first = lut_score(c.second, list_off[I.list_of(c.second)]);
        std::sort(cand.begin(), cand.end(), TopR::cmp);
        if (cand.size() > r2) cand.resize(r2);
      }
      if (p.rerank_full > 0) {
        const float* qv = (cosine ? qn : q) + qi * d;
        for (auto& c : cand) {
          const float* xv = I.vectors.data() + static_cast<size_t>(c.second) * d;
          double s = 0;
          if (l2) {
            for (size_t j = 0; j < d; ++j) s += static_cast<double>(qv[j] - xv[j]) * (qv[j] - xv[j]);
            s = -s;
          } else {
            for (size_t j = 0; j < d; ++j) s += static_cast<double>(qv[j]) * xv[j];
          }
          c.first = static_cast<float>(s);
        }
        std::sort(cand.begin(), cand.end(), TopR::cmp);
      }
      float* so = scores + qi * k;
      int64_t* io = out_ids + qi * k;
      for (size_t r = 0; r < k; ++r) {
        if (r < cand.size()) {
          so[r] = l2 ? -cand[r].first : cand[r].first;
          io[r] = I.ids[cand[r].second];
        } else {
          so[r] = worst;
          io[r] = -1;
        }
      }
    };

    if (two) {
      // Pass 1 over the probed lists' sign planes, then pass 2 with the float-LUT scores of Pi q,
      // taken from the codes (exact_code_score; l2: plus each slot's list term).
#pragma omp for schedule(dynamic, 4)
      for (size_t qi = 0; qi < nq; ++qi) {
        const float* y = qr + qi * d;
        top.reset(r1);
        tl.reset(r1);
        // One set of sign tables, of Pi q: the slots' list terms turn its sums into those of
        // Pi (q - c_l), whose norm bounds the error.
        tls->set_query(I, y, tl);
        for (size_t j = 0; j < np; ++j) {
          const size_t l = probes[qi * np + j];
          const size_t lb = I.list_begin[l], ls = I.list_size[l];
          if (ls == 0) continue;
          list_off[l] = poff[qi * np + j];
          tl.eps_qn = two_level_eps() * static_cast<float>(std::sqrt(sqnorm(I.d, residual_query(y, l))));
          const size_t b0 = lb / kBlock, b1 = (lb + ls + kBlock - 1) / kBlock;
          for (size_t cb = b0; cb < b1; cb += kChunkBlocks) {
            const size_t nb = std::min(kChunkBlocks, b1 - cb);
            tls->pass1(I, l2, tl, cb, nb, std::min(lb + ls, (cb + nb) * kBlock) - cb * kBlock, list_off[l], true);
          }
        }
        two_level_pass2(I, tl, top,
                        [&](size_t s) { return list_score(s, exact_code_score(I, y, s), list_off[I.list_of(s)]); });
        auto cand = top.sorted();
        finish(qi, cand, true);
      }
    } else if (!list_major) {
#pragma omp for schedule(dynamic, 4)
      for (size_t qi = 0; qi < nq; ++qi) {
        const float* y = qr + qi * d;
        top.reset(r1);
        // One set of tables of Pi q (l2: with the slots' list terms); l2 without list terms (the
        // float-LUT scan of a layout with more than 4 bits a group) builds each list's tables of
        // Pi (q - c_l).
        if (!l2 || lterm) build_luts(I, y, flut.data(), fast ? qlut.data() : nullptr, &bias, &delta);
        for (size_t j = 0; j < np; ++j) {
          const size_t l = probes[qi * np + j];
          const float off = poff[qi * np + j];
          if (I.list_size[l] == 0) continue;
          if (l2 && !lterm) build_luts(I, list_query(y, l), flut.data(), nullptr, &bias, &delta);
          if (fast && j + 1 < np) {
            // The next probed list's first two blocks and their scales, while this one is scanned.
            const size_t nl = probes[qi * np + j + 1];
            const size_t nb0 = I.list_begin[nl] / kBlock;
            const size_t nbl = std::min<size_t>(2, (I.list_size[nl] + kBlock - 1) / kBlock);
            const uint8_t* pb = I.blocks.data() + nb0 * I.block_bytes();  // either layout: whole blocks
            for (size_t o = 0; o < nbl * I.block_bytes(); o += 64) __builtin_prefetch(pb + o);
            for (size_t o = 0; o < nbl * kBlock; o += 16) __builtin_prefetch(I.scale.data() + nb0 * kBlock + o);
          }
          if (fast) {
            TopR* tp = &top;
            const uint8_t* q8 = qlut.data();
            scan_list(1, &tp, &q8, &bias, &delta, l, &off);
          } else {
            const size_t lb = I.list_begin[l], ls = I.list_size[l];
            for (size_t s = lb; s < lb + ls; ++s) top.push(lut_score(s, off), static_cast<uint32_t>(s));
          }
        }
        auto cand = top.sorted();
        finish(qi, cand, true);
      }
    } else {
      // List-major (fast scan only): the chunk's (query, probe) pairs grouped by list, each
      // probed list scanned once for all of them in list order (codes read from memory once,
      // then from cache), every query keeping its own candidates; then each query re-ranked.
      const size_t m16 = I.mp * 16;
      std::vector<uint8_t> cq8(chunk * m16);
      std::vector<float> cbias(chunk), cdelta(chunk);
      std::vector<TopR> tops(chunk);
      std::vector<uint32_t> head(LL + 1), fill(LL);
      std::vector<std::pair<uint32_t, float>> pairs(chunk * np);  // (query in the chunk, list offset)
#pragma omp for schedule(dynamic, 1)
      for (size_t c = 0; c < n_chunks; ++c) {
        const size_t q0 = c * chunk, nc = std::min(chunk, nq - q0);
        const uint32_t* pr = probes.data() + q0 * np;
        for (size_t i = 0; i < nc; ++i)
          build_luts(I, qr + (q0 + i) * d, flut.data(), cq8.data() + i * m16, &cbias[i], &cdelta[i]);
        for (size_t i = 0; i < nc; ++i) tops[i].reset(r1);
        std::fill(head.begin(), head.end(), 0u);
        for (size_t e = 0; e < nc * np; ++e) ++head[pr[e] + 1];
        for (size_t l = 0; l < LL; ++l) head[l + 1] += head[l];
        std::copy(head.begin(), head.end() - 1, fill.begin());
        for (size_t e = 0; e < nc * np; ++e) pairs[fill[pr[e]]++] = {static_cast<uint32_t>(e / np), poff[q0 * np + e]};
        for (size_t l = 0; l < LL; ++l) {
          if (head[l] == head[l + 1] || I.list_size[l] == 0) continue;
          // The list's queries four at a time.
          for (size_t e = head[l]; e < head[l + 1]; e += 4) {
            const size_t g = std::min<size_t>(4, head[l + 1] - e);
            TopR* ts[4];
            const uint8_t* q8s[4];
            float qb[4], qd[4], offs[4];
            for (size_t u = 0; u < g; ++u) {
              const size_t i = pairs[e + u].first;
              ts[u] = &tops[i];
              offs[u] = pairs[e + u].second;
              q8s[u] = cq8.data() + i * m16;
              qb[u] = cbias[i];
              qd[u] = cdelta[i];
            }
            scan_list(g, ts, q8s, qb, qd, l, offs);
          }
        }
        for (size_t i = 0; i < nc; ++i) {
          auto cand = tops[i].sorted();
          finish(q0 + i, cand, false);
        }
      }
    }
  }
}

}  // namespace

namespace {

// search_candidates' outputs (nq * r each), r = candidates_per_query.
struct CandidateOut {
  size_t r = 0;
  float *scan = nullptr, *rerank = nullptr, *full = nullptr, *scores = nullptr;
  int64_t *ids = nullptr, *slots = nullptr;
};

// Index::search (co == nullptr) and Index::search_candidates (co: flat indexes only).
void search_impl(const Index::Impl& I, size_t nq, const float* q, const SearchParams& p, float* scores,
                 int64_t* out_ids, const CandidateOut* co) {
  TQ_CHECK(p.k >= 1 && p.k <= 1 << 20, "index search: k = %d outside [1, 2^20]", p.k);
  TQ_CHECK(p.rerank >= -1, "index search: rerank must be >= -1");
  TQ_CHECK(p.rerank_full >= 0, "index search: rerank_full must be >= 0");
  TQ_CHECK(p.rerank_full == 0 || I.cfg.keep_vectors,
           "index search: rerank_full needs an index built with keep_vectors");
  TQ_CHECK(p.n_threads >= 0, "index search: n_threads must be >= 0");
  TQ_CHECK(I.ivf() || p.nprobe == 1, "index search: nprobe %d needs an IVF index (nlist > 0)", p.nprobe);
  if (nq == 0) return;
  TQ_CHECK(q != nullptr && (co != nullptr || (scores != nullptr && out_ids != nullptr)), "index search: null pointer");
  const size_t d = static_cast<size_t>(I.d);
  const size_t k = static_cast<size_t>(p.k);
  const bool l2 = I.cfg.metric == Metric::l2;
  const bool cosine = I.cfg.metric == Metric::cosine;
  // fast: a uint8 scan (group nibbles, or trellis table indices) then the float-LUT re-rank.
  const bool tfast = I.tc != nullptr && p.fast_scan;
  const bool fast = (I.fast_ok && p.fast_scan && !I.quant) || tfast;
  TQ_CHECK(p.two_level >= -1 && p.two_level <= 1, "index search: two_level must be -1 (auto), 0 or 1");
  TQ_CHECK(p.two_level != 1 || co == nullptr,
           "index search_candidates: the two-level scan is not for sharded candidates (two_level 1)");
  TQ_CHECK(p.two_level != 1 || two_level_search(I, p),
           "index search: two_level 1 needs a fast-scan index of dim >= %d (IVF: %d) with 3 to 4 bits per channel",
           kTwoLevelMinDim, kTwoLevelMinDimIvf);
  // two: the sign-plane pass, then exact float-LUT scores for the vectors it cannot rule out.
  const bool two = co == nullptr && two_level_search(I, p);
  const size_t rerank = p.rerank < 0 ? k + 16 : static_cast<size_t>(p.rerank);
  // Stage sizes: scan keeps r1 candidates, float-LUT re-rank keeps r2, full re-rank keeps k.
  // The two-level scan keeps float-LUT scores already: no re-rank stage.
  const size_t r2 = std::max(k, static_cast<size_t>(p.rerank_full));
  const size_t r1 = fast && !two && rerank > 0 ? std::max(r2, rerank) : r2;
  const float worst = l2 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();

  // Prepared queries: normalised (cosine), ||q||^2 (l2), rotated (mse).
  // Centred index: l2 works on q - mean (qsq = ||q - mean||^2); ip/cosine add <q, mean>.
  std::vector<float> qn(nq * d), qr(I.quant ? 0 : nq * d), qsq(nq), qoff(nq, 0.f);
  std::vector<float> qc(I.center.empty() ? 0 : d);
  for (size_t i = 0; i < nq; ++i) {
    const float* src = q + i * d;
    const double s2 = sqnorm(I.d, src);
    if (!input_sq_ok(s2)) check_rows(nq, I.d, q, "index search: query");  // throws, naming query i
    qsq[i] = static_cast<float>(s2);
    const float inv = cosine ? (s2 > 0 ? static_cast<float>(1.0 / std::sqrt(s2)) : 0.f) : 1.f;
    for (size_t j = 0; j < d; ++j) qn[i * d + j] = src[j] * inv;
  }
  if (!I.quant) {
    if (I.center.empty()) {
      I.rot->forward(nq, qn.data(), qr.data());
    } else {
      std::vector<float> shifted(nq * d);
      for (size_t i = 0; i < nq; ++i) {
        double off = 0, s2 = 0;
        for (size_t j = 0; j < d; ++j) {
          const float v = qn[i * d + j];
          off += static_cast<double>(v) * I.center[j];
          const float w = l2 ? v - I.center[j] : v;
          shifted[i * d + j] = w;
          s2 += static_cast<double>(w) * w;
        }
        if (l2) qsq[i] = static_cast<float>(s2);
        else qoff[i] = static_cast<float>(off);
      }
      I.rot->forward(nq, shifted.data(), qr.data());
    }
  }

  if (I.ivf()) {
    TQ_CHECK(co == nullptr, "index search_candidates: flat indexes only (this one is IVF)");
    search_ivf(I, nq, q, qn.data(), qr.data(), qsq.data(), p, scores, out_ids);
    return;
  }
  const size_t n = I.n;
  const size_t kChunkBlocks = 64;  // 2048 vectors per pass over the codes
  const int threads = p.n_threads > 0 ? p.n_threads : omp_get_max_threads();
  // Queries scanned together, each chunk of codes read once for them: 8, and up to 32 where the
  // chunk is widened and transposed first (the vector layout's single-level scan), while every
  // thread still gets a batch.
  const size_t per_thread = (nq + static_cast<size_t>(threads) - 1) / static_cast<size_t>(threads);
  const size_t qbatch = fast && !two && I.vl() ? std::clamp<size_t>(per_thread, 8, 32) : 8;
  const size_t n_qb = (nq + qbatch - 1) / qbatch;

#pragma omp parallel num_threads(threads)
  {
    std::vector<float> flut(qbatch * I.m * I.lut_stride);
    std::vector<uint8_t> qlut(fast ? qbatch * I.mp * I.lut_stride : 0);
    std::vector<float> bias(qbatch), delta(qbatch);
    std::vector<TopR> top(qbatch);
    std::vector<uint32_t> acc(kChunkBlocks * kBlock);
    std::vector<uint8_t> fastb;  // vector layout: the scanned blocks transposed (fast_blocks)
    std::vector<float> sc(kChunkBlocks * kBlock), bmax(kChunkBlocks);
    std::vector<float> pstate(I.quant ? I.quant->query_state_floats() : 0);
    // Two-level scan: each query's pass-1 state and the thread's scratch.
    std::vector<TwoLevelQuery> tl(two ? qbatch : 0);
    std::unique_ptr<TwoLevelScratch> tls(two ? new TwoLevelScratch(I) : nullptr);

    auto internal = [&](size_t i, float dot) { return internal_score(I, l2, i, dot); };
    auto exact_lut_dot = [&](const float* lut, size_t i) { return exact_lut_score(I, lut, i); };

#pragma omp for schedule(dynamic, 1)
    for (size_t qb = 0; qb < n_qb; ++qb) {
      const size_t q0 = qb * qbatch, q1 = std::min(nq, q0 + qbatch);
      const size_t bq = q1 - q0;
      if (!I.quant && !two)  // (the two-level scan scores from the codes: exact_code_score)
        for (size_t b = 0; b < bq; ++b)
          build_luts(I, qr.data() + (q0 + b) * d, flut.data() + b * I.m * I.lut_stride,
                     fast ? qlut.data() + b * I.mp * I.lut_stride : nullptr, &bias[b], &delta[b]);
      for (size_t b = 0; b < bq; ++b) top[b].reset(r1);
      if (two) {
        // Pass 1 over chunks of 2048 vectors, query by query; then pass 2 (one run: key 0).
        for (size_t b = 0; b < bq; ++b) {
          tls->set_query(I, qr.data() + (q0 + b) * d, tl[b]);
          tl[b].reset(r2);
        }
        const size_t nsb = (n + kBlock - 1) / kBlock;
        for (size_t cb = 0; cb < nsb; cb += kChunkBlocks) {
          const size_t nb = std::min(kChunkBlocks, nsb - cb);
          const size_t cnt = std::min(n, (cb + nb) * kBlock) - cb * kBlock;
          for (size_t b = 0; b < bq; ++b) tls->pass1(I, l2, tl[b], cb, nb, cnt, -0.f);
        }
        for (size_t b = 0; b < bq; ++b) {
          const float* y = qr.data() + (q0 + b) * d;
          two_level_pass2(I, tl[b], top[b], [&](size_t i) { return internal(i, exact_code_score(I, y, i)); });
        }
      } else if (fast) {
        // Chunks of kChunkBlocks * kBlock (2048) vectors: 64 blocks of 32 in the fast layout,
        // 32 of 64 for trellis codes; scores per 32 vectors either way.
        const size_t vb = tfast ? Index::Impl::kTrellisBlock : kBlock;  // vectors per storage block
        const size_t nsb = (n + vb - 1) / vb, chunk = kChunkBlocks * kBlock / vb;
        for (size_t cb = 0; cb < nsb; cb += chunk) {
          const size_t nb = std::min(chunk, nsb - cb);
          const size_t v0 = cb * vb, cnt = std::min(n, (cb + nb) * vb) - v0;
          const uint8_t* codes = tfast ? nullptr : I.fast_blocks(cb, nb, fastb);  // once for the batch
          for (size_t b = 0; b < bq; ++b) {
            const uint8_t* q8 = qlut.data() + b * I.mp * I.lut_stride;
            if (tfast) trellis_scan_u8(nb, d, I.gcodes.data() + cb * d * vb, q8, acc.data());
            else fast_scan_u8(nb, I.mp, codes, q8, acc.data());
            // Scores for whole blocks (padding vectors score garbage and are skipped below).
            fast_scan_scores(nb * vb, acc.data(), I.scale.data() + v0, l2 ? I.norm.data() + v0 : nullptr, bias[b],
                             delta[b], sc.data(), bmax.data());
            TopR& t = top[b];
            for (size_t bi = 0; bi * kBlock < cnt; ++bi) {
              const size_t r0 = bi * kBlock, r1e = std::min(cnt, r0 + kBlock);
              t.offer_block(sc.data() + r0, r1e - r0, -0.f, bmax[bi], static_cast<uint32_t>(v0 + r0));
            }
          }
        }
      } else if (I.quant) {
        const size_t cbytes = I.quant->code_bytes();
        for (size_t b = 0; b < bq; ++b) {
          I.quant->prepare_query(qn.data() + (q0 + b) * d, pstate.data());
          for (size_t v0 = 0; v0 < n; v0 += sc.size()) {
            const size_t cnt = std::min(sc.size(), n - v0);
            I.quant->score(pstate.data(), cnt, I.pcodes.data() + v0 * cbytes, sc.data());
            for (size_t r = 0; r < cnt; ++r) top[b].push(internal(v0 + r, sc[r]), static_cast<uint32_t>(v0 + r));
          }
        }
      } else {
        for (size_t v0 = 0; v0 < n; v0 += sc.size()) {
          const size_t cnt = std::min(sc.size(), n - v0);
          for (size_t b = 0; b < bq; ++b) {
            const float* lut = flut.data() + b * I.m * I.lut_stride;
            for (size_t r = 0; r < cnt; ++r)
              top[b].push(internal(v0 + r, exact_lut_dot(lut, v0 + r)), static_cast<uint32_t>(v0 + r));
          }
        }
      }

      // Internal score of the full re-rank of slot i for query qi (l2: ||q||^2 - distance).
      auto full_score = [&](size_t qi, size_t i) {
        const float* qv = (cosine ? qn.data() : q) + qi * d;
        const float* xv = I.vectors.data() + i * d;
        double s = 0;
        if (l2) {
          for (size_t j = 0; j < d; ++j) s += static_cast<double>(qv[j] - xv[j]) * (qv[j] - xv[j]);
          s = qsq[qi] - s;  // internal: higher is better, maps back to s below
        } else {
          for (size_t j = 0; j < d; ++j) s += static_cast<double>(qv[j]) * xv[j];
        }
        return static_cast<float>(s);
      };
      // The reported score of internal score s of the last stage.
      auto reported = [&](size_t qi, float s) {
        return l2 ? qsq[qi] - s : s + (p.rerank_full > 0 ? 0.f : qoff[qi]);
      };

      for (size_t b = 0; b < bq; ++b) {
        auto cand = top[b].sorted();
        if (co != nullptr) {
          // Every candidate of the scan, each scored by every stage, no cut.
          const size_t qi = q0 + b, o = qi * co->r;
          const float* lut = flut.data() + b * I.m * I.lut_stride;
          for (size_t ci = 0; ci < co->r; ++ci) {
            if (ci >= cand.size()) {
              co->scan[o + ci] = co->rerank[o + ci] = co->full[o + ci] = -std::numeric_limits<float>::infinity();
              co->scores[o + ci] = worst;
              co->ids[o + ci] = co->slots[o + ci] = -1;
              continue;
            }
            const size_t i = cand[ci].second;
            const float s1 = cand[ci].first;
            const float s2 = fast && rerank > 0 ? internal(i, exact_lut_dot(lut, i)) : s1;
            const float s3 = p.rerank_full > 0 ? full_score(qi, i) : s2;
            co->scan[o + ci] = s1;
            co->rerank[o + ci] = s2;
            co->full[o + ci] = s3;
            co->scores[o + ci] = reported(qi, s3);
            co->ids[o + ci] = I.ids[i];
            co->slots[o + ci] = static_cast<int64_t>(i);
          }
          continue;
        }
        if (fast && !two && rerank > 0) {
          const float* lut = flut.data() + b * I.m * I.lut_stride;
          // Prefetch the code rows of the candidate after next.
          for (size_t ci = 0; ci < cand.size() && ci < 2; ++ci) I.prefetch_codes(cand[ci].second);
          for (size_t ci = 0; ci < cand.size(); ++ci) {
            if (ci + 2 < cand.size()) I.prefetch_codes(cand[ci + 2].second);
            cand[ci].first = internal(cand[ci].second, exact_lut_dot(lut, cand[ci].second));
          }
          std::sort(cand.begin(), cand.end(), TopR::cmp);
          if (cand.size() > r2) cand.resize(r2);
        }
        if (p.rerank_full > 0) {
          for (auto& c : cand) c.first = full_score(q0 + b, c.second);
          std::sort(cand.begin(), cand.end(), TopR::cmp);
        }
        float* so = scores + (q0 + b) * k;
        int64_t* io = out_ids + (q0 + b) * k;
        for (size_t r = 0; r < k; ++r) {
          if (r < cand.size()) {
            so[r] = reported(q0 + b, cand[r].first);
            io[r] = I.ids[cand[r].second];
          } else {
            so[r] = worst;
            io[r] = -1;
          }
        }
      }
    }
  }
}

}  // namespace

void Index::search(size_t nq, const float* q, const SearchParams& p, float* scores, int64_t* ids) const {
  search_impl(*impl_, nq, q, p, scores, ids, nullptr);
}

size_t Index::candidates_per_query(const SearchParams& p) const {
  const Impl& I = *impl_;
  TQ_CHECK(p.k >= 1 && p.k <= 1 << 20, "index search: k = %d outside [1, 2^20]", p.k);
  TQ_CHECK(p.rerank >= -1 && p.rerank_full >= 0, "index search: rerank must be >= -1, rerank_full >= 0");
  const size_t k = static_cast<size_t>(p.k);
  const bool fast = I.fast_ok && p.fast_scan && !I.quant;
  const size_t rerank = p.rerank < 0 ? k + 16 : static_cast<size_t>(p.rerank);
  const size_t r2 = std::max(k, static_cast<size_t>(p.rerank_full));
  return fast && rerank > 0 ? std::max(r2, rerank) : r2;
}

void Index::search_candidates(size_t nq, const float* q, const SearchParams& p, float* scan, float* rerank,
                              float* full, float* scores, int64_t* ids, int64_t* slots) const {
  TQ_CHECK(!impl_->ivf(), "index search_candidates: flat indexes only (this one is IVF)");
  CandidateOut co;
  co.r = candidates_per_query(p);
  co.scan = scan;
  co.rerank = rerank;
  co.full = full;
  co.scores = scores;
  co.ids = ids;
  co.slots = slots;
  if (nq > 0)
    TQ_CHECK(scan && rerank && full && scores && ids && slots, "index search_candidates: null pointer");
  search_impl(*impl_, nq, q, p, nullptr, nullptr, &co);
}

void Index::search(size_t nq, size_t query_dim, const float* q, const SearchParams& p,
                   float* scores, int64_t* ids) const {
  TQ_CHECK(query_dim == static_cast<size_t>(impl_->d),
           "index search: queries have %zu components, the index has dim %d", query_dim, impl_->d);
  search(nq, q, p, scores, ids);
}

// ---------------------------------------------------------------------------------------
// Exact search

void exact_search(Metric metric, size_t n, int dim, const float* x, size_t nq, const float* q,
                  int k, float* scores, int64_t* ids, int n_threads) {
  TQ_CHECK(dim >= 1 && k >= 1, "exact_search: bad dim or k");
  check_rows(nq, dim, q, "exact_search: query");
  check_rows(n, dim, x, "exact_search: base");
  const size_t d = static_cast<size_t>(dim);
  const bool l2 = metric == Metric::l2, cosine = metric == Metric::cosine;
  std::vector<float> xinv(n, 1.f);
  if (cosine)
    for (size_t i = 0; i < n; ++i) {
      const double s = sqnorm(dim, x + i * d);
      xinv[i] = s > 0 ? static_cast<float>(1.0 / std::sqrt(s)) : 0.f;
    }
  const int threads = n_threads > 0 ? n_threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 4) num_threads(threads)
  for (size_t qi = 0; qi < nq; ++qi) {
    const float* qv = q + qi * d;
    const double qs = sqnorm(dim, qv);
    const float qinv = cosine ? (qs > 0 ? static_cast<float>(1.0 / std::sqrt(qs)) : 0.f) : 1.f;
    TopR t;
    t.reset(static_cast<size_t>(k));
    for (size_t i = 0; i < n; ++i) {
      const float* xv = x + i * d;
      float s = 0;
      if (l2) {
        for (size_t j = 0; j < d; ++j) s += (qv[j] - xv[j]) * (qv[j] - xv[j]);
        s = -s;
      } else {
        for (size_t j = 0; j < d; ++j) s += qv[j] * xv[j];
        if (cosine) s *= qinv * xinv[i];
      }
      t.push(s, static_cast<uint32_t>(i));
    }
    auto v = t.sorted();
    for (size_t r = 0; r < static_cast<size_t>(k); ++r) {
      if (r < v.size()) {
        scores[qi * k + r] = l2 ? -v[r].first : v[r].first;
        ids[qi * k + r] = static_cast<int64_t>(v[r].second);
      } else {
        scores[qi * k + r] = l2 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
        ids[qi * k + r] = -1;
      }
    }
  }
}

}  // namespace tq
