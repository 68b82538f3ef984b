// Embedding kernels at the speed of memory: achieved bandwidth of parity's table-batched forward
// and of its backward fused with the optimizer, next to the measured device copy bandwidth.
//
// What it measures (docs/perf/embedding.md has the results and the command):
// - copy: cudaMemcpy device to device of 2 GiB, bytes read + written;
// - single: one 10M-row fp32 table of dim 128, 65,536 bags of exactly 20 uniform ids;
//   also Zipf(1.05) ids, fp16/bf16 weights, and the three optimizers;
// - mlperf: the 26 MLPerf DLRMv2 tables (configs/models/mlperf-dlrmv2.yaml: 204M rows, dim 128,
//   pooling 1..100 per table, ~105 GB fp32) at batch 65,536, rowwise Adagrad (fits one H200);
// - model: any model's tables (--model, rows capped at --max-rows, its batch or --batch, its
//   storage type or --dtype, its embedding optimizer), all together, then each shape alone.
// Method: the median of --reps timed runs (CUDA events around each call) after --warmup runs;
// ids, outputs and gradients rotate among several sets (each set ~43 MB, several times L2 in
// total for the single table; one set is 0.9 GB for mlperf); weights and gradients are random and
// non-zero (device-side counter-based fill).
// Bytes that must move: embedding_traffic (parity/perf.h), the count the planner predicts with:
//   forward  = ids + offsets read + every looked-up row read + outputs written;
//   backward = ids + offsets read, (key, bag) pairs written and read, radix-sort passes, segment
//              starts; dout read once per (bag, table), and again per id where a table's dout
//              is larger than L2 (the share that misses); each distinct row's weights and
//              optimizer state read and written once.
// --dump DIR writes each case's ids and offsets so that bench/embedding_torch.py times PyTorch's
// nn.EmbeddingBag on exactly the same inputs; --results FILE writes the numbers as JSON.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "backend/gpu/embedding.h"
#include "backend/gpu/fill.h"
#include "backend/gpu/runtime.h"
#include "lab/row_probe.h"
#include "parity/data.h"
#include "parity/embedding_kernels.h"
#include "parity/perf.h"
#include "parity/random.h"
#include "parity/spec.h"

namespace pg = parity::gpu;
using parity::DType;
using parity::OptimizerKind;
using parity::TableLayout;

namespace {

struct Options {
  std::vector<std::string> cases = {"single", "variants", "mlperf"};
  int reps = 20;
  int warmup = 5;
  std::string dump_dir;
  std::string results;
  std::string model = std::string(PARITY_SOURCE_DIR) + "/configs/models/mlperf-dlrmv2.yaml";
  pg::SortMethod sort = pg::SortMethod::automatic;
  double scale = 1.0;                 // shrink every table and the batch (for a quick check)
  std::int64_t max_rows = 4'000'000;  // model case: rows per table at most
  std::int64_t batch = 0;             // model case: the model's batch when 0
  DType dtype = DType::f32;           // model case: table storage, when dtype_set
  bool dtype_set = false;
  std::vector<int> bwd_vecs = {
      0};  // vectors per lane tried in the backward of single and mlperf (0 = default)
  DType grad_dtype =
      DType::f32;  // the backward's output gradients (training stores them in bf16 under bf16 math)
  std::string device = "h200";  // the spec and calibration the predictions read
  std::string calibration;      // a calibration file instead of configs/calibration/<device>.yaml
  std::string configs = std::string(PARITY_SOURCE_DIR) + "/configs";
};

// The performance model the predictions come from (--device, its calibration).
struct Model {
  parity::DeviceSpec device;
  parity::Calibration cal;
};
Model g_model;

struct Result {
  std::string name;
  std::string pass;  // forward | backward
  std::string tag;   // the dumped case these inputs belong to (single, zipf, mlperf), or empty
  double ms = 0;
  double bytes = 0;
  double heavy_ids = 0;     // backward: ids in rows of more than kEmbeddingHeavyRow of them
  double predicted_ms = 0;  // the performance model's time for the same traffic
  double row_bytes = 0;     // backward: the distinct rows' traffic (EmbeddingTraffic::rows)
  bool narrow = false;      // 16-bit table weights
  double gbps() const { return bytes / (ms * 1e-3) / 1e9; }
};

std::vector<Result> g_results;
double g_copy_gbps = 0;

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty()
             ? 0.0
             : (v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
}

// Median milliseconds of f(rep) over reps runs after warmup runs, each bracketed by events.
double time_ms(const pg::Stream& s, int warmup, int reps, const std::function<void(int)>& f) {
  for (int i = 0; i < warmup; ++i) f(i);
  std::vector<pg::Event> start(reps), stop(reps);
  for (int i = 0; i < reps; ++i) {
    start[i].record(s.get());
    f(warmup + i);
    stop[i].record(s.get());
  }
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) ms[i] = pg::Event::elapsed_ms(start[i], stop[i]);
  return median(ms);
}

