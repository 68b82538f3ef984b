// NCCL alone: the collectives' bandwidth on this machine's GPUs as NCCL reaches it without
// parity, the yardstick `parity bench comm --engine nccl` is held against (bench/comm-check.sh,
// docs/perf/scaling.md). Measured the way nccl-tests measures it: one process drives every GPU
// (ncclCommInitAll, each collective one group call over the GPUs), a size's --iters launches go
// back to back on the GPUs' streams between two events after --warmup, and the slowest GPU's time
// counts. Sizes, buffers and columns are parity bench comm's: the all-reduce's buffer, the
// all-gather's received total, the reduce-scatter's and the all-to-all's sent total (each rank
// sending a P-th to every rank, as a training step's exchange does), with nccl-tests' bus
// bandwidth factors; every size's first result is checked against what each rank can work out
// alone (small integers, exact sums in fp32).
//
//   nccl_alone [--gpus N] [--ops all_to_all,all_reduce,...] [--min-bytes B] [--max-bytes B]
//              [--iters N] [--warmup N]
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/gpu/port.h"
#include "dist/nccl/nccl_port.h"
#include "parity/error.h"

namespace {

using parity::Error;
using parity::InputError;

void gpu_ok(parity::gpu::Error_t e, const char* what) {
  if (e != parity::gpu::kSuccess)
    throw Error(fmt::format("nccl_alone: {}: {}", what, parity::gpu::error_string(e)));
}
void nccl_ok(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(fmt::format("nccl_alone: {}: {}", what, ncclGetErrorString(r)));
}

enum class Op { all_to_all, all_reduce, reduce_scatter, all_gather };
constexpr const char* kOpNames[] = {"all_to_all", "all_reduce", "reduce_scatter", "all_gather"};

Op op_of(const std::string& name) {
  for (int i = 0; i < 4; ++i)
    if (name == kOpNames[i]) return static_cast<Op>(i);
  throw InputError(fmt::format(
      "--ops: '{}' is not a collective; expected all_to_all, all_reduce, reduce_scatter or "
      "all_gather",
      name));
}

// nccl-tests' bus-bandwidth factor (parity bench comm's).
double bus_factor(Op op, int n) {
  if (n <= 1) return 0;
  return (op == Op::all_reduce ? 2.0 : 1.0) * (n - 1) / n;
}

struct Args {
  int gpus = 0;  // 0: every visible GPU
  std::vector<Op> ops{Op::all_to_all, Op::all_reduce, Op::reduce_scatter, Op::all_gather};
  long long min_bytes = 1 << 10, max_bytes = 64 << 20;
  int iters = 20, warmup = 5;
};

long long whole(const std::string& flag, const char* text, long long lo) {
  long long v = 0;
  const char* end = text + std::strlen(text);
  const auto [p, ec] = std::from_chars(text, end, v);
  if (ec != std::errc() || p != end || v < lo)
    throw InputError(
        fmt::format("{} '{}': expected a whole number of at least {}", flag, text, lo));
  return v;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::puts(
          "nccl_alone [--gpus N] [--ops all_to_all,all_reduce,reduce_scatter,all_gather]\n"
          "           [--min-bytes B] [--max-bytes B] [--iters N] [--warmup N]");
      std::exit(0);
    }
    if (i + 1 >= argc) throw InputError(fmt::format("{}: a value is needed", flag));
    const char* v = argv[++i];
    if (flag == "--gpus") {
      a.gpus = static_cast<int>(whole(flag, v, 1));
    } else if (flag == "--ops") {
      a.ops.clear();
      std::string list = v;
      for (std::size_t at = 0; at <= list.size();) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        a.ops.push_back(op_of(list.substr(at, comma - at)));
        at = comma + 1;
      }
    } else if (flag == "--min-bytes") {
      a.min_bytes = whole(flag, v, 4);
    } else if (flag == "--max-bytes") {
      a.max_bytes = whole(flag, v, 4);
    } else if (flag == "--iters") {
      a.iters = static_cast<int>(whole(flag, v, 1));
    } else if (flag == "--warmup") {
      a.warmup = static_cast<int>(whole(flag, v, 0));
    } else {
      throw InputError(fmt::format("unknown flag '{}' (--help lists them)", flag));
    }
  }
  if (a.min_bytes > a.max_bytes)
    throw InputError(
        fmt::format("--min-bytes {} is above --max-bytes {}", a.min_bytes, a.max_bytes));
  return a;
}

// One GPU's part: its communicator, stream, timing events and buffers.
struct Rank {
  int device = 0;
  ncclComm_t comm = nullptr;
  parity::gpu::Stream_t stream = nullptr;
  parity::gpu::Event_t start = nullptr, stop = nullptr;
  float *send = nullptr, *recv = nullptr;
};

