#!/usr/bin/env bash
# Do checkpoints survive kill -9, and does a run interrupted again and again end exactly where an
# uninterrupted one ends? Runs on the CPU (no GPU needed), from the repository root:
#
#   bench/soak.sh                 # 20 kills of the tiny model over 2000 steps: about 3 minutes on 2 cores
#   SEED=7 bench/soak.sh          # another kill plan (a SEED makes the same draws again; where the
#                                 # kills land still depends on the machine's speed at the time)
#
# 1. The reference: one uninterrupted `parity train --backend $BACKEND` of STEPS steps with a checkpoint
#    every CKPT_EVERY steps; every checkpoint it writes is kept (hard links taken while it runs)
#    and loaded once (a resume from it alone).
# 2. KILLS times: `parity train --resume` of the same configuration into one checkpoint folder,
#    started in the background and killed with SIGKILL. Where the kill aims is drawn from SEED:
#    a random time (within the run's expected duration, so it lands in training steps, in an
#    evaluation, in start-up or in a checkpoint write), the write of a chosen checkpoint (the
#    folder polled for its .tmp file), or a chosen evaluation (the pause in the progress output
#    after the checkpoint before it). After each kill every step-N.safetensors in the folder must
#    be byte-identical to the reference's step-N (so it is whole and the resumed runs are exact);
#    leftover .tmp files are allowed and ignored.
# 3. A last `--resume` run to the end, not killed: its final checkpoint must be byte-identical to
#    the reference's (the tensors: weights and optimizer state, and the metadata, each compared),
#    and its final loss and AUC (as printed, 4 decimals) equal.
# Each run gets a terminal (script(1)), so that parity prints its progress every 0.25 s: the log
# shows the last step reached before the kill. A short table is printed last; the exit status is
# non-zero on any mismatch, torn checkpoint or failed run. Logs and the table go to $OUT (default
# out/soak); the checkpoints to the scratch folder (bench/common.sh; SCRATCH keeps it).
#
# Environment: PARITY (the binary, default build/parity where it exists, else build-cpu/parity,
# built CPU-only with BUILD_JOBS (2) jobs), BACKEND (cpu; gpu on a GPU machine, with PARITY a GPU
# build's binary), MODEL (tiny; tiny-dot, or any model a CPU trains
# quickly), STEPS (2000), CKPT_EVERY (100), EVAL_EVERY (200), EVAL_EXAMPLES (65536: evaluations
# long enough to be hit), KILLS (20), SEED (1: the kill plan), TRAIN_SEED (1: parity's --seed).
set -euo pipefail
keep_scratch=${SCRATCH:+1}
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" soak
BACKEND=${BACKEND:-cpu}
MODEL=${MODEL:-tiny}
STEPS=${STEPS:-2000}
CKPT_EVERY=${CKPT_EVERY:-100}
EVAL_EVERY=${EVAL_EVERY:-200}
EVAL_EXAMPLES=${EVAL_EXAMPLES:-65536}
KILLS=${KILLS:-20}
SEED=${SEED:-1}
TRAIN_SEED=${TRAIN_SEED:-1}
BUILD_JOBS=${BUILD_JOBS:-2}
for v in STEPS CKPT_EVERY EVAL_EVERY EVAL_EXAMPLES KILLS SEED TRAIN_SEED BUILD_JOBS; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "soak: $v must be a non-negative integer, got '${!v}'" >&2; exit 2; }
done
((CKPT_EVERY > 0 && EVAL_EVERY > 0 && STEPS > 2 * CKPT_EVERY && EVAL_EXAMPLES > 0)) ||
  { echo "soak: need CKPT_EVERY > 0, EVAL_EVERY > 0, EVAL_EXAMPLES > 0 and STEPS > 2 * CKPT_EVERY" >&2; exit 2; }
shopt -s nullglob

PID="" SPID=""  # the parity process running now, and the script(1) around it
cleanup() {
  if [ -n "$PID" ]; then kill -9 "$PID" 2>/dev/null || true; fi
  if [ -n "$SPID" ]; then wait "$SPID" 2>/dev/null || true; fi
  if [ -z "$keep_scratch" ]; then rm -rf "$SCRATCH"; fi
}
trap cleanup EXIT

