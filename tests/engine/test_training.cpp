// The tiny models (configs/models/tiny.yaml, tiny-dot.yaml) trained on every backend this build
// has (backends.h), each judged against the cpu backend, the reference: per-step losses over 500
// steps, predictions after 20 steps, the same bits from the same seed, and a rehearsal
// (Model::prepare) that changes nothing. On a GPU backend the runs also check its counters: after
// the first step (or after prepare) nothing is allocated, grown or planned. Comparisons of a
// backend with the cpu skip on the cpu itself (there they compare the reference with itself).
//
// Per-step bound: the per-step loss within 0.3% over 500 steps (fp32 against the cpu, and bf16
// and tf32 against fp32), asserted on the tiny models with SGD; the models as configured (Adam
// and rowwise Adagrad) are trained and reported but not held to it, because their first updates
// can turn on a rounding (see with_sgd below). Predictions after 20 steps as configured are
// asserted. "[ measured ]" lines record the deviations seen.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backends.h"
#include "parity/data.h"
#include "parity/engine.h"
#include "parity/spec.h"

namespace parity::testing {
namespace {

using Counters = GpuBackend::Counters;

std::filesystem::path model_path(const std::string& name) {
  const std::string file = fmt::format("configs/models/{}.yaml", name);
  // The source tree from this file's location, then the working directory (the device script runs
  // from the repository root), then PARITY_SOURCE_DIR.
  const std::filesystem::path here =
      std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
  for (const std::filesystem::path& root :
       {here, std::filesystem::current_path(),
        std::filesystem::path(std::getenv("PARITY_SOURCE_DIR") != nullptr
                                  ? std::getenv("PARITY_SOURCE_DIR")
                                  : ".")}) {
    if (std::filesystem::exists(root / file)) return root / file;
  }
  return file;
}

// A training run of a fresh model: its per-step losses and, on a GPU backend, the backend's
// counters after Model::prepare (when the run prepares) and after the first step.
struct TrainingRun {
  std::vector<float> losses;
  std::optional<Counters> after_prepare, after_first;
};

// `steps` training steps of a fresh model on `backend`; with `prepare`, Model::prepare runs on the
// first batch before step 1.
TrainingRun train(const ModelSpec& spec, Backend& backend, int steps, std::uint64_t seed,
                  bool prepare = false) {
  SyntheticData data(spec, seed);
  const std::int64_t batch = spec.batch_size;
  Model model(spec, backend, batch, seed);
  TrainingRun run;
  Batch b;
  for (int step = 0; step < steps; ++step) {
    data.batch(Split::train, step, batch, b);
    model.stage(b);
    if (step == 0 && prepare) {
      model.prepare();
      run.after_prepare = gpu_counters(backend);
    }
    model.train_staged();
    run.losses.push_back(model.last_loss());
    if (step == 0) run.after_first = gpu_counters(backend);
  }
  return run;
}

struct Deviation {
  double max_rel = 0;  // largest per-step |a - ref| / ref
  int at_step = 0;
  double mean_rel = 0;    // mean over steps of the same
  int first_over = -1;    // first step where it exceeds kLossTolerance (-1: never)
  double window_max = 0;  // largest deviation of a 50-step window's mean loss
};

constexpr double kLossTolerance = 0.003;  // the per-step bound: 0.3% relative
constexpr int kWindow = 50;

Deviation compare_losses(const std::vector<float>& a, const std::vector<float>& ref) {
  Deviation d;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double r =
        std::fabs(static_cast<double>(a[i]) - ref[i]) / std::fabs(static_cast<double>(ref[i]));
    d.mean_rel += r / static_cast<double>(ref.size());
    if (!(r <= d.max_rel)) {
      d.max_rel = r;
      d.at_step = static_cast<int>(i);
    }
    if (d.first_over < 0 && !(r <= kLossTolerance)) d.first_over = static_cast<int>(i);
  }
  for (std::size_t w = 0; w + kWindow <= ref.size(); w += kWindow) {
    double sa = 0, sr = 0;
    for (std::size_t i = w; i < w + kWindow; ++i) {
      sa += a[i];
      sr += ref[i];
    }
    d.window_max = std::max(d.window_max, std::fabs(sa - sr) / sr);
  }
  return d;
}

void report(const std::string& what, const Deviation& d, const std::vector<float>& a,
            const std::vector<float>& ref) {
  std::cout << "[ measured ] " << what << ": per-step loss deviation max " << d.max_rel << " (step "
            << d.at_step << "), mean " << d.mean_rel << ", first > 0.3% at step " << d.first_over
            << "; " << kWindow << "-step-window mean loss deviation max " << d.window_max
            << "; loss first " << ref.front() << " vs " << a.front() << ", last " << ref.back()
            << " vs " << a.back() << "\n";
}

// Between `since` and `now` nothing was allocated, grown or planned.
void expect_no_growth(const std::string& what, const Counters& since, const Counters& now) {
  EXPECT_EQ(now.allocations, since.allocations) << what << ": allocate() called in a step";
  EXPECT_EQ(now.scratch_growths, since.scratch_growths) << what << ": scratch grew in a step";
  EXPECT_EQ(now.blas_plans, since.blas_plans) << what << ": a BLAS plan was built in a step";
}

// A steady run: after the first step nothing is allocated, grown or planned, no embedding op reads
// the id count back (the engine passes it) and no bias/ReLU epilogue falls back to its own kernel.
void expect_steady(const std::string& what, const Counters& first, const Counters& last) {
  expect_no_growth(what, first, last);
  EXPECT_EQ(last.host_syncs, 0) << what << ": an embedding op read the id count back";
  EXPECT_EQ(last.epilogue_fallbacks, 0) << what << ": a bias/ReLU epilogue ran as its own kernel";
}

constexpr int kEngineSteps = 500;

// The tiny models with both optimizers switched to SGD (lr 0.05).
//
// Why the per-step bound is asserted on this variant: the tiny models train with Adam on the
// dense parameters and rowwise Adagrad on the tables, whose first updates are about ±lr for
// every element (Adam's m/sqrt(v), Adagrad's g/|g|), however small the gradient. A rounding
// difference that flips the sign of a near-zero gradient moves that weight by 2·lr. This is a
// property of the models, not of the GPU: when their dense layers trained with Adagrad at rate
// 0.05, on the CPU reference alone one weight changed by 1 ulp at initialisation moved the
// per-step loss by up to 0.46% (tiny) within 500 steps, and every weight changed by 1 ulp by up
// to 0.69% (tiny) and 1.0% (tiny-dot). With SGD the same perturbations stay under 3.3e-5 (1 ulp)
// and 1.8e-4 (bf16 emulation). The runs as configured are still made and reported; their
// smoothed loss is compared in bench/numerics-check.sh.
ModelSpec with_sgd(ModelSpec spec) {
  for (OptimizerSpec* o : {&spec.dense_optimizer, &spec.embedding_optimizer}) {
    o->kind = OptimizerKind::sgd;
    o->lr = 0.05;
  }
  return spec;
}

// Parameters: (backend, model); the model is "tiny" (DCNv2) or "tiny-dot".
class EngineTraining : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  void SetUp() override { PARITY_REQUIRE_BACKEND(name()); }
  const std::string& name() const { return std::get<0>(GetParam()); }
  const std::string& model() const { return std::get<1>(GetParam()); }
  std::string label() const { return fmt::format("{} {}", name(), model()); }
  bool is_cpu() const { return name() == "cpu"; }
  std::unique_ptr<Backend> backend(DenseMath math = DenseMath::fp32) const {
    return make_backend(name(), math);
  }
  ModelSpec spec() const { return load_model_spec(model_path(model())); }
};

