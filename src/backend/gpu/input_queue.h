// The GPU backend's side of the input pipeline (Backend::begin_input ... release_input in
// include/parity/backend.h): copies into an input slot run on a stream of their own, ordered
// against the compute stream by two events per slot, "its copies are done" and "the compute work
// that reads it is done". Host-only.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "backend/gpu/port.h"
#include "backend/gpu/runtime.h"

namespace parity::gpu {

class InputQueue {
 public:
  static constexpr int kMaxSlots = 64;

  Stream_t stream() const { return stream_.get(); }
  // The host waits until the slot's last copies have read their host sources; copies enqueued
  // next wait until the compute work that last read the slot is done.
  void begin(int slot);
  void copy(void* dst, const void* host_src, std::size_t bytes);
  // The slot's copies are complete once the queue reaches this point.
  void end(int slot);
  // Between begin and end: timing events around the work that makes the slot's batch on the queue
  // (make_begin, make_end), and the milliseconds between them (waits for make_end; negative where
  // the slot's batch since its last begin was not made so).
  void make_begin();
  void make_end();
  double made_ms(int slot);
  // Work enqueued on `compute` next waits for the slot's copies.
  void use(int slot, Stream_t compute);
  // The work enqueued on `compute` so far is all that reads the slot.
  void release(int slot, Stream_t compute);

 private:
  // Recorded flags: an event never recorded must not be waited on.
  struct Slot {
    Event copied, consumed;
    bool copied_recorded = false, consumed_recorded = false;
    Event made_start, made_stop;
    bool made_recorded = false;
  };
  Slot& slot(int i);
  Stream stream_;
  std::vector<std::unique_ptr<Slot>> slots_;
  int current_ = -1;  // the slot between begin and end
};

// Device timing marks on a stream (Backend::timing_mark / timing_elapsed_ms).
class TimingMarks {
 public:
  static constexpr int kMaxMarks = 4096;
  void record(int i, Stream_t s);
  // Milliseconds from mark i to mark j (waits for j).
  double elapsed_ms(int i, int j) const;

 private:
  std::vector<std::unique_ptr<Event>> marks_;
  std::vector<bool> recorded_;
};

}  // namespace parity::gpu
