// Process groups and collectives: which rank of a run this process is (from the environment its
// launcher set: mpirun, Slurm or a torchrun-style launcher), and the collectives a sharded step
// needs, behind one interface with one engine per transport: MPI on CPUs, NCCL on NVIDIA GPUs
// (RCCL on AMD from the same source). A run on one process uses the self communicator, which
// moves nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "parity/error.h"
#include "parity/spec.h"  // NamedValue

namespace parity {

enum class Launcher : std::uint8_t { none, mpirun, slurm, torchrun };
inline constexpr NamedValue<Launcher> kLauncherNames[] = {{"none", Launcher::none},
                                                          {"mpirun", Launcher::mpirun},
                                                          {"slurm", Launcher::slurm},
                                                          {"torchrun", Launcher::torchrun}};

// This process among the ranks of a run.
struct ProcessGroupInfo {
  Launcher launcher = Launcher::none;   // none: a single process
  int rank = 0, world = 1;              // this rank, of `world`
  int local_rank = 0, local_world = 1;  // on this host (the GPU a rank drives is its local rank)
  std::string master_addr;              // torchrun-style: where rank 0 listens
  int master_port = 0;
  // The variables the values came from, for messages ("OMPI_COMM_WORLD_RANK", ...).
  std::string source;
};

// A variable of the environment, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;

// The process group the launcher describes, checked: Open MPI's mpirun (OMPI_COMM_WORLD_RANK,
// _SIZE, _LOCAL_RANK, _LOCAL_SIZE), Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
// SLURM_NTASKS_PER_NODE), or a torchrun-style launcher (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), first found in that order; none of them: one
// process. Throws InputError naming the variable that is malformed or inconsistent (a rank not
// below the world size, a world size without a rank).
ProcessGroupInfo detect_process_group(const EnvLookup& env);
// The same from this process's environment.
ProcessGroupInfo detect_process_group();

// Collectives over the ranks of a run. Every rank calls each collective in the same order with
// sizes that agree (as NCCL and MPI require). The sums are deterministic: every rank gets the same
// bits, on every run. The MPI engine sums each element in rank order (0 first); the NCCL engine in
// NCCL's order, fixed for one topology and NCCL version.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view engine() const = 0;  // "self", "mpi", "nccl"
  // Whether spans may hold a GPU backend's memory (NCCL's engine: in place, once the work that
  // wrote it is done); the others take host memory only.
  virtual bool takes_device_memory() const { return false; }

  // data[i] = the sum over ranks of data[i], on every rank.
  virtual void all_reduce_sum(std::span<float> data) = 0;
  virtual void all_reduce_sum(std::span<double> data) = 0;
  // send holds size() blocks of recv.size() floats, block r for rank r; recv = the sum over ranks
  // of their block for this rank.
  virtual void reduce_scatter_sum(std::span<const float> send, std::span<float> recv) = 0;
  // recv = every rank's send, in rank order (recv.size() == size() * send.size()).
  virtual void all_gather(std::span<const std::byte> send, std::span<std::byte> recv) = 0;
  // Variable-size exchange: send holds size() consecutive blocks of send_bytes[r] bytes (block r
  // for rank r); recv receives size() blocks of recv_bytes[r] bytes (block r from rank r). Each
  // rank's recv_bytes[r] must equal rank r's send_bytes[this rank].
  virtual void all_to_all_v(std::span<const std::byte> send,
                            std::span<const std::int64_t> send_bytes, std::span<std::byte> recv,
                            std::span<const std::int64_t> recv_bytes) = 0;
  virtual void barrier() = 0;
  // A communicator over the same ranks whose collectives are ordered apart from this one's, so
  // that another thread may run them while this one runs others (the dense gradients' all-reduce
  // beside the embedding exchange). Collective: every rank calls it at the same point. Null
  // where the engine cannot (MPI without MPI_THREAD_MULTIPLE). It must not outlive this one.
  virtual std::unique_ptr<Communicator> duplicate() { return nullptr; }
  // Whether a collective of this communicator may be in flight while one of its duplicate's is
  // (MPI: yes; NCCL: no, its kernels wait on the GPU for their peers, and two communicators'
  // kernels may block each other, so the caller keeps them apart).
  virtual bool runs_beside_duplicate() const { return true; }
  // Ends every rank of the run with `code` (a rank that met an error the others did not: they
  // would otherwise wait for it inside a collective). The self communicator returns.
  virtual void abort(int code) noexcept = 0;
};

// One process: every collective is a copy (or nothing).
std::unique_ptr<Communicator> make_self_communicator();

// Whether this build has the MPI engine (Open MPI found at configure time).
bool mpi_available();

// A collective that waits longer than this for the other ranks ends the whole run: a rank that
// died or hangs must not leave the others waiting forever. The default is the environment's
// PARITY_COLLECTIVE_TIMEOUT (seconds) when set, else 600.
double default_collective_timeout_s();

// The MPI engine over MPI_COMM_WORLD (MPI initialised on first use, finalised at exit). Throws
// Error where this build has no MPI, or where the MPI world disagrees with `expected` (a
// process group detected from the environment: its rank and world size). A watchdog ends the run
// (MPI_Abort, exit status 3) when one collective has waited more than `timeout_s`, saying which
// rank, which collective and how long, on standard error.
std::unique_ptr<Communicator> make_mpi_communicator(
    const ProcessGroupInfo* expected = nullptr, double timeout_s = default_collective_timeout_s());

// Whether this build has the NCCL engine (nccl.h and libnccl found with the CUDA toolkit at
// configure time).
bool nccl_available();

// The NCCL engine (RCCL on AMD) on the GPU of this rank's local rank. The ranks learn NCCL's id
// from rank 0 through `bootstrap` (the MPI engine, under mpirun) or, without one, at the TCP
// rendezvous MASTER_ADDR:MASTER_PORT names (torchrun-style launches). Spans may hold device memory
// (used in place: the work that wrote it must be finished, as the engine runs on its own stream)
// or host memory (staged through device memory); each collective returns once done. A collective
// that waits longer than timeout_s, or that NCCL reports failed, ends the run (exit status 3)
// naming the rank and the collective. Throws Error where this build has no NCCL, InputError where
// the rank has no GPU of its local rank.
std::unique_ptr<Communicator> make_nccl_communicator(
    const ProcessGroupInfo& g, Communicator* bootstrap = nullptr,
    double timeout_s = default_collective_timeout_s());

}  // namespace parity
