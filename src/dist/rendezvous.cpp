// The TCP rendezvous of rendezvous.h. Rank 0 keeps every connection open until all ranks have
// met, then sends the payload to each: so the call is also a barrier, and a rank that returns
// knows every other rank reached the same point.
#include "dist/rendezvous.h"

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

namespace parity {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint32_t kMagic = 0x59545250;  // "PRTY"
constexpr std::uint64_t kMaxPayload = 1 << 20;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

struct Meeting {
  const ProcessGroupInfo& g;
  Clock::time_point deadline;
  std::string where() const {
    return fmt::format("rendezvous of {} ranks at {}:{} (MASTER_ADDR, MASTER_PORT), rank {}",
                       g.world, g.master_addr, g.master_port, g.rank);
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(fmt::format("{}: {}", where(), what));
  }
  int ms_left() const {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return static_cast<int>(std::max<long long>(0, std::min<long long>(left, 1 << 30)));
  }
  // Waits until fd is ready for `events`, or fails when the time is up.
  void wait(int fd, short events, const char* doing) const {
    for (;;) {
      pollfd p{fd, events, 0};
      const int n = ::poll(&p, 1, ms_left());
      if (n > 0) return;
      if (n == 0)
        fail(fmt::format("timed out {} (the other ranks did not all arrive in time)", doing));
      if (errno != EINTR) fail(fmt::format("{}: {}", doing, std::strerror(errno)));
    }
  }
  void send_all(int fd, const void* data, std::size_t n, const char* doing) const {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      wait(fd, POLLOUT, doing);
      const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
      if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (k <= 0) fail(fmt::format("{}: {}", doing, std::strerror(errno)));
      p += k;
      n -= static_cast<std::size_t>(k);
    }
  }
  void recv_all(int fd, void* data, std::size_t n, const char* doing) const {
    auto* p = static_cast<char*>(data);
    while (n > 0) {
      wait(fd, POLLIN, doing);
      const ssize_t k = ::recv(fd, p, n, 0);
      if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (k == 0) fail(fmt::format("{}: the other side closed the connection", doing));
      if (k < 0) fail(fmt::format("{}: {}", doing, std::strerror(errno)));
      p += k;
      n -= static_cast<std::size_t>(k);
    }
  }
};

struct Hello {
  std::uint32_t magic, rank, world, pad;
};

std::vector<std::byte> serve(const Meeting& m, std::span<const std::byte> payload) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(m.g.master_port);
  if (const int e = ::getaddrinfo(nullptr, port.c_str(), &hints, &found); e != 0)
    m.fail(fmt::format("cannot listen on port {}: {}", port, ::gai_strerror(e)));
  Fd listener;
  std::string why = "no address to listen on";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (s.get() < 0) continue;
    const int one = 1;
    ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(s.get(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(s.get(), 128) == 0) {
      listener = std::move(s);
      break;
    }
    why = std::strerror(errno);
  }
  ::freeaddrinfo(found);
  if (listener.get() < 0)
    m.fail(fmt::format("cannot listen on port {}: {} (is it in use? pick a free MASTER_PORT)", port,
                       why));

  std::vector<Fd> ranks(static_cast<std::size_t>(m.g.world));
  for (int met = 1; met < m.g.world;) {
    m.wait(listener.get(), POLLIN, "waiting for the other ranks to connect");
    Fd c(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (c.get() < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      m.fail(fmt::format("accepting a rank: {}", std::strerror(errno)));
    }
    // A connection that is not a rank (a port scanner, a probe) is dropped, not waited for.
    Hello h{};
    try {
      const Meeting greeting{m.g, std::min(m.deadline, Clock::now() + std::chrono::seconds(5))};
      greeting.recv_all(c.get(), &h, sizeof h, "reading a rank's greeting");
    } catch (const Error&) {
      continue;
    }
    if (h.magic != kMagic) continue;
    if (h.world != static_cast<std::uint32_t>(m.g.world) || h.rank == 0 ||
        h.rank >= static_cast<std::uint32_t>(m.g.world) || ranks[h.rank].get() >= 0)
      m.fail(
          fmt::format("a rank says it is rank {} of {}: expected each of ranks 1 to {} of {} "
                      "once (is another run using this port? give each run its own "
                      "MASTER_PORT)",
                      h.rank, h.world, m.g.world - 1, m.g.world));
    ranks[h.rank] = std::move(c);
    ++met;
  }
  const std::uint64_t n = payload.size();
  for (int r = 1; r < m.g.world; ++r) {
    m.send_all(ranks[static_cast<std::size_t>(r)].get(), &n, sizeof n, "sending to a rank");
    m.send_all(ranks[static_cast<std::size_t>(r)].get(), payload.data(), payload.size(),
               "sending to a rank");
  }
  return {payload.begin(), payload.end()};
}

