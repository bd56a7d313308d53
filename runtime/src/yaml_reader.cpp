#include "cocemu/runtime/detail/yaml_reader.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace cocemu::detail {

YamlReader::YamlReader(YAML::Node node, std::string file, std::string path)
    : node_(std::move(node)), file_(std::move(file)), path_(std::move(path)) {
  COCEMU_CHECK(node_.IsMap(), Errc::parse_error, "{}: '{}' must be a mapping of keys to values",
               where(), path_.empty() ? "<top level>" : path_);
}

namespace {

/// Every mapping of the document: duplicate keys are errors (yaml-cpp keeps the first silently),
/// and nesting is bounded.
void check_tree(const YAML::Node& n, const std::string& file, int depth) {
  COCEMU_CHECK(depth <= kMaxYamlDepth, Errc::parse_error,
               "{}:{}: nested more than {} levels deep; configuration files are flat", file,
               n.Mark().line + 1, kMaxYamlDepth);
  if (n.IsMap()) {
    std::set<std::string> seen;
    for (auto it = n.begin(); it != n.end(); ++it) {
      COCEMU_CHECK(it->first.IsScalar(), Errc::parse_error,
                   "{}:{}: a mapping key must be a plain name, not a list or a mapping", file,
                   it->first.Mark().line + 1);
      const std::string key = it->first.Scalar();
      COCEMU_CHECK(seen.insert(key).second, Errc::parse_error,
                   "{}:{}: key '{}' appears twice in one mapping", file, it->first.Mark().line + 1,
                   key.size() > 60 ? key.substr(0, 60) + "..." : key);
      check_tree(it->second, file, depth + 1);
    }
  } else if (n.IsSequence()) {
    for (const auto& item : n)
      check_tree(item, file, depth + 1);
  }
}

/// A walk over the document's parse events before it is loaded, bounding what the tree would
/// make every later pass do: nesting at most kMaxYamlDepth deep (checked on the way down, before
/// yaml-cpp's own recursion limit turns it into "bad file"), and aliases adding at most
/// kMaxYamlAliasNodes nodes in all, each alias counting every node of what it names with that
/// node's own aliases expanded (yaml-cpp shares an aliased node, but every walk over the tree —
/// the checks below, a derived profile's overlay — visits it once per alias: eight levels of
/// nine aliases each are 9^8 = 43 million nodes in a few hundred bytes of text).
class Bounds : public YAML::EventHandler {
 public:
  Bounds(const std::string& file, const std::string& what) : file_(file), what_(what) {}

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override { leaf(mark, anchor); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                const std::string&) override {
    leaf(mark, anchor);
  }
  void OnAnchor(const YAML::Mark&, const std::string& name) override { pending_name_ = name; }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    const auto it = anchors_.find(anchor);
    // An alias of a node still open (its own descendant) counts as one node.
    const std::int64_t nodes = it == anchors_.end() ? 1 : it->second.nodes;
    alias_nodes_ += nodes;
    COCEMU_CHECK(
        alias_nodes_ <= kMaxYamlAliasNodes, Errc::parse_error,
        "{}:{}: {}aliases expand to more than {} nodes (this one, *{}, repeats the {} nodes of "
        "line {}); configuration files are small: write the values out, or alias less",
        file_, mark.line + 1, what_.empty() ? "" : "in the " + what_ + ": ", kMaxYamlAliasNodes,
        it == anchors_.end() ? "?" : it->second.name, nodes,
        it == anchors_.end() ? 0 : it->second.line);
    add(nodes);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    open(mark, anchor);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    open(mark, anchor);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Frame {
    YAML::anchor_t anchor;
    std::string name;
    int line;
    std::int64_t nodes;
  };
  struct Anchored {
    std::string name;
    int line;
    std::int64_t nodes;
  };
  void add(std::int64_t nodes) {
    if (!stack_.empty()) stack_.back().nodes += nodes;
  }
  void leaf(const YAML::Mark& mark, YAML::anchor_t anchor) {
    if (anchor) anchors_[anchor] = {std::exchange(pending_name_, {}), mark.line + 1, 1};
    add(1);
  }
  void open(const YAML::Mark& mark, YAML::anchor_t anchor) {
    COCEMU_CHECK(stack_.size() < std::size_t(kMaxYamlDepth), Errc::parse_error,
                 "{}:{}: {}nested more than {} levels deep; configuration files are flat", file_,
                 mark.line + 1, what_.empty() ? "" : "in the " + what_ + ": ", kMaxYamlDepth);
    stack_.push_back({anchor, anchor ? std::exchange(pending_name_, {}) : "", mark.line + 1, 1});
  }
  void close() {
    const Frame f = stack_.back();
    stack_.pop_back();
    if (f.anchor) anchors_[f.anchor] = {f.name, f.line, f.nodes};
    add(f.nodes);
  }

