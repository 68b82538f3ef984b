// The HSTU attention alone: forward and forward+backward TFLOP/s of parity's tensor-core kernels
// (bf16 operands and outputs, fp32 sums) on full-length and jagged batches of the same token
// count, through the GPU backend's own entry points (Backend::hstu_attention_forward/backward).
//
// What it counts (docs/perf/hstu.md has the results and the command): per sequence of n tokens
// the causal forward FLOPs 2 n² h (a + v) / 2, and 3.5x that for forward+backward (the backward
// as 2.5 forwards: scores again, dP, dV, dQ, dK), the convention bench/hstu_attention_torch.py
// uses for PyTorch on the same shapes. The work parity's backward really does is larger (dq
// recomputes the scores and dP in a kernel of its own, so that no gradient needs an atomic add).
// Jagged batches draw lengths uniformly in 1..n until the token count is reached.
// --calibration FILE writes the full-length rows as a calibration file's hstu_attention entries
// (docs/planner.md, "HSTU models").
// Method: the median of --reps runs (device timing marks around each) after --warmup runs;
// inputs uniform in [-1, 1], bias tables in [-0.5, 0.5], timestamps increasing by random gaps.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/gpu/gpu_backend.h"
#include "backend/gpu/runtime.h"

using parity::DType;

namespace {

struct Options {
  std::vector<std::int64_t> lengths = {512, 1024, 2048, 4096, 8192};
  std::int64_t tokens = 65536;
  int heads = 4, dim = 128, targets = 8, reps = 10, warmup = 3;
  int position_buckets = 512, time_buckets = 64;
  bool jagged = true;
  std::string results;
  std::string calibration;  // the hstu_attention entries of a calibration file
};

struct Row {
  std::int64_t n = 0;
  bool jagged = false;
  std::int64_t batch = 0, tokens = 0;
  double flops = 0, fwd_ms = 0, both_ms = 0;
  double fwd_tflops() const { return flops / (fwd_ms * 1e-3) / 1e12; }
  double both_tflops() const { return 3.5 * flops / (both_ms * 1e-3) / 1e12; }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty()
             ? 0.0
             : (v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
}

double time_ms(parity::Backend& be, int warmup, int reps, const std::function<void()>& f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    be.timing_mark(0);
    f();
    be.timing_mark(1);
    ms.push_back(be.timing_elapsed_ms(0, 1));
  }
  return median(ms);
}

Row run_case(parity::GpuBackend& be, const Options& o, std::int64_t n, bool jagged,
             std::mt19937_64& rng) {
  std::vector<std::int64_t> lengths;
  if (!jagged) {
    lengths.assign(static_cast<std::size_t>(std::max<std::int64_t>(o.tokens / n, 1)), n);
  } else {
    std::uniform_int_distribution<std::int64_t> len(1, n);
    for (std::int64_t t = 0; t < o.tokens;) {
      const std::int64_t l = std::min(std::max<std::int64_t>(len(rng), o.targets), o.tokens - t);
      lengths.push_back(std::max<std::int64_t>(l, o.targets));
      t += lengths.back();
    }
  }
  std::vector<std::int64_t> offsets{0}, times;
  std::uniform_int_distribution<std::int64_t> gap(0, 5000);
  Row r;
  r.n = n;
  r.jagged = jagged;
  r.batch = static_cast<std::int64_t>(lengths.size());
  for (const std::int64_t l : lengths) {
    offsets.push_back(offsets.back() + l);
    std::int64_t ts = 1'700'000'000;
    for (std::int64_t i = 0; i < l; ++i) times.push_back(ts += gap(rng));
    r.flops += 2.0 * static_cast<double>(l) * static_cast<double>(l) * o.heads * (2.0 * o.dim) / 2;
  }
  r.tokens = offsets.back();
  const std::int64_t cols = static_cast<std::int64_t>(o.heads) * o.dim;
  const auto bytes = static_cast<std::size_t>(r.tokens * cols * 2);
  std::vector<void*> mats;
  for (int m = 0; m < 8; ++m) mats.push_back(be.allocate(bytes));  // q k v dout out dq dk dv
  for (int m = 0; m < 4; ++m)
    be.fill_uniform(mats[static_cast<std::size_t>(m)], DType::bf16, r.tokens * cols, -1.0f, 1.0f,
                    2026, static_cast<std::uint64_t>(m));
  auto* bias = static_cast<float*>(
      be.allocate(static_cast<std::size_t>(o.heads) * (o.position_buckets + o.time_buckets) * 12));
  const std::int64_t nb =
      static_cast<std::int64_t>(o.heads) * (o.position_buckets + o.time_buckets);
  be.fill_uniform(bias, DType::f32, nb, -0.5f, 0.5f, 2026, 8);
  auto* off = static_cast<std::int64_t*>(be.allocate(offsets.size() * 8));
  auto* ts = static_cast<std::int64_t*>(be.allocate(times.size() * 8));
  be.copy_to_device(off, offsets.data(), offsets.size() * 8);
  be.copy_to_device(ts, times.data(), times.size() * 8);

  // The row blocks that hold tokens, as the engine lists them for its steps.
  std::vector<std::int64_t> blocks;
  const std::int64_t packed = parity::sequence_blocks(offsets, blocks);
  auto* blk = static_cast<std::int64_t*>(be.allocate(std::max<std::size_t>(blocks.size(), 1) * 8));
  if (!blocks.empty()) be.copy_to_device(blk, blocks.data(), blocks.size() * 8);

  parity::SequenceBatch seq{r.batch, r.tokens, n, o.targets, off, ts};
  seq.blocks = blk;
  seq.block_count = static_cast<std::int64_t>(blocks.size());
  seq.packed_blocks = packed;
  parity::HstuAttention att;
  att.heads = o.heads;
  att.attention_dim = att.value_dim = o.dim;
  att.scale = 1.0f / std::sqrt(static_cast<float>(o.dim));
  att.inv_n = 1.0f / static_cast<float>(n);
  att.position_buckets = o.position_buckets;
  att.time_buckets = o.time_buckets;
  att.position = bias;
  att.time = bias + static_cast<std::int64_t>(o.heads) * o.position_buckets;
  auto view = [&](int m) {
    return parity::AMat(mats[static_cast<std::size_t>(m)], DType::bf16, r.tokens, cols);
  };
  float* dbias = bias + nb;
  auto forward = [&] { be.hstu_attention_forward(seq, att, view(0), view(1), view(2), view(4)); };
  auto backward = [&] {
    be.hstu_attention_backward(seq, att, view(0), view(1), view(2), view(3), view(5), view(6),
                               view(7), dbias,
                               dbias + static_cast<std::int64_t>(o.heads) * o.position_buckets);
  };
  r.fwd_ms = time_ms(be, o.warmup, o.reps, forward);
  r.both_ms = time_ms(be, o.warmup, o.reps, [&] {
    forward();
    backward();
  });
  be.synchronize();
  for (void* p : mats) be.deallocate(p);
  be.deallocate(bias);
  be.deallocate(off);
  be.deallocate(ts);
  be.deallocate(blk);
  return r;
}

std::vector<std::int64_t> split_ints(const std::string& s) {
  std::vector<std::int64_t> out;
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t comma = std::min(s.find(',', at), s.size());
    out.push_back(std::stoll(s.substr(at, comma - at)));
    at = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "attention_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "--lengths")
        o.lengths = split_ints(next());
      else if (a == "--tokens")
        o.tokens = std::stoll(next());
      else if (a == "--heads")
        o.heads = std::stoi(next());
      else if (a == "--dim")
        o.dim = std::stoi(next());
      else if (a == "--targets")
        o.targets = std::stoi(next());
      else if (a == "--reps")
        o.reps = std::stoi(next());
      else if (a == "--warmup")
        o.warmup = std::stoi(next());
      else if (a == "--full-only")
        o.jagged = false;
      else if (a == "--results")
        o.results = next();
      else if (a == "--calibration")
        o.calibration = next();
      else
        throw std::invalid_argument(a);
    } catch (const std::exception&) {
      std::fprintf(stderr,
                   "usage: attention_bench [--lengths 512,...,8192] [--tokens N] [--heads H] "
                   "[--dim D] [--targets T]\n"
                   "                       [--reps N] [--warmup N] [--full-only] "
                   "[--results FILE] [--calibration FILE]\n(%s was not understood)\n",
                   a.c_str());
      return 2;
    }
  }
  if (parity::gpu::device_count() == 0) {
    std::fprintf(stderr, "attention_bench: no GPU\n");
    return 1;
  }
  parity::GpuBackend be(parity::DenseMath::bf16);
  parity::HstuAttention probe;
  probe.heads = o.heads;
  probe.attention_dim = probe.value_dim = o.dim;
  probe.position_buckets = o.position_buckets;
  probe.time_buckets = o.time_buckets;
  if (const std::string why = be.tensor_core_attention_refusal(probe); !why.empty()) {
    std::fprintf(stderr, "attention_bench: %s\n", why.c_str());
    return 1;
  }
  std::mt19937_64 rng(2026);
  std::vector<Row> rows;
  fmt::print("{:>6} {:>7} {:>6} {:>8} {:>10} {:>9} {:>10} {:>9}\n", "n", "layout", "seqs", "tokens",
             "fwd ms", "TFLOP/s", "f+b ms", "TFLOP/s");
  for (const std::int64_t n : o.lengths)
    for (const bool jagged : {false, true}) {
      if (jagged && !o.jagged) continue;
      const Row r = run_case(be, o, n, jagged, rng);
      rows.push_back(r);
      fmt::print("{:>6} {:>7} {:>6} {:>8} {:>10.3f} {:>9.1f} {:>10.3f} {:>9.1f}\n", r.n,
                 r.jagged ? "jagged" : "full", r.batch, r.tokens, r.fwd_ms, r.fwd_tflops(),
                 r.both_ms, r.both_tflops());
      std::fflush(stdout);
    }
  if (!o.results.empty()) {
    std::ofstream f(o.results);
    f << "{\"heads\": " << o.heads << ", \"dim\": " << o.dim << ", \"rows\": [\n";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      f << fmt::format(
          "  {{\"n\": {}, \"layout\": \"{}\", \"sequences\": {}, \"tokens\": {}, \"flops\": {}, "
          "\"forward_ms\": {}, \"forward_tflops\": {}, \"both_ms\": {}, \"both_tflops\": "
          "{}}}{}\n",
          r.n, r.jagged ? "jagged" : "full", r.batch, r.tokens, r.flops, r.fwd_ms, r.fwd_tflops(),
          r.both_ms, r.both_tflops(), i + 1 < rows.size() ? "," : "");
    }
    f << "]}\n";
  }
  // The full-length rows as the calibration's hstu_attention entries (configs/calibration/*.yaml):
  // seconds per (token, head) of the forward and of the backward (forward+backward less forward).
  if (!o.calibration.empty()) {
    std::ofstream f(o.calibration);
    for (const Row& r : rows) {
      if (r.jagged) continue;
      const double per = 1e-3 / (static_cast<double>(r.tokens) * o.heads);
      f << fmt::format("  - {{dim: {}, n: {}, forward_s: {:.4g}, backward_s: {:.4g}}}\n", o.dim,
                       r.n, r.fwd_ms * per, (r.both_ms - r.fwd_ms) * per);
    }
  }
  return 0;
}
