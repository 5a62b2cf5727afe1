// Fused decode-attention kernels (placeholder until the SIMD kernels land).
#include "kv/attention_kernels.h"

namespace tq::kv {
bool fused_decode(const Shape&, const Stream&, const Stream&, const float*, int, int, int,
                  const States&) {
  return false;
}
}  // namespace tq::kv
