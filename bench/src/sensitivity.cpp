#include "cocemu/bench/sensitivity.h"

#include <fmt/format.h>

namespace cocemu::bench {

std::string Sensitivity::fragile(const std::string& conclusion) const {
  std::string out;
  for (const Flip& f : flips)
    if (f.conclusion == conclusion)
      out += fmt::format("{}{} x{:g} -> {}", out.empty() ? "" : "; ", f.parameter, f.factor, f.to);
  return out;
}

Sensitivity sensitivity(
    const DeviceProfile& profile,
    const std::function<Conclusions(std::shared_ptr<const DeviceProfile>)>& analyse,
    const std::vector<double>& factors) {
  Sensitivity s;
  s.profile = profile.name;
  s.factors = factors;
  s.parameters = profile.assumptions;
  s.base = analyse(std::make_shared<const DeviceProfile>(profile));
  s.runs = 1;
  for (const std::string& key : profile.assumptions)
    for (double f : factors) {
      const Conclusions c = analyse(std::make_shared<const DeviceProfile>(profile.scaled(key, f)));
      ++s.runs;
      for (const auto& [what, value] : s.base) {
        const auto it = c.find(what);
        const std::string now = it == c.end() ? "(none)" : it->second;
        if (now != value) s.flips.push_back({key, f, what, value, now});
      }
    }
  return s;
}

std::string format_sensitivity(const Sensitivity& s) {
  std::string out = fmt::format("\n# sensitivity: each of the {} assumptions of profile {} scaled",
                                s.parameters.size(), s.profile);
  for (double f : s.factors)
    out += fmt::format(" x{:g}", f);
  out += fmt::format(", one at a time ({} modeled runs); conclusions that change:\n", s.runs);
  for (const std::string& p : s.parameters)
    for (double f : s.factors) {
      std::string changes;
      for (const Flip& fl : s.flips)
        if (fl.parameter == p && fl.factor == f)
          changes += fmt::format("{}{}: {} -> {}", changes.empty() ? "" : "; ", fl.conclusion,
                                 fl.from, fl.to);
      out += fmt::format("  {:<44} x{:<4g} {}\n", p, f, changes.empty() ? "none" : changes);
    }
  int fragile = 0;
  std::string list;
  for (const auto& [what, value] : s.base) {
    const std::string why = s.fragile(what);
    if (why.empty()) continue;
    ++fragile;
    list += fmt::format("  {} = {}  (flips: {})\n", what, value, why);
  }
  out += fmt::format(
      "# {} of {} conclusions are fragile (flip within x{:g}..x{:g} of an "
      "assumption){}\n",
      fragile, s.base.size(), s.factors.front(), s.factors.back(), fragile ? ":" : "");
  return out + list;
}

nlohmann::json to_json(const Sensitivity& s) {
  nlohmann::json flips = nlohmann::json::array();
  for (const Flip& f : s.flips)
    flips.push_back({{"parameter", f.parameter},
                     {"factor", f.factor},
                     {"conclusion", f.conclusion},
                     {"from", f.from},
                     {"to", f.to}});
  nlohmann::json conclusions = nlohmann::json::array();
  for (const auto& [what, value] : s.base)
    conclusions.push_back(
        {{"conclusion", what}, {"value", value}, {"fragile", !s.fragile(what).empty()}});
  return {{"profile", s.profile}, {"factors", s.factors},       {"parameters", s.parameters},
          {"runs", s.runs},       {"conclusions", conclusions}, {"flips", flips}};
}

}  // namespace cocemu::bench
