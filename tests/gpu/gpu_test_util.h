// Helpers for the GPU backend tests: skipping where no GPU is present, random embedding problems
// in the CPU backend's layout (table offsets, one table-major CSR, output columns with gaps),
// device copies of host vectors, and the CPU reference.
//
// Why it is built this way: every GPU kernel is judged against the CPU backend (the oracle) on
// random inputs drawn from parity's counter-based RNG with a fixed seed per test, so a failure is
// reproducible from the seed in its message. Outputs are poisoned (all bits set: NaN in fp32 and
// bf16) before every run, so an element a kernel failed to write shows up as NaN, and columns it
// must not write are checked to still hold the poison.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/gpu/embedding.h"
#include "backend/gpu/numerics.h"
#include "backend/gpu/runtime.h"
#include "parity/data.h"
#include "parity/random.h"

namespace parity::gpu::test {

#define PARITY_REQUIRE_GPU()                                                                      \
  do {                                                                                            \
    if (::parity::gpu::device_count() == 0) {                                                     \
      GTEST_SKIP() << "skipped: " << ::parity::gpu::no_device_reason()                            \
                   << " (the GPU tests run on a GPU machine, e.g. through scripts/gpu-tests.sh)"; \
    }                                                                                             \
  } while (0)

class Rand {
 public:
  explicit Rand(std::uint64_t seed, std::uint64_t stream = 0) : s_(rng::key(seed, stream)) {}
  float uniform(float lo = -1.0f, float hi = 1.0f) {
    return static_cast<float>(lo + (hi - lo) * s_.next_uniform());
  }
  std::int64_t integer(std::int64_t lo, std::int64_t hi) {  // [lo, hi]
    return lo + static_cast<std::int64_t>(s_.next_below(static_cast<std::uint64_t>(hi - lo + 1)));
  }
  double u() { return s_.next_uniform(); }

 private:
  rng::Stream s_;
};

// A batch of embedding inputs and the layout of its tables (host side).
struct Problem {
  std::vector<TableLayout> tables;
  std::int64_t batch = 0;
  std::int64_t out_cols = 0;  // columns of the output view (gaps between tables included)
  std::int64_t ld = 0;        // leading dimension of the output buffer (>= out_cols)
  std::vector<std::int64_t> ids;
  std::vector<std::int64_t> offsets;
  std::int64_t weight_elems = 0;
  std::int64_t state_elems = 0;
  SparseInput input() const {
    return {batch, static_cast<int>(tables.size()), ids.data(), offsets.data()};
  }
};

struct ProblemSpec {
  std::vector<int> dims;
  std::vector<std::int64_t> rows;
  std::vector<Pooling> pooling;  // one per table (cycled)
  std::int64_t batch = 64;
  int max_pool = 8;         // bag sizes in [0, max_pool], with extra weight on 0 and 1
  double zipf_alpha = 0.0;  // 0: uniform ids; > 0: Zipf(alpha) (duplicate-heavy)
  int gap = 3;              // unused output columns between tables
  int ld_extra = 5;         // ld - out_cols
  OptimizerKind kind = OptimizerKind::sgd;
  DType dtype = DType::f32;
  int offset_pad = 0;               // extra elements between tables' weights (misaligns rows)
  std::vector<double> ids_per_bag;  // TableLayout::ids_per_bag, one per table (cycled; empty: 0)
};

inline Problem make_problem(const ProblemSpec& spec, std::uint64_t seed) {
  Problem p;
  Rand rand(seed, 1);
  std::int64_t weight = 0, state = 0, col = spec.gap;
  for (std::size_t t = 0; t < spec.dims.size(); ++t) {
    TableLayout tl;
    tl.rows = spec.rows[t % spec.rows.size()];
    tl.dim = spec.dims[t];
    tl.pooling = spec.pooling[t % spec.pooling.size()];
    tl.weight_offset = weight;
    tl.state_offset = state;
    tl.out_col = col;
    tl.dtype = spec.dtype;
    if (!spec.ids_per_bag.empty()) tl.ids_per_bag = spec.ids_per_bag[t % spec.ids_per_bag.size()];
    weight += tl.rows * tl.dim + spec.offset_pad;
    state += spec.kind == OptimizerKind::rowwise_adagrad ? tl.rows : tl.rows * tl.dim;
    col += tl.dim + spec.gap;
    p.tables.push_back(tl);
  }
  p.batch = spec.batch;
  p.out_cols = col;
  p.ld = col + spec.ld_extra;
  p.weight_elems = weight;
  p.state_elems = state;
  p.offsets.push_back(0);
  for (std::size_t t = 0; t < p.tables.size(); ++t) {
    const std::int64_t rows = p.tables[t].rows;
    ZipfSampler zipf(rows, spec.zipf_alpha > 0 ? spec.zipf_alpha : 1.0);
    // Zipf ranks scattered over the rows by a fixed odd multiplier (hot rows not adjacent).
    const std::int64_t mult = rows > 1 ? 2 * (rows / 3) + 1 : 1;
    for (std::int64_t b = 0; b < spec.batch; ++b) {
      const double r = rand.u();
      const std::int64_t n = r < 0.1 ? 0 : (r < 0.2 ? 1 : rand.integer(0, spec.max_pool));
      for (std::int64_t i = 0; i < n; ++i) {
        std::int64_t id;
        if (spec.zipf_alpha > 0) {
          const std::int64_t rank = zipf.sample(rand.u(), rand.u());
          id = static_cast<std::int64_t>((static_cast<unsigned __int128>(rank) * mult) % rows);
        } else {
          id = rand.integer(0, rows - 1);
        }
        p.ids.push_back(id);
      }
      p.offsets.push_back(static_cast<std::int64_t>(p.ids.size()));
    }
  }
  return p;
}

// Host values of weights: uniform in [-1, 1) or small integers; rounded to the weight dtype so
// that the fp32 copy is the exact value the GPU reads.
inline std::vector<float> random_values(std::int64_t n, std::uint64_t seed, bool integers,
                                        DType dtype, float lo = -1.0f, float hi = 1.0f) {
  Rand rand(seed, 2);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) {
    x = integers ? static_cast<float>(rand.integer(-8, 8)) : rand.uniform(lo, hi);
    if (dtype == DType::f16) x = half_to_float(half_bits(x));
    if (dtype == DType::bf16) x = bf16_to_float(bf16_bits(x));
  }
  return v;
}

