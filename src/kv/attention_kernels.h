// Shared between attention.cpp (driver) and attention_simd.cpp (fused kernels).
#pragma once

#include <cstddef>
#include <limits>

#include "kv/kv_internal.h"

namespace tq::kv {

constexpr int kChunkTokens = 2048;  // KV-length split (multiple of kBlock): fixed, so results
                                    // do not depend on the thread count

struct Shape {
  int D, H, KVH, G, n_q, n_tokens, n_quant;
  float scale;
};

// Online-softmax states of n rows (query x head): [m, l, pad..., acc[D]] each, stride D + 16.
struct States {
  float* base = nullptr;
  int D = 0;
  size_t stride() const noexcept { return (size_t)D + 16; }
  float& m(int k) const noexcept { return base[k * stride()]; }
  float& l(int k) const noexcept { return base[k * stride() + 1]; }
  float* acc(int k) const noexcept { return base + k * stride() + 16; }
  void reset(int k) const noexcept {
    m(k) = -std::numeric_limits<float>::infinity();
    l(k) = 0;
    for (int d = 0; d < D; ++d) acc(k)[d] = 0;
  }
};

// Fused decode (one query, G heads of one kv head) over quantized tokens [a, b) (a block
// aligned), limit = number of tokens the query sees. qd: G x D in the K domain. Updates st
// (rows 0..G-1, V domain). Returns false when no fused kernel handles (sk, sv) here.
bool fused_decode(const Shape& sh, const Stream& sk, const Stream& sv, const float* qd, int limit,
                  int a, int b, const States& st);

}  // namespace tq::kv
