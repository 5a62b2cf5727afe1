// Fuzz target: quantizer decode and scoring of arbitrary code bytes (include/tq/quantizer.h).
//
// Input: 5 header bytes choose the quantizer (kind, dimension, bits, rotation, norm format,
// codebook law, norm correction); the rest is read as whole codes of code_bytes() each
// (at most 32 codes). For every input:
//   - decode() and score() never read outside the codes or crash, whatever the bytes
//     (indices, fp16/f32 norms including Inf, NaN and subnormals);
//   - decode at the scalar reference level and at the best SIMD level are bit-identical
//     (the codec promises identical decode across levels);
//   - when the stored norms are finite and moderate, the decoded vector is finite and
//     score() agrees with <q, decode(code)> (score never materializes floats, so this
//     checks the two code paths read the same fields of the code).
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "fuzz_util.h"
#include "tq/codebook.h"
#include "tq/common.h"
#include "tq/distortion.h"
#include "tq/error.h"
#include "tq/quantizer.h"
#include "tq/simd.h"

namespace {

constexpr int kDims[] = {2, 3, 7, 8, 17, 33, 64, 100, 128};
constexpr const char* kRotations[] = {"hadamard", "haar", "block32", "block64", "givens", "iso4", "identity"};
constexpr size_t kMaxCodes = 32;

struct Choice {
  tq::QuantizerKind kind;
  tq::QuantizerConfig cfg;
};

Choice choose(const uint8_t h[5]) {
  Choice c;
  c.kind = static_cast<tq::QuantizerKind>(h[0] % 3);
  c.cfg.dim = kDims[h[1] % (sizeof(kDims) / sizeof(kDims[0]))];
  c.cfg.bits = 1 + h[2] % 8;
  if (c.kind == tq::QuantizerKind::prod && c.cfg.bits < 2) c.cfg.bits = 2;
  c.cfg.rotation = tq::parse_rotation(kRotations[h[3] % (sizeof(kRotations) / sizeof(kRotations[0]))]);
  c.cfg.norm = (h[4] & 1) ? tq::NormFormat::f32 : tq::NormFormat::f16;
  // Gauss-law codebooks only up to 4 bits: each 7/8-bit codebook costs seconds to compute
  // under the sanitizers, and all codebooks are computed once before fuzzing starts.
  c.cfg.law = (h[4] & 2) && c.cfg.bits <= 4 ? tq::Law::gauss : tq::Law::beta;
  c.cfg.norm_correction = !(h[4] & 4);
  c.cfg.seed = 0x5eed + (h[4] >> 3);
  return c;
}

const tq::Quantizer& get(const Choice& c) {
  using Key = std::tuple<int, int, int, int, int, int, int, int, uint64_t>;
  static std::map<Key, std::unique_ptr<tq::Quantizer>> cache;
  Key k{static_cast<int>(c.kind), c.cfg.dim, c.cfg.bits, static_cast<int>(c.cfg.rotation.kind),
        c.cfg.rotation.block, static_cast<int>(c.cfg.norm), static_cast<int>(c.cfg.law),
        c.cfg.norm_correction, c.cfg.seed};
  auto& q = cache[k];
  if (!q) q = tq::make_quantizer(c.kind, c.cfg);
  return *q;
}

float load_norm(const tq::Quantizer& q, const uint8_t* p) {
  if (q.config().norm == tq::NormFormat::f32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return tq::fp16_to_fp32(h);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Compute every codebook the inputs can select up front (about a minute under ASan), so
  // that no single input is slow and executions per second stay steady.
  for (int d : kDims)
    for (int bits = 1; bits <= 8; ++bits) {
      tq::get_codebook(d, bits, tq::Law::beta);
      if (bits <= 4) tq::get_codebook(d, bits, tq::Law::gauss);
    }
  const std::string dir = tq_fuzz::seed_dir();
  if (dir.empty()) return 0;
  // Seeds: real codes written by encode() for a spread of configurations.
  int i = 0;
  for (uint8_t kind = 0; kind < 3; ++kind)
    for (uint8_t dim : {0, 3, 5, 8})
      for (uint8_t bits : {0, 1, 3, 7}) {
        const uint8_t h[5] = {kind, dim, bits, static_cast<uint8_t>(i % 7), static_cast<uint8_t>(i % 8)};
        const Choice c = choose(h);
        const tq::Quantizer& q = get(c);
        const size_t n = 1 + i % 3;
        std::vector<float> x(n * q.dim());
        tq::random_unit_vectors(n, q.dim(), 100 + i, x.data());
        for (auto& v : x) v *= 2.5f;
        std::vector<uint8_t> out(5 + n * q.code_bytes());
        std::memcpy(out.data(), h, 5);
        q.encode(n, x.data(), out.data() + 5);
        tq_fuzz::write_seed(dir, "codes_" + std::to_string(i++), out);
      }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  const Choice c = choose(data);
  const tq::Quantizer& q = get(c);
  const size_t cb = q.code_bytes();
  const size_t n = std::min(kMaxCodes, (size - 5) / cb);
  if (n == 0) return 0;
  const std::vector<uint8_t> codes(data + 5, data + 5 + n * cb);  // exact-size heap copy
  const int d = q.dim();

  std::vector<float> x(n * d), x_scalar(n * d);
  q.decode(n, codes.data(), x.data());
  {
    tq::simd::ScopedLevel scalar("scalar");
    q.decode(n, codes.data(), x_scalar.data());
  }

  std::vector<float> qv(d);
  tq::random_unit_vectors(1, d, 7, qv.data());
  std::vector<float> state(q.query_state_floats()), scores(n);
  q.prepare_query(qv.data(), state.data());
  q.score(state.data(), n, codes.data(), scores.data());

  const size_t norms = q.kind() == tq::QuantizerKind::prod ? 2 : 1;
  const size_t nbytes = q.config().norm == tq::NormFormat::f32 ? 4 : 2;
  for (size_t r = 0; r < n; ++r) {
    bool moderate = true;
    double scale = 1;  // |s| * (1 + |gamma|): the size of the terms score() adds up
    for (size_t k = 0; k < norms; ++k) {
      const float s = load_norm(q, codes.data() + r * cb + k * nbytes);
      moderate = moderate && std::isfinite(s) && std::fabs(s) <= 1e15f;
      scale *= k == 0 ? std::fabs(s) : 1 + std::fabs(s);
    }
    const float* xr = x.data() + r * d;
    if (!moderate) continue;
    TQ_FUZZ_REQUIRE(tq::all_finite(d, xr));
    TQ_FUZZ_REQUIRE(std::memcmp(xr, x_scalar.data() + r * d, d * sizeof(float)) == 0);
    double dot = 0, xx = 0;
    for (int i = 0; i < d; ++i) {
      dot += static_cast<double>(qv[i]) * xr[i];
      xx += static_cast<double>(xr[i]) * xr[i];
    }
    // |<q, x>| <= ||x|| (q is a unit vector); allow float rounding relative to that.
    const double tol = 2e-3 * (std::sqrt(xx) + scale) + 1e-6;
    if (!(std::fabs(scores[r] - dot) <= tol)) {
      std::fprintf(stderr, "kind=%s d=%d bits=%d rot=%s row=%zu score=%.9g dot=%.9g tol=%.3g\n",
                   tq::quantizer_kind_name(q.kind()), d, q.config().bits,
                   tq::rotation_name(q.config().rotation).c_str(), r, scores[r], dot, tol);
      tq_fuzz::fail("score() disagrees with <q, decode()>");
    }
  }
  return 0;
}
