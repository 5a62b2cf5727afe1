#include "tq/error.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace tq {

std::string strprintf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string out;
  if (n > 0) {
    out.resize(static_cast<size_t>(n) + 1);
    std::vsnprintf(out.data(), out.size(), fmt, ap2);
    out.resize(static_cast<size_t>(n));
  }
  va_end(ap2);
  return out;
}

namespace detail {
void throw_error(const std::string& msg) { throw Error(msg); }
void assert_fail(const char* cond, const char* file, int line) {
  std::fprintf(stderr, "tq: internal error: assertion `%s` failed at %s:%d\n", cond, file, line);
  std::abort();
}
}  // namespace detail

size_t checked_mul(size_t a, size_t b, const char* what) {
  size_t r;
  TQ_CHECK(!__builtin_mul_overflow(a, b, &r), "size overflow computing %s (%zu * %zu)", what, a, b);
  return r;
}
size_t checked_add(size_t a, size_t b, const char* what) {
  size_t r;
  TQ_CHECK(!__builtin_add_overflow(a, b, &r), "size overflow computing %s (%zu + %zu)", what, a, b);
  return r;
}

}  // namespace tq
