#!/usr/bin/env bash
# One device call for the CUDA model (helper cuda-model): runs binaries built here (carried in build/cuda-model-bin),
# or builds them there when they do not run. Logs under $OUT; a short summary last.
#   bash tests/cuda_model/device_run.sh [--sanitize] [--bench-args "..."] [--skip-tests]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
SAN=0; SKIP_TESTS=0; BENCH_ARGS="--spec ling3-flash --random-weights --contexts 0,4096,32768,131072 --reps 5 --tokens 32"
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) SAN=1; shift;;
    --skip-tests) SKIP_TESTS=1; shift;;
    --bench-args) BENCH_ARGS="$2"; shift 2;;
    *) echo "unknown option $1"; exit 2;;
  esac
done
BIN=build/cuda-model-bin
if ls .deps/*.deb >/dev/null 2>&1; then mkdir -p .deps/root; for f in .deps/*.deb; do dpkg -x "$f" .deps/root; done; fi
export LD_LIBRARY_PATH="$PWD/.deps/root/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
summary=()
if ! "$BIN/test_cuda_kernels" --help >/dev/null 2>&1; then
  echo "carried binaries do not run here: building"; ldd "$BIN/test_cuda_kernels" | grep "not found"
  export CMAKE_PREFIX_PATH="$PWD/.deps/root/usr"
  t0=$(date +%s)
  cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DLING_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a >"$OUT/configure.log" 2>&1
  cmake --build build/dev -j "$(nproc)" --target test_cuda_kernels test_cuda_model ling cuda_model >"$OUT/build.log" 2>&1
  summary+=("build on device: rc=$? in $(( $(date +%s) - t0 )) s")
  grep -E "error" "$OUT/build.log" | head -20
  mkdir -p build/devbin; for b in tests/cuda_model/test_cuda_kernels tests/cuda_model/test_cuda_model examples/ling bench/cuda_model; do cp build/dev/$b build/devbin/ 2>/dev/null; done
  BIN=build/devbin
fi
if [ $SKIP_TESTS = 0 ]; then
  (cd tests && timeout 120 "../$BIN/test_cuda_kernels" >"$OUT/test_cuda_kernels.log" 2>&1); summary+=("test_cuda_kernels: rc=$? $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/test_cuda_kernels.log" | tr '\n' ' ')")
  (cd tests && timeout 120 "../$BIN/test_cuda_model" >"$OUT/test_cuda_model.log" 2>&1); summary+=("test_cuda_model: rc=$? $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/test_cuda_model.log" | tr '\n' ' ')")
fi
if [ $SAN = 1 ]; then
  for tool in memcheck racecheck; do
    (cd tests && timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 "../$BIN/test_cuda_kernels" >"$OUT/sanitize-$tool.log" 2>&1)
    summary+=("compute-sanitizer $tool test_cuda_kernels: rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitize-$tool.log" | tail -1)")
  done
fi
timeout 150 "$BIN/ling" bench $BENCH_ARGS >"$OUT/ling-bench.md" 2>&1; summary+=("ling bench: rc=$?")
[ -x "$BIN/cuda_model" ] && { timeout 60 "$BIN/cuda_model" --benchmark_min_time=0.1s >"$OUT/bench-cuda_model.log" 2>&1; summary+=("bench cuda_model: rc=$?"); }
echo "==== failures"; grep -hE "ERROR|FAILED|error:|CHECK\(|REQUIRE" "$OUT"/test_cuda_*.log | head -40
grep -hE "rel L2" "$OUT"/test_cuda_model.log | head -12
echo "==== bench"; tail -22 "$OUT/ling-bench.md"; grep -E "BM_" "$OUT/bench-cuda_model.log" 2>/dev/null | head
echo; for s in "${summary[@]}"; do echo "| $s |"; done
