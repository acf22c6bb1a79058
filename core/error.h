// core/error.h — errors are exceptions carrying one clear message: what was wrong and where.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace lockstep {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream s;
  (s << ... << args);
  return s.str();
}
}  // namespace detail

// LOCKSTEP_CHECK(cond, "message", values...): throws lockstep::Error with the message when cond fails.
#define LOCKSTEP_CHECK(cond, ...)                                             \
  do {                                                                        \
    if (!(cond)) throw ::lockstep::Error(::lockstep::detail::concat(__VA_ARGS__)); \
  } while (0)

[[noreturn]] inline void fail(const std::string& message) { throw Error(message); }

}  // namespace lockstep