// The values stored as `dtype` (2 or 4 bytes each).
inline std::vector<std::uint8_t> encode(const std::vector<float>& v, DType dtype) {
  std::vector<std::uint8_t> out(v.size() * dtype_size(dtype));
  for (std::size_t i = 0; i < v.size(); ++i)
    store_element(out.data(), dtype, static_cast<std::int64_t>(i), v[i]);
  return out;
}
inline std::vector<float> decode(const std::vector<std::uint8_t>& bytes, DType dtype) {
  std::vector<float> out(bytes.size() / dtype_size(dtype));
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = load_element(bytes.data(), dtype, static_cast<std::int64_t>(i));
  return out;
}

template <class T>
DeviceBuffer<T> to_device(const std::vector<T>& v) {
  DeviceBuffer<T> d(std::max<std::size_t>(v.size(), 1));
  d.upload_sync(v.data(), v.size());
  return d;
}
template <class T>
std::vector<T> to_host(const DeviceBuffer<T>& d, std::size_t n) {
  std::vector<T> v(n);
  d.download_sync(v.data(), n);
  return v;
}

// The problem's CSR on the device.
struct DeviceInput {
  DeviceBuffer<std::int64_t> ids;
  DeviceBuffer<std::int64_t> offsets;
  DeviceSparseInput in;
  explicit DeviceInput(const Problem& p) : ids(to_device(p.ids)), offsets(to_device(p.offsets)) {
    in.batch = p.batch;
    in.num_tables = static_cast<int>(p.tables.size());
    in.ids = ids.data();
    in.offsets = offsets.data();
    in.nnz = static_cast<std::int64_t>(p.ids.size());
  }
};

// Layouts as the CPU reference must see them: fp32 storage (the test compares against the exact,
// unrounded update and checks the GPU's rounding itself).
inline std::vector<TableLayout> as_f32(std::vector<TableLayout> tables) {
  for (auto& t : tables) t.dtype = DType::f32;
  return tables;
}

}  // namespace parity::gpu::test
