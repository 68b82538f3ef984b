#!/usr/bin/env bash
# How long does a rank of a sharded run spend routing its batch's ids to the shards' owners and
# exchanging them, on the host? (no GPU: the cpu backend)
#
#   bench/dist-routing.sh                 # after scripts/build.sh
#
# The MLPerf DLRMv2 tables (26, with their multi-hot sizes: 214 ids an example) at dim 16 and at
# most ROWS rows, small MLPs and the dot interaction so that the embedding work dominates, a plan
# for one GPU whose tables of 1,000 rows or more are cut into PIECES row shards, all held by the
# one rank: every id is routed (a row shard gets the ids in its rows) and exchanged through the
# MPI engine (--collectives mpi), as a rank of a sharded run does. `parity train --profile`
# prints the step's embedding_exchange (the routing, the ids' exchange and the pooled rows' and
# gradients' exchanges) beside the lookups and updates. RUNS runs; the table is printed last.
#
# Environment: BIN (build), ROWS (200000), PIECES (8), BATCH (8192), STEPS (8), RUNS (3).
set -euo pipefail
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh" dist-routing
BIN=${BIN:-build}
ROWS=${ROWS:-200000}
PIECES=${PIECES:-8}
BATCH=${BATCH:-8192}
STEPS=${STEPS:-8}
RUNS=${RUNS:-3}
P=$PWD/$BIN/parity
[ -x "$P" ] || { echo "dist-routing: no parity binary at $P (scripts/build.sh)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

sed -e 's/^name: .*/name: routing-check/' -e "s/batch_size: .*/batch_size: $BATCH/" \
  -e 's/dim: 128/dim: 16/' -e 's/^bottom_mlp:.*/bottom_mlp: [16]/' \
  -e 's/^top_mlp:.*/top_mlp: [16, 1]/' -e 's/^interaction:.*/interaction: {kind: dot}/' \
  "$(capped mlperf-dlrmv2 "$ROWS")" >"$SCRATCH/model.yaml"
"$P" plan --model "$SCRATCH/model.yaml" --device h200 --gpus 1 --out "$SCRATCH/plan1.json" >/dev/null
python3 - "$SCRATCH/plan1.json" "$SCRATCH/plan.json" "$PIECES" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
k = int(sys.argv[3])
for t in p["tables"]:
    t["dtype"], t["placement"] = "fp32", "hbm"
    rows = t["shards"][0]["rows"][1]
    if rows >= 1000:
        t["sharding"] = "row"
        t["shards"] = [{"device": 0, "rows": [rows * j // k, rows * (j + 1) // k],
                        "cols": t["shards"][0]["cols"]} for j in range(k)]
json.dump(p, open(sys.argv[2], "w"), indent=1)
EOF
rows=()
for r in $(seq 1 "$RUNS"); do
  "$P" train --backend cpu --collectives mpi --plan "$SCRATCH/plan.json" --steps "$STEPS" \
    --eval-examples 1024 --profile >"$OUT/run-$r.log" 2>&1
  ex=$(awk '$1 == "embedding_exchange" {print $2; exit}' "$OUT/run-$r.log")
  fw=$(awk '$1 == "embedding_forward" {print $2; exit}' "$OUT/run-$r.log")
  bw=$(awk '$1 == "embedding_backward" {print $2; exit}' "$OUT/run-$r.log")
  rows+=("$(printf '%-4s %12s %12s %12s  %s' "$r" "$ex" "$fw" "$bw" "$(grep -m1 '^done' "$OUT/run-$r.log" | sed 's/.*final/final/')")")
done
{
  echo "$(nproc) cores; batch $BATCH, tables of at most $ROWS rows in $PIECES row pieces; ms per step"
  printf '%-4s %12s %12s %12s\n' run exchange forward backward
  printf '%s\n' "${rows[@]}"
} | tee "$OUT/summary.txt"
