#!/usr/bin/env bash
# One device call for the CUDA model (helper cuda-model): builds the gpu targets there (-j all cores) unless working
# binaries are carried in build/cuda-model-bin, then runs the kernel tests, `ling bench`, the whole-model test and the
# kernel benchmarks, each under a time limit. Logs under $OUT; a short summary last.
#   bash tests/cuda_model/device_run.sh [--sanitize] [--bench-args "..."]      (device tool: carry [".deps"])
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
SAN=0; BENCH_ARGS="--spec ling3-flash --random-weights --contexts 0,4096,32768,131072 --reps 5 --tokens 32"
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) SAN=1; shift;;
    --bench-args) BENCH_ARGS="$2"; shift 2;;
    *) echo "unknown option $1"; exit 2;;
  esac
done
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
BIN=build/cuda-model-bin
if ls .deps/*.deb >/dev/null 2>&1; then mkdir -p .deps/root; for f in .deps/*.deb; do dpkg -x "$f" .deps/root; done; fi
export LD_LIBRARY_PATH="$PWD/.deps/root/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
summary=()
if ! "$BIN/test_cuda_kernels" --help >/dev/null 2>&1; then
  export CMAKE_PREFIX_PATH="$PWD/.deps/root/usr"
  rm -rf build/dev
  ls -la .deps/root/usr/include/pcre2.h .deps/root/usr/lib/x86_64-linux-gnu/libpcre2-8.so.0 | tee "$OUT/deps.txt"
  cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DLING_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
        -DLING_BUILD_TESTS=ON -DLING_BUILD_BENCH=ON -DCMAKE_LIBRARY_PATH="$PWD/.deps/root/usr/lib/x86_64-linux-gnu" \
        -DLING_PCRE2_LIBRARY="$PWD/.deps/root/usr/lib/x86_64-linux-gnu/libpcre2-8.so.0" -DLING_PCRE2_INCLUDE_DIR="$PWD/.deps/root/usr/include" \
        -Dbenchmark_DIR="$PWD/.deps/root/usr/lib/x86_64-linux-gnu/cmake/benchmark" >"$OUT/configure.log" 2>&1 || grep -B2 -A6 -i error "$OUT/configure.log" | head -30
  timeout 200 cmake --build build/dev -j "$(nproc)" --target test_cuda_kernels ling test_cuda_model cuda_model -- -k 0 >"$OUT/build.log" 2>&1
  summary+=("build on device: rc=$? at $(el) s")
  grep -E "error|FAILED" "$OUT/build.log" | head -30
  BIN=build/devbin; mkdir -p $BIN
  for b in tests/cuda_model/test_cuda_kernels tests/cuda_model/test_cuda_model examples/ling bench/cuda_model; do cp build/dev/$b $BIN/ 2>/dev/null; done
  mkdir -p "$OUT/bin"; cp $BIN/* "$OUT/bin/" 2>/dev/null
fi
if [ -x "$BIN/test_cuda_kernels" ]; then
  (cd tests && timeout 60 "../$BIN/test_cuda_kernels" >"$OUT/test_cuda_kernels.log" 2>&1)
  summary+=("test_cuda_kernels: rc=$? $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/test_cuda_kernels.log" | tr '\n' ' ') at $(el) s")
fi
if [ -x "$BIN/ling" ]; then
  timeout 100 "$BIN/ling" bench $BENCH_ARGS >"$OUT/ling-bench.md" 2>&1; summary+=("ling bench: rc=$? at $(el) s")
fi
if [ -x "$BIN/test_cuda_model" ]; then
  (cd tests && timeout 45 "../$BIN/test_cuda_model" >"$OUT/test_cuda_model.log" 2>&1)
  summary+=("test_cuda_model: rc=$? $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/test_cuda_model.log" | tr '\n' ' ') at $(el) s")
fi
if [ -x "$BIN/cuda_model" ]; then
  timeout 40 "$BIN/cuda_model" --benchmark_min_time=0.05s >"$OUT/bench-cuda_model.log" 2>&1; summary+=("bench cuda_model: rc=$? at $(el) s")
fi
if [ $SAN = 1 ] && [ -x "$BIN/test_cuda_kernels" ]; then
  for tool in memcheck racecheck; do
    (cd tests && timeout 30 compute-sanitizer --tool $tool --error-exitcode 9 "../$BIN/test_cuda_kernels" >"$OUT/sanitize-$tool.log" 2>&1)
    summary+=("compute-sanitizer $tool: rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitize-$tool.log" | tail -1) at $(el) s")
  done
fi
echo "==== failures"; grep -hE "ERROR:|FAILED|error:|CHECK|REQUIRE" "$OUT"/test_cuda_*.log 2>/dev/null | head -30
grep -hE "rel L2|agreement" "$OUT"/test_cuda_*.log 2>/dev/null | head -24
echo "==== bench"; tail -16 "$OUT/ling-bench.md" 2>/dev/null; grep -E "^BM_" "$OUT/bench-cuda_model.log" 2>/dev/null | head -10
echo; for s in "${summary[@]}"; do echo "| $s |"; done