class Collectives {
 public:
  explicit Collectives(int gpus) : ranks_(static_cast<std::size_t>(gpus)) {
    std::vector<int> devices(ranks_.size());
    for (int r = 0; r < gpus; ++r) devices[static_cast<std::size_t>(r)] = r;
    std::vector<ncclComm_t> comms(ranks_.size());
    nccl_ok(ncclCommInitAll(comms.data(), gpus, devices.data()), "ncclCommInitAll");
    for (int r = 0; r < gpus; ++r) {
      Rank& k = ranks_[static_cast<std::size_t>(r)];
      k.device = r;
      k.comm = comms[static_cast<std::size_t>(r)];
      gpu_ok(parity::gpu::set_device(r), "set_device");
      gpu_ok(parity::gpu::stream_create(&k.stream), "stream_create");
      gpu_ok(parity::gpu::event_create(&k.start), "event_create");
      gpu_ok(parity::gpu::event_create(&k.stop), "event_create");
    }
  }
  ~Collectives() {
    for (Rank& k : ranks_) {
      (void)parity::gpu::set_device(k.device);
      if (k.stream != nullptr) (void)parity::gpu::stream_synchronize(k.stream);
      release(k);
      if (k.comm != nullptr) ncclCommDestroy(k.comm);
      if (k.start != nullptr) (void)parity::gpu::event_destroy(k.start);
      if (k.stop != nullptr) (void)parity::gpu::event_destroy(k.stop);
      if (k.stream != nullptr) (void)parity::gpu::stream_destroy(k.stream);
    }
  }
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }

  // Buffers of `floats` per rank, the send buffer filled with (rank + i) mod 64 and the receive
  // buffer poisoned.
  void prepare(std::size_t floats) {
    floats_ = floats;
    std::vector<float> host(floats);
    const std::vector<float> poison(floats, -1.0f);
    for (Rank& k : ranks_) {
      gpu_ok(parity::gpu::set_device(k.device), "set_device");
      release(k);
      void *s = nullptr, *r = nullptr;
      gpu_ok(parity::gpu::malloc_device(&s, floats * 4), "malloc_device");
      gpu_ok(parity::gpu::malloc_device(&r, floats * 4), "malloc_device");
      k.send = static_cast<float*>(s);
      k.recv = static_cast<float*>(r);
      for (std::size_t i = 0; i < floats; ++i)
        host[i] = static_cast<float>((static_cast<std::size_t>(k.device) + i) % 64);
      gpu_ok(parity::gpu::memcpy_async(k.send, host.data(), floats * 4, k.stream), "upload");
      gpu_ok(parity::gpu::memcpy_async(k.recv, poison.data(), floats * 4, k.stream), "upload");
      gpu_ok(parity::gpu::stream_synchronize(k.stream), "upload");
    }
  }

  // One collective on every GPU, enqueued (a group call over the GPUs).
  void launch(Op op) {
    const auto P = ranks_.size();
    const std::size_t block = floats_ / P;
    nccl_ok(ncclGroupStart(), "ncclGroupStart");
    for (Rank& k : ranks_) {
      switch (op) {
        case Op::all_reduce:  // in place, as parity bench comm's timed all-reduces
          nccl_ok(ncclAllReduce(k.recv, k.recv, floats_, ncclFloat, ncclSum, k.comm, k.stream),
                  "ncclAllReduce");
          break;
        case Op::reduce_scatter:
          nccl_ok(ncclReduceScatter(k.send, k.recv, block, ncclFloat, ncclSum, k.comm, k.stream),
                  "ncclReduceScatter");
          break;
        case Op::all_gather:
          nccl_ok(ncclAllGather(k.send, k.recv, block, ncclFloat, k.comm, k.stream),
                  "ncclAllGather");
          break;
        case Op::all_to_all:
          for (std::size_t q = 0; q < P; ++q) {
            nccl_ok(ncclSend(k.send + q * block, block, ncclFloat, static_cast<int>(q), k.comm,
                             k.stream),
                    "ncclSend");
            nccl_ok(ncclRecv(k.recv + q * block, block, ncclFloat, static_cast<int>(q), k.comm,
                             k.stream),
                    "ncclRecv");
          }
          break;
      }
    }
    nccl_ok(ncclGroupEnd(), "ncclGroupEnd");
  }

  // The first result of `op` against what each rank works out alone (the all-reduce starts from
  // the send buffer copied into the receive buffer).
  bool first_run_is_right(Op op) {
    const auto P = ranks_.size();
    const std::size_t m = floats_ / P;
    if (op == Op::all_reduce)
      for (Rank& k : ranks_)
        gpu_ok(parity::gpu::memcpy_async(k.recv, k.send, floats_ * 4, k.stream), "copy");
    launch(op);
    std::vector<float> got(floats_);
    auto value = [](std::size_t rank, std::size_t i) {
      return static_cast<float>((rank + i) % 64);
    };
    for (Rank& k : ranks_) {
      gpu_ok(parity::gpu::memcpy_async(got.data(), k.recv, floats_ * 4, k.stream), "download");
      gpu_ok(parity::gpu::stream_synchronize(k.stream), "download");
      const auto me = static_cast<std::size_t>(k.device);
      const std::size_t n = op == Op::reduce_scatter ? m : floats_;
      for (std::size_t i = 0; i < n; ++i) {
        float want = 0;
        switch (op) {
          case Op::all_reduce:
            for (std::size_t r = 0; r < P; ++r) want += value(r, i);
            break;
          case Op::reduce_scatter:
            for (std::size_t r = 0; r < P; ++r) want += value(r, me * m + i);
            break;
          case Op::all_gather:
            want = value(i / m, i % m);
            break;
          case Op::all_to_all:
            want = value(i / m, me * m + i % m);
            break;
        }
        if (got[i] != want) return false;
      }
    }
    return true;
  }

  // Seconds a launch of `op`, over `iters` back to back after `warmup`: the slowest GPU's.
  double time(Op op, int warmup, int iters) {
    for (int i = 0; i < warmup; ++i) launch(op);
    for (Rank& k : ranks_) gpu_ok(parity::gpu::event_record(k.start, k.stream), "event_record");
    for (int i = 0; i < iters; ++i) launch(op);
    double slowest = 0;
    for (Rank& k : ranks_) {
      gpu_ok(parity::gpu::event_record(k.stop, k.stream), "event_record");
      gpu_ok(parity::gpu::event_synchronize(k.stop), "event_synchronize");
      float ms = 0;
      gpu_ok(parity::gpu::event_elapsed_ms(&ms, k.start, k.stop), "event_elapsed_ms");
      slowest = std::max(slowest, static_cast<double>(ms) * 1e-3 / iters);
    }
    return slowest;
  }

 private:
  static void release(Rank& k) {
    if (k.send != nullptr) (void)parity::gpu::free_device(k.send);
    if (k.recv != nullptr) (void)parity::gpu::free_device(k.recv);
    k.send = k.recv = nullptr;
  }
  std::vector<Rank> ranks_;
  std::size_t floats_ = 0;
};

