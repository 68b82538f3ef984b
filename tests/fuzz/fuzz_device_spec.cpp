// Feeds the input to parse_device_spec as the text of a device YAML file, then asks the device
// it accepted for its peak of every dense math precision. A finding: a crash, a sanitizer report,
// a hang, a leak, or an exception other than parity::Error escaping.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "parity/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  parity::fuzz::run_reader([&] {
    const parity::DeviceSpec d =
        parity::parse_device_spec(parity::fuzz::as_text(data, size), "fuzz");
    for (const auto& m : parity::kDenseMathNames)
      if (m.value != parity::DenseMath::tf32 || d.has_tf32()) {
        volatile double sink = d.dense_flops(m.value);
        (void)sink;
      }
  });
  return 0;
}
