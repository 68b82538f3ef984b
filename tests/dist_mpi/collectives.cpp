// The MPI engine's collectives under mpirun (ctest dist.mpi_collectives_np2, _np4): every rank
// fills its buffers from its rank, runs each collective and checks the result against what it
// can work out alone. The values are small integers, exact in fp32 in any order, and then a
// float sum whose bits must agree on every rank (the engine adds in rank order). Exit 0 when
// every check holds on every rank.
#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "parity/dist.h"

namespace {

int failures = 0;

void expect(bool ok, const std::string& what, int rank) {
  if (ok) return;
  ++failures;
  fmt::print(stderr, "rank {}: {}\n", rank, what);
}

}  // namespace

int main() {
  using namespace parity;
  try {
    const ProcessGroupInfo g = detect_process_group();
    const auto c = make_mpi_communicator(&g);
    const int P = c->size(), me = c->rank();
    expect(g.launcher == Launcher::mpirun && g.world == P && g.rank == me,
           "the environment describes this rank", me);

    // all_reduce_sum, over sizes that do and do not divide by the rank count.
    for (const std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
      std::vector<float> v(n);
      std::vector<double> w(n);
      for (std::size_t i = 0; i < n; ++i) {
        v[i] = static_cast<float>((me + 1) * 1000 + static_cast<int>(i));
        w[i] = static_cast<double>(v[i]) * 0.5;
      }
      c->all_reduce_sum(v);
      c->all_reduce_sum(w);
      for (std::size_t i = 0; i < n; ++i) {
        const double want = 1000.0 * P * (P + 1) / 2 + static_cast<double>(P) * i;
        expect(v[i] == static_cast<float>(want),
               fmt::format("all_reduce_sum(float)[{}] of {}", i, n), me);
        expect(w[i] == 0.5 * want, fmt::format("all_reduce_sum(double)[{}] of {}", i, n), me);
      }
    }
    // Inexact sums: every rank holds the same bits (rank 0's are broadcast by an all-gather).
    {
      std::vector<float> v(513);
      for (std::size_t i = 0; i < v.size(); ++i)
        v[i] = 1.0f / static_cast<float>(3 + me + static_cast<int>(i));
      c->all_reduce_sum(v);
      std::vector<std::byte> all(v.size() * sizeof(float) * static_cast<std::size_t>(P));
      c->all_gather(std::as_bytes(std::span<const float>(v)), all);
      for (int r = 1; r < P; ++r)
        expect(std::memcmp(all.data(), all.data() + r * v.size() * sizeof(float),
                           v.size() * sizeof(float)) == 0,
               fmt::format("rank {}'s sum has the bits of rank 0's", r), me);
    }
    // reduce_scatter_sum: block r of rank q holds q + r + i.
    {
      const std::size_t m = 5;
      std::vector<float> send(m * static_cast<std::size_t>(P)), recv(m, -1.0f);
      for (int r = 0; r < P; ++r)
        for (std::size_t i = 0; i < m; ++i)
          send[static_cast<std::size_t>(r) * m + i] =
              static_cast<float>(me + r + static_cast<int>(i));
      c->reduce_scatter_sum(send, recv);
      for (std::size_t i = 0; i < m; ++i) {
        const double want = P * (P - 1) / 2.0 + static_cast<double>(P) * (me + static_cast<int>(i));
        expect(recv[i] == static_cast<float>(want), fmt::format("reduce_scatter_sum[{}]", i), me);
      }
    }
    // all_to_all_v: rank q sends rank r (q + r) % 3 + 1 bytes, each of value 16 q + r.
    {
      auto bytes = [](int from, int to) { return static_cast<std::int64_t>((from + to) % 3 + 1); };
      std::vector<std::int64_t> sb(static_cast<std::size_t>(P)), rb(static_cast<std::size_t>(P));
      std::vector<std::byte> send, recv;
      for (int r = 0; r < P; ++r) {
        sb[static_cast<std::size_t>(r)] = bytes(me, r);
        rb[static_cast<std::size_t>(r)] = bytes(r, me);
        for (std::int64_t k = 0; k < bytes(me, r); ++k)
          send.push_back(static_cast<std::byte>(16 * me + r));
      }
      std::int64_t total = 0;
      for (const std::int64_t n : rb) total += n;
      recv.assign(static_cast<std::size_t>(total), std::byte{0xff});
      c->all_to_all_v(send, sb, recv, rb);
      std::size_t at = 0;
      for (int r = 0; r < P; ++r)
        for (std::int64_t k = 0; k < bytes(r, me); ++k, ++at)
          expect(recv[at] == static_cast<std::byte>(16 * r + me),
                 fmt::format("all_to_all_v byte {} from rank {}", k, r), me);
      // Sizes that do not add up are refused by name.
      bool refused = false;
      try {
        std::vector<std::int64_t> wrong = sb;
        wrong[0] += 1;
        c->all_to_all_v(send, wrong, recv, rb);
      } catch (const Error& e) {
        refused = std::string(e.what()).find("the send blocks add to") != std::string::npos;
      }
      expect(refused, "all_to_all_v refuses send sizes that do not add up to the buffer", me);
    }
    c->barrier();
  } catch (const std::exception& e) {
    fmt::print(stderr, "dist_mpi_check: {}\n", e.what());
    return 2;
  }
  if (failures == 0) fmt::print("dist_mpi_check: every collective checked\n");
  return failures == 0 ? 0 : 1;
}
