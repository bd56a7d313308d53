#include "cocemu/runtime/detail/yaml_reader.h"

#include <cmath>
#include <limits>

namespace cocemu::detail {

YamlReader::YamlReader(YAML::Node node, std::string file, std::string path)
    : node_(std::move(node)), file_(std::move(file)), path_(std::move(path)) {
  COCEMU_CHECK(node_.IsMap(), Errc::parse_error, "{}: '{}' must be a mapping of keys to values",
               where(), path_.empty() ? "<top level>" : path_);
}

YamlReader YamlReader::parse(const std::string& text, const std::string& file) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    COCEMU_FAIL(Errc::parse_error, "{}:{}:{}: YAML syntax error: {}", file, e.mark.line + 1,
                e.mark.column + 1, e.msg);
  }
  COCEMU_CHECK(root.IsMap(), Errc::parse_error, "{}: the document must be a mapping", file);
  return YamlReader(root, file, "");
}

std::string YamlReader::where(const YAML::Node& n) const {
  const YAML::Mark m = n.Mark();
  if (m.is_null()) return file_;
  return fmt::format("{}:{}", file_, m.line + 1);
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

void YamlReader::finish() const {
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    const std::string key = it->first.Scalar();
    COCEMU_CHECK(used_.count(key), Errc::parse_error, "{}: unknown key '{}{}'", where(it->first),
                 path_.empty() ? "" : path_ + ".", key);
  }
}

}  // namespace cocemu::detail
