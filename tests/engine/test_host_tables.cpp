// Host-placed tables (TableSpec::host_placed, engine/host_tables.h) on every backend: a model with
// tables in host memory, cached in part, in whole or not at all, trains exactly as the same model
// with every table in backend memory (every loss and every tensor equal, bit for bit, for each
// table optimizer and storage type, across the cache refreshes at steps 4 and 16); the counted
// lookups and hits are right; the cache learns the hot rows of a Zipf table; and a model resumed
// from another's tensors continues exactly.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "backends.h"
#include "engine/host_tables.h"
#include "micro_model.h"
#include "parity/data.h"
#include "parity/engine.h"
#include "parity/error.h"

namespace parity {
namespace {

// Tables of different dims (vector and scalar paths on a GPU): t0 uniform, t1 Zipf over 300
// rows, t2 tiny and heavily pooled, t3 of dim 128 with 80 ids a bag over 10 rows (every row a
// heavy row of the GPU backward: more than 64 occurrences a batch, summed in chunks).
ModelSpec spec_for(OptimizerKind opt, bool narrow) {
  ModelSpec m = testing::micro_model(InteractionKind::dcnv2, opt, OptimizerKind::adam, 0.05);
  m.tables.push_back(m.tables[0]);
  m.tables[3].name = "t3";
  m.tables[3].pooling = Pooling::mean;  // 80 rows summed would make SGD diverge
  const std::int64_t rows[] = {40, 300, 9, 10};
  const int dims[] = {8, 6, 16, 128};
  const int pool[] = {2, 3, 4, 80};
  for (int t = 0; t < 4; ++t) {
    m.tables[t].rows = rows[t];
    m.tables[t].dim = dims[t];
    m.tables[t].pooling_size = pool[t];
  }
  // The host rows' state starts at Adagrad's initial accumulator, as the backend's does.
  if (opt != OptimizerKind::sgd) m.embedding_optimizer.initial_accumulator = 0.01;
  if (narrow) {
    m.tables[0].dtype = DType::f16;
    m.tables[1].dtype = DType::bf16;
  }
  return m;
}

ModelSpec placed(ModelSpec m) {
  const std::int64_t cache[] = {0, 100, 9, 4};  // none, a third, all, some heavy rows
  for (int t = 0; t < 4; ++t) {
    m.tables[t].host_placed = true;
    m.tables[t].cache_rows = cache[t];
  }
  return m;
}

std::vector<std::vector<std::uint8_t>> all_bytes(Backend& be, Model& m) {
  std::vector<std::vector<std::uint8_t>> out;
  for (const TensorRef& t : m.tensors()) out.push_back(testing::host_bytes(be, t));
  return out;
}

class HostTablesTest
    : public ::testing::TestWithParam<std::tuple<std::string, OptimizerKind, bool>> {
 protected:
  void SetUp() override { PARITY_REQUIRE_BACKEND(std::get<0>(GetParam())); }
};

TEST_P(HostTablesTest, TrainExactlyAsInBackendMemory) {
  const auto& [name, opt, narrow] = GetParam();
  auto be = make_backend(name);
  const ModelSpec ref_spec = spec_for(opt, narrow);
  const ModelSpec host_spec = placed(ref_spec);
  constexpr std::int64_t kBatch = 16;
  Model ref(ref_spec, *be, kBatch, 5), host(host_spec, *be, kBatch, 5);
  // The host rows start as the backend-memory model's, and the caches hold their values.
  ASSERT_EQ(all_bytes(*be, ref), all_bytes(*be, host));
  int states = 0;
  for (const TensorRef& t : host.tensors()) {
    if (t.name.rfind("optimizer.embedding.", 0) != 0) continue;
    const auto bytes = testing::host_bytes(*be, t);
    for (std::size_t i = 0; i < bytes.size(); i += 4) {
      float v;
      std::memcpy(&v, bytes.data() + i, 4);
      ASSERT_EQ(v, 0.01f) << t.name;
    }
    ++states;
  }
  EXPECT_EQ(states, opt == OptimizerKind::sgd ? 0 : 4);
  EXPECT_GT(host.host_resident_bytes(), 0u);
  EXPECT_GT(host.allocated_bytes_by_category().at("embedding_cache_maps"), 0u);

  SyntheticData data(ref_spec, 11);
  std::vector<Batch> batches(20);
  for (std::size_t k = 0; k < batches.size(); ++k)
    data.batch(Split::train, static_cast<std::int64_t>(k) * kBatch, kBatch, batches[k]);
  std::vector<std::vector<std::uint8_t>> at_ten;
  for (std::size_t k = 0; k < batches.size(); ++k) {
    ref.train_step(batches[k]);
    host.train_step(batches[k]);
    ASSERT_EQ(ref.last_loss(), host.last_loss()) << "step " << k + 1;
    if (k + 1 == 10) at_ten = all_bytes(*be, host);
  }
  const auto ra = all_bytes(*be, ref), ha = all_bytes(*be, host);
  const auto names = ref.tensors();
  for (std::size_t i = 0; i < ra.size(); ++i) ASSERT_EQ(ra[i], ha[i]) << names[i].name;

  // Lookups counted since the refresh at step 16 (steps 17..20), and their hits.
  const auto stats = host.cache_stats();
  ASSERT_EQ(stats.size(), 4u);
  for (int t = 0; t < 4; ++t) {
    std::uint64_t lookups = 0;
    for (std::size_t k = 16; k < 20; ++k)
      lookups += static_cast<std::uint64_t>(batches[k].offsets[(t + 1) * kBatch] -
                                            batches[k].offsets[t * kBatch]);
    EXPECT_EQ(stats[t].lookups, lookups) << stats[t].table;
    EXPECT_EQ(stats[t].table, ref_spec.tables[t].name);
  }
  EXPECT_EQ(stats[0].hits, 0u);                // nothing cached
  EXPECT_EQ(stats[2].hits, stats[2].lookups);  // everything cached
  // The Zipf table's third most looked-up rows take most lookups; rows [0, 100), where the cache
  // started, would take about a third (the generator scatters the hot rows).
  EXPECT_GT(static_cast<double>(stats[1].hits), 0.6 * static_cast<double>(stats[1].lookups));

  // Resume: a fresh model given the tensors of step 10 (its initial ones are step 0's) continues
  // exactly.
  Model resumed(host_spec, *be, kBatch, 5);  // the seed keys the stochastic rounding
  const auto tensors = resumed.tensors();
  for (std::size_t i = 0; i < tensors.size(); ++i)
    be->copy_to_device(tensors[i].data, at_ten[i].data(), at_ten[i].size());
  resumed.tensors_written();
  resumed.set_step(10);
  Model again(ref_spec, *be, kBatch, 5);
  for (std::size_t k = 0; k < batches.size(); ++k) {
    again.train_step(batches[k]);
    if (k >= 10) {
      resumed.train_step(batches[k]);
      ASSERT_EQ(again.last_loss(), resumed.last_loss()) << "step " << k + 1;
    }
  }
  const auto rb = all_bytes(*be, resumed);
  for (std::size_t i = 0; i < ra.size(); ++i) ASSERT_EQ(ra[i], rb[i]) << names[i].name;

  // The tensors asked for twice write the caches back once: values written into the host rows
  // in between (a checkpoint being loaded) stay, and tensors_written() gives them to the caches.
  std::size_t w1 = 0;
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i].name == "embedding.t1.weight") w1 = i;
  const TensorRef t1 = host.tensors()[w1];
  std::vector<std::uint8_t> pattern(t1.bytes());
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::uint8_t>(i * 7);
  be->copy_to_device(t1.data, pattern.data(), pattern.size());
  ASSERT_EQ(testing::host_bytes(*be, host.tensors()[w1]), pattern);
  host.tensors_written();
  ASSERT_EQ(testing::host_bytes(*be, host.tensors()[w1]), pattern);
}

