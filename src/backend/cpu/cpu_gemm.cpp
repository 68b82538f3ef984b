// Packed, register-tiled double-accumulating matrix product; see cpu_gemm.h for why.
//
// Loop structure, for each depth block of kDepthBlock values of k (in ascending order):
//   1. pack the rows of a into panels of kTileRows rows, k-major: [row_tiles][kc][kTileRows];
//   2. pack the columns of b into panels of kTileCols columns, k-major: [col_tiles][kc][kTileCols];
//   3. every (row tile, column tile) pair is an independent piece of c: threads split them.
// Tiles at the edges are padded with zeros in the panels; padded outputs are never stored.
#include "backend/cpu/cpu_gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "backend/cpu/cpu_common.h"
#include "parity/error.h"

namespace parity::cpu {
namespace {

constexpr int kTileRows = 4;
constexpr int kTileCols = 4;
constexpr std::int64_t kDepthBlock = 256;
// Below this many multiply-adds a product runs on the calling thread (fork/join costs more).
constexpr std::int64_t kParallelWork = std::int64_t{1} << 16;

// acc(i, j) += Σ_k a_panel[k][i] · b_panel[k][j] in ascending k, then stores the valid part.
// first: the sums start from +0 instead of the partial sums already in c.
void multiply_tile(std::int64_t depth, const double* __restrict a_panel,  // [depth, kTileRows]
                   const double* __restrict b_panel,                      // [depth, kTileCols]
                   bool first, double* __restrict c, std::int64_t ldc, int rows, int cols) {
  double acc[kTileRows][kTileCols];
  for (int i = 0; i < kTileRows; ++i) {
    for (int j = 0; j < kTileCols; ++j) {
      acc[i][j] = (first || i >= rows || j >= cols) ? 0.0 : c[i * ldc + j];
    }
  }
  for (std::int64_t k = 0; k < depth; ++k) {
    const double* a = a_panel + k * kTileRows;
    const double* b = b_panel + k * kTileCols;
    for (int i = 0; i < kTileRows; ++i) {
      for (int j = 0; j < kTileCols; ++j) acc[i][j] += a[i] * b[j];
    }
  }
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) c[i * ldc + j] = acc[i][j];
  }
}

}  // namespace

template <class TA, class TB>
void gemm(Strided<TA> a, Strided<TB> b, double* c, std::int64_t ldc, Threads threads) {
  const std::int64_t m_total = a.rows;
  const std::int64_t n_total = b.cols;
  const std::int64_t k_total = a.cols;
  if (b.rows != k_total) {
    throw Error(fmt::format("gemm: a has {} columns, b has {} rows", k_total, b.rows));
  }
  if (ldc < n_total) {
    throw Error(fmt::format("gemm: ldc {} is less than n {}", ldc, n_total));
  }
  if (m_total == 0 || n_total == 0) return;
  if (k_total == 0) {
    for (std::int64_t m = 0; m < m_total; ++m) std::fill(c + m * ldc, c + m * ldc + n_total, 0.0);
    return;
  }

  const std::int64_t row_tiles = (m_total + kTileRows - 1) / kTileRows;
  const std::int64_t col_tiles = (n_total + kTileCols - 1) / kTileCols;
  const std::int64_t depth_max = std::min(k_total, kDepthBlock);
  double* a_pack = detail::scratch(detail::Slot::pack_a, row_tiles * depth_max * kTileRows);
  double* b_pack = detail::scratch(detail::Slot::pack_b, col_tiles * depth_max * kTileCols);
  const bool parallel =
      threads == Threads::parallel && m_total * n_total * k_total >= kParallelWork;

#pragma omp parallel if (parallel)
  {
    for (std::int64_t k0 = 0; k0 < k_total; k0 += kDepthBlock) {
      const std::int64_t depth = std::min(kDepthBlock, k_total - k0);

#pragma omp for schedule(static)
      for (std::int64_t rt = 0; rt < row_tiles; ++rt) {
        double* panel = a_pack + rt * depth * kTileRows;  // [depth, kTileRows]
        for (std::int64_t k = 0; k < depth; ++k) {
          for (int i = 0; i < kTileRows; ++i) {
            const std::int64_t m = rt * kTileRows + i;
            panel[k * kTileRows + i] = m < m_total ? static_cast<double>(a(m, k0 + k)) : 0.0;
          }
        }
      }

#pragma omp for schedule(static)
      for (std::int64_t ct = 0; ct < col_tiles; ++ct) {
        double* panel = b_pack + ct * depth * kTileCols;  // [depth, kTileCols]
        for (int j = 0; j < kTileCols; ++j) {
          const std::int64_t n = ct * kTileCols + j;
          for (std::int64_t k = 0; k < depth; ++k) {
            panel[k * kTileCols + j] = n < n_total ? static_cast<double>(b(k0 + k, n)) : 0.0;
          }
        }
      }

      // Row-tile-major order: consecutive tiles of one thread share the a panel.
#pragma omp for schedule(static)
      for (std::int64_t tile = 0; tile < row_tiles * col_tiles; ++tile) {
        const std::int64_t rt = tile / col_tiles;
        const std::int64_t ct = tile % col_tiles;
        const int rows =
            static_cast<int>(std::min<std::int64_t>(kTileRows, m_total - rt * kTileRows));
        const int cols =
            static_cast<int>(std::min<std::int64_t>(kTileCols, n_total - ct * kTileCols));
        multiply_tile(depth, a_pack + rt * depth * kTileRows, b_pack + ct * depth * kTileCols,
                      k0 == 0, c + rt * kTileRows * ldc + ct * kTileCols, ldc, rows, cols);
      }
    }
  }
}

template void gemm<float, float>(Strided<float>, Strided<float>, double*, std::int64_t, Threads);
template void gemm<double, double>(Strided<double>, Strided<double>, double*, std::int64_t,
                                   Threads);
template void gemm<double, float>(Strided<double>, Strided<float>, double*, std::int64_t, Threads);

}  // namespace parity::cpu
