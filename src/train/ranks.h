// What the training loops of a run over several ranks share. Internal to src/train.
#pragma once

#include <cstdint>
#include <filesystem>
#include <utility>
#include <vector>

#include "parity/dist.h"

namespace parity::train_detail {

// Every rank's values, in rank order, on every rank (each rank may give a different count).
std::vector<float> gather_all(Communicator& comm, const std::vector<float>& mine);

// The ranks share the checkpoint directory `dir`; a rank that lists other checkpoint steps there
// is not sharing it: InputError naming both ranks' counts and newest steps.
void same_checkpoints_on_every_rank(Communicator& comm, const std::vector<std::int64_t>& steps,
                                    const std::filesystem::path& dir);

// Whether any rank failed, and whether any found a checkpoint damaged (one rank's answer where
// comm is null).
std::pair<bool, bool> agree_on_resume(Communicator* comm, bool failed, bool corrupt);

}  // namespace parity::train_detail
