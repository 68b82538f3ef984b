// A one-batch-ahead loader: a background thread reads batch k+1 from a BatchSource while the
// caller trains on batch k. Batches come out in the order the source gives them, so training
// stays deterministic. Exceptions in the source reach the caller.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>

#include "parity/data.h"

namespace parity {

class Prefetcher {
 public:
  // Reads batches of batch_size examples from source until it ends or `limit` batches were read
  // (limit < 0: no limit). Only the loader thread touches the source until the Prefetcher is gone.
  // With ranks > 1 and a source that reads slices, each batch is this rank's slice of the next
  // batch_size examples (BatchSource::next_slice); otherwise whole batches.
  Prefetcher(BatchSource& source, std::int64_t batch_size, std::int64_t limit, int rank = 0,
             int ranks = 1);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;
  // Swaps the next batch into out; false at the end of the data. whole: the examples of the
  // batch it is a slice of (out.size where whole batches are read).
  bool next(Batch& out, std::int64_t* whole = nullptr);
  // Whether the batches are this rank's slices.
  bool slices() const { return slices_; }
  // The source's epoch() right after it gave the batch last returned by next().
  std::int64_t epoch() const { return epoch_; }

 private:
  void run();
  BatchSource& source_;
  const std::int64_t batch_size_, limit_;
  const int rank_, ranks_;
  const bool slices_;
  std::mutex mu_;
  std::condition_variable cv_;
  Batch slot_;
  std::int64_t slot_epoch_ = 0, epoch_ = 0, slot_whole_ = 0;
  bool full_ = false, done_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace parity
