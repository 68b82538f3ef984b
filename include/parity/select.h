// Zero-warm-up kernel selection: matrix-product problems and the BLAS library's kernel
// configurations, described without naming the library, so that host-only code (the planner,
// the selector, a plan file) can reason about them and the GPU backend can rebuild the exact
// configuration from the description.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace parity {

// What the operands of a product hold and how the tensor cores read them.
//   f32   fp32 operands, fp32 products (no tensor cores)
//   tf32  fp32 operands read as tf32 by the tensor cores
//   bf16, f16   16-bit operands
//   e4m3  8-bit float operands (scales of 1)
enum class GemmType : std::uint8_t { f32, tf32, bf16, f16, e4m3 };
const char* gemm_type_name(GemmType t);
// Bytes per operand element.
int gemm_operand_bytes(GemmType t);

enum class GemmEpilogue : std::uint8_t { none, relu, bias, relu_bias };
// "none", "relu", "bias", "relu_bias": the names catalogs and plans store.
const char* gemm_epilogue_name(GemmEpilogue e);

// D [m, n] (row-major, ldd) = op(A) [m, k] · op(B) [k, n] (+ D when accumulate) (+ bias [n])
// (relu); A and B row-major as stored, `transposed` meaning the product uses the transpose.
struct GemmProblem {
  std::int64_t m = 0, n = 0, k = 0;
  bool ta = false, tb = false;
  GemmType type = GemmType::bf16;
  // D in a 16-bit type (bf16 for bf16 and e4m3 operands, fp16 for f16), else fp32.
  bool narrow_output = false;
  bool accumulate = false;
  GemmEpilogue epilogue = GemmEpilogue::none;
  std::int64_t lda = 0, ldb = 0, ldd = 0;  // 0: packed (the stored row length)
  // The largest power of two (bytes, up to 256) that divides each operand's address.
  int align_a = 256, align_b = 256, align_d = 256;

  // lda/ldb/ldd with 0 replaced by the packed leading dimension.
  std::int64_t lead_a() const { return lda > 0 ? lda : (ta ? m : k); }
  std::int64_t lead_b() const { return ldb > 0 ? ldb : (tb ? k : n); }
  std::int64_t lead_d() const { return ldd > 0 ? ldd : n; }
  int output_bytes() const { return narrow_output ? 2 : 4; }
  // "bf16 8192x1024x512 NT" style text (N/T: A, B transposed as stored).
  std::string describe() const;
};

// How split-K partial results are summed.
enum class SplitReduction : std::uint8_t { none, in_place, compute_type, output_type };

// One configuration of one of the library's kernels. Sizes are 0 where the library decides
// (automatic stages or cluster shape) or does not say. Tile and cluster sizes are along the
// problem's own m and n (the column-major libraries compute Dᵀ and name them the other way
// round).
struct GemmKernel {
  int algo = 0;                      // the library's algorithm id
  int tile_m = 0, tile_n = 0;        // the thread-block tile of D
  int tile_k = 0, stages = 0;        // k per pipeline stage, stages in flight
  int cluster_m = 0, cluster_n = 0;  // thread-block cluster (Hopper and later)
  int split_k = 1;
  SplitReduction reduction = SplitReduction::none;
  int swizzle = 0;  // thread-block rasterisation option
  int custom = 0;   // the library's custom option of the algorithm
  int inner = 0;    // the library's instruction-shape id
  // From the library's check of this configuration against the problem:
  std::int64_t workspace_bytes = 0;
  float waves = 0;  // thread blocks over the device's concurrent slots

  // A stable text naming every configuration field: the tie-break key of the ranking and the
  // form a plan stores, e.g. "a66 t128x256 k64x4 c2x1 s1 r0 w0 o0 i0".
  std::string key() const;
  bool same_config(const GemmKernel& o) const { return key() == o.key(); }
};

// ------------------------------------------------------------------- the kernel catalog --

// One library configuration as `parity calibrate` measured it on a device (split_k 1: split-K
// variants are derived from it). Its time on a problem is
//   t = fixed_s + waves · (tile_s + K · kstep_s)
// with K = ceil(ceil(k / split) / tile_k) k steps and waves = catalog_waves(tiles, slots, P)
// over tiles = catalog_tiles(m, n) · split (a size the library leaves open counts as
// kNominalTile / kNominalStep), plus, split over s slices, reduction_fixed_s and the s partial
// fp32 results written and read back with the output; never under fixed_s plus the operands and
// the output moved once at the HBM rate, nor under fixed_s plus its FLOPs at the kind's measured
// peak rate, nor under the catalog's call_s (the cheapest call of the library measured).
// tile_s and kstep_s are measured on a few waves whose operands and output stay in L2; a
// problem whose operands and output outgrow L2 streams them from memory, and its waves cost
// what stream_tile_s and stream_kstep_s measured (many waves, twice L2 of output): the two pairs
// are blended by memory_regime(p, l2_bytes), 0 at a footprint of L2 and below, 1 at twice L2
// and above, linear in its logarithm between. A configuration without streaming costs (both 0;
// catalogs before parity-gemm-catalog-4) uses its L2 costs everywhere.
struct CatalogKernel {
  GemmKernel kernel;
  int max_split_k = 1;  // 1: the configuration has no split-K form
  SplitReduction split_reduction = SplitReduction::none;
  int min_align_a = 0, min_align_b = 0, min_align_d = 0;  // bytes, of addresses and rows
  double slots = 0;  // tiles in flight at once on the device (one wave)
  double fixed_s = 0, tile_s = 0, kstep_s = 0;
  double stream_tile_s = 0, stream_kstep_s = 0;

