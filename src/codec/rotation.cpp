// Rotations (include/tq/rotation.h). Hadamard-family rotations are lists of stages
// (sign flips and in-place WHTs on coordinate ranges) applied to a whole batch per stage;
// inverse() runs the stages backwards (both kinds are self-inverse). Givens and iso4 are
// block-diagonal 2x2 / 4x4 orthogonal matrices. Haar is a dense matrix (Eigen GEMM).
#define EIGEN_DONT_PARALLELIZE
#include <Eigen/Dense>
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tq/common.h"
#include "tq/error.h"
#include "tq/rotation.h"

namespace tq {

void fwht_signed_ref(size_t n, int m, float* x, size_t stride, const float* pre, const float* post) noexcept {
  if (m < 1) return;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(m)));
  for (size_t r = 0; r < n; ++r) {
    float* row = x + r * stride;
    if (pre)
      for (int i = 0; i < m; ++i) row[i] *= pre[i];
    for (int h = 1; h < m; h <<= 1) {
      for (int i = 0; i < m; i += 2 * h) {
        for (int j = i; j < i + h; ++j) {
          const float a = row[j], b = row[j + h];
          row[j] = a + b;
          row[j + h] = a - b;
        }
      }
    }
    for (int i = 0; i < m; ++i) row[i] *= scale;
    if (post)
      for (int i = 0; i < m; ++i) row[i] *= post[i];
  }
}

void fwht_ref(size_t n, int m, float* x, size_t stride) noexcept { fwht_signed_ref(n, m, x, stride, nullptr, nullptr); }

RotationSpec parse_rotation(const std::string& name) {
  if (name == "haar") return {RotationKind::haar, 0};
  if (name == "hadamard") return {RotationKind::hadamard, 0};
  if (name == "block32") return {RotationKind::block, 32};
  if (name == "block64") return {RotationKind::block, 64};
  if (name == "block128") return {RotationKind::block, 128};
  if (name == "givens") return {RotationKind::givens, 0};
  if (name == "iso4") return {RotationKind::iso4, 0};
  if (name == "identity" || name == "none") return {RotationKind::identity, 0};
  TQ_CHECK(false, "unknown rotation '%s' (valid: haar, hadamard, block32, block64, block128, givens, iso4, identity)",
           name.c_str());
  return {};
}

std::string rotation_name(const RotationSpec& spec) {
  switch (spec.kind) {
    case RotationKind::identity: return "identity";
    case RotationKind::haar: return "haar";
    case RotationKind::hadamard: return "hadamard";
    case RotationKind::block: return "block" + std::to_string(spec.block);
    case RotationKind::givens: return "givens";
    case RotationKind::iso4: return "iso4";
  }
  return "?";
}

namespace {

bool is_pow2(int x) { return x > 0 && (x & (x - 1)) == 0; }
int floor_pow2(int x) {
  int p = 1;
  while (p * 2 <= x) p *= 2;
  return p;
}

void copy_if_needed(size_t n, int d, const float* x, float* y) {
  if (n == 0) return;
  TQ_CHECK(x != nullptr && y != nullptr, "rotation: null pointer for a batch of %zu vectors", n);
  if (x != y) std::memmove(y, x, checked_mul(n, static_cast<size_t>(d), "rotation batch") * sizeof(float));
}

class IdentityRotation final : public Rotation {
 public:
  IdentityRotation(int d, uint64_t seed) : Rotation(d, {RotationKind::identity, 0}, seed) {}
  void forward(size_t n, const float* x, float* y) const override { copy_if_needed(n, dim_, x, y); }
  void inverse(size_t n, const float* x, float* y) const override { copy_if_needed(n, dim_, x, y); }
};

// Hadamard family: stages applied to all rows.
class HadamardRotation final : public Rotation {
 public:
  HadamardRotation(int d, RotationSpec spec, uint64_t seed) : Rotation(d, spec, seed) {
    Rng rng(seed ^ 0x4841444d41524421ull);
    const int B = spec.kind == RotationKind::block ? spec.block : d;
    int off = 0;
    for (; off + B <= d; off += B) add_range(rng, off, B);
    if (off < d) add_range(rng, off, d - off);
  }

  void forward(size_t n, const float* x, float* y) const override {
    copy_if_needed(n, dim_, x, y);
    for (size_t k = 0; k < stages_.size(); ++k) {
      const Stage& s = stages_[k];
      // signs over exactly the range of the next WHT: one fused pass
      if (!s.signs.empty() && k + 1 < stages_.size() && stages_[k + 1].signs.empty() &&
          stages_[k + 1].off == s.off && stages_[k + 1].len == s.len) {
        fwht_signed(n, s.len, y + s.off, static_cast<size_t>(dim_), s.signs.data(), nullptr);
        ++k;
      } else {
        apply(s, n, y);
      }
    }
  }
  void inverse(size_t n, const float* x, float* y) const override {
    copy_if_needed(n, dim_, x, y);
    for (size_t k = stages_.size(); k-- > 0;) {
      const Stage& s = stages_[k];
      if (s.signs.empty() && k > 0 && !stages_[k - 1].signs.empty() && stages_[k - 1].off == s.off &&
          stages_[k - 1].len == s.len) {
        fwht_signed(n, s.len, y + s.off, static_cast<size_t>(dim_), nullptr, stages_[k - 1].signs.data());
        --k;
      } else {
        apply(s, n, y);
      }
    }
  }

