#!/usr/bin/env bash
# resume_chain.sh PARITY MPIEXEC NP_FLAG DIR [MODEL]: MODEL (tiny by default; hstu-tiny too)
# trained 20 steps over 4 ranks (checkpoint sets every 10 steps), resumed over 2 ranks to step
# 30, by one process to step 40 (a single file), and over 4 ranks again to step 50, each with the
# planner's plan for its GPU count, its tables edited to fp32 (with 16-bit tables, gradients
# summed in another order flip some stochastic roundings, and the printed figures drift in the
# fourth digit; the pieces of 16-bit tables reshard bit for bit in dist.resharding_4_2_1_4_fp16);
# against one process training 40 steps without a stop. Passes when every stage resumes where the last one stopped and the run
# that stopped three times ends step 40 with the uninterrupted run's printed loss and AUC.
set -euo pipefail
parity=$1 mpiexec=$2 np=$3 dir=$4 model=${5:-tiny}
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
for g in 1 2 4; do
  "$parity" plan --model "$model" --device h200 --gpus $g --out p$g-planned.json >/dev/null
  sed -E 's/"dtype": "(fp16|bf16)"/"dtype": "fp32"/g' p$g-planned.json >p$g.json
done
common=(--checkpoint ck --checkpoint-every 10 --eval-examples 1024)
"$mpiexec" "$np" 4 "$parity" train --plan p4.json --steps 20 "${common[@]}" >s1.log 2>&1
"$mpiexec" "$np" 2 "$parity" train --plan p2.json --steps 30 --resume "${common[@]}" >s2.log 2>&1
"$parity" train --plan p1.json --steps 40 --resume "${common[@]}" >s3.log 2>&1
"$mpiexec" "$np" 4 "$parity" train --plan p4.json --steps 50 --resume "${common[@]}" >s4.log 2>&1
"$parity" train --plan p1.json --steps 40 --eval-examples 1024 >whole.log 2>&1
status=0
for s in "s2 20" "s3 30" "s4 40"; do
  set -- $s
  grep -q "resumed at step $2" $1.log || { echo "$1 did not resume at step $2:"; cat $1.log; status=1; }
done
[ -d ck/step-50 ] && [ -f ck/step-40.safetensors ] || { echo "missing checkpoints:"; ls ck; status=1; }
ending() { grep -o 'final loss [0-9.]*  AUC [0-9.]*' "$1"; }
if [ "$(ending s3.log)" != "$(ending whole.log)" ]; then
  echo "stopped 3 times: $(ending s3.log); without a stop: $(ending whole.log)"
  status=1
fi
echo "4 -> 2 -> 1 -> 4 ranks: step 40 $(ending s3.log), uninterrupted $(ending whole.log); step 50 $(ending s4.log)"
exit $status
