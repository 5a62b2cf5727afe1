// TurboQuant quantizers (include/tq/quantizer.h).
//
// Determinism: norms and the norm-correction factor are computed in double with a fixed
// summation order in plain C++ (not dispatched), rotations and index search are
// bit-identical across SIMD levels, so codes are identical at every level.
#include "tq/quantizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tq/bitpack.h"
#include "tq/common.h"
#include "tq/error.h"

namespace tq {

namespace detail {
void gather_scale(const Codebook& cb, size_t n, const uint8_t* idx, float s, float* out) noexcept;
int64_t quantize_scaled(const Codebook& cb, size_t n, const float* y, float scale, uint8_t* idx,
                        const int32_t* csq) noexcept;
}

QuantizerKind parse_quantizer_kind(const std::string& s) {
  if (s == "mse") return QuantizerKind::mse;
  if (s == "prod") return QuantizerKind::prod;
  if (s == "qjl") return QuantizerKind::qjl;
  TQ_CHECK(false, "unknown quantizer '%s' (valid: mse, prod, qjl)", s.c_str());
  return QuantizerKind::mse;
}

NormFormat parse_norm_format(const std::string& s) {
  TQ_CHECK(s == "f16" || s == "f32", "unknown norm format '%s' (valid: f16, f32)", s.c_str());
  return s == "f16" ? NormFormat::f16 : NormFormat::f32;
}

const char* quantizer_kind_name(QuantizerKind k) noexcept {
  switch (k) {
    case QuantizerKind::mse: return "mse";
    case QuantizerKind::prod: return "prod";
    case QuantizerKind::qjl: return "qjl";
  }
  return "?";
}

Quantizer::Quantizer(QuantizerKind kind, const QuantizerConfig& cfg) : kind_(kind), cfg_(cfg) {
  rot_ = make_rotation(cfg.rotation, cfg.dim, cfg.seed);
}

namespace {

constexpr size_t kChunk = 64;  // rows per internal batch
constexpr double kSqrtHalfPi = 1.2533141373155002512;  // sqrt(pi/2)

// Sum of squares in a fixed order (16 float partial sums, combined in double): plain C++
// compiled once for the baseline ISA, so every SIMD level gets the same bits.
double sum_sq(const float* x, int d) noexcept {
  float acc[16] = {};
  int i = 0;
  for (; i + 16 <= d; i += 16)
    for (int k = 0; k < 16; ++k) acc[k] += x[i + k] * x[i + k];
  for (int k = 0; i < d; ++i, ++k) acc[k] += x[i] * x[i];
  double t[8];
  for (int k = 0; k < 8; ++k) t[k] = static_cast<double>(acc[k]) + acc[k + 8];
  return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

size_t norm_bytes(NormFormat f) { return f == NormFormat::f16 ? 2 : 4; }

void store_norm(NormFormat f, double v, uint8_t* p, size_t row) {
  if (f == NormFormat::f32) {
    float x = static_cast<float>(v);
    TQ_CHECK(std::isfinite(x), "vector %zu: norm %g does not fit float32", row, v);
    std::memcpy(p, &x, 4);
  } else {
    TQ_CHECK(v <= 65504.0, "vector %zu: norm %g exceeds the fp16 range (max 65504); use an f32 norm", row, v);
    uint16_t h = fp32_to_fp16(static_cast<float>(v));
    std::memcpy(p, &h, 2);
  }
}

float load_norm(NormFormat f, const uint8_t* p) noexcept {
  if (f == NormFormat::f32) {
    float x;
    std::memcpy(&x, p, 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

// Batch arguments: non-null pointers when n > 0, and n * row sizes that fit in memory.
void check_batch(const char* op, size_t n, size_t row_bytes_a, const void* a, size_t row_bytes_b, const void* b) {
  if (n == 0) return;
  TQ_CHECK(a != nullptr && b != nullptr, "%s: null pointer for a batch of %zu vectors", op, n);
  checked_mul(n, row_bytes_a, op);
  checked_mul(n, row_bytes_b, op);
}

void check_rows_finite(size_t n, int d, const float* x, size_t row0) {
  for (size_t r = 0; r < n; ++r)
    TQ_CHECK(all_finite(static_cast<size_t>(d), x + r * d), "vector %zu contains NaN or Inf", row0 + r);
}

// The encode front end shared by the quantizers: checks and rotates x in chunks of kChunk
// rows, then calls f(row, y_row, norm, 1 / norm) for every row (y_row: the rotated row, not
// yet normalized, writable; 1 / norm is 0 for a zero vector).
template <class F>
void for_each_rotated(const Rotation& rot, int d, size_t n, const float* x, F&& f) {
  std::vector<float> y(kChunk * d);
  for (size_t r0 = 0; r0 < n; r0 += kChunk) {
    const size_t m = std::min(kChunk, n - r0);
    const float* xc = x + r0 * d;
    check_rows_finite(m, d, xc, r0);
    rot.forward(m, xc, y.data());
    for (size_t r = 0; r < m; ++r) {
      const double s = std::sqrt(sum_sq(xc + r * d, d));
      f(r0 + r, y.data() + r * d, s, s > 0 ? static_cast<float>(1.0 / s) : 0.0f);
    }
  }
}

// Dense Gaussian QJL matrix S (d x d, row-major), seeded apart from the rotation.
std::vector<float> gaussian_matrix(int d, uint64_t seed) {
  std::vector<float> s(checked_mul(static_cast<size_t>(d), static_cast<size_t>(d), "QJL matrix"));
  Rng rng(seed ^ 0x514a4c5f4d415452ull);
  for (auto& v : s) v = static_cast<float>(rng.normal());
  return s;
}

// out[j] = sum_i S[j, i] * v[i]
void matvec(const std::vector<float>& S, int d, const float* v, float* out) {
  for (int j = 0; j < d; ++j) {
    const float* row = S.data() + static_cast<size_t>(j) * d;
    float acc = 0;
    for (int i = 0; i < d; ++i) acc += row[i] * v[i];
    out[j] = acc;
  }
}

// ---------------------------------------------------------------- mse
class MseQuantizer final : public Quantizer {
 public:
  explicit MseQuantizer(const QuantizerConfig& cfg)
      : Quantizer(QuantizerKind::mse, cfg), cb_(get_codebook(cfg.dim, cfg.bits, cfg.law)) {
    nb_ = norm_bytes(cfg.norm);
    code_bytes_ = nb_ + packed_bytes(cfg.dim, cfg.bits);
    // Squared centroids in fixed point, so that ||c[idx]||^2 is an order-independent integer
    // sum: the largest possible total, d * max c^2, stays below 2^31.
    double maxc2 = 0;
    for (float c : cb_.centroids) maxc2 = std::max(maxc2, static_cast<double>(c) * c);
    const double scale = std::exp2(std::floor(std::log2(2147483000.0 / (cfg.dim * maxc2))));
    csq_unit_ = 1.0 / scale;
    for (float c : cb_.centroids) csq_.push_back(static_cast<int32_t>(std::llround(static_cast<double>(c) * c * scale)));
  }

  void encode(size_t n, const float* x, uint8_t* codes) const override {
    const int d = cfg_.dim;
    check_batch("encode", n, d * sizeof(float), x, code_bytes_, codes);
    std::vector<uint8_t> idx(d);
    for_each_rotated(*rot_, d, n, x, [&](size_t row, float* yr, double s, float inv) {
      const int64_t c2 = detail::quantize_scaled(cb_, d, yr, inv, idx.data(), csq_.data());
      double stored = s;
      if (cfg_.norm_correction && s > 0 && c2 > 0) stored = s / std::sqrt(c2 * csq_unit_);
      uint8_t* out = codes + row * code_bytes_;
      store_norm(cfg_.norm, stored, out, row);
      pack_bits(d, cfg_.bits, idx.data(), out + nb_);
    });
  }

  void decode(size_t n, const uint8_t* codes, float* x) const override {
    const int d = cfg_.dim;
    check_batch("decode", n, code_bytes_, codes, d * sizeof(float), x);
    std::vector<uint8_t> idx(d);
    for (size_t r = 0; r < n; ++r) {
      const uint8_t* c = codes + r * code_bytes_;
      unpack_bits(d, cfg_.bits, c + nb_, idx.data());
      detail::gather_scale(cb_, d, idx.data(), load_norm(cfg_.norm, c), x + r * d);
    }
    rot_->inverse(n, x, x);
  }

  size_t query_state_floats() const noexcept override { return static_cast<size_t>(cfg_.dim); }
  void prepare_query(const float* q, float* state) const override {
    check_batch("prepare_query", 1, sizeof(float), q, sizeof(float), state);
    check_rows_finite(1, cfg_.dim, q, 0);
    rot_->forward(1, q, state);
  }
  void score(const float* state, size_t n, const uint8_t* codes, float* out) const override {
    const int d = cfg_.dim;
    check_batch("score", n, code_bytes_, codes, sizeof(float), out);
    TQ_CHECK(n == 0 || state != nullptr, "score: null query state");
    std::vector<uint8_t> idx(d);
    for (size_t r = 0; r < n; ++r) {
      const uint8_t* c = codes + r * code_bytes_;
      unpack_bits(d, cfg_.bits, c + nb_, idx.data());
      out[r] = load_norm(cfg_.norm, c) * dot_centroids(cb_, d, state, idx.data());
    }
  }

 private:
  const Codebook& cb_;
  std::vector<int32_t> csq_;  // squared centroids in units of csq_unit_ (norm correction)
  double csq_unit_ = 0;
  size_t nb_;
};

// ---------------------------------------------------------------- prod / qjl
// mse_bits == 0: plain QJL.
class ProdQuantizer final : public Quantizer {
 public:
  ProdQuantizer(QuantizerKind kind, const QuantizerConfig& cfg)
      : Quantizer(kind, cfg),
        mse_bits_(kind == QuantizerKind::prod ? cfg.bits - 1 : 0),
        cb_(mse_bits_ > 0 ? &get_codebook(cfg.dim, mse_bits_, cfg.law) : nullptr),
        S_(gaussian_matrix(cfg.dim, cfg.seed)) {
    nb_ = norm_bytes(cfg.norm);
    idx_off_ = nb_ * (mse_bits_ > 0 ? 2 : 1);
    sign_off_ = idx_off_ + (mse_bits_ > 0 ? packed_bytes(cfg.dim, mse_bits_) : 0);
    code_bytes_ = sign_off_ + packed_bytes(cfg.dim, 1);
  }

  void encode(size_t n, const float* x, uint8_t* codes) const override {
    const int d = cfg_.dim;
    check_batch("encode", n, d * sizeof(float), x, code_bytes_, codes);
    std::vector<float> sr(d);
    std::vector<uint8_t> idx(d), sg(d);
    for_each_rotated(*rot_, d, n, x, [&](size_t row, float* yr, double s, float inv) {
      for (int i = 0; i < d; ++i) yr[i] *= inv;  // yr becomes the residual in the rotated domain
      uint8_t* out = codes + row * code_bytes_;
      store_norm(cfg_.norm, s, out, row);
      if (mse_bits_ > 0) {
        quantize_rotated(*cb_, d, yr, idx.data());
        for (int i = 0; i < d; ++i) yr[i] -= cb_->centroids[idx[i]];
        store_norm(cfg_.norm, std::sqrt(sum_sq(yr, d)), out + nb_, row);
        pack_bits(d, mse_bits_, idx.data(), out + idx_off_);
      }
      // QJL in the rotated domain: S Pi^T is again i.i.d. Gaussian.
      matvec(S_, d, yr, sr.data());
      for (int j = 0; j < d; ++j) sg[j] = sr[j] >= 0 ? 1 : 0;
      pack_bits(d, 1, sg.data(), out + sign_off_);
    });
  }

  void decode(size_t n, const uint8_t* codes, float* x) const override {
    const int d = cfg_.dim;
    check_batch("decode", n, code_bytes_, codes, d * sizeof(float), x);
    std::vector<uint8_t> idx(d), sg(d);
    std::vector<float> z(d);
    for (size_t r = 0; r < n; ++r) {
      const uint8_t* c = codes + r * code_bytes_;
      float* xr = x + r * d;
      const float s = load_norm(cfg_.norm, c);
      float gamma = 1.0f;
      if (mse_bits_ > 0) {
        gamma = load_norm(cfg_.norm, c + nb_);
        unpack_bits(d, mse_bits_, c + idx_off_, idx.data());
        for (int i = 0; i < d; ++i) xr[i] = cb_->centroids[idx[i]];
      } else {
        std::fill(xr, xr + d, 0.0f);
      }
      unpack_bits(d, 1, c + sign_off_, sg.data());
      for (int j = 0; j < d; ++j) z[j] = sg[j] ? 1.0f : -1.0f;
      const float k = static_cast<float>(kSqrtHalfPi / d) * gamma;
      for (int j = 0; j < d; ++j) {  // x += k * S^T z
        const float* row = S_.data() + static_cast<size_t>(j) * d;
        const float kz = k * z[j];
        for (int i = 0; i < d; ++i) xr[i] += kz * row[i];
      }
      for (int i = 0; i < d; ++i) xr[i] *= s;
    }
    rot_->inverse(n, x, x);
  }

  size_t query_state_floats() const noexcept override { return 2 * static_cast<size_t>(cfg_.dim); }
  void prepare_query(const float* q, float* state) const override {
    check_batch("prepare_query", 1, sizeof(float), q, sizeof(float), state);
    check_rows_finite(1, cfg_.dim, q, 0);
    rot_->forward(1, q, state);
    matvec(S_, cfg_.dim, state, state + cfg_.dim);
  }
  void score(const float* state, size_t n, const uint8_t* codes, float* out) const override {
    const int d = cfg_.dim;
    check_batch("score", n, code_bytes_, codes, sizeof(float), out);
    TQ_CHECK(n == 0 || state != nullptr, "score: null query state");
    const float* sq = state + d;
    std::vector<uint8_t> idx(d), sg(d);
    // For larger batches: a 256-entry table per sign byte, T[pos][byte] = sum of sq over the
    // set bits, so <Sq, sign> = 2 * sum_pos T[pos][byte] - sum(sq): d/8 lookups per code.
    const size_t nbytes = packed_bytes(d, 1);
    std::vector<float> lut;
    float sq_total = 0;
    if (n >= 32) {
      lut.assign(nbytes * 256, 0.0f);
      for (size_t pos = 0; pos < nbytes; ++pos) {
        float* t = lut.data() + pos * 256;
        for (int b = 1; b < 256; ++b) {
          const int k = __builtin_ctz(b);
          const size_t j = pos * 8 + k;
          t[b] = t[b & (b - 1)] + (j < static_cast<size_t>(d) ? sq[j] : 0.0f);
        }
      }
      for (int j = 0; j < d; ++j) sq_total += sq[j];
    }
    for (size_t r = 0; r < n; ++r) {
      const uint8_t* c = codes + r * code_bytes_;
      const float s = load_norm(cfg_.norm, c);
      float est = 0, gamma = 1.0f;
      if (mse_bits_ > 0) {
        gamma = load_norm(cfg_.norm, c + nb_);
        unpack_bits(d, mse_bits_, c + idx_off_, idx.data());
        est = dot_centroids(*cb_, d, state, idx.data());
      }
      float qs = 0;
      if (!lut.empty()) {
        const uint8_t* sb = c + sign_off_;
        for (size_t pos = 0; pos < nbytes; ++pos) qs += lut[pos * 256 + sb[pos]];
        qs = 2 * qs - sq_total;
      } else {
        unpack_bits(d, 1, c + sign_off_, sg.data());
        for (int j = 0; j < d; ++j) qs += sg[j] ? sq[j] : -sq[j];
      }
      out[r] = s * (est + gamma * static_cast<float>(kSqrtHalfPi / d) * qs);
    }
  }

 private:
  int mse_bits_;
  const Codebook* cb_;
  std::vector<float> S_;
  size_t nb_ = 0, idx_off_ = 0, sign_off_ = 0;
};

}  // namespace

std::unique_ptr<Quantizer> make_quantizer(QuantizerKind kind, const QuantizerConfig& cfg) {
  TQ_CHECK(cfg.dim >= 2, "quantizer dimension must be >= 2 (got %d)", cfg.dim);
  TQ_CHECK(cfg.dim <= (1 << 20), "quantizer dimension %d is too large (max %d)", cfg.dim, 1 << 20);
  TQ_CHECK(cfg.bits >= 1 && cfg.bits <= 8, "bits must be in 1..8 (got %d)", cfg.bits);
  switch (kind) {
    case QuantizerKind::mse: return std::make_unique<MseQuantizer>(cfg);
    case QuantizerKind::prod:
      TQ_CHECK(cfg.bits >= 2, "the prod quantizer needs bits >= 2 (b-1 mse bits + 1 QJL bit); use qjl for 1 bit");
      TQ_CHECK(cfg.dim <= 16384, "the prod quantizer's dense QJL matrix limits d to 16384 (got %d)", cfg.dim);
      return std::make_unique<ProdQuantizer>(kind, cfg);
    case QuantizerKind::qjl:
      TQ_CHECK(cfg.dim <= 16384, "the QJL quantizer's dense matrix limits d to 16384 (got %d)", cfg.dim);
      return std::make_unique<ProdQuantizer>(kind, cfg);
  }
  TQ_CHECK(false, "unknown quantizer kind %d", static_cast<int>(kind));
  return nullptr;
}

}  // namespace tq
