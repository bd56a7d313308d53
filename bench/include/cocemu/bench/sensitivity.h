#pragma once
/// Sensitivity of a conclusion to the profile's assumptions (R-TO-4): every parameter the
/// profile lists under `assumptions:` is scaled ×0.5 and ×2, one at a time, the analysis is
/// re-run (modeled only) and each conclusion — a verdict, a best strategy, a chosen split or
/// window — is compared with the unscaled run. A conclusion that changes within that range is
/// fragile.
#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cocemu/runtime/profile.h"

namespace cocemu::bench {

/// Named conclusions of one analysis: "fwd attn.qkv best strategy" -> "fused".
using Conclusions = std::map<std::string, std::string>;

struct Flip {
  std::string parameter;
  double factor = 1;
  std::string conclusion, from, to;
};

struct Sensitivity {
  std::string profile;
  std::vector<double> factors;
  std::vector<std::string> parameters;  ///< the profile's assumptions, in its order
  Conclusions base;                     ///< the conclusions on the profile as it is
  std::vector<Flip> flips;
  int runs = 0;  ///< analyses run (1 + parameters × factors)
  /// The flips of one conclusion, as "param ×2 → value, …" (empty if it is robust).
  std::string fragile(const std::string& conclusion) const;
};

/// Runs `analyse` on `profile` and on each assumption scaled by each factor.
Sensitivity sensitivity(
    const DeviceProfile& profile,
    const std::function<Conclusions(std::shared_ptr<const DeviceProfile>)>& analyse,
    const std::vector<double>& factors = {0.5, 2.0});

/// A table: per parameter and factor, the conclusions that flip; then the fragile ones.
std::string format_sensitivity(const Sensitivity& s);
nlohmann::json to_json(const Sensitivity& s);

}  // namespace cocemu::bench
