// The process group from each launcher's environment, and the errors a malformed one gets.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "parity/dist.h"

namespace parity {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    const auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string error_of(std::map<std::string, std::string> vars) {
  try {
    (void)detect_process_group(env_of(std::move(vars)));
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ProcessGroup, NoLauncherIsOneProcess) {
  const ProcessGroupInfo g = detect_process_group(env_of({{"HOME", "/root"}}));
  EXPECT_EQ(g.launcher, Launcher::none);
  EXPECT_EQ(g.rank, 0);
  EXPECT_EQ(g.world, 1);
  EXPECT_EQ(g.local_rank, 0);
}

TEST(ProcessGroup, EachLauncher) {
  ProcessGroupInfo g = detect_process_group(env_of({{"OMPI_COMM_WORLD_RANK", "3"},
                                                    {"OMPI_COMM_WORLD_SIZE", "8"},
                                                    {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                                                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}));
  EXPECT_EQ(g.launcher, Launcher::mpirun);
  EXPECT_EQ(g.rank, 3);
  EXPECT_EQ(g.world, 8);
  EXPECT_EQ(g.local_rank, 3);
  EXPECT_EQ(g.local_world, 4);
  g = detect_process_group(env_of({{"SLURM_PROCID", "5"},
                                   {"SLURM_NTASKS", "16"},
                                   {"SLURM_LOCALID", "1"},
                                   {"SLURM_NTASKS_PER_NODE", "8(x2)"}}));
  EXPECT_EQ(g.launcher, Launcher::slurm);
  EXPECT_EQ(g.rank, 5);
  EXPECT_EQ(g.world, 16);
  EXPECT_EQ(g.local_rank, 1);
  EXPECT_EQ(g.local_world, 8);
  g = detect_process_group(env_of({{"RANK", "1"},
                                   {"WORLD_SIZE", "2"},
                                   {"LOCAL_RANK", "1"},
                                   {"LOCAL_WORLD_SIZE", "2"},
                                   {"MASTER_ADDR", "node0"},
                                   {"MASTER_PORT", "29500"}}));
  EXPECT_EQ(g.launcher, Launcher::torchrun);
  EXPECT_EQ(g.rank, 1);
  EXPECT_EQ(g.world, 2);
  EXPECT_EQ(g.master_addr, "node0");
  EXPECT_EQ(g.master_port, 29500);
  // mpirun's variables win over a Slurm allocation's (mpirun inside an salloc sets both).
  g = detect_process_group(env_of({{"OMPI_COMM_WORLD_RANK", "0"},
                                   {"OMPI_COMM_WORLD_SIZE", "2"},
                                   {"SLURM_PROCID", "0"},
                                   {"SLURM_NTASKS", "1"}}));
  EXPECT_EQ(g.launcher, Launcher::mpirun);
  EXPECT_EQ(g.world, 2);
}

TEST(ProcessGroup, MalformedVariablesAreNamed) {
  EXPECT_NE(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("RANK=2 is not below WORLD_SIZE=2"),
            std::string::npos);
  EXPECT_NE(error_of({{"SLURM_PROCID", "0"}}).find("SLURM_PROCID is set without SLURM_NTASKS"),
            std::string::npos);
  EXPECT_NE(error_of({{"OMPI_COMM_WORLD_RANK", "x"}, {"OMPI_COMM_WORLD_SIZE", "2"}})
                .find("OMPI_COMM_WORLD_RANK='x': expected a whole number from 0"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}}).find("WORLD_SIZE='0'"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}}).find("MASTER_ADDR is not set"),
            std::string::npos);
  EXPECT_NE(
      error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})
          .find("MASTER_PORT='70000': expected a whole number from 1 to 65535"),
      std::string::npos);
  EXPECT_NE(
      error_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "1"}})
          .find("LOCAL_RANK='1'"),
      std::string::npos);
}

TEST(SelfCommunicator, EveryCollectiveIsACopy) {
  const auto c = make_self_communicator();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  std::vector<float> v{1.5f, -2.0f};
  c->all_reduce_sum(v);
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f}));
  std::vector<float> out(2, -1.0f);
  c->reduce_scatter_sum(v, out);
  EXPECT_EQ(out, v);
  const std::vector<std::byte> bytes{std::byte{1}, std::byte{2}, std::byte{3}};
  std::vector<std::byte> got(3);
  const std::vector<std::int64_t> n{3};
  c->all_to_all_v(bytes, n, got, n);
  EXPECT_EQ(got, bytes);
  std::vector<std::byte> short_recv(2);
  EXPECT_THROW(c->all_gather(bytes, short_recv), Error);
  c->barrier();
}

TEST(Communicator, CollectiveTimeOutFromTheEnvironment) {
  ::unsetenv("PARITY_COLLECTIVE_TIMEOUT");
  EXPECT_EQ(default_collective_timeout_s(), 600);
  ::setenv("PARITY_COLLECTIVE_TIMEOUT", "2.5", 1);
  EXPECT_EQ(default_collective_timeout_s(), 2.5);
  for (const char* bad : {"x", "0", "-1", "5s", "inf"}) {
    ::setenv("PARITY_COLLECTIVE_TIMEOUT", bad, 1);
    try {
      (void)default_collective_timeout_s();
      ADD_FAILURE() << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("PARITY_COLLECTIVE_TIMEOUT='"), std::string::npos);
    }
  }
  ::unsetenv("PARITY_COLLECTIVE_TIMEOUT");
}

TEST(MpiCommunicator, RefusedByNameWithoutMpi) {
  if (mpi_available()) GTEST_SKIP() << "this build has the MPI engine (ctest dist.mpi_* runs it)";
  try {
    (void)make_mpi_communicator();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no MPI engine"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace parity