void report(const Result& r) {
  g_results.push_back(r);
  std::printf(
      "  %-44s %-8s %9.3f ms %9.1f GB/s %6.1f%% of copy   (%.3f GB)   model %.3f ms (%.2fx)\n",
      r.name.c_str(), r.pass.c_str(), r.ms, r.gbps(), 100.0 * r.gbps() / g_copy_gbps, r.bytes / 1e9,
      r.predicted_ms, r.predicted_ms > 0 ? r.ms / r.predicted_ms : 0.0);
  std::fflush(stdout);
}

void measure_copy(const Options& o) {
  const std::size_t bytes = std::size_t{2} << 30;
  pg::DeviceBuffer<std::uint8_t> a(bytes, "copy source"), b(bytes, "copy destination");
  pg::Stream s;
  pg::fill_uniform(s.get(), a.data(), DType::f32, static_cast<std::int64_t>(bytes / 4), -1.0f, 1.0f,
                   1, 0);
  const double ms = time_ms(s, o.warmup, o.reps, [&](int i) {
    if (i % 2 == 0) {
      pg::copy_async(b.data(), a.data(), bytes, s.get());
    } else {
      pg::copy_async(a.data(), b.data(), bytes, s.get());
    }
  });
  g_copy_gbps = 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
  std::printf("  %-44s %-8s %9.3f ms %9.1f GB/s  (2 GiB read + 2 GiB written)\n",
              "device copy (memcpy D2D)", "copy", ms, g_copy_gbps);
  std::fflush(stdout);
}

// ------------------------------------------------------------------ inputs --

struct TableSet {
  std::string name;
  std::vector<TableLayout> tables;
  std::vector<int> pooling_size;
  std::vector<double> zipf;  // per table: Zipf(alpha) ids when > 0 (a variant's zipf overrides)
  std::int64_t batch = 0;
  std::int64_t weight_elems = 0;
  std::int64_t rowwise_state = 0;
  std::int64_t elementwise_state = 0;
  std::int64_t out_cols = 0;
};

TableSet make_set(const std::string& name, const std::vector<std::int64_t>& rows,
                  const std::vector<int>& pooling, const std::vector<int>& dims, std::int64_t batch,
                  DType dtype) {
  TableSet t;
  t.name = name;
  t.batch = batch;
  t.pooling_size = pooling;
  t.zipf.assign(rows.size(), 0.0);
  std::int64_t col = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const int dim = dims[i];
    TableLayout tl;
    tl.rows = rows[i];
    tl.dim = dim;
    tl.ids_per_bag = pooling[i];
    tl.weight_offset = t.weight_elems;
    tl.state_offset = t.rowwise_state;
    tl.out_col = col;
    tl.dtype = dtype;
    t.weight_elems += rows[i] * dim;
    t.rowwise_state += rows[i];
    t.elementwise_state += rows[i] * dim;
    col += dim;
    t.tables.push_back(tl);
  }
  t.out_cols = col;
  return t;
}

TableSet make_set(const std::string& name, const std::vector<std::int64_t>& rows,
                  const std::vector<int>& pooling, int dim, std::int64_t batch, DType dtype) {
  return make_set(name, rows, pooling, std::vector<int>(rows.size(), dim), batch, dtype);
}

struct HostBatch {
  std::vector<std::int64_t> ids;
  std::vector<std::int64_t> offsets;
  std::vector<std::int64_t> nnz_per_table;
  std::vector<std::int64_t> unique_per_table;
  std::vector<std::int64_t> heavy_per_table;  // ids in rows of more than kEmbeddingHeavyRow
};

// The bytes the kernels move on this batch (the performance model's count), the forward writing
// fp32 outputs and the backward reading grad_dtype gradients.
parity::EmbeddingTraffic traffic(const TableSet& set, const HostBatch& h, DType weights, DType io,
                                 OptimizerKind kind, pg::SortMethod sort, int key_bits) {
  std::vector<parity::EmbeddingBatch::Table> tables;
  for (std::size_t t = 0; t < set.tables.size(); ++t) {
    tables.push_back({set.tables[t].dim, static_cast<double>(h.nnz_per_table[t]),
                      static_cast<double>(h.unique_per_table[t]),
                      static_cast<double>(h.heavy_per_table[t])});
  }
  const auto method =
      sort == pg::SortMethod::portable ? parity::RadixSort::portable : parity::RadixSort::vendor;
  return parity::embedding_traffic({tables, static_cast<double>(set.batch), weights, io, kind,
                                    method, key_bits,
                                    static_cast<double>(pg::device_info().l2_cache_bytes)});
}

