#!/usr/bin/env bash
# Deep profile of the model's own kernel instances on the GPU machine (after device-test.sh built build/device): for each
# "label=kernel-regex[=launch-skip]" argument, ncu --set full on one instance inside `ling bench` of the full-size random
# model (fused routing and all, as in the decode step; serialized by ncu, so no PDL overlap), the details page as text
# and the SASS source page (per-instruction executed counts and stall samples) as CSV, bundled into
# $OUT/ncu-model.tar.gz, and the headline metrics printed. Usage: bash scripts/ncu-model.sh "a=moe_gate_up_stream=150" ...
# NCU_CONTEXT=32768 profiles at that context (random cache contents; e.g. "att=mla_attend_mma=3" for the MLA attention).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
LING=build/device/examples/ling
W=$(mktemp -d)
for spec in "$@"; do
  label=${spec%%=*}; rest=${spec#*=}; kre=${rest%%=*}; skip=150
  [ "$rest" != "$kre" ] && skip=${rest#*=}
  timeout 240 ncu --clock-control none --set full --import-source no -k regex:"$kre" --launch-skip "$skip" --launch-count 1 \
    -f -o "$W/$label" $LING bench --spec ling3-flash --random-weights --contexts "${NCU_CONTEXT:-0}" --reps 1 --tokens 4 >"$W/$label.run.txt" 2>&1
  ncu -i "$W/$label.ncu-rep" --page details >"$W/$label.details.txt" 2>&1
  ncu -i "$W/$label.ncu-rep" --page source --csv --print-source sass >"$W/$label.sass.csv" 2>&1
  rm -f "$W/$label.ncu-rep"
  grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Executed Ipc A|Issue Slots Busy|Local Memory|Executed Instructions  " "$W/$label.details.txt" | head -20 | sed "s/^/$label: /"
done
tar -C "$W" -czf "$OUT/ncu-model.tar.gz" .
