#include "backend/gpu/input_queue.h"

#include "backend/checks.h"

namespace parity::gpu {

using backend_checks::fail;

InputQueue::Slot& InputQueue::slot(int i) {
  if (i < 0 || i >= kMaxSlots) fail("input pipeline", "slot {} out of range [0, {})", i, kMaxSlots);
  while (slots_.size() <= static_cast<std::size_t>(i)) slots_.push_back(std::make_unique<Slot>());
  return *slots_[static_cast<std::size_t>(i)];
}

void InputQueue::begin(int i) {
  Slot& in = slot(i);
  if (in.copied_recorded) in.copied.synchronize();  // the pinned sources are free again
  if (in.consumed_recorded) in.consumed.wait_on(stream());
  in.made_recorded = false;
  current_ = i;
}

void InputQueue::copy(void* dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  check(memcpy_async(dst, host_src, bytes, stream()), "input_copy");
}

void InputQueue::end(int i) {
  Slot& in = slot(i);
  in.copied.record(stream());
  in.copied_recorded = true;
  current_ = -1;
}

void InputQueue::make_begin() {
  if (current_ < 0) fail("input pipeline", "a batch made on the device outside begin_input");
  slot(current_).made_start.record(stream());
}

void InputQueue::make_end() {
  if (current_ < 0) fail("input pipeline", "a batch made on the device outside begin_input");
  Slot& in = slot(current_);
  in.made_stop.record(stream());
  in.made_recorded = true;
}

double InputQueue::made_ms(int i) {
  Slot& in = slot(i);
  if (!in.made_recorded) return -1.0;
  return Event::elapsed_ms(in.made_start, in.made_stop);
}

void InputQueue::use(int i, Stream_t compute) {
  Slot& in = slot(i);
  if (in.copied_recorded) in.copied.wait_on(compute);
}

void InputQueue::release(int i, Stream_t compute) {
  Slot& in = slot(i);
  in.consumed.record(compute);
  in.consumed_recorded = true;
}

void TimingMarks::record(int i, Stream_t s) {
  if (i < 0 || i > kMaxMarks)
    fail("timing_mark", "mark index {} out of range [0, {}]", i, kMaxMarks);
  while (marks_.size() <= static_cast<std::size_t>(i)) {
    marks_.push_back(std::make_unique<Event>());
    recorded_.push_back(false);
  }
  marks_[static_cast<std::size_t>(i)]->record(s);
  recorded_[static_cast<std::size_t>(i)] = true;
}

double TimingMarks::elapsed_ms(int i, int j) const {
  auto recorded = [&](int k) {
    return k >= 0 && static_cast<std::size_t>(k) < marks_.size() &&
           recorded_[static_cast<std::size_t>(k)];
  };
  if (!recorded(i) || !recorded(j)) {
    fail("timing_elapsed_ms", "mark {} was never recorded", recorded(i) ? j : i);
  }
  return Event::elapsed_ms(*marks_[static_cast<std::size_t>(i)],
                           *marks_[static_cast<std::size_t>(j)]);
}

}  // namespace parity::gpu