 private:
  struct Stage {
    int off, len;
    std::vector<float> signs;  // non-empty: sign stage over [off, off+len); empty: WHT there
  };
  std::vector<Stage> stages_;

  void add_signs(Rng& rng, int off, int len) {
    Stage s{off, len, std::vector<float>(len)};
    for (auto& v : s.signs) v = (rng.next_u64() >> 63) ? -1.0f : 1.0f;
    stages_.push_back(std::move(s));
  }
  // One range [off, off+len): signs + WHT when len is a power of two; otherwise three
  // overlapping power-of-two WHTs (head, tail, head) each after fresh signs.
  void add_range(Rng& rng, int off, int len) {
    if (len == 1) {
      add_signs(rng, off, 1);
      return;
    }
    if (is_pow2(len)) {
      add_signs(rng, off, len);
      stages_.push_back({off, len, {}});
      return;
    }
    const int p = floor_pow2(len);
    add_signs(rng, off, len);
    stages_.push_back({off, p, {}});
    add_signs(rng, off, len);
    stages_.push_back({off + len - p, p, {}});
    add_signs(rng, off, len);
    stages_.push_back({off, p, {}});
  }
  void apply(const Stage& s, size_t n, float* y) const {
    if (s.signs.empty()) {
      fwht(n, s.len, y + s.off, static_cast<size_t>(dim_));
      return;
    }
    for (size_t r = 0; r < n; ++r) {
      float* row = y + r * dim_ + s.off;
      for (int i = 0; i < s.len; ++i) row[i] *= s.signs[i];
    }
  }
};

// Block-diagonal small orthogonal matrices (givens: 2x2, iso4: 4x4) with 1- or 2-wide tails.
class BlockMatrixRotation final : public Rotation {
 public:
  BlockMatrixRotation(int d, RotationSpec spec, uint64_t seed) : Rotation(d, spec, seed) {
    Rng rng(seed ^ 0x524f544f52514e54ull);
    int off = 0;
    if (spec.kind == RotationKind::iso4) {
      for (; off + 4 <= d; off += 4) add_iso4(rng, off);
    }
    for (; off + 2 <= d; off += 2) add_givens(rng, off);
    if (off < d) blocks_.push_back({off, 1, {(rng.next_u64() >> 63) ? -1.0f : 1.0f}});
  }
  void forward(size_t n, const float* x, float* y) const override { run(n, x, y, false); }
  void inverse(size_t n, const float* x, float* y) const override { run(n, x, y, true); }

 private:
  struct Block {
    int off, k;
    std::vector<float> m;  // k x k row-major
  };
  std::vector<Block> blocks_;

  void add_givens(Rng& rng, int off) {
    const double a = 2 * M_PI * rng.uniform();
    const float c = static_cast<float>(std::cos(a)), s = static_cast<float>(std::sin(a));
    blocks_.push_back({off, 2, {c, -s, s, c}});
  }
  static void unit_quat(Rng& rng, double q[4]) {
    double nrm = 0;
    do {
      nrm = 0;
      for (int i = 0; i < 4; ++i) { q[i] = rng.normal(); nrm += q[i] * q[i]; }
    } while (nrm < 1e-12);
    nrm = std::sqrt(nrm);
    for (int i = 0; i < 4; ++i) q[i] /= nrm;
  }
  // y = qL * x * qR as a 4x4 matrix: L(qL) R(qR).
  void add_iso4(Rng& rng, int off) {
    double p[4], q[4];
    unit_quat(rng, p);
    unit_quat(rng, q);
    const double a = p[0], b = p[1], c = p[2], d = p[3];
    const double L[4][4] = {{a, -b, -c, -d}, {b, a, -d, c}, {c, d, a, -b}, {d, -c, b, a}};
    const double w = q[0], x = q[1], y = q[2], z = q[3];
    const double R[4][4] = {{w, -x, -y, -z}, {x, w, z, -y}, {y, -z, w, x}, {z, y, -x, w}};
    Block blk{off, 4, std::vector<float>(16)};
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        double s = 0;
        for (int k = 0; k < 4; ++k) s += L[i][k] * R[k][j];
        blk.m[i * 4 + j] = static_cast<float>(s);
      }
    blocks_.push_back(std::move(blk));
  }
  void run(size_t n, const float* x, float* y, bool transpose) const {
    const int d = dim_;
    copy_if_needed(n, d, x, y);  // validates; the blocks then work in place
    for (size_t r = 0; r < n; ++r) {
      float* row = y + r * d;
      for (const Block& b : blocks_) {
        float* v = row + b.off;
        const float* m = b.m.data();
        if (b.k == 4) {  // unrolled 4x4 (iso4)
          const float a0 = v[0], a1 = v[1], a2 = v[2], a3 = v[3];
          if (!transpose) {
            v[0] = m[0] * a0 + m[1] * a1 + m[2] * a2 + m[3] * a3;
            v[1] = m[4] * a0 + m[5] * a1 + m[6] * a2 + m[7] * a3;
            v[2] = m[8] * a0 + m[9] * a1 + m[10] * a2 + m[11] * a3;
            v[3] = m[12] * a0 + m[13] * a1 + m[14] * a2 + m[15] * a3;
          } else {
            v[0] = m[0] * a0 + m[4] * a1 + m[8] * a2 + m[12] * a3;
            v[1] = m[1] * a0 + m[5] * a1 + m[9] * a2 + m[13] * a3;
            v[2] = m[2] * a0 + m[6] * a1 + m[10] * a2 + m[14] * a3;
            v[3] = m[3] * a0 + m[7] * a1 + m[11] * a2 + m[15] * a3;
          }
        } else if (b.k == 2) {  // givens: [c -s; s c]
          const float a0 = v[0], a1 = v[1];
          if (!transpose) {
            v[0] = m[0] * a0 + m[1] * a1;
            v[1] = m[2] * a0 + m[3] * a1;
          } else {
            v[0] = m[0] * a0 + m[2] * a1;
            v[1] = m[1] * a0 + m[3] * a1;
          }
        } else {
          v[0] *= m[0];
        }
      }
    }
  }
};

