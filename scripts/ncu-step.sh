#!/usr/bin/env bash
# Per-kernel profile of one decode step of the full-size random model on the GPU machine (after device-test.sh built
# build/device): $OUT/ncu-step.csv = duration of every kernel of one eager step (isolated by ncu: no PDL overlap, cold
# L2, so each is an upper bound), and $OUT/ncu-<kernel>.txt = stall reasons, occupancy and memory throughput of one
# instance of each hot kernel. Usage: bash scripts/ncu-step.sh [kernel-regex ...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
LING=build/device/examples/ling
ARGS="bench --spec ling3-flash --random-weights --contexts 0 --reps 1 --tokens 1"
timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum -k regex:'matvec|moe|router|kda|mla|embed' \
  --launch-count 340 --csv $LING $ARGS >"$OUT/ncu-step.csv" 2>/dev/null
for k in "$@"; do
  timeout 120 ncu --clock-control none -k regex:"$k" --launch-skip 4 --launch-count 1 --section SpeedOfLight \
    --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    --section SchedulerStats $LING $ARGS >"$OUT/ncu-$k.txt" 2>&1
done
