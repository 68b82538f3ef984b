// Synthetic batches on the device (see synthetic.h).
//
// Why it is built this way: the example math is parity/synthetic_example.h, the code the host
// generator runs, compiled here with -fmad=false (cmake/ParityGpu.cmake) so that no multiply and
// add are fused and every double rounds as on the host. Two kernels: one thread per (table,
// example) draws the bag's ids and writes the table's two teacher terms to the workspace
// (table-major, so a block's threads share a table and its pooling size, and so the work per
// thread, but for the blocks that straddle two tables); then one thread per example makes the
// dense features and adds the terms in the host's order to get the logit and the label. The work
// per id is a few 64-bit hashes and, for Zipf tables, an exp and a log1p in double: small beside
// the step that reads the batch.
#include "backend/gpu/synthetic.h"

#include "backend/gpu/elementwise.cuh"
#include "backend/gpu/launch.h"
#include "parity/synthetic_example.h"

namespace parity::gpu {
namespace {

using elementwise::kBlock;

__global__ __launch_bounds__(kBlock) void synthetic_bags_kernel(
    const synth::Generator* __restrict__ gen, int split, std::int64_t first, std::int64_t count,
    std::int64_t* __restrict__ ids, std::int64_t* __restrict__ offsets, double* __restrict__ p,
    double* __restrict__ q) {
  const synth::Generator& g = *gen;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t n = count * g.num_tables;
  if (i == 0) offsets[n] = count * g.ids_per_example;
  if (i >= n) return;
  const int t = static_cast<int>(i / count);
  const std::int64_t b = i - static_cast<std::int64_t>(t) * count;
  const std::int64_t start = synth::bag_start(g, t, b, count);
  offsets[i] = start;
  const synth::TableTerms terms =
      synth::table_bag(g, split, t, static_cast<std::uint64_t>(first + b), ids + start);
  p[i] = terms.p;  // [num_tables, count]
  q[i] = terms.q;
}

__global__ __launch_bounds__(kBlock) void synthetic_examples_kernel(
    const synth::Generator* __restrict__ gen, int split, std::int64_t first, std::int64_t count,
    float* __restrict__ dense, float* __restrict__ labels, const double* __restrict__ p,
    const double* __restrict__ q) {
  const synth::Generator& g = *gen;
  const std::int64_t b = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= count) return;
  const auto e = static_cast<std::uint64_t>(first + b);
  float* x = dense + b * g.num_dense;  // [num_dense]
  for (int k = 0; k < g.num_dense; ++k) x[k] = synth::dense_value(g, split, e, k);
  const double prob = synth::probability(synth::logit(g, x, p + b, q + b, count));
  labels[b] = synth::label(g, split, e, prob);
}

}  // namespace

void make_synthetic(Stream_t s, const SyntheticBatch& batch) {
  if (batch.count <= 0) return;
  if (batch.generator == nullptr || batch.workspace == nullptr)
    throw GpuError("make_synthetic: the generator and the workspace must be backend memory");
  const auto* gen = static_cast<const synth::Generator*>(batch.generator);
  auto* p = static_cast<double*>(batch.workspace);
  double* q = p + batch.num_tables * batch.count;
  const std::int64_t bags = batch.num_tables * batch.count;
  launch("synthetic_bags", synthetic_bags_kernel,
         {ceil_div(std::max<std::int64_t>(bags, 1), kBlock), kBlock, 0}, s, gen, batch.split,
         batch.first, batch.count, batch.ids, batch.offsets, p, q);
  launch("synthetic_examples", synthetic_examples_kernel,
         {ceil_div(batch.count, kBlock), kBlock, 0}, s, gen, batch.split, batch.first, batch.count,
         batch.dense, batch.labels, static_cast<const double*>(p), static_cast<const double*>(q));
}

}  // namespace parity::gpu
