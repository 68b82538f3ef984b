// The TCP rendezvous (src/dist/rendezvous.h), its ranks as threads of one process: every rank gets
// rank 0's bytes; a rank of another run, one that waits for nobody, and a missing address are
// each refused by name within the time-out.
#include "dist/rendezvous.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace parity {
namespace {

// A port no one listens on now (the kernel's pick for an ephemeral socket).
int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(s);
  return ntohs(a.sin_port);
}

ProcessGroupInfo rank_of(int rank, int world, int port) {
  ProcessGroupInfo g;
  g.launcher = Launcher::torchrun;
  g.rank = rank;
  g.world = world;
  g.master_addr = "127.0.0.1";
  g.master_port = port;
  return g;
}

std::vector<std::byte> bytes_of(const std::string& s) {
  const auto* b = reinterpret_cast<const std::byte*>(s.data());
  return {b, b + s.size()};
}

TEST(Rendezvous, EveryRankGetsRankZerosBytes) {
  const int port = free_port(), world = 4;
  std::vector<std::vector<std::byte>> got(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> ranks;
  // Rank 0 last: the others try again until it listens.
  for (int r = world - 1; r >= 0; --r)
    ranks.emplace_back([&, r] {
      try {
        const auto mine = bytes_of(r == 0 ? "id of rank 0: 0123456789abcdef" : "not this");
        got[static_cast<std::size_t>(r)] = rendezvous_broadcast(rank_of(r, world, port), mine, 20);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
    EXPECT_EQ(got[static_cast<std::size_t>(r)], bytes_of("id of rank 0: 0123456789abcdef"))
        << "rank " << r;
  }
}

TEST(Rendezvous, OneRankNeedsNobody) {
  ProcessGroupInfo g;  // no launcher, no address
  EXPECT_EQ(rendezvous_broadcast(g, bytes_of("x"), 1), bytes_of("x"));
}

TEST(Rendezvous, ARankOfAnotherRunIsRefused) {
  const int port = free_port();
  std::string error0;
  std::thread zero([&] {
    try {
      (void)rendezvous_broadcast(rank_of(0, 2, port), bytes_of("id"), 20);
    } catch (const Error& e) {
      error0 = e.what();
    }
  });
  std::string error1;
  try {
    (void)rendezvous_broadcast(rank_of(1, 3, port), {}, 5);  // thinks the run has 3 ranks
  } catch (const Error& e) {
    error1 = e.what();
  }
  zero.join();
  EXPECT_NE(error0.find("a rank says it is rank 1 of 3: expected each of ranks 1 to 1 of 2 once"),
            std::string::npos)
      << error0;
  EXPECT_NE(error1.find("rank 1"), std::string::npos) << error1;
}

TEST(Rendezvous, NobodyListeningTimesOutNamingTheAddress) {
  const int port = free_port();
  const auto start = std::chrono::steady_clock::now();
  try {
    (void)rendezvous_broadcast(rank_of(1, 2, port), {}, 0.5);
    FAIL() << "met nobody";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(fmt::format("127.0.0.1:{} (MASTER_ADDR, MASTER_PORT)", port)),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("cannot reach rank 0"), std::string::npos) << m;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5);
  // Rank 0 whose ranks never come.
  try {
    (void)rendezvous_broadcast(rank_of(0, 2, port), bytes_of("id"), 0.3);
    FAIL() << "rank 0 returned alone";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("timed out waiting for the other ranks to connect"),
              std::string::npos)
        << e.what();
  }
}

TEST(Rendezvous, NoAddressIsAnInputError) {
  ProcessGroupInfo g = rank_of(1, 2, 0);
  g.master_addr.clear();
  EXPECT_THROW((void)rendezvous_broadcast(g, {}, 1), InputError);
}

}  // namespace
}  // namespace parity
