// The communicators of dist.h: the self communicator, and the MPI engine where Open MPI was found
// at configure time (PARITY_HAVE_MPI).
//
// Why the sums are built from an exchange rather than MPI_Allreduce: MPI leaves the order of a
// reduction to the library (and the algorithm it picks may change with the message size), so the
// bits of a sum could differ between runs, between rank counts and even between ranks. Here each
// rank receives every rank's share of its slice and adds them in rank order (0 first), then the
// slices are gathered: the same bits on every rank and every run, at the bytes of a ring
// all-reduce (each rank sends and receives 2 (P - 1) / P of the buffer).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "parity/dist.h"

#ifdef PARITY_HAVE_MPI
#include <mpi.h>
#endif

namespace parity {
namespace {

class SelfCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view engine() const override { return "self"; }
  void all_reduce_sum(std::span<float>) override {}
  void all_reduce_sum(std::span<double>) override {}
  void reduce_scatter_sum(std::span<const float> send, std::span<float> recv) override {
    check(send.size() == recv.size(), "reduce_scatter_sum", "send holds one block of recv's size");
    std::copy(send.begin(), send.end(), recv.begin());
  }
  void all_gather(std::span<const std::byte> send, std::span<std::byte> recv) override {
    check(send.size() == recv.size(), "all_gather", "recv is one block of send's size");
    std::copy(send.begin(), send.end(), recv.begin());
  }
  void all_to_all_v(std::span<const std::byte> send, std::span<const std::int64_t> send_bytes,
                    std::span<std::byte> recv, std::span<const std::int64_t> recv_bytes) override {
    check(send_bytes.size() == 1 && recv_bytes.size() == 1 && send_bytes[0] == recv_bytes[0] &&
              static_cast<std::size_t>(send_bytes[0]) == send.size() && send.size() == recv.size(),
          "all_to_all_v", "one block, sent to itself");
    std::copy(send.begin(), send.end(), recv.begin());
  }
  void barrier() override {}
  std::unique_ptr<Communicator> duplicate() override {
    return std::make_unique<SelfCommunicator>();
  }
  void abort(int) noexcept override {}

