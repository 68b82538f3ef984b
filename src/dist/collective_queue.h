// One worker thread that runs tasks (collectives) in the order they were queued, while the thread
// that queued them goes on: the dense gradients' all-reduce of one bucket runs while the backward
// computes the next layers. Its collectives go through a communicator of their own
// (Communicator::duplicate), ordered the same way on every rank since every rank queues them in
// the same order.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace parity {

class CollectiveQueue {
 public:
  // on_start runs on the worker before its first task (a GPU backend makes its device current).
  explicit CollectiveQueue(std::function<void()> on_start = {});
  // Waits for the queued tasks, then joins the worker.
  ~CollectiveQueue();
  CollectiveQueue(const CollectiveQueue&) = delete;
  CollectiveQueue& operator=(const CollectiveQueue&) = delete;

  // Queues `task`; returns its ticket (1, 2, ...).
  std::int64_t submit(std::function<void()> task);
  // Waits until every task queued so far has finished. Rethrows the first exception a task threw
  // (once; the tasks queued after a failed one are not run).
  void wait_all();
  // Tasks queued and not yet finished.
  std::int64_t pending() const;

 private:
  void work(std::function<void()> on_start);

  mutable std::mutex mu_;
  std::condition_variable wake_, done_;
  std::deque<std::function<void()>> tasks_;
  std::int64_t queued_ = 0, finished_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace parity
