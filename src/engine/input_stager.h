// The input pipeline (docs/architecture.md, "The input pipeline"): kSlots input slots, each the
// device buffers of one batch and the pinned host memory it is staged in, used round robin.
// stage() checks a batch, copies it into the next slot's pinned memory and enqueues its copy to
// the device on the backend's copy queue; a step takes the oldest staged slot and holds it
// (InUse) while it enqueues the work that reads it. Backend::begin_input .. release_input order
// the two queues (backend.h describes the protocol).
//
// Why it is built this way: with batch k+1 staged right after step k is enqueued, both the host
// copy and the device copy hide behind step k. Every slot's device buffers are allocated at
// construction for a full batch and its pinned memory on first use or by allocate_pinned (which
// Model::prepare calls), so a step allocates nothing; only ids beyond the spec's pooling grow a
// slot, once. stage_synthetic has the backend make the batch in the slot instead, on the copy
// queue, from the generator block uploaded at its first call (with the kernels' workspace).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "parity/backend.h"
#include "parity/data.h"
#include "parity/spec.h"

namespace parity::engine {

// One input slot: the device buffers of a batch and the pinned host memory it is staged in.
struct InputSlot {
  Buffer dense, labels, ids, offsets;  // device: [B, F], [B], [ids_capacity], [T*B + 1]
  void* pinned = nullptr;              // host staging: dense | labels | offsets | ids
  std::size_t pinned_bytes = 0;
  std::int64_t ids_capacity = 0;
  bool has_labels = false;
  SparseInput sparse;  // the staged batch's CSR: device pointers into this slot
  // The same CSR in host memory, as long as the slot holds the batch (the batch's copy in pinned
  // staging memory, or the slot itself where the backend's memory is the host's); ids and offsets
  // null for a batch made on the device.
  SparseInput host_sparse;
  // The step's examples over every rank where this batch is a rank's slice (Model::stage); 0:
  // unknown.
  std::int64_t global_examples = 0;
};

class InputStager {
 public:
  static constexpr int kSlots = 2;

  // Slots for batches of up to max_batch examples of `spec` (which must outlive the stager).
  InputStager(Backend& backend, const ModelSpec& spec, std::int64_t max_batch);
  ~InputStager();
  InputStager(const InputStager&) = delete;
  InputStager& operator=(const InputStager&) = delete;

  // Checks the batch against the model and stages it in the next slot (throws when all kSlots
  // are staged already).
  void stage(const Batch& batch, std::int64_t global_examples = 0);
  // Stages examples [first, first + count) of a split of the synthetic data, made by the backend
  // on the device in the next slot (Backend::makes_synthetic_data must be true): the batch
  // stage(data.make(...)) would stage, with no host work and no copy.
  void stage_synthetic(const SyntheticData& data, Split split, std::int64_t first,
                       std::int64_t count);
  // Batches staged and not yet taken.
  int staged() const { return static_cast<int>(staged_count_); }
  // The slot the next stage() or stage_synthetic() fills.
  int next() const { return static_cast<int>(staged_total_ % kSlots); }
  // The oldest staged slot, the next one take() returns.
  int oldest() const { return static_cast<int>((staged_total_ - staged_count_) % kSlots); }
  // Takes the oldest staged slot off the queue.
  int take();
  const InputSlot& slot(int index) const { return slots_[index]; }
  // Allocates the pinned staging memory of every slot that has none yet (backends that copy in
  // the background only), so that no later stage() allocates it.
  void allocate_pinned();
  // Bytes of backend memory held by the slots (and stage_synthetic's generator and workspace).
  std::size_t allocated_bytes() const;

  // A taken slot in use by the step being enqueued: the compute queue waits for its copies
  // (use_input), and release_input is recorded once the step's work that reads it is enqueued
  // (release(); on unwinding too, so that later copies into the slot still wait).
  class InUse {
   public:
    InUse(InputStager& stager, int index);
    ~InUse();
    InUse(const InUse&) = delete;
    InUse& operator=(const InUse&) = delete;
    const InputSlot& slot() const { return stager_.slots_[index_]; }
    void release();

   private:
    InputStager& stager_;
    int index_;
    bool released_ = false;
  };

 private:
  void check_batch(const Batch& batch) const;
  // The slot's pinned staging memory exists and holds at least `bytes`; when (re)allocated, it
  // is sized for a full batch of max(ids_capacity, nids) ids.
  void ensure_pinned(InputSlot& slot, std::size_t bytes, std::int64_t nids);

  Backend& backend_;
  const ModelSpec& spec_;
  // stage_synthetic: the generator (kept, so that its block stays alive), its block in backend
  // memory (uploaded on first use, again when another generator comes) and the kernels'
  // workspace.
  std::optional<SyntheticData> generator_;
  Buffer generator_block_, synthetic_workspace_;
  std::int64_t max_batch_;
  InputSlot slots_[kSlots];
  std::int64_t staged_total_ = 0;  // batches ever staged (slot = staged_total_ % kSlots)
  std::int64_t staged_count_ = 0;  // staged, not yet taken
};

}  // namespace parity::engine