 private:
  static void check(bool ok, const char* op, const char* what) {
    if (!ok) throw Error(fmt::format("Communicator::{} (self): {}", op, what));
  }
};

#ifdef PARITY_HAVE_MPI

// Elements per MPI call: MPI counts and displacements are ints.
constexpr std::size_t kMaxChunk = std::size_t{1} << 28;

// Ends the run when one collective waits too long: each collective says when it starts and ends,
// and a thread checks the one in flight (a rank that died or hangs leaves the others inside a
// collective, where MPI itself would wait forever).
class Watchdog {
 public:
  Watchdog(double timeout_s, int rank, int size)
      : timeout_(timeout_s), rank_(rank), size_(size), thread_([this] { watch(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void begin(const char* op, std::int64_t collective) {
    std::lock_guard<std::mutex> lock(mu_);
    op_ = op;
    calls_ = collective;
    start_ = std::chrono::steady_clock::now();
  }
  void end() {
    std::lock_guard<std::mutex> lock(mu_);
    op_ = nullptr;
  }

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    const auto tick = std::chrono::duration<double>(std::min(1.0, std::max(0.01, timeout_ / 20)));
    while (!stop_) {
      cv_.wait_for(lock, tick);
      if (stop_ || op_ == nullptr) continue;
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      if (waited <= timeout_) continue;
      std::fprintf(stderr,
                   "parity: rank %d of %d: collective %s (collective %lld of this rank) has waited "
                   "%.1f s for the "
                   "other ranks (time-out %.1f s, PARITY_COLLECTIVE_TIMEOUT): a rank has died or "
                   "hangs; ending the run\n",
                   rank_, size_, op_, static_cast<long long>(calls_), waited, timeout_);
      std::fflush(stderr);
      int level = 0;
      MPI_Query_thread(&level);
      if (level == MPI_THREAD_MULTIPLE) MPI_Abort(MPI_COMM_WORLD, 3);
      std::_Exit(3);  // mpirun then ends the other ranks, as for a rank that died
    }
  }

  double timeout_;
  int rank_, size_;
  std::mutex mu_;
  std::condition_variable cv_;
  const char* op_ = nullptr;
  std::int64_t calls_ = 0;
  std::chrono::steady_clock::time_point start_;
  bool stop_ = false;
  std::thread thread_;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(double timeout_s) {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised) {
      int provided = 0;
      // MULTIPLE: the watchdog thread may end the run with MPI_Abort while the main thread is
      // inside a collective.
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        throw Error("MPI_Init_thread failed: is this process started by mpirun?");
      std::atexit([] {
        int finalised = 0;
        MPI_Finalized(&finalised);
        if (!finalised) MPI_Finalize();
      });
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    start(timeout_s);
  }
  // A duplicate of another engine's communicator (duplicate()).
  MpiCommunicator(MPI_Comm comm, double timeout_s) : comm_(comm), owned_(true) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    start(timeout_s);
  }
  ~MpiCommunicator() override {
    watchdog_.reset();
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (owned_ && !finalised) MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  std::unique_ptr<Communicator> duplicate() override {
    int level = 0;
    MPI_Query_thread(&level);
    if (level != MPI_THREAD_MULTIPLE) return nullptr;  // two threads may not call MPI at once
    MPI_Comm dup = MPI_COMM_NULL;
    call("duplicate", [&] { return MPI_Comm_dup(comm_, &dup); });
    return std::make_unique<MpiCommunicator>(dup, timeout_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view engine() const override { return "mpi"; }

  void all_reduce_sum(std::span<float> data) override { sum_in_rank_order(data, MPI_FLOAT); }
  void all_reduce_sum(std::span<double> data) override { sum_in_rank_order(data, MPI_DOUBLE); }

  void reduce_scatter_sum(std::span<const float> send, std::span<float> recv) override {
    ++collectives_;
    const std::size_t m = recv.size(), P = static_cast<std::size_t>(size_);
    if (send.size() != m * P)
      throw Error(
          fmt::format("Communicator::reduce_scatter_sum (mpi): send holds {} floats, "
                      "expected {} ranks x {}",
                      send.size(), P, m));
    std::vector<float> blocks(m * P);
    for (std::size_t off = 0; off < m; off += kMaxChunk) {
      const std::size_t n = std::min(kMaxChunk, m - off);
      std::vector<float> out(n * P), in(n * P);
      for (std::size_t r = 0; r < P; ++r)
        std::copy_n(send.data() + r * m + off, n, out.data() + r * n);
      call("reduce_scatter_sum", [&] {
        return MPI_Alltoall(out.data(), static_cast<int>(n), MPI_FLOAT, in.data(),
                            static_cast<int>(n), MPI_FLOAT, comm_);
      });
      for (std::size_t i = 0; i < n; ++i) {
        float s = in[i];
        for (std::size_t r = 1; r < P; ++r) s += in[r * n + i];
        recv[off + i] = s;
      }
    }
  }

  void all_gather(std::span<const std::byte> send, std::span<std::byte> recv) override {
    ++collectives_;
    const std::size_t n = send.size(), P = static_cast<std::size_t>(size_);
    if (recv.size() != n * P)
      throw Error(
          fmt::format("Communicator::all_gather (mpi): recv holds {} bytes, expected {} "
                      "ranks x {}",
                      recv.size(), P, n));
    if (n * P > static_cast<std::size_t>(INT_MAX))
      throw Error(
          fmt::format("Communicator::all_gather (mpi): {} bytes in all, more than one MPI "
                      "call carries ({})",
                      n * P, INT_MAX));
    call("all_gather", [&] {
      return MPI_Allgather(send.data(), static_cast<int>(n), MPI_BYTE, recv.data(),
                           static_cast<int>(n), MPI_BYTE, comm_);
    });
  }

  void all_to_all_v(std::span<const std::byte> send, std::span<const std::int64_t> send_bytes,
                    std::span<std::byte> recv, std::span<const std::int64_t> recv_bytes) override {
    ++collectives_;
    const auto P = static_cast<std::size_t>(size_);
    if (send_bytes.size() != P || recv_bytes.size() != P)
      throw Error(
          fmt::format("Communicator::all_to_all_v (mpi): {} send and {} receive sizes for "
                      "{} ranks",
                      send_bytes.size(), recv_bytes.size(), P));
    std::vector<int> sc(P), sd(P), rc(P), rd(P);
    auto layout = [&](std::span<const std::int64_t> bytes, std::size_t total, std::vector<int>& c,
                      std::vector<int>& d, const char* what) {
      std::int64_t at = 0;
      for (std::size_t r = 0; r < P; ++r) {
        if (bytes[r] < 0 || bytes[r] > INT_MAX || at > INT_MAX)
          throw Error(
              fmt::format("Communicator::all_to_all_v (mpi): {} block {} of {} bytes at "
                          "{}: MPI counts and offsets are below 2^31",
                          what, r, bytes[r], at));
        c[r] = static_cast<int>(bytes[r]);
        d[r] = static_cast<int>(at);
        at += bytes[r];
      }
      if (static_cast<std::size_t>(at) != total)
        throw Error(
            fmt::format("Communicator::all_to_all_v (mpi): the {} blocks add to {} bytes, "
                        "the buffer holds {}",
                        what, at, total));
    };
    layout(send_bytes, send.size(), sc, sd, "send");
    layout(recv_bytes, recv.size(), rc, rd, "receive");
    call("all_to_all_v", [&] {
      return MPI_Alltoallv(send.data(), sc.data(), sd.data(), MPI_BYTE, recv.data(), rc.data(),
                           rd.data(), MPI_BYTE, comm_);
    });
  }

  void barrier() override {
    ++collectives_;
    call("barrier", [&] { return MPI_Barrier(comm_); });
  }
  void abort(int code) noexcept override {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  // Every MPI call of a collective goes through here, timed by the watchdog.
  template <class F>
  void call(const char* op, F&& f) {
    watchdog_->begin(op, collectives_);
    const int code = f();
    watchdog_->end();
    ok(code, op);
  }
  void ok(int code, const char* op) const {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, text, &len);
    throw Error(fmt::format("Communicator::{} (mpi) on rank {} of {}: {}", op, rank_, size_,
                            std::string(text, static_cast<std::size_t>(len))));
  }

  // Each rank receives every rank's share of its slice of the buffer, adds them in rank order
  // and the slices are gathered back (the file's note says why).
  template <class T>
  void sum_in_rank_order(std::span<T> data, MPI_Datatype type) {
    ++collectives_;
    const std::size_t P = static_cast<std::size_t>(size_);
    if (P == 1 || data.empty()) return;
    for (std::size_t off = 0; off < data.size(); off += kMaxChunk) {
      const std::size_t n = std::min(kMaxChunk, data.size() - off);
      T* d = data.data() + off;
      std::vector<int> counts(P), displs(P);
      for (std::size_t r = 0; r < P; ++r) {
        displs[r] = static_cast<int>(n * r / P);
        counts[r] = static_cast<int>(n * (r + 1) / P) - displs[r];
      }
      const auto me = static_cast<std::size_t>(rank_);
      const int mine = counts[me];
      std::vector<int> rcounts(P, mine), rdispls(P);
      for (std::size_t r = 0; r < P; ++r) rdispls[r] = static_cast<int>(r) * mine;
      std::vector<T> parts(static_cast<std::size_t>(mine) * P);
      call("all_reduce_sum", [&] {
        return MPI_Alltoallv(d, counts.data(), displs.data(), type, parts.data(), rcounts.data(),
                             rdispls.data(), type, comm_);
      });
      std::vector<T> slice(static_cast<std::size_t>(mine));
      for (std::size_t i = 0; i < slice.size(); ++i) {
        T s = parts[i];
        for (std::size_t r = 1; r < P; ++r) s += parts[r * slice.size() + i];
        slice[i] = s;
      }
      call("all_reduce_sum", [&] {
        return MPI_Allgatherv(slice.data(), mine, type, d, counts.data(), displs.data(), type,
                              comm_);
      });
    }
  }

  void start(double timeout_s) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    if (!(timeout_s > 0))
      throw Error(fmt::format("collective time-out {} s: expected a positive number", timeout_s));
    timeout_ = timeout_s;
    watchdog_ = std::make_unique<Watchdog>(timeout_s, rank_, size_);
  }

  MPI_Comm comm_ = MPI_COMM_WORLD;
  bool owned_ = false;  // a duplicate, freed with this engine
  int rank_ = 0, size_ = 1;
  double timeout_ = 0;
  std::int64_t collectives_ = 0;  // collectives called so far, for the watchdog's message
  std::unique_ptr<Watchdog> watchdog_;
};

#endif  // PARITY_HAVE_MPI

}  // namespace

std::unique_ptr<Communicator> make_self_communicator() {
  return std::make_unique<SelfCommunicator>();
}

bool mpi_available() {
#ifdef PARITY_HAVE_MPI
  return true;
#else
  return false;
#endif
}

double default_collective_timeout_s() {
  const char* v = std::getenv("PARITY_COLLECTIVE_TIMEOUT");
  if (v == nullptr || *v == '\0') return 600;
  char* end = nullptr;
  const double t = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(t > 0) || !std::isfinite(t))
    throw InputError(fmt::format(
        "environment variable PARITY_COLLECTIVE_TIMEOUT='{}': expected a positive number of "
        "seconds",
        v));
  return t;
}

#ifndef PARITY_HAVE_NCCL
bool nccl_available() {
  return false;
}

std::unique_ptr<Communicator> make_nccl_communicator(const ProcessGroupInfo&, Communicator*,
                                                     double) {
  throw Error(
      "this build of parity has no NCCL engine: nccl.h and libnccl were not found with the CUDA "
      "toolkit when it was configured (build with the cuda backend where NCCL is installed)");
}
#endif

std::unique_ptr<Communicator> make_mpi_communicator(const ProcessGroupInfo* expected,
                                                    double timeout_s) {
#ifdef PARITY_HAVE_MPI
  auto c = std::make_unique<MpiCommunicator>(timeout_s);
  if (expected != nullptr && expected->launcher != Launcher::none &&
      (expected->rank != c->rank() || expected->world != c->size()))
    throw Error(fmt::format("MPI says rank {} of {}, the environment ({}) says rank {} of {}",
                            c->rank(), c->size(), expected->source, expected->rank,
                            expected->world));
  return c;
#else
  (void)expected;
  (void)timeout_s;
  throw Error(
      "this build of parity has no MPI engine: install Open MPI (scripts/setup.sh does) and "
      "configure again");
#endif
}

}  // namespace parity
