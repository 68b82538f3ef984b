// Feeds the input to parse_model_spec as the text of a model YAML file, then asks the spec it
// accepted for its derived sizes (validation bounds the fields so that these do not overflow).
// A finding: a crash, a sanitizer report, a hang, a leak, or an exception other than
// parity::Error escaping.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "parity/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  parity::fuzz::run_reader([&] {
    const parity::ModelSpec m = parity::parse_model_spec(parity::fuzz::as_text(data, size), "fuzz");
    parity::fuzz::check(m.num_tables() >= 1 && !m.bottom_mlp.empty() && !m.top_mlp.empty(),
                        "a model has a table and both MLPs");
    volatile std::int64_t sink = m.embedding_rows() + m.embedding_parameters() +
                                 m.lookups_per_example() + m.embedding_output_dim() +
                                 m.interaction_input_dim() + m.interaction_output_dim() +
                                 m.dense_parameters();
    (void)sink;
  });
  return 0;
}
