// Faults found in training and their replays, shared by the DLRM and HSTU loops. Internal to
// src/train.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "parity/backend.h"
#include "parity/dist.h"
#include "parity/engine.h"
#include "parity/error.h"
#include "parity/train.h"

namespace parity::train_detail {

// A fault found in training, thrown to train(), which replays it to tell the data or the model
// from the device (TrainConfig::replay_faults). what() is the message the run stops with where
// no replay is made.
enum class FaultKind { nonfinite, product_check, loss_spike };
class FaultInTraining : public NumericalError {
 public:
  FaultInTraining(FaultKind kind, std::int64_t step, double loss, std::string found,
                  std::string last_good, std::string advice, bool on_gpu, bool here = true)
      : NumericalError(found + last_good + advice),
        kind(kind),
        step(step),
        loss(loss),
        found(std::move(found)),
        last_good(std::move(last_good)),
        advice(std::move(advice)),
        on_gpu(on_gpu),
        here(here) {}
  FaultKind kind;
  std::int64_t step;  // found in (nonfinite: the first bad step)
  double loss;        // loss_spike: the step's loss
  std::string found, last_good, advice;
  bool on_gpu;  // the run's device is a GPU (one the health ledger can mark)
  // This rank's device is among those that may have caused it: a product check that failed
  // here; a non-finite value or a spike in a run over several ranks (the ranks share every step's
  // dense gradients, so any rank's device may have caused it).
  bool here;
};

// Throws FaultInTraining where any rank's checksummed products failed (Backend::product_checks'
// counts `c`, summed over `comm`'s ranks: a collective where comm has several, called by every
// rank at the same step). `step`: where it was found; `last_good`: FaultInTraining's.
void throw_if_products_failed(const Backend::ProductChecks& c, Communicator* comm,
                              std::int64_t step, const std::string& last_good, bool on_gpu);

// A planted table fault (TrainConfig::inject_table_fault) checked against the model's tensors
// (`layout`, Model::checkpoint_layout's): InputError naming the flag, the table and what was
// expected.
void check_table_fault(const TrainConfig::TableFaultAtStep& f, const CheckpointLayout& layout);
// Flips the fault's bit in each copy of its element that this process holds (`layout`'s pieces,
// in `backend`'s memory; the backend synchronised first). Returns how many it flipped. The
// caller then calls the model's tensors_written(), so that caches read the flipped row.
int plant_table_fault(const TrainConfig::TableFaultAtStep& f, const CheckpointLayout& layout,
                      Backend& backend);

// Trains a fault's replay: the run `rc` (resumed, to the fault's step, with no checkpoints,
// evaluations or planted faults) from the checkpoint of step `from`. Returns its result or throws
// the FaultInTraining it finds.
using ReplayRun = std::function<TrainResult(const TrainConfig& rc, std::int64_t from)>;

// What train() does with a fault a trainer found: replays it where it can (TrainConfig::
// replay_faults) and returns the verdict where the device was at fault and training may go on
// from the checkpoint; throws NumericalError with the verdict otherwise.
// `from`: the checkpoint step the replay started from. In a run over several ranks every rank
// calls it together (the replay is collective).
std::string after_fault(const TrainConfig& cfg, const FaultInTraining& f, TrainObserver* observer,
                        std::size_t recovered_before, std::int64_t& from, const ReplayRun& replay);

}  // namespace parity::train_detail
