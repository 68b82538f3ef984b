#!/usr/bin/env bash
# Where the attention kernels' time goes (an experiment, not a question): Nsight Compute's
# duration, tensor-pipe use, instruction counts, shared-memory atomics and warp stall reasons of
# query_kernel (forward, dq) and dkv_kernel, one launch each, at n = 8,192 and 512.
#
#   PARITY_PREBUILT=build-pb1 bench/lab/attention-probe.sh   # attention_bench from make-prebuilt.sh
set -uo pipefail
bin=${PARITY_PREBUILT:-build-prebuilt}
export LD_LIBRARY_PATH=$PWD/$bin/lib
m=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum
m=$m,smsp__inst_executed.sum,smsp__sass_inst_executed_op_shared_atom.sum
for r in barrier short_scoreboard long_scoreboard mio_throttle math_pipe_throttle wait not_selected; do
  m=$m,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
done
for n in 8192 512; do
  echo "== n $n"
  timeout 120 ncu --kernel-name regex:"query_kernel|dkv_kernel" --launch-skip 1 --launch-count 3 \
    --metrics "$m" "$bin/attention_bench" --lengths "$n" --full-only --reps 1 --warmup 0 2>&1 |
    grep -E "^  void|ratio|sum|pct" | sed 's/(unnamed>::Args.*//; s/smsp__average_warps_issue_stalled_//'
done
