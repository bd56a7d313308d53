#include "cocemu/layers/coc_config.h"

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>

#include "cocemu/runtime/detail/yaml_reader.h"
#include "cocemu/runtime/error.h"

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
int env_int(const EnvLookup& env, const std::string& name, std::initializer_list<int> allowed,
            int fallback) {
  const auto v = env(name);
  if (!v) return fallback;
  std::string list;
  for (int a : allowed)
    list += fmt::format("{}{}", list.empty() ? "" : ", ", a);
  char* end = nullptr;
  const long x = std::strtol(v->c_str(), &end, 10);
  bool ok = !v->empty() && end && *end == '\0';
  if (ok) ok = std::find(allowed.begin(), allowed.end(), int(x)) != allowed.end();
  COCEMU_CHECK_ARG(ok, "environment variable {}='{}' is invalid; allowed: {}", name, *v, list);
  return int(x);
}
}  // namespace

CocConfig parse_coc_config(const std::string& text, const std::string& origin,
                           const EnvLookup& env) {
  using detail::YamlReader;
  CocConfig c;
  YamlReader top = YamlReader::parse(text, origin);
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
    const std::regex shape(R"(\[\s*\d+\s*,\s*\d+\s*,\s*\d+\s*\])");
    for (const std::string& key : cc.keys()) {
      COCEMU_CHECK(std::regex_match(key, shape), Errc::parse_error,
                   "{}: customized_coc key '{}' must be a shape \"[m, k, n]\"",
                   cc.where(cc.node()[key]), key);
      const int v = int(cc.integer(key, -1, 8));
      COCEMU_CHECK(v == -1 || v == 1 || v == 2 || v == 4 || v == 8, Errc::parse_error,
                   "{}: customized_coc['{}'] = {}; allowed: -1 (fused), 1 (off), 2, 4, 8",
                   cc.where(cc.node()[key]), key, v);
      // Normalise "[m,k,n]" spacing to MindSpeed's "[m, k, n]".
      const std::regex number(R"(\d+)");
      std::vector<std::string> parts;
      for (std::sregex_iterator it(key.begin(), key.end(), number), end; it != end; ++it)
        parts.push_back(it->str());
      c.customized_coc[fmt::format("[{}, {}, {}]", parts[0], parts[1], parts[2])] = v;
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
  std::ifstream in(path);
  COCEMU_CHECK_ARG(in.good(), "cannot open CoC config '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_coc_config(ss.str(), path, env);
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
