#include "cocemu/runtime/profile.h"

#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

#include "cocemu/runtime/detail/yaml_reader.h"

#ifndef COCEMU_SOURCE_CONFIG_DIR
#define COCEMU_SOURCE_CONFIG_DIR "configs"
#endif

namespace cocemu {

double DeviceProfile::peak(DType t) const {
  auto it = peak_flops.find(t);
  COCEMU_CHECK_ARG(it != peak_flops.end(), "device profile '{}' has no peak FLOP/s for dtype {}",
                   name, name_of(t));
  return it->second;
}

const std::string& DeviceProfile::auto_algorithm(std::uint64_t bytes) const {
  for (const auto& rule : auto_rules)
    if (double(bytes) <= rule.max_bytes) return rule.algorithm;
  return auto_rules.back().algorithm;
}

DeviceProfile parse_device_profile(const std::string& text, const std::string& origin) {
  using detail::YamlReader;
  constexpr double inf = std::numeric_limits<double>::infinity();
  YamlReader top = YamlReader::parse(text, origin);
  DeviceProfile p;
  p.source = origin;
  p.name = top.string("name");
  top.string_or("description", "");
  p.ranks_per_node = int(top.integer("ranks_per_node", 1, 64));

  YamlReader compute = top.map("compute");
  YamlReader peaks = compute.map("peak_flops");
  for (const std::string& key : peaks.keys()) {
    DType t;
    try {
      t = parse_dtype(key);
    } catch (const Error&) {
      COCEMU_FAIL(Errc::parse_error,
                  "{}: unknown dtype key 'compute.peak_flops.{}'; allowed: f32, "
                  "f64, f16, bf16, i8, i32",
                  peaks.where(peaks.node()[key]), key);
    }
    p.peak_flops[t] = peaks.number(key, 1e6, 1e18);
  }
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    COCEMU_CHECK(p.peak_flops.count(t), Errc::parse_error,
                 "{}: 'compute.peak_flops' must give {} (f32, f16 and bf16 are required)",
                 peaks.where(), name_of(t));
  peaks.finish();
  YamlReader gemm = compute.map("gemm");
  p.gemm.max_efficiency = gemm.number("max_efficiency", 0.01, 1.0);
  p.gemm.half_efficiency_flops = gemm.number("half_efficiency_flops", 0, 1e15);
  p.gemm.alignment_bytes = std::uint32_t(gemm.integer("alignment_bytes", 1, 1 << 20));
  p.gemm.unaligned_efficiency = gemm.number("unaligned_efficiency", 0.01, 1.0);
  gemm.finish();
  p.kernel_min_ns = compute.number("kernel_min_ns", 0, 1e7);
  compute.finish();

  YamlReader memory = top.map("memory");
  p.memory_bandwidth = memory.number("bandwidth_bytes_per_s", 1e6, 1e15);
  memory.finish();

  YamlReader links = top.map("links");
  p.link_per_peer_bandwidth = links.number("per_peer_bytes_per_s", 1e6, 1e15);
  p.link_per_rank_bandwidth = links.number("per_rank_bytes_per_s", 1e6, 1e15);
  p.link_latency_ns = links.number("latency_ns", 0, 1e8);
  COCEMU_CHECK(p.link_per_rank_bandwidth >= p.link_per_peer_bandwidth, Errc::parse_error,
               "{}: links.per_rank_bytes_per_s ({}) must be >= links.per_peer_bytes_per_s ({})",
               links.where(), p.link_per_rank_bandwidth, p.link_per_peer_bandwidth);
  links.finish();

  YamlReader coll = top.map("collectives");
  for (const char* algo : {"ring", "direct"}) {
    YamlReader a = coll.map(algo);
    CollectiveAlgorithmCost c;
    c.step_latency_ns = a.number("step_latency_ns", 0, 1e8);
    c.bandwidth_efficiency = a.number("bandwidth_efficiency", 0.01, 1.0);
    a.finish();
    p.algorithms[algo] = c;
  }
  double previous = -1;
  for (YamlReader& rule : coll.sequence("auto")) {
    AlgorithmRule r;
    r.max_bytes = rule.number("max_bytes", 0, inf);
    r.algorithm = rule.string("algorithm");
    COCEMU_CHECK(r.algorithm == "ring" || r.algorithm == "direct", Errc::parse_error,
                 "{}: collectives.auto algorithm '{}' is unknown; allowed: ring, direct",
                 rule.where(), r.algorithm);
    COCEMU_CHECK(r.max_bytes > previous, Errc::parse_error,
                 "{}: collectives.auto rules must have increasing max_bytes ({} after {})",
                 rule.where(), r.max_bytes, previous);
    previous = r.max_bytes;
    rule.finish();
    p.auto_rules.push_back(r);
  }
  COCEMU_CHECK(!p.auto_rules.empty() && p.auto_rules.back().max_bytes == inf, Errc::parse_error,
               "{}: collectives.auto must end with a rule of max_bytes .inf", coll.where());
  coll.finish();

  YamlReader host = top.map("host");
  p.launch_overhead_ns = host.number("launch_overhead_ns", 0, 1e8);
  p.fused_launch_overhead_ns = host.number("fused_launch_overhead_ns", 0, 1e8);
  host.finish();

  YamlReader cont = top.map("contention");
  p.contention.compute_slowdown = cont.number("compute_slowdown", 1.0, 10.0);
  p.contention.comm_slowdown = cont.number("comm_slowdown", 1.0, 10.0);
  cont.finish();
  top.finish();
  return p;
}

DeviceProfile load_device_profile(const std::string& path) {
  std::ifstream in(path);
  COCEMU_CHECK_ARG(in.good(), "cannot open device profile '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_device_profile(ss.str(), path);
}

std::string config_dir() {
  if (const char* d = std::getenv("COCEMU_CONFIG_DIR")) return d;
  return COCEMU_SOURCE_CONFIG_DIR;
}

DeviceProfile load_named_profile(const std::string& name) {
  if (name.find('/') != std::string::npos ||
      (name.size() > 5 && name.compare(name.size() - 5, 5, ".yaml") == 0))
    return load_device_profile(name);
  return load_device_profile(config_dir() + "/devices/" + name + ".yaml");
}

}  // namespace cocemu
