// The HSTU layer's ops on the GPU (sequence.cu) against the CPU reference on random inputs with
// poisoned outputs: row ops, SiLU, row copies, summed lookups, and the jagged attention on
// lengths from 0 to 2,048 (empty and length-1 sequences included), forward and backward, the
// backward bit for bit the same when run again; the tensor-core attention on lengths to 8,192.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/gpu/gpu_backend.h"
#include "dense_test_util.h"

namespace parity::gpu::test {
namespace {

constexpr double kTol = 1e-4;  // GPU fp32 against the CPU per op (issue target)

// |got - ref| <= kTol (|ref| + rms(ref)) element by element; poison where ref has it.
void expect_near_ref(const std::string& what, const HostMat& got, const HostMat& ref,
                     double tol = kTol) {
  double sq = 0.0;
  std::int64_t n = 0;
  for (std::int64_t r = 0; r < ref.rows; ++r)
    for (std::int64_t c = 0; c < ref.cols; ++c) {
      sq += static_cast<double>(ref.at(r, c)) * ref.at(r, c);
      ++n;
    }
  const float rms = n > 0 ? static_cast<float>(std::sqrt(sq / static_cast<double>(n))) : 0.0f;
  HostMat mag = ref;
  for (std::int64_t r = 0; r < ref.rows; ++r)
    for (std::int64_t c = 0; c < ref.cols; ++c) mag.at(r, c) = std::fabs(ref.at(r, c)) + rms;
  expect_close(what, got, ref, mag, tol);
}

HostMat from(const std::vector<float>& v) {
  HostMat m(1, static_cast<std::int64_t>(v.size()), static_cast<std::int64_t>(v.size()));
  m.v = v;
  return m;
}

TEST(SequenceGpu, RowOpsMatchCpu) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu;
  CpuBackend cpu;
  Rand rand(71);
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{1, 1},
                                   {37, 96},
                                   {50, 130},
                                   {1000, 256},
                                   {20, 512},
                                   {20, 516},
                                   {300, 1000}}) {
    const std::string tag = std::to_string(rows) + "x" + std::to_string(cols) + " ";
    const HostMat x = HostMat::random(rows, cols, 3, rand, -2.0f, 3.0f);
    const HostMat u = HostMat::random(rows, cols, 1, rand);
    const HostMat dy = HostMat::random(rows, cols, 2, rand);
    const HostMat gamma = random_vec(cols, rand, 0.5f, 1.5f), beta = random_vec(cols, rand);
    const DevMat gx(gpu, x), gu(gpu, u), gdy(gpu, dy), gg(gpu, gamma), gb(gpu, beta);
    // Layer norm, forward and backward.
    HostMat y = x.poisoned(), dx = x.poisoned();
    std::vector<float> mean(static_cast<std::size_t>(rows)), rstd(mean.size()),
        dgamma(static_cast<std::size_t>(cols)), dbeta(dgamma.size());
    cpu.layer_norm_forward(x.cview(), gamma.v.data(), beta.v.data(), 1e-5f, y.view(), mean.data(),
                           rstd.data());
    cpu.layer_norm_backward(x.cview(), gamma.v.data(), mean.data(), rstd.data(), dy.cview(),
                            dx.view(), dgamma.data(), dbeta.data());
    DevMat gy(gpu, x.poisoned()), gdx(gpu, x.poisoned()), gmean(gpu, HostMat(1, rows, rows)),
        grstd(gpu, HostMat(1, rows, rows)), gdg(gpu, HostMat(1, cols, cols)),
        gdb(gpu, HostMat(1, cols, cols));
    gpu.layer_norm_forward(gx.view(), gg.data(), gb.data(), 1e-5f, gy.view(), gmean.data(),
                           grstd.data());
    gpu.layer_norm_backward(gx.view(), gg.data(), gmean.data(), grstd.data(), gdy.view(),
                            gdx.view(), gdg.data(), gdb.data());
    expect_near_ref(tag + "layer norm y", gy.download(), y);
    expect_near_ref(tag + "layer norm rstd", grstd.download(), from(rstd));
    expect_near_ref(tag + "layer norm dx", gdx.download(), dx);
    expect_near_ref(tag + "layer norm dgamma", gdg.download(), from(dgamma));
    expect_near_ref(tag + "layer norm dbeta", gdb.download(), from(dbeta));
    // Norm-multiply.
    HostMat ny = x.poisoned(), ndx = x.poisoned(), ndu = x.poisoned();
    cpu.norm_mul_forward(x.cview(), u.cview(), 1e-5f, ny.view(), mean.data(), rstd.data());
    cpu.norm_mul_backward(x.cview(), u.cview(), mean.data(), rstd.data(), dy.cview(), ndx.view(),
                          ndu.view());
    DevMat gny(gpu, x.poisoned()), gndx(gpu, x.poisoned()), gndu(gpu, x.poisoned());
    gpu.norm_mul_forward(gx.view(), gu.view(), 1e-5f, gny.view(), gmean.data(), grstd.data());
    gpu.norm_mul_backward(gx.view(), gu.view(), gmean.data(), grstd.data(), gdy.view(), gndx.view(),
                          gndu.view());
    expect_near_ref(tag + "norm_mul y", gny.download(), ny);
    expect_near_ref(tag + "norm_mul dx", gndx.download(), ndx);
    expect_near_ref(tag + "norm_mul du", gndu.download(), ndu);
    // SiLU and the residual add.
    HostMat sy = x.poisoned(), sdx = x.poisoned();
    cpu.silu_forward(x.cview(), sy.view());
    cpu.silu_backward(x.cview(), dy.cview(), sdx.view());
    DevMat gsy(gpu, x.poisoned()), gsdx(gpu, x.poisoned());
    gpu.silu_forward(gx.view(), gsy.view());
    gpu.silu_backward(gx.view(), gdy.view(), gsdx.view());
    expect_near_ref(tag + "silu", gsy.download(), sy);
    expect_near_ref(tag + "silu backward", gsdx.download(), sdx);
    cpu.add_into(dy.cview(), sy.view());
    gpu.add_into(gdy.view(), gsy.view());
    expect_near_ref(tag + "add_into", gsy.download(), sy);
  }
}

