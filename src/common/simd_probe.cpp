// The Highway target HWY_DYNAMIC_DISPATCH runs now (tq::simd::dispatched_target): lets the
// tests check that set_level reaches Highway's dispatch, not only tq's own bookkeeping.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "common/simd_probe.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace tq::simd {
namespace HWY_NAMESPACE {
int64_t Target() { return HWY_TARGET; }
}  // namespace HWY_NAMESPACE
}  // namespace tq::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <hwy/targets.h>

#include <cctype>
#include <string>

#include "tq/simd.h"

namespace tq::simd {
HWY_EXPORT(Target);
std::string dispatched_target() {
  std::string name = hwy::TargetName(HWY_DYNAMIC_DISPATCH(Target)());
  for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}
}  // namespace tq::simd
#endif
