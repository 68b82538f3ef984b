// The model on every backend this build has (backends.h): tensor names, initialisation, batch
// checks, the input pipeline, the step profile and the rehearsal, one test body per backend.
//
// And, on the cpu, the engine's wiring checked end to end: with SGD at lr 1, one training step
// moves every parameter by minus its gradient, which must match a finite difference of the loss
// computed through predict(). The per-op backward passes are checked in double precision in
// tests/backend; this test catches wrong views, slices and orderings. (It writes parameters through
// host pointers, so it is the cpu's only.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "adagrad_step.h"
#include "backends.h"
#include "micro_model.h"
#include "parity/data.h"
#include "parity/engine.h"
#include "parity/error.h"
#include "parity/metrics.h"

namespace parity {
namespace {

double loss_of(Model& m, const Batch& b) {
  std::vector<float> p(static_cast<std::size_t>(b.size));
  m.predict(b, p.data());
  return log_loss(p, b.labels);
}

class ModelGradient : public ::testing::TestWithParam<InteractionKind> {};

TEST_P(ModelGradient, StepMatchesFiniteDifferences) {
  const ModelSpec spec = testing::micro_model(GetParam());
  auto backend = make_backend("cpu");
  SyntheticData data(spec, 7);
  Batch b;
  data.batch(Split::train, 0, 8, b);

  Model model(spec, *backend, 8, 3);
  auto tensors = model.tensors();
  // Biases start at zero; an example whose layer input is all zeros (every ReLU before it
  // off) then sits exactly on the next ReLU's kink, where a central difference sees half
  // a slope. Small non-zero biases move every pre-activation off the kink.
  std::uint64_t lcg = 88172645463325252ULL;
  auto next_unit = [&] {
    lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(lcg >> 11) / 9007199254740992.0;
  };
  for (const auto& t : tensors)
    if (t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0)
      for (std::int64_t i = 0; i < t.elements(); ++i)
        static_cast<float*>(t.data)[i] = static_cast<float>(0.2 * next_unit() - 0.1);
  // Which rows of each table occur in the batch (only those get a gradient).
  std::vector<std::vector<bool>> used(spec.tables.size());
  for (std::size_t t = 0; t < spec.tables.size(); ++t) {
    used[t].assign(static_cast<std::size_t>(spec.tables[t].rows), false);
    for (std::int64_t i = b.offsets[t * 8]; i < b.offsets[(t + 1) * 8]; ++i)
      used[t][static_cast<std::size_t>(b.ids[static_cast<std::size_t>(i)])] = true;
  }

  struct Probe {
    float* p;
    double fd;
    std::string what;
  };
  // Central differences at two step sizes; where they disagree, a ReLU kink lies within
  // the step and the probe is skipped (counted, and bounded below).
  auto central = [&](float* p, float h) {
    const float orig = *p;
    *p = orig + h;
    const double lp = loss_of(model, b);
    *p = orig - h;
    const double lm = loss_of(model, b);
    *p = orig;
    return (lp - lm) / (static_cast<double>(orig + h) - static_cast<double>(orig - h));
  };
  std::vector<Probe> probes;
  int kinks = 0;
  const float h = 2e-3f;
  for (const auto& t : tensors) {
    if (t.name.rfind("optimizer.", 0) == 0) continue;
    float* data_ptr = static_cast<float*>(t.data);
    const std::int64_t n = t.elements();
    std::vector<std::int64_t> picks;
    if (t.name.rfind("embedding.", 0) == 0) {
      const std::size_t ti = static_cast<std::size_t>(t.name[11] - '0');  // embedding.tN.weight
      for (std::int64_t r = 0; r < t.shape[0] && picks.size() < 6; ++r)
        if (used[ti][static_cast<std::size_t>(r)])
          picks.push_back(r * t.shape[1] + (r % t.shape[1]));
    } else {
      for (std::int64_t k = 0; k < std::min<std::int64_t>(n, 8); ++k)
        picks.push_back(static_cast<std::int64_t>(next_unit() * static_cast<double>(n)));
    }
    for (std::int64_t i : picks) {
      float* p = data_ptr + i;
      const double fd = central(p, h), fd_half = central(p, h / 2);
      if (std::abs(fd - fd_half) > 1e-4 + 1e-2 * std::abs(fd)) {
        ++kinks;
        continue;
      }
      probes.push_back({p, fd, fmt::format("{}[{}]", t.name, i)});
    }
  }
  std::vector<float> before;
  for (const auto& pr : probes) before.push_back(*pr.p);
  model.train_step(b);
  int checked = 0;
  for (std::size_t k = 0; k < probes.size(); ++k) {
    const double g =
        static_cast<double>(before[k]) - static_cast<double>(*probes[k].p);  // -Δw at lr 1
    // fp32 forward: the difference quotient is good to ~5e-5 absolute (rounding of the
    // loss over 2h) plus O(h²) curvature; wiring bugs give errors of the gradient's size.
    EXPECT_LE(std::abs(g - probes[k].fd), 2e-4 + 1e-2 * std::abs(probes[k].fd))
        << probes[k].what << " step " << g << " fd " << probes[k].fd;
    ++checked;
  }
  EXPECT_LE(kinks, checked / 5) << "too many probes skipped at ReLU kinks";
  EXPECT_GT(checked, 50);
}

INSTANTIATE_TEST_SUITE_P(Interactions, ModelGradient,
                         ::testing::Values(InteractionKind::dcnv2, InteractionKind::dot));

// ---- on every backend (backends.h) ----

class EngineModel : public testing::OnEachBackend {};

TEST_P(EngineModel, TensorNamesAndCounts) {
  const ModelSpec spec = testing::micro_model(
      InteractionKind::dcnv2, OptimizerKind::rowwise_adagrad, OptimizerKind::adam, 0.01);
  auto be = backend();
  Model model(spec, *be, 8, 1);
  std::int64_t dense = 0, emb = 0;
  bool has_dense_state = false;
  for (const auto& t : model.tensors()) {
    if (t.name.rfind("embedding.", 0) == 0)
      emb += t.elements();
    else if (t.name == "optimizer.dense.state") {
      has_dense_state = true;
      EXPECT_EQ(t.shape, (std::vector<std::int64_t>{2, model.dense_parameter_count()}));
    } else if (t.name.rfind("optimizer.embedding.", 0) == 0) {
      EXPECT_EQ(t.shape.size(), 1u);  // rowwise: one float per row
    } else {
      dense += t.elements();
    }
  }
  EXPECT_TRUE(has_dense_state);
  EXPECT_EQ(dense, spec.dense_parameters());
  EXPECT_EQ(emb, spec.embedding_parameters());
  EXPECT_EQ(model.dense_parameter_count(), spec.dense_parameters());
  EXPECT_EQ(model.embedding_parameter_count(), spec.embedding_parameters());
  // The buffers by category add up to the total, and hold at least what the tensors need: fp32
  // tables (16-byte aligned, so perhaps a little more), dense parameters with their gradients and
  // Adam's two states, one rowwise state per row.
  const auto by = model.allocated_bytes_by_category();
  std::size_t total = 0;
  for (const auto& [name, bytes] : by) total += bytes;
  EXPECT_EQ(total, model.allocated_bytes());
  ASSERT_EQ(by.size(), 5u);
  EXPECT_GE(by.at("embedding_weights"), static_cast<std::size_t>(emb) * 4);
  EXPECT_GE(by.at("dense_parameters_and_state"), static_cast<std::size_t>(dense) * 4 * 4);
  EXPECT_GE(by.at("embedding_optimizer_state"), 4u);
  EXPECT_GT(by.at("activations"), 0u);
  EXPECT_GT(by.at("input_slots"), 0u);
}

TEST_P(EngineModel, SameSeedSameInitDifferentSeedDifferent) {
  const ModelSpec spec = testing::micro_model(InteractionKind::dot);
  auto be = backend();
  Model a(spec, *be, 8, 5), b(spec, *be, 8, 5), c(spec, *be, 8, 6);
  auto ta = a.tensors(), tb = b.tensors(), tc = c.tensors();
  bool any_diff = false;
  for (std::size_t i = 0; i < ta.size(); ++i) {
    const auto ha = testing::host_bytes(*be, ta[i]);
    ASSERT_EQ(ha, testing::host_bytes(*be, tb[i])) << ta[i].name;
    if (ta[i].name.find("weight") != std::string::npos)
      any_diff |= ha != testing::host_bytes(*be, tc[i]);
  }
  EXPECT_TRUE(any_diff);
}

TEST_P(EngineModel, RejectsBatchThatDoesNotFit) {
  const ModelSpec spec = testing::micro_model(InteractionKind::dot);
  auto be = backend();
  Model model(spec, *be, 4, 1);
  SyntheticData data(spec, 1);
  Batch b;
  data.batch(Split::train, 0, 8, b);
  EXPECT_THROW(model.train_step(b), Error);
  Batch malformed;
  data.batch(Split::train, 0, 4, malformed);
  malformed.ids.pop_back();
  EXPECT_THROW(model.train_step(malformed), Error);
  EXPECT_EQ(model.staged(), 0);  // a rejected batch is not staged
}

// The input pipeline: with batches staged ahead in every slot (more than the trainer does), the
// oldest is trained first and the parameters equal, bit for bit, training each batch as it comes.
TEST_P(EngineModel, StagedPipelineMatchesStepByStep) {
  const ModelSpec spec = testing::micro_model(
      InteractionKind::dcnv2, OptimizerKind::rowwise_adagrad, OptimizerKind::adam, 0.01);
  auto be = backend();
  SyntheticData data(spec, 4);
  std::vector<Batch> batches(6);
  for (std::size_t k = 0; k < batches.size(); ++k)
    data.batch(Split::train, static_cast<std::int64_t>(k), 8, batches[k]);
  Model a(spec, *be, 8, 9), b(spec, *be, 8, 9);
  for (const Batch& x : batches) a.train_step(x);
  constexpr std::size_t ahead = Model::kInputSlots;
  for (std::size_t k = 0; k < ahead; ++k) b.stage(batches[k]);
  b.prepare();  // a rehearsal changes nothing (and takes no batch)
  EXPECT_EQ(b.staged(), static_cast<int>(ahead));
  EXPECT_EQ(b.step(), 0);
  for (std::size_t k = 0; k < batches.size(); ++k) {
    EXPECT_EQ(b.staged(), static_cast<int>(std::min(ahead, batches.size() - k)));
    b.train_staged();
    if (k + ahead < batches.size()) b.stage(batches[k + ahead]);
  }
  EXPECT_EQ(b.staged(), 0);
  EXPECT_EQ(a.step(), b.step());
  auto ta = a.tensors(), tb = b.tensors();
  for (std::size_t i = 0; i < ta.size(); ++i)
    ASSERT_EQ(testing::host_bytes(*be, ta[i]), testing::host_bytes(*be, tb[i])) << ta[i].name;
  EXPECT_EQ(a.last_loss(), b.last_loss());
}

// The recipe's warm-up after a larger batch (ModelSpec::lr_factor): a warm-up step trains as the
// same model would with its learning rates times the step's factor, bit for bit, and after the
// warm-up at the full rates.
TEST_P(EngineModel, WarmUpStepsTrainAtTheirShareOfTheRates) {
  ModelSpec warm = testing::micro_model(InteractionKind::dcnv2, OptimizerKind::rowwise_adagrad,
                                        OptimizerKind::adam, 0.01);
  warm.lr_batch_scale = 4.0;
  warm.lr_warmup_steps = 2;
  auto be = backend();
  SyntheticData data(warm, 4);
  std::vector<Batch> batches(3);
  for (std::size_t k = 0; k < batches.size(); ++k)
    data.batch(Split::train, static_cast<std::int64_t>(k), 8, batches[k]);
  // One step each from the same start: the warm model at steps 0, 1, 2 against the plain model
  // with its rates scaled by that step's factor (0.25, 0.625, 1).
  for (std::int64_t step = 0; step < 3; ++step) {
    ModelSpec plain = warm;
    plain.lr_batch_scale = 1.0;
    plain.embedding_optimizer.lr *= warm.lr_factor(step);
    plain.dense_optimizer.lr *= warm.lr_factor(step);
    Model a(warm, *be, 8, 3), b(plain, *be, 8, 3);
    a.set_step(step);
    b.set_step(step);
    a.train_step(batches[static_cast<std::size_t>(step)]);
    b.train_step(batches[static_cast<std::size_t>(step)]);
    auto ta = a.tensors(), tb = b.tensors();
    for (std::size_t i = 0; i < ta.size(); ++i)
      ASSERT_EQ(testing::host_bytes(*be, ta[i]), testing::host_bytes(*be, tb[i]))
          << ta[i].name << " at step " << step;
  }
  // And the factor matters: step 0 at the full rates trains other values.
  ModelSpec full = warm;
  full.lr_warmup_steps = 0;
  Model a(warm, *be, 8, 3), c(full, *be, 8, 3);
  a.train_step(batches[0]);
  c.train_step(batches[0]);
  bool differ = false;
  auto ta = a.tensors(), tc = c.tensors();
  for (std::size_t i = 0; i < ta.size(); ++i)
    differ |= testing::host_bytes(*be, ta[i]) != testing::host_bytes(*be, tc[i]);
  EXPECT_TRUE(differ);
}

TEST_P(EngineModel, StagingMisuseIsAnError) {
  const ModelSpec spec = testing::micro_model(InteractionKind::dot);
  auto be = backend();
  Model model(spec, *be, 8, 1);
  SyntheticData data(spec, 1);
  Batch b;
  data.batch(Split::train, 0, 8, b);
  EXPECT_THROW(model.train_staged(), Error);  // nothing staged
  EXPECT_THROW(model.prepare(), Error);       // nothing staged: no shapes to rehearse
  model.stage(b);
  model.stage(b);
  EXPECT_THROW(model.stage(b), Error);  // both slots full
  std::vector<float> p(8);
  EXPECT_THROW(model.predict(b, p.data()), Error);  // a training batch is waiting
  EXPECT_THROW(model.train_step(b), Error);         // would train the staged batch, not this one
  model.train_staged();
  model.train_staged();
  model.predict(b, p.data());
  for (float v : p) EXPECT_TRUE(v > 0.0f && v < 1.0f);
  Batch unlabelled = b;
  unlabelled.labels.clear();
  model.stage(unlabelled);
  EXPECT_THROW(model.train_staged(), Error);  // no labels to train on
  EXPECT_EQ(model.staged(), 0);               // the unlabelled batch is taken all the same
}

TEST_P(EngineModel, ProfileCoversEveryCategory) {
  const ModelSpec spec = testing::micro_model(InteractionKind::dcnv2);
  auto be = backend();
  Model model(spec, *be, 8, 1);
  SyntheticData data(spec, 1);
  Batch b;
  data.batch(Split::train, 0, 8, b);
  model.set_profiling(true);
  for (int k = 0; k < 3; ++k) model.train_step(b);
  std::vector<float> p(8);
  model.predict(b, p.data());  // not part of the profile
  model.set_profiling(false);
  EXPECT_EQ(model.profiled_steps(), 3);
  for (const char* c : {"input_wait", "mlp", "embedding_forward", "interaction", "loss",
                        "embedding_backward", "dense_optimizer"}) {
    ASSERT_TRUE(model.profile_ms().count(c)) << c;
    EXPECT_GE(model.profile_ms().at(c), 0.0) << c;
  }
  EXPECT_EQ(model.profile_ms().size(), 7u);
  // Per op: every layer's forward and backward, once each (the micro model: 2 bottom, 2 cross and
  // 2 top layers), and the single-op categories under their own name.
  std::vector<std::string> ops;
  for (const auto& [op, ms] : model.profile_ops_ms()) ops.push_back(op);
  EXPECT_EQ(ops, (std::vector<std::string>{
                     "dense_optimizer: dense_optimizer", "embedding_backward: embedding_backward",
                     "embedding_forward: embedding_forward", "input_wait: input_wait",
                     "interaction: cross.0 backward", "interaction: cross.0 forward",
                     "interaction: cross.1 backward", "interaction: cross.1 forward", "loss: loss",
                     "mlp: bottom.0 backward", "mlp: bottom.0 forward", "mlp: bottom.1 backward",
                     "mlp: bottom.1 forward", "mlp: top.0 backward", "mlp: top.0 forward",
                     "mlp: top.1 backward", "mlp: top.1 forward"}));
  // The host's time per op: the same ops, each with a time (the CPU backend computes as it
  // enqueues, so the steps' host time is not zero).
  std::vector<std::string> host_ops;
  double host_total = 0;
  for (const auto& [op, ms] : model.profile_host_ops_ms()) {
    host_ops.push_back(op);
    EXPECT_GE(ms, 0.0) << op;
    host_total += ms;
  }
  EXPECT_EQ(host_ops, ops);
  EXPECT_GT(host_total, 0.0);
}

// A rehearsal (prepare) marks nothing in the profile and changes no value.
TEST_P(EngineModel, PrepareIsNotProfiledAndChangesNothing) {
  const ModelSpec spec =
      testing::micro_model(InteractionKind::dot, OptimizerKind::adagrad, OptimizerKind::adam, 0.01);
  auto be = backend();
  SyntheticData data(spec, 2);
  Batch b;
  data.batch(Split::train, 0, 8, b);
  Model plain(spec, *be, 8, 4), prepared(spec, *be, 8, 4);
  prepared.set_profiling(true);
  prepared.stage(b);
  prepared.prepare();
  prepared.set_profiling(false);
  EXPECT_EQ(prepared.profiled_steps(), 0);
  EXPECT_TRUE(prepared.profile_ms().empty());
  prepared.train_staged();
  plain.train_step(b);
  auto ta = plain.tensors(), tb = prepared.tensors();
  for (std::size_t i = 0; i < ta.size(); ++i)
    ASSERT_EQ(testing::host_bytes(*be, ta[i]), testing::host_bytes(*be, tb[i])) << ta[i].name;
  EXPECT_EQ(plain.last_loss(), prepared.last_loss());
}

// The finite-value guard: clean steps record nothing; the first step that meets a NaN (here in a
// dense weight) is recorded, and later steps do not overwrite it.
TEST_P(EngineModel, GuardRecordsTheFirstNonFiniteStep) {
  const ModelSpec spec = testing::micro_model(InteractionKind::dcnv2, OptimizerKind::adagrad,
                                              OptimizerKind::adam, 0.01);
  auto be = backend();
  SyntheticData data(spec, 4);
  Batch batch;
  Model m(spec, *be, 8, 9);
  for (int k = 0; k < 3; ++k) {
    data.batch(Split::train, k, 8, batch);
    m.train_step(batch);
  }
  EXPECT_EQ(m.first_nonfinite_step(), -1);
  const TensorRef w = m.tensors().front();  // a dense weight
  ASSERT_EQ(w.dtype, DType::f32);
  const float nan = std::nanf("");
  be->copy_to_device(static_cast<float*>(w.data) + 1, &nan, sizeof nan);
  for (int k = 3; k < 6; ++k) {
    data.batch(Split::train, k, 8, batch);
    m.train_step(batch);
  }
  EXPECT_EQ(m.first_nonfinite_step(), 4);
}

// fp16 and bf16 tables are stored in their own type: the tensors say so and hold two bytes an
// element, they start as the fp32 initialisation rounded to nearest, and training updates them
// deterministically (stochastic rounding keyed by the seed and the step), beside an fp32 table.
TEST_P(EngineModel, NarrowTablesAreStoredInTheirOwnType) {
  ModelSpec spec = testing::micro_model(InteractionKind::dcnv2, OptimizerKind::rowwise_adagrad,
                                        OptimizerKind::sgd, 0.05);
  const ModelSpec wide = spec;
  spec.tables[0].dtype = DType::f16;
  spec.tables[2].dtype = DType::bf16;
  auto be = backend();
  Model a(spec, *be, 8, 3), b(spec, *be, 8, 3), w(wide, *be, 8, 3);
  EXPECT_LT(a.allocated_bytes(), w.allocated_bytes());
  auto find = [](Model& m, const std::string& name) {
    for (const TensorRef& t : m.tensors())
      if (t.name == name) return t;
    throw Error("no tensor " + name);
  };
  for (const auto& [name, dtype] :
       {std::pair{"embedding.t0.weight", DType::f16}, std::pair{"embedding.t1.weight", DType::f32},
        std::pair{"embedding.t2.weight", DType::bf16}}) {
    const TensorRef t = find(a, name);
    EXPECT_EQ(t.dtype, dtype) << name;
    EXPECT_EQ(t.bytes(), static_cast<std::size_t>(t.elements()) * dtype_size(dtype)) << name;
    // The initial values: the fp32 model's, rounded once to nearest.
    const auto narrow = testing::host_bytes(*be, t);
    const auto f32 = testing::host_bytes(*be, find(w, name));
    for (std::int64_t i = 0; i < t.elements(); ++i) {
      float v;
      std::memcpy(&v, f32.data() + 4 * i, 4);
      ASSERT_EQ(load_element(narrow.data(), dtype, i), round_to_dtype(v, dtype)) << name << i;
    }
  }
  const auto start = testing::host_bytes(*be, find(a, "embedding.t0.weight"));
  SyntheticData data(spec, 2);
  Batch batch;
  for (int k = 0; k < 5; ++k) {
    data.batch(Split::train, k, 8, batch);
    a.train_step(batch);
    b.train_step(batch);
  }
  const auto ta = a.tensors(), tb = b.tensors();
  for (std::size_t i = 0; i < ta.size(); ++i)
    EXPECT_EQ(testing::host_bytes(*be, ta[i]), testing::host_bytes(*be, tb[i])) << ta[i].name;
  EXPECT_NE(testing::host_bytes(*be, find(a, "embedding.t0.weight")), start);
  EXPECT_EQ(a.first_nonfinite_step(), -1);
}

// Adagrad's initial accumulator (OptimizerSpec::initial_accumulator): every state starts at its
// value, and the first step is the one adagrad_step.h derives from the same model without one,
// for the dense layers (adagrad, per element) and the tables (rowwise_adagrad, per row; rows the
// batch missed keep the value).
TEST_P(EngineModel, AdagradStartsFromTheInitialAccumulator) {
  ModelSpec zero = testing::micro_model(InteractionKind::dcnv2, OptimizerKind::rowwise_adagrad,
                                        OptimizerKind::adagrad, 0.05);
  ModelSpec held = zero;
  held.dense_optimizer.initial_accumulator = 0.25;
  held.embedding_optimizer.initial_accumulator = 0.125;
  auto be = backend();
  Model z(zero, *be, 8, 3), a(held, *be, 8, 3);
  auto floats = [&](Model& m, const std::string& name) {
    return testing::tensor_floats(*be, m, name);
  };
  auto dense = [&](Model& m) { return testing::dense_floats(*be, m); };
  const std::string dense_state = "optimizer.dense.state";
  for (const float s : floats(a, dense_state)) ASSERT_EQ(s, 0.25f);
  for (const float s : floats(a, "optimizer.embedding.t1.state")) ASSERT_EQ(s, 0.125f);
  for (const float s : floats(z, dense_state)) ASSERT_EQ(s, 0.0f);
  const std::vector<float> w0 = dense(a), e0 = floats(a, "embedding.t1.weight");
  ASSERT_EQ(w0, dense(z));

  SyntheticData data(zero, 2);
  Batch batch;
  data.batch(Split::train, 0, 8, batch);
  z.train_step(batch);
  a.train_step(batch);

  testing::expect_first_adagrad_step(w0, dense(z), dense(a), floats(z, dense_state),
                                     floats(a, dense_state), 0.25, zero.dense_optimizer.eps, 1,
                                     "dense");
  testing::expect_first_adagrad_step(
      e0, floats(z, "embedding.t1.weight"), floats(a, "embedding.t1.weight"),
      floats(z, "optimizer.embedding.t1.state"), floats(a, "optimizer.embedding.t1.state"), 0.125,
      zero.embedding_optimizer.eps, zero.tables[1].dim, "table t1");
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineModel, ::testing::ValuesIn(testing::engine_backends()),
                         testing::backend_param_name);

}  // namespace
}  // namespace parity
