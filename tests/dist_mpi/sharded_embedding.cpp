// The sharded embedding tables under mpirun (ctest dist.sharded_embedding_np2, _np4): for each
// sharding (table, column, row, replicated, and a mix; rows and columns cut into one piece more
// than there are ranks, so that a rank holds several pieces of a table) and each embedding
// optimizer, three steps of forward and fused update on every rank's own batch (ranks hold batches
// of different sizes), against one process holding every table whole and the batches of every
// rank in rank order (the cpu backend's own ops on whole tables). Each rank compares its pooled
// outputs (poisoned first) and every weight it holds. On the cpu backend: bit for bit where the
// sums are the same sums (table, column, replicated); where row shards add partial sums (and
// scale a mean bag's gradient before the owner's update), |sharded - whole| <= 1e-6 (|whole| +
// 0.1), the values being of order 0.1 to 1. On a GPU (`dist_sharded_check gpu [mpi|nccl|self]`:
// the shards in device memory, exchanged through the host by the MPI engine or the self
// communicator, or in place by NCCL's) within 1e-5 of the cpu's whole tables. Rowwise Adagrad over
// column shards keeps a shard's own row state, so it is not compared there. With SGD, also bf16
// outputs and gradients (a bf16 interaction input: the fp32 rows rounded once), and fp16 and
// bf16 tables (each piece's elements stochastically rounded as the whole table's: bit for bit
// where the sums are the same, else within one step of the storage type). Exit 0 when every check
// holds.
#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "dist/sharded_embedding.h"
#include "parity/backend.h"
#include "parity/dist.h"
#include "parity/dtype.h"
#include "parity/plan.h"
#include "parity/random.h"
#include "plans.h"

namespace {

using namespace parity;

const char* kModel = R"(
name: sharded-check
dense_features: 4
batch_size: 64
tables:
  - {name: a, rows: 1000, dim: 16, pooling_size: 3}
  - {name: b, rows: 37, dim: 8, pooling: mean}
  - {name: c, rows: 500, dim: 16, pooling_size: 5, pooling: mean}
  - {name: d, rows: 64, dim: 8, pooling_size: 2}
bottom_mlp: [8]
top_mlp: [4, 1]
interaction: {kind: dcnv2, cross_layers: 1, low_rank: 4}
optimizer:
  embedding: {kind: sgd, lr: 0.05}
  dense: {kind: sgd, lr: 0.01}
)";

float uniform(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  const std::uint64_t h = rng::key(rng::key(a, b), c);
  return static_cast<float>(static_cast<double>(h >> 11) * 0x1.0p-53) - 0.5f;
}

// Every table whole in one process, run by the backend's own ops: the reference, independent of
// ShardedEmbedding's routing and packing.
class WholeTables {
 public:
  // Every table stored as dt (fp32, fp16 or bf16; the initial values rounded to nearest even).
  WholeTables(const ModelSpec& m, OptimizerKind opt, DType dt, Backend& backend,
              const std::function<float(int, std::int64_t, int)>& init)
      : backend_(backend), dt_(dt) {
    std::int64_t w = 0, st = 0, col = 0;
    for (int t = 0; t < m.num_tables(); ++t) {
      const TableSpec& ts = m.tables[static_cast<std::size_t>(t)];
      TableLayout l;
      l.rows = ts.rows;
      l.dim = ts.dim;
      l.pooling = ts.pooling;
      l.weight_offset = w;
      l.state_offset = st;
      l.out_col = col;
      l.ids_per_bag = ts.pooling_size;
      l.dtype = dt;
      layouts_.push_back(l);
      w += ts.rows * ts.dim;
      st += ts.rows * cache_state_per_row(opt, ts.dim);
      col += ts.dim;
    }
    weights_.resize(static_cast<std::size_t>(w));
    narrow_.resize(static_cast<std::size_t>(w));
    state_.assign(static_cast<std::size_t>(st), 0.0f);
    for (int t = 0; t < m.num_tables(); ++t) {
      const TableLayout& l = layouts_[static_cast<std::size_t>(t)];
      for (std::int64_t r = 0; r < l.rows; ++r)
        for (int c = 0; c < l.dim; ++c) {
          const auto i = static_cast<std::size_t>(l.weight_offset + r * l.dim + c);
          weights_[i] = init(t, r, c);
          narrow_[i] = dt == DType::f16 ? half_bits(weights_[i]) : bf16_bits(weights_[i]);
        }
    }
  }
  void forward(const SparseInput& in, Mat out) {
    backend_.embedding_forward(layouts_, tables(), in, out);
  }
  void update(const SparseInput& in, CMat dout, const OptimizerParams& op,
              const StochasticRounding& rounding) {
    backend_.embedding_backward_update(layouts_, tables(), state_.data(), in, dout, op, rounding);
  }
  float weight(int t, std::int64_t r, int c) const {
    const TableLayout& l = layouts_[static_cast<std::size_t>(t)];
    const auto i = static_cast<std::size_t>(l.weight_offset + r * l.dim + c);
    return dt_ == DType::f32   ? weights_[i]
           : dt_ == DType::f16 ? half_to_float(narrow_[i])
                               : bf16_to_float(narrow_[i]);
  }

