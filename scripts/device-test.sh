#!/usr/bin/env bash
# The one command for the GPU machine: configure with CUDA (sm_90a), build with all cores, run the `gpu` tests
# and the benchmarks, write logs under $OUT, print a short table last.
#
# Here (once per checkout, as root; needs Debian's package lists):  bash scripts/device-test.sh --stage
#   downloads the Debian -dev packages the build needs into .deps/ (git-ignored); the GPU machine has none of them
#   and reaches no registry, so every device call carries them: carry [".deps"].
# There (through the device tool):  bash scripts/device-test.sh [options]
#   --targets "a b"   build only these targets (default: all)
#   --tests REGEX     run only the gpu tests matching REGEX (default: all gpu tests)
#   --no-bench        skip the benchmarks
#   --bench-args "…"  extra arguments for `ling bench` (default: --spec ling3-flash --random-weights)
#   --sanitize        also run compute-sanitizer memcheck and racecheck over the gpu tests
#   --cpu-tests       also run the CPU tests there
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEB_PKGS="libeigen3-dev nlohmann-json3-dev libcli11-dev doctest-dev libpcre2-dev libpcre2-8-0 libbenchmark-dev libbenchmark1debian"

if [ "${1:-}" = "--stage" ]; then
  mkdir -p .deps && cd .deps && rm -f ./*.deb && apt-get download $DEB_PKGS && ls -la
  exit $?
fi

TARGETS=all; TESTS=""; BENCH=1; BENCH_ARGS="--spec ling3-flash --random-weights --contexts 0,4096,32768,131072 --reps 5"; SANITIZE=0; CPU_TESTS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --targets) TARGETS="$2"; shift 2;;
    --tests) TESTS="$2"; shift 2;;
    --no-bench) BENCH=0; shift;;
    --bench-args) BENCH_ARGS="$2"; shift 2;;
    --sanitize) SANITIZE=1; shift;;
    --cpu-tests) CPU_TESTS=1; shift;;
    *) echo "unknown option $1"; exit 2;;
  esac
done
OUT=${OUT:-$ROOT/out}; mkdir -p "$OUT"
BUILD=build/device
declare -a SUMMARY=()
note() { SUMMARY+=("$1"); }

# 1. dependencies: unpack the carried Debian packages under .deps/root
if ! ls .deps/*.deb >/dev/null 2>&1; then echo "no .deps/*.deb: run 'bash scripts/device-test.sh --stage' here and carry .deps"; exit 2; fi
mkdir -p .deps/root
for f in .deps/*.deb; do dpkg -x "$f" .deps/root || exit 2; done
export CMAKE_PREFIX_PATH="$ROOT/.deps/root/usr"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"

# 2. configure and build
t0=$(date +%s)
# configure_cuda DIR [cmake args]: a Release build with CUDA for sm_90a in DIR
configure_cuda() { cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLING_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a "${@:2}"; }
configure_cuda $BUILD -DLING_BUILD_TESTS=ON -DLING_BUILD_BENCH=ON >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
# LING_AB_CUDA_FLAGS: a second `ling` binary built with these extra CUDA flags (build/device-ab, alongside the main
# build), which the variants below that contain LING_BIN=ab run (A/B of compile-time trials in one call)
if [ -n "${LING_AB_CUDA_FLAGS:-}" ]; then
  (configure_cuda build/device-ab -DLING_BUILD_TESTS=OFF -DLING_BUILD_BENCH=OFF "-DCMAKE_CUDA_FLAGS=$LING_AB_CUDA_FLAGS" \
      >"$OUT/build-ab.log" 2>&1 &&
   cmake --build build/device-ab -j "$(nproc)" --target ling >>"$OUT/build-ab.log" 2>&1; echo "rc=$?" >>"$OUT/build-ab.log") &
fi
cmake --build $BUILD -j "$(nproc)" --target $TARGETS >"$OUT/build.log" 2>&1
rc_build=$?
wait
[ -n "${LING_AB_CUDA_FLAGS:-}" ] && note "build-ab ($LING_AB_CUDA_FLAGS): $(tail -1 "$OUT/build-ab.log")"
note "build ($TARGETS): rc=$rc_build in $(( $(date +%s) - t0 )) s"
[ $rc_build -eq 0 ] || { grep -E "error|Error" "$OUT/build.log" | head -40; }

# 3. gpu tests (without --tests, test_cuda_ops_moe runs last, after the benchmarks: it takes ~4 min, and a call cut
#    short by the device tool's 600 s limit then still has the measurements)
if [ -n "$TESTS" ]; then RF=(-R "$TESTS"); LATE=""; else RF=(-E test_cuda_ops_moe); LATE=test_cuda_ops_moe; fi
if [ "${LING_SKIP_CTEST:-0}" != 1 ]; then  # LING_SKIP_CTEST=1: only the sanitizer runs the selected tests
  ctest --test-dir $BUILD -L gpu "${RF[@]}" --output-on-failure --timeout 300 >"$OUT/gpu-tests.log" 2>&1
  note "gpu tests: $(grep -E 'tests passed|tests failed' "$OUT/gpu-tests.log" | tail -1)"
else
  LATE=""
fi
if [ $CPU_TESTS = 1 ]; then
  ctest --test-dir $BUILD -LE gpu --output-on-failure --timeout 300 -j 8 >"$OUT/cpu-tests.log" 2>&1
  note "cpu tests: $(grep -E 'tests passed|tests failed' "$OUT/cpu-tests.log" | tail -1)"
fi
if [ $SANITIZE = 1 ]; then
  # LING_SANITIZE_TOOLS (default "memcheck racecheck"), LING_SANITIZE_TIMEOUT (s per executable and tool, default 300),
  # LING_SANITIZE_JOBS (runs at once, default 1: every executable under every tool is one run, each with its own log,
  # joined per tool at the end); an executable's exit: 0 clean, 9 the tool reported errors, 124 cut by the timeout (its
  # log says how far it got)
  declare -a RUNS=()
  SEL=${LING_SANITIZE_EXES:-$TESTS}  # LING_SANITIZE_EXES: a regex of executables for the sanitizer alone
  for tool in ${LING_SANITIZE_TOOLS:-memcheck racecheck}; do
    for exe in $(find $BUILD/tests -type f -executable -name 'test_cuda*' | sort); do
      [ -n "$SEL" ] && ! [[ "$(basename "$exe")" =~ $SEL ]] && continue
      RUNS+=("$tool:$exe")
    done
  done
  source "$ROOT/scripts/sanitize-common.sh"
  sanitize_one() {  # TOOL EXE: one run; its log and a line "rc seconds" in $OUT/san-TOOL-NAME.{log,rc}
    local t1 rc n; t1=$(date +%s); n=$(basename "$2")
    # LING_SANITIZER: the tests skip their speed checks; LING_SANITIZE_ARGS: arguments for every executable (doctest's
    # filters, e.g. --test-case=..., when one executable is selected)
    # sanitize-common.sh: the flash-width cases' steps and vocabulary, and racecheck's kernel exclusions
    sanitizer_args "$1" "$2"
    (cd tests && env "${SAN_ENV[@]}" LING_SANITIZER="$1" timeout "${LING_SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool "$1" "${SAN_ARGS[@]}" \
        --error-exitcode 9 \
        "$ROOT/$2" ${LING_SANITIZE_ARGS:-} >"$OUT/san-$1-$n.log" 2>&1)
    rc=$?  # before any command substitution, which would set $? itself
    echo "$rc $(( $(date +%s) - t1 ))" >"$OUT/san-$1-$n.rc"
  }
  for r in "${RUNS[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "${LING_SANITIZE_JOBS:-1}" ]; do sleep 1; done
    sanitize_one "${r%%:*}" "${r#*:}" &
  done
  wait
  for tool in ${LING_SANITIZE_TOOLS:-memcheck racecheck}; do
    res=""
    for r in "${RUNS[@]}"; do
      [ "${r%%:*}" = "$tool" ] || continue
      n=$(basename "${r#*:}")
      { echo "==== $n"; cat "$OUT/san-$tool-$n.log"; } >>"$OUT/sanitize-$tool.log"
      read -r rc secs <"$OUT/san-$tool-$n.rc"
      res="$res $n=rc$rc/${secs}s"
      rm -f "$OUT/san-$tool-$n.log" "$OUT/san-$tool-$n.rc"
    done
    note "compute-sanitizer $tool:$res; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-$tool.log" | sort | uniq -c | tr '\n' ' ')"
  done
fi

# 4. benchmarks
if [ $BENCH = 1 ]; then
  # LING_BENCH_FILTER: a Google Benchmark filter for bench/cuda_* (default: every benchmark)
  for b in $BUILD/bench/cuda_*; do
    [ -x "$b" ] || continue
    name=$(basename "$b")
    "$b" --benchmark_min_time=0.2 ${LING_BENCH_FILTER:+--benchmark_filter="$LING_BENCH_FILTER"} >"$OUT/bench-$name.log" 2>&1
    note "bench $name: rc=$?"
  done
  # probes (answered in sessions 20, 21, 28, 29 and 31, docs/perf-log.md): with LING_PROBES=1, region_chain, ring_chain,
  # tma_box, matvec_wg, wgmma_rate, sm_service, moe_pattern, select_chain, tile_landing and wgmma_decode; LING_PROBE_LIST
  # names the probes to run instead (session 33's split_sums and flag_chain are run only that way)
  for p in ${LING_PROBE_LIST:-${LING_PROBES:+region_chain ring_chain tma_box matvec_wg wgmma_rate sm_service moe_pattern \
      select_chain tile_landing wgmma_decode}}; do
    [ -x $BUILD/bench/$p ] || continue
    timeout 120 $BUILD/bench/$p >"$OUT/probe-$p.log" 2>&1; note "probe $p: rc=$? (probe-$p.log)"
  done
  if [ -x $BUILD/examples/ling ]; then
    $BUILD/examples/ling bench $BENCH_ARGS >"$OUT/ling-bench.md" 2>&1; note "ling bench: rc=$?"
    # A/B at context 0 (one binary), in rounds: LING_CTX0_VARIANTS ("" for none): variants are separated by spaces, the
    # settings of one variant by commas; "X=1" is the default run. None by default.
    # variant_bench VARIANT CONTEXTS: one `ling bench` run with the variant's settings, appended to ling-bench.md
    # variant_bin VARIANT: the binary a variant runs (LING_BIN=ab: the LING_AB_CUDA_FLAGS build)
    variant_bin() { if [[ "$1" == *LING_BIN=ab* ]]; then echo build/device-ab/examples/ling; else echo $BUILD/examples/ling; fi; }
    variant_bench() {
      { echo; echo "### $1"; env ${1//,/ } "$(variant_bin "$1")" bench --spec ling3-flash --random-weights --contexts "$2" \
          --reps 3; } >>"$OUT/ling-bench.md" 2>&1; note "ling bench ($1): rc=$?"
    }
    for v in ${LING_CTX0_VARIANTS-}; do variant_bench "$v" 0; done
    # A/B at every context, in the same format; by default session 23's MLA attention and combine (kernel 3, a thread
    # per column) and two tiles per pass with Q̂'s loads first (kernel 6) against the default, two rounds
    # (docs/perf-log.md, session 24)
    MV="LING_MLA_KERNEL=3,LING_MLA_COMBINE=1 LING_MLA_KERNEL=6 X=1"
    for v in ${LING_LONG_VARIANTS-$MV $MV}; do variant_bench "$v" 0,4096,32768,131072; done
    # step timelines of launch A (LING_TRACE_VARIANTS, same format, none by default; each with LING_TRACE_MOEA=5, the
    # copies issued, and =4, the last tile landed): the KDA layers' launch A and launch B lines of tools/perf/trace_summary.py
    TV=${LING_TRACE_VARIANTS-}
    [ -n "$TV" ] && echo "trace columns: region blk entF entL waitF waitL | midMd midL endF endMd endL | dur (µs after the \
last wait exit; mid: the LING_TRACE_MOEA mark)" >>"$OUT/ling-bench.md"
    for v in $TV; do
      # LING_TRACE_MARKS: the LING_TRACE_MOEA marks to trace (MoeArgs::trace_mid); LING_TRACE_REGIONS: a regex of
      # the trace_summary.py lines to keep (all regions: "kda:|mla:")
      for m in ${LING_TRACE_MARKS:-5 4}; do
        env ${v//,/ } LING_TRACE="$OUT/trace.csv" LING_TRACE_MOEA=$m "$(variant_bin "$v")" bench --spec ling3-flash \
          --random-weights --contexts 0 --reps 1 >/dev/null 2>&1
        echo "trace $v MOEA=$m: $(python3 tools/perf/trace_summary.py "$OUT/trace.csv" 2>&1 | grep -E "${LING_TRACE_REGIONS:-kda:moe[AB]}" | tr '\n' ' ')" \
          >>"$OUT/ling-bench.md"
        rm -f "$OUT/trace.csv"
      done
    done
  fi
fi

# 5. the gpu test left for last (step 3)
if [ -n "$LATE" ]; then
  ctest --test-dir $BUILD -L gpu -R "$LATE" --output-on-failure --timeout 300 >>"$OUT/gpu-tests.log" 2>&1
  note "gpu tests ($LATE): $(grep -E 'tests passed|tests failed' "$OUT/gpu-tests.log" | tail -1)"
fi

rm -f "$OUT/configure.log" "$OUT/gpu.txt"  # the device tool returns at most 8 files
echo; echo "==== logs in \$OUT: $(ls "$OUT" | tr '\n' ' ')"
[ -f "$OUT/gpu-tests.log" ] && grep -E "Passed|Failed|\*\*\*|Skipped" "$OUT/gpu-tests.log" | tail -40
[ -f "$OUT/ling-bench.md" ] && grep -E "^\||^#|streaming-read|agreement|^trace|MLA chain in one launch" "$OUT/ling-bench.md"
echo; echo "| step | result |"; echo "|---|---|"
for s in "${SUMMARY[@]}"; do echo "| ${s%%:*} | ${s#*:} |"; done
