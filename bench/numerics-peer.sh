#!/usr/bin/env bash
# Does bf16 move a model's training as far in PyTorch as in parity? For each model and seed: one
# dataset (`parity data synth`: the examples `parity train` makes on the fly for that seed);
# parity trained on it on the GPU in fp32 and in bf16 dense math (the model's own recipe,
# --no-plan); PyTorch (bench/numerics_torch.py: the same model, optimizers and examples in the
# same order, its own initial weights) in fp32 and under bf16 autocast, each again with its
# weights moved by about one fp32 ulp before the first step (what two devices' orders of
# summation do to a run). Every window's mean loss is compared as bench/numerics-check.sh compares
# them (0.3% in every window of WINDOW steps; docs/reliability.md): parity bf16 against parity
# fp32, PyTorch bf16 against PyTorch fp32, and each PyTorch recipe against itself one ulp off.
#
#   PARITY_PREBUILT=build-prebuilt bench/numerics-peer.sh
#
# Environment: MODELS (default "tiny tiny-dot"), SEEDS ("1 2 3 4 5 6"), STEPS (2000), WINDOW
# (100), BATCH (512), CAP (rows of every table capped here: 200000), EVAL_EXAMPLES (65536),
# PYTHON (python3: the one with torch), WITH_PARITY (1; 0 on a machine without a GPU: PyTorch
# alone, on the CPU there; `parity data` still writes the datasets, so name a prebuilt folder,
# PARITY_PREBUILT). Each cell is the worst window / the mean of the windows' signed differences. The table is printed last and written to
# $OUT/numerics-peer.md; the exit status is non-zero where a run fails (the bounds are measured
# here, not enforced).
set -uo pipefail
. "$(dirname "$0")/common.sh" numerics-peer
MODELS=${MODELS:-tiny tiny-dot}
SEEDS=${SEEDS:-1 2 3 4 5 6}
STEPS=${STEPS:-2000}
WINDOW=${WINDOW:-100}
BATCH=${BATCH:-512}
CAP=${CAP:-200000}
EVAL_EXAMPLES=${EVAL_EXAMPLES:-65536}
PYTHON=${PYTHON:-python3}
WITH_PARITY=${WITH_PARITY:-1}
find_binaries parity || exit 1
device_facts
"$PYTHON" -c 'import torch; c = torch.cuda.is_available()
print("torch", torch.__version__, "on", torch.cuda.get_device_name() if c else "the CPU")' \
  2>&1 | tee -a "$OUT/device.txt"
status=0
rows=()
for m in $MODELS; do
  spec=$(capped "$m" "$CAP")
  for s in $SEEDS; do
    base="$OUT/$m-s$s"
    data="$SCRATCH/$m-s$s"
    rm -f "$base".*  # no earlier run's results in this run's table
    say "$m, seed $s"
    run_bin "$BIN/parity" data synth --model "$spec" --examples $((STEPS * BATCH)) \
      --eval-examples "$EVAL_EXAMPLES" --seed "$s" --out "$data" >"$base.data.log" 2>&1 || {
      status=1
      continue
    }
    pids=()
    for run in fp32 bf16 fp32-ulp bf16-ulp; do
      off=()
      [ "$run" = "${run%-ulp}" ] || off=(--perturb-ulp 1)
      PYTHONUNBUFFERED=1 "$PYTHON" bench/numerics_torch.py --model "$spec" \
        --data "$data" --dense-math "${run%-ulp}" --steps "$STEPS" --batch "$BATCH" --seed "$s" \
        --loss-window "$WINDOW" --eval-examples "$EVAL_EXAMPLES" --loss-log "$base.torch-$run.txt" \
        "${off[@]}" >"$base.torch-$run.log" 2>&1 &
      pids+=($!)
    done
    for math in fp32 bf16; do
      [ "$WITH_PARITY" = 1 ] || continue
      run_bin "$BIN/parity" train --model "$spec" --data "$data" --no-plan --seed "$s" --steps "$STEPS" \
        --batch "$BATCH" --eval-every 0 --eval-examples "$EVAL_EXAMPLES" --backend gpu \
        --dense-math "$math" --loss-window "$WINDOW" --loss-log "$base.parity-$math.txt" \
        >"$base.parity-$math.log" 2>&1 || status=1
    done
    for p in "${pids[@]}"; do wait "$p" || status=1; done
    rows+=("$(PYTHONPATH=bench python3 - "$base" "$m" "$s" "$WITH_PARITY" <<'PY'
import math, sys
from loss_windows import last_auc, mean, relative, windows, worst
base, model, seed, with_parity = sys.argv[1:]
def auc(run):
    try:
        a = last_auc(f"{base}.{run}.log")
    except OSError:
        return "-"
    return "?" if math.isnan(a) else f"{a:.4f}"
def cell(x, y):  # x against y: the worst window and the mean of the signed differences
    try:
        d = relative(windows(f"{base}.{x}.txt"), windows(f"{base}.{y}.txt"))
    except OSError:
        return "-" if x.startswith("parity") and with_parity != "1" else "run failed"
    if not d:
        return "run failed"
    return f"{100 * worst(d):.3f}% / {100 * mean(d):+.3f}%"
print(f"| {model} | {seed} | {cell('parity-bf16', 'parity-fp32')} | {cell('torch-bf16', 'torch-fp32')} "
      f"| {cell('torch-fp32-ulp', 'torch-fp32')} | {cell('torch-bf16-ulp', 'torch-bf16')} "
      f"| {auc('parity-fp32')} / {auc('parity-bf16')} | {auc('torch-fp32')} / {auc('torch-bf16')} |")
PY
)")
    echo "${rows[-1]}"
    rm -rf "$data"
  done
done
device_after
{
  echo "| model | seed | parity: bf16 vs fp32 | PyTorch: bf16 vs fp32 | PyTorch fp32: one ulp off vs not | PyTorch bf16: one ulp off vs not | AUC parity fp32 / bf16 | AUC PyTorch fp32 / bf16 |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$OUT/numerics-peer.md"
exit $status
