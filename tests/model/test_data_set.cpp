// One tests/data set (LING_DATA_SET) through runtime::Session: prefill, decode and MTP logits within relative L2
// 1e-4 of expected.safetensors (fp32), greedy ids equal; also the prompt through decode() and MTP per position.
#include <doctest/doctest.h>

#include <string>

#include "data_check.hpp"

TEST_CASE(LING_DATA_SET) {
  auto r = ling::test::run_data_set(std::string(LING_TEST_DATA) + "/" + LING_DATA_SET);
  MESSAGE(LING_DATA_SET << " (" << r.model_type << "): T=" << r.tokens << " N=" << r.decode_steps
                        << " prefill " << r.prefill_rel_l2 << ", decode " << r.decode_rel_l2 << ", mtp "
                        << r.mtp_rel_l2 << ", prompt via decode " << r.prefill_step_rel_l2 << ", mtp per position "
                        << r.mtp_step_rel_l2);
  CHECK(r.prefill_rel_l2 < 1e-4);
  CHECK(r.decode_rel_l2 < 1e-4);
  CHECK(r.prefill_step_rel_l2 < 1e-4);
  CHECK(r.greedy == r.expected_greedy);
  if (r.mtp_rel_l2 >= 0) {
    CHECK(r.mtp_rel_l2 < 1e-4);
    CHECK(r.mtp_step_rel_l2 < 1e-4);
  }
}
