#!/usr/bin/env bash
# On the GPU machine, with binaries staged by scripts/device-prebuild.sh and carried (carry [".deps", "build/device"]):
# the staged gpu tests (from tests/, as ctest runs them), `ling bench` at four contexts, and compute-sanitizer memcheck
# and racecheck on a doctest filter of test_cuda_kernels; logs in $OUT, a short table last.
#   bash scripts/device-prebuilt-check.sh [sanitizer test-case filter, default 'MLA*'] [reps, default 3]
# LING_CHECK_TESTS=0 / LING_CHECK_BENCH=0 / LING_CHECK_SANITIZE=0 skip the plain test runs / the four-context table /
# the sanitizers; LING_CHECK_SANITIZE=all runs them over every staged test executable (below). LING_CHECK_TRACE=1 also
# traces one step at context 0 block by block ($OUT/trace.csv, $OUT/trace-blocks.csv) and prints the regions' medians
# (tools/perf/trace_summary.py) and why their blocks end apart (tools/perf/trace_blocks.py).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
for f in .deps/*.deb; do dpkg -x "$f" .deps/root; done
if [ -f build/device/bin.tar.xz ]; then tar -C build/device -xJf build/device/bin.tar.xz; fi
export LD_LIBRARY_PATH=$PWD/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$PATH:/usr/local/cuda/bin
B=$PWD/build/device
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
summary=()
for t in "$B"/tests/cuda_*/test_cuda_*; do
  [ -x "$t" ] && [ "${LING_CHECK_TESTS:-1}" != 0 ] || continue
  n=$(basename "$t")
  (cd tests && timeout 300 "$t" >"$OUT/$n.log" 2>&1); rc=$?
  summary+=("$n rc=$rc $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/$n.log" | tr -s ' ' | tr '\n' ' ')")
done
if [ -x "$B/examples/ling" ] && [ "${LING_CHECK_BENCH:-1}" != 0 ]; then
  timeout 400 "$B/examples/ling" bench --spec ling3-flash --random-weights --contexts 0,4096,32768,131072 --reps "${2:-3}" \
    >"$OUT/bench.log" 2>&1
fi
if [ -x "$B/examples/ling" ] && [ "${LING_CHECK_TRACE:-0}" = 1 ]; then
  LING_TRACE="$OUT/trace.csv" LING_TRACE_BLOCKS="$OUT/trace-blocks.csv" timeout 200 "$B/examples/ling" bench \
    --spec ling3-flash --random-weights --contexts 0 --reps 1 >"$OUT/trace-bench.log" 2>&1
  python3 tools/perf/trace_summary.py "$OUT/trace.csv" >"$OUT/trace-summary.txt" 2>&1
  python3 tools/perf/trace_blocks.py "$OUT/trace-blocks.csv" >"$OUT/trace-blocks.txt" 2>&1
fi
# LING_CHECK_SANITIZE=all: memcheck and racecheck over every staged gpu test executable instead (LING_SANITIZER set,
# so the tests skip their speed bounds), LING_SANITIZE_JOBS runs at once (default 8), each within
# LING_SANITIZE_TIMEOUT s (default 540); racecheck of test_cuda_model runs one process per test case (whole, it
# outran 370 s in session 25). LING_SANITIZE_TOOLS (default "racecheck memcheck") and LING_SANITIZE_EXES (a regex of
# executable names) narrow it, as in scripts/device-test.sh. One log per run in $OUT/san-*.log.
if [ "${LING_CHECK_SANITIZE:-1}" = all ]; then
  source scripts/sanitize-common.sh
  san() {  # tool exe tag [doctest filter]
    # stdbuf: the test's output line-buffered, so that a run that dies by a signal still shows how far it got.
    # sanitize-common.sh: the flash-width cases' steps and vocabulary, and racecheck's kernel exclusions
    sanitizer_args "$1" "$2"
    (cd tests && env "${SAN_ENV[@]}" LING_SANITIZER="$1" timeout "${LING_SANITIZE_TIMEOUT:-540}" stdbuf -oL compute-sanitizer --tool "$1" \
      "${SAN_ARGS[@]}" --error-exitcode 9 "$2" ${4:+"-tc=$4"} >"$OUT/san-$1-$3.log" 2>&1)
    echo "rc=$?" >>"$OUT/san-$1-$3.log"
    # its line on stdout now: the device tool returns at most 8 files, and a call cut by its limit prints no summary
    san_line "$OUT/san-$1-$3.log"
  }
  san_line() {  # LOG: a run's line (its tag, exit, the tool's summary, doctest's counts)
    echo "$(basename "$1" .log) $(tail -1 "$1") $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$1" | head -1) \
