#!/usr/bin/env bash
# Deep profile of single kernel instances from bench/cuda_ops on the GPU machine (after device-test.sh built
# build/device): for each "label=benchmark-filter=kernel-regex" argument, ncu --set full on one instance (skipping the
# warm-up), the details page as text and the SASS source page (per-instruction executed counts and stall samples) as
# CSV, all bundled into $OUT/ncu-kernels.tar.gz (the device tool returns at most 8 files).
# Usage: bash scripts/ncu-kernels.sh "down=moe_step_8of512_mxfp4\+shared=moe_down_kernel" ...
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
B=build/device/bench/cuda_ops
W=$(mktemp -d)
for spec in "$@"; do
  label=${spec%%=*}; rest=${spec#*=}; filter=${rest%%=*}; kre=${rest#*=}
  timeout 240 ncu --clock-control none --set full --import-source no -k regex:"$kre" --launch-skip 30 --launch-count 1 \
    -f -o "$W/$label" $B --benchmark_filter="$filter" --benchmark_min_time=0.01 >"$W/$label.run.txt" 2>&1
  ncu -i "$W/$label.ncu-rep" --page details >"$W/$label.details.txt" 2>&1
  ncu -i "$W/$label.ncu-rep" --page source --csv --print-source sass >"$W/$label.sass.csv" 2>&1
  rm -f "$W/$label.ncu-rep"
  grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Executed Ipc A|Issue Slots Busy|Local Memory|Executed Instructions  " "$W/$label.details.txt" | head -20 | sed "s/^/$label: /"
done
cuobjdump --dump-resource-usage $B 2>/dev/null | grep -A1 -E "moe_|matvec|router" | grep -E "Function|REG" | paste - - | \
  sed -E 's/.*Function ([^ ]+).*REG:([0-9]+).*STACK:([0-9]+).*LOCAL:([0-9]+).*/\2 regs stack \3 local \4  \1/' | cut -c1-200 >"$W/resource-usage.txt"
tar -C "$W" -czf "$OUT/ncu-kernels.tar.gz" .
