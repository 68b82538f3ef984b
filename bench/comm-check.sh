#!/usr/bin/env bash
# Do parity's collectives reach what NCCL reaches alone, and does the planner's collective model
# predict them? On a GPU machine, from the repository root:
#   1. nccl_alone (bench/nccl_alone.cpp): NCCL's own bandwidth over every GPU, nccl-tests' way
#      (one process, back-to-back launches between events);
#   2. parity bench comm --engine nccl, one rank a GPU (mpirun where there are several), with the
#      planner's collective_time for the same sizes on DEVICE;
#   3. the table: per collective and size, parity's bus bandwidth, NCCL's alone, their ratio (the
#      issue's target is 90% for the all-to-all), the model's bus bandwidth and its error against
#      parity's measured time; then the scale-up terms fitted to parity's results (for the
#      device's calibration file).
#
#   PARITY_PREBUILT=build-prebuilt bench/comm-check.sh
#
# Environment: GPUS (default: every GPU nvidia-smi lists), DEVICE (h200: the catalog key the model
# is evaluated for), MIN_BYTES (1024), MAX_BYTES (268435456), ITERS (20), WARMUP (5). The table is
# printed last and written to $OUT/comm-check.md; the exit status is non-zero where a result is
# wrong or a run fails.
set -uo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" comm-check
GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
DEVICE=${DEVICE:-h200}
MIN_BYTES=${MIN_BYTES:-1024}
MAX_BYTES=${MAX_BYTES:-268435456}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
find_binaries parity nccl_alone || exit 1
device_facts
[ "${GPUS:-0}" -ge 1 ] || {
  echo "no GPU listed by nvidia-smi" >&2
  exit 1
}
status=0
sizes=(--min-bytes "$MIN_BYTES" --max-bytes "$MAX_BYTES" --iters "$ITERS" --warmup "$WARMUP")

say "NCCL alone over $GPUS GPUs"
run_bin "$BIN/nccl_alone" --gpus "$GPUS" "${sizes[@]}" >"$OUT/nccl-alone.log" 2>&1 || status=1
cat "$OUT/nccl-alone.log"

say "parity bench comm over $GPUS ranks"
launch=()
if [ "$GPUS" -gt 1 ]; then
  launch=(mpirun --allow-run-as-root --oversubscribe -np "$GPUS" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE)
fi
run_bin "${launch[@]}" "$BIN/parity" bench comm --engine nccl --device "$DEVICE" "${sizes[@]}" \
  >"$OUT/parity-comm.log" 2>&1 || status=1
cat "$OUT/parity-comm.log"
grep -q WRONG "$OUT/nccl-alone.log" "$OUT/parity-comm.log" && status=1
device_after

# Rows "size op time algbw busbw check [model_us model_busbw]" of both logs, joined on (op, size).
{
  echo "| collective | size (B) | parity busbw GB/s | NCCL alone busbw GB/s | parity / NCCL | model busbw GB/s | model time error |"
  echo "|---|---|---|---|---|---|---|"
  awk '
    FNR == 1 { file++ }
    $1 ~ /^[0-9]+$/ && NF >= 6 {
      key = $2 " " $1
      if (file == 1) { nccl_t[key] = $3; nccl_bw[key] = $5 }
      else if (file == 2) { order[++n] = key; t[key] = $3; bw[key] = $5; mt[key] = $7; mbw[key] = $8 }
    }
    END {
      for (i = 1; i <= n; i++) {
        k = order[i]; split(k, f, " ")
        ratio = (k in nccl_t) && t[k] > 0 ? sprintf("%.1f%%", 100 * nccl_t[k] / t[k]) : "-"
        err = mt[k] > 0 && t[k] > 0 ? sprintf("%+.0f%%", 100 * (mt[k] / t[k] - 1)) : "-"
        printf "| %s | %s | %s | %s | %s | %s | %s |\n", f[1], f[2], bw[k],
               (k in nccl_bw) ? nccl_bw[k] : "-", ratio, mbw[k] != "" ? mbw[k] : "-", err
      }
    }' "$OUT/nccl-alone.log" "$OUT/parity-comm.log"
  grep -A3 -E '^(scale-up fit|no scale-up fit)' "$OUT/parity-comm.log"
} | tee "$OUT/comm-check.md"
exit $status