// Fixed pooling per table; ids uniform, or Zipf(alpha) scattered over the rows.
HostBatch make_batch(const TableSet& set, double zipf_alpha, std::uint64_t seed) {
  HostBatch h;
  const std::int64_t B = set.batch;
  const int T = static_cast<int>(set.tables.size());
  std::vector<std::int64_t> table_start(T + 1, 0);
  for (int t = 0; t < T; ++t) table_start[t + 1] = table_start[t] + B * set.pooling_size[t];
  h.ids.resize(static_cast<std::size_t>(table_start[T]));
  h.offsets.resize(static_cast<std::size_t>(B * T + 1));
  h.nnz_per_table.resize(T);
  h.unique_per_table.resize(T);
  h.heavy_per_table.resize(T);
  for (int t = 0; t < T; ++t) {
    const std::int64_t rows = set.tables[t].rows;
    const int pool = set.pooling_size[t];
    h.nnz_per_table[t] = B * pool;
    for (std::int64_t b = 0; b < B; ++b) h.offsets[t * B + b] = table_start[t] + b * pool;
    const double alpha = zipf_alpha > 0 ? zipf_alpha : set.zipf[t];
    parity::ZipfSampler zipf(rows, alpha > 0 ? alpha : 1.0);
    const std::uint64_t mult = rows > 1 ? 2 * static_cast<std::uint64_t>(rows / 3) + 1 : 1;
    const std::uint64_t key = parity::rng::key(seed, static_cast<std::uint64_t>(t));
#pragma omp parallel for schedule(static)
    for (std::int64_t j = 0; j < B * pool; ++j) {
      const std::uint64_t r1 = parity::rng::bits(key, 2 * static_cast<std::uint64_t>(j));
      std::int64_t id;
      if (alpha > 0) {
        const double u1 = static_cast<double>(r1 >> 11) * (1.0 / 9007199254740992.0);
        const double u2 = parity::rng::uniform01(key, 2 * static_cast<std::uint64_t>(j) + 1);
        const auto rank = static_cast<std::uint64_t>(zipf.sample(u1, u2));
        id = static_cast<std::int64_t>((static_cast<unsigned __int128>(rank) * mult) %
                                       static_cast<std::uint64_t>(rows));
      } else {
        id = static_cast<std::int64_t>(
            (static_cast<unsigned __int128>(r1) * static_cast<std::uint64_t>(rows)) >> 64);
      }
      h.ids[static_cast<std::size_t>(table_start[t] + j)] = id;
    }
    std::vector<std::uint32_t> count(static_cast<std::size_t>(rows), 0);
    for (std::int64_t j = table_start[t]; j < table_start[t + 1]; ++j)
      ++count[static_cast<std::size_t>(h.ids[j])];
    std::int64_t u = 0, heavy = 0;
    for (const std::uint32_t c : count) {
      u += c > 0;
      heavy += c > parity::kEmbeddingHeavyRow ? c : 0;
    }
    h.unique_per_table[t] = u;
    h.heavy_per_table[t] = heavy;
  }
  h.offsets[B * T] = table_start[T];
  return h;
}

void dump_batch(const Options& o, const std::string& name, int rotation, const TableSet& set,
                const HostBatch& h, double zipf) {
  if (o.dump_dir.empty()) return;
  std::filesystem::create_directories(o.dump_dir);
  const std::string base = o.dump_dir + "/" + name;
  std::ofstream(base + fmt::format(".ids.{}.bin", rotation), std::ios::binary)
      .write(reinterpret_cast<const char*>(h.ids.data()),
             static_cast<std::streamsize>(h.ids.size() * 8));
  std::ofstream(base + fmt::format(".offsets.{}.bin", rotation), std::ios::binary)
      .write(reinterpret_cast<const char*>(h.offsets.data()),
             static_cast<std::streamsize>(h.offsets.size() * 8));
  if (rotation == 0) {
    std::ofstream m(base + ".json");
    m << "{\"name\": \"" << name << "\", \"batch\": " << set.batch
      << ", \"dim\": " << set.tables[0].dim << ", \"zipf\": " << zipf << ", \"rows\": [";
    for (std::size_t t = 0; t < set.tables.size(); ++t) m << (t ? ", " : "") << set.tables[t].rows;
    m << "], \"pooling\": [";
    for (std::size_t t = 0; t < set.tables.size(); ++t) m << (t ? ", " : "") << set.pooling_size[t];
    m << "]}\n";
  }
}

struct DeviceBatch {
  pg::DeviceBuffer<std::int64_t> ids, offsets;
  pg::DeviceSparseInput in;
  DeviceBatch(const HostBatch& h, std::int64_t batch, int tables)
      : ids(h.ids.size(), "bench ids"), offsets(h.offsets.size(), "bench offsets") {
    ids.upload_sync(h.ids.data(), h.ids.size());
    offsets.upload_sync(h.offsets.data(), h.offsets.size());
    in = {batch, tables, ids.data(), offsets.data(), static_cast<std::int64_t>(h.ids.size())};
  }
};

// ------------------------------------------------------------------- cases --

