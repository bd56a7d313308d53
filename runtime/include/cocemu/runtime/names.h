#pragma once
/// Named configuration files (`configs/devices/<name>.yaml`, `configs/models/<name>.yaml`): the
/// names a folder offers, and the error a mistyped name gets — the valid names and the nearest
/// one, so `--profile h100` says "did you mean 'h100-sxm'?".
#include <string>
#include <vector>

namespace cocemu {

/// The names of the `.yaml` files in `dir` (without the extension), sorted; empty if `dir` cannot
/// be read.
std::vector<std::string> yaml_names_in(const std::string& dir);

/// Levenshtein distance between `a` and `b`, ignoring case (insertions, deletions, substitutions).
int edit_distance(const std::string& a, const std::string& b);

/// The name of `valid` nearest to `name`: one that starts with it or contains it (`h100` →
/// `h100-sxm`), else the one at the smallest edit distance if that distance is at most a third of
/// the longer name (and at least 2 edits are allowed); empty when nothing is near.
std::string nearest_name(const std::string& name, const std::vector<std::string>& valid);

/// "valid names: a, b, c (did you mean 'b'?)" — or "no .yaml files in DIR" when there are none.
std::string valid_names_hint(const std::string& name, const std::vector<std::string>& valid,
                             const std::string& dir);

/// True when `name_or_path` names a file by path (it holds a '/' or ends in ".yaml"), false when
/// it is a name to look up in a configs folder.
bool is_config_path(const std::string& name_or_path);

}  // namespace cocemu