#define PARITY_SKIP_ON_CPU(why)                                    \
  do {                                                             \
    if (is_cpu()) GTEST_SKIP() << "skipped on the cpu: " << (why); \
  } while (0)

TEST_P(EngineTraining, Fp32TracksCpuFor500Steps) {
  PARITY_SKIP_ON_CPU("it is the reference");
  const ModelSpec configured = spec();
  {
    const ModelSpec sgd = with_sgd(configured);
    auto cpu = make_backend("cpu"), be = backend(DenseMath::fp32);
    const std::vector<float> ref = train(sgd, *cpu, kEngineSteps, 11).losses;
    const std::vector<float> got = train(sgd, *be, kEngineSteps, 11).losses;
    const Deviation d = compare_losses(got, ref);
    report(fmt::format("{} (sgd) fp32 vs cpu, {} steps", label(), kEngineSteps), d, got, ref);
    EXPECT_LE(d.max_rel, kLossTolerance);
    EXPECT_LT(ref.back(), ref.front()) << "the reference run did not learn";
  }
  auto cpu = make_backend("cpu"), be = backend(DenseMath::fp32);
  const std::vector<float> ref = train(configured, *cpu, kEngineSteps, 11).losses;
  const TrainingRun run = train(configured, *be, kEngineSteps, 11);
  const Deviation d = compare_losses(run.losses, ref);
  // As configured (Adagrad): reported, not asserted (see with_sgd).
  report(fmt::format("{} (as configured) fp32 vs cpu, {} steps", label(), kEngineSteps), d,
         run.losses, ref);
  if (const std::optional<Counters> last = gpu_counters(*be)) {
    const Counters& first = *run.after_first;
    expect_steady(fmt::format("{} fp32", label()), first, *last);
    std::cout << "[ measured ] " << label() << " gpu counters after step 1: " << first.allocations
              << " allocations, " << first.scratch_growths << " scratch growths, "
              << first.blas_plans << " BLAS plans; after " << kEngineSteps << ": "
              << last->allocations << ", " << last->scratch_growths << ", " << last->blas_plans
              << "; id-count host reads " << last->host_syncs << "; epilogue fallbacks "
              << last->epilogue_fallbacks << "\n";
  }
}

