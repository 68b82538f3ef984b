// Feeds the input to CriteoReader as a Criteo TSV file, given twice (the reader moving from one
// file to the next), of a model of Criteo's shape whose tables have 1 to 2^62 rows. It is read
// through in stop mode (the first bad line ends it with an InputError), in skip mode (bad lines
// counted, the first few described), and through the batch source after a seek. A finding: a
// crash, a sanitizer report, a hang, a leak, an exception other than parity::Error escaping, or
// a batch that breaks what the reader promises (one id per table and example, each a row of its
// table).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fuzz_util.h"
#include "parity/data.h"
#include "parity/spec.h"

namespace {

const parity::ModelSpec& model() {
  static const parity::ModelSpec m = [] {
    parity::ModelSpec s;
    s.name = "criteo-fuzz";
    s.dense_features = 13;
    for (int t = 0; t < 26; ++t) {
      parity::TableSpec table;
      table.name = "c" + std::to_string(t);
      // Small tables (ids collide), prime-sized ones and the largest allowed.
      table.rows = t == 0 ? 1 : t == 25 ? std::int64_t{1} << 62 : 97 * t + 1;
      table.dim = 2;
      s.tables.push_back(table);
    }
    return s;
  }();
  return m;
}

void check_batch(const parity::Batch& b, std::int64_t max_size) {
  using parity::fuzz::check;
  const auto n = static_cast<std::size_t>(b.size);
  check(b.size > 0 && b.size <= max_size, "a batch holds 1 to batch_size examples");
  check(b.num_dense == 13 && b.num_tables == 26, "a batch has Criteo's shape");
  check(b.labels.size() == n && b.dense.size() == 13 * n && b.ids.size() == 26 * n,
        "one label, 13 dense features and 26 ids per example");
  check(b.offsets.size() == 26 * n + 1 && b.offsets.back() == static_cast<std::int64_t>(26 * n),
        "one id per bag");
  for (std::size_t t = 0; t < 26; ++t)
    for (std::size_t e = 0; e < n; ++e) {
      const std::int64_t id = b.ids[t * n + e];
      check(id >= 0 && id < model().tables[t].rows, "every id is a row of its table");
    }
  for (std::size_t e = 0; e < n; ++e)
    check(b.labels[e] == 0.0f || b.labels[e] == 1.0f, "labels are 0 or 1");
}

void read_through(const std::filesystem::path& file, parity::CriteoOptions options,
                  std::int64_t batch) {
  parity::fuzz::run_reader([&] {
    parity::CriteoReader reader({file, file}, model(), options);
    parity::Batch b;
    while (reader.next(batch, b)) check_batch(b, batch);
    parity::fuzz::check(
        static_cast<std::int64_t>(reader.warnings().size()) <= options.max_reported &&
            reader.bad_lines() <= reader.lines_read(),
        "at most max_reported bad lines are described");
  });
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)model();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto file = parity::fuzz::write_file("day_0.tsv", parity::fuzz::as_text(data, size));
  read_through(file, {parity::OnBadLine::stop, 10}, 4);
  read_through(file, {parity::OnBadLine::skip, 2}, 3);
  parity::fuzz::run_reader([&] {
    auto source = parity::make_criteo_source({file}, model(), {parity::OnBadLine::skip, 1});
    source->seek(2);
    parity::Batch b;
    for (int i = 0; i < 2 && source->next(3, b); ++i) check_batch(b, 3);
    (void)source->closing_warning();
  });
  return 0;
}
