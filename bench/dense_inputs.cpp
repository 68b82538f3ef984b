// dense_bench's shapes, input sets and timing (dense_bench.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "backend/gpu/fill.h"
#include "dense_bench.h"
#include "parity/dtype.h"
#include "parity/random.h"

namespace parity::bench {

StepShapes::StepShapes(const ModelSpec& m, std::int64_t b, DType activation_dtype)
    : batch(b), features(m.dense_features), act(activation_dtype) {
  int width = m.dense_features;
  for (std::size_t i = 0; i < m.bottom_mlp.size(); ++i) {
    bottom.push_back({fmt::format("bottom.{}", i), width, m.bottom_mlp[i], Activation::relu});
    width = m.bottom_mlp[i];
  }
  d = width;
  n = m.interaction_input_dim();
  inter_out = m.interaction_output_dim();
  tables = m.num_tables();
  dcn = m.interaction.kind == InteractionKind::dcnv2;
  if (dcn) {
    rank = m.interaction.low_rank;
    cross_layers = m.interaction.cross_layers;
  }
  width = inter_out;
  for (std::size_t i = 0; i < m.top_mlp.size(); ++i) {
    const bool last = i + 1 == m.top_mlp.size();
    top.push_back({fmt::format("top.{}", i), width, m.top_mlp[i],
                   last ? Activation::none : Activation::relu});
    width = m.top_mlp[i];
  }
  x0 = dcn ? act : DType::f32;
  grad = x0;
}

TensorSpec matrix(DType t, std::int64_t rows, std::int64_t cols, bool held) {
  return columns(t, rows, cols, cols, held);
}

TensorSpec columns(DType t, std::int64_t rows, std::int64_t cols, std::int64_t ld, bool held) {
  return {.dtype = t, .rows = rows, .cols = cols, .ld = ld, .held = held};
}

int InputSets::add(const TensorSpec& t) {
  specs_.push_back(t);
  return static_cast<int>(specs_.size()) - 1;
}

double InputSets::set_bytes() const {
  double total = 0;
  for (const TensorSpec& t : specs_)
    total += static_cast<double>(t.rows * t.ld) * static_cast<double>(dtype_size(t.dtype));
  return total;
}

void InputSets::allocate(Backend& be, const gpu::Stream* s) {
  // Three times the L2 cache in all, at least two sets; small inputs get many sets.
  constexpr double kL2Multiple = 3.0;
  constexpr int kMaxSets = 256;
  int sets = 2;
  if (s != nullptr) {
    const double l2 = static_cast<double>(gpu::device_info().l2_cache_bytes);
    sets = std::clamp(static_cast<int>(std::ceil(kL2Multiple * l2 / std::max(set_bytes(), 1.0))), 2,
                      kMaxSets);
  }
  buffers_.clear();
  buffers_.resize(static_cast<std::size_t>(sets));
  for (int k = 0; k < sets; ++k) {
    for (std::size_t t = 0; t < specs_.size(); ++t) {
      const TensorSpec& spec = specs_[t];
      const std::int64_t elements = spec.rows * spec.ld;
      auto& b = buffers_[static_cast<std::size_t>(k)].emplace_back(
          be, static_cast<std::size_t>(elements) * dtype_size(spec.dtype));
      const std::uint64_t seed = 1000 + t, stream = static_cast<std::uint64_t>(k);
      if (s != nullptr) {
        gpu::fill_uniform(s->get(), b.get(), spec.dtype, elements, spec.lo, spec.hi, seed, stream);
        continue;
      }
      const std::uint64_t key = rng::key(seed, stream);
      for (std::int64_t i = 0; i < elements; ++i)
        store_element(
            b.get(), spec.dtype, i,
            static_cast<float>(spec.lo + (spec.hi - spec.lo) *
                                             rng::uniform01(key, static_cast<std::uint64_t>(i))));
    }
  }
  if (s != nullptr) s->synchronize();  // the backend's ops run on its own stream
}

AMat InputSets::view(int set, int t) const {
  const TensorSpec& s = specs_[static_cast<std::size_t>(t)];
  return {buffers_[static_cast<std::size_t>(set)][static_cast<std::size_t>(t)].get(), s.dtype,
          s.rows, s.cols, s.ld};
}

Mat InputSets::f32(int set, int t) const {
  const AMat v = view(set, t);
  if (!v.is_f32())
    throw Error(
        fmt::format("dense_bench: tensor {} is stored in {}, not fp32", t, dtype_name(v.dtype)));
  return v.f32();
}

void InputSets::hold(Backend& be, int set) const {
  for (std::size_t t = 0; t < specs_.size(); ++t) {
    if (!specs_[t].held) continue;
    const Buffer& b = buffers_[static_cast<std::size_t>(set)][t];
    be.hold_constant(b.get(), b.bytes());
  }
}

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0.0;
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

}  // namespace

double time_on_stream(const gpu::Stream& s, int warmup, int reps,
                      const std::function<void(int)>& f) {
  for (int i = 0; i < warmup; ++i) f(i);
  std::vector<gpu::Event> start(static_cast<std::size_t>(reps)),
      stop(static_cast<std::size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    start[static_cast<std::size_t>(i)].record(s.get());
    f(warmup + i);
    stop[static_cast<std::size_t>(i)].record(s.get());
  }
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i)
    ms.push_back(gpu::Event::elapsed_ms(start[static_cast<std::size_t>(i)],
                                        stop[static_cast<std::size_t>(i)]));
  return median(ms);
}

double time_on_backend(Backend& be, int warmup, int reps, const std::function<void(int)>& before,
                       const std::function<void(int)>& f) {
  for (int i = 0; i < warmup; ++i) {
    before(i);
    f(i);
  }
  // Marks are events made on first use: make them all before the timed calls.
  for (int i = 0; i <= reps; ++i) be.timing_mark(i);
  be.synchronize();
  for (int i = 0; i < reps; ++i) {
    before(warmup + i);
    if (i == 0) be.timing_mark(0);
    f(warmup + i);
    be.timing_mark(i + 1);
  }
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) ms.push_back(be.timing_elapsed_ms(i, i + 1));
  return median(ms);
}

double time_op(Backend& be, const Options& o, InputSets& in, Copies copies,
               const std::function<void(int)>& run) {
  const int sets = in.count();
  if (copies == Copies::before)
    for (int k = 0; k < sets; ++k) in.hold(be, k);
  const auto before = [&](int call) {
    if (copies == Copies::each_call) {  // a new step: the forward's first reader makes the copy
      be.release_constants();
      in.hold(be, call % sets);
    }
  };
  // Every set once in the warm-up: the copies made before are then there.
  const double ms = time_on_backend(be, std::max(o.warmup, sets), o.reps, before,
                                    [&](int call) { run(call % sets); });
  be.release_constants();
  return ms;
}

}  // namespace parity::bench
