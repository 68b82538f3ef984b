// Feeds the input to plan_from_json as the text of a plan file. A plan it accepts is written
// back with plan_to_json, which must read again as the same plan (what `parity plan --out`
// writes, `parity train --plan` reads). A finding: a crash, a sanitizer report, a hang, a leak, an
// exception other than parity::Error escaping, or a plan that does not survive the round trip.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "parity/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(parity::fuzz::as_text(data, size));
  parity::fuzz::run_reader([&] {
    const parity::Plan plan = parity::plan_from_json(text, "fuzz");
    const std::string once = parity::plan_to_json(plan);
    std::string twice;
    try {
      twice = parity::plan_to_json(parity::plan_from_json(once, "fuzz (written back)"));
    } catch (const parity::Error& e) {
      std::fprintf(stderr, "fuzz: %s\n", e.what());
      parity::fuzz::check(false, "an accepted plan, written back, reads again");
    }
    parity::fuzz::check(once == twice, "an accepted plan, written back, reads as the same plan");
  });
  return 0;
}
