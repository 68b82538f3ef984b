// Reading JSON input files field by field, so that an edited plan or calibration gets a
// message naming the file and the field that is wrong ("plan.json: field 'tables[3].dtype':
// expected one of ..."), never a crash or a silently ignored typo.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "parity/error.h"

namespace parity {

// A view of one field: path_ is where it is ("tables[3].dtype"), origin_ the file.
class JsonReader {
 public:
  JsonReader(const nlohmann::json& j, std::string path, const std::string& origin)
      : j_(j), path_(std::move(path)), origin_(origin) {}
  [[noreturn]] void fail(const std::string& msg) const {
    throw InputError(fmt::format("{}: field '{}': {}", origin_, path_, msg));
  }
  JsonReader at(const std::string& key) const {
    if (!j_.is_object()) fail("expected an object");
    const std::string path = path_.empty() ? key : fmt::format("{}.{}", path_, key);
    if (!j_.contains(key)) JsonReader(j_, path, origin_).fail("missing");
    return JsonReader(j_.at(key), path, origin_);
  }
  bool has(const std::string& key) const { return j_.is_object() && j_.contains(key); }
  // Refuses fields other than `known`: a misspelt one would otherwise be ignored without a word.
  const JsonReader& only(std::initializer_list<std::string_view> known) const {
    if (!j_.is_object()) fail("expected an object");
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (std::find(known.begin(), known.end(), it.key()) == known.end())
        JsonReader(*it, path_.empty() ? it.key() : fmt::format("{}.{}", path_, it.key()), origin_)
            .fail(fmt::format("unknown field (expected one of {})", fmt::join(known, ", ")));
    return *this;
  }
  JsonReader at(std::size_t i) const {
    return JsonReader(j_.at(i), fmt::format("{}[{}]", path_, i), origin_);
  }
  std::size_t size() const {
    if (!j_.is_array()) fail("expected a list");
    return j_.size();
  }
  std::string str() const {
    if (!j_.is_string()) fail("expected a string");
    return j_.get<std::string>();
  }
  std::int64_t integer(std::int64_t lo, std::int64_t hi) const {
    if (!j_.is_number_integer()) fail("expected an integer");
    const auto v = j_.get<std::int64_t>();
    if (v < lo || v > hi) fail(fmt::format("expected an integer in [{}, {}], got {}", lo, hi, v));
    return v;
  }
  bool boolean() const {
    if (!j_.is_boolean()) fail("expected true or false");
    return j_.get<bool>();
  }
  double number() const {
    if (!j_.is_number()) fail("expected a number");
    const double v = j_.get<double>();
    if (!std::isfinite(v) || v < 0) fail(fmt::format("expected a finite number >= 0, got {}", v));
    return v;
  }
  // One of the values of an enum's name table ({name, value} entries, as spec.h's), those
  // `allowed` accepts.
  template <class Entry, std::size_t N, class E = decltype(Entry::value)>
  E choice(const Entry (&options)[N], bool (*allowed)(E) = nullptr) const {
    const std::string s = str();
    std::vector<std::string_view> names;
    for (const auto& o : options) {
      if (allowed && !allowed(o.value)) continue;
      if (s == o.name) return o.value;
      names.push_back(o.name);
    }
    fail(fmt::format("expected one of {}, got '{}'", fmt::join(names, ", "), s));
  }

 private:
  const nlohmann::json& j_;
  std::string path_;
  const std::string& origin_;
};

}  // namespace parity
