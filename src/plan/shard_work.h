// The perf model's view of one table shard of a plan (shared by the planner and the plan
// evaluation).
#pragma once

#include "parity/plan.h"

namespace parity::detail {

// key_bits: of the sort keys of all the tables the shard's device holds (embedding_key_bits).
inline EmbeddingShardWork shard_work(const TablePlan& tp, const TableSpec& ts, std::int64_t rows,
                                     int dim, double bags, double lookups, int key_bits,
                                     DType io_dtype = DType::f32) {
  EmbeddingShardWork w;
  w.key_bits = key_bits;
  w.io_dtype = io_dtype;
  w.rows = rows;
  w.dim = dim;
  w.bags = bags;
  w.lookups = lookups;
  w.weight_dtype = tp.dtype;
  w.optimizer = tp.optimizer;
  w.placement = tp.placement;
  w.cache_rows = static_cast<double>(tp.cache_rows);
  w.distribution = ts.distribution;
  w.zipf_alpha = ts.zipf_alpha;
  return w;
}

}  // namespace parity::detail
