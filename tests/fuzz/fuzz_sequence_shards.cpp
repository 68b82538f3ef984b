// Feeds the input to SequenceShardReader as a sequence shard dataset of the HSTU model
// tests/fuzz/micro-hstu.yaml, in the archive form of fuzz_shards.cpp (fuzz_util.h's
// write_archive). Both splits are opened and read through in batches that cross file ends, then
// again after seeks with and without wrapping.
// A finding: a crash, a sanitizer report, a hang, a leak, an exception other than parity::Error
// escaping, or a batch that breaks what the reader promises (its arrays of the model's shape, the
// offsets consistent, every history of 1 to max_len events in time order, every id below its
// table's rows, every label 0 or 1).
#include <stdlib.h>

#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "parity/data.h"
#include "parity/spec.h"

namespace {

const parity::ModelSpec& model() {
  static const parity::ModelSpec m =
      parity::load_model_spec(PARITY_SOURCE_DIR "/tests/fuzz/micro-hstu.yaml");
  return m;
}

void check_batch(const parity::Batch& b, std::int64_t max_size) {
  using parity::fuzz::check;
  const auto& m = model();
  const auto& seq = m.hstu->sequence;
  const auto n = static_cast<std::size_t>(b.size);
  const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  check(b.size > 0 && b.size <= max_size, "a batch holds 1 to batch_size examples");
  check(b.targets == seq.targets && b.features == static_cast<int>(seq.features.size()) &&
            b.num_tables == m.num_tables() && b.tasks == static_cast<int>(m.hstu->tasks.size()),
        "a batch has the model's shape");
  const std::size_t scores = n * static_cast<std::size_t>(b.targets * b.tasks);
  check(b.history_offsets.size() == n + 1 && b.history_offsets[0] == 0 &&
            b.event_times.size() == static_cast<std::size_t>(b.events()) &&
            b.event_ids.size() == b.event_times.size() * static_cast<std::size_t>(b.features) &&
            b.target_ids.size() == n * static_cast<std::size_t>(b.targets) &&
            b.target_times.size() == b.target_ids.size() && b.labels.size() == scores &&
            (b.teacher_prob.empty() || b.teacher_prob.size() == scores) &&
            b.unordered_prob.size() == b.teacher_prob.size(),
        "every array holds its entries per example, event and target");
  for (std::size_t e = 0; e < n; ++e) {
    const std::int64_t first = b.history_offsets[e], last = b.history_offsets[e + 1];
    check(last - first >= 1 && last - first <= seq.max_len, "a history holds 1 to max_len events");
    for (std::int64_t j = first + 1; j < last; ++j)
      check(b.event_times[at(j)] >= b.event_times[at(j - 1)], "a history's times do not go back");
  }
  for (int f = 0; f < b.features; ++f)
    for (std::int64_t j = 0; j < b.events(); ++j) {
      const std::int64_t id = b.event_ids[at(f * b.events() + j)];
      check(id >= 0 && id < seq.features[at(f)].rows, "every event id is a row of its table");
    }
  for (const std::int64_t id : b.target_ids)
    check(id >= 0 && id < seq.features.front().rows, "every target is an item");
  for (const float l : b.labels) check(l == 0.0f || l == 1.0f, "every label is 0 or 1");
  check(b.offsets.size() == static_cast<std::size_t>(b.num_tables) * n + 1 && b.offsets[0] == 0 &&
            b.offsets.back() == static_cast<std::int64_t>(b.ids.size()),
        "the context offsets span the ids");
  for (std::size_t i = 0; i + 1 < b.offsets.size(); ++i)
    check(b.offsets[i] <= b.offsets[i + 1], "the context offsets do not decrease");
  for (int t = 0; t < b.num_tables; ++t)
    for (auto k = b.offsets[at(t) * n]; k < b.offsets[at(t + 1) * n]; ++k)
      check(b.ids[at(k)] >= 0 && b.ids[at(k)] < m.tables[at(t)].rows,
            "every context id is a row of its table");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ::setenv("OMP_NUM_THREADS", "1", 0);  // one core per fuzzing process, as libFuzzer's -jobs expect
  (void)model();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  parity::fuzz::clear_temp_dir();
  parity::fuzz::write_archive(parity::fuzz::as_text(data, size));
  for (const parity::Split split : {parity::Split::train, parity::Split::eval})
    parity::fuzz::read_dataset_split<parity::SequenceShardReader>(model(), split, check_batch);
  return 0;
}
