#include <doctest/doctest.h>

#include "ling/core/error.hpp"

TEST_CASE("Error carries its code and names what is at fault") {
  try {
    ling::fail(ling::ErrorCode::kMissingTensor, "model.safetensors: tensor 'lm_head.weight' is missing");
    FAIL("fail() returned");
  } catch (ling::Error const& e) {
    CHECK(e.code() == ling::ErrorCode::kMissingTensor);
    CHECK(std::string(e.what()) == "missing tensor: model.safetensors: tensor 'lm_head.weight' is missing");
  }
  ling::Status s(ling::ErrorCode::kConfig, "config.json: hidden_size");
  CHECK_FALSE(s.is_ok());
  CHECK_THROWS_AS(s.throw_if_error(), ling::Error);
  CHECK(ling::Status::ok().is_ok());
}
