// The BLAS library's kernels for one matrix-product problem: enumerated, checked by the library,
// described as vendor-neutral GemmKernels (parity/select.h), rebuilt from such a description, and
// run. Host entry points only; the library's names stay in blas_port.h.
//
// Why it is built this way:
// - The heuristic answers a handful of configurations; the library runs many more. Enumeration
//   walks the library's own lists (algorithm ids for the types, each algorithm's tiles and
//   stages, split-K, rasterisation and custom options, cluster shapes) and keeps what the
//   library's check accepts for the problem, with the workspace and wave count it reports. The
//   walk is bounded: split-K, swizzle and custom variants are tried on the configurations whose
//   base form the library accepted, split-K only where the tiles of D fill less than two waves.
// - A GemmKernel names every configuration field, so a plan can store the choice and the backend
//   can rebuild the same library configuration on another run (configure()).
// - Split-K reductions are the out-of-place schemes only (the in-place one sums in the output and
//   is left out), so a chosen kernel gives the same bits on every run.
// - hipBLASLt's C interface exposes no configuration fields: there the enumeration is its
//   heuristic asked for many answers, each described by its solution index alone.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "backend/gpu/blas_port.h"
#include "parity/select.h"

#if PARITY_GPU_HAVE_BLASLT

namespace parity::gpu {

// A problem's descriptors as the library takes them, wherever they were built (a BlasOperation,
// or blas.cpp's cached plans), with the types they were built for.
struct BlasDescriptors {
  GemmProblem problem;
  blas::MatmulDesc desc = nullptr;
  blas::Layout la = nullptr, lb = nullptr, lc = nullptr, ld = nullptr;
  blas::ComputeType compute{};
  blas::DataType operand{}, output{};
};
// The compute, operand and output types of a problem (BlasDescriptors' last three fields).
void blas_types(const GemmProblem& p, BlasDescriptors& d);

// The matmul descriptor and the four layouts of one problem (row-major D = op(A) op(B) read
// column-major as Dᵀ = op(B)ᵀ op(A)ᵀ: the library's A is our B).
class BlasOperation {
 public:
  explicit BlasOperation(const GemmProblem& p);
  ~BlasOperation();
  BlasOperation(const BlasOperation&) = delete;
  BlasOperation& operator=(const BlasOperation&) = delete;

  const GemmProblem& problem() const { return p_; }
  blas::MatmulDesc desc() const { return desc_; }
  blas::Layout la() const { return la_; }  // our B
  blas::Layout lb() const { return lb_; }  // our A
  blas::Layout lc() const { return lc_; }
  blas::Layout ld() const { return ld_; }
  blas::ComputeType compute() const { return compute_; }
  blas::DataType operand_type() const { return operand_; }
  blas::DataType output_type() const { return output_; }
  // Sets the bias pointer (bias epilogues).
  void set_bias(const void* bias) const;
  BlasDescriptors descriptors() const {
    return {p_, desc_, la_, lb_, lc_, ld_, compute_, operand_, output_};
  }

 private:
  GemmProblem p_;
  blas::ComputeType compute_;
  blas::DataType operand_, output_;
  blas::MatmulDesc desc_ = nullptr;
  blas::Layout la_ = nullptr, lb_ = nullptr, lc_ = nullptr, ld_ = nullptr;
};

// A configuration in both forms: the description and the library's own.
struct LibraryKernel {
  GemmKernel kernel;
  blas::Algo algo{};
};

struct EnumerateLimits {
  int max_split_k = 16;
  bool cluster_shapes = true;  // try 1x1, 2x1 and 1x2 beside the library's automatic choice
  int max_kernels = 20000;     // stop the walk past this many accepted configurations
};

// What a walk did: configurations asked of the library's check and accepted.
struct EnumerateStats {
  std::int64_t checked = 0;
  std::int64_t accepted = 0;
  int algorithms = 0;
};

// The heuristic's first `count` answers for the problem, in its order (deterministic split-K
// reductions only; alignments from the problem).
std::vector<LibraryKernel> heuristic_kernels(blas::Handle h, const BlasOperation& op,
                                             std::size_t workspace_bytes, int count);

// Every configuration the library accepts for the problem, within the limits, in a fixed order.
std::vector<LibraryKernel> enumerate_kernels(blas::Handle h, const BlasOperation& op,
                                             std::size_t workspace_bytes,
                                             const EnumerateLimits& limits,
                                             EnumerateStats* stats = nullptr);

// The library's configuration for a description, checked against the problem: false (with the
// library's reason in *why) when the library has no such configuration or rejects it here. On
// success the kernel's workspace and wave count are the check's.
// The configuration read back from the library must name the same fields as the description
// (an id the tables do not know would otherwise turn silently into the library's default).
bool configure(blas::Handle h, const BlasDescriptors& d, std::size_t workspace_bytes,
               GemmKernel& kernel, blas::Algo& algo, std::string* why);
inline bool configure(blas::Handle h, const BlasOperation& op, std::size_t workspace_bytes,
                      GemmKernel& kernel, blas::Algo& algo, std::string* why) {
  return configure(h, op.descriptors(), workspace_bytes, kernel, algo, why);
}

// Runs the product with one configuration: D = A·B (+ beta·D) on stream s.
blas::Status run_kernel(blas::Handle h, const BlasOperation& op, const blas::Algo& algo,
                        const void* a, const void* b, void* d, float beta, void* workspace,
                        std::size_t workspace_bytes, Stream_t s);

// What a configuration's algorithm supports beyond its fields, in the problem's own terms (the
// library's A is our B): its split-K depth (1 without split-K) and the reduction a split uses
// (the output-type scheme where the library offers it, else the compute-type one), and the
// alignment in bytes it needs of A, B and D.
struct KernelCaps {
  int max_split_k = 1;
  SplitReduction split_reduction = SplitReduction::none;
  int min_align_a = 0, min_align_b = 0, min_align_d = 0;
};
KernelCaps kernel_caps(const blas::Algo& algo);

// Microseconds one run takes, the mean of back-to-back runs that fill about target_ms (at least
// 3, at most 200) after one warm-up run; negative when the library refuses to run it.
double time_kernel_us(blas::Handle h, const BlasOperation& op, const blas::Algo& algo,
                      const void* a, const void* b, void* d, void* workspace,
                      std::size_t workspace_bytes, Stream_t s, double target_ms);

// The library's version number (for plans: a choice is valid for the library that made it).
std::size_t blas_library_version();

}  // namespace parity::gpu

#endif  // PARITY_GPU_HAVE_BLASLT
