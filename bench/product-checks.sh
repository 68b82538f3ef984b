#!/usr/bin/env bash
# Do the GPU's checksummed products (--product-checks) catch flipped bits, never fail a clean
# product, and at what cost? On the GPU machine, from the repository root:
#   1. the GPU tests of the checks (test_backend_gpu '*ProductChecks*'): 1,500 injected high-bit
#      flips a dense math, caught by bit class, and clean random products;
#   2. clean training with the checks: tiny for TINY_STEPS steps under the plan's dense math (bf16
#      on an H100 or H200) and under fp32, each of OTHER_MODELS (the dot interaction, HSTU) for
#      OTHER_STEPS and each of MODELS for STEPS steps: none may fail;
#   3. the cost: each of MODELS again without the checks, both with --profile, the device step
#      time (the profile's sum of categories) beside the plan's prediction of it (the plan made
#      with the checks counts them), and the steady examples/s;
#   4. the dense forward ops alone with and without the checks (dense_bench): measured beside the
#      plan's prediction with the checks counted, op by op in dense*.log; and with every checked
#      product through the library and the row pass (--library-checks), where bf16 products
#      would run in one kernel;
#   5. a flip found in training: tiny with --inject-fault, exit 3 without replay, and with a
#      checkpoint to replay from, the device blamed and training going on (exit 0).
# The health ledger is $OUT/ledger.json (the flips mark the device suspect there, not in the
# machine's own).
#
#   PARITY_PREBUILT=build-prebuilt bench/product-checks.sh
#
# Environment: MODELS (default mlperf-dlrmv2-2m), STEPS (300), TINY_STEPS (10000), OTHER_MODELS
# (tiny-dot hstu-tiny), OTHER_STEPS (2000). The table is
# printed last and written to $OUT/product-checks.md; the exit status is non-zero where a check
# fails a clean run, a flip is missed or a run fails.
set -uo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" product-checks
MODELS=${MODELS:-mlperf-dlrmv2-2m}
STEPS=${STEPS:-300}
TINY_STEPS=${TINY_STEPS:-10000}
OTHER_MODELS=${OTHER_MODELS:-tiny-dot hstu-tiny}
OTHER_STEPS=${OTHER_STEPS:-2000}
find_binaries parity test_backend_gpu dense_bench || exit 1
device_facts
export PARITY_HEALTH_LEDGER=$OUT/ledger.json
P="$BIN/parity"
status=0
rows=()
row() { rows+=("| $1 | $2 | $3 |"); }

# The "product checks: N dense products checked, none failed" count, or the stop's reason.
outcome() {  # LOG
  grep -m1 -oE 'product checks: [0-9]+ dense products checked, none failed' "$1" ||
    grep -m1 -oE 'silent data corruption: [^;]*' "$1" || echo "no outcome (see $(basename "$1"))"
}
# The profile's "sum of categories": device ms a step, and the plan's prediction of it (the plan
# made with --product-checks counts the checks).
step_ms() { awk '/sum of categories/ {print $4; exit}' "$1"; }
plan_ms() { awk '/sum of categories/ {print $5; exit}' "$1"; }

say "GPU tests of the checks"
run_bin "$BIN/test_backend_gpu" --gtest_filter='*ProductChecks*' >"$OUT/tests.log" 2>&1 || status=1
grep -E 'caught|clean products' "$OUT/tests.log"
for math in fp32 bf16; do
  caught=$(grep -E "measured \] $math " "$OUT/tests.log" | grep caught |
    awk '{h = $5 == "high"; printf "%s%s %s of %s", (NR > 1 ? ", " : ""), (h ? "high mantissa" : $5), (h ? $7 : $6), (h ? $9 : $8)}')
  row "injected high-bit flips, $math math" "test_backend_gpu --gtest_filter='*ProductChecks*'" \
    "${caught:-not run (see tests.log)}"
done

say "tiny: $TINY_STEPS clean steps with the checks"
run_bin "$P" train --model tiny --steps "$TINY_STEPS" --product-checks --eval-examples 4096 \
  >"$OUT/tiny.log" 2>&1 || status=1
row "clean tiny, the plan's dense math" "parity train --model tiny --steps $TINY_STEPS --product-checks" \
  "$(outcome "$OUT/tiny.log")"
run_bin "$P" train --model tiny --no-plan --dense-math fp32 --steps "$TINY_STEPS" --product-checks \
  --eval-examples 4096 >"$OUT/tiny-fp32.log" 2>&1 || status=1
row "clean tiny, fp32 math" "... --no-plan --dense-math fp32" "$(outcome "$OUT/tiny-fp32.log")"

# The other paths through the checked products: the dot interaction and HSTU's projections.
for m in $OTHER_MODELS; do
  say "$m: $OTHER_STEPS clean steps with the checks"
  run_bin "$P" train --model "$m" --steps "$OTHER_STEPS" --product-checks --eval-examples 4096 \
    >"$OUT/$m.other.log" 2>&1 || status=1
  row "clean $m" "parity train --model $m --steps $OTHER_STEPS --product-checks" \
    "$(outcome "$OUT/$m.other.log")"
