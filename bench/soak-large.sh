#!/usr/bin/env bash
# Do checkpoints of tens of GB survive kill -9 on a GPU machine's disk, and does a run killed twice
# end exactly where an uninterrupted one ends? The disk-light companion of bench/soak.sh: it keeps
# no copy of the reference's checkpoints, only their headers, which hold every tensor's CRC-32C
# (docs/reliability.md), so two checkpoints with the same header hold the same bytes.
#
#   PARITY_PREBUILT=build-prebuilt bench/soak-large.sh            # on the GPU machine
#   BACKEND=cpu MODEL=tiny CAP=1000 STEPS=300 bench/soak-large.sh  # the same steps on the CPU
#
# 1. The reference: MODEL with every table's rows capped at CAP, planned for one DEVICE, trained
#    STEPS steps with a checkpoint every CKPT_EVERY (one kept). Each checkpoint's header is saved
#    as it appears, with the time its write took (its .tmp first seen to its rename seen). The
#    reference's folder is then removed: the disk holds one run's checkpoints at a time.
# 2. Kill 1, in training: a run from step 0 killed with SIGKILL halfway between its first and
#    second checkpoints.
# 3. Kill 2, in a checkpoint write: a resumed run killed while its second checkpoint's .tmp file
#    grows (after WRITE_FRACTION of the reference's write time).
# 4. The end: a resumed run to STEPS. After each kill the folder's checkpoints must carry the
#    reference's headers; the last one and the final loss and AUC must equal the reference's.
# A table is printed last; the exit status is non-zero on any mismatch. Logs and the table go to
# $OUT (default out/soak-large).
#
# Environment: PARITY_PREBUILT or BIN (the folder with parity), BACKEND (gpu), MODEL
# (mlperf-dlrmv2), CAP (6000000 rows: 17.6 GB of fp32 tables), DEVICE (h200), STEPS (300),
# CKPT_EVERY (100), EVAL_EXAMPLES (65536), WRITE_FRACTION (0.5).
set -euo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" soak-large
BACKEND=${BACKEND:-gpu}
MODEL=${MODEL:-mlperf-dlrmv2}
CAP=${CAP:-6000000}
DEVICE=${DEVICE:-h200}
STEPS=${STEPS:-300}
CKPT_EVERY=${CKPT_EVERY:-100}
EVAL_EXAMPLES=${EVAL_EXAMPLES:-65536}
WRITE_FRACTION=${WRITE_FRACTION:-0.5}
for v in CAP STEPS CKPT_EVERY EVAL_EXAMPLES; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "soak-large: $v must be a whole number, got '${!v}'" >&2; exit 2; }
done
((CKPT_EVERY > 0 && STEPS >= 3 * CKPT_EVERY)) ||
  { echo "soak-large: need CKPT_EVERY > 0 and STEPS >= 3 * CKPT_EVERY (three checkpoints)" >&2; exit 2; }

if [ -n "${PARITY_PREBUILT:-}" ]; then
  BIN=$PARITY_PREBUILT
  PARITY_LIB_PATH="$PWD/$BIN/lib:"
fi
BIN=${BIN:-build}
PARITY=$PWD/$BIN/parity
[ -x "$PARITY" ] || { echo "soak-large: no parity binary at $PARITY" >&2; exit 2; }
[ "$BACKEND" = cpu ] || device_facts
df -h "$SCRATCH" | tail -1 | tee -a "$OUT/device.txt"

spec=$(capped "$MODEL" "$CAP")
run_bin "$PARITY" plan --model "$spec" --device "$DEVICE" --gpus 1 --out "$SCRATCH/plan.json" \
  >"$OUT/plan.txt" 2>&1 || { cat "$OUT/plan.txt"; exit 1; }
train_args() {  # DIR [MORE...]
  ARGS=(train --backend "$BACKEND" --plan "$SCRATCH/plan.json" --seed 1 --steps "$STEPS"
    --checkpoint "$1" --checkpoint-every "$CKPT_EVERY" --keep-checkpoints 1 --eval-every 0
    --eval-examples "$EVAL_EXAMPLES" "${@:2}")
  [ "$BACKEND" = cpu ] && ARGS=(train --backend cpu --model "$spec" --no-plan "${ARGS[@]:5}")
  return 0
}
PID=""
trap '[ -n "$PID" ] && kill -9 "$PID" 2>/dev/null; rm -rf "$SCRATCH"' EXIT
launch() {  # LOG ARGS...: parity itself in the background (PID), so that a kill reaches it
  local log=$1
  shift
  LD_LIBRARY_PATH="${PARITY_LIB_PATH}/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$PARITY" "$@" >"$log" 2>&1 &
  PID=$!
}
now() { date +%s.%N; }
calc() { awk "BEGIN { v = $1; printf \"%.3f\", (v > 0 ? v : 0) }"; }  # never below 0
header() {  # FILE: the safetensors header (its length and its JSON)
  local n
  n=$(od -An -tu8 --endian=little -N8 "$1" | tr -d ' ')
  head -c $((8 + n)) "$1"
}
final_numbers() { sed -n 's/^done .*final loss \([^ ]*\) *AUC \([^ ]*\).*/loss \1 AUC \2/p' "$1" | tail -1; }

