// Collectives over a backend's memory: the step's gradients and pooled rows where the step keeps
// them. In place where the communicator takes that memory (the cpu backend's is the host's; the
// NCCL engine takes a GPU's), else staged through host memory (the MPI engine under a GPU backend:
// two ranks sharing one GPU, a host without NCCL).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "parity/backend.h"
#include "parity/dist.h"

namespace parity {

class BackendCollectives {
 public:
  BackendCollectives(Communicator& comm, Backend& backend);

  Communicator& comm() const { return comm_; }
  // Whether the spans go to the communicator as they are (no staging).
  bool in_place() const { return in_place_; }

  // data[0, n) = its sum over the ranks, on every rank (backend memory). ready: the backend's
  // work that wrote data is known to be done (a fence waited for), so none is waited for here.
  void all_reduce_sum(float* data, std::size_t n, bool ready = false);
  // Communicator::all_to_all_v over backend memory.
  void all_to_all_v(const void* send, std::span<const std::int64_t> send_bytes, void* recv,
                    std::span<const std::int64_t> recv_bytes);
  // Communicator::all_gather over backend memory: `bytes` from each rank, in rank order.
  void all_gather(const void* send, std::size_t bytes, void* recv);

 private:
  // The backend's work that wrote the spans is done before another stream reads them.
  void before_in_place();

  Communicator& comm_;
  Backend& backend_;
  bool in_place_ = false;
  bool device_ = false;  // the spans are a GPU's memory
  std::vector<std::byte> send_, recv_;
};

}  // namespace parity
