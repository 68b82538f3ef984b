#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include "parity/error.h"

namespace parity {

AtomicFile::AtomicFile(std::filesystem::path path, std::string what)
    : path_(std::move(path)), tmp_(path_.string() + ".tmp"), what_(std::move(what)) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw Error(
        fmt::format("cannot create {} '{}': {}", what_, tmp_.string(), std::strerror(errno)));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  std::error_code ec;
  std::filesystem::remove(tmp_, ec);  // after commit() it no longer exists
}

void AtomicFile::fail(const std::string& doing) {
  const std::string why = std::strerror(errno);
  throw Error(fmt::format("cannot {} {} '{}': {}", doing, what_, tmp_.string(), why));
}

void AtomicFile::write(const void* data, std::size_t bytes) {
  const char* c = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t w = ::write(fd_, c, std::min<std::size_t>(bytes, std::size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("write");
    }
    c += w;
    bytes -= static_cast<std::size_t>(w);
  }
}

void AtomicFile::write_at(std::size_t offset, const void* data, std::size_t bytes) {
  const char* c = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t w = ::pwrite(fd_, c, std::min<std::size_t>(bytes, std::size_t{1} << 30),
                               static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("write");
    }
    c += w;
    offset += static_cast<std::size_t>(w);
    bytes -= static_cast<std::size_t>(w);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail("sync");
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) fail("close");
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    throw Error(fmt::format("cannot rename '{}' to '{}': {}", tmp_.string(), path_.string(), why));
  }
  const std::filesystem::path dir = path_.has_parent_path() ? path_.parent_path() : ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);  // make the rename durable
    ::close(dfd);
  }
}

}  // namespace parity
