#include "spec/yaml_util.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <system_error>

#include <fmt/format.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>

#include "core/input_file.h"
#include "parity/error.h"

namespace parity::spec_yaml {
namespace {

std::string trim(std::string_view s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Scalars longer than this are shortened in messages.
constexpr std::size_t kMaxShownScalar = 60;

std::string shown(const std::string& text) {
  if (text.size() <= kMaxShownScalar) return text;
  return text.substr(0, kMaxShownScalar) + "...";
}

// Parses the whole of text as a double (std::from_chars rejects a leading '+').
std::optional<double> parse_double(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.empty()) return std::nullopt;
  double value = 0.0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// The mark of each document's top node (where LoadAll's node would say it is).
class DocumentMarks final : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> marks;
  void OnDocumentStart(const YAML::Mark&) override { top_ = true; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t) override { node(m); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { node(m); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                const std::string&) override {
    node(m);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    node(m);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    node(m);
  }
  void OnMapEnd() override {}

 private:
  bool top_ = false;
  void node(const YAML::Mark& m) {
    if (top_) marks.push_back(m);
    top_ = false;
  }
};

}  // namespace

std::string location(const std::string& origin, const YAML::Mark& mark) {
  if (mark.is_null() || mark.line < 0 || mark.column < 0) return origin;
  return fmt::format("{}:{}:{}", origin, mark.line + 1, mark.column + 1);
}

std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return fmt::format("'{}'", shown(node.Scalar()));
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing";
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  // Optimal string alignment distance, three rolling rows.
  const std::size_t n = b.size();
  std::vector<std::size_t> prev2(n + 1), prev(n + 1), cur(n + 1);
  for (std::size_t j = 0; j <= n; ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= n; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        cur[j] = std::min(cur[j], prev2[j - 2] + 1);
    }
    std::swap(prev2, prev);
    std::swap(prev, cur);
  }
  return prev[n];
}

std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string_view>& candidates) {
  const std::string w = lower(word);
  std::optional<std::string> best;
  std::size_t best_distance = 0;
  for (std::string_view c : candidates) {
    const std::size_t d = edit_distance(w, lower(c));
    // Close enough to be a typo: one edit in a short word, else two edits or a
    // third of the longer word.
    const std::size_t longer = std::max(w.size(), c.size());
    const std::size_t limit = longer <= 4 ? 1 : std::max<std::size_t>(2, longer / 3);
    if (d <= limit && (!best || d < best_distance)) {
      best = std::string(c);
      best_distance = d;
    }
  }
  // One word a prefix of the other ("hbm" for "hbm_bytes", "dimension" for "dim")
  // is also a likely slip.
  if (!best && w.size() >= 3) {
    for (std::string_view c : candidates) {
      const std::string lc = lower(c);
      if (lc.size() >= 3 && (lc.rfind(w, 0) == 0 || w.rfind(lc, 0) == 0)) return std::string(c);
    }
  }
  return best;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string_view>& candidates) {
  const auto match = closest_match(word, candidates);
  if (!match || *match == word) return "";
  return fmt::format(" (did you mean '{}'?)", *match);
}

std::string join_or(const std::vector<std::string_view>& words) {
  std::string out;
  for (std::size_t i = 0; i < words.size(); ++i) {
    if (i > 0) out += i + 1 == words.size() ? " or " : ", ";
    out += words[i];
  }
  return out;
}

std::string read_text_file(const std::filesystem::path& file, std::string_view what) {
  return read_input_file(file, what, kMaxSpecBytes);
}

YAML::Node parse_document(std::string_view text, const std::string& origin, std::string_view what) {
  const std::string yaml(text);
  std::vector<YAML::Node> docs;
  DocumentMarks starts;
  try {
    // yaml-cpp 0.7's LoadAll never returns on a document that starts with ',' (it makes empty
    // documents without consuming the token until memory runs out), so documents are counted
    // first, up to a second one, and loaded only when there is one at most.
    std::istringstream in(yaml);
    YAML::Parser parser(in);
    while (starts.marks.size() < 2 && parser.HandleNextDocument(starts)) {
    }
    if (starts.marks.size() < 2) docs = YAML::LoadAll(yaml);
  } catch (const YAML::DeepRecursion& e) {
    throw InputError(fmt::format(
        "{}: YAML nested {} levels deep, deeper than the parser allows; a {} needs a few levels",
        location(origin, e.mark), e.depth(), what));
  } catch (const YAML::ParserException& e) {
    throw InputError(fmt::format("{}: YAML syntax error: {}", location(origin, e.mark), e.msg));
  } catch (const YAML::Exception& e) {
    throw InputError(fmt::format("{}: cannot parse YAML: {}", location(origin, e.mark), e.msg));
  }
  if (starts.marks.size() > 1)
    throw InputError(fmt::format(
        "{}: expected one YAML document in the {}, found a second one here (remove the '---')",
        location(origin, starts.marks[1]), what));
  if (docs.empty() || docs[0].IsNull())
    throw InputError(fmt::format(
        "{}: the {} is empty (expected a map of fields; see docs/configs.md)", origin, what));
  if (!docs[0].IsMap())
    throw InputError(fmt::format("{}: expected a map of {} fields at the top level, got {}",
                                 location(origin, docs[0].Mark()), what, describe(docs[0])));
  return docs[0];
}