int run(const Args& a) {
  int visible = 0;
  if (parity::gpu::get_device_count(&visible) != parity::gpu::kSuccess || visible == 0)
    throw InputError("nccl_alone: no GPU is usable here");
  const int gpus = a.gpus > 0 ? a.gpus : visible;
  if (gpus > visible)
    throw InputError(
        fmt::format("--gpus {}: {} GPU{} visible", gpus, visible, visible == 1 ? " is" : "s are"));
  int version = 0;
  nccl_ok(ncclGetVersion(&version), "ncclGetVersion");
  Collectives c(gpus);
  fmt::print("nccl_alone: NCCL {}, {} GPU{} in one process, {} iterations after {} warm-up\n",
             version, gpus, gpus == 1 ? "" : "s", a.iters, a.warmup);
  fmt::print("{:>14} {:>15} {:>11} {:>12} {:>12} {:>6}\n", "size(B)", "op", "time(us)",
             "algbw(GB/s)", "busbw(GB/s)", "check");
  bool all_right = true;
  for (const Op op : a.ops) {
    for (long long bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= 4) {
      const auto P = static_cast<std::size_t>(gpus);
      const std::size_t floats =
          std::max<std::size_t>(P, static_cast<std::size_t>(bytes) / 4 / P * P);
      c.prepare(floats);
      const bool right = c.first_run_is_right(op);
      all_right = all_right && right;
      const double t = c.time(op, a.warmup, a.iters);
      const double size = static_cast<double>(floats) * 4;
      const double algbw = size / t / 1e9;
      fmt::print("{:>14} {:>15} {:>11.1f} {:>12.2f} {:>12.2f} {:>6}\n",
                 static_cast<long long>(size), kOpNames[static_cast<int>(op)], t * 1e6, algbw,
                 algbw * bus_factor(op, gpus), right ? "ok" : "WRONG");
    }
  }
  return all_right ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const InputError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_alone: %s\n", e.what());
    return 1;
  }
}