  const std::string& file_;
  const std::string& what_;
  std::vector<Frame> stack_;
  std::unordered_map<YAML::anchor_t, Anchored> anchors_;
  std::string pending_name_;
  std::int64_t alias_nodes_ = 0;
};

/// yaml-cpp's message for a syntax error, said so a person can act on it.
std::string explain(const YAML::Exception& e, const std::string& text) {
  if (e.msg == YAML::ErrorMsg::MAP_VALUE && !e.mark.is_null()) {
    // The line of the error: a key longer than YAML's 1024-character limit for implicit keys
    // ends up here too.
    std::size_t at = 0;
    for (int l = 0; l < e.mark.line && at != std::string::npos; ++l) {
      at = text.find('\n', at);
      if (at != std::string::npos) ++at;
    }
    if (at != std::string::npos) {
      const std::size_t end = std::min(text.find('\n', at), text.size());
      const std::string_view line(text.data() + at, end - at);
      const std::size_t colon = line.find(": ");
      const std::size_t key = colon == std::string_view::npos ? line.size() : colon;
      if (key > 1024)
        return fmt::format(
            "a key of {} characters; YAML allows at most 1024 in a key on one line (yaml-cpp: "
            "{})",
            key, e.msg);
    }
    return fmt::format(
        "a ':' where no value can start, e.g. 'a: b: c' on one line (quote a value that contains "
        "': ') (yaml-cpp: {})",
        e.msg);
  }
  if (e.msg == YAML::ErrorMsg::BAD_FILE && !e.mark.is_null())
    return fmt::format("nested too deeply for the YAML parser (yaml-cpp: {})", e.msg);
  return e.msg;
}

bool is_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + std::size_t(len) > s.size()) return false;
    for (int k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + std::size_t(k)]) >> 6) != 2) return false;
    i += std::size_t(len);
  }
  return true;
}

}  // namespace

YamlReader YamlReader::parse(const std::string& text, const std::string& file,
                             const std::string& what) {
  const std::string in_what = what.empty() ? "" : "in the " + what + ": ";
  COCEMU_CHECK(text.size() <= (std::size_t(4) << 20), Errc::parse_error,
               "{}: {}{} bytes; configuration files are at most 4 MiB", file, in_what, text.size());
  // One document only. Found by scanning for document markers after content, not with
  // YAML::LoadAll, which can loop on malformed input (found by fuzzing yaml-cpp 0.7).
  {
    bool content = false;
    int line = 0;
    for (std::size_t at = 0; at < text.size(); ++line) {
      const std::size_t end = std::min(text.find('\n', at), text.size());
      const std::string_view l(text.data() + at, end - at);
      const bool marker = (l.substr(0, 3) == "---" || l.substr(0, 3) == "...") &&
                          (l.size() == 3 || l[3] == ' ' || l[3] == '\t' || l[3] == '\r');
      COCEMU_CHECK(!(marker && content), Errc::parse_error,
                   "{}:{}: a second YAML document ('{}'); exactly one is allowed", file, line + 1,
                   l.substr(0, 3));
      const std::size_t first = l.find_first_not_of(" \t\r");
      if (!marker && first != std::string_view::npos && l[first] != '#') content = true;
      at = end + 1;
    }
  }
  YAML::Node root;
  try {
    {
      std::istringstream in(text);
      YAML::Parser parser(in);
      Bounds bounds(file, what);
      parser.HandleNextDocument(bounds);
    }
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    COCEMU_FAIL(Errc::parse_error, "{}:{}:{}: {}YAML syntax error: {}", file, e.mark.line + 1,
                e.mark.column + 1, in_what, explain(e, text));
  }
  COCEMU_CHECK(root.IsMap(), Errc::parse_error,
               "{}: {}the document must be a mapping of keys to values, not {}", file, in_what,
               root.IsNull()       ? "empty"
               : root.IsScalar()   ? "a plain value"
               : root.IsSequence() ? "a list"
                                   : "this");
  check_tree(root, file, 0);
  return YamlReader(root, file, "");
}

std::string YamlReader::where(const YAML::Node& n) const {
  try {  // an invalid node (a lookup that found nothing) has no mark
    const YAML::Mark m = n.Mark();
    if (m.is_null()) return file_;
    return fmt::format("{}:{}", file_, m.line + 1);
  } catch (const YAML::Exception&) {
    return file_;
  }
}

bool YamlReader::has(const std::string& key) const {
  return bool(node_[key]);
}

YAML::Node YamlReader::get(const std::string& key) {
  used_.insert(key);
  YAML::Node n = node_[key];
  COCEMU_CHECK(n, Errc::parse_error, "{}: missing required key '{}{}'", where(),
               path_.empty() ? "" : path_ + ".", key);
  return n;
}

double YamlReader::number(const std::string& key, double min, double max) {
  YAML::Node n = get(key);
  double v = 0;
  bool ok = n.IsScalar();
  if (ok) {
    try {
      v = n.as<double>();
    } catch (const YAML::Exception&) {
      ok = false;
    }
  }
  COCEMU_CHECK(ok && !std::isnan(v), Errc::parse_error, "{}: '{}{}' must be a number, got '{}'",
               where(n), path_.empty() ? "" : path_ + ".", key, n.IsScalar() ? n.Scalar() : "?");
  COCEMU_CHECK(v >= min && v <= max, Errc::parse_error,
               "{}: '{}{}' = {} is out of range; allowed [{}, {}]", where(n),
               path_.empty() ? "" : path_ + ".", key, n.Scalar(), min, max);
  return v;
}

