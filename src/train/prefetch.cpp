#include "prefetch.h"

#include <utility>

namespace parity {

Prefetcher::Prefetcher(BatchSource& source, std::int64_t batch_size, std::int64_t limit, int rank,
                       int ranks)
    : source_(source),
      batch_size_(batch_size),
      limit_(limit),
      rank_(rank),
      ranks_(ranks),
      slices_(ranks > 1 && source.reads_slices()),
      thread_([this] { run(); }) {}

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
  for (std::int64_t read = 0;; ++read) {
    bool more = false;
    std::int64_t epoch = 0, whole = 0;
    std::exception_ptr err;
    try {
      if (limit_ < 0 || read < limit_) {
        if (slices_) {
          whole = source_.next_slice(batch_size_, rank_, ranks_, work);
          more = whole > 0;
        } else {
          more = source_.next(batch_size_, work);
          whole = work.size;
        }
      }
      epoch = source_.epoch();
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
    slot_epoch_ = epoch;
    slot_whole_ = whole;
    full_ = true;
    cv_.notify_all();
  }
}

bool Prefetcher::next(Batch& out, std::int64_t* whole) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return full_ || done_; });
  if (full_) {
    std::swap(out, slot_);
    epoch_ = slot_epoch_;
    if (whole != nullptr) *whole = slot_whole_;
    full_ = false;
    cv_.notify_all();
    return true;
  }
  if (error_) std::rethrow_exception(error_);
  return false;
}

}  // namespace parity