TEST(SequenceGpu, RowCopiesAndSummedLookupsMatchCpu) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu;
  CpuBackend cpu;
  Rand rand(72);
  const HostMat src = HostMat::random(50, 24, 0, rand);
  std::vector<std::int64_t> index;
  for (std::int64_t i = 0; i < 50; i += 3) index.push_back((i * 7) % 50);
  const auto n = static_cast<std::int64_t>(index.size());
  Buffer gi(gpu, index.size() * 8);
  gpu.copy_to_device(gi.get(), index.data(), index.size() * 8);
  HostMat rows(n, 24, 24);
  cpu.gather_rows(src.cview(), index.data(), rows.view());
  const DevMat gsrc(gpu, src);
  DevMat grows(gpu, rows.poisoned());
  gpu.gather_rows(gsrc.view(), gi.as<const std::int64_t>(), grows.view());
  expect_near_ref("gather_rows", grows.download(), rows);
  // Between element types: the rows into a bf16 view, each rounded to nearest even (poisoned
  // first), and back into fp32, exactly.
  {
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(n * 24), 0x7fc1);
    Buffer g16(gpu, bits.size() * 2);
    gpu.copy_to_device(g16.get(), bits.data(), bits.size() * 2);
    gpu.gather_rows(gsrc.view(), gi.as<const std::int64_t>(), AMat(g16.get(), DType::bf16, n, 24));
    gpu.copy_to_host(bits.data(), g16.get(), bits.size() * 2);
    std::vector<std::int64_t> identity(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) identity[static_cast<std::size_t>(i)] = i;
    Buffer gid(gpu, identity.size() * 8);
    gpu.copy_to_device(gid.get(), identity.data(), identity.size() * 8);
    DevMat back(gpu, rows.poisoned());
    gpu.gather_rows(CAMat(g16.get(), DType::bf16, n, 24), gid.as<const std::int64_t>(),
                    back.view());
    const HostMat got = back.download();
    int wrong = 0;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t c = 0; c < 24; ++c) {
        const std::uint16_t b = bits[static_cast<std::size_t>(i * 24 + c)];
        wrong += b != bf16_bits(rows.at(i, c)) || got.at(i, c) != bf16_to_float(b);
      }
    EXPECT_EQ(wrong, 0) << "gather_rows between fp32 and bf16";
  }
  HostMat full = src;
  DevMat gfull(gpu, src);
  cpu.scatter_add_rows(rows.cview(), index.data(), full.view());
  gpu.scatter_add_rows(grows.view(), gi.as<const std::int64_t>(), gfull.view());
  expect_near_ref("scatter_add_rows", gfull.download(), full);
  // Rows scaled in a strided view (columns 3 to 19 of 24), by a factor each and by alpha alone.
  std::vector<float> factors(50);
  for (float& f : factors) f = static_cast<float>(rand.uniform(-2, 2));
  Buffer gf(gpu, factors.size() * 4);
  gpu.copy_to_device(gf.get(), factors.data(), factors.size() * 4);
  HostMat scaled = src;
  DevMat gscaled(gpu, src);
  cpu.scale_rows(factors.data(), 0.5f, scaled.view().cols_slice(3, 16));
  gpu.scale_rows(gf.as<const float>(), 0.5f, gscaled.view().cols_slice(3, 16));
  cpu.scale_rows(nullptr, -1.5f, scaled.view());
  gpu.scale_rows(nullptr, -1.5f, gscaled.view());
  EXPECT_EQ(gscaled.download().v, scaled.v) << "scale_rows: one fp32 product per element";

  // Three tables (fp32, bf16, fp32 mean), one id per token and some empty bags; of dim 16 (four
  // columns a thread) and 18 (one).
  for (const std::int64_t dim : {16, 18}) {
    std::vector<TableLayout> tables(3);
    const std::int64_t rows_of[3] = {40, 7, 5};
    std::int64_t off32 = 0;
    for (int t = 0; t < 3; ++t) {
      tables[t].rows = rows_of[t];
      tables[t].dim = dim;
      tables[t].dtype = t == 1 ? DType::bf16 : DType::f32;
      tables[t].pooling = t == 2 ? Pooling::mean : Pooling::sum;
      tables[t].weight_offset = t == 1 ? 0 : off32;
      if (t != 1) off32 += rows_of[t] * dim;
    }
    std::vector<float> w32(static_cast<std::size_t>(off32));
    for (float& v : w32) v = rand.uniform();
    std::vector<std::uint16_t> w16(static_cast<std::size_t>(7 * dim));
    for (auto& b : w16) b = bf16_bits(rand.uniform());
    const std::int64_t tokens = 300;
    std::vector<std::int64_t> ids, offsets{0};
    for (int t = 0; t < 3; ++t)
      for (std::int64_t b = 0; b < tokens; ++b) {
        const std::int64_t k = t == 2 ? rand.integer(0, 3) : (b % 11 == 5 ? 0 : 1);
        for (std::int64_t j = 0; j < k; ++j) ids.push_back(rand.integer(0, rows_of[t] - 1));
        offsets.push_back(static_cast<std::int64_t>(ids.size()));
      }
    HostMat out(tokens, dim, dim);
    cpu.embedding_sum_forward(tables, TableWeights{w32.data(), nullptr, w16.data()},
                              SparseInput{tokens, 3, ids.data(), offsets.data()}, out.view());
    Buffer g32(gpu, w32.size() * 4), g16(gpu, w16.size() * 2), gids(gpu, ids.size() * 8),
        goff(gpu, offsets.size() * 8);
    gpu.copy_to_device(g32.get(), w32.data(), w32.size() * 4);
    gpu.copy_to_device(g16.get(), w16.data(), w16.size() * 2);
    gpu.copy_to_device(gids.get(), ids.data(), ids.size() * 8);
    gpu.copy_to_device(goff.get(), offsets.data(), offsets.size() * 8);
    DevMat gout(gpu, out.poisoned());
    gpu.embedding_sum_forward(
        tables, TableWeights{g32.get(), nullptr, g16.get()},
        SparseInput{tokens, 3, gids.as<const std::int64_t>(), goff.as<const std::int64_t>()},
        gout.view());
    expect_near_ref("embedding_sum_forward dim " + std::to_string(dim), gout.download(), out);
  }
}