$(grep -E '^\[doctest\] (test cases|assertions)' "$1" | tr -s ' ' | tr '\n' ' ')"
  }
  # LING_SANITIZE_DEADLINE (s from here, default none): runs not started by then are skipped and named, so that a
  # call under the device tool's limit ends with its summary (keep DEADLINE + TIMEOUT below that limit; session 62:
  # 31 runs at 10 at once outran 560 s and every line was lost). LING_SANITIZE_FIRST_CASE=k: racecheck of
  # test_cuda_model from its k-th case on (the next call after such a cut).
  t_start=$(date +%s)
  started() {  # TAG: 0 if the deadline allows another run
    if [ -n "${LING_SANITIZE_DEADLINE:-}" ] && [ $(( $(date +%s) - t_start )) -ge "$LING_SANITIZE_DEADLINE" ]; then
      summary+=("$1 not started (LING_SANITIZE_DEADLINE=$LING_SANITIZE_DEADLINE s)"); return 1
    fi
  }
  for tool in ${LING_SANITIZE_TOOLS:-racecheck memcheck}; do
    for t in "$B"/tests/cuda_*/test_cuda_*; do
      n=$(basename "$t")
      [[ "$n" =~ ${LING_SANITIZE_EXES:-.} ]] || continue
      if [ $tool = racecheck ] && [ "$n" = test_cuda_model ]; then
        i=0
        while IFS= read -r tc; do
          i=$((i + 1))
          [ $i -ge "${LING_SANITIZE_FIRST_CASE:-1}" ] || continue  # the cases before it ran in an earlier call
          # a comma separates doctest filters: match it by a wildcard
          if started "san-$tool-$n-$i"; then san $tool "$t" "$n-$i" "${tc//,/*}" & fi
          while [ "$(jobs -rp | wc -l)" -ge "${LING_SANITIZE_JOBS:-8}" ]; do sleep 1; done
        done < <("$t" --list-test-cases --no-version 2>/dev/null | grep -v -E '^\[doctest\]|^=+$' | sed '/^$/d')
      else
        if started "san-$tool-$n"; then san $tool "$t" "$n" & fi
      fi
      while [ "$(jobs -rp | wc -l)" -ge "${LING_SANITIZE_JOBS:-8}" ]; do sleep 1; done
    done
  done
  wait
  for f in "$OUT"/san-*.log; do
    summary+=("$(san_line "$f")")
  done
elif [ -x "$B/tests/cuda_model/test_cuda_kernels" ] && [ "${LING_CHECK_SANITIZE:-1}" != 0 ]; then
  for tool in memcheck racecheck; do
    (cd tests && timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 "$B/tests/cuda_model/test_cuda_kernels" \
      -tc="${1:-MLA*}" >"$OUT/sanitizer-$tool.log" 2>&1); rc=$?
    summary+=("compute-sanitizer $tool (${1:-MLA*}) rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer-$tool.log" | head -1)")
  done
fi
echo "---- summary ($(cat "$OUT/gpu.txt"))"
printf '%s\n' "${summary[@]}"
grep -E "streaming-read|^\| " "$OUT/bench.log" 2>/dev/null
cat "$OUT/trace-summary.txt" "$OUT/trace-blocks.txt" 2>/dev/null
