// The analytical performance model: time and memory of every op of a training step
// on a device, from the device spec (configs/devices/) and a calibration (named
// constants per architecture family, overridable by a file measured on the device).
// Host-only C++; the planner, the kernel selector and the benchmarks all ask it, so
// a prediction and its measurement can always be printed side by side.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "parity/spec.h"

namespace parity {

// ------------------------------------------------------------ calibration --

// Achieved fractions and fixed costs on one device. Defaults come from one table with an
// NVIDIA and an AMD value per field (src/perf/calibration.cpp, each with its origin); a
// calibration file measured on the device overrides any of them.
struct Calibration {
  std::string source;  // where the values came from
  // Dense matrix products: achieved fraction of the datasheet peak at large sizes.
  double gemm_efficiency_fp32 = 0;
  double gemm_efficiency_tf32 = 0;
  double gemm_efficiency_bf16 = 0;
  double gemm_efficiency_fp16 = 0;
  // Memory: achieved device-to-device copy bandwidth as a fraction of the datasheet.
  double hbm_efficiency = 0;
  // Table-batched embedding kernels: achieved fraction of the *copy* bandwidth.
  double embedding_forward_efficiency = 0;
  double embedding_backward_efficiency = 0;
  // The same for the distinct rows' reads and writes (EmbeddingTraffic::rows) of fp16 and bf16
  // tables: their update rounds stochastically, and moves half the bytes for the same work a row.
  double embedding_update_efficiency_16bit = 0;
  // The backward's costs beside its memory traffic (embedding_backward_seconds): the fixed cost of
  // one backward over a device's tables (keys, sort, segments and update launches, at any size),
  // the fixed cost of its heavy-row stages where any row is heavy, and the seconds per id in a
  // heavy row (kEmbeddingHeavyRow: summed in chunks, then merged; bound by loads in flight).
  double embedding_backward_fixed_s = 0;
  double embedding_heavy_fixed_s = 0;
  double embedding_heavy_lookup_s = 0;
  // The checked products' row pass (--product-checks: each row of a product's fp32 output summed
  // against its prediction, the output stored): achieved fraction of the copy bandwidth, one
  // figure for every shape and for fp32 math too (measured under bf16 math).
  double product_check_efficiency = 0;
  // The checked bf16 product in one kernel (fused_checked_products): its main loop's fraction of
  // the bf16 peak, and its epilogue's (the bf16 output and each row's sums a column tile, written
  // after the main loop) fraction of the copy bandwidth.
  double fused_check_gemm_efficiency = 0;
  double fused_check_epilogue_efficiency = 0;
  double host_link_efficiency = 0;      // achieved fraction of host_link_bandwidth
  double host_gather_efficiency = 0;    // the same for the forward's scattered row reads
  double scale_up_efficiency = 0;       // nccl-tests busbw / link bandwidth, scale-up
  double scale_out_efficiency = 0;      // same across domains
  double collective_latency_up_s = 0;   // fixed cost of one collective within a domain
  double collective_latency_out_s = 0;  // across domains
  double kernel_launch_s = 0;           // per kernel launch (no graph capture)
  double allreduce_overlap = 0;         // fraction of dense backward time that hides the
                                        // dense-gradient all-reduce (bucketed, as DDP)
  double workspace_bytes = 0;           // GEMM workspace, sort temporaries
  double reserved_bytes = 0;            // runtime context, collective buffers, allocator
                                        // slack: absolute bytes, not a percentage
  // The HSTU attention on tensor cores (hstu_attention_cost): seconds per (token, head) of its
  // forward and of its backward over full-length sequences of n tokens, a batch of them filling
  // the device, at head dim `dim` (a = v), as attention_bench measures them.
  struct AttentionPoint {
    int dim = 0;
    int n = 0;
    double forward_s = 0, backward_s = 0;
  };
  std::vector<AttentionPoint> hstu_attention;
  // The scalar fp32 kernels (fp32 math, or no tensor-core form): achieved fraction of the fp32
  // peak, counted with the causal FLOPs.
  double hstu_attention_scalar_efficiency = 0;