# Sleeping without a process: read on a FIFO that nobody writes, with a timeout.
mkfifo "$SCRATCH/snooze"
exec {SNOOZE_FD}<>"$SCRATCH/snooze"
snooze() { read -rt "$1" -u "$SNOOZE_FD" _ || true; }
now_us() { NOW=${EPOCHREALTIME//[!0-9]/}; }
mtime_us() { local t; t=$(stat -c %.6Y "$1"); echo "${t//[!0-9]/}"; }
secs() { printf '%d.%03d' $(($1 / 1000000)) $(($1 / 1000 % 1000)); }
# The kill plan's random numbers: bash's generator seeded with SEED (never called in a subshell,
# which would not advance it). rand N sets R to a number in [0, N).
RANDOM=$SEED
rand() { R=$((((RANDOM << 15) | RANDOM) % ($1 > 0 ? $1 : 1))); }

# ---- the machine, the binary -----------------------------------------------------------------
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "host: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $(free -g | awk '/Mem:/ {print $2}') GiB," \
    "$(grep -m1 '^PRETTY_NAME=' /etc/os-release | cut -d= -f2 | tr -d '"'), $(df -T "$SCRATCH" | awk 'NR == 2 {print $2}') scratch"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- src tools include 2>/dev/null || echo ' (src/tools/include modified)')"
} | tee "$OUT/host.txt"
if [ -z "${PARITY:-}" ]; then
  PARITY=build/parity
  [ -x "$PARITY" ] || PARITY=build-cpu/parity
fi
if [ ! -x "$PARITY" ]; then
  say "build (cmake, Release, cpu) into build-cpu: parity"
  if ! { cmake -S . -B build-cpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPARITY_BACKENDS=cpu -DPARITY_BUILD_TESTS=OFF &&
    cmake --build build-cpu --target parity -j"$BUILD_JOBS"; } >>"$OUT/build.log" 2>&1; then
    tail -30 "$OUT/build.log"
    say "build failed (log: $OUT/build.log)"
    exit 1
  fi
  PARITY=build-cpu/parity
fi
PARITY=$(cd "$(dirname "$PARITY")" && pwd)/$(basename "$PARITY")
say "binary: $PARITY"

REF=$SCRATCH/reference        # the reference run's checkpoint folder (it keeps the newest two)
REF_ALL=$SCRATCH/reference-all  # every checkpoint it wrote
SOAK=$SCRATCH/soak            # the interrupted runs' checkpoint folder
rm -rf "$REF" "$REF_ALL" "$SOAK"  # a kept scratch folder may hold another configuration's
mkdir -p "$REF_ALL" "$OUT/runs"
train_args() {  # DIR [MORE...]: the one configuration every run trains
  ARGS=(train --backend "$BACKEND" --model "$MODEL" --seed "$TRAIN_SEED" --steps "$STEPS" --checkpoint "$1"
    --checkpoint-every "$CKPT_EVERY" --eval-every "$EVAL_EVERY" --eval-examples "$EVAL_EXAMPLES" "${@:2}")
}

# Starts `parity ARGS...` in the background on a terminal of its own, logged to LOG; sets SPID
# (script), PID (parity: the shell script runs it in execs into it) and LAUNCH (us), and touches
# MARK (a file written since then is newer than it: [[ F -nt $MARK ]]).
MARK=$SCRATCH/launched
launch() {  # LOG ARGS...
  local log=$1 cmd pidfile=$SCRATCH/pid
  shift
  rm -f "$pidfile"
  printf -v cmd '%q ' "$PARITY" "$@"
  : >"$MARK"
  now_us
  LAUNCH=$NOW
  SHELL=/bin/bash script -qfec "echo \$\$ >$(printf '%q' "$pidfile"); exec $cmd" "$log" </dev/null >/dev/null 2>&1 &
  SPID=$!
  PID=""
  for _ in $(seq 5000); do
    if [ -s "$pidfile" ]; then read -r PID <"$pidfile" || true; fi
    [ -n "$PID" ] && return 0
    snooze 0.001
  done
  echo "soak: the run did not start (log: $log)" >&2
  exit 1
}
finish() {  # waits for the script(1) around the run; sets RC to parity's exit status
  RC=0
  wait "$SPID" || RC=$?
  PID="" SPID=""
}
plain_log() { tr '\r' '\n' <"$1" | sed -e 's/\x1b\[K//g'; }
last_bar_step() { plain_log "$1" | sed -n 's/^\[[#-]*\] \([0-9]*\)\/.*/\1/p' | tail -1; }
last_bar_rate() { plain_log "$1" | sed -n 's/^\[[#-]*\] [0-9]*\/[0-9]*  \([0-9]*\)[.0-9]* steps\/s.*/\1/p' | tail -1; }
final_numbers() { plain_log "$1" | sed -n 's/^done .*final loss \([^ ]*\) *AUC \([^ ]*\).*/loss \1 AUC \2/p' | tail -1; }
final_eval() { plain_log "$1" | sed -n "s/^eval  step *$STEPS  \\(AUC [^ ]*  log loss [^ ]*\\).*/\\1/p" | tail -1; }
ckpt_steps() {  # DIR: the steps of its checkpoints, in order
  local f
  for f in "$1"/step-*.safetensors; do
    f=${f##*/step-}
    echo "${f%.safetensors}"
  done | sort -n
}
newest_step() { ckpt_steps "$1" | tail -1; }
# A checkpoint loads: a run resumes from it alone (a folder holding only it) and evaluates one batch.
loads() {  # FILE STEP
  local dir=$SCRATCH/load
  rm -rf "$dir"
  mkdir -p "$dir"
  ln "$1" "$dir/" 2>/dev/null || cp "$1" "$dir/"
  # One step more than the checkpoint's (parity refuses a resume with nothing left to train).
  "$PARITY" train --backend "$BACKEND" --model "$MODEL" --seed "$TRAIN_SEED" --steps "$(($2 + 1))" \
    --checkpoint "$dir" --resume --eval-examples 512 >"$SCRATCH/load.log" 2>&1 &&
    grep -q "resumed at step $2\$" "$SCRATCH/load.log"
}
header_len() { od -An -tu8 --endian=little -N8 "$1" | tr -d ' '; }
# What differs between two checkpoints: "identical", or which of metadata and tensor bytes differ.
compare_ckpt() {  # A B
  if cmp -s "$1" "$2"; then echo identical; return; fi
  local ha hb out=()
  ha=$(header_len "$1") hb=$(header_len "$2")
  if ! cmp -s <(head -c $((8 + ha)) "$1" | tail -c "$ha") <(head -c $((8 + hb)) "$2" | tail -c "$hb"); then
    out+=("header (metadata or tensor table) differs")
  fi
  if ! cmp -s <(tail -c +$((9 + ha)) "$1") <(tail -c +$((9 + hb)) "$2"); then
    local at
    at=$(cmp <(tail -c +$((9 + ha)) "$1") <(tail -c +$((9 + hb)) "$2") 2>&1 |
      sed -n '1s/.* differ: \(byte [0-9]*\).*/first at data \1/p; 1s/.*EOF on .*/one is shorter/p' || true)
    out+=("tensor bytes differ${at:+ ($at)}")
  fi
  local joined
  printf -v joined '%s; ' "${out[@]}"
  echo "${joined%; }"
}
# Every checkpoint in DIR against the reference's of the same step; sets CHECK (a summary) and
# BAD (the number of checkpoints that are not the reference's or do not load).
check_folder() {  # DIR
  local s f verdict n=0
  BAD=0 CHECK=""
  for s in $(ckpt_steps "$1"); do
    n=$((n + 1))
    f=$1/step-$s.safetensors
    if [ -e "$REF_ALL/step-$s.safetensors" ]; then
      verdict=$(compare_ckpt "$REF_ALL/step-$s.safetensors" "$f")
      [ "$verdict" = identical ] && continue
    else
      verdict="no reference checkpoint of this step"
    fi
    if loads "$f" "$s"; then verdict="$verdict, loads"; else verdict="$verdict, DOES NOT LOAD"; fi
    BAD=$((BAD + 1))
    CHECK+="step-$s: $verdict; "
    cp "$f" "$OUT/runs/" 2>/dev/null || true
  done
  [ -n "$CHECK" ] || CHECK="$n identical"
}

# ---- 1. the reference ------------------------------------------------------------------------
say "reference: $MODEL, $STEPS steps, a checkpoint every $CKPT_EVERY, an evaluation of $EVAL_EXAMPLES examples every $EVAL_EVERY"
train_args "$REF"
launch "$OUT/reference.log" "${ARGS[@]}"
collect() {
  local f
  for f in "$REF"/step-*.safetensors; do
    [ -e "$REF_ALL/${f##*/}" ] || ln "$f" "$REF_ALL/" 2>/dev/null || cp "$f" "$REF_ALL/" 2>/dev/null || true
  done
}
while kill -0 "$PID" 2>/dev/null; do
  collect
  snooze 0.02
done
collect
finish
now_us
REF_US=$((NOW - LAUNCH))
REF_NUMBERS=$(final_numbers "$OUT/reference.log")
REF_EVAL=$(final_eval "$OUT/reference.log")
if ((RC != 0)) || [ -z "$REF_NUMBERS" ]; then
  tail -5 "$OUT/reference.log"
  say "the reference run failed (rc $RC, log $OUT/reference.log)"
  exit 1
fi
say "reference: $(secs $REF_US) s, $REF_NUMBERS, final $REF_EVAL"
missing=0
for ((s = CKPT_EVERY; s <= STEPS; s += CKPT_EVERY)); do
  [ -e "$REF_ALL/step-$s.safetensors" ] || missing=$((missing + 1))
done
((STEPS % CKPT_EVERY == 0)) || [ -e "$REF_ALL/step-$STEPS.safetensors" ] || missing=$((missing + 1))
((missing == 0)) || say "warning: $missing reference checkpoints were pruned before they were kept (those steps are load-checked only)"
# Each kept reference checkpoint loads; the time of a run that loads one and evaluates a batch is
# the start-up, and one that evaluates EVAL_EXAMPLES the start-up plus an evaluation.
for f in "$REF_ALL"/step-*.safetensors; do
  s=${f##*/step-}
  s=${s%.safetensors}
  loads "$f" "$s" || { cat "$SCRATCH/load.log"; say "the reference's step-$s does not load"; exit 1; }
done
now_us
t0=$NOW
loads "$REF_ALL/step-$STEPS.safetensors" "$STEPS"
now_us
SIGMA=$((NOW - t0))
# (loads left step STEPS + 1 there: one step more again, now with the run's evaluation)
"$PARITY" train --backend "$BACKEND" --model "$MODEL" --seed "$TRAIN_SEED" --steps "$((STEPS + 2))" \
  --checkpoint "$SCRATCH/load" --resume --eval-examples "$EVAL_EXAMPLES" >/dev/null 2>&1
now_us
T_EVAL=$((NOW - t0 - 2 * SIGMA))
((T_EVAL > 1000)) || T_EVAL=1000
N_EVALS=$((STEPS / EVAL_EVERY + 1))
TAU=$(((REF_US - SIGMA) / STEPS))                                                  # per step, all included
TAU_STEP=$(((REF_US - SIGMA - N_EVALS * T_EVAL) / STEPS))                          # per training step
((TAU_STEP > 100)) || TAU_STEP=100
SIL=$((250000 + 4 * TAU_STEP + 50000))     # a pause in the progress output longer than this: not steps
SPR=$((250000 / TAU_STEP + 3))             # steps between two progress lines, at most
say "timing: start-up $(secs $SIGMA) s, evaluation $(secs $T_EVAL) s, $((TAU_STEP / 1000)) ms a step ($((TAU / 1000)) ms with evaluations and checkpoints)"

# ---- 2. the kills ----------------------------------------------------------------------------
# One line a kill: mode, resumed from, killed after (us), where it landed, its step, newest
# checkpoint after, new .tmp left, the folder's check.
ROWS=()
kills=0 rounds=0 failures=0 finished_early=0 LAST_DONE="" LAST_DONE_LOG=""
declare -A landed_count=()
while ((kills < KILLS)); do
  rounds=$((rounds + 1))
  if ((rounds > 3 * KILLS)); then
    say "gave up: $rounds runs for $kills kills"
    failures=$((failures + 1))
    break
  fi
  r=$(newest_step "$SOAK")
  r=${r:-0}
  if ((r == STEPS)); then  # a run reached the end before its kill: nothing is left to resume
    say "a run trained the last step before its kill: $kills kills in all"
    break
  fi
  rem=$((STEPS - r))
  left=$((KILLS - kills))
  # The latest a kill may come: well before the run could reach its last step.
  cap=$((SIGMA + TAU * (rem > 1 ? rem - 1 : 0) * 6 / 10))
  # The next checkpoint and evaluation steps (aims only before the last step).
  next_ckpt=$(((r / CKPT_EVERY + 1) * CKPT_EVERY))
  next_eval=$(((r / EVAL_EVERY + 1) * EVAL_EVERY))
  rand 100
  if ((R < 30 && next_ckpt < STEPS)); then
    mode="write"
  elif ((R < 50 && next_eval < STEPS)); then
    mode="eval"
  elif ((R < 55)); then
    mode="start"
  else
    mode="timed"
  fi
  # What the mode aims at: the write of one of the next three checkpoints, one of the next two
  # evaluations, a time within the start-up, or a time within the run.
  target=0 delay=0
  case $mode in
    write)
      rand 3
      target=$((next_ckpt + R * CKPT_EVERY))
      while ((target >= STEPS)); do target=$((target - CKPT_EVERY)); done
      ;;
    eval)
      rand 2
      target=$((next_eval + R * EVAL_EVERY))
      while ((target >= STEPS)); do target=$((target - EVAL_EVERY)); done
      ;;
    start)
      rand $((SIGMA * 3 / 2))
      delay=$R
      ;;
    timed)
      mean=$((SIGMA + TAU * rem / (left + 1)))
      hi=$((2 * mean < cap ? 2 * mean : cap))
      rand "$hi"
      delay=$R
      ;;
  esac
  train_args "$SOAK" --resume
  log=$OUT/runs/kill-$(printf %02d $((kills + 1))).log
  launch "$log" "${ARGS[@]}"
  deadline=$((LAUNCH + cap))
  gap="" note="" after_rename=0
  case $mode in
    write)  # kill as soon as the target's temporary file is seen
      tmp=$SOAK/step-$target.safetensors.tmp  # one an earlier kill left is older than MARK
      deadline=$((LAUNCH + SIGMA + TAU * (target - r) * 3 + 2000000))
      while kill -0 "$PID" 2>/dev/null; do
        if [[ -e $tmp && $tmp -nt $MARK ]]; then
          kill -9 "$PID"
          break
        fi
        if [ -e "$SOAK/step-$target.safetensors" ]; then
          kill -9 "$PID"
          note="the .tmp not seen: killed after the rename"
          after_rename=1
          break
        fi
        now_us
        if ((NOW > deadline)); then
          kill -9 "$PID"
          note="timed out waiting for the write"
          break
        fi
        snooze 0.001
      done
      ;;
    eval)  # after the checkpoint before the target, wait for the pause in the progress output
      before=$(((target - 1) / CKPT_EVERY * CKPT_EVERY))
      deadline=$((LAUNCH + SIGMA + TAU * (target - r) * 3 + 2 * T_EVAL + 2000000))
      # Armed once the checkpoint before it is there and the run is near the target (a pause in
      # the start-up is not the evaluation's).
      near=$((LAUNCH + SIGMA + TAU_STEP * (target - r - SPR) / 2))  # the speed varies 2x on a shared machine
      armed=0
      while kill -0 "$PID" 2>/dev/null; do
        now_us
        if ((NOW > deadline)); then
          note="timed out waiting for the evaluation"
          break
        fi
        if ((!armed)); then
          if ((NOW >= near)) && { ((before <= r)) || [ -e "$SOAK/step-$before.safetensors" ]; }; then armed=1; fi
        elif [ -s "$log" ] && ((NOW - $(mtime_us "$log") > SIL)); then
          rand $((T_EVAL / 4))
          snooze "$(secs "$R")"
          break
        fi
        snooze 0.02
      done
      if kill -0 "$PID" 2>/dev/null; then
        now_us
        gap=$((NOW - $(mtime_us "$log")))
        kill -9 "$PID"
      fi
      ;;
    start | timed)
      snooze "$(secs "$delay")"
      if kill -0 "$PID" 2>/dev/null; then
        now_us
        gap=$((NOW - $(mtime_us "$log")))
        kill -9 "$PID"
      fi
      ;;
  esac
  now_us
  at=$((NOW - LAUNCH))
  finish
  if ((RC == 0)) && [ -n "$(final_numbers "$log")" ]; then
    # It ended by itself before the kill: not a kill (the loop goes on, resuming at its end).
    finished_early=$((finished_early + 1))
    LAST_DONE=$(final_numbers "$log")
    LAST_DONE_LOG=$log
    say "run $rounds ($mode) finished before its kill; not counted"
    continue
  fi
  if ((RC != 137)); then
    tail -5 "$log"
    say "run $rounds ($mode) ended by itself with status $RC (log: $log)"
    failures=$((failures + 1))
    break
  fi
  kills=$((kills + 1))
  # Where it landed.
  new_tmp=""
  for f in "$SOAK"/*.tmp; do
    if [[ $f -nt $MARK ]]; then new_tmp=${f##*/}; fi
  done
  S=$(last_bar_step "$log")
  S=${S:-$r}
  if [ -n "$new_tmp" ]; then
    where="checkpoint write"
    step=${new_tmp#step-}
    step=${step%.safetensors.tmp}
  elif ((after_rename)); then
    where="after a checkpoint's rename"
    step=$target
  elif ! plain_log "$log" | grep -q '^parity train:'; then
    where="start-up"
    step=$r
  else
    # The steps the run could have made after its last progress line, at the rate it showed.
    rate=$(last_bar_rate "$log")
    reach=$((rate ? rate * 3 / 10 + 3 : SPR))
    E=$(((S / EVAL_EVERY + 1) * EVAL_EVERY))
    if [ -n "$gap" ] && ((gap > SIL && E <= S + reach && E < STEPS)); then
      where="evaluation"
      step=$E
    else
      where="steps"
      step="~$S"
    fi
  fi
  landed_count[$where]=$((${landed_count[$where]:-0} + 1))
  check_folder "$SOAK"
  ((BAD == 0)) || failures=$((failures + 1))
  after=$(newest_step "$SOAK")
  ROWS+=("$kills|$mode${note:+*}|$r|$(secs $at)|$where|$step|${after:--}|${new_tmp:--}|$CHECK")
  say "kill $kills/$KILLS ($mode$([ -n "$note" ] && echo ": $note")): resumed from $r, killed after $(secs $at) s, in $where at step $step; newest checkpoint now ${after:-none}; folder: $CHECK"
done

# ---- 3. to the end ---------------------------------------------------------------------------
r=$(newest_step "$SOAK")
say "last run: resumes from ${r:-0} to $STEPS"
LOSS_NOTE=""
if [ "${r:-0}" = "$STEPS" ]; then
  # The run that trained the last step ended by itself: its output is the final one.
  FINAL_RC=0
  FINAL_NUMBERS=$LAST_DONE
  FINAL_EVAL=$(final_eval "$LAST_DONE_LOG")
  LOSS_NOTE=" (from the run that trained the last step before its kill)"
else
  train_args "$SOAK" --resume
  launch "$OUT/runs/final.log" "${ARGS[@]}"
  finish
  FINAL_RC=$RC
  FINAL_NUMBERS=$(final_numbers "$OUT/runs/final.log")
  FINAL_EVAL=$(final_eval "$OUT/runs/final.log")
fi
check_folder "$SOAK"
FINAL_CHECK=$CHECK
((BAD == 0)) || failures=$((failures + 1))
if [ -e "$SOAK/step-$STEPS.safetensors" ]; then
  FINAL_CKPT=$(compare_ckpt "$REF_ALL/step-$STEPS.safetensors" "$SOAK/step-$STEPS.safetensors")
else
  FINAL_CKPT="missing"
fi
leftover=("$SOAK"/*.tmp)
ref_files=("$REF_ALL"/step-*.safetensors)

# ---- the table -------------------------------------------------------------------------------
{
  echo
  echo "soak: $MODEL, $STEPS steps, checkpoint every $CKPT_EVERY, evaluation ($EVAL_EXAMPLES examples) every $EVAL_EVERY, SEED=$SEED, TRAIN_SEED=$TRAIN_SEED"
  cat "$OUT/host.txt"
  echo
  printf '%4s  %-7s %7s %9s  %-28s %6s %7s  %-26s %s\n' kill mode resumed "killed at" "landed in" step "ckpt" "new .tmp left" "checkpoints vs reference"
  for row in "${ROWS[@]}"; do
    IFS='|' read -r k m from at where step after tmp check <<<"$row"
    printf '%4s  %-7s %7s %8ss  %-28s %6s %7s  %-26s %s\n' "$k" "$m" "$from" "$at" "$where" "$step" "$after" "$tmp" "$check"
  done
  if [[ ${ROWS[*]} == *'*|'* ]]; then
    echo "(* the aim was missed: the kill came after the rename, or at the wait's deadline)"
  fi
  echo
  summary=""
  for w in "start-up" "steps" "evaluation" "checkpoint write" "after a checkpoint's rename"; do
    [ -z "${landed_count[$w]:-}" ] || summary+="${summary:+, }${landed_count[$w]} in $w"
  done
  echo "kills: $kills of $KILLS ($summary); runs: $((rounds + 1)) with --resume ($finished_early ended before their kill), plus ${#ref_files[@]} load checks of the reference's checkpoints"
  echo "leftover .tmp files at the end (ignored by --resume): ${#leftover[@]}"
  echo "reference run: $(secs $REF_US) s; soak total: ${SECONDS} s"
  echo
  printf '%-30s %-38s %-38s %s\n' "" reference "killed $kills times and resumed" result
  same() { [ "$1" = "$2" ] && echo "equal" || echo "DIFFERENT"; }
  printf '%-30s %-38s %-38s %s\n' "final loss, AUC (done line)" "$REF_NUMBERS" "${FINAL_NUMBERS:-none (rc $FINAL_RC)}" "$(same "$REF_NUMBERS" "$FINAL_NUMBERS")$LOSS_NOTE"
  printf '%-30s %-38s %-38s %s\n' "final evaluation" "$REF_EVAL" "${FINAL_EVAL:-none}" "$(same "$REF_EVAL" "$FINAL_EVAL")"
  printf '%-30s %-38s %-38s %s\n' "step-$STEPS.safetensors" "" "" "$FINAL_CKPT"
  printf '%-30s %-38s %-38s %s\n' "checkpoints left in the folder" "" "" "$FINAL_CHECK"
} >"$OUT/results.txt"
ok=1
[ "$REF_NUMBERS" = "$FINAL_NUMBERS" ] && [ "$REF_EVAL" = "$FINAL_EVAL" ] && [ "$FINAL_CKPT" = identical ] &&
  ((FINAL_RC == 0 && failures == 0 && kills == KILLS)) || ok=0
if ((ok)); then
  echo "result: PASS: exact match (the final checkpoint byte-identical to the uninterrupted run's; loss and AUC equal)" >>"$OUT/results.txt"
else
  echo "result: FAIL ($failures failed checks or runs; see above and $OUT/runs)" >>"$OUT/results.txt"
fi
cat "$OUT/results.txt"
((ok))
