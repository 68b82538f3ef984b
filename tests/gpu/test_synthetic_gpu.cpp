// Synthetic batches made on the GPU (Backend::make_synthetic) against the host generator
// (SyntheticData::make): ids, offsets, dense features and labels bit for bit, on models that take
// every path of the generator (uniform and Zipf tables, sum and mean pooling, empty bags, tables
// of 10^12 rows, no dense features, MLPerf's pooling sizes), outputs poisoned first.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backend/gpu/gpu_backend.h"
#include "gpu_test_util.h"
#include "parity/data.h"

namespace parity::gpu::test {
namespace {

TableSpec table(std::int64_t rows, int pooling, double zipf_alpha = 0.0,
                Pooling pool = Pooling::sum) {
  static int n = 0;
  TableSpec t;
  t.name = "t" + std::to_string(n++);
  t.rows = rows;
  t.dim = 16;
  t.pooling_size = pooling;
  t.pooling = pool;
  t.distribution = zipf_alpha > 0 ? IdDistribution::zipf : IdDistribution::uniform;
  t.zipf_alpha = zipf_alpha;
  return t;
}

ModelSpec model(std::string name, int dense, std::vector<TableSpec> tables) {
  ModelSpec m;
  m.name = std::move(name);
  m.dense_features = dense;
  m.tables = std::move(tables);
  m.bottom_mlp = {16};
  m.top_mlp = {16, 1};
  m.batch_size = 1024;
  return m;
}

template <class T>
std::vector<T> download(Backend& be, const Buffer& b, std::size_t n) {
  std::vector<T> v(n);
  be.copy_to_host(v.data(), b.get(), n * sizeof(T));
  return v;
}

// Makes examples [first, first + count) of a split on the GPU and on the host; expects every
// bit equal.
void expect_same_batch(const ModelSpec& m, std::uint64_t seed, Split split, std::int64_t first,
                       std::int64_t count) {
  const SyntheticData data(m, seed);
  Batch want;
  data.make(split, first, count, want);

  GpuBackend gpu;
  const auto block = data.generator();
  Buffer gen(gpu, block.size());
  gpu.copy_to_device(gen.get(), block.data(), block.size());
  const std::size_t nd = static_cast<std::size_t>(count * m.dense_features);
  const std::size_t nids = static_cast<std::size_t>(count * data.ids_per_example());
  const std::size_t noff = static_cast<std::size_t>(count * m.num_tables() + 1);
  Buffer dense(gpu, std::max<std::size_t>(nd, 1) * 4), labels(gpu, count * 4),
      ids(gpu, std::max<std::size_t>(nids, 1) * 8), offsets(gpu, noff * 8),
      work(gpu, std::max<std::size_t>(SyntheticBatch::workspace_bytes(m.num_tables(), count), 8));
  // Poison: all bits set (NaN floats, id -1).
  for (const Buffer* b : {&dense, &labels, &ids, &offsets}) {
    const std::vector<unsigned char> ones(b->bytes(), 0xff);
    gpu.copy_to_device(b->get(), ones.data(), ones.size());
  }
  SyntheticBatch sb;
  sb.generator = gen.get();
  sb.num_dense = m.dense_features;
  sb.num_tables = m.num_tables();
  sb.ids_per_example = data.ids_per_example();
  sb.split = split == Split::train ? 0 : 1;
  sb.first = first;
  sb.count = count;
  sb.dense = dense.as<float>();
  sb.labels = labels.as<float>();
  sb.ids = ids.as<std::int64_t>();
  sb.offsets = offsets.as<std::int64_t>();
  sb.workspace = work.get();
  gpu.synchronize();  // the uploads and poison ran on the compute queue, the kernels run beside it
  gpu.begin_input(0);
  gpu.make_synthetic(sb);
  gpu.end_input(0);
  gpu.synchronize();

  const std::string what = m.name + " seed " + std::to_string(seed) + " first " +
                           std::to_string(first) + " count " + std::to_string(count);
  const auto got_ids = download<std::int64_t>(gpu, ids, nids);
  std::size_t bad_ids = 0;
  for (std::size_t i = 0; i < nids; ++i) bad_ids += got_ids[i] != want.ids[i];
  EXPECT_EQ(bad_ids, 0u) << what << ": ids differ (of " << nids << ")";
  EXPECT_EQ(download<std::int64_t>(gpu, offsets, noff), want.offsets) << what;
  const auto got_dense = download<float>(gpu, dense, nd);
  EXPECT_EQ(std::memcmp(got_dense.data(), want.dense.data(), nd * 4), 0) << what << ": dense";
  const auto got_labels = download<float>(gpu, labels, static_cast<std::size_t>(count));
  std::size_t bad_labels = 0;
  for (std::size_t i = 0; i < got_labels.size(); ++i)
    bad_labels += std::memcmp(&got_labels[i], &want.labels[i], 4) != 0;
  EXPECT_EQ(bad_labels, 0u) << what << ": labels differ (of " << count << ")";
}

TEST(SyntheticGpu, SmallModelIsBitIdentical) {
  PARITY_REQUIRE_GPU();
  const ModelSpec m = model(
      "small", 13,
      {table(50, 1), table(120, 2, 1.1), table(300, 3, 0.0, Pooling::mean), table(777, 1, 0.8),
       table(1000, 4), table(2048, 2, 1.2, Pooling::mean), table(3333, 1), table(5000, 3, 1.0)});
  expect_same_batch(m, 1, Split::train, 0, 1000);
  expect_same_batch(m, 7, Split::train, 123457, 777);
  expect_same_batch(m, 7, Split::eval, 5, 3);
}

// Huge tables (uniform ids over 10^12 rows, Zipf over 4e9 with alpha at 1 and far from it), an
// empty bag, long bags, no dense features (so no dense x table terms).
TEST(SyntheticGpu, HugeTablesEmptyBagsAndNoDenseAreBitIdentical) {
  PARITY_REQUIRE_GPU();
  const ModelSpec m =
      model("huge", 0,
            {table(1'000'000'000'000, 5), table(4'000'000'000, 3, 1.0), table(10, 0),
             table(4'000'000'000, 50, 0.6, Pooling::mean), table(1, 2), table(70'000'000, 7, 3.5)});
  expect_same_batch(m, 3, Split::train, 0, 4096);
  expect_same_batch(m, 3, Split::eval, 1'000'000'000, 1000);
}

// MLPerf DLRMv2's pooling sizes (214 ids an example) over tables of up to 40M rows: 1.75M ids, so
// the generator's rare paths (the ziggurat's wedges and tail, Zipf rejections) are taken
// thousands of times.
TEST(SyntheticGpu, MlperfPoolingIsBitIdentical) {
  PARITY_REQUIRE_GPU();
  const int pooling[] = {3, 2, 1, 2, 6, 1, 1,  1,   1,  7,  3, 8, 1,
                         6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1};
  std::vector<TableSpec> tables;
  for (int t = 0; t < 26; ++t)
    tables.push_back(
        table(t % 3 == 0 ? 40'000'000 : 3'000'000 + t, pooling[t], t % 2 == 0 ? 1.05 : 0.0));
  const ModelSpec m = model("mlperf-like", 13, tables);
  expect_same_batch(m, 11, Split::train, 65536 * 3, 8192);
}

}  // namespace
}  // namespace parity::gpu::test
