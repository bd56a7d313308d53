#include "cocemu/layers/coc_config.h"

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cocemu/runtime/checked.h"
#include "cocemu/runtime/detail/yaml_reader.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/input_file.h"

namespace cocemu::layers {

const char* to_string(Strategy s) {
  switch (s) {
    case Strategy::serial:
      return "serial";
    case Strategy::script:
      return "script";
    case Strategy::fused:
      return "fused";
  }
  return "?";
}

std::optional<std::string> process_env(const std::string& name) {
  if (const char* v = std::getenv(name.c_str())) return std::string(v);
  return std::nullopt;
}

namespace {
/// "[m, k, n]" with any spacing: three positive integers below 2^40 (no regular expressions,
/// so a key of any length is read in one pass).
std::optional<std::array<std::int64_t, 3>> parse_shape_key(const std::string& key) {
  std::array<std::int64_t, 3> dims{};
  std::size_t i = 0;
  auto skip = [&] {
    while (i < key.size() && (key[i] == ' ' || key[i] == '\t'))
      ++i;
  };
  skip();
  if (i >= key.size() || key[i++] != '[') return std::nullopt;
  for (int d = 0; d < 3; ++d) {
    skip();
    std::int64_t v = 0;
    const std::size_t start = i;
    while (i < key.size() && key[i] >= '0' && key[i] <= '9' && i - start < 13)
      v = v * 10 + (key[i++] - '0');
    if (i == start || v <= 0 || v >= (std::int64_t(1) << 40)) return std::nullopt;
    if (i < key.size() && key[i] >= '0' && key[i] <= '9') return std::nullopt;
    dims[std::size_t(d)] = v;
    skip();
    if (i >= key.size() || key[i++] != (d < 2 ? ',' : ']')) return std::nullopt;
  }
  skip();
  if (i != key.size()) return std::nullopt;
  return dims;
}

/// YAML's limit on an implicit key (one on a line with its ':'), which yaml-cpp enforces.
constexpr std::size_t kMaxYamlKeyChars = 1024;

/// A quoted key longer than YAML allows: yaml-cpp says only "end of map flow not found" (in a
/// flow mapping, `{"…": 2}`) or "illegal map value". Found before parsing, with its line and
/// length. (A plain key in block style is explained by the YAML reader itself.)
void check_quoted_key_lengths(const std::string& text, const std::string& origin) {
  std::size_t line = 1;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') ++line;
    if (c == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\n')) {
      while (i + 1 < text.size() && text[i + 1] != '\n')
        ++i;
      continue;
    }
    // A quote opens a scalar only where a scalar can start (not inside a plain one: "it's").
    const char before = i == 0 ? '\n' : text[i - 1];
    const bool opens = before == '\n' || before == ' ' || before == '\t' || before == '{' ||
                       before == '[' || before == ',' || before == ':';
    if ((c != '"' && c != '\'') || !opens) continue;
    // A quoted scalar: to its closing quote ('' escapes a single quote, \" a double one).
    const std::size_t start = i, at_line = line;
    std::size_t j = i + 1;
    for (; j < text.size(); ++j) {
      if (text[j] == '\n') ++line;
      if (c == '"' && text[j] == '\\') {
        ++j;
        continue;
      }
      if (text[j] == c) {
        if (c == '\'' && j + 1 < text.size() && text[j + 1] == '\'') {
          ++j;
          continue;
        }
        break;
      }
    }
    if (j >= text.size()) return;  // unterminated: the YAML reader says so
    std::size_t after = j + 1;
    while (after < text.size() && (text[after] == ' ' || text[after] == '\t'))
      ++after;
    const std::size_t chars = j + 1 - start;  // with its quotes, as YAML counts the key
    COCEMU_CHECK(after >= text.size() || text[after] != ':' || chars <= kMaxYamlKeyChars,
                 Errc::parse_error,
                 "{}:{}: in the CoC config: a key of {} characters; YAML allows at most {} in a "
                 "key (customized_coc's keys are shapes \"[m, k, n]\")",
                 origin, at_line, chars, kMaxYamlKeyChars);
    i = j;
  }
}

int env_int(const EnvLookup& env, const std::string& name, std::initializer_list<int> allowed,
            int fallback) {
  const auto v = env(name);
  if (!v) return fallback;
  std::string list;
  for (int a : allowed)
    list += fmt::format("{}{}", list.empty() ? "" : ", ", a);
  bool ok = !v->empty() && v->size() <= 20;
  std::int64_t x = 0;
  try {
    x = parse_integer(name, *v, -1000, 1000);
  } catch (const Error&) {
    ok = false;
  }
  if (ok) ok = std::find(allowed.begin(), allowed.end(), int(x)) != allowed.end();
  COCEMU_CHECK_ARG(ok, "environment variable {}='{}' is invalid; allowed: {}", name,
                   v->size() > 40 ? v->substr(0, 40) + "..." : *v, list);
  return int(x);
}
}  // namespace

