// The dense gradients' all-reduce in buckets while the backward goes on, as PyTorch DDP does, for
// both models (Model and HstuModel): the gradients become final as a tail of one flat buffer, and
// each bucket of at least `bucket_bytes` goes to a worker thread (CollectiveQueue) with a fence
// of the backend's work, summed there on a communicator of its own (Communicator::duplicate) so
// that it never interleaves with the step's other collectives. Where the engine gives no such
// communicator, everything is summed at once at the end of the backward.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "dist/backend_collectives.h"
#include "dist/collective_queue.h"
#include "parity/backend.h"
#include "parity/dist.h"

namespace parity {

class DenseGradientBuckets {
 public:
  // grads: backend memory [count], summed over comm's ranks. Every rank builds it at the same
  // point (it asks comm for a duplicate).
  DenseGradientBuckets(Communicator& comm, Backend& backend, float* grads, std::int64_t count,
                       std::size_t bucket_bytes);
  ~DenseGradientBuckets();  // the worker drained first: its tasks read the gradients
  DenseGradientBuckets(const DenseGradientBuckets&) = delete;
  DenseGradientBuckets& operator=(const DenseGradientBuckets&) = delete;

  // Whether buckets are summed while the backward goes on (a worker and a duplicate exist).
  bool overlapped() const { return queue_ != nullptr; }
  // Whether the buckets in flight may run beside the step's own collectives; where not (NCCL:
  // two communicators' kernels must not wait on each other on the GPU), wait() before those.
  bool beside_other_collectives() const { return comm_.runs_beside_duplicate(); }

  // A backward begins: no gradient is final.
  void begin() { unsent_ = count_; }
  // Gradients [from, count) are final: those not yet sent go as one bucket once they reach the
  // bucket size.
  void final_from(std::int64_t from);
  // Every gradient is final: the rest sent (with a worker), or every gradient summed now.
  void finish();
  // Waits for the buckets in flight (nothing without a worker).
  void wait();

 private:
  // Queues the sum of gradients [from, unsent_) after the backend's work so far.
  void send(std::int64_t from);

  Communicator& comm_;
  Backend& backend_;
  float* grads_;
  std::int64_t count_, bucket_floats_, unsent_ = 0;
  BackendCollectives collectives_;  // comm_ over the backend's memory: finish() without a worker
  std::unique_ptr<Communicator> duplicate_;
  std::unique_ptr<BackendCollectives> duplicate_collectives_;
  std::unique_ptr<CollectiveQueue> queue_;  // declared last: stopped first
};

}  // namespace parity
