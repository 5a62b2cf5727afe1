// Highway kernel of gelu_tanh_mul (see activation.h): the GELU gate of gemma3's FFN, one vector
// of floats at a time with hwy's Tanh; the tail (fewer than a vector) through the scalar formula.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "llm/activation_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <cmath>

#include "llm/activation.h"
#include "tq/simd.h"

#ifndef TQ_LLM_ACTIVATION_SCALAR_
#define TQ_LLM_ACTIVATION_SCALAR_  // this file is included once per SIMD target
namespace tq::llm {
namespace {
inline float gelu_tanh_scalar(float z) {
  return 0.5f * z * (1.0f + std::tanh(0.7978845608028654f * z * (1.0f + 0.044715f * z * z)));
}
}  // namespace
}  // namespace tq::llm
#endif

HWY_BEFORE_NAMESPACE();
namespace tq::llm {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void GeluTanhMul(float* g, const float* u, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto c = hn::Set(d, 0.7978845608028654f), a = hn::Set(d, 0.044715f), one = hn::Set(d, 1.0f),
             half = hn::Set(d, 0.5f);
  size_t j = 0;
  for (; j + N <= n; j += N) {
    const auto z = hn::LoadU(d, g + j);
    // Same order of operations as the scalar formula: c z (1 + a z^2), then 0.5 z (1 + tanh).
    const auto t = hn::Tanh(d, hn::Mul(hn::Mul(c, z), hn::Add(one, hn::Mul(hn::Mul(a, z), z))));
    hn::StoreU(hn::Mul(hn::Mul(hn::Mul(half, z), hn::Add(one, t)), hn::LoadU(d, u + j)), d, g + j);
  }
  for (; j < n; ++j) g[j] = gelu_tanh_scalar(g[j]) * u[j];
}

}  // namespace HWY_NAMESPACE
}  // namespace tq::llm
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tq::llm {
HWY_EXPORT(GeluTanhMul);

void gelu_tanh_mul_ref(float* g, const float* u, size_t n) noexcept {
  for (size_t j = 0; j < n; ++j) g[j] = gelu_tanh_scalar(g[j]) * u[j];
}

void gelu_tanh_mul(float* g, const float* u, size_t n) noexcept {
  if (simd::use_scalar()) gelu_tanh_mul_ref(g, u, n);
  else HWY_DYNAMIC_DISPATCH(GeluTanhMul)(g, u, n);
}
}  // namespace tq::llm
#endif  // HWY_ONCE
