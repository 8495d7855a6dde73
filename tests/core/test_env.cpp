#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "ling/core/env.hpp"

// env_int_in: the fallback when unset or empty, the number when whole and in range, else a ling::Error that names the
// variable and the value.
TEST_CASE("env_int_in: whole numbers in range, the fallback when unset, an Error naming the variable otherwise") {
  char const* n = "LING_TEST_ENV_SETTING";
  unsetenv(n);
  CHECK(ling::env_int_in(n, 20, 0, 90) == 20);
  setenv(n, "", 1);
  CHECK(ling::env_int_in(n, 20, 0, 90) == 20);
  for (auto [v, want] : {std::pair{"0", 0}, std::pair{"90", 90}, std::pair{"35", 35}, std::pair{"+7", 7}}) {
    setenv(n, v, 1);
    CHECK(ling::env_int_in(n, 20, 0, 90) == want);
  }
  for (char const* v : {"91", "-1", "abc", "20%", "2.5", "99999999999999999999"}) {
    CAPTURE(v);
    setenv(n, v, 1);
    try {
      (void)ling::env_int_in(n, 20, 0, 90);
      FAIL("accepted");
    } catch (ling::Error const& e) {
      CHECK(e.code() == ling::ErrorCode::kInvalidArgument);
      CHECK(std::string(e.what()).find(std::string(n) + "=" + v) != std::string::npos);
      CHECK(std::string(e.what()).find("from 0 to 90") != std::string::npos);
    }
  }
  unsetenv(n);
}
