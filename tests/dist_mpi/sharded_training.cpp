// The tiny model trained by several processes under mpirun (ctest dist.sharded_training_np2,
// _np4): its tables sharded by a plan (table, row, replicated; column and a mix with SGD tables,
// since rowwise Adagrad keeps a column shard's own row state), its dense layers data-parallel
// (SGD), each rank on its slice of every global batch (slices of different sizes; every other
// step staged with the global batch's size, as the trainer stages it, the others summed by the
// ranks), against one process training the same model on the whole batches. Each rank holds its
// shards' bytes of table weights and no whole table, and its shards start at the whole tables'
// values exactly. After every step each rank compares the mean loss over the global batch and,
// after the last, every dense parameter and every table element it holds. The ranks sum partial
// products and gradients in another order than one process does, so: |sharded - whole| <= 2e-6
// (|whole| + 0.01) for parameters after 4 steps, and the loss within 1e-6 relative. The same ranks
// summing their dense gradients in 256-byte buckets while the backward goes on must give the same
// dense parameters bit for bit. Exit 0 when every check holds.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "dist/sharded_embedding.h"
#include "parity/data.h"
#include "parity/dist.h"
#include "parity/engine.h"
#include "parity/plan.h"
#include "plans.h"

int main() {
  using namespace parity;
  int failures = 0;
  try {
    const ProcessGroupInfo g = detect_process_group();
    const auto comm = make_mpi_communicator(&g);
    const int P = comm->size(), me = comm->rank();
    const auto cpu = make_cpu_backend();
    ModelSpec base = load_model_spec(std::filesystem::path(PARITY_SOURCE_DIR) / "configs" /
                                     "models" / "tiny.yaml");
    constexpr std::int64_t kGlobal = 96;
    constexpr int kSteps = 4;
    // Rank q's slice of each global batch: sizes that differ between ranks.
    std::vector<std::int64_t> slice(static_cast<std::size_t>(P)),
        first(static_cast<std::size_t>(P));
    std::int64_t at = 0;
    for (int q = 0; q < P; ++q) {
      slice[static_cast<std::size_t>(q)] =
          q + 1 < P ? kGlobal / P + (q % 2 == 0 ? 3 : -3) : kGlobal - at;
      first[static_cast<std::size_t>(q)] = at;
      at += slice[static_cast<std::size_t>(q)];
    }
    for (const std::string how : {"table", "row", "replicated", "mixed", "column"}) {
      ModelSpec m = base;
      // SGD for the dense layers: Adagrad's first steps divide each gradient by its own size, so
      // a parameter whose gradient is near zero moves by about the learning rate either way, and
      // a rounding of the sum decides which (the losses still agree to 1e-7 under Adagrad).
      m.dense_optimizer.kind = OptimizerKind::sgd;
      if (how == "column" || how == "mixed") m.embedding_optimizer.kind = OptimizerKind::sgd;
      // The shards' row state starts at Adagrad's initial accumulator, as the whole tables' does
      // (rows split and rows replicated; the whole tables' own start is tested in tests/engine).
      if (how == "row" || how == "replicated") m.embedding_optimizer.initial_accumulator = 1e-4;
      const Plan plan = test::plan_for(m, P, how, m.embedding_optimizer.kind);
      m = apply_plan(m, plan, kGlobal);
      const SyntheticData data(m, 7);
      Model sharded(m, *cpu, kGlobal, 11, &plan, comm.get());
      // The same ranks with the dense gradients summed in 256-byte buckets as the backward makes
      // them (the tiny model's fit in one default bucket): each element is summed in rank order
      // either way, so every dense parameter must come out the same, bit for bit.
      Model bucketed(m, *cpu, kGlobal, 11, &plan, comm.get(), 256);
      Model whole(m, *cpu, kGlobal, 11);
      // The rank holds its shards' bytes, and no whole table.
      std::size_t mine = 0;
      for (const TablePlan& tp : plan.tables)
        for (const ShardPlan& sp : tp.shards)
          if (sp.device == me)
            mine += static_cast<std::size_t>((sp.row_end - sp.row_begin) *
                                             (sp.col_end - sp.col_begin)) *
                    sizeof(float);
      const std::size_t held = sharded.allocated_bytes_by_category().at("embedding_weights");
      if (held != mine && ++failures <= 10)
        fmt::print(stderr, "rank {}: {}: {} bytes of table weights held, its shards are {}\n", me,
                   how, held, mine);
      // Before any step the shards hold the whole tables' initial values exactly.
      {
        const std::vector<TensorRef> start = whole.tensors();
        const ShardedEmbedding& shards0 = *sharded.sharded_embedding();
        for (int tb = 0; tb < m.num_tables(); ++tb) {
          const TableSpec& ts = m.tables[static_cast<std::size_t>(tb)];
          const std::string name = fmt::format("embedding.{}.weight", ts.name);
          const float* w0 = nullptr;
          for (const TensorRef& t : start)
            if (t.name == name) w0 = static_cast<const float*>(t.data);
          for (std::int64_t r = 0; r < ts.rows; ++r)
            for (int c = 0; c < ts.dim; ++c)
              if (const auto got = shards0.weight(tb, r, c);
                  got && *got != w0[r * ts.dim + c] && ++failures <= 10)
                fmt::print(stderr, "rank {}: {}: table {} ({}, {}) starts at {}, not {}\n", me, how,
                           ts.name, r, c, *got, w0[r * ts.dim + c]);
        }
      }
      double worst_loss = 0, worst = 0;
      for (int step = 0; step < kSteps; ++step) {
        Batch mine, all;
        data.make(Split::train, step * kGlobal + first[static_cast<std::size_t>(me)],
                  slice[static_cast<std::size_t>(me)], mine);
        data.make(Split::train, step * kGlobal, kGlobal, all);
        if (step % 2 == 1) {  // the trainer's way: the global batch given with the slice
          sharded.stage(mine, kGlobal);
          sharded.train_staged();
        } else {
          sharded.train_step(mine);  // the ranks sum their batch sizes
        }
        bucketed.train_step(mine);
        whole.train_step(all);
        double loss = sharded.last_loss() * static_cast<double>(mine.size) / kGlobal;
        comm->all_reduce_sum(std::span<double>(&loss, 1));
        const double want = whole.last_loss();
        const double err = std::abs(loss - want) / std::abs(want);
        worst_loss = std::max(worst_loss, err);
        if (!(err <= 1e-6) && ++failures <= 10)  // a NaN fails too
          fmt::print(stderr, "rank {}: {}: step {} loss {} against {}\n", me, how, step + 1, loss,
                     want);
      }
      auto compare = [&](float got, float want, const std::string& what) {
        const double err = std::abs(static_cast<double>(got) - want) / (std::abs(want) + 0.01);
        worst = std::max(worst, err);
        if (!(err <= 2e-6) && ++failures <= 10)
          fmt::print(stderr, "rank {}: {}: {}: {} against {}\n", me, how, what, got, want);
      };
      // The dense parameters and their optimizer state: one process's, on every rank.
      const std::vector<TensorRef> dense = sharded.dense_tensors();
      for (const TensorRef& t : whole.dense_tensors()) {
        const auto it = std::find_if(dense.begin(), dense.end(),
                                     [&](const TensorRef& d) { return d.name == t.name; });
        if (it == dense.end()) {
          ++failures;
          fmt::print(stderr, "rank {}: {}: no dense tensor {}\n", me, how, t.name);
          continue;
        }
        for (std::int64_t i = 0; i < t.elements(); ++i)
          compare(static_cast<const float*>(it->data)[i], static_cast<const float*>(t.data)[i],
                  fmt::format("{}[{}]", t.name, i));
      }
      const std::vector<TensorRef> in_buckets = bucketed.dense_tensors();
      std::int64_t differ = 0;
      for (std::size_t i = 0; i < dense.size(); ++i)
        for (std::int64_t e = 0; e < dense[i].elements(); ++e)
          differ += static_cast<const float*>(dense[i].data)[e] !=
                    static_cast<const float*>(in_buckets[i].data)[e];
      if (differ > 0 && ++failures <= 10)
        fmt::print(stderr, "rank {}: {}: {} dense values differ with 256-byte buckets\n", me, how,
                   differ);
      // Every table element this rank holds.
      const std::vector<TensorRef> ref = whole.tensors();
      const ShardedEmbedding& shards = *sharded.sharded_embedding();
      for (int tb = 0; tb < m.num_tables(); ++tb) {
        const TableSpec& ts = m.tables[static_cast<std::size_t>(tb)];
        const std::string name = fmt::format("embedding.{}.weight", ts.name);
        const float* w = nullptr;
        for (const TensorRef& t : ref)
          if (t.name == name) w = static_cast<const float*>(t.data);
        for (std::int64_t r = 0; r < ts.rows; ++r)
          for (int c = 0; c < ts.dim; ++c)
            if (const auto got = shards.weight(tb, r, c))
              compare(*got, w[r * ts.dim + c], fmt::format("table {} ({}, {})", ts.name, r, c));
      }
      if (me == 0)
        fmt::print(
            "{:<10} {} ranks, {} steps of {} examples: loss within {:.1e}, parameters within "
            "{:.1e}; 256-byte buckets {} the same{}\n",
            how, P, kSteps, kGlobal, worst_loss, worst, differ == 0 ? "give" : "do not give",
            bucketed.dense_allreduce_overlapped() ? " (summed while the backward went on)"
                                                  : " (summed at the end: no second communicator)");
    }
    comm->barrier();
  } catch (const std::exception& e) {
    fmt::print(stderr, "sharded_training_check: {}\n", e.what());
    return 2;
  }
  return failures == 0 ? 0 : 1;
}
