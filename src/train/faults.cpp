// Faults found in training and their replays (faults.h).
#include "faults.h"

#include <fmt/format.h>

#include <cmath>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

#include "parity/checkpoint.h"
#include "parity/dist.h"
#include "parity/health.h"
#include "ranks.h"

namespace parity::train_detail {
namespace {

// Marks the run's GPU suspect in the health ledger; what was done, to say.
std::string mark_suspect(const TrainConfig& cfg, bool on_gpu, const std::string& reason) {
  if (!on_gpu) return "the cpu backend has no device to mark in the health ledger";
  const std::string uuid = detect_gpu_uuid();
  try {
    HealthLedger ledger(cfg.health_ledger.empty() ? default_ledger_path() : cfg.health_ledger);
    ledger.record(uuid, detect_gpu(), DeviceHealth::suspect, reason, "parity train");
    return fmt::format("device {} is marked suspect in the health ledger '{}'", uuid,
                       ledger.file().string());
  } catch (const std::exception& e) {  // the fault is the news; the ledger's trouble too
    return fmt::format("device {} could not be marked suspect: {}", uuid, e.what());
  }
}

std::string table_tensor(const TrainConfig::TableFaultAtStep& f) {
  return fmt::format("embedding.{}.weight", f.table);
}

std::string describe(const TrainConfig::TableFaultAtStep& f) {
  return fmt::format("--inject-table-fault {}:{}:{}:{}:{}", f.step, f.table, f.row, f.col, f.bit);
}

}  // namespace

void check_table_fault(const TrainConfig::TableFaultAtStep& f, const CheckpointLayout& layout) {
  if (f.step < 1)
    throw InputError(fmt::format("{}: step {}, expected 1 or more", describe(f), f.step));
  const std::string name = table_tensor(f);
  std::string tables;
  for (const CheckpointTensor& t : layout.tensors) {
    if (t.name == name) {
      const std::int64_t cols = t.shape.size() > 1 ? t.shape[1] : 1;
      if (f.row < 0 || f.row >= t.shape[0] || f.col < 0 || f.col >= cols)
        throw InputError(
            fmt::format("{}: element ({}, {}) is outside table '{}' of {} rows and {} columns",
                        describe(f), f.row, f.col, f.table, t.shape[0], cols));
      const int bits = static_cast<int>(8 * dtype_size(t.dtype));
      if (f.bit < 0 || f.bit >= bits)
        throw InputError(fmt::format("{}: bit {}, expected 0 to {} (table '{}' is stored as {})",
                                     describe(f), f.bit, bits - 1, f.table, dtype_name(t.dtype)));
      return;
    }
    constexpr std::string_view prefix = "embedding.", suffix = ".weight";
    if (t.name.starts_with(prefix) && t.name.ends_with(suffix))
      tables +=
          fmt::format("{}'{}'", tables.empty() ? "" : ", ",
                      t.name.substr(prefix.size(), t.name.size() - prefix.size() - suffix.size()));
  }
  throw InputError(fmt::format("{}: the model has no table '{}' (its tables: {})", describe(f),
                               f.table, tables));
}

int plant_table_fault(const TrainConfig::TableFaultAtStep& f, const CheckpointLayout& layout,
                      Backend& backend) {
  const std::string name = table_tensor(f);
  int flipped = 0;
  for (const CheckpointPiece& p : layout.pieces) {
    if (p.name != name || f.row < p.row_begin || f.row >= p.row_end || f.col < p.col_begin ||
        f.col >= p.col_end)
      continue;
    const std::size_t size = dtype_size(p.local.dtype);
    const std::int64_t index =
        (f.row - p.row_begin) * (p.col_end - p.col_begin) + (f.col - p.col_begin);
    auto* at = static_cast<unsigned char*>(p.local.data) + static_cast<std::size_t>(index) * size;
    unsigned char bytes[8] = {};
    backend.copy_to_host(bytes, at, size);
    bytes[f.bit / 8] ^= static_cast<unsigned char>(1u << (f.bit % 8));  // little-endian storage
    backend.copy_to_device(at, bytes, size);
    ++flipped;
  }
  return flipped;
}

void throw_if_products_failed(const Backend::ProductChecks& c, Communicator* comm,
                              std::int64_t step, const std::string& last_good, bool on_gpu) {
  const bool several = comm != nullptr && comm->size() > 1;
  double failures = static_cast<double>(c.failures), products = static_cast<double>(c.products);
  if (several) {
    failures = sum_over_ranks(*comm, failures);
    products = sum_over_ranks(*comm, products);
  }
  if (failures == 0) return;
  const std::string where = !several ? fmt::format("the first {}", c.first_failure)
                            : c.failures > 0
                                ? fmt::format("{} of them on rank {}, the first {}", c.failures,
                                              comm->rank(), c.first_failure)
                                : fmt::format("none on rank {}", comm->rank());
  throw FaultInTraining(
      FaultKind::product_check, step, NAN,
      fmt::format("silent data corruption: {} of {} checksummed products failed their check by "
                  "step {}{}, {}",
                  failures, products, step,
                  several ? fmt::format(" over {} ranks", comm->size()) : "", where),
      last_good,
      ". Resume from the last good checkpoint on another device, and check this one with the "
      "vendor's diagnostics (dcgmi diag, rocm-smi)",
      on_gpu, c.failures > 0);
}

std::string after_fault(const TrainConfig& cfg, const FaultInTraining& f, TrainObserver* observer,
                        std::size_t recovered_before, std::int64_t& from, const ReplayRun& replay) {
  const bool product = f.kind == FaultKind::product_check;
  auto warn = [&](std::string text) {
    if (observer == nullptr) return;
    TrainEvent e;
    e.kind = TrainEvent::Kind::warning;
    e.step = f.step;
    e.total_steps = cfg.steps > 0 ? cfg.steps : -1;
    e.message = std::move(text);
    observer->on_event(e);
  };
  std::string why_not;
  from = -1;
  if (!cfg.replay_faults) {
    why_not = "replays are off";
  } else if (cfg.checkpoint_dir.empty()) {
    why_not =
        "no checkpoint directory: --checkpoint DIR lets a replay tell the data from the "
        "device";
  } else {
    for (const std::int64_t c : list_checkpoints(cfg.checkpoint_dir))
      if (c < f.step) from = c;
    if (from < 0) why_not = fmt::format("no checkpoint before step {} to replay from", f.step);
  }
  const std::string reason = fmt::format("parity train found a fault: {}", f.found);
  // The device to mark: this rank's, where it may have caused the fault (FaultInTraining::here).
  const bool several = cfg.comm != nullptr && cfg.comm->size() > 1;
  auto mark = [&] {
    if (!f.here)
      return fmt::format("rank {}'s device passed its checks and is not marked", cfg.comm->rank());
    const std::string m = mark_suspect(cfg, f.on_gpu, reason);
    if (!several || product) return m;
    return fmt::format(
        "any of the {} ranks' devices may have caused it (they share every step's "
        "dense gradients): {}",
        cfg.comm->size(), m);
  };
  if (!why_not.empty()) {
    if (!product) throw NumericalError(fmt::format("{} (not replayed: {})", f.what(), why_not));
    throw NumericalError(fmt::format("{}; {}{}{} (not replayed: {})", f.found, mark(), f.last_good,
                                     f.advice, why_not));
  }
  const std::filesystem::path ckpt = find_checkpoint(cfg.checkpoint_dir, from);
  const std::string span =
      fmt::format("steps {} to {} from checkpoint '{}'", from + 1, f.step, ckpt.string());
  warn(
      fmt::format("{}; replaying {} on the same device, to tell the data or the model from the "
                  "device",
                  f.found, span));

  TrainConfig rc = cfg;
  rc.resume = true;
  rc.steps = f.step;
  rc.checkpoint_every = 0;
  rc.eval_every = 0;
  rc.loss_window = 0;
  rc.profile = false;
  rc.inject_fault.reset();
  rc.inject_table_fault.reset();
  bool reproduced = false;
  std::string again;
  try {
    const TrainResult r = replay(rc, from);
    if (f.kind == FaultKind::loss_spike) {
      reproduced = static_cast<float>(r.final_loss) == static_cast<float>(f.loss);
      again = fmt::format("loss {:.9g} at step {}", r.final_loss, f.step);
    } else {
      again = fmt::format("clean to step {}", f.step);
    }
  } catch (const FaultInTraining& g) {
    reproduced = g.kind == f.kind && (f.kind != FaultKind::nonfinite || g.step == f.step);
    again = g.found;
  }

  if (reproduced && !product)
    throw NumericalError(fmt::format(
        "{}{}; the replay of {} gave the same result again ({}): the data or the model is the "
        "cause, not the device{}",
        f.found, f.last_good, span, again, f.advice));
  const std::string marked = mark();
  if (reproduced)  // a product that fails its check again: a fault that persists
    throw NumericalError(fmt::format(
        "{}; the replay of {} failed its check again ({}): the device's fault persists; {}{}{}",
        f.found, span, again, marked, f.last_good, f.advice));
  const std::string verdict = fmt::format(
      "{}; the replay of {} differed ({}): the device computed step {} wrongly once "
      "(a hardware fault); {}",
      f.found, span, again, f.step, marked);
  constexpr std::size_t kRecoveries = 1;  // a second fault of the device stops the run
  if (recovered_before >= kRecoveries)
    throw NumericalError(fmt::format(
        "{}; this is the device's second fault in this run: stopping{}. Train on another device, "
        "and check this one with the vendor's diagnostics (dcgmi diag, rocm-smi)",
        verdict, f.last_good));
  warn(fmt::format("{}; training continues from checkpoint '{}'", verdict, ckpt.string()));
  return verdict;
}

}  // namespace parity::train_detail