double YamlReader::number_or(const std::string& key, double fallback, double min, double max) {
  if (!has(key)) return fallback;
  return number(key, min, max);
}

std::int64_t YamlReader::integer(const std::string& key, std::int64_t min, std::int64_t max) {
  YAML::Node n = get(key);
  std::int64_t v = 0;
  bool ok = n.IsScalar();
  if (ok) {
    try {
      v = n.as<std::int64_t>();
    } catch (const YAML::Exception&) {
      ok = false;
    }
  }
  COCEMU_CHECK(ok, Errc::parse_error, "{}: '{}{}' must be an integer, got '{}'", where(n),
               path_.empty() ? "" : path_ + ".", key, n.IsScalar() ? n.Scalar() : "?");
  COCEMU_CHECK(v >= min && v <= max, Errc::parse_error,
               "{}: '{}{}' = {} is out of range; allowed [{}, {}]", where(n),
               path_.empty() ? "" : path_ + ".", key, v, min, max);
  return v;
}

bool YamlReader::boolean(const std::string& key) {
  YAML::Node n = get(key);
  bool v = false;
  bool ok = n.IsScalar();
  if (ok) {
    try {
      v = n.as<bool>();
    } catch (const YAML::Exception&) {
      ok = false;
    }
  }
  COCEMU_CHECK(ok, Errc::parse_error, "{}: '{}{}' must be true or false, got '{}'", where(n),
               path_.empty() ? "" : path_ + ".", key, n.IsScalar() ? n.Scalar() : "?");
  return v;
}

bool YamlReader::boolean_or(const std::string& key, bool fallback) {
  return has(key) ? boolean(key) : fallback;
}

std::string YamlReader::string(const std::string& key) {
  YAML::Node n = get(key);
  COCEMU_CHECK(n.IsScalar(), Errc::parse_error, "{}: '{}{}' must be a string", where(n),
               path_.empty() ? "" : path_ + ".", key);
  COCEMU_CHECK(is_utf8(n.Scalar()), Errc::parse_error, "{}: '{}{}' is not valid UTF-8 text",
               where(n), path_.empty() ? "" : path_ + ".", key);
  return n.Scalar();
}

std::string YamlReader::string_or(const std::string& key, const std::string& fallback) {
  return has(key) ? string(key) : fallback;
}

YamlReader YamlReader::map(const std::string& key) {
  YAML::Node n = get(key);
  return YamlReader(n, file_, path_.empty() ? key : path_ + "." + key);
}

std::vector<YamlReader> YamlReader::sequence(const std::string& key) {
  YAML::Node n = get(key);
  COCEMU_CHECK(n.IsSequence(), Errc::parse_error, "{}: '{}{}' must be a list", where(n),
               path_.empty() ? "" : path_ + ".", key);
  std::vector<YamlReader> out;
  for (std::size_t i = 0; i < n.size(); ++i)
    out.emplace_back(n[i], file_,
                     fmt::format("{}{}[{}]", path_.empty() ? "" : path_ + ".", key, i));
  return out;
}

std::vector<std::pair<std::string, std::string>> YamlReader::strings(const std::string& key) {
  YAML::Node n = get(key);
  COCEMU_CHECK(n.IsSequence(), Errc::parse_error, "{}: '{}{}' must be a list", where(n),
               path_.empty() ? "" : path_ + ".", key);
  std::vector<std::pair<std::string, std::string>> out;
  for (std::size_t i = 0; i < n.size(); ++i) {
    COCEMU_CHECK(n[i].IsScalar(), Errc::parse_error, "{}: '{}{}[{}]' must be a plain string",
                 where(n[i]), path_.empty() ? "" : path_ + ".", key, i);
    out.push_back({n[i].Scalar(), where(n[i])});
  }
  return out;
}

std::vector<std::string> YamlReader::keys() {
  std::vector<std::string> out;
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    out.push_back(it->first.Scalar());
    used_.insert(out.back());
  }
  return out;
}

namespace {
/// A key as an error message shows it, quoted: whole up to 80 characters, else its start and its
/// length (a key can be as long as the file).
std::string quoted_key(const std::string& key) {
  constexpr std::size_t kMax = 80, kShown = 60;
  if (key.size() <= kMax) return fmt::format("'{}'", key);
  return fmt::format("'{}…' ({} characters)", key.substr(0, kShown), key.size());
}
}  // namespace

void YamlReader::finish() const {
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    const std::string key = it->first.Scalar();
    COCEMU_CHECK(used_.count(key), Errc::parse_error, "{}: unknown key {}", where(it->first),
                 quoted_key((path_.empty() ? "" : path_ + ".") + key));
  }
}

}  // namespace cocemu::detail
