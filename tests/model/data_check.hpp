#pragma once
// Runs a tests/data set (config.json + weights + expected.safetensors written by tools/oracle) through
// runtime::Session and measures it against the expected outputs. Compiled once into a library shared by the
// per-set test executables, so each set is its own readable test.
#include <cstdint>
#include <string>
#include <vector>

namespace ling::test {

struct DataSetReport {
  std::string model_type;
  std::int64_t tokens = 0, decode_steps = 0, vocab = 0;
  double prefill_rel_l2 = -1, decode_rel_l2 = -1, mtp_rel_l2 = -1;  // -1: not present in the set
  double mtp_step_rel_l2 = -1;                                       // MTP one position at a time vs expected
  double prefill_step_rel_l2 = -1;                                   // prompt through decode() vs expected
  bool greedy_equal = false;
  std::vector<std::int32_t> greedy, expected_greedy;
};

DataSetReport run_data_set(std::string const& dir);

}  // namespace ling::test
