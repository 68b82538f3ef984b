// Kernel selection on the host: the catalog's file form and its checks, and the ranking's formula,
// filters and order.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "parity/error.h"
#include "parity/select.h"
#include "select/suite.h"

namespace parity {
namespace {

CatalogKernel make_kernel(int algo, int tm, int tn, double fixed, double tile, double kstep) {
  CatalogKernel k;
  k.kernel.algo = algo;
  k.kernel.tile_m = tm;
  k.kernel.tile_n = tn;
  k.kernel.tile_k = 64;
  k.slots = 132;
  k.fixed_s = fixed;
  k.tile_s = tile;
  k.kstep_s = kstep;
  return k;
}

GemmCatalog small_catalog() {
  GemmCatalog c;
  c.device = "h200";
  c.library = "cuBLASLt";
  c.library_version = 130100;
  c.multiprocessors = 132;
  c.l2_bytes = 50 << 20;
  c.measured = "a test";
  c.reduction_fixed_s = 3e-6;
  c.call_s = 5e-6;
  CatalogGroup g;
  g.type = GemmType::bf16;
  g.tb = true;
  g.narrow_output = true;
  g.epilogue = GemmEpilogue::bias;
  g.peak_flops_per_s = 1e15;  // above what the kernels below reach: the formula decides
  g.kernels.push_back(make_kernel(66, 128, 256, 6e-6, 1e-6, 0.5e-6));
  CatalogKernel small = make_kernel(24, 64, 64, 5e-6, 0.2e-6, 0.05e-6);
  small.max_split_k = 16;
  small.split_reduction = SplitReduction::compute_type;
  small.min_align_a = small.min_align_b = 16;
  small.stream_tile_s = 0.3e-6;
  small.stream_kstep_s = 0.08e-6;
  g.kernels.push_back(small);
  c.groups.push_back(g);
  return c;
}

GemmProblem forward(std::int64_t m, std::int64_t n, std::int64_t k) {
  GemmProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.tb = true;
  p.narrow_output = true;
  p.epilogue = GemmEpilogue::bias;
  return p;
}

std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         (name + "-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + ".json");
}

TEST(GemmText, KeyAndDescriptionNameEveryField) {
  GemmKernel k;
  k.algo = 66;
  k.tile_m = 128;
  k.tile_n = 256;
  k.tile_k = 64;
  k.cluster_m = 2;
  k.cluster_n = 1;
  k.split_k = 4;
  k.reduction = SplitReduction::compute_type;
  k.custom = 7;
  EXPECT_EQ(k.key(), "a66 t128x256 k64x0 c2x1 s4 r2 w0 o7 i0");
  GemmProblem p = forward(8192, 1024, 512);
  EXPECT_EQ(p.describe(), "bf16 8192x1024x512 NT 16-bit out +bias");
  EXPECT_EQ(p.lead_a(), 512);  // A [m, k] as stored
  EXPECT_EQ(p.lead_b(), 512);  // B stored [n, k], used transposed
  EXPECT_EQ(p.lead_d(), 1024);
  p.ta = true;
  EXPECT_EQ(p.lead_a(), 8192);  // A stored [k, m]
}

TEST(GemmCatalogFile, RoundTripsExactly) {
  const GemmCatalog c = small_catalog();
  const auto file = temp_file("catalog");
  save_gemm_catalog(c, file);
  const GemmCatalog back = load_gemm_catalog(file);
  std::filesystem::remove(file);
  ASSERT_EQ(back.groups.size(), 1u);
  ASSERT_EQ(back.groups[0].kernels.size(), 2u);
  EXPECT_EQ(back.library_version, 130100);
  EXPECT_EQ(back.multiprocessors, 132);
  EXPECT_EQ(back.l2_bytes, 50 << 20);
  EXPECT_EQ(back.reduction_fixed_s, 3e-6);
  EXPECT_EQ(back.call_s, 5e-6);
  EXPECT_EQ(back.groups[0].peak_flops_per_s, 1e15);
  for (std::size_t i = 0; i < 2; ++i) {
    const CatalogKernel& a = c.groups[0].kernels[i];
    const CatalogKernel& b = back.groups[0].kernels[i];
    EXPECT_EQ(a.kernel.key(), b.kernel.key());
    EXPECT_EQ(a.max_split_k, b.max_split_k);
    EXPECT_EQ(a.split_reduction, b.split_reduction);
    EXPECT_EQ(a.min_align_a, b.min_align_a);
    EXPECT_EQ(a.slots, b.slots);
    EXPECT_EQ(a.fixed_s, b.fixed_s);
    EXPECT_EQ(a.tile_s, b.tile_s);
    EXPECT_EQ(a.kstep_s, b.kstep_s);
    EXPECT_EQ(a.stream_tile_s, b.stream_tile_s);
    EXPECT_EQ(a.stream_kstep_s, b.stream_kstep_s);
  }
  // The same problem ranks the same from the file as from memory.
  const auto x = rank_gemm_kernels(forward(4096, 1000, 700), c, 4e12);
  const auto y = rank_gemm_kernels(forward(4096, 1000, 700), back, 4e12);
  ASSERT_EQ(x.size(), y.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].kernel.key(), y[i].kernel.key());
    EXPECT_EQ(x[i].seconds, y[i].seconds);
  }
}