struct AttentionCase {
  std::vector<std::int64_t> lengths;
  int targets, heads, a, vd, pb, tb;
};

// Nearest-even bf16 of every element (the operands the tensor-core kernels see exactly).
HostMat bf16_rounded(HostMat m) {
  for (float& x : m.v) {
    std::uint32_t u = 0;
    std::memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(&x, &u, 4);
  }
  return m;
}

// The GPU attention (forward and backward) against the CPU on the same random inputs, outputs
// poisoned first, within tol of (|ref| + rms(ref)); the backward run twice gives the same bits.
void check_attention(GpuBackend& gpu, const AttentionCase& ac, double tol, bool bf16_inputs,
                     std::uint64_t seed) {
  CpuBackend cpu;
  Rand rand(seed);
  const int targets = ac.targets, heads = ac.heads, a = ac.a, vd = ac.vd, pb = ac.pb, tb = ac.tb;
  std::vector<std::int64_t> offsets{0}, times;
  for (const std::int64_t len : ac.lengths) {
    const std::int64_t n = len == 0 ? 0 : std::max<std::int64_t>(len, targets);
    std::int64_t ts = 1600000000 + rand.integer(0, 1000);
    for (std::int64_t i = 0; i < n; ++i) {
      times.push_back(ts);
      ts += static_cast<std::int64_t>(std::exp(rand.u() * 14.0));
    }
    offsets.push_back(offsets.back() + n);
  }
  const std::int64_t tokens = offsets.back();
  std::int64_t longest = 0;
  for (std::size_t b = 0; b + 1 < offsets.size(); ++b)
    longest = std::max(longest, offsets[b + 1] - offsets[b]);
  HostMat qkv = HostMat::random(tokens, 2 * heads * a + heads * vd, 0, rand, -0.5f, 1.0f);
  HostMat dout = HostMat::random(tokens, heads * vd, 0, rand);
  if (bf16_inputs) {
    qkv = bf16_rounded(qkv);
    dout = bf16_rounded(dout);
  }
  const HostMat pos = random_vec(heads * pb, rand), tim = random_vec(heads * tb, rand);
  HstuAttention att;
  att.heads = heads;
  att.attention_dim = a;
  att.value_dim = vd;
  att.scale = 1.0f / std::sqrt(static_cast<float>(a));
  att.inv_n = 1.0f / static_cast<float>(std::max<std::int64_t>(longest, 1));
  att.position_buckets = pb;
  att.time_buckets = tb;
  SequenceBatch seq{static_cast<std::int64_t>(ac.lengths.size()),
                    tokens,
                    longest,
                    targets,
                    offsets.data(),
                    times.data()};
  const CMat all = qkv.cview();
  const std::int64_t qa = static_cast<std::int64_t>(heads) * a;
  HstuAttention catt = att;
  catt.position = pos.v.data();
  catt.time = tim.v.data();
  HostMat out(tokens, heads * vd, heads * vd), dq(tokens, qa, qa), dk(tokens, qa, qa),
      dv(tokens, heads * vd, heads * vd);
  std::vector<float> dpos(pos.v.size()), dtime(tim.v.size());
  cpu.hstu_attention_forward(seq, catt, all.cols_slice(0, qa), all.cols_slice(qa, qa),
                             all.cols_slice(2 * qa, heads * vd), out.view());
  cpu.hstu_attention_backward(seq, catt, all.cols_slice(0, qa), all.cols_slice(qa, qa),
                              all.cols_slice(2 * qa, heads * vd), dout.cview(), dq.view(),
                              dk.view(), dv.view(), dpos.data(), dtime.data());

  const DevMat gqkv(gpu, qkv), gdout(gpu, dout), gpos(gpu, pos), gtim(gpu, tim);
  Buffer goff(gpu, offsets.size() * 8), gtimes(gpu, std::max<std::size_t>(times.size(), 1) * 8);
  gpu.copy_to_device(goff.get(), offsets.data(), offsets.size() * 8);
  if (!times.empty()) gpu.copy_to_device(gtimes.get(), times.data(), times.size() * 8);
  SequenceBatch gseq = seq;
  gseq.offsets = goff.as<const std::int64_t>();
  gseq.timestamps = gtimes.as<const std::int64_t>();
  HstuAttention gatt = att;
  gatt.position = gpos.data();
  gatt.time = gtim.data();
  const Mat gall = gqkv.view();
  DevMat gout(gpu, out.poisoned()), gdq(gpu, dq.poisoned()), gdk(gpu, dk.poisoned()),
      gdv(gpu, dv.poisoned()), gdp(gpu, HostMat(1, heads * pb, heads * pb)),
      gdt(gpu, HostMat(1, heads * tb, heads * tb));
  gpu.hstu_attention_forward(gseq, gatt, gall.cols_slice(0, qa), gall.cols_slice(qa, qa),
                             gall.cols_slice(2 * qa, heads * vd), gout.view());
  auto backward = [&] {
    gpu.hstu_attention_backward(gseq, gatt, gall.cols_slice(0, qa), gall.cols_slice(qa, qa),
                                gall.cols_slice(2 * qa, heads * vd), gdout.view(), gdq.view(),
                                gdk.view(), gdv.view(), gdp.data(), gdt.data());
  };
  backward();
  const std::string tag = "a " + std::to_string(a) + " v " + std::to_string(vd) + ": attention ";
  expect_near_ref(tag + "out", gout.download(), out, tol);
  expect_near_ref(tag + "dq", gdq.download(), dq, tol);
  expect_near_ref(tag + "dk", gdk.download(), dk, tol);
  expect_near_ref(tag + "dv", gdv.download(), dv, tol);
  expect_near_ref(tag + "dposition", gdp.download(), from(dpos), tol);
  expect_near_ref(tag + "dtime", gdt.download(), from(dtime), tol);
  const HostMat first_dq = gdq.download(), first_dk = gdk.download(), first_dp = gdp.download(),
                first_dt = gdt.download();
  backward();
  EXPECT_EQ(std::memcmp(gdq.download().v.data(), first_dq.v.data(), first_dq.v.size() * 4), 0);
  EXPECT_EQ(std::memcmp(gdk.download().v.data(), first_dk.v.data(), first_dk.v.size() * 4), 0);
  EXPECT_EQ(std::memcmp(gdp.download().v.data(), first_dp.v.data(), first_dp.v.size() * 4), 0);
  EXPECT_EQ(std::memcmp(gdt.download().v.data(), first_dt.v.data(), first_dt.v.size() * 4), 0);
  // The same kernels launched over the listed row blocks only (SequenceBatch::blocks): the same
  // bits where no short sequences share a block (each block's results do not depend on which
  // others run); where runs of them do, their sums add in another order, so within tol of the
  // CPU again, and the same bits on a second backward.
  std::vector<std::int64_t> blocks;
  const std::int64_t packed = sequence_blocks(offsets, blocks);
  Buffer gblocks(gpu, std::max<std::size_t>(blocks.size(), 1) * 8);
  if (!blocks.empty()) gpu.copy_to_device(gblocks.get(), blocks.data(), blocks.size() * 8);
  gseq.blocks = gblocks.as<const std::int64_t>();
  gseq.block_count = static_cast<std::int64_t>(blocks.size());
  gseq.packed_blocks = packed;
  const HostMat first_out = gout.download(), first_dv = gdv.download();
  DevMat bout(gpu, out.poisoned()), bdq(gpu, dq.poisoned()), bdk(gpu, dk.poisoned()),
      bdv(gpu, dv.poisoned()), bdp(gpu, HostMat(1, heads * pb, heads * pb)),
      bdt(gpu, HostMat(1, heads * tb, heads * tb));
  gpu.hstu_attention_forward(gseq, gatt, gall.cols_slice(0, qa), gall.cols_slice(qa, qa),
                             gall.cols_slice(2 * qa, heads * vd), bout.view());
  auto listed_backward = [&] {
    gpu.hstu_attention_backward(gseq, gatt, gall.cols_slice(0, qa), gall.cols_slice(qa, qa),
                                gall.cols_slice(2 * qa, heads * vd), gdout.view(), bdq.view(),
                                bdk.view(), bdv.view(), bdp.data(), bdt.data());
  };
  listed_backward();
  const std::string listed = packed > 0 ? " over the listed blocks, " + std::to_string(packed) +
                                              " of them runs of short sequences"
                                        : " over the listed blocks";
  if (packed == 0) {
    for (const auto& [name, got, want] :
         {std::tuple{"out", bout.download(), first_out}, std::tuple{"dq", bdq.download(), first_dq},
          std::tuple{"dk", bdk.download(), first_dk}, std::tuple{"dv", bdv.download(), first_dv},
          std::tuple{"dposition", bdp.download(), first_dp},
          std::tuple{"dtime", bdt.download(), first_dt}})
      EXPECT_EQ(std::memcmp(got.v.data(), want.v.data(), want.v.size() * 4), 0)
          << tag << name << listed;
    return;
  }
  // Tokens of sequences outside the runs: the same bits as without the list.
  std::vector<char> in_run(static_cast<std::size_t>(tokens), 0);
  for (const std::int64_t b : blocks)
    if (b & kPackedBlock)
      std::fill(in_run.begin() + offsets[b >> 20],
                in_run.begin() + offsets[(b >> 20) + (b & (kPackedBlock - 1))], 1);
  for (const auto& [name, got, want] :
       {std::tuple{"out", bout.download(), first_out}, std::tuple{"dq", bdq.download(), first_dq},
        std::tuple{"dk", bdk.download(), first_dk}, std::tuple{"dv", bdv.download(), first_dv}}) {
    std::int64_t differ = 0;
    for (std::int64_t t = 0; t < tokens; ++t)
      if (!in_run[static_cast<std::size_t>(t)] &&
          std::memcmp(got.v.data() + t * got.ld, want.v.data() + t * want.ld, got.cols * 4) != 0)
        ++differ;
    EXPECT_EQ(differ, 0) << tag << name << listed << ": rows outside the runs differ";
  }
  expect_near_ref(tag + "out" + listed, bout.download(), out, tol);
  expect_near_ref(tag + "dq" + listed, bdq.download(), dq, tol);
  expect_near_ref(tag + "dk" + listed, bdk.download(), dk, tol);
  expect_near_ref(tag + "dv" + listed, bdv.download(), dv, tol);
  expect_near_ref(tag + "dposition" + listed, bdp.download(), from(dpos), tol);
  expect_near_ref(tag + "dtime" + listed, bdt.download(), from(dtime), tol);
  const HostMat listed_dq = bdq.download(), listed_dk = bdk.download(), listed_dv = bdv.download(),
                listed_dp = bdp.download(), listed_dt = bdt.download();
  listed_backward();
  for (const auto& [name, got, want] :
       {std::tuple{"dq", bdq.download(), listed_dq}, std::tuple{"dk", bdk.download(), listed_dk},
        std::tuple{"dv", bdv.download(), listed_dv},
        std::tuple{"dposition", bdp.download(), listed_dp},
        std::tuple{"dtime", bdt.download(), listed_dt}})
    EXPECT_EQ(std::memcmp(got.v.data(), want.v.data(), want.v.size() * 4), 0)
        << tag << name << listed << ": a second backward differs";
}