class HaarRotation final : public Rotation {
 public:
  HaarRotation(int d, uint64_t seed) : Rotation(d, {RotationKind::haar, 0}, seed) {
    Rng rng(seed ^ 0x4841415251524e47ull);
    Eigen::MatrixXd g(d, d);
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j) g(i, j) = rng.normal();
    Eigen::HouseholderQR<Eigen::MatrixXd> qr(g);
    Eigen::MatrixXd q = qr.householderQ();
    const Eigen::MatrixXd& rr = qr.matrixQR();
    for (int j = 0; j < d; ++j)
      if (rr(j, j) < 0) q.col(j) *= -1.0;  // makes the law exactly Haar
    q_ = q.cast<float>();
  }
  void forward(size_t n, const float* x, float* y) const override { run(n, x, y, false); }
  void inverse(size_t n, const float* x, float* y) const override { run(n, x, y, true); }

 private:
  Eigen::MatrixXf q_;  // column-major d x d; forward: y = Q x
  // Batched products through OpenBLAS (runtime-dispatched AVX-512 kernels; Eigen here is
  // compiled for the baseline ISA). Rows: Y = X Q^T (forward) or X = Y Q (inverse).
  void run(size_t n, const float* x, float* y, bool inv) const {
    if (n == 0) return;
    TQ_CHECK(x != nullptr && y != nullptr, "rotation: null pointer for a batch of %zu vectors", n);
    checked_mul(n, static_cast<size_t>(dim_) * sizeof(float), "rotation batch");
    const int d = dim_;
    const size_t chunk = 256;
    std::vector<float> buf(chunk * dim_);
    for (size_t r0 = 0; r0 < n; r0 += chunk) {
      const int m = static_cast<int>(std::min(chunk, n - r0));
      // q_ is column-major, i.e. row-major Q^T: element (i, j) of Q at data[j * d + i].
      // Row-major X (m x d) times Q^T: B = X * Q^T  ->  op(B) = NoTrans(X) * Trans(Q) where Q
      // viewed row-major is the transpose of the stored column-major buffer.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, inv ? CblasTrans : CblasNoTrans, m, d, d, 1.0f, x + r0 * dim_, d,
                  q_.data(), d, 0.0f, buf.data(), d);
      std::memcpy(y + r0 * dim_, buf.data(), static_cast<size_t>(m) * dim_ * sizeof(float));
    }
  }
};

}  // namespace

std::unique_ptr<Rotation> make_rotation(const RotationSpec& spec, int dim, uint64_t seed) {
  TQ_CHECK(dim >= 1, "rotation dimension must be >= 1 (got %d)", dim);
  TQ_CHECK(dim <= (1 << 24), "rotation dimension %d is too large", dim);
  switch (spec.kind) {
    case RotationKind::identity: return std::make_unique<IdentityRotation>(dim, seed);
    case RotationKind::haar:
      TQ_CHECK(dim <= 8192, "haar rotation needs a dense %d x %d matrix; use hadamard above d = 8192", dim, dim);
      return std::make_unique<HaarRotation>(dim, seed);
    case RotationKind::hadamard: return std::make_unique<HadamardRotation>(dim, spec, seed);
    case RotationKind::block:
      TQ_CHECK(spec.block == 32 || spec.block == 64 || spec.block == 128,
               "block Hadamard width must be 32, 64 or 128 (got %d)", spec.block);
      return std::make_unique<HadamardRotation>(dim, spec, seed);
    case RotationKind::givens:
    case RotationKind::iso4: return std::make_unique<BlockMatrixRotation>(dim, spec, seed);
  }
  TQ_CHECK(false, "unknown rotation kind %d", static_cast<int>(spec.kind));
  return nullptr;
}

}  // namespace tq