 private:
  TableWeights tables() {
    return TableWeights::all(
        dt_, dt_ == DType::f32 ? static_cast<void*>(weights_.data()) : narrow_.data());
  }
  Backend& backend_;
  DType dt_;
  std::vector<TableLayout> layouts_;
  std::vector<float> weights_, state_;
  std::vector<std::uint16_t> narrow_;
};

// Rank q's bags at a step: 5 + q examples, each table's bags of 0 to 2 x its pooling size ids.
struct Batch {
  std::int64_t n = 0;
  std::vector<std::int64_t> offsets{0}, ids;
};
Batch batch_of(const ModelSpec& m, int step, int q) {
  Batch b;
  b.n = 5 + q;
  for (int t = 0; t < m.num_tables(); ++t) {
    const TableSpec& ts = m.tables[static_cast<std::size_t>(t)];
    for (std::int64_t i = 0; i < b.n; ++i) {
      const auto h =
          rng::key(rng::key(static_cast<std::uint64_t>(step), static_cast<std::uint64_t>(q)),
                   static_cast<std::uint64_t>(t * 1000 + i));
      const std::int64_t len =
          static_cast<std::int64_t>(h % static_cast<std::uint64_t>(2 * ts.pooling_size + 1));
      for (std::int64_t k = 0; k < len; ++k)
        b.ids.push_back(static_cast<std::int64_t>(rng::key(h, static_cast<std::uint64_t>(k)) %
                                                  static_cast<std::uint64_t>(ts.rows)));
      b.offsets.push_back(static_cast<std::int64_t>(b.ids.size()));
    }
  }
  return b;
}

