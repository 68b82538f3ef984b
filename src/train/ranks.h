// What the training loops of a run over several ranks share. Internal to src/train.
#pragma once

#include <vector>

#include "parity/dist.h"

namespace parity::train_detail {

// Every rank's values, in rank order, on every rank (each rank may give a different count).
std::vector<float> gather_all(Communicator& comm, const std::vector<float>& mine);

}  // namespace parity::train_detail