// fp16 and bf16 tables against the cpu: both round every update stochastically with the same
// bits, so the runs part only where the fp32 and double updates straddle a random rounding point
// (one narrow step, rarely). Asserted with SGD (see with_sgd) at the per-step bound.
TEST_P(EngineTraining, NarrowTablesTrackCpuFor500Steps) {
  PARITY_SKIP_ON_CPU("it is the reference");
  ModelSpec narrow = with_sgd(spec());
  for (std::size_t t = 0; t < narrow.tables.size(); ++t)
    narrow.tables[t].dtype = t % 3 == 0 ? DType::f16 : t % 3 == 1 ? DType::bf16 : DType::f32;
  auto cpu = make_backend("cpu"), be = backend(DenseMath::fp32);
  const std::vector<float> ref = train(narrow, *cpu, kEngineSteps, 11).losses;
  const TrainingRun run = train(narrow, *be, kEngineSteps, 11);
  const Deviation d = compare_losses(run.losses, ref);
  report(fmt::format("{} (sgd, fp16/bf16 tables) vs cpu, {} steps", label(), kEngineSteps), d,
         run.losses, ref);
  EXPECT_LE(d.max_rel, kLossTolerance);
  EXPECT_LT(ref.back(), ref.front()) << "the reference run did not learn";
  if (const std::optional<Counters> last = gpu_counters(*be))
    expect_steady(fmt::format("{} narrow tables", label()), *run.after_first, *last);
}

TEST_P(EngineTraining, Bf16AndTf32TrackFp32For500Steps) {
  PARITY_SKIP_ON_CPU("every dense math computes in fp32 there");
  const ModelSpec configured = spec();
  for (const bool sgd : {true, false}) {
    const ModelSpec s = sgd ? with_sgd(configured) : configured;
    const std::string what = fmt::format("{} {}", label(), sgd ? "(sgd)" : "(as configured)");
    auto fp32 = backend(DenseMath::fp32), bf16 = backend(DenseMath::bf16),
         tf32 = backend(DenseMath::tf32);
    const std::vector<float> ref = train(s, *fp32, kEngineSteps, 11).losses;
    const TrainingRun run = train(s, *bf16, kEngineSteps, 11);
    // bf16 storage too: after step 1 nothing is allocated, grown or planned, and nothing falls
    // back.
    if (const std::optional<Counters> last = gpu_counters(*bf16))
      expect_steady(fmt::format("{} bf16", what), *run.after_first, *last);
    const Deviation d = compare_losses(run.losses, ref);
    report(fmt::format("{} bf16 vs fp32, {} steps", what, kEngineSteps), d, run.losses, ref);
    const std::vector<float> got32 = train(s, *tf32, kEngineSteps, 11).losses;
    const Deviation d32 = compare_losses(got32, ref);
    report(fmt::format("{} tf32 vs fp32, {} steps", what, kEngineSteps), d32, got32, ref);
    if (sgd) {  // the per-step bound (asserted on the SGD variant; see with_sgd)
      EXPECT_LE(d.max_rel, kLossTolerance) << "bf16";
      EXPECT_LE(d32.max_rel, kLossTolerance) << "tf32";
    }
  }
}

