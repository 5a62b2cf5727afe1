// Helpers shared by the KV cache tests (test_kv_cache.cpp, test_kv_quality.cpp).
#pragma once

#include <cmath>
#include <vector>

namespace tq_test {

// ||a - b|| / ||b|| (or ||a - b|| when b is zero).
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double)(a[i] - b[i]) * (a[i] - b[i]);
    den += (double)b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace tq_test