CocConfig parse_coc_config(const std::string& text, const std::string& origin,
                           const EnvLookup& env) {
  using detail::YamlReader;
  CocConfig c;
  check_quoted_key_lengths(text, origin);
  YamlReader top = YamlReader::parse(text, origin, "CoC config");
  c.matmul_soc_friendly = top.boolean_or("matmul_soc_friendly", true);
  c.recompute_all_gather = top.boolean_or("recompute_all_gather", true);
  c.enable_coc_in_column_backward = top.boolean_or("enable_coc_in_column_backward", false);
  c.k_min = top.has("k_min") ? top.integer("k_min", 0, 1 << 30) : 1024;
  c.k_max = top.has("k_max") ? top.integer("k_max", 0, 1 << 30) : 4096;
  COCEMU_CHECK(c.k_min <= c.k_max, Errc::parse_error, "{}: k_min {} must be <= k_max {}",
               top.where(), c.k_min, c.k_max);
  c.tile_rows = top.has("tile_rows") ? top.integer("tile_rows", 1, 1 << 20) : 128;
  c.tiles_per_step = top.has("tiles_per_step") ? int(top.integer("tiles_per_step", 1, 15)) : 2;
  c.optimize_recomp_communication_level =
      top.has("optimize_recomp_communication_level")
          ? int(top.integer("optimize_recomp_communication_level", 0, 2))
          : 0;
  if (top.has("customized_coc") && !top.node()["customized_coc"].IsNull()) {
    YamlReader cc = top.map("customized_coc");
    for (const std::string& key : cc.keys()) {
      const std::string where = cc.where(cc.node()[key]);
      const std::string shown = key.size() > 60 ? key.substr(0, 60) + "..." : key;
      const auto dims = parse_shape_key(key);
      COCEMU_CHECK(dims.has_value(), Errc::parse_error,
                   "{}: customized_coc key '{}' must be a shape \"[m, k, n]\" of positive "
                   "integers below 2^40",
                   where, shown);
      const int v = int(cc.integer(key, -1, 8));
      COCEMU_CHECK(v == -1 || v == 1 || v == 2 || v == 4 || v == 8, Errc::parse_error,
                   "{}: customized_coc['{}'] = {}; allowed: -1 (fused), 1 (off), 2, 4, 8", where,
                   shown, v);
      // Normalise "[m,k,n]" spacing to MindSpeed's "[m, k, n]"; two spellings of one shape are
      // an error, not a silent choice.
      const std::string norm = fmt::format("[{}, {}, {}]", (*dims)[0], (*dims)[1], (*dims)[2]);
      COCEMU_CHECK(!c.customized_coc.count(norm), Errc::parse_error,
                   "{}: customized_coc has two entries for the shape {}", where, norm);
      c.customized_coc[norm] = v;
    }
  } else if (top.has("customized_coc")) {
    top.map("customized_coc");  // mark used (null map)
  }
  top.finish();
  c.parallel_num = env_int(env, "COC_PARALLEL_NUM", {1, 2, 4, 8}, 1);
  c.fused = env_int(env, "USE_COC_FUSED_KERNEL", {0, 1}, 0) == 1;
  c.cc_mode = env_int(env, "CC_MODE", {-1, 0, 1, 2}, -1);
  const bool coc_on =
      c.cc_mode != 0 && (c.parallel_num > 1 || c.fused || !c.customized_coc.empty());
  COCEMU_CHECK_ARG(!(coc_on && c.optimize_recomp_communication_level > 0),
                   "CoC (COC_PARALLEL_NUM={}, USE_COC_FUSED_KERNEL={}, {} customized shapes) "
                   "cannot be combined with the TP recompute-communication optimisation "
                   "(optimize_recomp_communication_level = {}); MindSpeed rejects this combination",
                   c.parallel_num, c.fused ? 1 : 0, c.customized_coc.size(),
                   c.optimize_recomp_communication_level);
  return c;
}

CocConfig load_coc_config(const std::string& path, const EnvLookup& env) {
  return parse_coc_config(read_input_file(path, "CoC config"), path, env);
}

CocChoice choose(const CocConfig& c, std::int64_t m, std::int64_t k, std::int64_t n) {
  if (c.cc_mode == 0) return {Strategy::serial, 1};  // original Megatron
  if (c.cc_mode == 1) return {Strategy::script, 1};  // rewrite: same code path, one chunk
  int p = c.fused ? -1 : c.parallel_num;             // USE_COC_FUSED_KERNEL wins
  if (auto it = c.customized_coc.find(fmt::format("[{}, {}, {}]", m, k, n));
      it != c.customized_coc.end())
    p = it->second;
  if (p == -1) return {Strategy::fused, 1};
  if (p == 1) return {Strategy::serial, 1};
  if (m < p) return {Strategy::serial, 1};  // MindSpeed: m < P falls back to no split
  return {Strategy::script, p};
}

SocFriendly soc_friendly(const CocConfig& c, std::int64_t m, std::int64_t k, std::int64_t n,
                         int parallel_num, std::size_t e, bool weight_col_major) {
  // MindSpeed's get_aligned_mm_inputs (lcal_coc/matmul_soc_friendly.py), called only on the
  // script path with P > 1 (P = 1 routes to the rewrite functions, which do not call it).
  SocFriendly s{false, k};
  if (!c.matmul_soc_friendly || parallel_num <= 1) return s;
  const auto aligned = [e](std::int64_t x, std::size_t bytes) {
    return (std::size_t(x) * e) % bytes == 0;
  };
  const bool mn_aligned = aligned(m / parallel_num, 512) && aligned(n, 512);
  if (aligned(k, 512)) {
    s.transpose_weight = !mn_aligned && !weight_col_major;
  } else if (mn_aligned && !aligned(k, 32) && k >= c.k_min && k <= c.k_max) {
    const std::int64_t per = std::int64_t(512 / e);
    s.padded_k = (k + per - 1) / per * per;
  }
  return s;
}

}  // namespace cocemu::layers
