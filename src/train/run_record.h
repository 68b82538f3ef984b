// What a checkpoint records of the run that wrote it, and the check that a run may resume from
// it: a run continues only with the model, batch, seed and recipe it was trained with (the data
// order depends on the batch and the seed, the numerics on the recipe).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "parity/spec.h"

namespace parity::train_detail {

struct RunRecord {
  std::string model;
  std::int64_t batch = 0;
  std::uint64_t seed = 0;
  std::string embedding_optimizer, dense_optimizer, dense_math;
  std::string data;  // the training source's kind()
  // The recipe's numerics as metadata keys and values (optimizer kinds and hyperparameters, dense
  // math, table precisions): a resume must find each one the checkpoint holds unchanged.
  std::vector<std::pair<std::string, std::string>> recipe;
};

// The record of a run of `model` (its recipe: apply_plan's, where a plan was given).
RunRecord run_record(const ModelSpec& model, std::int64_t batch, std::uint64_t seed,
                     DenseMath dense_math, std::string data);

// The metadata of the checkpoint of `step`.
std::map<std::string, std::string> checkpoint_metadata(const RunRecord& run, std::int64_t step);

// The step of the checkpoint at `path`, once its metadata says a run like `run` wrote it
// (format, model, batch, seed, recipe); InputError naming the file and what differs otherwise
// (CheckpointCorrupt where the header is damaged).
std::int64_t resumable_step(const std::filesystem::path& path, const RunRecord& run);

}  // namespace parity::train_detail