// ---------------------------------------------------------------- Field ----

void Field::fail(std::string_view message) const {
  throw InputError(path_.empty() ? fmt::format("{}: {}", where(), message)
                                 : fmt::format("{}: field '{}': {}", where(), path_, message));
}

void Field::fail_expected(std::string_view expected) const {
  fail(fmt::format("expected {}, got {}", expected, describe(node_)));
}

std::string Field::as_string() const {
  if (!node_.IsScalar()) fail_expected("a string");
  return node_.Scalar();
}

std::string Field::as_nonempty_string(std::string_view expected) const {
  if (!node_.IsScalar() || trim(node_.Scalar()).empty()) fail_expected(expected);
  return node_.Scalar();
}

std::int64_t Field::as_int(std::int64_t lo, std::int64_t hi, std::string_view expected) const {
  if (!node_.IsScalar()) fail_expected(expected);
  const std::string text = trim(node_.Scalar());
  std::string_view digits = text;
  if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  const bool whole_text = !digits.empty() && end == digits.data() + digits.size();
  if (whole_text && ec == std::errc()) {
    if (value < lo || value > hi) fail_expected(expected);
    return value;
  }
  if (whole_text && ec == std::errc::result_out_of_range) fail_expected(expected);
  // 4e7 or 4.0e7: accept when the number is a whole one, exactly representable.
  const auto d = parse_double(text);
  if (!d || !std::isfinite(*d) || std::trunc(*d) != *d || std::fabs(*d) > 9007199254740992.0)
    fail_expected(expected);
  value = static_cast<std::int64_t>(*d);
  if (value < lo || value > hi) fail_expected(expected);
  return value;
}

double Field::as_number(std::string_view expected) const {
  if (!node_.IsScalar()) fail_expected(expected);
  const auto d = parse_double(trim(node_.Scalar()));
  if (!d || !std::isfinite(*d)) fail_expected(expected);
  return *d;
}

bool Field::as_bool() const {
  if (node_.IsScalar()) {
    const std::string text = lower(trim(node_.Scalar()));
    if (text == "true" || text == "yes") return true;
    if (text == "false" || text == "no") return false;
  }
  fail_expected("true or false");
}

std::vector<Field> Field::as_list(std::string_view expected) const {
  if (!node_.IsSequence()) fail_expected(expected);
  std::vector<Field> out;
  out.reserve(node_.size());
  std::size_t i = 0;
  for (auto it = node_.begin(); it != node_.end(); ++it, ++i)
    out.emplace_back(*it, fmt::format("{}[{}]", path_, i), origin_);
  return out;
}

MapView Field::as_map(std::vector<std::string_view> known, std::string_view expected) const {
  return MapView(*this, std::move(known), expected);
}

// -------------------------------------------------------------- MapView ----

MapView::MapView(const Field& self, std::vector<std::string_view> known, std::string_view expected)
    : self_(self) {
  if (!self.node().IsMap()) self.fail_expected(expected);
  const std::string in = self.path().empty() ? "" : fmt::format(" in '{}'", self.path());
  for (auto it = self.node().begin(); it != self.node().end(); ++it) {
    const YAML::Node key = it->first;  // a copy: it-> yields a temporary
    const std::string key_where = location(self.origin(), key.Mark());
    if (!key.IsScalar())
      throw InputError(
          fmt::format("{}: expected a field name{}, got {}", key_where, in, describe(key)));
    const std::string name = key.Scalar();
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string hint = did_you_mean(name, known);
      if (hint.empty()) hint = fmt::format(" (expected one of {})", join_or(known));
      throw InputError(fmt::format("{}: unknown field '{}'{}{}", key_where, shown(name), in, hint));
    }
    for (const auto& [seen, field] : entries_)
      if (seen == name)
        throw InputError(fmt::format("{}: duplicate field '{}'{} (first given at line {})",
                                     key_where, name, in, field.line()));
    entries_.emplace_back(name, Field(it->second, child_path(name), &self.origin()));
  }
}

bool MapView::has(std::string_view key) const {
  return get(key).has_value();
}

std::optional<Field> MapView::get(std::string_view key) const {
  for (const auto& [name, field] : entries_)
    if (name == key) return field;
  return std::nullopt;
}

Field MapView::require(std::string_view key, std::string_view hint) const {
  if (auto f = get(key)) return *f;
  fail_missing(key, hint);
}

void MapView::fail_missing(std::string_view key, std::string_view hint) const {
  throw InputError(
      hint.empty()
          ? fmt::format("{}: missing field '{}'", self_.where(), child_path(key))
          : fmt::format("{}: missing field '{}' ({})", self_.where(), child_path(key), hint));
}

std::string MapView::child_path(std::string_view key) const {
  return self_.path().empty() ? std::string(key) : fmt::format("{}.{}", self_.path(), key);
}

}  // namespace parity::spec_yaml
