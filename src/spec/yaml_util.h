// Reading validated values out of a yaml-cpp tree with error messages that name
// the file, the line and column, the field path and what was expected.
//
// Why a layer of our own: yaml-cpp's `as<T>()` throws BadConversion with a
// message that names neither the file nor the field, accepts surprising input
// ("1.5" as an int truncates on some paths, "yes" as a bool) and `node[key]` on
// a non-const node silently inserts. Here every read goes through a Field, which
// knows its path ("tables[3].rows") and its document's origin, and every map
// goes through a MapView, which rejects unknown and duplicate keys up front
// (suggesting the closest known key) so a typo never passes as a default.
//
// Internal to the thinking half (src/spec, and src/perf for calibration files); not part of the
// public interface.
#pragma once

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "parity/error.h"
#include "parity/spec.h"

namespace parity::spec_yaml {

// "origin:line:col" (1-based) for a mark; just "origin" where the mark is unknown.
std::string location(const std::string& origin, const YAML::Mark& mark);

// How a node looks in a message: 'text' for a scalar, "a map", "a list", "nothing".
std::string describe(const YAML::Node& node);

// Edit distance with adjacent transpositions counted as one edit.
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to word, if it is close enough to be a likely typo.
std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string_view>& candidates);

// " (did you mean 'x'?)" or "" when nothing is close.
std::string did_you_mean(std::string_view word, const std::vector<std::string_view>& candidates);

// "a, b or c".
std::string join_or(const std::vector<std::string_view>& words);

// Reads a whole file; throws InputError "cannot read <what> '<path>': <reason>".
// Specs are a few kilobytes; a file far larger is not one (a wrong path to a data file).
inline constexpr std::size_t kMaxSpecBytes = std::size_t{16} << 20;
std::string read_text_file(const std::filesystem::path& file, std::string_view what);

// Parses text holding exactly one YAML document whose top level is a map.
// YAML syntax errors become InputError "origin:line:col: YAML syntax error: ...".
// what names the document in messages ("model spec").
YAML::Node parse_document(std::string_view text, const std::string& origin, std::string_view what);

// A spec (`what`: "model spec", "device spec") read from YAML text by parse(root, origin). Every
// read goes through Field, so yaml-cpp's own exceptions are not expected; should one escape, it
// still becomes an InputError naming the place.
template <class Parse>
auto parse_spec(std::string_view text, const std::string& origin, std::string_view what,
                Parse parse) {
  const YAML::Node root = parse_document(text, origin, what);
  try {
    return parse(root, origin);
  } catch (const YAML::Exception& e) {
    throw InputError(fmt::format("{}: cannot read {}: {}", location(origin, e.mark), what, e.msg));
  }
}

class MapView;

// One node of the document together with its path and origin.
class Field {
 public:
  Field(YAML::Node node, std::string path, const std::string* origin)
      : node_(std::move(node)), path_(std::move(path)), origin_(origin) {}

  const YAML::Node& node() const { return node_; }
  const std::string& path() const { return path_; }
  const std::string& origin() const { return *origin_; }
  YAML::Mark mark() const { return node_.Mark(); }
  int line() const { return node_.Mark().line + 1; }
  std::string where() const { return location(*origin_, node_.Mark()); }

  // Throws InputError "origin:line:col: field 'path': message".
  [[noreturn]] void fail(std::string_view message) const;
  // Throws "... field 'path': expected <expected>, got <what is there>".
  [[noreturn]] void fail_expected(std::string_view expected) const;

  // A scalar as text (quoted or not).
  std::string as_string() const;
  // A scalar that is not empty after trimming.
  std::string as_nonempty_string(std::string_view expected) const;
  // An integer in [lo, hi]. Accepts 42, +42 and integral numbers written with
  // an exponent (4e7); rejects 1.5, 0x10 and anything out of range. expected
  // describes the range for the message ("a positive integer").
  std::int64_t as_int(std::int64_t lo, std::int64_t hi, std::string_view expected) const;
  // A finite number.
  double as_number(std::string_view expected) const;
  // true/false (any case) or yes/no.
  bool as_bool() const;
  // A scalar equal to one of the names of an enum's name table (spec.h); the message lists
  // them and suggests the closest.
  template <class T, std::size_t N>
  T as_choice(const NamedValue<T> (&choices)[N]) const;
  // A list; each element's path is path[i].
  std::vector<Field> as_list(std::string_view expected) const;
  // A map with only the given keys; see MapView.
  MapView as_map(std::vector<std::string_view> known, std::string_view expected) const;

 private:
  YAML::Node node_;
  std::string path_;
  const std::string* origin_;
};

// A map node whose keys have been checked: every key is a plain scalar, none is
// repeated and each is one of the known ones (or the error suggests the closest).
class MapView {
 public:
  MapView(const Field& self, std::vector<std::string_view> known, std::string_view expected);

  const Field& self() const { return self_; }
  bool has(std::string_view key) const;
  // The value under key, or nullopt when absent.
  std::optional<Field> get(std::string_view key) const;
  // The value under key; when absent throws
  // "origin:line:col: missing field 'path.key' (hint)" at the map's position.
  Field require(std::string_view key, std::string_view hint) const;
  // Throws the missing-field error for key (for fields required only in some cases).
  [[noreturn]] void fail_missing(std::string_view key, std::string_view hint) const;
  // Path of a child: "key" at the top level, "parent.key" below.
  std::string child_path(std::string_view key) const;

 private:
  Field self_;
  std::vector<std::pair<std::string, Field>> entries_;
};

template <class T, std::size_t N>
T Field::as_choice(const NamedValue<T> (&choices)[N]) const {
  std::vector<std::string_view> names;
  for (const auto& c : choices) names.push_back(c.name);
  if (node_.IsScalar()) {
    const std::string text = node_.Scalar();
    for (const auto& c : choices)
      if (c.name == text) return c.value;
    fail(fmt::format("expected {}, got '{}'{}",
                     names.size() == 1 ? std::string(names[0]) : "one of " + join_or(names), text,
                     did_you_mean(text, names)));
  }
  fail_expected("one of " + join_or(names));
}

}  // namespace parity::spec_yaml
