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

// The smallest of the ranks' non-negative values (a step, a count), or -1 where every rank gives
// -1: the ranks' agreement on the first bad step.
std::int64_t earliest_on_any_rank(Communicator& comm, std::int64_t mine);

// The sum over the ranks of `mine` (counts, in doubles: exact below 2^53).
double sum_over_ranks(Communicator& comm, double mine);

}  // namespace parity::train_detail