done

for m in $MODELS; do
  say "$m: $STEPS steps without and with the checks"
  run_bin "$P" train --model "$m" --steps "$STEPS" --profile >"$OUT/$m.log" 2>&1 || status=1
  run_bin "$P" train --model "$m" --steps "$STEPS" --profile --product-checks \
    >"$OUT/$m.checks.log" 2>&1 || status=1
  row "clean $m" "parity train --model $m --steps $STEPS --profile --product-checks" \
    "$(outcome "$OUT/$m.checks.log")"
  without=$(step_ms "$OUT/$m.log")
  with=$(step_ms "$OUT/$m.checks.log")
  cost=$(awk -v a="$without" -v b="$with" 'BEGIN {if (a > 0 && b > 0) printf "+%.1f%%", 100 * (b / a - 1); else print "-"}')
  plan_without=$(plan_ms "$OUT/$m.log")
  plan_with=$(plan_ms "$OUT/$m.checks.log")
  predicted=$(awk -v a="$plan_without" -v b="$plan_with" 'BEGIN {if (a > 0 && b > 0) printf "+%.1f%%", 100 * (b / a - 1); else print "-"}')
  row "cost on $m" "the same without --product-checks" \
    "device step ${without:-?} ms without, ${with:-?} ms with ($cost); the plan predicts ${plan_without:-?} and ${plan_with:-?} ($predicted); $(steady "$OUT/$m.log") against $(steady "$OUT/$m.checks.log") examples/s"
done

# The forward ops alone, with and without the checks (dense_bench: each op's median time beside
# its roofline and the plan's prediction with the checks counted): measured and predicted ms
# summed over the forward ops.
forward_ms() { awk '$2 == "forward" && $3 + 0 > 0 {m += $3; p += $10} END {printf "%.2f measured, %.2f predicted", m, p}' "$1"; }
say "the dense forward ops with and without the checks"
run_bin "$BIN/dense_bench" --model mlperf-dlrmv2 --no-passes --reps 10 >"$OUT/dense.log" 2>&1 || status=1
run_bin "$BIN/dense_bench" --model mlperf-dlrmv2 --no-passes --reps 10 --product-checks \
  >"$OUT/dense-checks.log" 2>&1 || status=1
run_bin "$BIN/dense_bench" --model mlperf-dlrmv2 --no-passes --reps 10 --product-checks \
  --library-checks >"$OUT/dense-library.log" 2>&1 || status=1
fused=$(grep -m1 -oE '[0-9]+ of them in one kernel' "$OUT/dense-checks.log")
row "forward ops of MLPerf DLRMv2, batch 65,536" "dense_bench --model mlperf-dlrmv2 --no-passes --reps 10 [--product-checks [--library-checks]]" \
  "without: $(forward_ms "$OUT/dense.log") ms; with: $(forward_ms "$OUT/dense-checks.log") ms ($(grep -m1 -oE 'product checks: [0-9]+ forward products checked, [0-9]+ failed' "$OUT/dense-checks.log" || echo 'no check count'); ${fused:-none in one kernel}); through the library and the row pass: $(forward_ms "$OUT/dense-library.log") ms"

say "a flip in training"
run_bin "$P" train --model tiny --steps 60 --product-checks --no-replay --inject-fault 30:2:100:30 \
  >"$OUT/flip.log" 2>&1
rc=$?
[ "$rc" -eq 3 ] || status=1
row "a flip, no replay" "parity train --model tiny --steps 60 --product-checks --no-replay --inject-fault 30:2:100:30" \
  "exit $rc (3 expected): $(outcome "$OUT/flip.log")"
rm -rf "$SCRATCH/ckpt"
run_bin "$P" train --model tiny --steps 60 --product-checks --inject-fault 30:2:100:30 \
  --checkpoint "$SCRATCH/ckpt" --checkpoint-every 20 >"$OUT/flip-replay.log" 2>&1
rc=$?
[ "$rc" -eq 0 ] || status=1
replay=$(grep -m1 -oE 'the replay of steps [0-9]+ to [0-9]+ [^:]*' "$OUT/flip-replay.log")
row "a flip, replayed" "the same with --checkpoint DIR --checkpoint-every 20" \
  "exit $rc (0 expected): ${replay:-no replay found}"
# Without the checks the flip is planted all the same, for the finite-value guard to find.
run_bin "$P" train --model tiny --steps 60 --no-replay --inject-fault 30:2:100:30 \
  >"$OUT/flip-unchecked.log" 2>&1
rc=$?
row "a flip without the checks" "parity train --model tiny --steps 60 --no-replay --inject-fault 30:2:100:30" \
  "exit $rc: $(grep -m1 -oE '(stopped|failed): .{0,120}' "$OUT/flip-unchecked.log" || echo 'ran to the end')"
device_after

{
  echo "| what | command | result |"
  echo "|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$OUT/product-checks.md"
exit $status