// The scalar fp32 kernels: lengths 0 .. 2,048 with targets, heads 2 (a 64, v 32, which take two
// lanes' strides on 32-lane warps), few buckets so that distances and times clamp.
TEST(SequenceGpu, AttentionMatchesCpu) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu;
  check_attention(gpu, {{0, 1, 3, 2048, 2, 77, 0, 513, 130, 4}, 2, 2, 64, 32, 40, 20}, kTol, false,
                  73);
}

// The tensor-core kernels (bf16 dense math; the inputs rounded to bf16 first, so both sides see
// the same operands and the difference is the kernels' bf16 rounding of the scores): every head
// dim they take, lengths around the tile sizes (63, 64, 65, 127, 128, 129), an 8,192-token one,
// sequences made only of targets, and bias tables small enough to clamp.
TEST(SequenceGpu, TensorCoreAttentionMatchesCpu) {
  PARITY_REQUIRE_GPU();
  GpuBackend gpu(DenseMath::bf16);
  constexpr double kBf16Tol = 2e-2;
  if (const std::string why = gpu.tensor_core_attention_refusal({2, 64, 64, 0.0f, 0.0f, 1, 1});
      !why.empty())
    GTEST_SKIP() << why;
  check_attention(
      gpu,
      {{0, 1, 3, 2048, 2, 77, 0, 513, 130, 4, 63, 64, 65, 127, 128, 129}, 2, 2, 64, 64, 40, 20},
      kBf16Tol, true, 79);
  check_attention(gpu, {{8192, 1, 300, 3}, 3, 1, 128, 128, 512, 64}, kBf16Tol, true, 83);
  // Head dim 128 with every sequence under 1,024 tokens: the forward on warp products, the
  // backward on warpgroup products where the GPU has them; few position buckets, so most tiles
  // are far from the diagonal.
  check_attention(gpu, {{600, 1, 64, 129, 0, 257}, 2, 2, 128, 128, 24, 16}, kBf16Tol, true, 87);
  check_attention(gpu, {{200, 5, 129, 1000}, 1, 3, 32, 32, 256, 128}, kBf16Tol, true, 89);
  check_attention(gpu, {{70, 16, 1, 400}, 0, 2, 16, 16, 8, 4}, kBf16Tol, true, 97);
  // A heavy-tailed batch: most histories far shorter than a block, so runs of them share one
  // (with empty ones and targets inside runs), beside longer ones; every head dim.
  const std::vector<std::int64_t> short_tailed{5,  17, 0, 40, 33,  1, 9,   60, 64, 2,  100,
                                               28, 3,  3, 3,  120, 8, 700, 0,  50, 11, 77};
  std::vector<std::int64_t> tailed_offsets{0}, tailed_blocks;
  for (const std::int64_t n : short_tailed)
    tailed_offsets.push_back(tailed_offsets.back() + (n == 0 ? 0 : std::max<std::int64_t>(n, 3)));
  ASSERT_GE(sequence_blocks(tailed_offsets, tailed_blocks), 4) << "the batch packs no runs";
  for (const int d : {16, 32, 64, 128})
    check_attention(gpu, {short_tailed, 3, 2, d, d, 32, 24}, kBf16Tol, true,
                    101 + static_cast<std::uint64_t>(d));
}

}  // namespace
}  // namespace parity::gpu::test