struct Variant {
  std::string label;
  pg::SortMethod sort = pg::SortMethod::automatic;
  DType wdtype = DType::f32;
  OptimizerKind kind = OptimizerKind::rowwise_adagrad;
  double zipf = 0.0;
  bool forward = true;
  bool backward = true;
  std::vector<int> bwd_vecs = {0};
};

void run_set(const Options& o, const TableSet& base, const std::vector<Variant>& variants,
             int rotations, const std::string& dump_name) {
  pg::Stream s;
  const int T = static_cast<int>(base.tables.size());
  for (const Variant& v : variants) {
    TableSet set = base;
    for (auto& tl : set.tables) {
      tl.dtype = v.wdtype;
      tl.state_offset = v.kind == OptimizerKind::adagrad ? tl.weight_offset : tl.state_offset;
    }
    std::vector<HostBatch> host;
    std::vector<std::unique_ptr<DeviceBatch>> dev;
    for (int r = 0; r < rotations; ++r) {
      host.push_back(make_batch(set, v.zipf, 1000 + r + (v.zipf > 0 ? 77 : 0)));
      dev.push_back(std::make_unique<DeviceBatch>(host.back(), set.batch, T));
      if (!dump_name.empty() && v.label == variants.front().label)
        dump_batch(o, dump_name, r, set, host.back(), v.zipf);
    }
    pg::EmbeddingTables tables(set.tables);
    pg::DeviceBuffer<std::uint8_t> weights(
        static_cast<std::size_t>(set.weight_elems) * parity::dtype_size(v.wdtype), "bench weights");
    pg::fill_uniform(s.get(), weights.data(), v.wdtype, set.weight_elems, -0.05f, 0.05f, 42, 1);
    const std::size_t out_elems = static_cast<std::size_t>(set.batch * set.out_cols);
    std::vector<pg::DeviceBuffer<float>> outs;
    for (int r = 0; r < rotations; ++r) outs.emplace_back(out_elems, "bench outputs");
    const std::string name =
        fmt::format("{} {}{}", set.name, parity::dtype_name(v.wdtype), v.label);
    const std::string tag =
        v.label == variants.front().label && v.wdtype == variants.front().wdtype ? dump_name : "";

    if (v.forward) {
      const double ms = time_ms(s, o.warmup, o.reps, [&](int i) {
        const int r = i % rotations;
        pg::embedding_forward(s.get(), tables, parity::TableWeights::all(v.wdtype, weights.data()),
                              dev[r]->in,
                              {outs[r].data(), DType::f32, set.batch, set.out_cols, set.out_cols});
      });
      tables.raise_input_errors(s.get());
      const double bytes =
          traffic(set, host[0], v.wdtype, DType::f32, v.kind, v.sort, tables.key_bits()).forward;
      const double copy = g_model.device.hbm_bandwidth.value * g_model.cal.hbm_efficiency;
      report({name, "forward", tag, ms, bytes, 0,
              1e3 * (bytes / (copy * g_model.cal.embedding_forward_efficiency) +
                     g_model.cal.kernel_launch_s)});
    }
    if (v.backward) {
      // Gradients: reuse the output buffers (of o.grad_dtype: a bf16 gradient takes the first half
      // of each fp32 buffer), filled with random values.
      for (int r = 0; r < rotations; ++r) {
        pg::fill_uniform(s.get(), outs[r].data(), o.grad_dtype,
                         static_cast<std::int64_t>(out_elems), -1.0f, 1.0f, 7, r);
      }
      const auto grads = [&](int r) {
        return parity::AMat{outs[r].data(), o.grad_dtype, set.batch, set.out_cols, set.out_cols};
      };
      const std::int64_t state_elems = v.kind == OptimizerKind::adagrad ? set.elementwise_state
                                       : v.kind == OptimizerKind::rowwise_adagrad
                                           ? set.rowwise_state
                                           : 0;
      pg::DeviceBuffer<float> state(
          static_cast<std::size_t>(std::max<std::int64_t>(state_elems, 1)), "bench state");
      pg::fill_uniform(s.get(), state.data(), DType::f32, state_elems, 0.0f, 0.1f, 43, 1);
      std::int64_t max_nnz = 0;
      for (const auto& h : host)
        max_nnz = std::max<std::int64_t>(max_nnz, static_cast<std::int64_t>(h.ids.size()));
      pg::EmbeddingWorkspace ws(tables, set.batch, max_nnz,
                                v.sort != pg::SortMethod::automatic ? v.sort : o.sort);
      parity::OptimizerParams opt;
      opt.kind = v.kind;
      opt.lr = 0.005f;
      for (int vecs : v.bwd_vecs) {
        pg::UpdateOptions upd;
        upd.seed = 5;
        upd.vectors_per_lane = vecs;
        const double ms = time_ms(s, o.warmup, o.reps, [&](int i) {
          const int r = i % rotations;
          upd.step = static_cast<std::uint64_t>(i);
          pg::embedding_backward_update(s.get(), tables,
                                        parity::TableWeights::all(v.wdtype, weights.data()),
                                        state.data(), dev[r]->in, grads(r), opt, upd, ws);
        });
        tables.raise_input_errors(s.get());
        // Bytes: averaged over the rotations (their distinct-row counts differ slightly).
        double bytes = 0, sort = 0, heavy = 0, row_bytes = 0, predicted = 0;
        for (const auto& h : host) {
          const auto b =
              traffic(set, h, v.wdtype, o.grad_dtype, v.kind, ws.sort_method(), tables.key_bits());
          bytes += b.backward() / rotations;
          sort += b.sort / rotations;
          heavy += b.heavy_ids / rotations;
          row_bytes += b.rows / rotations;
          predicted += 1e3 *
                       (parity::embedding_backward_seconds(b, g_model.device, g_model.cal) +
                        parity::embedding_backward_fixed_seconds(b.heavy_ids > 0, g_model.cal)) /
                       rotations;
        }
        pg::BackwardProfile prof;
        upd.profile = &prof;
        pg::embedding_backward_update(s.get(), tables,
                                      parity::TableWeights::all(v.wdtype, weights.data()),
                                      state.data(), dev[0]->in, grads(0), opt, upd, ws);
        float stage[pg::BackwardProfile::kStages];
        prof.stage_ms(stage);
        const auto stats = ws.last_stats(s.get());
        report({fmt::format("{} +{}{}{}", name, parity::optimizer_name(v.kind),
                            o.grad_dtype == DType::f32
                                ? std::string()
                                : fmt::format(" grad {}", parity::dtype_name(o.grad_dtype)),
                            vecs ? fmt::format(" vpl={}", vecs) : std::string()),
                "backward", vecs ? std::string() : tag, ms, bytes, heavy, predicted, row_bytes,
                parity::dtype_size(v.wdtype) == 2});
        std::printf(
            "  %-44s          unique rows %lld, heavy rows %lld (%lld chunks), sort %s (%.0f MB of "
            "%.0f MB)\n",
            "", static_cast<long long>(stats.unique_rows), static_cast<long long>(stats.heavy_rows),
            static_cast<long long>(stats.heavy_chunks),
            std::string(pg::sort_method_name(ws.sort_method())).c_str(), sort / 1e6, bytes / 1e6);
        std::printf("  %-44s          stages (one run):", "");
        for (int k = 0; k < pg::BackwardProfile::kStages; ++k) {
          std::printf(" %s %.3f ms%s", pg::BackwardProfile::kNames[k], stage[k],
                      k + 1 < pg::BackwardProfile::kStages ? "," : "\n");
        }
      }
    }
  }
}