// Every rank's batches as one, in rank order (table-major CSR).
Batch concat(const ModelSpec& m, const std::vector<Batch>& parts) {
  Batch all;
  for (const Batch& p : parts) all.n += p.n;
  for (int t = 0; t < m.num_tables(); ++t)
    for (const Batch& p : parts)
      for (std::int64_t i = 0; i < p.n; ++i) {
        const std::int64_t lo = p.offsets[static_cast<std::size_t>(t * p.n + i)];
        const std::int64_t hi = p.offsets[static_cast<std::size_t>(t * p.n + i + 1)];
        all.ids.insert(all.ids.end(), p.ids.begin() + lo, p.ids.begin() + hi);
        all.offsets.push_back(static_cast<std::int64_t>(all.ids.size()));
      }
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  int failures = 0;
  try {
    const std::string backend_name = argc > 1 ? argv[1] : "cpu";
    const std::string engine = argc > 2 ? argv[2] : "mpi";
    const ProcessGroupInfo g = detect_process_group();
    if (backend_name != "cpu") use_gpu_of_local_rank(g.local_rank);
    // The MPI engine (under mpirun, or alone), NCCL's (bootstrapped by MPI under a launcher), or
    // one process's self communicator (host spans: a GPU's rows go through the host).
    const bool launched = g.launcher != Launcher::none;
    const auto mpi =
        engine == "mpi" || (engine == "nccl" && launched) ? make_mpi_communicator(&g) : nullptr;
    const auto other = engine == "nccl"   ? make_nccl_communicator(g, mpi.get())
                       : engine == "self" ? make_self_communicator()
                                          : nullptr;
    Communicator* comm = other ? other.get() : mpi.get();
    if (comm == nullptr) throw Error("engine '" + engine + "': expected mpi, nccl or self");
    const int P = comm->size(), me = comm->rank();
    const auto cpu = make_cpu_backend();
    const auto backend = make_backend(backend_name);
    const bool on_cpu = backend->memory_is_host();
    ModelSpec m = parse_model_spec(kModel, "sharded-check");
    const int width = 16 + 8 + 16 + 8;
    auto init = [](int t, std::int64_t r, int c) {
      return uniform(static_cast<std::uint64_t>(t), static_cast<std::uint64_t>(r),
                     static_cast<std::uint64_t>(c));
    };
    for (const std::string how : {"table", "column", "row", "replicated", "mixed", "sum-rows"})
      for (const OptimizerKind opt :
           {OptimizerKind::sgd, OptimizerKind::adagrad, OptimizerKind::rowwise_adagrad})
        for (const DType io : {DType::f32, DType::bf16})
          for (const DType dt : {DType::f32, DType::f16, DType::bf16}) {
            const bool columns = how == "column" || how == "mixed";
            if (columns && opt == OptimizerKind::rowwise_adagrad) continue;
            if (io == DType::bf16 && opt != OptimizerKind::sgd) continue;
            if (dt != DType::f32 && io != DType::f32) continue;  // 16-bit tables: fp32 outputs
            const bool bf16 = io == DType::bf16;  // a bf16 interaction input and its gradient
            const bool exact = on_cpu && how != "row" && how != "mixed" && how != "sum-rows";
            const double tolerance = on_cpu ? 1e-6 : 1e-5;
            m.embedding_optimizer.kind = opt;
            Plan plan = test::plan_for(m, P, how, opt, P + 1);
            for (TablePlan& tp : plan.tables) tp.dtype = dt;
            ShardedEmbedding sharded(m, plan, *comm, *backend);
            WholeTables whole(m, opt, dt, *cpu, init);
            sharded.fill(init, 0.0f);
            const OptimizerParams op{opt, 0.05f, 1e-8f};
            double worst = 0;
            auto compare = [&](float got, float want, const std::string& what) {
              // Relative to the value, floored at 0.1: the weights, gradients and their sums are of
              // order 0.1 to 1, so a few fp32 roundings of the partial sums stay below 1e-6.
              const double err = std::abs(static_cast<double>(got) - want) / (std::abs(want) + 0.1);
              worst = std::max(worst, err);
              if (exact ? !(got == want) : !(err <= tolerance)) {  // a NaN fails either way
                if (++failures <= 10)
                  fmt::print(stderr, "rank {}: {} {} {}: {}: {} against {}\n", me, how,
                             optimizer_name(opt), dtype_name(dt), what, got, want);
              }
            };
            // A 16-bit weight whose update saw a gradient rounded otherwise (row partials, a mean
            // bag's scale) may round stochastically to the neighbouring value: within one step of
            // its type. Where the sums are the same it is the whole table's, bit for bit (the
            // pieces round each element as the whole table does).
            auto compare_weight = [&](float got, float want, const std::string& what) {
              if (dt == DType::f32 || exact) return compare(got, want, what);
              const double step = dt == DType::bf16 ? 0x1p-7 : 0x1p-10;
              if (!(std::abs(static_cast<double>(got) - want) <= step * (std::abs(want) + 0.01)) &&
                  ++failures <= 10)
                fmt::print(stderr, "rank {}: {} {} {}: {}: {} against {}\n", me, how,
                           optimizer_name(opt), dtype_name(dt), what, got, want);
            };
            const StochasticRounding rounding{5, 0};
            for (int step = 1; step <= 3; ++step) {
              std::vector<Batch> parts;
              for (int q = 0; q < P; ++q) parts.push_back(batch_of(m, step, q));
              const Batch all = concat(m, parts);
              std::int64_t first = 0;
              for (int q = 0; q < me; ++q) first += parts[static_cast<std::size_t>(q)].n;
              const Batch& mine = parts[static_cast<std::size_t>(me)];
              const auto out_floats = static_cast<std::size_t>(mine.n * width);
              Buffer d_out(*backend, out_floats * 4), d_dout(*backend, out_floats * 4);
              backend->fill(d_out.as<float>(), mine.n * width, NAN);  // every output written
              std::vector<float> out(out_floats);
              std::vector<float> ref(static_cast<std::size_t>(all.n * width), NAN);
              sharded.forward({mine.n, m.num_tables(), mine.ids.data(), mine.offsets.data(),
                               static_cast<std::int64_t>(mine.ids.size())},
                              AMat(d_out.get(), io, mine.n, width));
              if (bf16) {  // the rows rounded once to bf16
                std::vector<std::uint16_t> bits(out_floats);
                backend->copy_to_host(bits.data(), d_out.get(), out_floats * 2);
                for (std::size_t i = 0; i < out_floats; ++i) out[i] = bf16_to_float(bits[i]);
              } else {
                backend->copy_to_host(out.data(), d_out.get(), out_floats * 4);
              }
              const SparseInput all_in{all.n, m.num_tables(), all.ids.data(), all.offsets.data(),
                                       static_cast<std::int64_t>(all.ids.size())};
              whole.forward(all_in, Mat(ref.data(), all.n, width));
              if (bf16)
                for (float& v : ref) v = bf16_to_float(bf16_bits(v));
              for (std::int64_t i = 0; i < mine.n; ++i)
                for (int c = 0; c < width; ++c) {
                  const float got = out[static_cast<std::size_t>(i * width + c)];
                  const float want = ref[static_cast<std::size_t>((first + i) * width + c)];
                  const std::string what = fmt::format("step {} output ({}, {})", step, i, c);
                  // Row partial sums may round to the neighbouring bf16 value (2^-8 apart).
                  if (bf16 && !exact) {
                    if (!(std::abs(got - want) <= 0x1p-8 * (std::abs(want) + 0.1)) &&
                        ++failures <= 10)
                      fmt::print(stderr, "rank {}: {} bf16: {}: {} against {}\n", me, how, what,
                                 got, want);
                  } else {
                    compare(got, want, what);
                  }
                }
              std::vector<float> dref(static_cast<std::size_t>(all.n * width));
              for (std::int64_t i = 0; i < all.n; ++i)
                for (int c = 0; c < width; ++c)
                  dref[static_cast<std::size_t>(i * width + c)] =
                      uniform(99 + static_cast<std::uint64_t>(step), static_cast<std::uint64_t>(i),
                              static_cast<std::uint64_t>(c));
              if (bf16) {  // the gradients as bf16 (both sides see the rounded values)
                std::vector<std::uint16_t> bits(out_floats);
                for (float& v : dref) v = bf16_to_float(bf16_bits(v));
                for (std::size_t i = 0; i < out_floats; ++i)
                  bits[i] = bf16_bits(dref[static_cast<std::size_t>(first * width) + i]);
                backend->copy_to_device(d_dout.get(), bits.data(), out_floats * 2);
              } else {
                backend->copy_to_device(d_dout.get(), dref.data() + first * width, out_floats * 4);
              }
              sharded.backward_update(CAMat(d_dout.get(), io, mine.n, width), op,
                                      {rounding.seed, static_cast<std::uint64_t>(step)});
              whole.update(all_in, CMat(dref.data(), all.n, width), op,
                           {rounding.seed, static_cast<std::uint64_t>(step)});
              for (int t = 0; t < m.num_tables(); ++t) {
                const TableSpec& ts = m.tables[static_cast<std::size_t>(t)];
                for (std::int64_t r = 0; r < ts.rows; ++r)
                  for (int c = 0; c < ts.dim; ++c)
                    if (const auto w = sharded.weight(t, r, c))
                      compare_weight(
                          *w, whole.weight(t, r, c),
                          fmt::format("step {} table {} weight ({}, {})", step, ts.name, r, c));
              }
            }
            // Where ranks hold row pieces of sum tables alone, a bag with no id in a rank's pieces
            // is not exchanged with it: the check above covered that path.
            double left_out = static_cast<double>(sharded.bags_left_out());
            comm->all_reduce_sum(std::span<double>(&left_out, 1));
            if (how == "sum-rows" && P > 1 && left_out == 0 && ++failures <= 10)
              fmt::print(stderr, "{} {}: every bag went to every owner\n", how,
                         optimizer_name(opt));
            if (me == 0)
              fmt::print(
                  "{:<10} {:<16} {:<4} tables {:<4} {} ranks ({}, {}): largest relative difference "
                  "{:.2e}{}; {} bags not sent\n",
                  how, optimizer_name(opt), dtype_name(io), dtype_name(dt), P, backend->name(),
                  comm->engine(), worst, exact ? " (bit for bit)" : "", left_out);
          }
    // An id outside its table, under row sharding (the routing finds no shard for it): an
    // InputError naming the table and the id, on the rank whose batch holds it.
    {
      ShardedEmbedding sharded(m, test::plan_for(m, P, "row", OptimizerKind::sgd, P + 1), *comm,
                               *backend);
      Batch bad = batch_of(m, 1, me);
      if (bad.offsets[static_cast<std::size_t>(bad.n)] == 0)
        throw Error("the check's batch has no id in table a");
      bad.ids[0] = m.tables[0].rows + 5;  // table a's first id (every rank's: all refuse)
      Buffer d_out(*backend, static_cast<std::size_t>(bad.n * width) * 4);
      try {
        sharded.forward({bad.n, m.num_tables(), bad.ids.data(), bad.offsets.data(),
                         static_cast<std::int64_t>(bad.ids.size())},
                        Mat(d_out.as<float>(), bad.n, width));
        ++failures;
        fmt::print(stderr, "rank {}: an id outside table a was routed\n", me);
      } catch (const InputError& e) {
        if (std::string(e.what()).find("table 'a': id 1005") == std::string::npos && ++failures)
          fmt::print(stderr, "rank {}: unexpected message: {}\n", me, e.what());
      }
    }
    comm->barrier();
  } catch (const std::exception& e) {
    fmt::print(stderr, "sharded_embedding_check: {}\n", e.what());
    return 2;
  }
  return failures == 0 ? 0 : 1;
}
