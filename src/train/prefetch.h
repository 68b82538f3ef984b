// A one-batch-ahead loader: a background thread makes batch k+1 while the caller
// trains on batch k. Batches come out in the order the producer makes them, so
// training stays deterministic. Exceptions in the producer reach the caller.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "parity/data.h"

namespace parity {

class Prefetcher {
 public:
  // produce(batch) fills batch and returns false when the data is exhausted.
  explicit Prefetcher(std::function<bool(Batch&)> produce);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;
  // Swaps the next batch into out; false at the end of the data.
  bool next(Batch& out);

 private:
  void run();
  std::function<bool(Batch&)> produce_;
  std::mutex mu_;
  std::condition_variable cv_;
  Batch slot_;
  bool full_ = false, done_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace parity
