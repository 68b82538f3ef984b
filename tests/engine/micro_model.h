// Small models built in code for engine tests (no YAML needed).
#pragma once

#include "parity/spec.h"

namespace parity::testing {

inline ModelSpec micro_model(InteractionKind kind, OptimizerKind emb_opt = OptimizerKind::sgd,
                             OptimizerKind dense_opt = OptimizerKind::sgd, double lr = 1.0) {
  ModelSpec m;
  m.name = kind == InteractionKind::dot ? "micro-dot" : "micro-dcnv2";
  m.source_file = "<test>";
  m.dense_features = 5;
  m.batch_size = 8;
  const int dim = 4;
  const std::int64_t rows[] = {7, 13, 3};
  const int pool[] = {2, 1, 3};
  const Pooling pooling[] = {Pooling::sum, Pooling::sum, Pooling::mean};
  for (int t = 0; t < 3; ++t) {
    TableSpec s;
    s.name = "t" + std::to_string(t);
    s.rows = rows[t];
    s.dim = dim;
    s.pooling_size = pool[t];
    s.pooling = pooling[t];
    s.distribution = t == 1 ? IdDistribution::zipf : IdDistribution::uniform;
    s.zipf_alpha = t == 1 ? 1.1 : 0.0;
    m.tables.push_back(s);
  }
  m.bottom_mlp = {6, dim};
  m.top_mlp = {5, 1};
  m.interaction.kind = kind;
  if (kind == InteractionKind::dcnv2) {
    m.interaction.cross_layers = 2;
    m.interaction.low_rank = 3;
  }
  m.embedding_optimizer.kind = emb_opt;
  m.embedding_optimizer.lr = lr;
  m.dense_optimizer.kind = dense_opt;
  m.dense_optimizer.lr = lr;
  return m;
}

}  // namespace parity::testing
