// The step profile (docs/architecture.md, "The step profile"): a backend timing mark at the start
// of every section of a training step (an op category, and the op within it), summed per
// category and per op over the profiled steps.
//
// Why it is built this way: the marks of step k are read only once step k+1 is enqueued, so the
// host waits for work the device has (nearly) finished instead of draining it after every step.
// That needs two sets of marks, one per parity of the step: step k+1 records into the other set
// while step k's are read. A set holds kMarksPerStep marks; a deeper model's extra sections fold
// into the one before them.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "parity/backend.h"

namespace parity::engine {

class StepProfiler {
 public:
  explicit StepProfiler(Backend& backend) : backend_(backend) {}
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // On: every step records marks from its next section on. Off: the pending steps are read first.
  void set_enabled(bool on);
  // Marks the start of a section of the step being enqueued: category ("mlp") and, where the
  // category has several ops, the op ("top.0 forward"). Free while off or paused.
  void section(const char* category, std::string_view op = {});
  // Marks the end of the step and reads the previous step's marks.
  void end_step();
  // Reads every pending step (waits for the device).
  void finish();
  // Whether sections mark now (on, and not paused).
  bool recording() const { return enabled_ && !paused_; }
  // Work for a step on another queue, beside the step's own (the batch the device makes while
  // the step before runs): its span in milliseconds, summed under name.
  void beside(const std::string& name, double ms) { beside_ms_[name] += ms; }

  // While one lives, sections mark nothing (a rehearsal, an evaluation: not part of the profile).
  class Pause {
   public:
    explicit Pause(StepProfiler& p) : p_(p), was_(std::exchange(p.paused_, true)) {}
    ~Pause() { p_.paused_ = was_; }
    Pause(const Pause&) = delete;
    Pause& operator=(const Pause&) = delete;

   private:
    StepProfiler& p_;
    bool was_;
  };

  // Milliseconds summed over the profiled steps, per category and per op ("category: op").
  const std::map<std::string, double>& category_ms() const { return category_ms_; }
  const std::map<std::string, double>& op_ms() const { return op_ms_; }
  // The host's milliseconds from each op's mark to the next, summed over the same steps: where
  // an op's device time is about its host time, the device waited for the host to enqueue it.
  const std::map<std::string, double>& host_op_ms() const { return host_op_ms_; }
  const std::map<std::string, double>& beside_ms() const { return beside_ms_; }
  std::int64_t steps() const { return steps_; }

 private:
  static constexpr int kMarksPerStep = 128;
  void read(int set);

  Backend& backend_;
  bool enabled_ = false;
  bool paused_ = false;
  int set_ = 0;  // the mark set of the step being enqueued (marks set_ * kMarksPerStep + i)
  std::vector<std::pair<std::string, std::string>> marks_[2];  // (category, op) at each mark
  bool pending_[2] = {false, false};                           // a finished step's marks, unread
  std::map<std::string, double> category_ms_, op_ms_, host_op_ms_, beside_ms_;
  std::chrono::steady_clock::time_point last_host_;  // the host time of the last mark
  std::int64_t steps_ = 0;
};

}  // namespace parity::engine