# ---- 1. the reference: each checkpoint's header, and its write time ---------------------------
REF=$SCRATCH/reference
rm -rf "$OUT/headers" "$OUT/write-times.txt"
mkdir -p "$OUT/headers"
train_args "$REF"
say "reference: $MODEL (rows capped at $CAP), $STEPS steps, a checkpoint every $CKPT_EVERY"
t0=$(now)
launch "$OUT/reference.log" "${ARGS[@]}"
declare -A tmp_seen=()
WRITE_S=""
while kill -0 "$PID" 2>/dev/null; do
  for ((s = CKPT_EVERY; s <= STEPS; s += CKPT_EVERY)); do
    f=$REF/step-$s.safetensors
    [ -z "${tmp_seen[$s]:-}" ] && [ -e "$f.tmp" ] && tmp_seen[$s]=$(now)
    if [ -e "$f" ] && [ ! -e "$OUT/headers/step-$s" ]; then
      header "$f" >"$OUT/headers/step-$s"
      if [ -n "${tmp_seen[$s]:-}" ]; then w=$(calc "$(now) - ${tmp_seen[$s]}"); else w=0; fi
      WRITE_S+="step $s: ${w} s; "
      echo "$s $w" >>"$OUT/write-times.txt"
    fi
  done
  sleep 0.01
done
wait "$PID" || { tail -5 "$OUT/reference.log"; say "the reference run failed"; exit 1; }
PID=""
[ -e "$REF/step-$STEPS.safetensors" ] && [ ! -e "$OUT/headers/step-$STEPS" ] &&
  header "$REF/step-$STEPS.safetensors" >"$OUT/headers/step-$STEPS"
REF_S=$(calc "$(now) - $t0")
REF_NUMBERS=$(final_numbers "$OUT/reference.log")
SIZE=$(stat -c %s "$REF/step-$STEPS.safetensors")
say "reference: ${REF_S} s, $REF_NUMBERS; checkpoint $((SIZE / 1000000)) MB; writes: $WRITE_S"
rm -rf "$REF"
first_write=$(awk 'NR == 1 {print $2}' "$OUT/write-times.txt")

ROWS=()
failures=0
check() {  # LABEL: every checkpoint in the soak folder carries the reference's header
  local f s verdict="" n=0
  for f in "$SOAK"/step-*.safetensors; do
    [ -e "$f" ] || continue
    s=${f##*/step-}
    s=${s%.safetensors}
    n=$((n + 1))
    if ! cmp -s <(header "$f") "$OUT/headers/step-$s"; then
      verdict+="step-$s DIFFERS; "
      failures=$((failures + 1))
    fi
  done
  [ -n "$verdict" ] || verdict="$n identical"
  ROWS+=("$1|$(ls "$SOAK" | tr '\n' ' ')|$verdict")
}
SOAK=$SCRATCH/soak

# ---- 2. kill in training ----------------------------------------------------------------------
train_args "$SOAK" --resume
launch "$OUT/kill-1.log" "${ARGS[@]}"
until [ -e "$SOAK/step-$CKPT_EVERY.safetensors" ] || ! kill -0 "$PID" 2>/dev/null; do sleep 0.05; done
# Half of a checkpoint interval's training time, from the reference's batch and examples/s.
batch=$(grep -m1 -oE 'batch [0-9]+' "$OUT/reference.log" | grep -oE '[0-9]+')
rate=$(grep -m1 -E '^done' "$OUT/reference.log" | grep -oE '[0-9.]+[kM]? examples/s' | head -1 |
  awk '{v = $1 + 0; if ($1 ~ /k$/) v *= 1e3; if ($1 ~ /M$/) v *= 1e6; print v}')
sleep "$(calc "$batch / $rate * $CKPT_EVERY / 2")"
kill -9 "$PID" 2>/dev/null && killed="killed" || killed="had ended"
wait "$PID" 2>/dev/null || true
PID=""
check "1: in training, after step-$CKPT_EVERY ($killed)"

# ---- 3. kill in a checkpoint write ------------------------------------------------------------
target=$((2 * CKPT_EVERY))
launch "$OUT/kill-2.log" "${ARGS[@]}"
until [ -e "$SOAK/step-$target.safetensors.tmp" ] || ! kill -0 "$PID" 2>/dev/null; do sleep 0.01; done
sleep "$(calc "$first_write * $WRITE_FRACTION")"
tmp_bytes=$(stat -c %s "$SOAK/step-$target.safetensors.tmp" 2>/dev/null || echo 0)
kill -9 "$PID" 2>/dev/null && killed="killed with $((tmp_bytes / 1000000)) MB of step-$target written" || killed="had ended"
wait "$PID" 2>/dev/null || true
PID=""
check "2: in the write of step-$target ($killed)"

# ---- 4. to the end (unless the run of kill 2 got there: a write too short to be hit) ----------
t0=$(now)
if [ -e "$SOAK/step-$STEPS.safetensors" ]; then
  cp "$OUT/kill-2.log" "$OUT/final.log"
else
  launch "$OUT/final.log" "${ARGS[@]}"
  wait "$PID" || { tail -5 "$OUT/final.log"; failures=$((failures + 1)); }
  PID=""
fi
END_S=$(calc "$(now) - $t0")
RESUMED=$(grep -o 'resumed at step [0-9]*' "$OUT/final.log" | head -1)
check "3: to the end (${RESUMED:-not resumed}, ${END_S} s)"
END_NUMBERS=$(final_numbers "$OUT/final.log")
[ "$END_NUMBERS" = "$REF_NUMBERS" ] || failures=$((failures + 1))

{
  echo "| run | checkpoints left | against the reference's headers |"
  echo "|---|---|---|"
  for r in "${ROWS[@]}"; do echo "| ${r//|/ | } |"; done
  echo
  echo "reference: $REF_NUMBERS in ${REF_S} s; the end: ${END_NUMBERS:-none}"
  echo "checkpoint: $SIZE bytes; writes: $WRITE_S"
  echo "failures: $failures"
} | tee "$OUT/summary.md"
((failures == 0))
