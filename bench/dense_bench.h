// The pieces of dense_bench (bench/dense_bench.cpp says what it measures and how): the dense
// shapes and storage types of a training step as the engine makes them, sets of random inputs
// rotated so that together they exceed the L2 cache, and the timing.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/gpu/gpu_backend.h"
#include "backend/gpu/runtime.h"
#include "parity/backend.h"
#include "parity/plan.h"
#include "parity/spec.h"

namespace parity::bench {

struct Options {
  std::string model;    // a model YAML, or a name in <configs>/models
  std::string configs;  // the configs folder (devices/, calibration/, models/)
  std::string device = "h200";
  std::string results;     // JSON of every measurement
  std::string dump;        // JSON of the shapes, for bench/dense_torch.py
  std::int64_t batch = 0;  // 0: the model's batch_size
  DenseMath math = DenseMath::bf16;
  int reps = 30;
  int warmup = 5;
  std::int64_t product_size = 8192;  // the product ceiling's m = n = k
  bool passes = true;                // also the elementwise passes alone
  bool check_on_cpu = false;         // each step op once on the CPU backend, no measurement
  std::string gemm_catalog;          // a kernel catalog: the step's ops also with its choices, A/B
  int ab_rounds = 2;            // with a catalog: rounds of (library heuristic, catalog) timings
  bool product_checks = false;  // the forward products checked (Backend::set_product_checks)
  bool library_checks = false;  // ... through the library (GpuBackend::use_fused_checks(false))
};

// One layer of an MLP as the engine lays it out (src/engine/layout.cpp).
struct Layer {
  std::string name;  // "bottom.0", "top.4"
  int in = 0, out = 0;
  Activation act = Activation::relu;
};

// The dense shapes and storage types of one training step (src/engine/layout.cpp, model.cpp).
struct StepShapes {
  StepShapes(const ModelSpec& m, std::int64_t batch, DType activation_dtype);
  std::int64_t batch = 0;
  int features = 0;  // F, the data's dense features (fp32)
  std::vector<Layer> bottom, top;
  bool dcn = false;
  int n = 0;     // x0's columns: D + the tables' dims (N of the cross layers)
  int d = 0;     // the bottom MLP's output width
  int rank = 0;  // low rank of the cross layers
  int cross_layers = 0;
  int tables = 0;
  int inter_out = 0;        // the interaction's output width (the top MLP's input)
  DType act = DType::f32;   // activations (Backend::activation_dtype)
  DType x0 = DType::f32;    // x0: like the activations with DCNv2, fp32 with the dot
  DType grad = DType::f32;  // dx0 and the interaction's gradients: like x0
};

// One tensor of an op's input set: its storage type, the view the op gets ([rows, cols] with
// leading dimension ld) and the range of its random values.
struct TensorSpec {
  DType dtype = DType::f32;
  std::int64_t rows = 0, cols = 0, ld = 0;
  float lo = -1.0f, hi = 1.0f;
  bool held = false;  // the engine holds it constant when the op runs (Backend::hold_constant)
};
TensorSpec matrix(DType t, std::int64_t rows, std::int64_t cols, bool held = false);
TensorSpec columns(DType t, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                   bool held = false);

// Sets of an op's tensors, each allocated through the backend and filled with random non-zero
// values from the counter-based generator (include/parity/random.h; on the GPU its twin,
// gpu::fill_uniform): as many sets as make three times the L2 cache together (at least 2), so
// that rotating them, no call finds its inputs in the cache.
class InputSets {
 public:
  int add(const TensorSpec& t);
  // Allocates and fills every set on the GPU (on stream s), then waits for the fills; where s is
  // null (the CPU check), two sets in host memory, filled on the host.
  void allocate(Backend& be, const gpu::Stream* s);
  int count() const { return static_cast<int>(buffers_.size()); }
  double set_bytes() const;
  AMat view(int set, int t) const;
  Mat f32(int set, int t) const;
  float* ptr(int set, int t) const { return f32(set, t).data; }
  // Holds the set's `held` tensors constant (as the engine does when the op runs).
  void hold(Backend& be, int set) const;

 private:
  std::vector<TensorSpec> specs_;
  std::vector<std::vector<Buffer>> buffers_;  // [set][tensor]
};

// When the bf16 copy of a held fp32 operand is made: by this op at every call (the forward, the
// first reader of the step), or before it (the backward reuses the forward's copy).
enum class Copies { each_call, before };

// Median milliseconds of f(call) over reps calls after warmup calls, each call between two
// device events on stream s.
double time_on_stream(const gpu::Stream& s, int warmup, int reps,
                      const std::function<void(int)>& f);
// The same on the backend's stream, through its timing marks; before(call) runs on the host
// before each call.
double time_on_backend(Backend& be, int warmup, int reps, const std::function<void(int)>& before,
                       const std::function<void(int)>& f);
// The median of one op over the input sets, holding them as `copies` says.
double time_op(Backend& be, const Options& o, InputSets& in, Copies copies,
               const std::function<void(int)>& run);

// The ceilings measured in this run.
struct Ceilings {
  double copy_bytes_per_s = 0;     // device-to-device copy, bytes read + written
  double product_flops_per_s = 0;  // product_size^3 through linear_forward, in the dense math
  double copy_ms = 0, product_ms = 0;
};

// One dense op of the step, measured, with the performance model's counts and prediction.
struct OpResult {
  std::string name, category;
  double ms = 0;
  double flops = 0, bytes = 0, predicted_ms = -1;  // -1: the model names no such op
  int sets = 0;
};
// One elementwise pass alone: the bytes it must move (each input read once, each output
// written once) and its time.
struct PassResult {
  std::string name;
  double ms = 0, bytes = 0;
  int sets = 0;
};

// The op's roofline time: max(flops / the product rate, bytes / the copy rate), in ms.
double roofline_ms(const OpResult& r, const Ceilings& c);
// The table of ops: its header and one row.
void print_op_header();
void print_op(const OpResult& r, const Ceilings& c);

// Every dense op of a step (forward, loss, backward) at the engine's shapes, in the engine's
// order, through the backend's public interface; prints a line per op. The inputs are filled on
// `fill` (null: on the host, for the CPU check).
std::vector<OpResult> measure_step(Backend& be, const Options& o, const StepShapes& sh,
                                   const std::vector<OpCost>& predicted, const Ceilings& c,
                                   const gpu::Stream* fill);
// The elementwise passes of the step alone, through their op headers; prints a line per pass.
std::vector<PassResult> measure_passes(GpuBackend& be, const Options& o, const StepShapes& sh,
                                       const ModelSpec& m, const Ceilings& c);

}  // namespace parity::bench
