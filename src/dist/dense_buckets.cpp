// The dense gradients' bucketed all-reduce (dense_buckets.h).
#include "dist/dense_buckets.h"

#include <algorithm>

namespace parity {

DenseGradientBuckets::DenseGradientBuckets(Communicator& comm, Backend& backend, float* grads,
                                           std::int64_t count, std::size_t bucket_bytes)
    : comm_(comm),
      backend_(backend),
      grads_(grads),
      count_(count),
      bucket_floats_(
          std::max<std::int64_t>(1, static_cast<std::int64_t>(bucket_bytes / sizeof(float)))),
      collectives_(comm, backend),
      duplicate_(comm.duplicate()) {
  if (!duplicate_) return;
  duplicate_collectives_ = std::make_unique<BackendCollectives>(*duplicate_, backend);
  queue_ = std::make_unique<CollectiveQueue>([&b = backend] { b.use_from_this_thread(); });
}

DenseGradientBuckets::~DenseGradientBuckets() {
  queue_.reset();
}

void DenseGradientBuckets::final_from(std::int64_t from) {
  if (queue_ && unsent_ - from >= bucket_floats_) send(from);
}

void DenseGradientBuckets::send(std::int64_t from) {
  // Queued with a fence of the backend's work so far: the worker sums what the backward made.
  queue_->submit([this, done = backend_.fence(), from, to = unsent_] {
    if (done) done();
    duplicate_collectives_->all_reduce_sum(grads_ + from, static_cast<std::size_t>(to - from),
                                           /*ready=*/true);
  });
  unsent_ = from;
}

void DenseGradientBuckets::finish() {
  if (!queue_) {
    collectives_.all_reduce_sum(grads_, static_cast<std::size_t>(count_));
    return;
  }
  if (unsent_ > 0) send(0);
}

void DenseGradientBuckets::wait() {
  if (queue_) queue_->wait_all();
}

}  // namespace parity
