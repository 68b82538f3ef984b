// Feeds the input to the checkpoint reader as a safetensors file, the way `parity train --resume`
// reads one: read_safetensors_header, the run record's resume check on its metadata
// (resumable_step, for the run that wrote the seeds), then load_safetensors into the tensors of
// the model tests/fuzz/micro.yaml on the cpu backend, with and without extra tensors allowed.
// A finding: a crash, a sanitizer report, a hang, a leak, an exception other than parity::Error
// escaping, or an accepted header that breaks what the reader promises (every tensor's byte
// range within the file's data section).
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "fuzz_util.h"
#include "parity/backend.h"
#include "parity/checkpoint.h"
#include "parity/engine.h"
#include "parity/spec.h"
#include "train/run_record.h"

namespace {

struct Target {
  parity::ModelSpec spec = parity::load_model_spec(PARITY_SOURCE_DIR "/tests/fuzz/micro.yaml");
  std::unique_ptr<parity::Backend> backend = parity::make_backend("cpu");
  parity::Model model{spec, *backend, 1, 1};
  // The run tests/fuzz/make-seeds.sh trains: `parity train --model micro.yaml --batch 16`.
  parity::train_detail::RunRecord run =
      parity::train_detail::run_record(spec, 16, 1, parity::DenseMath::fp32, "synthetic");
};

Target& target() {
  static Target t;
  return t;
}

void check_header(const parity::SafetensorsHeader& h, std::uint64_t file_size) {
  using parity::fuzz::check;
  check(h.data_offset >= 8 && h.data_offset <= file_size, "the data section starts in the file");
  for (const auto& [name, e] : h.tensors) {
    check(e.begin <= e.end && e.end <= file_size - h.data_offset,
          "a tensor's byte range lies in the data section");
    for (const std::int64_t d : e.shape) check(d >= 0, "dimensions are not negative");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ::setenv("OMP_NUM_THREADS", "1", 0);  // one core per fuzzing process, as libFuzzer's -jobs expect
  (void)target();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Target& t = target();
  const auto file =
      parity::fuzz::write_file("step-2.safetensors", parity::fuzz::as_text(data, size));
  parity::fuzz::run_reader([&] { check_header(parity::read_safetensors_header(file), size); });
  parity::fuzz::run_reader([&] { (void)parity::train_detail::resumable_step(file, t.run); });
  parity::fuzz::run_reader(
      [&] { (void)parity::load_safetensors(file, t.model.tensors(), *t.backend); });
  parity::fuzz::run_reader(
      [&] { (void)parity::load_safetensors(file, t.model.tensors(), *t.backend, true); });
  return 0;
}
