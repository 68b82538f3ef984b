// parity bench comm: the collectives' bandwidth over message sizes, printed the way nccl-tests
// prints it (algorithm and bus bandwidth), beside the planner's collective model for a device at
// the same rank count.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "common.h"
#include "parity/backend.h"
#include "parity/dist.h"
#include "parity/error.h"
#include "parity/perf.h"

namespace parity::cli {
namespace {

struct CommArgs {
  std::vector<std::string> ops{"all_to_all", "all_reduce", "reduce_scatter", "all_gather"};
  std::int64_t min_bytes = 1 << 10, max_bytes = 64 << 20;
  int iters = 20, warmup = 5;
  std::string engine = "auto", device;
};

// nccl-tests' bus-bandwidth factor: the fraction of the buffer each rank's links carry.
double bus_factor(Collective c, int n) {
  if (n <= 1) return 0;
  return (c == Collective::all_reduce ? 2.0 : 1.0) * (n - 1) / n;
}

Collective collective_of(const std::string& name) {
  for (Collective c : {Collective::all_to_all, Collective::all_reduce, Collective::reduce_scatter,
                       Collective::all_gather})
    if (collective_name(c) == name) return c;
  throw InputError(fmt::format(
      "--ops: '{}' is not a collective; expected all_to_all, all_reduce, reduce_scatter or "
      "all_gather",
      name));
}

// One collective on a buffer of `bytes` per rank (nccl-tests' size: the all-reduce's buffer, the
// all-gather's received total, the reduce-scatter's and the all-to-all's sent total), filled with
// small integers and checked once: every sum is exact in fp32. With a GPU backend (the NCCL
// engine) the buffers are in device memory, as a training step's are, and used in place.
class Op {
 public:
  Op(Communicator& c, Collective kind, std::int64_t bytes, Backend* gpu)
      : c_(c), kind_(kind), gpu_(gpu) {
    const auto P = static_cast<std::size_t>(c.size());
    floats_ = std::max<std::size_t>(P, static_cast<std::size_t>(bytes) / 4 / P * P);
    a_.resize(floats_);
    b_.resize(floats_);
    for (std::size_t i = 0; i < floats_; ++i) a_[i] = static_cast<float>((c.rank() + i) % 64);
    if (gpu_ != nullptr) {
      da_ = Buffer(*gpu_, floats_ * 4);
      db_ = Buffer(*gpu_, floats_ * 4);
      gpu_->copy_to_device(da_.get(), a_.data(), floats_ * 4);
      gpu_->synchronize();
    }
  }
  std::int64_t bytes() const { return static_cast<std::int64_t>(floats_ * 4); }
  // fresh: the all-reduce starts from the inputs again (else it sums its last result in place,
  // as the timed runs do: no copy is timed).
  void run(bool fresh) {
    const auto P = static_cast<std::size_t>(c_.size());
    float* a = gpu_ != nullptr ? da_.as<float>() : a_.data();
    float* b = gpu_ != nullptr ? db_.as<float>() : b_.data();
    const std::span<float> as(a, floats_), bs(b, floats_);
    switch (kind_) {
      case Collective::all_reduce:
        if (fresh) {
          if (gpu_ != nullptr) {
            gpu_->copy_within(b, a, floats_ * 4);
            gpu_->synchronize();  // the engine's stream does not wait for the backend's
          } else {
            std::copy(a_.begin(), a_.end(), b_.begin());
          }
        }
        c_.all_reduce_sum(bs);
        break;
      case Collective::reduce_scatter:
        c_.reduce_scatter_sum(as, bs.first(floats_ / P));
        break;
      case Collective::all_gather:
        c_.all_gather(std::as_bytes(as.first(floats_ / P)), std::as_writable_bytes(bs));
        break;
      case Collective::all_to_all: {
        const std::vector<std::int64_t> block(P, static_cast<std::int64_t>(floats_ / P * 4));
        c_.all_to_all_v(std::as_bytes(as), block, std::as_writable_bytes(bs), block);
        break;
      }
    }
  }
  // The result of one fresh run against what each rank can work out alone.
  bool check() {
    const auto P = static_cast<std::size_t>(c_.size());
    const std::size_t m = floats_ / P, me = static_cast<std::size_t>(c_.rank());
    if (gpu_ != nullptr) gpu_->copy_to_host(b_.data(), db_.get(), floats_ * 4);
    auto value = [](std::size_t rank, std::size_t i) {
      return static_cast<float>((rank + i) % 64);
    };
    for (std::size_t i = 0; i < floats_; ++i) {
      float want = 0;
      switch (kind_) {
        case Collective::all_reduce:
          for (std::size_t r = 0; r < P; ++r) want += value(r, i);
          break;
        case Collective::reduce_scatter:
          if (i >= m) return true;
          for (std::size_t r = 0; r < P; ++r) want += value(r, me * m + i);
          break;
        case Collective::all_gather:
          want = value(i / m, i % m);
          break;
        case Collective::all_to_all:
          want = value(i / m, me * m + i % m);
          break;
      }
      if (b_[i] != want) return false;
    }
    return true;
  }