  double gemm_efficiency(DenseMath m) const;
};

// Built-in values for a device (by vendor and arch).
Calibration default_calibration(const DeviceSpec& device);
// Overrides from a YAML file of `key: value` pairs (keys as the fields above) plus
// `device: NAME` (must match) and `source: "..."`. Throws InputError naming file, line, key.
Calibration load_calibration(const std::filesystem::path& file, const DeviceSpec& device);
// configs/calibration/<device>.yaml when it exists, else the built-in values.
Calibration calibration_for(const DeviceSpec& device, const std::filesystem::path& configs_dir);

// ------------------------------------------------------------------- GEMM --

struct GemmShape {
  std::int64_t m = 0, n = 0, k = 0;  // C[m, n] = A[m, k] · B[k, n]
  DenseMath math = DenseMath::fp32;
  int output_bytes = 0;  // per element of C; 0: the operands' (dense_operand_bytes)
};

struct GemmTile {
  int m = 0, n = 0;
  int ctas_per_cu = 1;  // concurrent tiles on one SM/CU
  int split_k = 1;      // k cut into this many slices, their fp32 partial results summed after
};

struct GemmEstimate {
  double seconds = 0;
  double compute_s = 0;  // with tile and wave quantization
  double memory_s = 0;
  GemmTile tile;  // the candidate ranked first
  double waves = 0;
  double flops = 0;  // 2mnk
  double bytes = 0;
};

// Candidate tiles for the device's vendor and the math precision.
std::vector<GemmTile> gemm_candidates(const DeviceSpec& device, DenseMath math);
// Time of one tile config (roofline with tile and wave quantization, plus launch).
GemmEstimate gemm_time(const GemmShape& s, const GemmTile& tile, const DeviceSpec& device,
                       const Calibration& cal);
// The fastest candidate; deterministic (ties go to the earlier candidate).
GemmEstimate gemm_best(const GemmShape& s, const DeviceSpec& device, const Calibration& cal);

// Whether the GPU backend runs a checked bf16 product (with a bf16 output and a depth that is a
// multiple of 8) as one kernel that sums each row as it stores it, on this device: NVIDIA sm_90,
// whose warpgroup products and tensor-memory copies that kernel is written for
// (src/backend/gpu/checked_product.cu). Elsewhere it goes through the library and a row pass.
bool fused_checked_products(const DeviceSpec& device);

// Bytes of one product operand under a dense math: 2 for bf16 and fp16, 4 for fp32 and tf32.
double dense_operand_bytes(DenseMath m);

// A memory-bound pass moving `bytes` (plus one launch).
double memory_pass_time(double bytes, const DeviceSpec& device, const Calibration& cal);

// -------------------------------------------------------------- embeddings --

// Expected distinct rows among n draws over rows with the table's distribution.
double expected_unique_rows(std::int64_t rows, IdDistribution dist, double alpha, double draws);
// Fraction of draws that hit the `cached` most frequent rows.
double hot_fraction(std::int64_t rows, IdDistribution dist, double alpha, double cached);

enum class Placement : std::uint8_t { hbm, host };
inline constexpr NamedValue<Placement> kPlacementNames[] = {{"hbm", Placement::hbm},
                                                            {"host", Placement::host}};
std::string_view placement_name(Placement p);

// ------------------------------------------------------ embedding traffic --
//
// The bytes of device memory the table-batched embedding kernels move (src/backend/gpu/
// embedding.h) for one group of tables and one batch, stage by stage. One count for all: the
// planner predicts with it, and embedding_bench divides it by the measured time (the
// calibration's embedding efficiencies are that rate over the copy bandwidth).

// How the backward sorts its (key, bag) pairs (src/backend/gpu/radix_sort.h): the vendor's
// radix sort (CUB's, on CUDA) or the portable LSD sort (the only one on HIP).
enum class RadixSort : std::uint8_t { vendor, portable };
// The sort the GPU backend takes on the device by default: vendor on NVIDIA, portable on AMD.
RadixSort default_radix_sort(const DeviceSpec& device);
// Pairs per tile of the portable sort, whose digit counts are kept per tile (256 threads x 16
// pairs; src/backend/gpu/radix_sort.cu asserts it).
inline constexpr std::int64_t kPortableSortTile = 4096;
// Bytes a stable radix sort of n (uint32 key, uint32 value) pairs by key bits [0, key_bits)
// reads and writes: 8-bit digits, one pass per digit. The vendor figure is our count of CUB's
// one-sweep sort (one histogram pass over the keys, then each pass reads and writes the pairs);
// the portable sort per pass reads the keys (up-sweep), reads and writes the pairs (down-sweep)
// and scans its per-tile digit counts (read twice, written once).
double radix_sort_bytes(RadixSort sort, double n, int key_bits);
// Bits of the linearised (table, row) sort keys of a group holding `rows` rows in all: keys are
// in [0, rows] (rows marks a skipped id).
int embedding_key_bits(double rows);

// One group of tables (one weight buffer) and one batch.
struct EmbeddingBatch {
  struct Table {
    int dim = 0;
    double ids = 0;          // ids looked up
    double unique_rows = 0;  // distinct rows among them
    double heavy_ids = 0;    // ids in rows of more than kEmbeddingHeavyRow of them
  };
  std::span<const Table> tables;
  double batch = 0;  // bags per table
  DType weight_dtype = DType::f32;
  DType io_dtype = DType::f32;  // the pooled outputs, and the gradients the backward reads
  OptimizerKind optimizer = OptimizerKind::rowwise_adagrad;
  RadixSort sort = RadixSort::vendor;
  int key_bits = 32;  // embedding_key_bits of the group's rows
  // The device's caches (L2 and any last level): the backward reads a bag's gradient row once
  // per id, and a table's gradients that do not fit are read again from memory (0: not counted).
  double cache_bytes = 0;
};

struct EmbeddingTraffic {
  double forward = 0;  // ids and offsets read, every looked-up row read, pooled outputs written
  // The backward fused with the optimizer update, by stage:
  double ids_and_keys = 0;  // ids and offsets read, (key, bag) pairs written; segment starts
                            // found and written; sorted pairs and starts read by the update
  double sort = 0;          // radix_sort_bytes of the pairs
  double gradients = 0;     // output gradients read once per bag
  // ... and read again for the bag's other ids, the share of them that misses the caches: a
  // table's gradients (batch x dim) beyond cache_bytes, its ids walked in row order.
  double gradient_rereads = 0;
  double rows = 0;  // each distinct row's weights and optimizer state read and written
  double backward() const { return ids_and_keys + sort + gradients + gradient_rereads + rows; }
  double heavy_ids = 0;             // the tables' heavy_ids: not bytes, the heavy-row stages' work
  DType weight_dtype = DType::f32;  // the group's: the rows' traffic of 16-bit tables has its rate
};
EmbeddingTraffic embedding_traffic(const EmbeddingBatch& b);
// Seconds of the backward fused with the update for traffic t: its memory traffic at the
// backward's share of the copy rate plus its heavy rows' ids at their own cost. A backward over a
// device's tables adds embedding_backward_fixed_seconds once.
double embedding_backward_seconds(const EmbeddingTraffic& t, const DeviceSpec& device,
                                  const Calibration& cal);
double embedding_backward_fixed_seconds(bool any_heavy, const Calibration& cal);
// Expected ids, of `draws` drawn, that fall in rows drawn more than kEmbeddingHeavyRow times:
// uniform, by the Poisson tail of one row's count; Zipf, the draws of the ranks whose expected
// count passes the threshold (hot_fraction of those ranks).
double expected_heavy_ids(std::int64_t rows, IdDistribution dist, double alpha, double draws);

// The work of one table shard on one device for one step.
struct EmbeddingShardWork {
  std::int64_t rows = 0;  // rows in the shard
  int dim = 0;            // columns in the shard
  double bags = 0;        // pooled outputs produced per step
  double lookups = 0;     // ids looked up per step
  DType weight_dtype = DType::f32;
  // The pooled outputs and their gradients (bf16 under bf16 math with DCNv2).
  DType io_dtype = DType::f32;
  OptimizerKind optimizer = OptimizerKind::rowwise_adagrad;
  Placement placement = Placement::hbm;
  double cache_rows = 0;  // host placement: rows cached in HBM
  IdDistribution distribution = IdDistribution::uniform;
  double zipf_alpha = 0;
  int key_bits = 32;  // of the sort keys of the tables the device holds (embedding_key_bits)
};

struct EmbeddingCost {
  double forward_bytes = 0, backward_bytes = 0, host_bytes = 0;
  double unique_rows = 0;
  double heavy_ids = 0;  // expected_heavy_ids: where any, the backward's heavy stages run
  double forward_s = 0, backward_s = 0, host_s = 0;  // backward includes the fused update
};

EmbeddingCost embedding_cost(const EmbeddingShardWork& w, const DeviceSpec& device,
                             const Calibration& cal);
// Bytes of optimizer state per row.
double optimizer_state_bytes_per_row(OptimizerKind k, int dim);

// ------------------------------------------------------------- collectives --

enum class Collective : std::uint8_t { all_to_all, all_reduce, reduce_scatter, all_gather };
std::string_view collective_name(Collective c);

// Time of a collective where every one of `gpus` ranks holds `bytes` (all_reduce: the
// buffer; all_to_all: what each rank sends in total, itself included; reduce_scatter:
// the input; all_gather: the output). Latency-bandwidth model with nccl-tests' bus
// bandwidth factors: all_reduce 2(n-1)/n, the others (n-1)/n; hierarchical across
// scale-up domains.
double collective_time(Collective c, double bytes, int gpus, const DeviceSpec& device,
                       const Calibration& cal);

// One measured collective (parity bench comm): its kind, the bytes collective_time takes, the
// ranks and the seconds it took.
struct CollectiveSample {
  Collective kind = Collective::all_reduce;
  double bytes = 0;
  int gpus = 0;
  double seconds = 0;
};

// The scale-up terms of the calibration (collective_latency_up_s, scale_up_efficiency) with which
// collective_time fits the samples best: least squares on the relative error of
// t = latency + c / efficiency, c the sample's bus bytes over the device's scale-up bandwidth,
// the efficiency at most 1 and the latency at least 0. Every sample within one scale-up domain,
// of at least 2 ranks, and at least two distinct sizes; else InputError says which is not.
struct CollectiveFit {
  double latency_s = 0;
  double efficiency = 0;
  double rms_relative_error = 0;  // of the fitted model over the samples
  double worst_relative_error = 0;
  int samples = 0;
};
CollectiveFit fit_scale_up(const std::vector<CollectiveSample>& samples, const DeviceSpec& device);

// -------------------------------------------------------------------- HSTU --

// A batch of an HSTU model's sequences on average, from the model's length distribution (exact
// sums over the discrete lengths the synthetic data draw): per example its tokens (contexts +
// history + targets) and the (query, key) pairs its attention computes: with H = contexts +
// history, H(H + 1)/2 causal pairs among them and H + 1 for each target (the history and itself).
struct SequenceMoments {
  double history = 0;     // events per example
  double tokens = 0;      // tokens per example
  double tokens_sq = 0;   // E[tokens²] per example (the spread of a batch's token count)
  double pairs = 0;       // attention pairs per example
  double tokens_max = 0;  // the longest example's tokens (contexts + max_len + targets)
};
SequenceMoments sequence_moments(const ModelSpec& m);

// Tokens a batch of `examples` holds at most but with probability about 1e-9 (six standard
// deviations of the sum of independent lengths above its mean, plus one longest example), and
// never more than examples x tokens_max: what a plan sizes the per-token buffers for.
double token_capacity(const SequenceMoments& s, double examples);

// The HSTU attention kernels of one layer on a batch (src/backend/gpu/hstu_attention.cu on tensor
// cores, sequence.cu's scalar kernels otherwise). Tensor cores: each sequence of n tokens costs
// heads x max(n, n0) x t(max(n, n0)), t the calibration's time per (token, head) at full length n
// (hstu_attention: log-log interpolation between its lengths, linear in the head dim between its
// dims; n0 its shortest length, since a shorter sequence still takes a block of rows), summed
// exactly over the length distribution. Scalar: the causal FLOPs at
// hstu_attention_scalar_efficiency of the fp32 peak.
struct HstuAttentionCost {
  bool tensor_cores = false;
  double forward_s = 0, backward_s = 0;
  double forward_flops = 0, backward_flops = 0;  // causal (the pairs the model computes)
};
HstuAttentionCost hstu_attention_cost(const ModelSpec& m, double examples, DenseMath math,
                                      const DeviceSpec& dev, const Calibration& cal);
// Why the attention of `m` under `math` takes the scalar kernels on `dev` (empty: tensor cores),
// as the GPU backend decides (gpu_backend.cpp's tensor_core_attention).
std::string hstu_attention_scalar_reason(const ModelSpec& m, DenseMath math, const DeviceSpec& dev);

// The work of one HSTU layer per example, on average: FLOPs of its matrix products and of its
// attention (2 per multiply-add; attention forward 2 pairs heads (a + v), backward 2 pairs heads
// (3a + 2v): the scores again, dA, dV, dQ, dK), and the activation bytes it keeps per token
// for the backward, in the engine's fp32 storage (`element_bytes` each): x, the normed input, the
// projection before and after SiLU, the attention output, the norm-multiply output and four
// statistics; with recompute only x, the projection before SiLU, the attention output and the
// statistics are kept (SiLU, U/V/Q/K and the normed input are formed again in the backward).
struct HstuLayerWork {
  double projection_flops_forward = 0, projection_flops_backward = 0;
  double attention_flops_forward = 0, attention_flops_backward = 0;
  double activation_bytes_per_token = 0, activation_bytes_per_token_recompute = 0;
};
HstuLayerWork hstu_layer_work(const ModelSpec& m, double element_bytes = 4);

}  // namespace parity
