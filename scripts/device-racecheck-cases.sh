#!/usr/bin/env bash
# On the GPU machine, with binaries staged by scripts/device-prebuild.sh and carried (carry [".deps", "build/device"]):
# compute-sanitizer racecheck over test_cuda_model's cases (or those of LING_RACECHECK_EXE, another staged test
# executable) named by doctest filters, one process at a time (four Ling-3.0-flash-width cases at once made no
# progress in 290 s, session 46), each within LING_RACECHECK_TIMEOUT s
# (default 240), with scripts/sanitize-common.sh's settings (the flash-width cases' steps and vocabulary, the kernels
# racecheck leaves out). Logs in $OUT/race-<n>.log, a line per case last.
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
T=${LING_RACECHECK_EXE:-$PWD/build/device/tests/cuda_model/test_cuda_model}  # or another staged test executable
source scripts/sanitize-common.sh
sanitizer_args racecheck "$T"
lines=()
i=0
for tc in "$@"; do
  i=$((i + 1))
  log="$OUT/race-$i.log"
  start=$(date +%s)
  (cd tests && env "${SAN_ENV[@]}" LING_SANITIZER=racecheck timeout "${LING_RACECHECK_TIMEOUT:-240}" stdbuf -oL \
    compute-sanitizer --tool racecheck "${SAN_ARGS[@]}" --error-exitcode 9 "$T" "-tc=$tc" >"$log" 2>&1)
  rc=$?
  lines+=("$tc: rc=$rc $(($(date +%s) - start)) s, $(grep -E 'RACECHECK SUMMARY' "$log" | head -1) \
$(grep -E '^\[doctest\] (test cases|assertions)' "$log" | tr -s ' ' | tr '\n' ' ')")
  echo "${lines[-1]}"
done
echo "---- racecheck, one case per process ($(nvidia-smi --query-gpu=name --format=csv,noheader))"
printf '%s\n' "${lines[@]}"
