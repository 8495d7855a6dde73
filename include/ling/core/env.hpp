#pragma once
// Settings read from the environment that change how the library runs (not what it computes), checked: a value that
// is not a whole number in range is a ling::Error naming the variable, not a silent fallback.
#include <cerrno>
#include <cstdlib>
#include <string>

#include "ling/core/error.hpp"

namespace ling {

// The whole decimal number that the environment variable `name` holds, in [lo, hi]; `fallback` when it is unset or
// empty. Anything else (letters, a fraction, trailing text, out of range) throws kInvalidArgument naming `name`.
inline int env_int_in(char const* name, int fallback, int lo, int hi) {
  char const* e = std::getenv(name);
  if (!e || !*e) return fallback;
  char* end = nullptr;
  errno = 0;
  long const v = std::strtol(e, &end, 10);
  require(errno == 0 && end != e && *end == '\0' && v >= lo && v <= hi, ErrorCode::kInvalidArgument,
          std::string(name) + "=" + e + ": expected a whole number from " + std::to_string(lo) + " to " +
              std::to_string(hi));
  return int(v);
}

}  // namespace ling
