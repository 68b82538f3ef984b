#!/usr/bin/env bash
# kill_during_checkpoints.sh PARITY MPIEXEC NP_FLAG DIR: two ranks train the tiny model writing a
# checkpoint set every 2 steps; rank 1 is killed (SIGKILL) at a random moment, three times. Each
# time the run must end within 60 s, and the next run must resume from a complete set (nothing
# set aside as damaged) at a step past the last one resumed from.
set -uo pipefail
parity=$1 mpiexec=$2 np=$3 dir=$4
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1
"$parity" plan --model tiny --device h200 --gpus 2 --out p2.json >/dev/null || exit 1
last=0
for round in 1 2 3; do
  rm -f pid.*
  "$mpiexec" "$np" 2 bash -c 'echo $$ >pid.$OMPI_COMM_WORLD_RANK; exec "$0" "$@"' "$parity" \
    train --plan p2.json --steps 1000000 --checkpoint ck --checkpoint-every 2 \
    --keep-checkpoints 3 --eval-examples 1024 --resume >run$round.log 2>&1 &
  launcher=$!
  for _ in $(seq 100); do [ -s pid.1 ] && break; sleep 0.1; done
  # Past start-up (however long a loaded machine takes) and this run's first set, then a moment
  # that falls anywhere in a step or a write.
  for _ in $(seq 600); do grep -q '^checkpoint' run$round.log && break; sleep 0.1; done
  sleep "$(awk -v s=$RANDOM 'BEGIN { print (s % 1000) / 1000 }')"
  kill -9 "$(cat pid.1)"
  for _ in $(seq 600); do kill -0 $launcher 2>/dev/null || break; sleep 0.1; done
  if kill -0 $launcher 2>/dev/null; then
    echo "round $round: the run did not end within 60 s of rank 1's death"
    kill -9 -- -$launcher $launcher 2>/dev/null
    exit 1
  fi
  if [ $round -gt 1 ]; then
    grep -q "set aside" run$round.log && { echo "round $round set a checkpoint aside:"; cat run$round.log; exit 1; }
    step=$(grep -o 'resumed at step [0-9]*' run$round.log | grep -o '[0-9]*$')
    if [ -z "$step" ] || [ "$step" -le "$last" ]; then
      echo "round $round resumed at step '${step}', after step $last:"; cat run$round.log; exit 1
    fi
    last=$step
  fi
  echo "round $round: rank 1 killed; sets now: $(ls ck | tr '\n' ' ')"
done
echo "3 kills, every restart resumed from a complete set (last at step $last)"
