#include "cocemu/runtime/names.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <filesystem>

namespace cocemu {

std::vector<std::string> yaml_names_in(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::filesystem::path& p = it->path();
    if (p.extension() == ".yaml" && it->is_regular_file(ec)) names.push_back(p.stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

int edit_distance(const std::string& a, const std::string& b) {
  const auto lower = [](char c) { return char(std::tolower(static_cast<unsigned char>(c))); };
  std::vector<int> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j)
    prev[j] = int(j);
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = int(i);
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1,
                         prev[j - 1] + (lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest_name(const std::string& name, const std::vector<std::string>& valid) {
  if (name.empty()) return {};
  const auto lower = [](std::string s) {
    for (char& c : s)
      c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string n = lower(name);
  // A name the user shortened ("h100") or wrapped: the shortest valid name containing it.
  std::string containing;
  for (const std::string& v : valid)
    if (lower(v).find(n) != std::string::npos &&
        (containing.empty() || v.size() < containing.size()))
      containing = v;
  if (!containing.empty()) return containing;
  std::string best;
  int best_d = 0;
  for (const std::string& v : valid) {
    const int d = edit_distance(name, v);
    if (best.empty() || d < best_d) best = v, best_d = d;
  }
  const int allowed = std::max<int>(2, int(std::max(name.size(), best.size()) / 3));
  return !best.empty() && best_d <= allowed ? best : std::string();
}

std::string valid_names_hint(const std::string& name, const std::vector<std::string>& valid,
                             const std::string& dir) {
  if (valid.empty()) return fmt::format("no .yaml files in '{}'", dir);
  const std::string near = nearest_name(name, valid);
  return fmt::format("valid names: {}{}", fmt::join(valid, ", "),
                     near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near));
}

bool is_config_path(const std::string& s) {
  return s.find('/') != std::string::npos ||
         (s.size() > 5 && s.compare(s.size() - 5, 5, ".yaml") == 0);
}

}  // namespace cocemu
