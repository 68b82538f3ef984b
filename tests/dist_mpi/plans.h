// Plans that lay a model's tables out one way over P ranks, for the mpirun tests.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "parity/plan.h"

namespace parity::test {

// how: table (round robin from rank 1), column (up to `pieces` pieces of at least 4 columns),
// row (`pieces` equal ranges), replicated, mixed (the first table by rows, the second
// replicated, the third by columns, the rest whole), or sum-rows (sum-pooled tables by rows,
// mean-pooled ones whole on rank 0: the other ranks hold row pieces of sum tables only). Piece j
// goes to rank (j + t) % P (column) or j % P (row); pieces 0 means P, and more pieces than ranks
// give a rank several of one table.
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
    if (how == "sum-rows") kind = ts.pooling == Pooling::mean ? "rank0" : "row";
    if (kind == "column" && ts.dim < 8) kind = "table";
    if (kind == "table" || kind == "rank0") {
      tp.sharding = Sharding::table;
      tp.shards = {{kind == "table" ? (t + 1) % P : 0, 0, ts.rows, 0, ts.dim}};
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

// An HSTU model's tables (its sequence features, then its contextual tables) over P ranks, as
// its plans lay them out. how: row (every table in P equal row ranges, range j on rank j),
// replicated, or mixed (the first feature by rows, the other features replicated, the contextual
// tables whole on rank (1 + t) % P).
inline Plan hstu_plan_for(const ModelSpec& m, int P, std::int64_t global_batch,
                          const std::string& how) {
  Plan p;
  p.model = m.name;
  p.device = "h200";
  p.gpus = P;
  p.global_batch = global_batch;
  p.per_device_batch = global_batch / P;
  p.embedding_optimizer = m.embedding_optimizer.kind;
  std::vector<const TableSpec*> tables;
  for (const TableSpec& t : m.hstu->sequence.features) tables.push_back(&t);
  for (const TableSpec& t : m.tables) tables.push_back(&t);
  const auto features = m.hstu->sequence.features.size();
  for (std::size_t t = 0; t < tables.size(); ++t) {
    const TableSpec& ts = *tables[t];
    TablePlan tp;
    tp.name = ts.name;
    tp.optimizer = p.embedding_optimizer;
    std::string kind = how;
    if (how == "mixed") kind = t == 0 ? "row" : t < features ? "replicated" : "table";
    if (kind == "row" && ts.rows < P) kind = "replicated";
    if (kind == "table") {
      tp.sharding = Sharding::table;
      tp.shards = {{static_cast<int>(1 + t) % P, 0, ts.rows, 0, ts.dim}};
    } else if (kind == "row") {
      tp.sharding = Sharding::row;
      for (int j = 0; j < P; ++j)
        tp.shards.push_back({j, ts.rows * j / P, ts.rows * (j + 1) / P, 0, ts.dim});
    } else {
      tp.sharding = Sharding::replicated;
      for (int d = 0; d < P; ++d) tp.shards.push_back({d, 0, ts.rows, 0, ts.dim});
    }
    p.tables.push_back(tp);
  }
  return p;
}

}  // namespace parity::test
