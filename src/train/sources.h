// Where a training run's batches come from, for both training loops (trainer.cpp's DLRM loop and
// hstu_trainer.cpp's): the sources a configuration names, and the held-out data read once before
// the first step. Internal to src/train.
#pragma once

#include <cstdint>
#include <memory>

#include "parity/data.h"
#include "parity/train.h"

namespace parity::train_detail {

struct Sources {
  std::unique_ptr<BatchSource> train, eval;
};

// The training and evaluation data the configuration names: the user's sources, a shard dataset
// (with a step count epochs follow each other; else one pass), Criteo TSV files or synthetic data
// (an HSTU model's: its shard format and synthetic sequences).
Sources make_sources(const TrainConfig& cfg);

// Reads up to eval_examples held-out examples, in batches of `batch`, before the first step: a
// bad one stops the run now, not at its first evaluation; no example at all is an InputError.
void check_eval_data(BatchSource& eval, std::int64_t batch, std::int64_t eval_examples);

}  // namespace parity::train_detail