// The HBM ceiling of the backward's row traffic: read and write, once each, the distinct rows of
// one batch (sorted, as the backward visits them), with no arithmetic and no index chain.
void probe_rows(const Options& o, const TableSet& set) {
  if (set.tables.size() != 1 || set.tables[0].dim != 128) return;
  const HostBatch h = make_batch(set, 0.0, 1000);
  std::vector<std::uint32_t> rows(h.ids.begin(), h.ids.end());
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  pg::Stream s;
  pg::DeviceBuffer<float> w(static_cast<std::size_t>(set.weight_elems), "probe weights");
  pg::fill_uniform(s.get(), w.data(), DType::f32, set.weight_elems, -1.0f, 1.0f, 3, 0);
  pg::DeviceBuffer<std::uint32_t> d_rows(rows.size(), "probe rows");
  d_rows.upload_sync(rows.data(), rows.size());
  const auto n = static_cast<std::int64_t>(rows.size());
  const double ms = time_ms(s, o.warmup, o.reps, [&](int) {
    pg::lab::row_read_modify_write(s.get(), w.data(), d_rows.data(), n, 128);
  });
  report({fmt::format("probe: {} distinct random rows read+written", n), "probe", "", ms,
          2.0 * 512.0 * n});
}

void case_single(const Options& o, bool variants) {
  const std::int64_t rows = static_cast<std::int64_t>(10'000'000 * o.scale);
  const std::int64_t batch = static_cast<std::int64_t>(65536 * std::min(1.0, o.scale * 10));
  TableSet set = make_set("10M x 128, 65536 x 20", {rows}, {20}, 128, batch, DType::f32);
  std::vector<Variant> v;
  if (!variants) {
    v.push_back({"", pg::SortMethod::automatic, DType::f32, OptimizerKind::rowwise_adagrad, 0.0,
                 true, true, o.bwd_vecs});
    run_set(o, set, v, 4, "single");
    probe_rows(o, set);
  } else {
    v.push_back({" zipf1.05", pg::SortMethod::automatic, DType::f32, OptimizerKind::rowwise_adagrad,
                 1.05, true, true});
    run_set(o, set, v, 4, "zipf");
    v.clear();
    v.push_back({" portable-sort", pg::SortMethod::portable, DType::f32,
                 OptimizerKind::rowwise_adagrad, 0.0, false, true});
    v.push_back({"", pg::SortMethod::automatic, DType::f32, OptimizerKind::sgd, 0.0, false, true});
    v.push_back(
        {"", pg::SortMethod::automatic, DType::f32, OptimizerKind::adagrad, 0.0, false, true});
    v.push_back({"", pg::SortMethod::automatic, DType::f16, OptimizerKind::rowwise_adagrad, 0.0,
                 true, true});
    v.push_back({"", pg::SortMethod::automatic, DType::bf16, OptimizerKind::rowwise_adagrad, 0.0,
                 true, true});
    run_set(o, set, v, 4, "");
  }
}

