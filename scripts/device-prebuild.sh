#!/usr/bin/env bash
# Build the GPU binaries here (no GPU needed: nvcc compiles for sm_90a) and stage them, stripped, in build/device for
# the device tool to carry, so a device call spends its time measuring instead of building:
#   bash scripts/device-prebuild.sh [targets]      (default: ling test_cuda_model test_cuda_kernels)
# then call the device tool with carry [".deps", "build/device"] and run the binaries directly there. Unpack them
# first, as scripts/device-prebuilt-check.sh and device-ab.sh do: `tar -C build/device -xJf build/device/bin.tar.xz`,
# `for f in .deps/*.deb; do dpkg -x $f .deps/root; done`, LD_LIBRARY_PATH=$PWD/.deps/root/usr/lib/x86_64-linux-gnu;
# tests run from tests/, as ctest runs them. The carry replaces build/device on every call, so unpack on every call.
# The device tool carries at most 64 MiB with the tracked files (~33 MB): packed, the four gpu test executables and
# `ling` take ~18 MB. Configured as scripts/device-test.sh configures build/device, in build/prebuilt; build/device
# here holds only the packed copies (device-test.sh on the GPU machine reconfigures it).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGETS=${1:-"ling test_cuda_model test_cuda_kernels"}
cmake -S . -B build/prebuilt -G Ninja -DCMAKE_BUILD_TYPE=Release -DLING_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DLING_BUILD_TESTS=ON -DLING_BUILD_BENCH=ON >/dev/null
# shellcheck disable=SC2086
cmake --build build/prebuilt -j "$(nproc)" --target $TARGETS
rm -rf build/device build/device-stage
for t in $TARGETS; do
  f=$(find build/prebuilt -type f -executable -name "$t" -not -path "*/CMakeFiles/*" | head -1)
  [ -n "$f" ] || { echo "no binary for target $t"; exit 1; }
  d=build/device-stage/${f#build/prebuilt/}
  mkdir -p "$(dirname "$d")" && cp "$f" "$d" && strip "$d"
done
# LING_STAGE_OLD=<an earlier build's ling, outside build/device, which is emptied above>: staged beside the new one as
# examples/ling.old, for scripts/device-ab.sh's `old` variants (A/B across binaries)
if [ -n "${LING_STAGE_OLD:-}" ]; then
  mkdir -p build/device-stage/examples && cp "$LING_STAGE_OLD" build/device-stage/examples/ling.old &&
    strip build/device-stage/examples/ling.old
fi
# packed (xz roughly halves stripped binaries), so that five of them fit the carry; device-prebuilt-check.sh unpacks
# build/device/bin.tar.xz into build/device
mkdir -p build/device
tar -C build/device-stage -cJf build/device/bin.tar.xz .
echo "staged in build/device/bin.tar.xz ($(git rev-parse --short HEAD)$(git diff --quiet || echo ', with uncommitted changes')):"
find build/device-stage -type f -printf '  %p %s\n'
rm -rf build/device-stage
echo "carry with the tracked files: $(( ($(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) + $(du -sb build/device .deps 2>/dev/null | awk '{s+=$1} END {print s}')) / 1048576 )) MiB of 64"
