// Plans that lay a model's tables out one way over P ranks, for the mpirun tests.
#pragma once

#include <algorithm>
#include <string>

#include "parity/plan.h"

namespace parity::test {

// how: table (round robin from rank 1), column (up to `pieces` pieces of at least 4 columns),
// row (`pieces` equal ranges), replicated, or mixed (the first table by rows, the second
// replicated, the third by columns, the rest whole). Piece j goes to rank (j + t) % P (column) or
// j % P (row); pieces 0 means P, and more pieces than ranks give a rank several of one table.
inline Plan plan_for(const ModelSpec& m, int P, const std::string& how, OptimizerKind opt,
                     int pieces = 0) {
  if (pieces <= 0) pieces = P;
  Plan p;
  p.model = m.name;
  p.device = "h200";
  p.gpus = P;
  p.global_batch = m.batch_size;
  p.per_device_batch = m.batch_size / P;
  p.embedding_optimizer = opt;
  for (int t = 0; t < m.num_tables(); ++t) {
    const TableSpec& ts = m.tables[static_cast<std::size_t>(t)];
    TablePlan tp;
    tp.name = ts.name;
    tp.optimizer = opt;
    std::string kind = how;
    if (how == "mixed") kind = t == 0 ? "row" : t == 1 ? "replicated" : t == 2 ? "column" : "table";
    if (kind == "column" && ts.dim < 8) kind = "table";
    if (kind == "table") {
      tp.sharding = Sharding::table;
      tp.shards = {{(t + 1) % P, 0, ts.rows, 0, ts.dim}};
    } else if (kind == "column") {
      tp.sharding = Sharding::column;
      const int k = std::max(1, std::min(pieces, ts.dim / 4));
      for (int j = 0; j < k; ++j)
        tp.shards.push_back({(j + t) % P, 0, ts.rows, ts.dim * j / k, ts.dim * (j + 1) / k});
    } else if (kind == "row") {
      tp.sharding = Sharding::row;
      for (int j = 0; j < pieces; ++j)
        if (ts.rows * (j + 1) / pieces > ts.rows * j / pieces)
          tp.shards.push_back({j % P, ts.rows * j / pieces, ts.rows * (j + 1) / pieces, 0, ts.dim});
    } else {
      tp.sharding = Sharding::replicated;
      for (int d = 0; d < P; ++d) tp.shards.push_back({d, 0, ts.rows, 0, ts.dim});
    }
    p.tables.push_back(tp);
  }
  return p;
}

}  // namespace parity::test
