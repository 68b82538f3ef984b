#include "engine/step_profiler.h"

namespace parity::engine {

void StepProfiler::set_enabled(bool on) {
  if (!on) finish();
  enabled_ = on;
}

void StepProfiler::section(const char* category, std::string_view op) {
  if (!enabled_ || paused_) return;
  auto& marks = marks_[set_];
  // The last mark of a set is kept for the end of the step (category "").
  if (marks.size() >= kMarksPerStep - 1 && category[0] != '\0') return;
  backend_.timing_mark(set_ * kMarksPerStep + static_cast<int>(marks.size()));
  const auto now = std::chrono::steady_clock::now();
  if (!marks.empty()) {
    const auto& [last_category, last_op] = marks.back();
    host_op_ms_[last_category + ": " + (last_op.empty() ? last_category : last_op)] +=
        std::chrono::duration<double, std::milli>(now - last_host_).count();
  }
  last_host_ = now;
  marks.emplace_back(category, std::string(op));
}

void StepProfiler::end_step() {
  if (!enabled_) return;
  section("");  // the end mark
  pending_[set_] = true;
  set_ ^= 1;
  // The previous step's marks, now that this step is enqueued (the device stays busy).
  if (pending_[set_]) read(set_);
  marks_[set_].clear();
}

void StepProfiler::read(int set) {
  auto& marks = marks_[set];
  for (std::size_t i = 0; i + 1 < marks.size(); ++i) {
    const int mark = set * kMarksPerStep + static_cast<int>(i);
    const double ms = backend_.timing_elapsed_ms(mark, mark + 1);
    const auto& [category, op] = marks[i];
    category_ms_[category] += ms;
    op_ms_[category + ": " + (op.empty() ? category : op)] += ms;
  }
  pending_[set] = false;
  ++steps_;
}

void StepProfiler::finish() {
  for (int k = 0; k < 2; ++k) {
    const int set = set_ ^ 1 ^ k;  // the older pending step first
    if (pending_[set]) read(set);
    marks_[set].clear();
  }
}

}  // namespace parity::engine