std::string param_name(
    const ::testing::TestParamInfo<std::tuple<std::string, OptimizerKind, bool>>& info) {
  const auto& [name, opt, narrow] = info.param;
  return fmt::format("{}_{}_{}", name, optimizer_name(opt), narrow ? "narrow" : "fp32");
}

INSTANTIATE_TEST_SUITE_P(Backends, HostTablesTest,
                         ::testing::Combine(::testing::ValuesIn(testing::engine_backends()),
                                            ::testing::Values(OptimizerKind::sgd,
                                                              OptimizerKind::rowwise_adagrad,
                                                              OptimizerKind::adagrad),
                                            ::testing::Bool()),
                         param_name);

// A cache larger than its table, or a table too large for 32-bit cache slots, is refused by name.
TEST(HostTables, RefusesBadCacheSizes) {
  auto be = make_backend("cpu");
  ModelSpec m = placed(spec_for(OptimizerKind::sgd, false));
  m.tables[1].cache_rows = 301;
  try {
    Model model(m, *be, 8, 1);
    FAIL() << "not refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("table 't1': cache_rows 301 is outside [0, 300]"),
              std::string::npos)
        << e.what();
  }
}

// The cache's choice against its definition (every row ordered by count, then cached first, then
// by row; the first `keep`), on counts that tie at one value (the usual case: most rows never
// looked up), spread over many values, and past the histogram's range.
TEST(HostTables, ChoiceOfCachedRowsIsItsDefinition) {
  std::mt19937_64 g(7);
  for (const std::uint32_t spread : {1u, 5u, 300u, 200000u})
    for (int trial = 0; trial < 6; ++trial) {
      const std::size_t rows = 1 + g() % 5000;
      std::vector<std::uint32_t> counts(rows), slot(rows, TableLayout::kNotCached);
      for (auto& c : counts) c = g() % 3 == 0 ? 0 : static_cast<std::uint32_t>(g() % spread);
      std::vector<std::uint32_t> order(rows);
      std::iota(order.begin(), order.end(), 0u);
      std::shuffle(order.begin(), order.end(), g);
      const std::size_t cached = g() % (rows + 1);
      for (std::size_t i = 0; i < cached; ++i) slot[order[i]] = static_cast<std::uint32_t>(i);
      const auto keep = static_cast<std::int64_t>(g() % (rows + 1));

      std::vector<std::uint32_t> ref(rows);
      std::iota(ref.begin(), ref.end(), 0u);
      std::sort(ref.begin(), ref.end(), [&](std::uint32_t a, std::uint32_t b) {
        if (counts[a] != counts[b]) return counts[a] > counts[b];
        const bool ca = slot[a] != TableLayout::kNotCached, cb = slot[b] != TableLayout::kNotCached;
        if (ca != cb) return ca;
        return a < b;
      });
      std::vector<std::uint8_t> want(rows, 0);
      for (std::int64_t i = 0; i < keep; ++i) want[ref[static_cast<std::size_t>(i)]] = 1;
      EXPECT_EQ(engine::choose_cache_rows(counts, slot, keep), want)
          << "rows " << rows << ", spread " << spread << ", keep " << keep << ", cached " << cached;
    }
}

}  // namespace
}  // namespace parity
