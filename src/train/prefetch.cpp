#include "prefetch.h"

#include <utility>

namespace parity {

Prefetcher::Prefetcher(std::function<bool(Batch&)> produce)
    : produce_(std::move(produce)), thread_([this] { run(); }) {}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Prefetcher::run() {
  Batch work;
  for (;;) {
    bool more = false;
    std::exception_ptr err;
    try {
      more = produce_(work);
    } catch (...) {
      err = std::current_exception();
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !full_ || stop_; });
    if (stop_) return;
    if (err || !more) {
      error_ = err;
      done_ = true;
      cv_.notify_all();
      return;
    }
    std::swap(slot_, work);
    full_ = true;
    cv_.notify_all();
  }
}

bool Prefetcher::next(Batch& out) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return full_ || done_; });
  if (full_) {
    std::swap(out, slot_);
    full_ = false;
    cv_.notify_all();
    return true;
  }
  if (error_) std::rethrow_exception(error_);
  return false;
}

}  // namespace parity
