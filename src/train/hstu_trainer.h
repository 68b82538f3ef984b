// The training loop of HSTU models (ModelKind::hstu), which train() hands them to. Internal to
// src/train.
#pragma once

#include "parity/train.h"

namespace parity::train_detail {

// train() for an HSTU model: synthetic sequences, a sequence shard dataset or sources of the
// caller's own, evaluation per task.
TrainResult train_hstu(const TrainConfig& config, TrainObserver* observer);

}  // namespace parity::train_detail
