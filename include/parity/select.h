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
// with tiles = ceil(m / tile_m) · ceil(n / tile_n) · split, waves = ceil(tiles / slots) and
// K = ceil(ceil(k / split) / tile_k) (a size the library leaves open counts as kNominalTile /
// kNominalStep), plus, split over s slices, reduction_fixed_s and the s partial fp32 results
// written and read back with the output; never under fixed_s plus the operands and the output
// moved once at the HBM rate.
struct CatalogKernel {
  GemmKernel kernel;
  int max_split_k = 1;  // 1: the configuration has no split-K form
  SplitReduction split_reduction = SplitReduction::none;
  int min_align_a = 0, min_align_b = 0, min_align_d = 0;  // bytes, of addresses and rows
  double slots = 0;  // tiles in flight at once on the device (one wave)
  double fixed_s = 0, tile_s = 0, kstep_s = 0;
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

// The configurations measured for one kind of product.
struct CatalogGroup {
  GemmType type = GemmType::bf16;
  bool ta = false, tb = false, narrow_output = false;
  GemmEpilogue epilogue = GemmEpilogue::none;
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
  std::string measured;          // when and with what command
  double reduction_fixed_s = 0;  // one split-K reduction's own cost
  std::vector<CatalogGroup> groups;

  // The group for a problem's kind; nullptr if none was measured.
  const CatalogGroup* group_for(const GemmProblem& p) const;
};

// Reads and checks a catalog: every field present, of its type, finite and in range; a bad one
// is an InputError naming the file and the field (groups[2].kernels[5].kstep_s).
GemmCatalog load_gemm_catalog(const std::filesystem::path& file);
// Writes it (to a temporary file renamed into place).
void save_gemm_catalog(const GemmCatalog& c, const std::filesystem::path& file);

// The bytes of alignment a problem's operand offers: the smaller of its address's and its rows'
// (leading dimension times element size).
int operand_alignment(int address_alignment, std::int64_t lead, int element_bytes);

struct KernelEstimate {
  GemmKernel kernel;  // with its split-K
  double seconds = 0;
  double waves = 0;
};

// Every catalog configuration that can run the problem (alignment, split-K depth), with its
// predicted time, fastest first; ties broken by the configuration's fields, so the order is the
// same on every run and every rank. Empty when the catalog has no group for the problem's kind.
// hbm_bytes_per_s: the device's achieved memory rate (the floor of every product).
std::vector<KernelEstimate> rank_gemm_kernels(const GemmProblem& p, const GemmCatalog& c,
                                              double hbm_bytes_per_s);

}  // namespace parity
