// The matrix-product problems kernel selection is judged on (bench/gemm_bench.cpp times them):
// every product of the zoo's models in forward, data-gradient and weight-gradient form at several
// batch sizes (token counts for the HSTU models), and random shapes with awkward sizes and
// alignments. Host-only, deterministic for a seed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "parity/select.h"

namespace parity {

struct SuiteProblem {
  std::string origin;  // "mlperf-dlrmv2 top.0 dgrad b65536", "random 17"
  GemmProblem problem;
};

struct SuiteOptions {
  std::vector<std::int64_t> batches = {2048, 16384, 65536};  // DLRM examples per product
  std::vector<std::int64_t> tokens = {32768, 262144};        // HSTU tokens per product
  int random = 64;                                           // random shapes per type
  std::uint64_t seed = 2026;
};

// The problems of one operand type, deduplicated (the first origin of a shape kept), zoo
// products first in file-name order, then the random shapes. fp8 (e4m3) keeps only the form the
// tensor cores take (B transposed as stored, A not: the forward products).
std::vector<SuiteProblem> gemm_suite(const std::filesystem::path& models_dir, GemmType type,
                                     const SuiteOptions& o);

}  // namespace parity
