// Host placement for one recipe and layout: the coldest tables of over-full devices move to
// host memory, and each device's spare HBM caches its host tables' hottest rows.
#include <algorithm>
#include <cmath>

#include "search.h"

namespace parity::detail {

Fit fit_memory(Plan& p, const ModelSpec& m, const DeviceSpec& dev, const Calibration& cal) {
  Fit out;
  const int W = p.gpus;
  const double budget = dev.hbm_bytes.value;
  const int T = m.num_tables();
  for (int round = 0; round <= T; ++round) {
    const Prediction pr = evaluate_plan(p, m, dev, cal);
    std::vector<double> over(static_cast<std::size_t>(W), 0);
    bool any = false;
    for (int d = 0; d < W; ++d) {
      over[static_cast<std::size_t>(d)] =
          pr.device_memory_bytes[static_cast<std::size_t>(d)] - budget;
      any |= over[static_cast<std::size_t>(d)] > 0;
    }
    if (!any) break;
    // Candidates on over-full devices, coldest (fewest lookups per byte) first.
    struct Cand {
      int table;
      double heat;
    };
    std::vector<Cand> cands;
    for (int t = 0; t < T; ++t) {
      const auto& tp = p.tables[static_cast<std::size_t>(t)];
      if (tp.placement == Placement::host || tp.sharding == Sharding::replicated) continue;
      bool on_full = false;
      for (const auto& s : tp.shards) on_full |= over[static_cast<std::size_t>(s.device)] > 0;
      if (!on_full) continue;
      const auto& ts = m.tables[static_cast<std::size_t>(t)];
      cands.push_back({t, ts.pooling_size / std::max(1.0, table_bytes(tp, ts))});
    }
    if (cands.empty()) {
      const auto worst = std::max_element(over.begin(), over.end());
      out.feasible = false;
      out.shortfall = *worst;
      const auto d = static_cast<std::size_t>(worst - over.begin());
      out.why =
          fmt::format("device {} needs {} of its {} even with every movable table in host memory",
                      d, gb(pr.device_memory_bytes[d]), gb(budget));
      return out;
    }
    std::stable_sort(cands.begin(), cands.end(),
                     [](const Cand& a, const Cand& b) { return a.heat < b.heat; });
    // Move enough tables to cover the largest overflow in this round.
    std::vector<double> freed(static_cast<std::size_t>(W), 0);
    for (const auto& c : cands) {
      auto& tp = p.tables[static_cast<std::size_t>(c.table)];
      const auto& ts = m.tables[static_cast<std::size_t>(c.table)];
      bool needed = false;
      for (const auto& s : tp.shards)
        needed |=
            freed[static_cast<std::size_t>(s.device)] < over[static_cast<std::size_t>(s.device)];
      if (!needed) continue;
      tp.placement = Placement::host;
      tp.cache_rows = 0;
      const double per_shard = table_bytes(tp, ts) / static_cast<double>(tp.shards.size());
      for (const auto& s : tp.shards) freed[static_cast<std::size_t>(s.device)] += per_shard;
    }
  }
  // Cache: each device's spare HBM, shared by its host-placed tables by lookups.
  Prediction pr = evaluate_plan(p, m, dev, cal);
  for (int d = 0; d < W; ++d) {
    if (pr.device_memory_bytes[static_cast<std::size_t>(d)] > budget) {
      out.feasible = false;
      out.shortfall = pr.device_memory_bytes[static_cast<std::size_t>(d)] - budget;
      out.why = fmt::format("device {} needs {} of its {}", d,
                            gb(pr.device_memory_bytes[static_cast<std::size_t>(d)]), gb(budget));
      return out;
    }
  }
  // Spare HBM after everything else, the host tables' per-row cache maps included (evaluate_plan
  // counts them with no row cached).
  std::vector<double> spare(static_cast<std::size_t>(W)), demand(static_cast<std::size_t>(W), 0);
  for (int d = 0; d < W; ++d)
    spare[static_cast<std::size_t>(d)] =
        0.98 * (budget - pr.device_memory_bytes[static_cast<std::size_t>(d)]);
  bool any_host = false;
  for (int t = 0; t < T; ++t) {
    const auto& tp = p.tables[static_cast<std::size_t>(t)];
    if (tp.placement != Placement::host) continue;
    any_host = true;
    for (const auto& s : tp.shards)
      demand[static_cast<std::size_t>(s.device)] +=
          m.tables[static_cast<std::size_t>(t)].pooling_size;
  }
  if (any_host) {
    for (int t = 0; t < T; ++t) {
      auto& tp = p.tables[static_cast<std::size_t>(t)];
      if (tp.placement != Placement::host) continue;
      const auto& ts = m.tables[static_cast<std::size_t>(t)];
      double rows = static_cast<double>(ts.rows);
      for (const auto& s : tp.shards) {
        const auto du = static_cast<std::size_t>(s.device);
        const double share = demand[du] > 0 ? spare[du] * ts.pooling_size / demand[du] : 0;
        const int dim = s.col_end - s.col_begin;
        const double row_bytes = dim * static_cast<double>(dtype_size(tp.dtype)) + 16 +
                                 optimizer_state_bytes_per_row(tp.optimizer, dim);
        rows = std::min(rows, std::floor(share / row_bytes));
      }
      tp.cache_rows =
          static_cast<std::int64_t>(std::max(0.0, std::min(rows, static_cast<double>(ts.rows))));
    }
    pr = evaluate_plan(p, m, dev, cal);
    if (pr.host_memory_bytes > dev.host_memory_bytes.value) {
      out.feasible = false;
      out.shortfall = pr.host_memory_bytes - dev.host_memory_bytes.value;
      out.why =
          fmt::format("the tables placed in host memory need {} per GPU, the host has {} per GPU",
                      gb(pr.host_memory_bytes), gb(dev.host_memory_bytes.value));
      return out;
    }
  }
  out.feasible = true;
  return out;
}

}  // namespace parity::detail
