// The analytical model's terms against hand-computed values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "parity/embedding_kernels.h"
#include "parity/error.h"
#include "parity/perf.h"

namespace parity {
namespace {
namespace fs = std::filesystem;

DeviceSpec h200() {
  return find_device("h200", fs::path(PARITY_SOURCE_DIR) / "configs/devices");
}
DeviceSpec mi350x() {
  return find_device("mi350x", fs::path(PARITY_SOURCE_DIR) / "configs/devices");
}

TEST(Gemm, RooflineWithTileAndWaveQuantization) {
  const DeviceSpec d = h200();  // 132 SMs, bf16 989 TFLOP/s, 4.8 TB/s
  const Calibration c = default_calibration(d);
  // 8192^3 bf16 with 128x256 tiles: 64 x 32 = 2048 tiles in ceil(2048/132) = 16 waves;
  // a wave is 132 tiles of 2*128*256*8192 flops at 989e12 * eff.
  const GemmEstimate e = gemm_time({8192, 8192, 8192, DenseMath::bf16}, {128, 256, 1}, d, c);
  const double peak = 989e12 * c.gemm_efficiency_bf16;
  EXPECT_DOUBLE_EQ(e.waves, 16);
  EXPECT_NEAR(e.compute_s, 16 * 132 * (2.0 * 128 * 256 * 8192) / peak, 1e-12);
  EXPECT_NEAR(e.memory_s, 3.0 * 8192 * 8192 * 2 / (4.8e12 * c.hbm_efficiency), 1e-12);
  EXPECT_NEAR(e.seconds, e.compute_s + c.kernel_launch_s, 1e-12);  // compute bound
  EXPECT_DOUBLE_EQ(e.flops, 2.0 * 8192 * 8192 * 8192);

  // Tile quantization: m = 129 pads to two 128-row tiles, as expensive as m = 256.
  const auto a = gemm_time({129, 256 * 132, 4096, DenseMath::bf16}, {128, 256, 1}, d, c);
  const auto b = gemm_time({256, 256 * 132, 4096, DenseMath::bf16}, {128, 256, 1}, d, c);
  EXPECT_DOUBLE_EQ(a.compute_s, b.compute_s);
  // Wave quantization: 133 tiles need two waves, twice the compute of 132.
  const auto w1 = gemm_time({128, 256 * 132, 4096, DenseMath::bf16}, {128, 256, 1}, d, c);
  const auto w2 = gemm_time({128, 256 * 133, 4096, DenseMath::bf16}, {128, 256, 1}, d, c);
  EXPECT_DOUBLE_EQ(w1.waves, 1);
  EXPECT_DOUBLE_EQ(w2.waves, 2);
  EXPECT_NEAR(w2.compute_s, 2 * w1.compute_s, 1e-15);
}

TEST(Gemm, BestIsTheFastestCandidateAndDeterministic) {
  const DeviceSpec d = h200();
  const Calibration c = default_calibration(d);
  const GemmShape s{65536, 1, 256, DenseMath::bf16};
  const GemmEstimate best = gemm_best(s, d, c);
  for (const auto& t : gemm_candidates(d, s.math))
    EXPECT_LE(best.seconds, gemm_time(s, t, d, c).seconds);
  EXPECT_EQ(gemm_best(s, d, c).tile.m, best.tile.m);
  EXPECT_EQ(gemm_best(s, d, c).tile.n, best.tile.n);
  // A skinny product is memory bound.
  EXPECT_GT(best.memory_s, best.compute_s);
}

TEST(Gemm, Tf32OnADeviceWithoutItThrows) {
  DeviceSpec d = mi350x();
  d.tf32_emulation = Tf32Emulation::none;  // no TF32 units, no emulation
  EXPECT_THROW(gemm_best({1024, 1024, 1024, DenseMath::tf32}, d, default_calibration(d)), Error);
}

TEST(Embedding, UniqueRowsUniformIsExact) {
  EXPECT_DOUBLE_EQ(expected_unique_rows(1, IdDistribution::uniform, 0, 100), 1.0);
  EXPECT_NEAR(expected_unique_rows(100, IdDistribution::uniform, 0, 50),
              100 * (1 - std::pow(0.99, 50)), 1e-9);
  EXPECT_NEAR(expected_unique_rows(40000000, IdDistribution::uniform, 0, 65536.0 * 3),
              40000000 * (1 - std::pow(1 - 1 / 4e7, 65536.0 * 3)), 1e-3);
  EXPECT_DOUBLE_EQ(expected_unique_rows(100, IdDistribution::uniform, 0, 0), 0.0);
}

// Zipf: against the exact Poisson sum over every rank.
double exact_zipf_unique(std::int64_t rows, double alpha, double n) {
  double h = 0;
  for (std::int64_t k = 1; k <= rows; ++k) h += std::pow(static_cast<double>(k), -alpha);
  double u = 0;
  for (std::int64_t k = 1; k <= rows; ++k)
    u += -std::expm1(-n * std::pow(static_cast<double>(k), -alpha) / h);
  return u;
}

TEST(Embedding, UniqueRowsZipfMatchesTheExactSum) {
  for (double alpha : {0.8, 1.0, 1.2}) {
    for (std::int64_t rows : {500, 200000, 2000000}) {
      const double n = 65536.0 * 4;
      const double exact = exact_zipf_unique(rows, alpha, n);
      EXPECT_NEAR(expected_unique_rows(rows, IdDistribution::zipf, alpha, n), exact, 0.01 * exact)
          << "alpha " << alpha << " rows " << rows;
    }
  }
  // Zipf concentrates draws: fewer distinct rows than uniform.
  EXPECT_LT(expected_unique_rows(1000000, IdDistribution::zipf, 1.1, 1e5),
            expected_unique_rows(1000000, IdDistribution::uniform, 0, 1e5));
}

TEST(Embedding, HotFraction) {
  EXPECT_DOUBLE_EQ(hot_fraction(1000, IdDistribution::uniform, 0, 250), 0.25);
  double top = 0, all = 0;
  for (int k = 1; k <= 1000; ++k) {
    all += std::pow(k, -1.2);
    if (k <= 10) top += std::pow(k, -1.2);
  }
  // Exact head of 64 ranks, Euler-Maclaurin tail: agrees with the full sum to ~1e-10.
  EXPECT_NEAR(hot_fraction(1000, IdDistribution::zipf, 1.2, 10), top / all, 1e-9);
  EXPECT_DOUBLE_EQ(hot_fraction(1000, IdDistribution::zipf, 1.2, 5000), 1.0);
}

// Ids in heavy rows (more than kEmbeddingHeavyRow ids a row), counted on drawn ids: Zipf by the
// inverse of its cumulative distribution, uniform by index, against expected_heavy_ids.
TEST(Embedding, HeavyIdsMatchTheCountOnDrawnIds) {
  std::mt19937_64 rng(7);
  const auto count_heavy = [&](std::int64_t rows, double alpha, std::int64_t draws) {
    std::vector<double> cdf(static_cast<std::size_t>(rows));
    double total = 0;
    for (std::int64_t k = 0; k < rows; ++k)
      cdf[static_cast<std::size_t>(k)] = total += alpha > 0 ? std::pow(k + 1.0, -alpha) : 1.0;
    std::uniform_real_distribution<double> u(0, total);
    std::vector<std::int64_t> count(static_cast<std::size_t>(rows), 0);
    for (std::int64_t i = 0; i < draws; ++i) {
      const auto it = std::upper_bound(cdf.begin(), cdf.end(), u(rng));
      ++count[static_cast<std::size_t>(std::min<std::ptrdiff_t>(it - cdf.begin(), rows - 1))];
    }
    double heavy = 0;
    for (const std::int64_t c : count) heavy += c > kEmbeddingHeavyRow ? static_cast<double>(c) : 0;
    return heavy;
  };
  struct Case {
    std::int64_t rows;
    double alpha;
    std::int64_t draws;
  };
  for (const Case c :
       {Case{200000, 1.1, 1000000}, Case{200000, 1.2, 300000}, Case{50000, 1.05, 2000000},
        Case{4000, 0.0, 256000}, Case{1000, 0.0, 200000}}) {
    const double exact = count_heavy(c.rows, c.alpha, c.draws);
    const double model =
        expected_heavy_ids(c.rows, c.alpha > 0 ? IdDistribution::zipf : IdDistribution::uniform,
                           c.alpha, static_cast<double>(c.draws));
    EXPECT_NEAR(model, exact, 0.01 * static_cast<double>(c.draws))
        << c.rows << " rows, alpha " << c.alpha << ", " << c.draws << " draws";
    EXPECT_GT(exact, 0.2 * static_cast<double>(c.draws));  // each case has heavy rows
  }
  // Uniform ids over many rows: none heavy, in the model and (1M ids over 100k rows) drawn.
  EXPECT_DOUBLE_EQ(count_heavy(100000, 0.0, 1000000), 0.0);
  EXPECT_LT(expected_heavy_ids(100000, IdDistribution::uniform, 0, 1e6), 1e-6);
  EXPECT_DOUBLE_EQ(expected_heavy_ids(100000, IdDistribution::uniform, 0, 0), 0.0);
  // Far below the threshold the tail is summed, not left as 1 minus the head's rounding.
  for (const double per_row : {0.0066, 0.026, 0.1, 1.3})
    EXPECT_LT(expected_heavy_ids(10000000, IdDistribution::uniform, 0, 1e7 * per_row), 1e-20);
  // A heavy row needs more than kEmbeddingHeavyRow ids: none among that many draws.
  for (const auto dist : {IdDistribution::uniform, IdDistribution::zipf}) {
    EXPECT_DOUBLE_EQ(expected_heavy_ids(1, dist, 1.1, 50), 0.0);
    EXPECT_DOUBLE_EQ(expected_heavy_ids(1, dist, 1.1, kEmbeddingHeavyRow), 0.0);
    EXPECT_DOUBLE_EQ(expected_heavy_ids(1, dist, 1.1, 1000), 1000.0);
  }
}

// The backward's time: memory traffic at its rate, the 16-bit rows' at theirs, heavy ids at their
// cost; the fixed costs once a backward.
TEST(Embedding, BackwardSecondsAddTheirTerms) {
  const DeviceSpec d = h200();
  Calibration c = default_calibration(d);
  c.hbm_efficiency = 0.5;
  c.embedding_backward_efficiency = 0.5;
  c.embedding_update_efficiency_16bit = 0.25;
  c.embedding_heavy_lookup_s = 1e-9;
  c.embedding_backward_fixed_s = 2e-6;
  c.embedding_heavy_fixed_s = 3e-6;
  EmbeddingTraffic t;
  t.sort = 1e9;
  t.rows = 2e9;
  t.heavy_ids = 1e6;
  const double rate = d.hbm_bandwidth.value * 0.5 * 0.5;
  EXPECT_DOUBLE_EQ(embedding_backward_seconds(t, d, c), 3e9 / rate + 1e-3);
  t.weight_dtype = DType::f16;
  EXPECT_DOUBLE_EQ(embedding_backward_seconds(t, d, c), 1e9 / rate + 2e9 / (rate / 2) + 1e-3);
  EXPECT_DOUBLE_EQ(embedding_backward_fixed_seconds(false, c), 2e-6);
  EXPECT_DOUBLE_EQ(embedding_backward_fixed_seconds(true, c), 5e-6);
}

TEST(Embedding, SortBytesFollowTheMethodAndTheKeyBits) {
  EXPECT_EQ(embedding_key_bits(0), 0);
  EXPECT_EQ(embedding_key_bits(1), 1);
  EXPECT_EQ(embedding_key_bits(1000000), 20);  // keys 0 .. 1000000
  EXPECT_EQ(embedding_key_bits(204'184'588), 28);
  EXPECT_EQ(default_radix_sort(h200()), RadixSort::vendor);
  EXPECT_EQ(default_radix_sort(mi350x()), RadixSort::portable);
  const double n = 1 << 20;
  // One 8-bit pass per digit: 20 bits are 3 passes, 28 are 4, more than 32 count as 32.
  // Vendor: a histogram pass over the 4-byte keys, then each pass reads and writes 8-byte pairs.
  EXPECT_DOUBLE_EQ(radix_sort_bytes(RadixSort::vendor, n, 20), 4 * n + 3 * 16 * n);
  EXPECT_DOUBLE_EQ(radix_sort_bytes(RadixSort::vendor, n, 28), 4 * n + 4 * 16 * n);
  EXPECT_DOUBLE_EQ(radix_sort_bytes(RadixSort::vendor, n, 40), 4 * n + 4 * 16 * n);
  // Portable: per pass the keys, the pairs read and written, and three passes over the
  // 256 counts of each 4096-pair tile.
  const double tiles = n / 4096;
  EXPECT_DOUBLE_EQ(radix_sort_bytes(RadixSort::portable, n, 20), 3 * (20 * n + 12 * 256 * tiles));
  EXPECT_DOUBLE_EQ(radix_sort_bytes(RadixSort::portable, 10, 8), 20 * 10 + 12 * 256);  // one tile
}

// The group count the benchmark divides by its time, stage by stage, by hand for two tables.
TEST(Embedding, GroupTrafficByStage) {
  const EmbeddingBatch::Table tables[] = {{128, 1000, 900}, {64, 3000, 100}};
  EmbeddingBatch b{tables, 500, DType::f16, DType::bf16, OptimizerKind::adagrad, RadixSort::vendor,
                   12};
  const EmbeddingTraffic t = embedding_traffic(b);
  const double n = 4000, u = 1000, offsets = 8 * (2 * 500 + 1);
  EXPECT_DOUBLE_EQ(t.forward,
                   offsets + 8 * n + (1000 * 128 + 3000 * 64) * 2 + 500 * (128 + 64) * 2);
  // Keys: ids and offsets read, (key, bag) written; segments: keys read, starts written; the
  // update reads both ends of each segment's start and the sorted pairs.
  EXPECT_DOUBLE_EQ(t.ids_and_keys, 8 * n + offsets + 8 * n + 4 * n + 4 * u + 8 * u + 8 * n);
  EXPECT_DOUBLE_EQ(t.sort, radix_sort_bytes(RadixSort::vendor, n, 12));
  EXPECT_DOUBLE_EQ(t.gradients, 500 * (128 + 64) * 2);
  // Adagrad: a float of state per element, read and written with the row.
  EXPECT_DOUBLE_EQ(t.rows, 2 * 900 * 128 * (2 + 4) + 2 * 100 * 64 * (2 + 4));
  EXPECT_DOUBLE_EQ(t.gradient_rereads, 0);  // no cache size given: not counted
  EXPECT_DOUBLE_EQ(t.backward(), t.ids_and_keys + t.sort + t.gradients + t.rows);
  // With a cache of 100 KB: table 0's gradients (500 x 128 x 2 = 128 KB) miss it by 28/128, its
  // 500 ids beyond the first of each bag are read again at that share; table 1's (64 KB) fit.
  b.cache_bytes = 100e3;
  const EmbeddingTraffic c = embedding_traffic(b);
  EXPECT_DOUBLE_EQ(c.gradient_rereads, (1000 - 500) * 128 * 2 * (1 - 100e3 / 128e3));
  EXPECT_DOUBLE_EQ(c.backward(), t.backward() + c.gradient_rereads);
}

TEST(Embedding, BytesAreTheOnesThatMustMove) {
  const DeviceSpec d = h200();
  Calibration c = default_calibration(d);
  EmbeddingShardWork w;
  w.rows = 1000000;
  w.dim = 128;
  w.bags = 65536;
  w.lookups = 65536.0 * 20;
  w.weight_dtype = DType::f32;
  w.optimizer = OptimizerKind::rowwise_adagrad;
  w.key_bits = 20;
  const EmbeddingCost e = embedding_cost(w, d, c);
  // forward: 8 B per id and per offset, a 512 B row per lookup, a 512 B output per bag.
  EXPECT_DOUBLE_EQ(e.forward_bytes,
                   w.lookups * 8 + (w.bags + 1) * 8 + w.lookups * 512 + w.bags * 512);
  const double u = expected_unique_rows(w.rows, w.distribution, 0, w.lookups);
  EXPECT_DOUBLE_EQ(e.unique_rows, u);
  // backward: the one-table group's traffic on the H200's sort: output grads once per bag,
  // ids, keys and segments, the sort's 3 passes, each unique row and its one-float state read
  // and written.
  EXPECT_DOUBLE_EQ(e.backward_bytes, w.bags * 512 + 28 * w.lookups + 8 * (w.bags + 1) + 12 * u +
                                         (4 + 3 * 16) * w.lookups + 2 * u * (512 + 4));
  const double copy = 4.8e12 * c.hbm_efficiency;
  EXPECT_NEAR(e.forward_s,
              e.forward_bytes / (copy * c.embedding_forward_efficiency) + c.kernel_launch_s, 1e-12);
  EXPECT_DOUBLE_EQ(e.host_bytes, 0);
  // fp16 halves the row bytes; full adagrad state is a row of floats.
  w.weight_dtype = DType::f16;
  EXPECT_LT(embedding_cost(w, d, c).forward_bytes, e.forward_bytes);
  EXPECT_DOUBLE_EQ(optimizer_state_bytes_per_row(OptimizerKind::adagrad, 128), 512);
  EXPECT_DOUBLE_EQ(optimizer_state_bytes_per_row(OptimizerKind::sgd, 128), 0);
  // Host placement: with the whole table cached nothing crosses the host link.
  w.weight_dtype = DType::f32;
  w.placement = Placement::host;
  w.cache_rows = static_cast<double>(w.rows);
  EXPECT_NEAR(embedding_cost(w, d, c).host_bytes, 0, 1e-6);
  w.cache_rows = 0;
  const EmbeddingCost h = embedding_cost(w, d, c);
  // Every lookup's row read by the forward, each distinct row read and written with its state.
  EXPECT_NEAR(h.host_bytes, w.lookups * 512 + 2 * u * (512 + 4), 1e-6 * h.host_bytes);
  EXPECT_NEAR(h.host_s,
              w.lookups * 512 / (64e9 * c.host_gather_efficiency) +
                  2 * u * (512 + 4) / (64e9 * c.host_link_efficiency),
              1e-12);
}

TEST(Collective, BusBandwidthFactorsAndHierarchy) {
  const DeviceSpec d = h200();  // 450 GB/s scale-up per direction, domain 8, NIC 50 GB/s
  const Calibration c = default_calibration(d);
  const double S = 1e9, up = 450e9 * c.scale_up_efficiency, out = 50e9 * c.scale_out_efficiency;
  EXPECT_DOUBLE_EQ(collective_time(Collective::all_reduce, S, 1, d, c), 0);
  EXPECT_NEAR(collective_time(Collective::all_reduce, S, 8, d, c),
              c.collective_latency_up_s + 2.0 * 7 / 8 * S / up, 1e-12);
  EXPECT_NEAR(collective_time(Collective::all_gather, S, 8, d, c),
              c.collective_latency_up_s + 7.0 / 8 * S / up, 1e-12);
  EXPECT_NEAR(collective_time(Collective::all_to_all, S, 8, d, c),
              c.collective_latency_up_s + 7.0 / 8 * S / up, 1e-12);
  // 32 GPUs = 4 domains of 8: intra-domain over NVLink, 1/8 of the data per GPU over the NIC.
  EXPECT_NEAR(collective_time(Collective::all_reduce, S, 32, d, c),
              2 * c.collective_latency_up_s + c.collective_latency_out_s + 2.0 * 7 / 8 * S / up +
                  2.0 * 3 / 4 * (S / 8) / out,
              1e-12);
  // All-to-all across domains: the off-domain share goes over the NIC.
  EXPECT_NEAR(collective_time(Collective::all_to_all, S, 32, d, c),
              c.collective_latency_out_s + std::max(7.0 / 32 * S / up, 24.0 / 32 * S / out), 1e-12);
}

// The scale-up fit recovers the latency and efficiency that made its samples (every collective,
// 2 to 8 ranks, 1 KB to 256 MB), stays close under multiplicative noise, keeps the efficiency at
// most 1, and refuses samples it cannot fit.
TEST(Collective, ScaleUpFitRecoversTheModelsTerms) {
  const DeviceSpec d = h200();
  Calibration truth = default_calibration(d);
  truth.collective_latency_up_s = 23e-6;
  truth.scale_up_efficiency = 0.71;
  std::vector<CollectiveSample> samples;
  for (const Collective k : {Collective::all_to_all, Collective::all_reduce,
                             Collective::reduce_scatter, Collective::all_gather})
    for (const int n : {2, 4, 8})
      for (double bytes = 1024; bytes <= 256e6; bytes *= 4)
        samples.push_back({k, bytes, n, collective_time(k, bytes, n, d, truth)});
  const CollectiveFit exact = fit_scale_up(samples, d);
  EXPECT_NEAR(exact.latency_s, 23e-6, 1e-12);
  EXPECT_NEAR(exact.efficiency, 0.71, 1e-9);
  EXPECT_LT(exact.rms_relative_error, 1e-9);
  EXPECT_EQ(exact.samples, static_cast<int>(samples.size()));

  std::mt19937 rng(7);
  std::uniform_real_distribution<double> noise(0.95, 1.05);
  std::vector<CollectiveSample> noisy = samples;
  for (CollectiveSample& s : noisy) s.seconds *= noise(rng);
  const CollectiveFit near = fit_scale_up(noisy, d);
  EXPECT_NEAR(near.latency_s, 23e-6, 2e-6);
  EXPECT_NEAR(near.efficiency, 0.71, 0.03);
  EXPECT_GT(near.rms_relative_error, 0.01);
  EXPECT_LE(near.worst_relative_error, 0.06);

  // Faster than the link (a bad sample): the efficiency stays at 1, the latency refitted.
  std::vector<CollectiveSample> fast = samples;
  for (CollectiveSample& s : fast) s.seconds = 5e-6 + (s.seconds - 23e-6) * 0.5;
  EXPECT_DOUBLE_EQ(fit_scale_up(fast, d).efficiency, 1.0);

  const auto refused = [&](std::vector<CollectiveSample> v, const char* words) {
    try {
      fit_scale_up(v, d);
      ADD_FAILURE() << "taken: " << words;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused({{Collective::all_reduce, 1e6, 1, 1e-3}, {Collective::all_reduce, 4e6, 1, 2e-3}},
          "over 1 ranks: the scale-up fit takes 2 to 8 ranks");
  refused({{Collective::all_reduce, 1e6, 16, 1e-3}, {Collective::all_reduce, 4e6, 16, 2e-3}},
          "over 16 ranks");
  refused({{Collective::all_reduce, 1e6, 8, 1e-3}, {Collective::all_gather, 1e6, 8, 2e-3}},
          "the fit needs two sizes or more");
  refused({{Collective::all_reduce, 1e6, 8, 0}, {Collective::all_reduce, 4e6, 8, 1e-3}},
          "both must be positive");
}

TEST(Calibration, FileOverridesAndBadFilesAreClear) {
  const DeviceSpec d = h200();
  const Calibration def = default_calibration(d);
  const Calibration shipped = calibration_for(d, fs::path(PARITY_SOURCE_DIR) / "configs");
  EXPECT_DOUBLE_EQ(shipped.gemm_efficiency_bf16, 0.79);
  EXPECT_DOUBLE_EQ(shipped.kernel_launch_s, def.kernel_launch_s);  // not in the file
  EXPECT_NE(shipped.source.find("h200.yaml"), std::string::npos);
  EXPECT_EQ(calibration_for(mi350x(), fs::path(PARITY_SOURCE_DIR) / "configs").source,
            default_calibration(mi350x()).source);

  const fs::path f = fs::temp_directory_path() / "parity-cal-test.yaml";
  auto message = [&](const std::string& text) {
    std::ofstream(f) << text;
    try {
      load_calibration(f, d);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  std::string m = message("device: h200\nhbm_eficiency: 0.9\n");
  EXPECT_NE(m.find(":2:1: unknown field 'hbm_eficiency' (did you mean 'hbm_efficiency'?)"),
            std::string::npos)
      << m;
  m = message("device: h200\nhbm_efficiency: 0.5\nhbm_efficiency: 0.9\n");  // a repeated key is not
                                                                            // silently taken
  EXPECT_NE(m.find(":3:1:"), std::string::npos) << m;
  EXPECT_NE(m.find("hbm_efficiency"), std::string::npos) << m;
  m = message("device: h200\n[1]: 2\n");  // a key that is not a name: an InputError, not a crash
  EXPECT_NE(m.find(":2:"), std::string::npos) << m;
  m = message("device: h200\nhbm_efficiency: 1.5\n");
  EXPECT_NE(m.find("field 'hbm_efficiency': expected a number in [0.01"), std::string::npos) << m;
  m = message("device: b200\n");
  EXPECT_NE(m.find("is for device 'b200', not 'h200'"), std::string::npos) << m;
  m = message("device: h200\nhbm_efficiency: fast\n");
  EXPECT_NE(m.find("expected a number"), std::string::npos) << m;
  m = message("[1, 2");
  EXPECT_NE(m.find("YAML syntax error"), std::string::npos) << m;
  m = message("device: h200\nsort_bytes_per_id: 96\n");  // an earlier release's key
  EXPECT_NE(m.find(":2:"), std::string::npos) << m;
  EXPECT_NE(m.find("no longer a calibration value"), std::string::npos) << m;
  m = message("device: h200\nhbm_efficiency: 0.9\nhost_pageable_efficiency: 0.08\n");
  EXPECT_NE(m.find(":3:"), std::string::npos) << m;
  EXPECT_NE(m.find("pinned memory"), std::string::npos) << m;
  // The attention table: the shipped file's, and bad entries named by field.
  EXPECT_EQ(shipped.hstu_attention.size(), 20u);
  EXPECT_TRUE(default_calibration(mi350x()).hstu_attention.empty());
  m = message("device: h200\nhstu_attention:\n  - {dim: 64, n: 16, forward_s: 1e-9}\n");
  EXPECT_NE(m.find("backward_s"), std::string::npos) << m;
  m = message(
      "device: h200\nhstu_attention:\n  - {dim: 64, n: 16, forward_s: -1, backward_s: 1e-9}\n");
  EXPECT_NE(m.find("forward_s"), std::string::npos) << m;
  EXPECT_NE(m.find("(0, 1]"), std::string::npos) << m;
  m = message("device: h200\nhstu_attention: 3\n");
  EXPECT_NE(m.find("hstu_attention"), std::string::npos) << m;
  fs::remove(f);
}

}  // namespace
}  // namespace parity
