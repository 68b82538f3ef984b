// An HSTU model trained by several processes under mpirun (ctest dist.hstu_training_np2, _np4):
// its tables laid out as HSTU plans lay them out (every table split by rows; replicated; the item
// table by rows, the other features replicated and the contextual table whole on one rank; and
// the rows layout with the features concatenated instead of summed), the sequence features
// looked up per token and the contextual tables per example from their owners, the dense layers
// data-parallel (SGD), each rank on its slice of every global batch, against one process training
// the same model on the whole batches (hstu-tiny, the cpu backend). The pieces start at the whole
// tables' values exactly. After every step each rank compares the mean loss over the global batch
// and, after the last, every dense parameter and every table element it holds. Half the steps give
// the global batch with the layout (Layout::global_batch), the others let the ranks sum it. The
// ranks sum dense gradients and the summed features in another order than one process does, and
// rowwise Adagrad divides a row's gradient by its own size (a row's small gradients keep their
// relative rounding in its update), so: |sharded - whole| <= 5e-5 (|whole| + 0.01) for parameters
// after 4 steps (2e-5 seen, in item rows), and the loss within 1e-6 relative. The same ranks
// summing their dense gradients in 256-byte buckets while the backward goes on must give the same
// dense parameters bit for bit. Exit 0 when every check holds.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
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
    const ModelSpec base = load_model_spec(std::filesystem::path(PARITY_SOURCE_DIR) / "configs" /
                                           "models" / "hstu-tiny.yaml");
    constexpr std::int64_t kGlobal = 48;
    constexpr int kSteps = 4;
    const std::int64_t slice = kGlobal / P;
    for (const std::string how : {"row", "replicated", "mixed", "concat"}) {
      ModelSpec m = base;
      // SGD for the dense layers: Adam's first steps divide each gradient by its own size, so a
      // parameter whose gradient is near zero moves by about the learning rate either way.
      m.dense_optimizer.kind = OptimizerKind::sgd;
      if (how == "concat") {
        m.hstu->sequence.combine = EventCombine::concat;
        for (TableSpec& f : m.hstu->sequence.features) f.dim = m.hstu->model_dim / 2;
      }
      const Plan plan = test::hstu_plan_for(m, P, kGlobal, how == "concat" ? "row" : how);
      m = apply_plan(m, plan, kGlobal);
      const SyntheticSequences data(m, 7);
      HstuModel sharded(m, *cpu, slice, 11);
      sharded.shard(plan, *comm);
      // The same ranks with the dense gradients summed in 256-byte buckets as the backward makes
      // them (hstu-tiny's fit one default bucket): each element is summed in rank order either
      // way, so every dense parameter must come out the same, bit for bit.
      // Built sharded (never holding a whole table), where `sharded` is sharded after it is built.
      HstuModel bucketed(m, *cpu, slice, 11, {}, &plan, comm.get(), 256);
      HstuModel whole(m, *cpu, kGlobal, 11);
      std::vector<const TableSpec*> tables;
      for (const TableSpec& t : m.hstu->sequence.features) tables.push_back(&t);
      for (const TableSpec& t : m.tables) tables.push_back(&t);
      // The rank holds its pieces' bytes of table weights, and no whole table.
      std::size_t mine = 0;
      for (const TablePlan& tp : plan.tables)
        for (const ShardPlan& sp : tp.shards)
          if (sp.device == me)
            mine += static_cast<std::size_t>((sp.row_end - sp.row_begin) *
                                             (sp.col_end - sp.col_begin)) *
                    sizeof(float);
      const std::size_t held = sharded.allocated_bytes_by_category().at("embedding_weights");
      if (held != mine && ++failures <= 10)
        fmt::print(stderr, "rank {}: {}: {} bytes of table weights held, its pieces are {}\n", me,
                   how, held, mine);
      // Before any step the pieces hold the whole tables' initial values exactly.
      for (std::size_t t = 0; t < tables.size(); ++t)
        for (std::int64_t r = 0; r < tables[t]->rows; ++r)
          for (int c = 0; c < tables[t]->dim; ++c)
            if (const auto got = sharded.table_value(static_cast<int>(t), r, c)) {
              const float want = *whole.table_value(static_cast<int>(t), r, c);
              if (*got != want && ++failures <= 10)
                fmt::print(stderr, "rank {}: {}: table {} ({}, {}) starts at {}, not {}\n", me, how,
                           tables[t]->name, r, c, *got, want);
            }
      double worst_loss = 0, worst = 0;
      for (int step = 0; step < kSteps; ++step) {
        Batch part, all;
        data.make(Split::train, step * kGlobal + me * slice, slice, part);
        data.make(Split::train, step * kGlobal, kGlobal, all);
        if (step % 2 == 0) {
          HstuModel::Layout layout;
          sharded.layout(part, layout);
          layout.global_batch = kGlobal;
          sharded.train_step(part, layout);
        } else {
          sharded.train_step(part);  // the ranks sum the global batch
        }
        bucketed.train_step(part);
        whole.train_step(all);
        double loss = sharded.last_loss() * static_cast<double>(slice) / kGlobal;
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
        if (!(err <= 5e-5) && ++failures <= 10)
          fmt::print(stderr, "rank {}: {}: {}: {} against {}\n", me, how, what, got, want);
      };
      const std::vector<TensorRef> dense = sharded.dense_tensors();
      const std::vector<TensorRef> ref = whole.dense_tensors();
      if (dense.size() != ref.size()) {
        ++failures;
        fmt::print(stderr, "rank {}: {}: {} dense tensors, one process has {}\n", me, how,
                   dense.size(), ref.size());
      }
      for (std::size_t i = 0; i < std::min(dense.size(), ref.size()); ++i)
        for (std::int64_t e = 0; e < ref[i].elements(); ++e)
          compare(static_cast<const float*>(dense[i].data)[e],
                  static_cast<const float*>(ref[i].data)[e], fmt::format("{}[{}]", ref[i].name, e));
      const std::vector<TensorRef> in_buckets = bucketed.dense_tensors();
      std::int64_t differ = 0;
      for (std::size_t i = 0; i < dense.size(); ++i)
        for (std::int64_t e = 0; e < dense[i].elements(); ++e)
          differ += static_cast<const float*>(dense[i].data)[e] !=
                    static_cast<const float*>(in_buckets[i].data)[e];
      if ((differ > 0 || !bucketed.dense_allreduce_overlapped()) && ++failures <= 10)
        fmt::print(
            stderr, "rank {}: {}: {} dense values differ with 256-byte buckets{}\n", me, how,
            differ,
            bucketed.dense_allreduce_overlapped() ? "" : " (not summed during the backward)");
      std::int64_t held_values = 0;
      for (std::size_t t = 0; t < tables.size(); ++t)
        for (std::int64_t r = 0; r < tables[t]->rows; ++r)
          for (int c = 0; c < tables[t]->dim; ++c)
            if (const auto got = sharded.table_value(static_cast<int>(t), r, c)) {
              ++held_values;
              compare(*got, *whole.table_value(static_cast<int>(t), r, c),
                      fmt::format("table {} ({}, {})", tables[t]->name, r, c));
            }
      // Every element is held by some rank.
      double everyone = static_cast<double>(held_values);
      comm->all_reduce_sum(std::span<double>(&everyone, 1));
      std::int64_t elements = 0;
      for (const TableSpec* t : tables) elements += t->rows * t->dim;
      if (everyone < static_cast<double>(elements) && ++failures <= 10)
        fmt::print(stderr, "rank {}: {}: the ranks hold {} table elements of {}\n", me, how,
                   everyone, elements);
      if (me == 0)
        fmt::print(
            "{:<10} {} ranks, {} steps of {} examples: loss within {:.1e}, parameters within "
            "{:.1e}; 256-byte buckets give the same dense parameters\n",
            how, P, kSteps, kGlobal, worst_loss, worst);
    }
    comm->barrier();
  } catch (const std::exception& e) {
    fmt::print(stderr, "hstu_training_check: {}\n", e.what());
    return 2;
  }
  return failures == 0 ? 0 : 1;
}