  bool has_stream_costs() const { return stream_tile_s + stream_kstep_s > 0; }
};

inline constexpr int kNominalTile = 64;  // the tile of a configuration without one
inline constexpr int kNominalStep = 32;  // the k step of a configuration without one

// A configuration's tile (m, n) and k step as the formula counts them: its own sizes, or the
// nominal ones where the library leaves them open.
struct CountedTile {
  std::int64_t m, n, k;
};
inline CountedTile counted_tile(const GemmKernel& k) {
  return {k.tile_m > 0 ? k.tile_m : kNominalTile, k.tile_n > 0 ? k.tile_n : kNominalTile,
          k.tile_k > 0 ? k.tile_k : kNominalStep};
}

// The tiles of D a configuration launches for an m x n output: each side's tile count rounded
// up to a whole number of thread-block clusters (a cluster is scheduled whole).
double catalog_tiles(const GemmKernel& k, std::int64_t m, std::int64_t n);

// The waves `tiles` take on a device of P multiprocessors that holds `slots` tiles at once. Where
// several tiles share a multiprocessor (slots > P), a last, partial wave costs what its fullest
// multiprocessor holds: waves = ceil(tiles / P) · P / slots; otherwise ceil(tiles / slots).
double catalog_waves(double tiles, double slots, int multiprocessors);

// The configurations measured for one kind of product.
struct CatalogGroup {
  GemmType type = GemmType::bf16;
  bool ta = false, tb = false, narrow_output = false;
  GemmEpilogue epilogue = GemmEpilogue::none;
  // The fastest rate (2·m·n·k FLOP/s) any configuration of the kind reached when measured.
  double peak_flops_per_s = 0;
  std::vector<CatalogKernel> kernels;

  // The kind as a problem of no size, and the empty group of a problem's kind.
  GemmProblem kind() const;
  static CatalogGroup of_kind(const GemmProblem& p);
};

struct GemmCatalog {
  std::string source_file;
  std::string device;   // the device spec's name, e.g. "h200"
  std::string library;  // "cuBLASLt", "hipBLASLt"
  std::int64_t library_version = 0;
  int multiprocessors = 0;       // of the GPU measured
  std::int64_t l2_bytes = 0;     // of the GPU measured; 0: the streaming costs are not used
  std::string measured;          // when and with what command
  double reduction_fixed_s = 0;  // one split-K reduction's own cost
  // The time of the cheapest product the library runs (a 16 x 16 x 16 one, back to back): the
  // host's and the launch's share of every call, which no configuration's fit may undercut.
  double call_s = 0;
  std::vector<CatalogGroup> groups;

  // The group for a problem's kind; nullptr if none was measured.
  const CatalogGroup* group_for(const GemmProblem& p) const;
};

// One timed run of a configuration, as the catalog's formula counts it: `waves` waves of tiles of
// `steps` k steps each took `seconds`.
struct CostSample {
  double waves = 0, steps = 0, seconds = 0;
};
struct CostFit {
  double fixed_s = 0, tile_s = 0, kstep_s = 0;
  double rms_relative_error = 0;  // of the fitted times against the samples
};
// One configuration as calibration measured it: every timed run with its problem's shape, the
// fitted constants, and whether the catalog kept it. Written by `parity calibrate --samples` so
// that other forms of the model can be tried on the same runs without a GPU.
struct MeasuredKernel {
  GemmProblem kind;  // the kind of product (no size)
  CatalogKernel kernel;
  std::vector<GemmProblem> shapes;  // the problem of each run, as samples
  std::vector<CostSample> samples;
  std::vector<GemmProblem> stream_shapes;  // the streaming runs (shallow, deep), if measured
  std::vector<CostSample> stream_samples;
  double rms_relative_error = 0;
  bool kept = false;
};

// How far a problem's operands and output (each moved once) outgrow an L2 of `l2_bytes`: 0 at
// L2 and below, 1 at twice L2 and above, log2(footprint / L2) between; 0 where l2_bytes is 0.
double memory_regime(const GemmProblem& p, std::int64_t l2_bytes);