// Whether the non-blocking socket s connects to a within the time left (why: the reason if not).
bool connected(int s, const addrinfo* a, const Meeting& m, std::string& why) {
  if (::connect(s, a->ai_addr, a->ai_addrlen) == 0) return true;
  if (errno != EINPROGRESS) {
    why = std::strerror(errno);
    return false;
  }
  pollfd p{s, POLLOUT, 0};
  if (::poll(&p, 1, m.ms_left()) <= 0) {
    why = "no answer";
    return false;
  }
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) why = std::strerror(err);
  return err == 0;
}

std::vector<std::byte> join(const Meeting& m) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string port = std::to_string(m.g.master_port);
  std::string why;
  for (;;) {
    addrinfo* found = nullptr;
    const int e = ::getaddrinfo(m.g.master_addr.c_str(), port.c_str(), &hints, &found);
    if (e == 0) {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        // Non-blocking, so that an address that drops packets costs the time left, not the
        // kernel's connect time-out.
        Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
        if (s.get() < 0) continue;
        if (!connected(s.get(), a, m, why)) continue;
        ::freeaddrinfo(found);
        const int one = 1;
        ::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        const Hello h{kMagic, static_cast<std::uint32_t>(m.g.rank),
                      static_cast<std::uint32_t>(m.g.world), 0};
        m.send_all(s.get(), &h, sizeof h, "greeting rank 0");
        std::uint64_t n = 0;
        m.recv_all(s.get(), &n, sizeof n, "waiting for rank 0 and the other ranks");
        if (n > kMaxPayload) m.fail(fmt::format("rank 0 announced {} bytes", n));
        std::vector<std::byte> out(static_cast<std::size_t>(n));
        m.recv_all(s.get(), out.data(), out.size(), "receiving from rank 0");
        return out;
      }
      ::freeaddrinfo(found);
    } else {
      why = ::gai_strerror(e);
    }
    // Rank 0 may not listen yet: try again until the time is up.
    if (m.ms_left() == 0) m.fail(fmt::format("cannot reach rank 0: {}", why));
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, m.ms_left())));
  }
}

}  // namespace

std::vector<std::byte> rendezvous_broadcast(const ProcessGroupInfo& g,
                                            std::span<const std::byte> payload, double timeout_s) {
  if (g.world <= 1) return {payload.begin(), payload.end()};
  if (payload.size() > kMaxPayload)
    throw Error(
        fmt::format("rendezvous_broadcast: {} bytes, at most {}", payload.size(), kMaxPayload));
  if (g.master_port <= 0 || g.master_port > 65535 || (g.rank != 0 && g.master_addr.empty()))
    throw InputError(
        fmt::format("rank {} of {}: a run over several processes without MPI needs MASTER_ADDR and "
                    "MASTER_PORT (the address and port where rank 0 listens), got '{}' and {}",
                    g.rank, g.world, g.master_addr, g.master_port));
  const Meeting m{g, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(timeout_s))};
  return g.rank == 0 ? serve(m, payload) : join(m);
}

}  // namespace parity
