// Reading the small files a user names (specs, plans, dataset descriptions): refused unless they
// are regular files, because opening a FIFO blocks until a writer comes and a device such as
// /dev/zero never ends; bounded in size, so that a wrong path cannot fill the memory.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace parity {

// Throws InputError "cannot read <what> '<path>': <why>" unless path names a regular file (after
// symbolic links): no such file, a directory, a FIFO, a device, a socket.
void require_regular_file(const std::filesystem::path& path, std::string_view what);

// The whole file, checked as above and refused when larger than max_bytes.
std::string read_input_file(const std::filesystem::path& path, std::string_view what,
                            std::size_t max_bytes);

}  // namespace parity
