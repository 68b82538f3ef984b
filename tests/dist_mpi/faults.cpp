// A rank that hangs or dies under mpirun (ctest dist.fault_*): the others must not wait forever.
//   dist_fault_check hang   rank 1 sleeps past the time-out before its all-reduce: rank 0's
//                           watchdog ends the run, naming its rank and the collective
//   dist_fault_check kill   rank 1 kills itself before its all-reduce: mpirun ends the run,
//                           naming the rank that died
// The time-out is PARITY_COLLECTIVE_TIMEOUT (the test sets 2 s).
#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <string>
#include <thread>
#include <vector>

#include "parity/dist.h"

int main(int argc, char** argv) {
  using namespace parity;
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    const ProcessGroupInfo g = detect_process_group();
    const auto c = make_mpi_communicator(&g);
    std::vector<float> v(1024, 1.0f);
    c->all_reduce_sum(v);  // every rank is up
    if (c->rank() == 1) {
      if (mode == "hang") std::this_thread::sleep_for(std::chrono::seconds(60));
      if (mode == "kill") std::raise(SIGKILL);
    }
    c->all_reduce_sum(v);
    fmt::print("dist_fault_check: rank {} finished, which a fault test must not reach\n",
               c->rank());
  } catch (const std::exception& e) {
    fmt::print(stderr, "dist_fault_check: {}\n", e.what());
    return 2;
  }
  return 0;
}
