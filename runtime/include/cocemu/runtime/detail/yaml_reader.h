#pragma once
/// Strict YAML reading: every key must be known, every required key present, every number in
/// range; errors name file:line. Shared by all configuration parsers.
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "cocemu/runtime/error.h"

namespace cocemu::detail {

/// Nesting a configuration file may have, at most.
inline constexpr int kMaxYamlDepth = 32;
/// Nodes that aliases (*name) may add to a document, in all, each alias counting every node of
/// what it names: configuration files are small, and every walk over the tree visits an aliased
/// node once per alias.
inline constexpr std::int64_t kMaxYamlAliasNodes = 100000;

class YamlReader {
 public:
  YamlReader(YAML::Node node, std::string file, std::string path);
  /// Parses text; syntax errors (yaml-cpp's, said plainly), nesting deeper than kMaxYamlDepth and
  /// aliases expanding past kMaxYamlAliasNodes become parse errors with file:line and `what` was
  /// being read ("device profile"), before the tree is built.
  static YamlReader parse(const std::string& text, const std::string& file,
                          const std::string& what = "");

  bool has(const std::string& key) const;
  double number(const std::string& key, double min, double max);
  double number_or(const std::string& key, double fallback, double min, double max);
  std::int64_t integer(const std::string& key, std::int64_t min, std::int64_t max);
  bool boolean(const std::string& key);
  bool boolean_or(const std::string& key, bool fallback);
  std::string string(const std::string& key);
  std::string string_or(const std::string& key, const std::string& fallback);
  YamlReader map(const std::string& key);
  std::vector<YamlReader> sequence(const std::string& key);
  /// A list of plain strings (scalars), with the line of each.
  std::vector<std::pair<std::string, std::string>> strings(const std::string& key);
  /// Keys of this map, in file order (each marked as used).
  std::vector<std::string> keys();
  /// Marks `key` as read without reading it (a key accepted and deliberately not used).
  void skip(const std::string& key) { used_.insert(key); }
  /// Throws for every key not consumed by the calls above.
  void finish() const;

  const YAML::Node& node() const { return node_; }
  std::string where(const YAML::Node& n) const;
  std::string where() const { return where(node_); }
  const std::string& file() const { return file_; }
  const std::string& path() const { return path_; }

 private:
  YAML::Node get(const std::string& key);
  YAML::Node node_;
  std::string file_, path_;
  std::set<std::string> used_;
};

}  // namespace cocemu::detail
