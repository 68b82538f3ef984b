#!/usr/bin/env bash
# Does the sharded step run right on a GPU, and what does the NCCL engine cost a run of one GPU?
# What one GPU machine can answer (several ranks on several GPUs belong to the multi-GPU issue).
#
#   PARITY_PREBUILT=build-prebuilt bench/dist-one-gpu.sh
#
# 1. dist_sharded_check on the GPU, one process: every sharding (rows and columns cut into two
#    pieces, both held here) through NCCL's engine in place and through the self communicator
#    (the rows through the host), against the cpu's whole tables within 1e-5. Then, where mpirun
#    starts parity's binaries here, two ranks sharing the GPU through the MPI engine.
# 2. The NCCL engine at world size 1: MODEL planned for one DEVICE, STEPS steps on batches made on
#    the device, trained alone and with --collectives nccl (the tables stay whole; the dense
#    gradients go through NCCL in place), alternating RUNS times each; the steady examples/s of
#    each and the ratio. The bound: at most 3% below.
# 3. Where mpirun works: tiny and hstu-tiny over 2 ranks sharing the GPU (--collectives mpi, the
#    planner's plans for 2 GPUs as they are: fp16 tables, bf16 dense math), their loss and AUC
#    beside one process's.
# A table is printed last; logs go to $OUT (default out/dist-one-gpu).
#
# Environment: PARITY_PREBUILT or a cmake build, MODEL (mlperf-dlrmv2), DEVICE (this GPU's), STEPS
# (200), RUNS (2), SKIP_MPI (set: no mpirun steps).
set -uo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" dist-one-gpu
MODEL=${MODEL:-mlperf-dlrmv2}
# The catalog's name of this machine's GPU (h100, h200, ...), unless DEVICE names one.
DEVICE=${DEVICE:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 |
  grep -oiE 'h100|h200|b200|gb200' | tr '[:upper:]' '[:lower:]' || true)}
DEVICE=${DEVICE:-h200}
STEPS=${STEPS:-200}
RUNS=${RUNS:-2}
for v in STEPS RUNS; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "dist-one-gpu: $v must be a whole number, got '${!v}'" >&2; exit 2; }
done
device_facts
find_binaries parity dist_sharded_check
P=$BIN/parity
rows=()
row() { rows+=("$(printf '%-52s %s' "$1" "$2")"); }

say "1. the sharded tables on the GPU"
for engine in nccl self; do
  if run_bin "$BIN/dist_sharded_check" gpu "$engine" >"$OUT/sharded-$engine.log" 2>&1; then
    row "dist_sharded_check gpu $engine (1 rank)" "pass ($(grep -oE 'difference [0-9.e+-]+' "$OUT/sharded-$engine.log" | sort -k2 -g | tail -1))"
  else
    row "dist_sharded_check gpu $engine (1 rank)" "FAIL (sharded-$engine.log)"
  fi
done
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np 2 -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE)
if [ -z "${SKIP_MPI:-}" ] && command -v mpirun >/dev/null; then
  if run_bin "${MPIRUN[@]}" "$BIN/dist_sharded_check" gpu mpi >"$OUT/sharded-mpi2.log" 2>&1; then
    row "dist_sharded_check gpu mpi (2 ranks, 1 GPU)" "pass"
  else
    row "dist_sharded_check gpu mpi (2 ranks, 1 GPU)" "did not pass (sharded-mpi2.log)"
  fi
fi

say "2. world size 1: $MODEL alone and through NCCL"
run_bin "$P" plan --model "$MODEL" --device "$DEVICE" --gpus 1 --out "$SCRATCH/plan1.json" \
  >"$OUT/plan1.txt" 2>&1 || { tail -5 "$OUT/plan1.txt"; exit 1; }
for r in $(seq 1 "$RUNS"); do
  for how in alone nccl; do
    extra=()
    [ "$how" = nccl ] && extra=(--collectives nccl)
    run_bin "$P" train --plan "$SCRATCH/plan1.json" --steps "$STEPS" --eval-examples 65536 \
      "${extra[@]}" >"$OUT/w1-$how-$r.log" 2>&1 || say "w1 $how run $r failed (w1-$how-$r.log)"
    echo "$how $r $(steady "$OUT/w1-$how-$r.log")" | tee -a "$OUT/w1.txt"
  done
done
best() { awk -v h="$1" '$1 == h && $3 + 0 > m {m = $3 + 0} END {printf "%.0f", m}' "$OUT/w1.txt"; }
a=$(best alone)
n=$(best nccl)
row "$MODEL, 1 GPU, alone: examples/s (best of $RUNS)" "$a"
row "$MODEL, 1 GPU, --collectives nccl: examples/s" "$n"
[ "${a:-0}" -gt 0 ] && row "nccl / alone" "$(awk -v a="$a" -v n="$n" 'BEGIN {printf "%.4f", n / a}')"

if [ -z "${SKIP_MPI:-}" ] && command -v mpirun >/dev/null; then
  say "3. tiny and hstu-tiny over 2 ranks sharing the GPU (MPI through the host), plans as made"
  # The planner's plans as they are: tiny's fp16 tables and bf16 dense math (a bf16 interaction
  # input under sharded tables), hstu-tiny's rows split over the ranks.
  for m in tiny hstu-tiny; do
    run_bin "$P" plan --model "$m" --device "$DEVICE" --gpus 2 --out "$SCRATCH/$m-2.json" >/dev/null 2>&1
    run_bin "$P" plan --model "$m" --device "$DEVICE" --gpus 1 --out "$SCRATCH/$m-1.json" >/dev/null 2>&1
    if run_bin "${MPIRUN[@]}" "$P" train --plan "$SCRATCH/$m-2.json" --collectives mpi \
      --steps 200 --eval-examples 4096 >"$OUT/$m-np2.log" 2>&1; then
      row "$m, 2 ranks on 1 GPU (mpi): final" "$(grep -m1 '^done' "$OUT/$m-np2.log" | sed 's/.*final/final/')"
    else
      row "$m, 2 ranks on 1 GPU (mpi)" "did not run ($m-np2.log)"
    fi
    run_bin "$P" train --plan "$SCRATCH/$m-1.json" --steps 200 --eval-examples 4096 \
      >"$OUT/$m-1.log" 2>&1
    row "$m, 1 process: final" "$(grep -m1 '^done' "$OUT/$m-1.log" | sed 's/.*final/final/')"
  done
fi
device_after
printf '%s\n' "${rows[@]}" | tee "$OUT/summary.txt"
