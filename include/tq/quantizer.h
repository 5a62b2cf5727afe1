// TurboQuant quantizers with a batch API.
//
//   mse   TurboQuant_mse: s = ||x||, y = Pi x / s, idx_i = nearest centroid of y_i.
//         Stored norm: s / ||c[idx]|| with norm correction (default), else s.
//         x_hat = stored_norm * Pi^T c[idx].
//   prod  TurboQuant_prod: (bits - 1)-bit mse stage without norm correction, plus 1-bit QJL
//         of the residual r = u - u_hat: sign(S r) with S a dense d x d N(0, 1) matrix,
//         and gamma = ||r||. <q, x> ~= s * (<q, u_hat> + gamma * sqrt(pi/2)/d * <S q, sign(S r)>).
//         Unbiased. bits >= 2 (bits == 1 is plain qjl).
//   qjl   QJL alone: s and sign(S u); <q, x> ~= s * sqrt(pi/2)/d * <S q, sign(S u)>.
//
// Code layout (one vector, code_bytes() bytes, little-endian, no padding):
//   mse : [norm: f16 (2 B) or f32 (4 B)] [indices: packed_bytes(d, bits)]
//   prod: [norm][gamma: same format as norm] [indices: packed_bytes(d, bits-1)] [signs: packed_bytes(d, 1)]
//   qjl : [norm] [signs: packed_bytes(d, 1)]
// (bitpack.h gives the bit order.) A zero vector encodes to norm 0 and decodes to zeros.
// Inputs with NaN or Inf are rejected with tq::Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tq/codebook.h"
#include "tq/rotation.h"

namespace tq {

enum class QuantizerKind : uint8_t { mse = 0, prod = 1, qjl = 2 };
QuantizerKind parse_quantizer_kind(const std::string& s);  // "mse" | "prod" | "qjl"
const char* quantizer_kind_name(QuantizerKind k) noexcept;

enum class NormFormat : uint8_t { f16 = 0, f32 = 1 };
NormFormat parse_norm_format(const std::string& s);  // "f16" | "f32"; throws tq::Error

struct QuantizerConfig {
  int dim = 0;
  int bits = 4;                        // bits per coordinate, everything but the norms
  RotationSpec rotation{};             // default: randomized Hadamard
  uint64_t seed = 0x5eed;              // rotation (and QJL matrix) seed
  Law law = Law::beta;
  NormFormat norm = NormFormat::f16;
  bool norm_correction = true;         // mse only
};

class Quantizer {
 public:
  virtual ~Quantizer() = default;
  const QuantizerConfig& config() const noexcept { return cfg_; }
  int dim() const noexcept { return cfg_.dim; }
  QuantizerKind kind() const noexcept { return kind_; }
  const Rotation& rotation() const noexcept { return *rot_; }
  size_t code_bytes() const noexcept { return code_bytes_; }
  // Storage cost per coordinate including norms: code_bytes() * 8 / dim.
  double bits_per_value() const noexcept { return code_bytes_ * 8.0 / cfg_.dim; }

  // x: n * dim floats (row-major); codes: n * code_bytes() bytes.
  virtual void encode(size_t n, const float* x, uint8_t* codes) const = 0;
  virtual void decode(size_t n, const uint8_t* codes, float* x) const = 0;

  // Inner products of one float query with n coded vectors, without decoding them.
  // prepare_query fills query_state_floats() floats (the rotated query, and S q for
  // prod / qjl); score writes n estimates of <q, x_i>.
  virtual size_t query_state_floats() const noexcept = 0;
  virtual void prepare_query(const float* q, float* state) const = 0;
  virtual void score(const float* state, size_t n, const uint8_t* codes, float* out) const = 0;

 protected:
  Quantizer(QuantizerKind kind, const QuantizerConfig& cfg);
  QuantizerKind kind_;
  QuantizerConfig cfg_;
  std::unique_ptr<Rotation> rot_;
  size_t code_bytes_ = 0;
};

// Validates cfg (dim >= 2, bits 1..8, prod bits >= 2) and builds the quantizer.
std::unique_ptr<Quantizer> make_quantizer(QuantizerKind kind, const QuantizerConfig& cfg);

// Kernels shared with the KV cache and the index (rotated domain, unit-scale values).
// quantize_rotated: y: n values -> idx: n codebook indices (count of boundaries <= y), of the
// float products scale * y[i] when a scale is given (the index's grid fit).
void quantize_rotated(const Codebook& cb, size_t n, const float* y, uint8_t* idx, float scale = 1.f) noexcept;
void quantize_rotated_ref(const Codebook& cb, size_t n, const float* y, uint8_t* idx, float scale = 1.f) noexcept;
// dot_centroids: sum_i q[i] * c[idx[i]] over n coordinates.
float dot_centroids(const Codebook& cb, size_t n, const float* q, const uint8_t* idx) noexcept;
float dot_centroids_ref(const Codebook& cb, size_t n, const float* q, const uint8_t* idx) noexcept;

}  // namespace tq
