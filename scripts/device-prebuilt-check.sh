#!/usr/bin/env bash
# On the GPU machine, with binaries staged by scripts/device-prebuild.sh and carried (carry [".deps", "build/device"]):
# the staged gpu tests (from tests/, as ctest runs them), `ling bench` at four contexts, and compute-sanitizer memcheck
# and racecheck on a doctest filter of test_cuda_kernels; logs in $OUT, a short table last.
#   bash scripts/device-prebuilt-check.sh [sanitizer test-case filter, default 'MLA*'] [reps, default 3]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
for f in .deps/*.deb; do dpkg -x "$f" .deps/root; done
export LD_LIBRARY_PATH=$PWD/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$PATH:/usr/local/cuda/bin
B=$PWD/build/device
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
summary=()
for t in "$B"/tests/cuda_model/test_*; do
  [ -x "$t" ] || continue
  n=$(basename "$t")
  (cd tests && timeout 300 "$t" >"$OUT/$n.log" 2>&1); rc=$?
  summary+=("$n rc=$rc $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/$n.log" | tr -s ' ' | tr '\n' ' ')")
done
if [ -x "$B/examples/ling" ]; then
  timeout 400 "$B/examples/ling" bench --spec ling3-flash --random-weights --contexts 0,4096,32768,131072 --reps "${2:-3}" \
    >"$OUT/bench.log" 2>&1
fi
if [ -x "$B/tests/cuda_model/test_cuda_kernels" ]; then
  for tool in memcheck racecheck; do
    (cd tests && timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 "$B/tests/cuda_model/test_cuda_kernels" \
      -tc="${1:-MLA*}" >"$OUT/sanitizer-$tool.log" 2>&1); rc=$?
    summary+=("compute-sanitizer $tool (${1:-MLA*}) rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer-$tool.log" | head -1)")
  done
fi
echo "---- summary ($(cat "$OUT/gpu.txt"))"
printf '%s\n' "${summary[@]}"
grep -E "streaming-read|^\| " "$OUT/bench.log" 2>/dev/null
