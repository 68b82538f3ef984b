// Checkpoints that reshard, under mpirun (ctest dist.resharding): the tiny model (Adagrad tables,
// whose state is per element, and Adagrad dense layers) trained a few steps over the ranks and
// saved as a set, then loaded and saved again by other ranks under other shardings, and by one
// process as a single file. Every copy must hold the first one's tensors bit for bit.
//   dist_reshard_check train  HOW DIR        train 5 steps sharded by HOW, save the set in DIR
//   dist_reshard_check copy   HOW FROM DIR   load FROM's newest checkpoint sharded by HOW (one
//                                            process: unsharded, as one file), save it in DIR
//   dist_reshard_check same   A B            one process: A's newest and B's newest are equal
// HOW as tests/dist_mpi/plans.h names the layouts. The tables are fp32, or as RESHARD_TABLE_DTYPE
// says (fp16, bf16: pieces of 16-bit tables). Exit 0 when it worked (same: when equal).
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "parity/checkpoint.h"
#include "parity/data.h"
#include "parity/dist.h"
#include "parity/engine.h"
#include "parity/plan.h"
#include "plans.h"

namespace {

using namespace parity;
namespace fs = std::filesystem;

constexpr std::int64_t kBatch = 96;
constexpr std::int64_t kSteps = 5;

ModelSpec model() {
  ModelSpec m = load_model_spec(fs::path(PARITY_SOURCE_DIR) / "configs" / "models" / "tiny.yaml");
  m.embedding_optimizer.kind = OptimizerKind::adagrad;
  m.dense_optimizer.kind = OptimizerKind::adagrad;
  const char* dtype = std::getenv("RESHARD_TABLE_DTYPE");
  const auto dt = parse_dtype(dtype != nullptr ? dtype : "fp32");
  if (!dt || !is_table_dtype(*dt))
    throw InputError(fmt::format("RESHARD_TABLE_DTYPE '{}': expected fp32, fp16 or bf16", dtype));
  for (TableSpec& t : m.tables) t.dtype = *dt;
  return m;
}

fs::path newest(const fs::path& dir) {
  const auto steps = list_checkpoints(dir);
  if (steps.empty()) throw Error(fmt::format("no checkpoint in '{}'", dir.string()));
  return find_checkpoint(dir, steps.back());
}

int run(int argc, char** argv) {
  const std::string verb = argc > 1 ? argv[1] : "";
  const ModelSpec m = model();
  const auto backend = make_backend("cpu");
  if (verb == "same" && argc == 4) {
    Model a(m, *backend, kBatch, 1), b(m, *backend, kBatch, 2);
    load_checkpoint(newest(argv[2]), a.checkpoint_layout(), *backend);
    load_checkpoint(newest(argv[3]), b.checkpoint_layout(), *backend);
    const auto ta = a.tensors(), tb = b.tensors();
    int differ = 0;
    for (std::size_t i = 0; i < ta.size(); ++i)
      if (ta[i].name != tb[i].name || ta[i].bytes() != tb[i].bytes() ||
          std::memcmp(ta[i].data, tb[i].data, ta[i].bytes()) != 0) {
        fmt::print(stderr, "{} differs between '{}' and '{}'\n", ta[i].name, argv[2], argv[3]);
        ++differ;
      }
    fmt::print("{} tensors, {} differ: {} against {}\n", ta.size(), differ, argv[2], argv[3]);
    return differ == 0 ? 0 : 1;
  }
  const bool train = verb == "train" && argc == 4, copy = verb == "copy" && argc == 5;
  if (!train && !copy) {
    fmt::print(stderr, "usage: dist_reshard_check train HOW DIR | copy HOW FROM DIR | same A B\n");
    return 2;
  }
  const std::string how = argv[2];
  const fs::path out = argv[argc - 1];
  const ProcessGroupInfo g = detect_process_group();
  const auto comm = g.world > 1 ? make_mpi_communicator(&g) : make_self_communicator();
  const int P = comm->size(), me = comm->rank();
  Plan plan = test::plan_for(m, P, how, m.embedding_optimizer.kind);
  for (std::size_t t = 0; t < plan.tables.size(); ++t) plan.tables[t].dtype = m.tables[t].dtype;
  const ModelSpec planned = apply_plan(m, plan, kBatch);
  Model model(planned, *backend, kBatch, 11);
  if (P > 1) model.shard(plan, *comm);
  std::int64_t step = kSteps;
  if (train) {
    const SyntheticData data(planned, 7);
    for (std::int64_t s = 0; s < kSteps; ++s) {
      Batch mine;
      const std::int64_t first = kBatch * me / P, last = kBatch * (me + 1) / P;
      data.make(Split::train, s * kBatch + first, last - first, mine);
      model.train_step(mine);
    }
  } else {
    const fs::path from = newest(argv[3]);
    const auto meta =
        load_checkpoint(from, model.checkpoint_layout(), *backend, TensorValues::finite);
    model.tensors_written();
    step = std::stoll(meta.at("step"));
  }
  const std::map<std::string, std::string> meta = {{"step", fmt::format("{}", step)}};
  if (P == 1 && copy) {
    save_safetensors(checkpoint_path(out, step), model.tensors(), meta, *backend);
  } else {
    save_checkpoint_set(out, step, model.checkpoint_layout(), meta, *comm, *backend,
                        TensorValues::finite);
  }
  if (me == 0)
    fmt::print("{} ranks, {} tables: step {} saved in '{}'\n", P, how, step, out.string());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dist_reshard_check: {}\n", e.what());
    return 2;
  }
}
