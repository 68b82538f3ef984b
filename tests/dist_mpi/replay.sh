#!/usr/bin/env bash
# replay.sh PARITY MPIEXEC NP_FLAG DIR: faults found in a run over 2 ranks are replayed by both
# ranks together from the checkpoint before them. A flipped product (caught by the checksummed
# products on both ranks) and a flip without checks (found by the finite-value guard, the ranks
# agreeing on its first bad step; the loss over the global batch watched for spikes): each replay
# comes out clean, so the device is blamed, training goes on from the checkpoint, and the run
# ends with the printed loss and AUC of a run without the fault. The same for a flip in an
# embedding row (planted by the rank that holds it) and for hstu-tiny's checked products.
set -euo pipefail
parity=$1 mpiexec=$2 np=$3 dir=$4
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
"$parity" plan --model tiny --device h200 --gpus 2 --out plan.json >/dev/null
common=(--plan plan.json --steps 40 --eval-examples 1024)
"$mpiexec" "$np" 2 "$parity" train "${common[@]}" --product-checks >clean.log 2>&1
"$mpiexec" "$np" 2 "$parity" train "${common[@]}" --product-checks --inject-fault 15:0:0:30 \
  --checkpoint ck1 --checkpoint-every 10 >checked.log 2>&1
"$mpiexec" "$np" 2 "$parity" train "${common[@]}" --spike-factor 3 --inject-fault 15:0:1:30 \
  --checkpoint ck2 --checkpoint-every 10 >guard.log 2>&1
"$mpiexec" "$np" 2 "$parity" train "${common[@]}" --spike-factor 3 \
  --inject-table-fault 15:t6:7:3:14 --checkpoint ck4 --checkpoint-every 10 >table.log 2>&1
"$parity" plan --model hstu-tiny --device h200 --gpus 2 --out hstu-plan.json >/dev/null
hstu=(--plan hstu-plan.json --steps 30 --eval-examples 512 --product-checks)
"$mpiexec" "$np" 2 "$parity" train "${hstu[@]}" >hstu-clean.log 2>&1
"$mpiexec" "$np" 2 "$parity" train "${hstu[@]}" --inject-fault 15:2:7:30 --checkpoint ck3 \
  --checkpoint-every 10 >hstu.log 2>&1
status=0
ending() { grep -o 'final loss [0-9.]*  AUC [0-9.]*' "$1" | head -1; }
for run in checked guard table hstu; do
  if ! grep -q "the replay of steps 11 to [0-9]* from checkpoint .* differed" $run.log; then
    echo "$run: no replay that blamed the device:"
    cat $run.log
    status=1
  fi
  clean=clean.log
  [ $run = hstu ] && clean=hstu-clean.log
  if [ -z "$(ending $clean)" ] || [ "$(ending $run.log)" != "$(ending $clean)" ]; then
    echo "$run ended with '$(ending $run.log)', the run without a fault with '$(ending $clean)'"
    status=1
  fi
done
grep -q "failed their check by step [0-9]* over 2 ranks" checked.log ||
  { echo "checked: the fault was not said as found over 2 ranks"; status=1; }
grep -q "NaN or infinite .* replay of steps 11 to 15 .* differed" guard.log ||
  { echo "guard: the ranks did not agree on step 15 as the first bad one"; status=1; }
echo "2 ranks, a fault at step 15: $(ending checked.log) (product checks), $(ending guard.log) (finite-value guard), $(ending table.log) (a table's row); without: $(ending clean.log)"
echo "hstu-tiny over 2 ranks, a fault at step 15: $(ending hstu.log); without: $(ending hstu-clean.log)"
exit $status
