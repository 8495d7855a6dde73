#!/usr/bin/env bash
# On the GPU machine, with binaries staged by scripts/device-prebuild.sh and carried (carry [".deps", "build/device"]):
# compute-sanitizer racecheck over test_cuda_model's cases named by doctest filters, one process at a time (four
# Ling-3.0-flash-width cases at once made no progress in 290 s, session 46), each within LING_RACECHECK_TIMEOUT s
# (default 240). As device-prebuilt-check.sh's LING_CHECK_SANITIZE=all: the random-weight fill kernels left out and the
# flash-width cases run for LING_TEST_FLASH_STEPS steps (default 2) with a vocabulary of LING_TEST_FLASH_VOCAB rows
# (default 16 384 of 157 184: the LM head, the same kernel instance, reads x from shared memory once per row). Also left
# out: the random LM head's FP8-row quantization (random_weights.cuh quantize_fp8_rows_kernel, 157 184 blocks per model
# at these widths; lm_head.cuh's kernel of the same name uses no shared memory). Should this compute-sanitizer refuse a
# second exclusion, the case runs again with the first alone. Logs in $OUT/race-<n>.log, a line per case last.
#   bash scripts/device-racecheck-cases.sh "*L2 look-ahead*gives the default*" "*forced routing is predicted*" ...
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
for f in .deps/*.deb; do dpkg -x "$f" .deps/root; done
if [ -f build/device/bin.tar.xz ] && [ ! -x build/device/tests/cuda_model/test_cuda_model ]; then
  tar -C build/device -xJf build/device/bin.tar.xz
fi
export LD_LIBRARY_PATH=$PWD/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$PATH:/usr/local/cuda/bin
T=$PWD/build/device/tests/cuda_model/test_cuda_model
lines=()
i=0
for tc in "$@"; do
  i=$((i + 1))
  log="$OUT/race-$i.log"
  run() {
    (cd tests && LING_SANITIZER=racecheck LING_TEST_FLASH_STEPS=${LING_TEST_FLASH_STEPS:-2} \
      LING_TEST_FLASH_VOCAB=${LING_TEST_FLASH_VOCAB:-16384} \
      timeout "${LING_RACECHECK_TIMEOUT:-240}" stdbuf -oL compute-sanitizer --tool racecheck "$@" \
      --error-exitcode 9 "$T" "-tc=$tc" >"$log" 2>&1)
  }
  start=$(date +%s)
  run --kernel-name-exclude kns=fill --kernel-name-exclude kns=quantize_fp8_rows
  rc=$?
  if ! grep -q '^\[doctest\]' "$log"; then
    echo "two exclusions refused? $(head -3 "$log" | tr '\n' ' ')"
    start=$(date +%s)
    run --kernel-name-exclude kns=fill
    rc=$?
  fi
  lines+=("$tc: rc=$rc $(($(date +%s) - start)) s, $(grep -E 'RACECHECK SUMMARY' "$log" | head -1) \
$(grep -E '^\[doctest\] (test cases|assertions)' "$log" | tr -s ' ' | tr '\n' ' ')")
  echo "${lines[-1]}"
done
echo "---- racecheck, one case per process ($(nvidia-smi --query-gpu=name --format=csv,noheader))"
printf '%s\n' "${lines[@]}"