// The streaming costs (tile, kstep) from two runs of many waves, a shallow and a deep one, with
// the configuration's fixed cost known: t = fixed + waves · (tile + steps · kstep) solved
// exactly, a negative constant set to 0 and the other refitted to the deep run. Throws Error on
// runs whose waves, steps or times are not above 0, or whose depths are equal.
CostFit fit_stream_costs(double fixed_s, const CostSample& shallow, const CostSample& deep);

// The constants of t = fixed + waves · (tile + steps · kstep), none negative, that fit the
// samples best in relative error (least squares over every subset of the three held at 0).
// Throws Error on fewer than three samples or a time not above 0.
CostFit fit_kernel_costs(const std::vector<CostSample>& samples);

// The configurations of a group worth keeping: those that rank first, within 3% of first, or
// among the first three on some shape of a grid (m and n 64 to 65,536, k 64 to 32,768, each a
// multiple of 64 or 1, 2 or 4 elements past one, so that rows of every alignment are asked),
// ranked without the cheapest call's floor (which would tie every configuration of a small shape).
std::vector<CatalogKernel> useful_kernels(const GemmCatalog& c, const CatalogGroup& g,
                                          double hbm_bytes_per_s);
// Keeps the useful configurations of every group (parity calibrate, after measuring).
void prune_gemm_catalog(GemmCatalog& c, double hbm_bytes_per_s);

// Reads and checks a catalog: every field present, of its type, finite and in range; a bad one
// is an InputError naming the file and the field (groups[2].kernels[5].kstep_s).
GemmCatalog load_gemm_catalog(const std::filesystem::path& file);
// Writes it (to a temporary file renamed into place).
void save_gemm_catalog(const GemmCatalog& c, const std::filesystem::path& file);

// The bytes of alignment a problem's operand offers: the smaller of its address's and its rows'
// (leading dimension times element size).
int operand_alignment(int address_alignment, std::int64_t lead, int element_bytes);
// The same for a stored [rows, cols] output: one row counts its address alone; one column
// strides by its leading dimension like any matrix (the library refuses its 16-byte kernels for
// an n = 1 output packed as a column).
int operand_alignment(int address_alignment, std::int64_t rows, std::int64_t cols,
                      std::int64_t lead, int element_bytes);
// The same for A or B stored [rows, cols], k running along its columns (A [m, k], B [n, k]
// stored transposed) or its rows: a vector along k (one row of the first, one packed column of
// the second) counts its address alone; a vector across k (k = 1) strides by its leading
// dimension like any matrix, as the library reads it.
int operand_alignment(int address_alignment, std::int64_t rows, std::int64_t cols,
                      std::int64_t lead, int element_bytes, bool k_along_cols);

// The workspace the GPU backend gives the BLAS library (cuBLAS's recommendation for Hopper): a
// split-K configuration whose fp32 partial results do not fit it is never ranked.
inline constexpr std::int64_t kGemmWorkspaceBytes = std::int64_t{32} << 20;

struct KernelEstimate {
  GemmKernel kernel;  // with its split-K
  double seconds = 0;
  double waves = 0;
};

// Every catalog configuration that can run the problem (alignment), each at its fastest split-K
// depth, with its predicted time, fastest first; ties broken by the configuration's fields, so the
// order is the same on every run and every rank. Empty when the catalog has no group for the
// problem's kind. hbm_bytes_per_s: the device's achieved memory rate (the floor of every product).
std::vector<KernelEstimate> rank_gemm_kernels(const GemmProblem& p, const GemmCatalog& c,
                                              double hbm_bytes_per_s);

// A plan's choice for one product of the step (Plan::kernels, made by the planner): the product
// and the catalog's configurations to run it with, in order; the backend runs the first the
// library accepts.
struct GemmDecision {
  std::string op;  // the plan's name for the product, for messages
  GemmProblem problem;
  std::vector<GemmKernel> ranked;
};
// The key a decision is found by: the problem's kind and shape (an accumulating product shares
// its plain form's choice).
std::string decision_key(GemmProblem p);

// Where a backend's products took their configurations from.
struct GemmSelectionCounts {
  std::int64_t planned = 0;    // the plan's decision
  std::int64_t ranked = 0;     // the catalog's ranking when the product first ran
  std::int64_t heuristic = 0;  // the library's heuristic where neither gave one it accepts
};

// The configuration a stored key names (GemmKernel::key(), split-K depth included) among the
// catalog's configurations of the problem's kind, with the split and its reduction applied; false
// where the catalog has no such configuration or its split is not one the configuration allows.
bool find_catalog_kernel(const GemmCatalog& c, const GemmProblem& kind, const std::string& key,
                         GemmKernel& out);

}  // namespace parity
