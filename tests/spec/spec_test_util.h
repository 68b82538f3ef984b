// Helpers shared by the spec tests.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>

#include "parity/error.h"

namespace parity::testing {

inline std::filesystem::path source_dir() {
  return PARITY_SOURCE_DIR;
}
inline std::filesystem::path model_dir() {
  return source_dir() / "configs" / "models";
}
inline std::filesystem::path device_dir() {
  return source_dir() / "configs" / "devices";
}

// The message of the InputError that f throws; a test failure if it throws
// nothing or anything else.
inline std::string input_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected parity::InputError, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected parity::InputError, nothing was thrown";
  return "";
}

// text with the first occurrence of from replaced by to; from must occur.
inline std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "test setup: '" << from << "' not in the base text";
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

}  // namespace parity::testing

#define EXPECT_CONTAINS(haystack, needle)                          \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "expected to find \"" << (needle) << "\" in:\n  " << (haystack)
