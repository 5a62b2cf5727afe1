// Seeded random orthogonal transforms of R^d, applied to batches of row vectors.
//
//   haar      dense Haar-random matrix: QR of a Gaussian matrix with sign fix (Eigen).
//   hadamard  randomized Hadamard: random signs then the normalized fast Walsh-Hadamard
//             transform, O(d log d). When d is not a power of two with p the largest power
//             of two below d: signs, WHT on [0, p), signs, WHT on [d - p, d), signs, WHT on
//             [0, p): three overlapping orthogonal stages that mix every coordinate.
//   blockB    block-diagonal randomized Hadamard with B-wide blocks (B = 32, 64, 128); a
//             ragged tail block (d not a multiple of B) uses the overlapping scheme above.
//   givens    2-D Givens rotations of coordinate pairs by random angles (PlanarQuant-style);
//             an odd last coordinate gets a random sign.
//   iso4      4-D rotations x -> qL * x * qR of coordinate quadruples by random unit
//             quaternions (IsoQuant-style); a tail of 1-3 coordinates uses givens / sign.
//   identity  no rotation (for tests and ablations).
// All are exactly orthogonal (up to float rounding); inverse() undoes forward().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tq {

enum class RotationKind : uint8_t { identity = 0, haar = 1, hadamard = 2, block = 3, givens = 4, iso4 = 5 };

struct RotationSpec {
  RotationKind kind = RotationKind::hadamard;
  int block = 0;  // block width for RotationKind::block (32, 64 or 128)
};
// "haar" | "hadamard" | "block32" | "block64" | "block128" | "givens" | "iso4" | "identity".
RotationSpec parse_rotation(const std::string& name);
std::string rotation_name(const RotationSpec& spec);

class Rotation {
 public:
  virtual ~Rotation() = default;
  int dim() const noexcept { return dim_; }
  const RotationSpec& spec() const noexcept { return spec_; }
  uint64_t seed() const noexcept { return seed_; }
  // x, y: n * dim floats, row-major. y may alias x (in place).
  virtual void forward(size_t n, const float* x, float* y) const = 0;
  virtual void inverse(size_t n, const float* x, float* y) const = 0;

 protected:
  Rotation(int dim, RotationSpec spec, uint64_t seed) : dim_(dim), spec_(spec), seed_(seed) {}
  int dim_;
  RotationSpec spec_;
  uint64_t seed_;
};

// dim >= 1 (haar needs dim <= 8192); throws tq::Error on bad arguments.
std::unique_ptr<Rotation> make_rotation(const RotationSpec& spec, int dim, uint64_t seed);

// In-place normalized fast Walsh-Hadamard transform of n rows of length m (a power of two)
// with stride `stride` floats between rows. SIMD-dispatched; fwht_ref is the reference.
void fwht(size_t n, int m, float* x, size_t stride) noexcept;
void fwht_ref(size_t n, int m, float* x, size_t stride) noexcept;
// The same with optional element-wise multipliers (random signs) applied before (pre) and
// after (post) the transform; nullptr skips them. Bit-identical to separate passes.
void fwht_signed(size_t n, int m, float* x, size_t stride, const float* pre, const float* post) noexcept;
void fwht_signed_ref(size_t n, int m, float* x, size_t stride, const float* pre, const float* post) noexcept;

}  // namespace tq
