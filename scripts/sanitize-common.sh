# Sourced by the sanitizer runs of scripts/device-test.sh, device-prebuilt-check.sh and device-racecheck-cases.sh (from
# the repository root): one place for what every compute-sanitizer run of the gpu tests leaves out or shortens.
# - The Ling-3.0-flash-width cases of test_cuda_model run 2 steps instead of 8 (LING_TEST_FLASH_STEPS), on a vocabulary
#   of 16 384 rows instead of 157 184 (LING_TEST_FLASH_VOCAB, model_harness.cu: the LM head is the same kernel instance
#   there; at full size its shared-memory reads are about half of the step's, an estimate). Either can be set before.
# - racecheck leaves out the random-weight fill kernels (no shared memory; they took the host's 125 GB within a minute
#   at these widths, session 46) and, in test_cuda_model, the random LM head's FP8-row quantization (random_weights.cuh,
#   157 184 blocks per model build; lm_head.cuh's kernel of that name uses no shared memory). With both left out the MLA
#   flash-width case took 227 s under racecheck (session 47).
# sanitizer_args TOOL EXE: in SAN_ENV the settings for the run (for `env`: only the sanitizer's runs get them), in
# SAN_ARGS compute-sanitizer's kernel exclusions for TOOL on the test executable EXE.
sanitizer_args() {
  SAN_ENV=(LING_TEST_FLASH_STEPS="${LING_TEST_FLASH_STEPS:-2}" LING_TEST_FLASH_VOCAB="${LING_TEST_FLASH_VOCAB:-16384}")
  SAN_ARGS=()
  [ "$1" = racecheck ] || return 0
  SAN_ARGS=(--kernel-name-exclude kns=fill)
  [ "$(basename "$2")" = test_cuda_model ] && SAN_ARGS+=(--kernel-name-exclude kns=quantize_fp8_rows)
  return 0
}
