// Feeds the input to ShardReader as a shard dataset of the model tests/fuzz/micro.yaml. The input
// is a small archive: meta.json's text, then for each part file a line "@@file NAME" and the
// file's bytes, up to the next such line:
//   {"format": "parity-shards-1", ...}\n@@file train-00000.bin\nPRTYSHD1...
// The files are written to a directory of their own; both splits are opened and read through,
// in batches that cross file ends, then read again after seeks with and without wrapping.
// A finding: a crash, a sanitizer report, a hang, a leak, an exception other than parity::Error
// escaping, or a batch that breaks what the reader promises (the CSR consistent, every id below
// its table's rows).
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "parity/data.h"
#include "parity/spec.h"

namespace {

const parity::ModelSpec& model() {
  static const parity::ModelSpec m =
      parity::load_model_spec(PARITY_SOURCE_DIR "/tests/fuzz/micro.yaml");
  return m;
}

void check_batch(const parity::Batch& b, std::int64_t max_size) {
  using parity::fuzz::check;
  const auto& m = model();
  const auto n = static_cast<std::size_t>(b.size);
  check(b.size > 0 && b.size <= max_size, "a batch holds 1 to batch_size examples");
  check(b.num_dense == m.dense_features && b.num_tables == m.num_tables(),
        "a batch has the model's shape");
  check(b.labels.size() == n && b.dense.size() == n * static_cast<std::size_t>(b.num_dense) &&
            (b.teacher_prob.empty() || b.teacher_prob.size() == n),
        "labels, dense features and teacher hold one entry per example");
  check(b.offsets.size() == static_cast<std::size_t>(b.num_tables) * n + 1 && b.offsets[0] == 0 &&
            b.offsets.back() == static_cast<std::int64_t>(b.ids.size()),
        "the offsets span the ids");
  for (std::size_t i = 0; i + 1 < b.offsets.size(); ++i)
    check(b.offsets[i] <= b.offsets[i + 1], "the offsets do not decrease");
  for (int t = 0; t < b.num_tables; ++t) {
    const std::int64_t rows = m.tables[static_cast<std::size_t>(t)].rows;
    for (auto k = b.offsets[static_cast<std::size_t>(t) * n];
         k < b.offsets[static_cast<std::size_t>(t + 1) * n]; ++k)
      check(b.ids[static_cast<std::size_t>(k)] >= 0 && b.ids[static_cast<std::size_t>(k)] < rows,
            "every id is a row of its table");
  }
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
    parity::fuzz::read_dataset_split<parity::ShardReader>(model(), split, check_batch);
  return 0;
}
