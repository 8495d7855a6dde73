#!/usr/bin/env bash
# A/B on the GPU machine after device-test.sh built build/device: `ling bench` at one context for each variant (env
# settings separated by commas; variants by spaces), alternating binaries/variants in one process run each, plus an
# optional benchmark filter of bench/cuda_ops. Usage: bash scripts/device-ab.sh "VAR=1 VAR=0,OTHER=1" [bench-filter] [reps]
# LING_AB_TRACE=1: also one traced step per variant (LING_TRACE, context 0; LING_AB_TRACE_MOEA=n sets LING_TRACE_MOEA),
# its timeline in $OUT/trace-<n>.csv and the KDA and MLA layers' region medians printed (tools/perf/trace_summary.py).
# A variant with LING_PREDICT also prints the bench's hit-rate line.
# A variant that starts with `old` runs build/device/examples/ling.old instead (an earlier build staged beside this one,
# for A/B across binaries; scripts/device-prebuild.sh stages it from LING_STAGE_OLD): "old" alone, or "old,VAR=1".
# LING_AB_ROUNDS=n repeats the whole list n times (default 1), so that drift shows as a difference between rounds;
# LING_AB_TRACE traces each variant in the first round only.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=build/device
# binaries staged by scripts/device-prebuild.sh come packed
if [ -f $B/bin.tar.xz ] && [ ! -x $B/examples/ling ]; then tar -C $B -xJf $B/bin.tar.xz; fi
if [ -n "${2:-}" ]; then
  $B/bench/cuda_ops --benchmark_filter="$2" --benchmark_min_time=0.2 >"$OUT/ab-bench.log" 2>&1
  grep manual_time "$OUT/ab-bench.log" | awk '{print $1, $NF, $(NF-1)}' | sed 's/us_per_op=//'
fi
n=0
for round in $(seq "${LING_AB_ROUNDS:-1}"); do
  for v in default $1; do
    bin=ling e=$v
    [[ "$v" == old* ]] && bin=ling.old e=${v#old}
    [ "$v" = default ] && e=""
    e=${e//,/ }
    if [ ! -x "$B/examples/$bin" ]; then echo "$v: no $B/examples/$bin" | tee -a "$OUT/ab.log"; continue; fi
    r=$(env $e $B/examples/$bin bench --spec ling3-flash --random-weights --contexts 0 --reps "${3:-3}" 2>&1 | grep -E "^\| 0 |LING_PREDICT=")
    echo "$v: $r" | tee -a "$OUT/ab.log"
    if [ "${LING_AB_TRACE:-0}" = 1 ] && [ "$round" = 1 ]; then
      n=$((n + 1))
      env $e LING_TRACE="$OUT/trace-$n.csv" ${LING_AB_TRACE_MOEA:+LING_TRACE_MOEA=$LING_AB_TRACE_MOEA} \
        $B/examples/$bin bench --spec ling3-flash --random-weights --contexts 0 --reps 1 >/dev/null 2>&1
      python3 tools/perf/trace_summary.py "$OUT/trace-$n.csv" 2>&1 | grep -E "^region|^kda|^mla|period" | sed "s/^/  [$n] /" |
        tee -a "$OUT/ab.log"
    fi
  done
done
