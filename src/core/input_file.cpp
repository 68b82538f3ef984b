#include "core/input_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "parity/error.h"

namespace parity {
namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "it is a directory";
  if (S_ISFIFO(mode)) return "it is a FIFO (named pipe), not a regular file";
  if (S_ISCHR(mode)) return "it is a character device, not a regular file";
  if (S_ISBLK(mode)) return "it is a block device, not a regular file";
  if (S_ISSOCK(mode)) return "it is a socket, not a regular file";
  return "it is not a regular file";
}

}  // namespace

void require_regular_file(const std::filesystem::path& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw InputError(fmt::format("cannot read {} '{}': {}", what, path.string(),
                                 errno == ENOENT ? "no such file" : std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    throw InputError(
        fmt::format("cannot read {} '{}': {}", what, path.string(), kind_of(st.st_mode)));
}

std::string read_input_file(const std::filesystem::path& path, std::string_view what,
                            std::size_t max_bytes) {
  require_regular_file(path, what);
  const std::string prefix = fmt::format("cannot read {} '{}': ", what, path.string());
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw InputError(prefix + std::strerror(errno));
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw InputError(prefix + why);
    }
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
    if (text.size() > max_bytes) {
      ::close(fd);
      throw InputError(
          fmt::format("{}it is larger than {} bytes, too large for a {}", prefix, max_bytes, what));
    }
  }
  ::close(fd);
  return text;
}

}  // namespace parity
