#include "backends.h"

#include <utility>

#include "parity/error.h"

namespace parity::testing {
namespace {

// Each backend this build has, with why it cannot run here ("" where it can).
const std::vector<std::pair<std::string, std::string>>& built() {
  static const std::vector<std::pair<std::string, std::string>> list = [] {
    std::vector<std::pair<std::string, std::string>> out{{"cpu", ""}};
    for (const char* name : {"cuda", "hip"}) {
      try {
        (void)make_backend(name);
        out.emplace_back(name, detect_gpu().empty() ? "detect_gpu() finds no GPU" : "");
      } catch (const InputError&) {
        // Not built.
      } catch (const Error& e) {
        out.emplace_back(name, e.what());  // built, but no usable GPU here
      }
    }
    return out;
  }();
  return list;
}

}  // namespace

const std::vector<std::string>& engine_backends() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& [name, why] : built()) out.push_back(name);
    return out;
  }();
  return names;
}

const std::string& unusable_reason(const std::string& name) {
  for (const auto& [n, why] : built())
    if (n == name) return why;
  static const std::string unknown = "not built";
  return unknown;
}

std::vector<std::uint8_t> host_bytes(Backend& backend, const TensorRef& t) {
  std::vector<std::uint8_t> out(t.bytes());
  backend.copy_to_host(out.data(), t.data, out.size());
  return out;
}

}  // namespace parity::testing
