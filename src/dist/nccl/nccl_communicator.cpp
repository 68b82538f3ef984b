// The NCCL engine of dist.h (RCCL on AMD, from the same source: nccl_port.h).
//
// Why it is built this way:
// - Spans may hold device memory, used in place (the step's gradients and rows), or host memory
//   (the trainer's control values: flags, evaluation scores), staged through one device buffer
//   that grows to the largest call. The runtime tells the two apart (gpu::is_device_pointer).
// - The collectives run on the engine's own stream and return once done, as the MPI engine's do.
//   While it waits the engine polls NCCL's asynchronous error and the clock: a rank that died or
//   hangs never leaves the others waiting past the collective time-out, and an NCCL failure
//   (a network error, a peer that aborted) ends the run naming the rank and the collective.
// - The ranks learn NCCL's unique id from rank 0 through the MPI engine where mpirun started them,
//   else through the TCP rendezvous at MASTER_ADDR:MASTER_PORT (torchrun-style launches).
// - Sums are NCCL's own all-reduce and reduce-scatter: the same bits on every rank, and from run to
//   run on one topology and NCCL version, but in NCCL's order, not rank order (the MPI engine's).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "dist/nccl/nccl_port.h"
#include "dist/rendezvous.h"
#include "parity/dist.h"

namespace parity {
namespace {

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const ProcessGroupInfo& g, Communicator* bootstrap, double timeout_s)
      : rank_(g.rank), size_(g.world), timeout_(timeout_s), bootstrap_(bootstrap) {
    if (!(timeout_s > 0))
      throw Error(fmt::format("collective time-out {} s: expected a positive number", timeout_s));
    if (bootstrap != nullptr && (bootstrap->rank() != rank_ || bootstrap->size() != size_))
      throw Error(
          fmt::format("the NCCL engine is for rank {} of {}, its bootstrap is rank {} of {}", rank_,
                      size_, bootstrap->rank(), bootstrap->size()));
    int devices = 0;
    gpu_ok(gpu::get_device_count(&devices), "counting the GPUs");
    // A launcher that gives each rank its own GPU (CUDA_VISIBLE_DEVICES per rank, Slurm's
    // --gpus-per-task=1) leaves one visible; otherwise the local rank picks it.
    device_ = devices == 1 ? 0 : g.local_rank;
    const int device = device_;
    if (device >= devices)
      throw InputError(fmt::format(
          "rank {} of {} is local rank {} on its host, which shows it {} GPU(s): start at most one "
          "rank per GPU",
          rank_, size_, g.local_rank, devices));
    gpu_ok(gpu::set_device(device), "selecting the rank's GPU");
    gpu_ok(gpu::stream_create(&stream_), "creating the engine's stream");
    try {  // a constructor that throws runs no destructor: the stream goes here
      // NVLink multicast stays off unless the user turns it on (not every fabric manager allows
      // it).
      ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
      ncclUniqueId id{};
      if (rank_ == 0) nccl_ok(ncclGetUniqueId(&id), "init");
      if (size_ > 1) {
        const auto mine = std::as_bytes(std::span<const ncclUniqueId>(&id, 1));
        std::vector<std::byte> from0;
        if (bootstrap != nullptr) {
          std::vector<std::byte> all(mine.size() * static_cast<std::size_t>(size_));
          bootstrap->all_gather(mine, all);
          from0.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(mine.size()));
        } else {
          from0 = rendezvous_broadcast(g, mine, timeout_s);
        }
        if (from0.size() != sizeof id)
          throw Error(fmt::format("the NCCL engine: rank 0 sent {} bytes of id, expected {}",
                                  from0.size(), sizeof id));
        std::memcpy(&id, from0.data(), sizeof id);
      }
      nccl_ok(ncclCommInitRank(&comm_, size_, id, rank_), "init");
    } catch (...) {
      (void)gpu::stream_destroy(stream_);
      throw;
    }
  }

  ~NcclCommunicator() override {
    if (stream_ != nullptr) (void)gpu::stream_synchronize(stream_);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (staging_ != nullptr) (void)gpu::free_device(staging_);
    if (stream_ != nullptr) (void)gpu::stream_destroy(stream_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view engine() const override { return "nccl"; }
  bool takes_device_memory() const override { return true; }

  void all_reduce_sum(std::span<float> data) override {
    all_reduce(data.data(), data.size(), ncclFloat, sizeof(float));
  }
  void all_reduce_sum(std::span<double> data) override {
    all_reduce(data.data(), data.size(), ncclDouble, sizeof(double));
  }

  void reduce_scatter_sum(std::span<const float> send, std::span<float> recv) override {
    const std::size_t m = recv.size(), P = static_cast<std::size_t>(size_);
    if (send.size() != m * P)
      throw Error(fmt::format(
          "Communicator::reduce_scatter_sum (nccl): send holds {} floats, expected {} ranks x {}",
          send.size(), P, m));
    if (m == 0) return;
    Staged s = stage(send.data(), send.size_bytes(), recv.data(), recv.size_bytes());
    run("reduce_scatter_sum",
        [&] { return ncclReduceScatter(s.send, s.recv, m, ncclFloat, ncclSum, comm_, stream_); });
    unstage(s, recv.data(), recv.size_bytes());
  }

  void all_gather(std::span<const std::byte> send, std::span<std::byte> recv) override {
    const std::size_t n = send.size(), P = static_cast<std::size_t>(size_);
    if (recv.size() != n * P)
      throw Error(fmt::format(
          "Communicator::all_gather (nccl): recv holds {} bytes, expected {} ranks x {}",
          recv.size(), P, n));
    if (n == 0) return;
    Staged s = stage(send.data(), n, recv.data(), recv.size());
    run("all_gather", [&] { return ncclAllGather(s.send, s.recv, n, ncclInt8, comm_, stream_); });
    unstage(s, recv.data(), recv.size());
  }

  void all_to_all_v(std::span<const std::byte> send, std::span<const std::int64_t> send_bytes,
                    std::span<std::byte> recv, std::span<const std::int64_t> recv_bytes) override {
    const auto P = static_cast<std::size_t>(size_);
    if (send_bytes.size() != P || recv_bytes.size() != P)
      throw Error(fmt::format(
          "Communicator::all_to_all_v (nccl): {} send and {} receive sizes for {} ranks",
          send_bytes.size(), recv_bytes.size(), P));
    auto offsets = [&](std::span<const std::int64_t> bytes, std::size_t total, const char* what) {
      std::vector<std::size_t> at(P + 1, 0);
      for (std::size_t r = 0; r < P; ++r) {
        if (bytes[r] < 0)
          throw Error(fmt::format("Communicator::all_to_all_v (nccl): {} block {} of {} bytes",
                                  what, r, bytes[r]));
        at[r + 1] = at[r] + static_cast<std::size_t>(bytes[r]);
      }
      if (at[P] != total)
        throw Error(fmt::format(
            "Communicator::all_to_all_v (nccl): the {} blocks add to {} bytes, the buffer holds {}",
            what, at[P], total));
      return at;
    };
    const auto so = offsets(send_bytes, send.size(), "send");
    const auto ro = offsets(recv_bytes, recv.size(), "receive");
    Staged s = stage(send.data(), send.size(), recv.data(), recv.size());
    run("all_to_all_v", [&] {
      ncclResult_t r = ncclGroupStart();
      for (std::size_t q = 0; q < P && r == ncclSuccess; ++q) {
        const int peer = static_cast<int>(q);
        if (send_bytes[q] > 0)
          r = ncclSend(static_cast<const char*>(s.send) + so[q],
                       static_cast<std::size_t>(send_bytes[q]), ncclInt8, peer, comm_, stream_);
        if (r == ncclSuccess && recv_bytes[q] > 0)
          r = ncclRecv(static_cast<char*>(s.recv) + ro[q], static_cast<std::size_t>(recv_bytes[q]),
                       ncclInt8, peer, comm_, stream_);
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
    unstage(s, recv.data(), recv.size());
  }

  void barrier() override {
    float one = 1.0f;
    all_reduce(&one, 1, ncclFloat, sizeof one, "barrier");
  }

  // A second NCCL communicator on the same GPU, its id sent through this one.
  std::unique_ptr<Communicator> duplicate() override {
    ProcessGroupInfo g;
    g.rank = rank_;
    g.world = size_;
    int devices = 0;
    gpu_ok(gpu::get_device_count(&devices), "counting the GPUs");
    g.local_rank = devices == 1 ? 0 : device_;
    g.local_world = devices;
    auto d = std::make_unique<NcclCommunicator>(g, this, timeout_);
    // Its abort ends the run through this one's bootstrap (MPI), never through this communicator,
    // which another thread may be using.
    d->bootstrap_ = bootstrap_;
    return d;
  }
  bool runs_beside_duplicate() const override { return false; }

  void abort(int code) noexcept override {
    // One thread ends the process; another that fails meanwhile (the bucketed all-reduce's
    // worker, or the main thread) waits for it.
    static std::atomic<bool> aborting{false};
    if (aborting.exchange(true))
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    std::fflush(stdout);
    std::fflush(stderr);
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    if (bootstrap_ != nullptr) bootstrap_->abort(code);  // mpirun: ends every rank
    std::_Exit(code);
  }

 private:
  // Where a call's send and receive bytes are on the device: the caller's device memory, or the
  // staging buffer (send first, the receive area after it).
  struct Staged {
    const void* send;
    void* recv;
    bool recv_staged;
  };

  Staged stage(const void* send, std::size_t send_bytes, void* recv, std::size_t recv_bytes) {
    // Any thread may call: the GPU is the one this engine was made on.
    gpu_ok(gpu::set_device(device_), "selecting the rank's GPU");
    const bool send_dev = send_bytes == 0 || gpu::is_device_pointer(send);
    const bool recv_dev = recv_bytes == 0 || gpu::is_device_pointer(recv);
    const std::size_t recv_at = send_dev ? 0 : (send_bytes + 255) / 256 * 256;
    grow(recv_at + (recv_dev ? 0 : recv_bytes));
    Staged s{send, recv, !recv_dev};
    if (!send_dev) {
      gpu_ok(gpu::memcpy_async(staging_, send, send_bytes, stream_),
             "staging a collective's input");
      s.send = staging_;
    }
    if (!recv_dev) s.recv = static_cast<char*>(staging_) + recv_at;
    return s;
  }
  void unstage(const Staged& s, void* recv, std::size_t bytes) {
    if (!s.recv_staged) return;
    gpu_ok(gpu::memcpy_async(recv, s.recv, bytes, stream_), "copying a collective's output back");
    gpu_ok(gpu::stream_synchronize(stream_), "copying a collective's output back");
  }
  void grow(std::size_t bytes) {
    if (bytes <= staging_bytes_) return;
    if (staging_ != nullptr) {
      gpu_ok(gpu::stream_synchronize(stream_), "growing the staging buffer");
      const gpu::Error_t e = gpu::free_device(staging_);
      staging_ = nullptr;
      staging_bytes_ = 0;
      gpu_ok(e, "growing the staging buffer");
    }
    const std::size_t want = std::max(bytes, 2 * staging_bytes_);
    gpu_ok(gpu::malloc_device(&staging_, want), "allocating the staging buffer");
    staging_bytes_ = want;
  }

  void all_reduce(void* data, std::size_t n, ncclDataType_t type, std::size_t elt,
                  const char* op = "all_reduce_sum") {
    if (n == 0) return;
    Staged s = stage(data, n * elt, data, n * elt);
    if (s.recv_staged) s.recv = const_cast<void*>(s.send);  // in place in the staging buffer
    run(op, [&] { return ncclAllReduce(s.send, s.recv, n, type, ncclSum, comm_, stream_); });
    unstage(s, data, n * elt);
  }

  // Enqueues one collective and waits for it (the file's note says how).
  template <class F>
  void run(const char* op, F&& enqueue) {
    ++collectives_;
    nccl_ok(enqueue(), op);
    const auto start = std::chrono::steady_clock::now();
    for (long spins = 0;; ++spins) {
      const gpu::Error_t q = gpu::stream_query(stream_);
      if (q == gpu::kSuccess) return;
      if (q != gpu::kNotReady)
        throw Error(fmt::format("Communicator::{} (nccl) on rank {} of {}: {}", op, rank_, size_,
                                gpu::error_string(q)));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        end_run(fmt::format("collective {} (collective {} of this rank) failed: NCCL says {}", op,
                            collectives_, ncclGetErrorString(async)));
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_)
        end_run(fmt::format(
            "collective {} (collective {} of this rank) has waited {:.1f} s for the other ranks "
            "(time-out {:.1f} s, PARITY_COLLECTIVE_TIMEOUT): a rank has died or hangs; ending the "
            "run",
            op, collectives_, waited, timeout_));
      // Short collectives are polled closely; a long wait gives the core back.
      if (spins > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  [[noreturn]] void end_run(const std::string& why) {
    std::fprintf(stderr, "parity: rank %d of %d: %s\n", rank_, size_, why.c_str());
    abort(3);
    std::_Exit(3);  // abort() does not return; said again for the compiler
  }

  void nccl_ok(ncclResult_t r, const char* op) const {
    if (r == ncclSuccess) return;
    throw Error(
        fmt::format("Communicator::{} (nccl) on rank {} of {}: {} ({})", op, rank_, size_,
                    ncclGetErrorString(r),
                    comm_ != nullptr ? ncclGetLastError(comm_) : ncclGetLastError(nullptr)));
  }
  void gpu_ok(gpu::Error_t e, const char* doing) const {
    if (e == gpu::kSuccess) return;
    throw Error(fmt::format("the NCCL engine on rank {} of {}: {}: {}", rank_, size_, doing,
                            gpu::error_string(e)));
  }

  int rank_ = 0, size_ = 1;
  int device_ = 0;
  double timeout_;
  Communicator* bootstrap_;
  ncclComm_t comm_ = nullptr;
  gpu::Stream_t stream_ = nullptr;
  void* staging_ = nullptr;
  std::size_t staging_bytes_ = 0;
  std::int64_t collectives_ = 0;  // collectives called so far, for messages
};

}  // namespace

bool nccl_available() {
  return true;
}

std::unique_ptr<Communicator> make_nccl_communicator(const ProcessGroupInfo& g,
                                                     Communicator* bootstrap, double timeout_s) {
  return std::make_unique<NcclCommunicator>(g, bootstrap, timeout_s);
}

}  // namespace parity
