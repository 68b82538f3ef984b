// Host placement for one recipe and layout: the coldest tables of over-full devices move to
// host memory, and each device's spare HBM caches its host tables' hottest rows.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "search.h"

namespace parity::detail {

namespace {

// Each device's spare HBM after everything else (the host tables' per-row cache maps included:
// evaluate_plan counts them with no row cached) becomes cache for its host-placed tables, shared
// by their lookups. False, with `out` saying why, when the host tables exceed the host's memory.
bool assign_caches(Plan& p, const ModelSpec& m, const DeviceSpec& dev, const Calibration& cal,
                   Fit& out) {
  const int W = p.gpus;
  const int T = m.num_tables();
  const double budget = dev.hbm_bytes.value;
  Prediction pr = evaluate_plan(p, m, dev, cal);
  for (int d = 0; d < W; ++d) {
    if (pr.device_memory_bytes[static_cast<std::size_t>(d)] > budget) {
      out.feasible = false;
      out.shortfall = pr.device_memory_bytes[static_cast<std::size_t>(d)] - budget;
      out.why = fmt::format("device {} needs {} of its {}", d,
                            gb(pr.device_memory_bytes[static_cast<std::size_t>(d)]), gb(budget));
      return false;
    }
  }
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
  if (!any_host) return true;
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
    return false;
  }
  return true;
}

}  // namespace

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
  if (!assign_caches(p, m, dev, cal, out)) return out;
  // More tables in host memory can be faster: a Zipf table's cache of its hottest rows serves most
  // of its lookups in a fraction of its bytes, so the HBM a whole cold table holds may serve more
  // lookups as cache. Try moving the next coldest tables too (1, 2, 4, ... more, then halving the
  // step around the best) and keep the fastest plan that fits.
  bool any_host = false;
  for (const auto& tp : p.tables) any_host |= tp.placement == Placement::host;
  if (any_host) {
    std::vector<std::pair<double, int>> movable;  // (heat, table), coldest first
    for (int t = 0; t < T; ++t) {
      const auto& tp = p.tables[static_cast<std::size_t>(t)];
      if (tp.placement == Placement::host || tp.sharding == Sharding::replicated) continue;
      const auto& ts = m.tables[static_cast<std::size_t>(t)];
      movable.push_back({ts.pooling_size / std::max(1.0, table_bytes(tp, ts)), t});
    }
    std::stable_sort(movable.begin(), movable.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    const int n = static_cast<int>(movable.size());
    std::map<int, std::optional<Plan>> tried;  // more tables moved -> the plan (nullopt: no fit)
    tried[0] = p;
    auto rate = [&](int k) -> double {
      auto it = tried.find(k);
      if (it == tried.end()) {
        Plan q = tried.at(0).value();
        for (int i = 0; i < k; ++i) {
          auto& tp =
              q.tables[static_cast<std::size_t>(movable[static_cast<std::size_t>(i)].second)];
          tp.placement = Placement::host;
          tp.cache_rows = 0;
        }
        Fit f;
        it = tried
                 .emplace(k, assign_caches(q, m, dev, cal, f) ? std::optional<Plan>(std::move(q))
                                                              : std::nullopt)
                 .first;
      }
      return it->second ? evaluate_plan(*it->second, m, dev, cal).examples_per_s : -1.0;
    };
    int best = 0;
    double best_rate = rate(0);
    for (int k = 1; k <= n; k = k < n && 2 * k > n ? n : 2 * k) {
      const double r = rate(k);
      if (r > best_rate * (1 + 1e-12)) {
        best = k;
        best_rate = r;
      }
      if (k == n) break;
    }
    for (int step = std::max(1, best / 2); step >= 1; step /= 2)
      for (const int k : {best - step, best + step}) {
        if (k < 0 || k > n) continue;
        const double r = rate(k);
        if (r > best_rate * (1 + 1e-12)) {
          best = k;
          best_rate = r;
        }
      }
    if (best > 0) p = *tried.at(best);
  }
  out.feasible = true;
  return out;
}

}  // namespace parity::detail