 private:
  Communicator& c_;
  Collective kind_;
  Backend* gpu_;
  std::size_t floats_ = 0;
  std::vector<float> a_, b_;
  Buffer da_, db_;
};

void run_comm(const CommArgs& a) {
  const ProcessGroupInfo g = detect_process_group();
  std::string engine = a.engine;
  if (engine == "auto")
    engine = nccl_available() && !detect_gpu().empty() ? "nccl"
             : g.world == 1 && !mpi_available()        ? "self"
                                                       : "mpi";
  std::unique_ptr<Communicator> bootstrap, c;
  std::unique_ptr<Backend> gpu;  // the NCCL engine's buffers
  if (engine == "self") {
    c = make_self_communicator();
  } else if (engine == "mpi") {
    c = make_mpi_communicator(&g);
  } else if (engine == "nccl") {
    if (g.world > 1 && (g.launcher == Launcher::mpirun || g.launcher == Launcher::slurm))
      bootstrap = make_mpi_communicator(&g);
    c = make_nccl_communicator(g, bootstrap.get());  // selects the local rank's GPU
    gpu = make_backend("gpu");
  } else {
    throw InputError(fmt::format("--engine: '{}'; expected auto, mpi, nccl or self", a.engine));
  }
  if (a.min_bytes > a.max_bytes)
    throw InputError(
        fmt::format("--min-bytes {} is above --max-bytes {}", a.min_bytes, a.max_bytes));
  std::vector<Collective> ops;
  for (const std::string& name : a.ops) ops.push_back(collective_of(name));
  const int P = c->size();
  const bool lead = c->rank() == 0;
  std::optional<DeviceSpec> dev;
  Calibration cal;
  if (!a.device.empty()) {
    dev = find_device(a.device, configs_dir() / "devices");
    cal = calibration_for(*dev, configs_dir());
  }
  if (lead) {
    fmt::print("parity bench comm: engine {}, {} rank{} ({}), {} iterations after {} warm-up\n",
               c->engine(), P, P == 1 ? "" : "s",
               g.launcher == Launcher::none
                   ? "one process"
                   : "started by " + std::string(name_in(kLauncherNames, g.launcher)),
               a.iters, a.warmup);
    if (dev)
      fmt::print("model: the planner's collective_time on {} x {} (calibration: {})\n", P,
                 dev->display_name, cal.source.substr(0, cal.source.find(" (")));
    fmt::print("{:>14} {:>15} {:>11} {:>12} {:>12} {:>6}{}\n", "size(B)", "op", "time(us)",
               "algbw(GB/s)", "busbw(GB/s)", "check",
               dev ? fmt::format(" {:>13} {:>13}", "model(us)", "model busbw") : "");
  }
  std::vector<CollectiveSample> samples;  // for the scale-up fit
  for (const Collective kind : ops) {
    for (std::int64_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= 4) {
      Op op(*c, kind, bytes, gpu.get());
      op.run(true);
      const bool ok = op.check();
      for (int i = 0; i < a.warmup; ++i) op.run(false);
      c->barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < a.iters; ++i) op.run(false);
      double mine =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / a.iters;
      // The slowest rank's time, and whether every rank's check held.
      std::vector<double> all(static_cast<std::size_t>(P));
      const double row[2] = {mine, ok ? 1.0 : 0.0};
      std::vector<double> rows(2 * static_cast<std::size_t>(P));
      c->all_gather(std::as_bytes(std::span<const double>(row)),
                    std::as_writable_bytes(std::span<double>(rows)));
      double t = 0;
      bool every = true;
      for (int r = 0; r < P; ++r) {
        t = std::max(t, rows[2 * static_cast<std::size_t>(r)]);
        every = every && rows[2 * static_cast<std::size_t>(r) + 1] == 1.0;
      }
      if (!lead) continue;
      const double size = static_cast<double>(op.bytes());
      samples.push_back({kind, size, P, t});
      const double algbw = size / t / 1e9;
      std::string model;
      if (dev) {
        const double mt = collective_time(kind, size, P, *dev, cal);
        model = fmt::format(" {:>13.1f} {:>13.2f}", mt * 1e6,
                            mt > 0 ? size / mt / 1e9 * bus_factor(kind, P) : 0.0);
      }
      fmt::print("{:>14} {:>15} {:>11.1f} {:>12.2f} {:>12.2f} {:>6}{}\n", op.bytes(),
                 collective_name(kind), t * 1e6, algbw, algbw * bus_factor(kind, P),
                 every ? "ok" : "WRONG", model);
      if (!every)
        throw Error(fmt::format("{} of {} bytes gave a wrong result on some rank",
                                collective_name(kind), op.bytes()));
    }
  }
  // The device's scale-up terms as this run measures them, for its calibration file.
  if (lead && dev && P >= 2 && P <= dev->scale_up_domain.value) {
    try {
      const CollectiveFit f = fit_scale_up(samples, *dev);
      fmt::print(
          "scale-up fit over these {} results (least squares on relative error; the calibration "
          "has {:.3g} s and {:.3f}):\n  collective_latency_up_s: {:.3g}\n  scale_up_efficiency: "
          "{:.3f}\n  (the fitted model's error: rms {:.1f}%, worst {:.1f}%)\n",
          f.samples, cal.collective_latency_up_s, cal.scale_up_efficiency, f.latency_s,
          f.efficiency, 100 * f.rms_relative_error, 100 * f.worst_relative_error);
    } catch (const InputError& e) {
      fmt::print("no scale-up fit: {}\n", e.what());
    }
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks of the system's parts");
  bench->require_subcommand(1);
  auto args = std::make_shared<CommArgs>();
  CLI::App* comm = bench->add_subcommand(
      "comm",
      "Collectives over message sizes (algorithm and bus bandwidth, as nccl-tests prints them),\n"
      "beside the planner's model of them for --device at the same rank count. Every result is\n"
      "checked. Run under a launcher:\n\n"
      "  mpirun -np 4 parity bench comm --device h200\n"
      "  srun -n 4 parity bench comm\n"
      "  torchrun --nproc-per-node 8 --no-python parity bench comm   # NCCL between GPUs\n"
      "  parity bench comm --engine self            # one process");
  comm->add_option("--ops", args->ops,
                   "Collectives: all_to_all, all_reduce, reduce_scatter, all_gather")
      ->delimiter(',');
  comm->add_option("--min-bytes", args->min_bytes, "Smallest buffer per rank, bytes")
      ->check(positive_integer())
      ->capture_default_str();
  comm->add_option("--max-bytes", args->max_bytes, "Largest buffer per rank, bytes (x4 steps)")
      ->check(positive_integer())
      ->capture_default_str();
  comm->add_option("--iters", args->iters, "Timed iterations per size")
      ->check(positive_integer())
      ->capture_default_str();
  comm->add_option("--warmup", args->warmup, "Untimed iterations first")
      ->check(nonnegative_integer())
      ->capture_default_str();
  comm->add_option("--engine", args->engine,
                   "auto (NCCL on the GPUs where built and a GPU is usable, else MPI when built "
                   "with it), mpi, nccl (buffers in device memory) or self")
      ->capture_default_str();
  comm->add_option("--device", args->device,
                   "Print the planner's collective model for this device beside each size");
  comm->callback([args] { run_comm(*args); });
}

}  // namespace parity::cli