void case_mlperf(const Options& o) {
  const parity::ModelSpec spec = parity::load_model_spec(o.model);
  std::vector<std::int64_t> rows;
  std::vector<int> pooling;
  for (const auto& t : spec.tables) {
    rows.push_back(std::max<std::int64_t>(1, static_cast<std::int64_t>(t.rows * o.scale)));
    pooling.push_back(t.pooling_size);
  }
  const std::int64_t batch =
      static_cast<std::int64_t>(spec.batch_size * std::min(1.0, o.scale * 10));
  TableSet set = make_set(fmt::format("mlperf-dlrmv2 26 tables, batch {}", batch), rows, pooling,
                          spec.tables[0].dim, batch, DType::f32);
  const double gb = (set.weight_elems * 4.0 + set.rowwise_state * 4.0) / 1e9;
  const auto [free_b, total_b] = pg::memory_info();
  std::printf("  mlperf: %lld rows, %.1f GB weights + rowwise state; %.1f GB free of %.1f GB\n",
              static_cast<long long>(set.rowwise_state), gb, free_b / 1e9, total_b / 1e9);
  std::vector<Variant> v = {{"", pg::SortMethod::automatic, DType::f32,
                             OptimizerKind::rowwise_adagrad, 0.0, true, true, o.bwd_vecs}};
  run_set(o, set, v, 2, "mlperf");
}

