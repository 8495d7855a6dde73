#!/usr/bin/env bash
# session 22 probe (deleted before commit)
cd "$(dirname "$0")"
bash scripts/device-test.sh --targets "ling test_cuda_ops_moe test_cuda_model" --tests NONE --no-bench > $OUT/dt.log 2>&1
tail -3 $OUT/dt.log
export LD_LIBRARY_PATH=$PWD/.deps/root/usr/lib/x86_64-linux-gnu
B=$PWD/build/device/examples/ling
(cd tests && ../build/device/tests/cuda_ops/test_cuda_ops_moe -tc="moe: launch A's lean*,moe: launch B's lane*") > $OUT/t.log 2>&1; tail -3 $OUT/t.log
(cd tests && ../build/device/tests/cuda_model/test_cuda_model) > $OUT/tm.log 2>&1; tail -3 $OUT/tm.log
for v in LING_MOE_LEAN_A=2 LING_MOE_LEAN_A=3 X=1 LING_MOE_LEAN_A=1 LING_MOE_LEAN_A=2 LING_MOE_LEAN_A=3 X=1; do
  echo "## $v $(env $v $B bench --spec ling3-flash --random-weights --contexts 0 --reps 3 | grep '^| 0 ')"
done
echo "region         blk    entF    entL   waitF   waitL | after the last wait:  midMd   midL   endF  endMd   endL |    dur"
for v in X=1 LING_MOE_LEAN_A=1 LING_MOE_LEAN_A=2 LING_MOE_LEAN_A=3 LING_MOE_DIAG_A=1; do
  for m in 0 3 5 4; do
    env $v LING_TRACE=$OUT/tr.csv LING_TRACE_MOEA=$m $B bench --spec ling3-flash --random-weights --contexts 0 --reps 1 > /dev/null 2>&1
    echo "$v MOEA=$m $(python3 tools/perf/trace_summary.py $OUT/tr.csv | grep -E 'kda:moeA|period' | tr '\n' ' ')"
    rm -f $OUT/tr.csv
  done
done