// A catalog file with one field changed: the message names the file and the field.
void expect_refused(const std::string& from, const std::string& to, const std::string& message) {
  const auto file = temp_file("catalog-bad");
  save_gemm_catalog(small_catalog(), file);
  std::string text;
  {
    std::ifstream in(file);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  {
    std::ofstream out(file);
    out << text;
  }
  try {
    (void)load_gemm_catalog(file);
    ADD_FAILURE() << "accepted " << to;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
  }
  std::filesystem::remove(file);
}

TEST(GemmCatalogFile, RefusesBadFieldsByName) {
  expect_refused("\"fixed_s\":6e-06", "\"fixed_s\":-6e-06",
                 "'groups[0].kernels[0].fixed_s': expected a finite number >= 0");
  expect_refused("\"slots\":132.0", "\"slots\":0.5", "'groups[0].kernels[0].slots'");
  expect_refused("\"type\": \"bf16\"", "\"type\": \"bf17\"", "'groups[0].type': expected one of");
  expect_refused("\"swizzle\"", "\"swizzel\"", "unknown field");
  expect_refused("\"peak_flops_per_s\": 1e+15", "\"peak_flops_per_s\": 0",
                 "'groups[0].peak_flops_per_s': expected a rate above 0");
  expect_refused("\"format\": \"parity-gemm-catalog-4\"", "\"format\": \"other\"", "'format'");
  expect_refused("\"split_reduction\":\"compute_type\"", "\"split_reduction\":\"none\"",
                 "needs its reduction");
  expect_refused("\"library_version\": 130100,", "", "'library_version': missing");
  expect_refused("\"multiprocessors\": 132", "\"multiprocessors\": 0", "'multiprocessors'");
  expect_refused("\"call_s\": 5e-06", "\"call_s\": 2", "'call_s': expected seconds");
  expect_refused("\"split_reduction\":\"compute_type\"", "\"split_reduction\":\"in_place\"",
                 "not deterministic");
  expect_refused("\"tile\":[", "\"tile\":[1,", "expected [m, n]");
}

TEST(GemmCatalogFile, RefusesAFileThatIsNotJson) {
  const auto file = temp_file("catalog-text");
  {
    std::ofstream out(file);
    out << "groups: []\n";
  }
  EXPECT_THROW((void)load_gemm_catalog(file), InputError);
  std::filesystem::remove(file);
  EXPECT_THROW((void)load_gemm_catalog("/no/such/catalog.json"), InputError);
}

TEST(GemmRanking, FollowsTheFormula) {
  const GemmCatalog c = small_catalog();
  // 8192 x 1024 x 512: the 128x256 tile gives 64 x 4 = 256 tiles, 2 waves of 132, K = 8 steps.
  const auto r = rank_gemm_kernels(forward(8192, 1024, 512), c, 4e12);
  double t66 = -1;
  for (const auto& e : r)
    if (e.kernel.algo == 66) t66 = e.seconds;
  EXPECT_DOUBLE_EQ(t66, 6e-6 + 2 * (1e-6 + 8 * 0.5e-6));
  // The 64x64 tile: 128 x 16 = 2048 tiles, 16 waves, K = 8: 5 + 16 * (0.2 + 8 * 0.05) us; no
  // split-K at that many waves.
  int small = 0;
  for (const auto& e : r)
    if (e.kernel.algo == 24) {
      ++small;
      EXPECT_DOUBLE_EQ(e.seconds, 5e-6 + 16 * (0.2e-6 + 8 * 0.05e-6));
      EXPECT_EQ(e.kernel.split_k, 1);
    }
  EXPECT_EQ(small, 1);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_LE(r[0].seconds, r[1].seconds);
}

TEST(GemmRanking, SplitsLongKWhereTheTilesLeaveTheDeviceIdle) {
  GemmCatalog c = small_catalog();
  c.l2_bytes = 0;  // the L2 costs alone (the operands are 64 MiB)
  // 256 x 256 x 65536: 16 tiles of 64x64, far under a wave; k long enough for every split.
  // A memory rate high enough that moving the operands once does not bind.
  const double hbm = 4e15;
  const auto r = rank_gemm_kernels(forward(256, 256, 65536), c, hbm);
  ASSERT_EQ(r.size(), 2u);  // one entry a configuration, at its fastest split
  // The best is a split one: 1,024 steps of one tile are the whole time unsplit. Its depth is the
  // fastest of 2 ... 16 (its limit) by the formula.
  EXPECT_EQ(r[0].kernel.algo, 24);
  EXPECT_EQ(r[0].kernel.reduction, SplitReduction::compute_type);
  double best = 1e30;
  int best_split = 0;
  for (const int s : {1, 2, 3, 4, 6, 8, 12, 16}) {
    const double waves = std::ceil(16.0 * s / 132);
    const double steps = std::ceil(std::ceil(65536.0 / s) / 64);
    double t = 5e-6 + waves * (0.2e-6 + steps * 0.05e-6);
    if (s > 1) t += 3e-6 + (2.0 * s + 1.0) * 256 * 256 * 4 / hbm;
    const double once = (256.0 * 65536 + 65536.0 * 256) * 2 + 256.0 * 256 * 2;
    t = std::max({t, 5e-6 + once / hbm, 5e-6 + 2.0 * 256 * 256 * 65536 / 1e15, 5e-6});
    if (t < best) best = t, best_split = s;
  }
  EXPECT_EQ(r[0].kernel.split_k, best_split);
  EXPECT_GT(best_split, 1);
  EXPECT_NEAR(r[0].seconds, best, 1e-15);
}

TEST(GemmRanking, LeavesOutWhatTheAlignmentForbids) {
  const GemmCatalog c = small_catalog();
  GemmProblem p = forward(4096, 1024, 1741);  // rows of A and B: 3,482 bytes, 2-byte aligned
  const auto r = rank_gemm_kernels(p, c, 4e12);
  ASSERT_FALSE(r.empty());
  for (const auto& e : r) EXPECT_NE(e.kernel.algo, 24);
  EXPECT_EQ(operand_alignment(256, 1741, 2), 2);
  EXPECT_EQ(operand_alignment(256, 1024, 2), 256);
  EXPECT_EQ(operand_alignment(4, 1024, 2), 4);
  // An output: a single row counts its address, a single column its rows.
  EXPECT_EQ(operand_alignment(256, 1, 1741, 1741, 2), 256);
  EXPECT_EQ(operand_alignment(256, 65536, 1, 1, 2), 2);
  EXPECT_EQ(operand_alignment(256, 65536, 1, 3, 2), 2);
  EXPECT_EQ(operand_alignment(256, 8, 1741, 1741, 2), 2);
  // An operand of a product: a vector along k counts its address, one across k (k = 1: a
  // column of A [m, 1], measured refused by the library's 16-byte kernels) its rows.
  EXPECT_EQ(operand_alignment(256, 1, 1741, 1741, 2, true), 256);    // A [1, k]
  EXPECT_EQ(operand_alignment(256, 65536, 1, 1, 2, false), 256);     // Aᵀ stored [k, 1]
  EXPECT_EQ(operand_alignment(256, 65536, 1, 1, 2, true), 2);        // A [m, 1]: k = 1
  EXPECT_EQ(operand_alignment(256, 65536, 1741, 1741, 2, true), 2);  // any matrix: its rows
}

TEST(GemmRanking, NeverSplitsPastTheWorkspace) {
  GemmCatalog c = small_catalog();
  CatalogKernel big = make_kernel(66, 256, 512, 6e-6, 1e-6, 0.5e-6);  // 8 tiles a 512 x 2048
  big.max_split_k = 16;
  big.split_reduction = SplitReduction::compute_type;
  c.groups[0].kernels = {big};
  c.groups[0].peak_flops_per_s = 1e18;  // the formula decides, not the kind's peak
  // Long k over few tiles: splitting fills the device, as far as the partial results fit.
  for (const std::int64_t m : {512, 2048}) {
    const std::int64_t n = 2048;
    const auto r = rank_gemm_kernels(forward(m, n, 65536), c, 4e12);
    ASSERT_EQ(r.size(), 1u);
    const int split = r[0].kernel.split_k;
    EXPECT_LE(static_cast<double>(split) * m * n * 4, kGemmWorkspaceBytes) << m;
    // 512 x 2048 splits deep (8 tiles); 2048 x 2048 (32 tiles) would take 4, past the workspace.
    if (m == 512) {
      EXPECT_GT(split, 2);
    } else {
      EXPECT_EQ(split, 2);
    }
  }
}

TEST(GemmRanking, NeverFasterThanMovingTheOperandsOnce) {
  GemmCatalog c = small_catalog();
  c.groups[0].kernels.resize(1);
  c.groups[0].kernels[0].kstep_s = 1e-12;  // a kernel that computes for free
  c.groups[0].kernels[0].tile_s = 1e-12;
  c.groups[0].peak_flops_per_s = 1e18;  // so that the memory floor binds
  const GemmProblem p = forward(65536, 4096, 4096);
  const double bytes = (65536.0 * 4096 + 4096.0 * 4096) * 2 + 65536.0 * 4096 * 2;
  const auto r = rank_gemm_kernels(p, c, 4e12);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_DOUBLE_EQ(r[0].seconds, 6e-6 + bytes / 4e12);
}

TEST(GemmRanking, CountsWholeClustersOfTiles) {
  GemmKernel k;
  k.tile_m = 192;
  k.tile_n = 80;
  EXPECT_DOUBLE_EQ(catalog_tiles(k, 3456, 512), 18.0 * 7);  // 18 x 6.4 tiles
  k.cluster_n = 2;
  EXPECT_DOUBLE_EQ(catalog_tiles(k, 3456, 512), 18.0 * 8);  // 7 columns make 4 clusters
  k.cluster_m = 4;
  EXPECT_DOUBLE_EQ(catalog_tiles(k, 3456, 512), 20.0 * 8);
  GemmKernel open;  // sizes the library leaves open count as the nominal tile
  EXPECT_DOUBLE_EQ(catalog_tiles(open, 65, 64), 2.0);
}

TEST(GemmRanking, APartialWaveOfSharedMultiprocessorsCostsItsFullestOne) {
  // Four tiles a multiprocessor on 132: 100 tiles leave each at most one, a quarter wave.
  EXPECT_DOUBLE_EQ(catalog_waves(100, 528, 132), 0.25);
  EXPECT_DOUBLE_EQ(catalog_waves(528, 528, 132), 1.0);
  EXPECT_DOUBLE_EQ(catalog_waves(529, 528, 132), 1.25);
  // One tile a multiprocessor, or no multiprocessor count: whole waves.
  EXPECT_DOUBLE_EQ(catalog_waves(133, 132, 132), 2.0);
  EXPECT_DOUBLE_EQ(catalog_waves(100, 528, 0), 1.0);
}

TEST(GemmCatalogPrune, DropsWhatNeverRanksNearTheFirst) {
  GemmCatalog c = small_catalog();
  CatalogGroup& g = c.groups[0];
  g.kernels[1].min_align_a = g.kernels[1].min_align_b = 0;
  g.kernels.push_back(make_kernel(66, 128, 128, 6e-6, 0.8e-6, 0.3e-6));
  CatalogKernel slow = g.kernels[0];  // the first configuration at ten times its costs
  slow.kernel.custom = 1;
  slow.fixed_s *= 10;
  slow.tile_s *= 10;
  slow.kstep_s *= 10;
  g.kernels.push_back(slow);
  c.call_s = 1.0;  // a floor that ties everything must not keep everything
  prune_gemm_catalog(c, 4e12);
  ASSERT_EQ(c.groups[0].kernels.size(), 3u);
  for (const CatalogKernel& k : c.groups[0].kernels) EXPECT_EQ(k.kernel.custom, 0);
}

TEST(GemmRanking, NeverFasterThanTheCheapestCall) {
  GemmCatalog c = small_catalog();
  c.groups[0].kernels.resize(1);
  c.groups[0].kernels[0].fixed_s = 0;  // a fit that put all of a small run's time in its tiles
  c.call_s = 7e-6;
  const auto r = rank_gemm_kernels(forward(16, 16, 16), c, 4e12);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_DOUBLE_EQ(r[0].seconds, 7e-6);
}

TEST(GemmRanking, NeverFasterThanTheKindsMeasuredPeak) {
  GemmCatalog c = small_catalog();
  c.groups[0].kernels.resize(1);
  c.groups[0].peak_flops_per_s = 5e14;
  const GemmProblem p = forward(16384, 8192, 8192);
  const auto r = rank_gemm_kernels(p, c, 4e12);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_DOUBLE_EQ(r[0].seconds, 6e-6 + 2.0 * 16384 * 8192 * 8192 / 5e14);
}

TEST(GemmCostFit, RecoversTheConstantsOfExactTimes) {
  const double fixed = 4e-6, tile = 2e-6, kstep = 3e-8;
  std::vector<CostSample> s;
  for (const double w : {1.0, 2.0, 3.0})
    for (const double k : {4.0, 256.0, 1024.0}) s.push_back({w, k, fixed + w * (tile + k * kstep)});
  const CostFit f = fit_kernel_costs(s);
  EXPECT_NEAR(f.fixed_s, fixed, 1e-12);
  EXPECT_NEAR(f.tile_s, tile, 1e-12);
  EXPECT_NEAR(f.kstep_s, kstep, 1e-15);
  EXPECT_LT(f.rms_relative_error, 1e-9);
}

TEST(GemmCostFit, HoldsAConstantAtZeroRatherThanNegative) {
  // Times that the unconstrained fit explains with a negative fixed cost.
  const std::vector<CostSample> s = {{1, 4, 1e-6}, {1, 1024, 41e-6}, {2, 1024, 84e-6}};
  const CostFit f = fit_kernel_costs(s);
  EXPECT_GE(f.fixed_s, 0.0);
  EXPECT_GE(f.tile_s, 0.0);
  EXPECT_GT(f.kstep_s, 0.0);
  EXPECT_LT(f.rms_relative_error, 0.2);
  EXPECT_THROW((void)fit_kernel_costs({{1, 4, 1e-6}, {1, 8, 2e-6}}), Error);
  EXPECT_THROW((void)fit_kernel_costs({{1, 4, 1e-6}, {1, 8, 0}, {2, 8, 3e-6}}), Error);
}

TEST(GemmCatalogFile, ReadsTheFormatWithoutStreamingCosts) {
  const auto file = temp_file("catalog-3");
  save_gemm_catalog(small_catalog(), file);  // kernel 1 has streaming costs
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  // The file as the format before them was written: no streaming costs, no L2 size.
  const auto erase_field = [&](const std::string& start, char end) {
    for (std::size_t at; (at = text.find(start)) != std::string::npos;)
      text.erase(at, text.find_first_of(end == ',' ? ",}" : "\n", at + 1) - at + (end == '\n'));
  };
  erase_field(",\"stream_tile_s\":", ',');
  erase_field(",\"stream_kstep_s\":", ',');
  erase_field(" \"l2_bytes\":", '\n');
  text.replace(text.find("catalog-4"), 9, "catalog-3");
  std::ofstream(file) << text;
  const GemmCatalog back = load_gemm_catalog(file);
  EXPECT_EQ(back.l2_bytes, 0);
  EXPECT_FALSE(back.groups[0].kernels[1].has_stream_costs());
  EXPECT_EQ(back.groups[0].kernels[1].kstep_s, small_catalog().groups[0].kernels[1].kstep_s);
  // The old format with a field of the new one is refused by name, in a kernel and at the top.
  const auto refused_naming = [&](const std::string& bad, const std::string& field) {
    std::ofstream(file) << bad;
    try {
      (void)load_gemm_catalog(file);
      ADD_FAILURE() << "a parity-gemm-catalog-3 file with " << field << " was read";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  std::string bad = text;
  bad.replace(bad.find("\"kstep_s\""), 9, "\"stream_tile_s\":1e-6,\"kstep_s\"");
  refused_naming(bad, "stream_tile_s");
  bad = text;
  bad.replace(bad.find("\"call_s\""), 8, "\"l2_bytes\": 1, \"call_s\"");
  refused_naming(bad, "l2_bytes");
  std::filesystem::remove(file);
}

TEST(GemmRanking, MemoryRegimeGrowsFromL2ToTwiceL2) {
  const std::int64_t l2 = 50 << 20;
  // bf16 operands, 16-bit output: footprint 2·(m·k + k·n + m·n) bytes.
  EXPECT_EQ(memory_regime(forward(1024, 1024, 1024), l2), 0.0);  // 6 MiB
  EXPECT_EQ(memory_regime(forward(8192, 8192, 8192), l2), 1.0);  // 384 MiB
  EXPECT_EQ(memory_regime(forward(8192, 8192, 8192), 0), 0.0);   // no L2 size: never streamed
  GemmProblem p = forward(4096, 4096, 2048);                     // 64 MiB of 50
  EXPECT_NEAR(memory_regime(p, l2), std::log2(64.0 / 50.0), 1e-12);
}

TEST(GemmRanking, StreamingCostsTakeOverBeyondL2) {
  GemmCatalog c = small_catalog();
  const CatalogKernel& k = c.groups[0].kernels[1];  // 64x64, split-K, streaming costs
  c.groups[0].peak_flops_per_s = 1e18;              // no floor: the formula alone
  const auto time_of = [&](const GemmProblem& p) {
    for (const KernelEstimate& e : rank_gemm_kernels(p, c, 4e12))
      if (e.kernel.algo == 24) return e;
    ADD_FAILURE() << "no estimate of the 64x64 configuration";
    return KernelEstimate{};
  };
  for (const std::int64_t size : {2048, 16384}) {
    const GemmProblem p = forward(size, size, 4096);
    const KernelEstimate e = time_of(p);
    ASSERT_EQ(e.kernel.split_k, 1);
    const double w = memory_regime(p, c.l2_bytes);
    EXPECT_EQ(w, size == 2048 ? 0.0 : 1.0);
    const double tile = (1 - w) * k.tile_s + w * k.stream_tile_s;
    const double kstep = (1 - w) * k.kstep_s + w * k.stream_kstep_s;
    EXPECT_DOUBLE_EQ(e.seconds, k.fixed_s + e.waves * (tile + 64 * kstep));
  }
}

TEST(GemmRanking, BlendsBetweenL2AndTwiceL2AndKeepsL2CostsWithoutStreamingOnes) {
  GemmCatalog c = small_catalog();
  c.groups[0].peak_flops_per_s = 1e18;  // no floor: the formula alone
  CatalogKernel plain = c.groups[0].kernels[1];
  plain.kernel.custom = 1;  // another configuration, without streaming costs
  plain.stream_tile_s = plain.stream_kstep_s = 0;
  c.groups[0].kernels.push_back(plain);
  const GemmProblem p = forward(4096, 4096, 2560);  // 72 MiB: between L2 (50) and twice L2
  const double w = memory_regime(p, c.l2_bytes);
  ASSERT_GT(w, 0.0);
  ASSERT_LT(w, 1.0);
  const CatalogKernel& k = c.groups[0].kernels[1];
  int seen = 0;
  for (const KernelEstimate& e : rank_gemm_kernels(p, c, 4e12)) {
    if (e.kernel.algo != 24) continue;
    ++seen;
    ASSERT_EQ(e.kernel.split_k, 1);
    const double v = e.kernel.custom == 1 ? 0.0 : w;  // the plain one keeps its L2 costs
    const double tile = (1 - v) * k.tile_s + v * k.stream_tile_s;
    const double kstep = (1 - v) * k.kstep_s + v * k.stream_kstep_s;
    EXPECT_DOUBLE_EQ(e.seconds, k.fixed_s + e.waves * (tile + 40 * kstep)) << e.kernel.key();
  }
  EXPECT_EQ(seen, 2);
}

TEST(GemmCostFit, StreamingCostsSolveTwoRunsExactly) {
  const double fixed = 5e-6, tile = 3e-6, kstep = 4e-8;
  const CostSample shallow{40, 4, fixed + 40 * (tile + 4 * kstep)};
  const CostSample deep{40, 512, fixed + 40 * (tile + 512 * kstep)};
  const CostFit f = fit_stream_costs(fixed, shallow, deep);
  EXPECT_NEAR(f.tile_s, tile, 1e-15);
  EXPECT_NEAR(f.kstep_s, kstep, 1e-18);
  EXPECT_LT(f.rms_relative_error, 1e-9);
  // A deep run faster per wave than the shallow one: no negative step cost.
  const CostFit g = fit_stream_costs(fixed, {40, 4, 1e-3}, {40, 512, 0.9e-3});
  EXPECT_EQ(g.kstep_s, 0.0);
  EXPECT_GT(g.tile_s, 0.0);
  // A shallow run below what the deep one's step cost implies: no negative tile cost.
  const CostFit h = fit_stream_costs(fixed, {40, 4, 6e-6}, {40, 512, 1e-3});
  EXPECT_EQ(h.tile_s, 0.0);
  EXPECT_NEAR(h.kstep_s, (1e-3 - fixed) / 40 / 512, 1e-18);
  EXPECT_THROW((void)fit_stream_costs(fixed, deep, shallow), Error);
  EXPECT_THROW((void)fit_stream_costs(fixed, {40, 4, 0}, deep), Error);
}

TEST(GemmRanking, TiesGoTheSameWayWhateverTheCatalogOrder) {
  GemmCatalog a = small_catalog();
  a.groups[0].kernels = {make_kernel(66, 128, 128, 6e-6, 1e-6, 0.5e-6),
                         make_kernel(66, 128, 128, 6e-6, 1e-6, 0.5e-6)};
  a.groups[0].kernels[0].kernel.custom = 3;
  a.groups[0].kernels[1].kernel.custom = 1;
  GemmCatalog b = a;
  std::swap(b.groups[0].kernels[0], b.groups[0].kernels[1]);
  const auto ra = rank_gemm_kernels(forward(8192, 1024, 512), a, 4e12);
  const auto rb = rank_gemm_kernels(forward(8192, 1024, 512), b, 4e12);
  ASSERT_EQ(ra.size(), 2u);
  EXPECT_EQ(ra[0].seconds, ra[1].seconds);
  EXPECT_EQ(ra[0].kernel.custom, 1);
  EXPECT_EQ(rb[0].kernel.custom, 1);
}

TEST(GemmRanking, RefusesAMemoryRateOfZero) {
  EXPECT_THROW((void)rank_gemm_kernels(forward(64, 64, 64), small_catalog(), 0.0), Error);
}

TEST(GemmRanking, NothingForAKindTheCatalogDoesNotHold) {
  const GemmCatalog c = small_catalog();
  GemmProblem p = forward(1024, 1024, 1024);
  p.narrow_output = false;  // no group with an fp32 output
  EXPECT_TRUE(rank_gemm_kernels(p, c, 4e12).empty());
  p = forward(0, 1024, 1024);
  EXPECT_TRUE(rank_gemm_kernels(p, c, 4e12).empty());
}

// The selection suite: every zoo model's products in their three forms at the three batches, and
// the random shapes; the same list on every call.
TEST(GemmSuite, HoldsTheZoosProductsAndRandomShapes) {
  const std::filesystem::path models = std::filesystem::path(PARITY_SOURCE_DIR) / "configs/models";
  const auto bf16 = gemm_suite(models, GemmType::bf16, {});
  EXPECT_GE(bf16.size(), 300u);
  int forward = 0, dgrad = 0, wgrad = 0, random = 0, unaligned = 0;
  for (const SuiteProblem& s : bf16) {
    const GemmProblem& p = s.problem;
    ASSERT_GT(p.m, 0) << s.origin;
    ASSERT_GT(p.n, 0) << s.origin;
    ASSERT_GT(p.k, 0) << s.origin;
    EXPECT_GE(p.lead_a(), p.ta ? p.m : p.k) << s.origin;
    EXPECT_GE(p.lead_b(), p.tb ? p.k : p.n) << s.origin;
    forward += s.origin.ends_with(" forward");
    dgrad += s.origin.ends_with(" dgrad");
    wgrad += s.origin.ends_with(" wgrad");
    random += s.origin.starts_with("random ");
    unaligned += p.align_a < 16;
  }
  EXPECT_GT(forward, 100);
  EXPECT_GT(dgrad, 100);
  EXPECT_GT(wgrad, 100);
  EXPECT_EQ(random, 64);
  EXPECT_GT(unaligned, 0);
  // The MLPerf model's DCNv2 product of the measurement is there.
  bool cross = false;
  for (const SuiteProblem& s : bf16)
    cross |= s.problem.m == 65536 && s.problem.n == 3456 && s.problem.k == 512 && !s.problem.ta &&
             !s.problem.tb;
  EXPECT_TRUE(cross);
  // fp8: the forward form alone (A · Bᵀ), fewer problems.
  const auto fp8 = gemm_suite(models, GemmType::e4m3, {});
  ASSERT_FALSE(fp8.empty());
  EXPECT_LT(fp8.size(), bf16.size());
  for (const SuiteProblem& s : fp8) {
    EXPECT_FALSE(s.problem.ta) << s.origin;
    EXPECT_TRUE(s.problem.tb) << s.origin;
  }
  const auto again = gemm_suite(models, GemmType::bf16, {});
  ASSERT_EQ(again.size(), bf16.size());
  for (std::size_t i = 0; i < bf16.size(); ++i)
    EXPECT_EQ(again[i].problem.describe() + again[i].origin,
              bf16[i].problem.describe() + bf16[i].origin);
}

}  // namespace
}  // namespace parity
