// The worker thread of collective_queue.h.
#include "dist/collective_queue.h"

namespace parity {

CollectiveQueue::CollectiveQueue(std::function<void()> on_start)
    : worker_([this, f = std::move(on_start)]() mutable { work(std::move(f)); }) {}

CollectiveQueue::~CollectiveQueue() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return finished_ == queued_; });
    stop_ = true;
  }
  wake_.notify_all();
  worker_.join();
}

std::int64_t CollectiveQueue::submit(std::function<void()> task) {
  std::int64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    ticket = ++queued_;
  }
  wake_.notify_one();
  return ticket;
}

void CollectiveQueue::wait_all() {
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return finished_ == queued_; });
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

std::int64_t CollectiveQueue::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_ - finished_;
}

void CollectiveQueue::work(std::function<void()> on_start) {
  std::exception_ptr start_error;
  if (on_start) {
    try {
      on_start();
    } catch (...) {
      start_error = std::current_exception();
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (start_error) error_ = start_error;
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopped
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    // After a failure the rest is skipped: a collective after a failed one may wait forever.
    const bool run = error_ == nullptr;
    lock.unlock();
    std::exception_ptr failed;
    if (run) {
      try {
        task();
      } catch (...) {
        failed = std::current_exception();
      }
    }
    lock.lock();
    if (failed && !error_) error_ = failed;
    ++finished_;
    done_.notify_all();
  }
}

}  // namespace parity