// Model::prepare (a rehearsal of the step on the first batch's shapes) changes no value: the
// losses are the same bits as without it. On a GPU backend it also leaves the first step nothing
// to allocate, grow or plan, and allocates every input slot's pinned memory. fp32 and bf16 dense
// math (the cpu computes both in fp32: fp32 only).
TEST_P(EngineTraining, PrepareLeavesTheFirstStepNothingToAllocate) {
  const ModelSpec s = spec();
  constexpr int kSteps = 20;
  const std::vector<DenseMath> maths =
      is_cpu() ? std::vector<DenseMath>{DenseMath::fp32}
               : std::vector<DenseMath>{DenseMath::fp32, DenseMath::bf16};
  for (const DenseMath math : maths) {
    const std::string what = fmt::format("{} {}", label(), dense_math_name(math));
    auto plain = backend(math), prepared = backend(math);
    const std::vector<float> ref = train(s, *plain, kSteps, 11).losses;
    const std::optional<Counters> before = gpu_counters(*prepared);
    const TrainingRun run = train(s, *prepared, kSteps, 11, true);
    ASSERT_EQ(run.losses.size(), ref.size());
    for (std::size_t i = 0; i < ref.size(); ++i)
      EXPECT_EQ(run.losses[i], ref[i]) << what << ": step " << i + 1;
    const std::optional<Counters> last = gpu_counters(*prepared);
    if (!last) continue;  // a backend that counts nothing (cpu)
    const Counters& after_prepare = *run.after_prepare;
    EXPECT_GT(after_prepare.blas_plans, before->blas_plans)
        << what << ": the rehearsal planned nothing";
    EXPECT_GT(after_prepare.scratch_growths, before->scratch_growths)
        << what << ": the rehearsal sized nothing";
    EXPECT_EQ(after_prepare.pinned_allocations, Model::kInputSlots)
        << what << ": every input slot's pinned memory";
    for (const Counters& c : {*run.after_first, *last}) {
      EXPECT_EQ(c.pinned_allocations, after_prepare.pinned_allocations)
          << what << ": pinned memory allocated in a step";
      expect_no_growth(what, after_prepare, c);
    }
    EXPECT_EQ(last->host_syncs, 0) << what;
  }
}

TEST_P(EngineTraining, SameSeedSameBits) {
  const ModelSpec s = spec();
  const std::vector<DenseMath> maths =
      is_cpu() ? std::vector<DenseMath>{DenseMath::fp32}
               : std::vector<DenseMath>{DenseMath::fp32, DenseMath::bf16};
  for (const DenseMath m : maths) {
    auto a = backend(m), b = backend(m);
    const std::vector<float> la = train(s, *a, 50, 3).losses;
    const std::vector<float> lb = train(s, *b, 50, 3).losses;
    EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * 4), 0)
        << dense_math_name(m) << ": two runs differ";
  }
}

TEST_P(EngineTraining, PredictMatchesCpu) {
  PARITY_SKIP_ON_CPU("it is the reference");
  const ModelSpec s = spec();
  auto cpu = make_backend("cpu"), be = backend();
  SyntheticData data(s, 5);
  Model mc(s, *cpu, 256, 5), mb(s, *be, 256, 5);
  Batch b;
  for (int step = 0; step < 20; ++step) {
    data.batch(Split::train, step, 256, b);
    mc.train_step(b);
    mb.train_step(b);
  }
  data.batch(Split::eval, 0, 256, b);
  std::vector<float> pc(256), pb(256);
  mc.predict(b, pc.data());
  mb.predict(b, pb.data());
  double worst = 0;
  for (std::size_t i = 0; i < pc.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(pc[i]) - pb[i]));
  std::cout << "[ measured ] " << label() << " predict after 20 steps: max |p - p_cpu| = " << worst
            << "\n";
  EXPECT_LE(worst, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(
    Backends, EngineTraining,
    ::testing::Combine(::testing::ValuesIn(engine_backends()),
                       ::testing::Values(std::string("tiny"), std::string("tiny-dot"))),
    [](const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& i) {
      return std::get<0>(i.param) + (std::get<1>(i.param) == "tiny" ? "_dcnv2" : "_dot");
    });

// make_backend gives each built backend by its name.
class EngineBackend : public OnEachBackend {};

TEST_P(EngineBackend, MakeBackendGivesTheNamedBackend) {
  EXPECT_EQ(backend()->name(), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineBackend, ::testing::ValuesIn(engine_backends()),
                         backend_param_name);

}  // namespace
}  // namespace parity::testing
