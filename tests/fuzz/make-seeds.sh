#!/usr/bin/env bash
# Writes the seed corpus of the fuzz targets, tests/fuzz/corpus/<target>/: valid inputs of a few
# KB each, from configs/ and from files the tools write (plans, a shard dataset and a checkpoint
# of tests/fuzz/micro.yaml), plus a few hand-made variants of them. Run it again when a format
# changes, and commit the result.
# Usage: tests/fuzz/make-seeds.sh [PARITY_BINARY]   (default build/parity; from anywhere)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
parity=$(realpath "${1:-$root/build/parity}")
corpus="$root/tests/fuzz/corpus"
micro="$root/tests/fuzz/micro.yaml"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$root"
rm -rf "$corpus"
mkdir -p "$corpus"/fuzz_{model_spec,device_spec,plan_json,shards,sequence_shards,criteo,checkpoint}

# ---- model and device YAML: every kind of field the zoo and the catalog use
for m in tiny tiny-dot criteo-small mlperf-dlrmv2 prod-trillion; do
  cp "configs/models/$m.yaml" "$corpus/fuzz_model_spec/"
done
cp "$micro" "$corpus/fuzz_model_spec/"
cp tests/cli/bad-model.yaml "$corpus/fuzz_model_spec/"
for d in h200 mi300x mi355x; do
  cp "configs/devices/$d.yaml" "$corpus/fuzz_device_spec/"
done
# Finding 1 of docs/fuzzing.md: a ',' where a document starts (yaml-cpp's LoadAll never returned).
printf ',\n' >"$corpus/fuzz_model_spec/regress-comma-document.yaml"
cp "$corpus/fuzz_model_spec/regress-comma-document.yaml" "$corpus/fuzz_device_spec/"

# ---- plans: table-sharded in HBM, host-placed tables of a port, column sharding over 8 GPUs.
# Paths are written relative to the repository, so that the seeds do not name this machine.
plan() {
  local out=$1
  shift
  "$parity" plan "$@" --out "$scratch/plan.json" >/dev/null
  LC_ALL=C sed "s|$root/||g" "$scratch/plan.json" >"$corpus/fuzz_plan_json/$out"
}
plan tiny-h200.json --model tiny --device h200
plan mlperf-h200-from-h100.json --model mlperf-dlrmv2 --device h200 --port-from h100 --gpus 1
plan tiny-mi350x-x8.json --model tiny --device mi350x --gpus 8

# ---- shard datasets, as archives (fuzz_shards.cpp): meta.json, then "@@file NAME" and each part
archive() {  # archive DIR OUT
  local dir=$1 out=$2
  {
    cat "$dir/meta.json"
    for f in "$dir"/*.bin; do
      printf '\n@@file %s\n' "$(basename "$f")"
      cat "$f"
    done
  } >"$out"
}
# A part file without the teacher section (as Criteo data is written): has_teacher (bytes 40-43)
# zeroed and the teacher's f32 [n] removed, n from the header (bytes 16-23; small here).
drop_teacher() {  # drop_teacher FILE
  local f=$1 n
  n=$(od -An -t d8 -j 16 -N 8 "$f" | tr -d ' ')
  local labels_end=$((64 + (4 * n + 7) / 8 * 8))
  local teacher_end=$((labels_end + (4 * n + 7) / 8 * 8))
  {
    head -c 40 "$f"
    printf '\0\0\0\0'
    tail -c +45 "$f" | head -c $((labels_end - 44))
    tail -c +$((teacher_end + 1)) "$f"
  } >"$f.new"
  mv "$f.new" "$f"
}
"$parity" data synth --model "$micro" --examples 16 --eval-examples 8 --examples-per-file 10 \
  --out "$scratch/shards" >/dev/null
archive "$scratch/shards" "$corpus/fuzz_shards/micro-synth"
# Finding 2: an integer field of meta.json given as a number out of int's range.
LC_ALL=C sed 's/"dense_features": 3/"dense_features": 1e300/' "$corpus/fuzz_shards/micro-synth" \
  >"$corpus/fuzz_shards/regress-float-dense-features"
drop_teacher "$scratch/shards/train-00001.bin"  # a batch across both kinds has no teacher
drop_teacher "$scratch/shards/eval-00000.bin"
"$parity" data info "$scratch/shards" --model "$micro" >/dev/null
archive "$scratch/shards" "$corpus/fuzz_shards/micro-no-teacher"

# ---- a sequence shard dataset of the HSTU model (fuzz_sequence_shards.cpp), in the same form
"$parity" data synth --model tests/fuzz/micro-hstu.yaml --examples 12 --eval-examples 6 \
  --examples-per-file 7 --out "$scratch/sequences" >/dev/null
archive "$scratch/sequences" "$corpus/fuzz_sequence_shards/micro-hstu-synth"

# ---- Criteo TSV: full lines, empty fields, negative integers, the extremes of each field, CRLF;
# one bad line
criteo_line() {  # criteo_line LABEL SEED EMPTY_EVERY: field i (1-39) empty where EMPTY_EVERY divides it
  local seed=$2 every=$3 i line=$1
  for i in $(seq 1 39); do
    line+=$'\t'
    if [ $((i % every)) -eq 0 ]; then
      continue
    elif [ "$i" -le 13 ]; then
      line+=$(((seed * 7919 + i * 104729) % 2000 - 3))
    else
      line+=$(printf '%08x' $(((seed * 2654435761 + i * 40503) % 4294967296)))
    fi
  done
  printf '%s' "$line"
}
{
  for s in 1 2 3; do criteo_line $((s % 2)) "$s" 99; printf '\n'; done
  criteo_line 0 4 3
  printf '\r\n'
  criteo_line 1 5 2
  printf '\n0\t-9223372036854775808\t9223372036854775807%s\tffffffff\t0\ta%s\n' \
    "$(printf '\t%.0s' $(seq 1 11))" "$(printf '\t%.0s' $(seq 1 23))"
} >"$corpus/fuzz_criteo/day_0.tsv"
{
  criteo_line 1 6 99
  printf '\n'
  criteo_line 2 7 99  # label 2: a bad line
  printf '\n'
  criteo_line 0 8 5
} >"$corpus/fuzz_criteo/bad-label.tsv"

# ---- a checkpoint: two steps of micro (rowwise Adagrad tables, Adam dense), as fuzz_checkpoint.cpp
# expects its run record (model micro, batch 16, seed 1)
"$parity" train --model "$micro" --steps 2 --batch 16 --seed 1 --eval-examples 64 \
  --checkpoint "$scratch/ck" >/dev/null
cp "$scratch/ck/step-2.safetensors" "$corpus/fuzz_checkpoint/micro-step-2.safetensors"

echo "$corpus: $(find "$corpus" -type f | wc -l) files, $(cat "$corpus"/*/* | wc -c) bytes"