// Any model's tables as they are (dims, pooling, id distributions, storage type), rows capped at
// --max-rows, at the model's batch (or --batch): the whole set in one launch as the engine runs
// it, then each class of tables of one shape (dim, pooling, distribution) alone, so that a slow
// shape shows by itself.
void case_model(const Options& o) {
  const parity::ModelSpec spec = parity::load_model_spec(o.model);
  const std::int64_t batch = o.batch > 0 ? o.batch : spec.batch_size;
  const DType dtype = o.dtype_set ? o.dtype : spec.tables[0].dtype;
  const OptimizerKind kind = spec.embedding_optimizer.kind;
  struct Class {
    int dim, pooling;
    double zipf;
    std::vector<int> members;
  };
  std::vector<Class> classes;
  std::vector<std::int64_t> rows;
  std::vector<int> pooling, dims;
  std::vector<double> zipf;
  for (std::size_t i = 0; i < spec.tables.size(); ++i) {
    const auto& t = spec.tables[i];
    rows.push_back(std::min(t.rows, o.max_rows));
    pooling.push_back(t.pooling_size);
    dims.push_back(t.dim);
    const double a = t.distribution == parity::IdDistribution::zipf ? t.zipf_alpha : 0.0;
    zipf.push_back(a);
    auto it = std::find_if(classes.begin(), classes.end(), [&](const Class& c) {
      return c.dim == t.dim && c.pooling == t.pooling_size && c.zipf == a;
    });
    if (it == classes.end()) {
      classes.push_back({t.dim, t.pooling_size, a, {}});
      it = classes.end() - 1;
    }
    it->members.push_back(static_cast<int>(i));
  }
  const auto subset = [&](const std::string& name, const std::vector<int>& members) {
    std::vector<std::int64_t> r;
    std::vector<int> p, d;
    for (int m : members) {
      r.push_back(rows[m]);
      p.push_back(pooling[m]);
      d.push_back(dims[m]);
    }
    TableSet set = make_set(name, r, p, d, batch, dtype);
    for (std::size_t k = 0; k < members.size(); ++k) set.zipf[k] = zipf[members[k]];
    return set;
  };
  std::vector<int> all(spec.tables.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  const std::vector<Variant> v = {
      {"", pg::SortMethod::automatic, dtype, kind, 0.0, true, true, o.bwd_vecs}};
  std::printf("  %s: %zu tables in %zu shapes, rows capped at %lld, batch %lld, %s tables, %s\n",
              spec.name.c_str(), spec.tables.size(), classes.size(),
              static_cast<long long>(o.max_rows), static_cast<long long>(batch),
              std::string(parity::dtype_name(dtype)).c_str(),
              std::string(parity::optimizer_name(kind)).c_str());
  run_set(o, subset(spec.name + " all", all), v, 2, "");
  if (classes.size() < 2) return;
  for (const auto& c : classes) {
    run_set(o,
            subset(fmt::format("{} x{} dim {} pool {}{}", spec.name, c.members.size(), c.dim,
                               c.pooling, c.zipf > 0 ? fmt::format(" zipf {}", c.zipf) : ""),
                   c.members),
            v, 2, "");
  }
}

// The backward's calibration, measured: one table at a time over dims, ids a bag and id
// distributions, batch 65,536, rowwise Adagrad. The model (embedding_backward_seconds and
// embedding_backward_fixed_seconds) is linear in five constants: a fixed cost, a fixed cost of the
// heavy-row stages where any row is heavy, seconds per byte of memory traffic, seconds per byte of
// a 16-bit table's distinct rows, and seconds per id in a heavy row. The tables are fp32 and fp16.
// They are fitted to these cases by least squares on relative error and printed as calibration
// lines, with each case's time under the fitted values and under the calibration the run read.
void case_pooling(const Options& o) {
  const std::int64_t rows = static_cast<std::int64_t>(10'000'000 * o.scale);
  const std::int64_t batch = static_cast<std::int64_t>(65536 * std::min(1.0, o.scale * 10));
  const std::size_t first = g_results.size();
  for (int dim : {64, 128, 256}) {
    for (int pool : {1, 4, 16, 64, 200}) {
      for (double zipf : {0.0, 1.1}) {
        const TableSet set =
            make_set(fmt::format("{}M x {}, {} x {}{}", rows / 1'000'000, dim, batch, pool,
                                 zipf > 0 ? fmt::format(" zipf{}", zipf) : std::string(" uniform")),
                     {rows}, {pool}, dim, batch, DType::f32);
        std::vector<Variant> v;
        for (DType w : {DType::f32, DType::f16})
          v.push_back(
              {"", pg::SortMethod::automatic, w, OptimizerKind::rowwise_adagrad, zipf, true, true});
        run_set(o, set, v, 2, "");
      }
    }
  }
  // Fixed, heavy fixed, per byte (all but 16-bit rows), per byte of 16-bit rows, per heavy id.
  constexpr int kTerms = 5;
  const auto terms = [](const Result& r) {
    return std::array<double, kTerms>{1.0, r.heavy_ids > 0 ? 1.0 : 0.0,
                                      r.narrow ? r.bytes - r.row_bytes : r.bytes,
                                      r.narrow ? r.row_bytes : 0.0, r.heavy_ids};
  };
  // Normal equations of the rows weighted by 1/t, solved by Gaussian elimination.
  double m[kTerms][kTerms + 1] = {};
  int used = 0;
  for (std::size_t i = first; i < g_results.size(); ++i) {
    const Result& r = g_results[i];
    if (r.pass != "backward") continue;
    const auto a = terms(r);
    for (int p = 0; p < kTerms; ++p) {
      for (int q = 0; q < kTerms; ++q) m[p][q] += a[p] * a[q] / (r.ms * r.ms);
      m[p][kTerms] += a[p] / r.ms;
    }
    ++used;
  }
  for (int p = 0; p < kTerms; ++p) {
    if (!(std::abs(m[p][p]) > 0)) {
      std::printf("  fit: singular (no case exercises term %d)\n", p);
      return;
    }
    for (int q = kTerms; q >= p; --q) m[p][q] /= m[p][p];
    for (int r = 0; r < kTerms; ++r) {
      if (r == p) continue;
      const double f = m[r][p];
      for (int q = p; q <= kTerms; ++q) m[r][q] -= f * m[p][q];
    }
  }
  std::array<double, kTerms> c{};
  for (int p = 0; p < kTerms; ++p) c[p] = m[p][kTerms];
  double worst = 0, sum2 = 0;
  for (std::size_t i = first; i < g_results.size(); ++i) {
    const Result& r = g_results[i];
    if (r.pass != "backward") continue;
    const auto a = terms(r);
    double fitted = 0;
    for (int p = 0; p < kTerms; ++p) fitted += c[p] * a[p];
    const double err = fitted / r.ms - 1;
    worst = std::max(worst, std::abs(err));
    sum2 += err * err;
    std::printf("  %-44s measured %8.3f ms, fitted %8.3f (%+5.1f%%), calibration read %8.3f\n",
                r.name.c_str(), r.ms, fitted, 100 * err, r.predicted_ms);
  }
  const double copy = g_model.device.hbm_bandwidth.value * g_model.cal.hbm_efficiency;
  std::printf("  fit over %d backward cases: worst %.1f%%, rms %.1f%%\n", used, 100 * worst,
              100 * std::sqrt(sum2 / used));
  if (c[2] > 0 && c[3] > 0)
    std::printf(
        "  calibration lines:\n    embedding_backward_efficiency: %.3f\n"
        "    embedding_update_efficiency_16bit: %.3f\n"
        "    embedding_backward_fixed_s: %.3g\n    embedding_heavy_fixed_s: %.3g\n"
        "    embedding_heavy_lookup_s: %.3g\n",
        1e3 / (c[2] * copy), 1e3 / (c[3] * copy), std::max(0.0, c[0]) * 1e-3,
        std::max(0.0, c[1]) * 1e-3, std::max(0.0, c[4]) * 1e-3);
  std::fflush(stdout);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

void write_results(const Options& o) {
  if (o.results.empty()) return;
  std::ofstream f(o.results);
  const auto& d = pg::device_info();
  f << "{\"device\": \"" << d.name << "\", \"copy_gbps\": " << g_copy_gbps << ", \"results\": [\n";
  for (std::size_t i = 0; i < g_results.size(); ++i) {
    const auto& r = g_results[i];
    f << (i ? ",\n" : "") << "  {\"name\": \"" << r.name << "\", \"pass\": \"" << r.pass
      << "\", \"tag\": \"" << r.tag << "\", \"ms\": " << r.ms << ", \"bytes\": " << r.bytes
      << ", \"gbps\": " << r.gbps() << "}";
  }
  f << "\n]}\n";
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "embedding_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--cases")
      o.cases = split(next());
    else if (a == "--reps")
      o.reps = std::stoi(next());
    else if (a == "--warmup")
      o.warmup = std::stoi(next());
    else if (a == "--dump")
      o.dump_dir = next();
    else if (a == "--results")
      o.results = next();
    else if (a == "--model")
      o.model = next();
    else if (a == "--scale")
      o.scale = std::stod(next());
    else if (a == "--max-rows")
      o.max_rows = std::stoll(next());
    else if (a == "--batch")
      o.batch = std::stoll(next());
    else if (a == "--dtype") {
      const std::string t = next();
      o.dtype_set = true;
      o.dtype = t == "f16" ? DType::f16 : t == "bf16" ? DType::bf16 : DType::f32;
      if (t != "f16" && t != "bf16" && t != "f32") {
        std::fprintf(stderr, "embedding_bench: --dtype %s: expected f32, f16 or bf16\n", t.c_str());
        return 2;
      }
    } else if (a == "--sort")
      o.sort = next() == "portable" ? pg::SortMethod::portable : pg::SortMethod::vendor;
    else if (a == "--grad-dtype") {
      const std::string t = next();
      if (t != "f32" && t != "bf16") {
        std::fprintf(stderr, "embedding_bench: --grad-dtype %s: expected f32 or bf16\n", t.c_str());
        return 2;
      }
      o.grad_dtype = t == "bf16" ? DType::bf16 : DType::f32;
    } else if (a == "--device") {
      o.device = next();
    } else if (a == "--calibration") {
      o.calibration = next();
    } else if (a == "--configs") {
      o.configs = next();
    } else if (a == "--bwd-vecs") {
      o.bwd_vecs.clear();
      for (const auto& x : split(next())) o.bwd_vecs.push_back(std::stoi(x));
    } else {
      std::fprintf(
          stderr,
          "usage: embedding_bench [--cases single,variants,mlperf,model,pooling] [--reps N] "
          "[--warmup N] [--dump DIR]\n"
          "                       [--device KEY] [--calibration FILE] [--configs DIR]\n"
          "                       [--results FILE] [--model YAML] [--scale X] [--sort "
          "vendor|portable]\n"
          "                       [--bwd-vecs 0,1,2,4] [--grad-dtype f32|bf16]\n"
          "                       [--max-rows N] [--batch N] [--dtype f32|f16|bf16]\n");
      return 2;
    }
  }
  if (pg::device_count() == 0) {
    std::fprintf(stderr, "embedding_bench: %s\n", pg::no_device_reason().c_str());
    return 3;
  }
  try {
    const std::filesystem::path configs = o.configs;
    g_model.device = parity::find_device(o.device, configs / "devices");
    g_model.cal = o.calibration.empty() ? parity::calibration_for(g_model.device, configs)
                                        : parity::load_calibration(o.calibration, g_model.device);
    const auto& d = pg::device_info();
    std::printf(
        "embedding_bench on %s (%d SMs, warp %d, L2 %lld MB, %.1f GB), median of %d runs after %d "
        "warm-up; the model's times for device spec '%s' (--device) with %s\n",
        d.name.c_str(), d.multiprocessor_count, d.warp_size,
        static_cast<long long>(d.l2_cache_bytes >> 20), d.total_memory_bytes / 1e9, o.reps,
        o.warmup, g_model.device.name.c_str(), g_model.cal.source.c_str());
    measure_copy(o);
    for (const auto& c : o.cases) {
      if (c == "single")
        case_single(o, false);
      else if (c == "variants")
        case_single(o, true);
      else if (c == "mlperf")
        case_mlperf(o);
      else if (c == "model")
        case_model(o);
      else if (c == "pooling")
        case_pooling(o);
      else
        throw parity::InputError("embedding_bench: unknown case '" + c +
                                 "' (single, variants, mlperf, model, pooling)");
    }
    write_results(o);
  } catch (const std::exception& e) {
    write_results(o);
    std::fprintf(stderr, "embedding_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
