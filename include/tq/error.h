// Errors, in three tiers (docs/design.md "Errors"):
//  - bad input from a user or a file: TQ_CHECK throws tq::Error with a message that says
//    what and where;
//  - broken internal invariants: TQ_ASSERT aborts with file:line;
//  - kernels are noexcept and never allocate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace tq {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// printf-style formatting into a std::string.
std::string strprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

namespace detail {
[[noreturn]] void throw_error(const std::string& msg);
[[noreturn]] void assert_fail(const char* cond, const char* file, int line);
}  // namespace detail

// Overflow-checked size arithmetic; `what` names the quantity in the error message.
size_t checked_mul(size_t a, size_t b, const char* what);
size_t checked_add(size_t a, size_t b, const char* what);

}  // namespace tq

#define TQ_CHECK(cond, ...)                                        \
  do {                                                             \
    if (!(cond)) ::tq::detail::throw_error(::tq::strprintf(__VA_ARGS__)); \
  } while (0)

#define TQ_ASSERT(cond)                                                   \
  do {                                                                    \
    if (!(cond)) ::tq::detail::assert_fail(#cond, __FILE__, __LINE__);   \
  } while (0)
