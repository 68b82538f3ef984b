// How long a host-placed table's cache takes to choose its rows at a refresh (engine::
// choose_cache_rows): a table of ROWS rows, KEEP of them cached (rows 0 to KEEP - 1 to start),
// counts from LOOKUPS Zipf(ALPHA) draws with the ranks scattered over the rows; the median of
// RUNS runs.
//   build/cache_choice_bench [rows] [keep] [lookups] [alpha] [runs]
// Default: prod-video-recs' video_id as planned for one H200 (150M rows, 108.6M cached) after four
// steps of 131,072 lookups.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "engine/host_tables.h"

int main(int argc, char** argv) {
  const auto arg = [&](int i, double d) { return argc > i ? std::atof(argv[i]) : d; };
  const auto rows = static_cast<std::size_t>(arg(1, 150e6));
  const auto keep = static_cast<std::int64_t>(arg(2, 108.6e6));
  const auto lookups = static_cast<std::int64_t>(arg(3, 4 * 131072));
  const double alpha = arg(4, 1.1);
  const int runs = static_cast<int>(arg(5, 5));
  if (rows == 0 || keep < 0 || static_cast<std::size_t>(keep) > rows || alpha <= 1 || runs < 1) {
    fmt::print(stderr,
               "cache_choice_bench: expected rows > 0, 0 <= keep <= rows, alpha > 1, "
               "runs >= 1\n");
    return 2;
  }
  std::vector<std::uint32_t> counts(rows, 0), slot(rows, parity::TableLayout::kNotCached);
  std::mt19937_64 g(1);
  std::uniform_real_distribution<double> u01(0, 1);
  const double tail = std::pow(static_cast<double>(rows), 1 - alpha);
  for (std::int64_t i = 0; i < lookups; ++i) {  // rank by the inverse of the continuous CDF
    const double r = std::pow(1 - u01(g) * (1 - tail), 1 / (1 - alpha));
    const auto rank = std::min(rows - 1, static_cast<std::size_t>(r) - 1);
    ++counts[rank * 2654435761ull % rows];  // ranks scattered over the rows
  }
  for (std::int64_t i = 0; i < keep; ++i)
    slot[static_cast<std::size_t>(i)] = static_cast<std::uint32_t>(i);
  std::vector<double> s;
  std::size_t chosen = 0;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<std::uint8_t> c = parity::engine::choose_cache_rows(counts, slot, keep);
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    chosen = static_cast<std::size_t>(std::count(c.begin(), c.end(), std::uint8_t{1}));
  }
  std::sort(s.begin(), s.end());
  fmt::print(
      "{} rows, {} kept, {} Zipf({}) lookups: {} chosen; median {:.3f} s, fastest {:.3f} s "
      "over {} runs\n",
      rows, keep, lookups, alpha, chosen, s[s.size() / 2], s.front(), runs);
  return 0;
}
