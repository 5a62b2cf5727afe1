// The FFN gate activations of LlamaModel (internal to the library; tested in
// tests/test_qmatvec.cpp, Activation.*).
#pragma once

#include <cstddef>

namespace tq::llm {

// g[j] = gelu(g[j]) * u[j], j < n, with ggml's GELU (tanh approximation):
//   gelu(z) = 0.5 z (1 + tanh(sqrt(2/pi) z (1 + 0.044715 z^2))).
// SIMD (Highway dynamic dispatch, hwy's vector Tanh, at most 4 ulp from tanh) at every level
// but "scalar", where the plain formula with std::tanh runs (gelu_tanh_mul_ref). Either is
// within 1e-6 |z u| of the exact value (float rounding of the few operations around tanh; for
// z << 0 the result is a small difference 1 + tanh ~ 0, so the bound is on |z u|, not on the
// result). Single-threaded: callers split the range.
void gelu_tanh_mul(float* g, const float* u, size_t n) noexcept;
void gelu_tanh_mul_ref(float* g, const float* u, size_t n) noexcept;

}  // namespace tq::llm
