#include "cocemu/runtime/profile.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <fmt/ranges.h>

#include "cocemu/runtime/detail/yaml_reader.h"
#include "cocemu/runtime/input_file.h"
#include "cocemu/runtime/names.h"

namespace cocemu {

double DeviceProfile::peak(DType t) const {
  auto it = peak_flops.find(t);
  COCEMU_CHECK_ARG(it != peak_flops.end(), "device profile '{}' has no peak FLOP/s for dtype {}",
                   name, name_of(t));
  return it->second;
}

const AlgorithmRule& DeviceProfile::auto_rule(std::uint64_t bytes, bool multi_node) const {
  const auto& rules =
      multi_node && !auto_rules_multi_node.empty() ? auto_rules_multi_node : auto_rules;
  for (const auto& rule : rules)
    if (double(bytes) <= rule.max_bytes) return rule;
  return rules.back();
}

void DeviceProfile::check_world(int n_ranks) const {
  const int nodes = (n_ranks + topology.devices_per_node - 1) / topology.devices_per_node;
  COCEMU_CHECK_ARG(nodes <= 1 || topology.multi_node,
                   "device profile '{}' describes one node of {} devices and no inter-node "
                   "network, but a world of {} ranks spans {} nodes; add topology.inter_node "
                   "{{per_device_bytes_per_s, latency_ns}} to the profile",
                   name, topology.devices_per_node, n_ranks, nodes);
}

namespace {

/// `topology:` — devices per node, the intra-node fabric and the inter-node network.
Topology parse_topology(detail::YamlReader t) {
  using detail::YamlReader;
  Topology topo;
  topo.devices_per_node = int(t.integer("devices_per_node", 1, 1024));
  YamlReader intra = t.map("intra_node");
  const std::string fabric = intra.string("fabric");
  COCEMU_CHECK(fabric == "mesh" || fabric == "switch", Errc::parse_error,
               "{}: topology.intra_node.fabric '{}' is unknown; allowed: mesh (per-peer links, "
               "as HCCS), switch (as NVSwitch)",
               intra.where(), fabric);
  topo.intra_switch = fabric == "switch";
  topo.intra_per_device = intra.number("per_device_bytes_per_s", 1e6, 1e15);
  if (topo.intra_switch) {
    topo.intra_per_peer = topo.intra_per_device;
  } else {
    topo.intra_per_peer = intra.number("per_peer_bytes_per_s", 1e6, 1e15);
    COCEMU_CHECK(topo.intra_per_device >= topo.intra_per_peer, Errc::parse_error,
                 "{}: topology.intra_node.per_device_bytes_per_s ({}) must be >= "
                 "per_peer_bytes_per_s ({})",
                 intra.where(), topo.intra_per_device, topo.intra_per_peer);
  }
  topo.intra_latency_ns = intra.number("latency_ns", 0, 1e8);
  intra.finish();
  if (t.has("inter_node")) {
    YamlReader inter = t.map("inter_node");
    topo.multi_node = true;
    topo.inter_per_device = inter.number("per_device_bytes_per_s", 1e6, 1e15);
    topo.inter_latency_ns = inter.number("latency_ns", 0, 1e8);
    if (inter.has("bandwidth_efficiency"))
      topo.inter_efficiency = inter.number("bandwidth_efficiency", 0.01, 1.0);
    inter.finish();
  }
  t.finish();
  return topo;
}

std::vector<AlgorithmRule> parse_auto_rules(
    detail::YamlReader& coll, const char* key,
    const std::map<std::string, CollectiveAlgorithmCost>& algorithms) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  std::vector<AlgorithmRule> rules;
  double previous = -1;
  for (detail::YamlReader& rule : coll.sequence(key)) {
    AlgorithmRule r;
    r.max_bytes = rule.number("max_bytes", 0, inf);
    const auto known = [&](const std::string& name, const std::string& where) {
      COCEMU_CHECK(algorithms.count(name), Errc::parse_error,
                   "{}: collectives.{} algorithm '{}' has no cost entry; allowed: ring, direct, "
                   "hierarchical and tree (each with its collectives entry)",
                   where, key, name);
    };
    COCEMU_CHECK(rule.has("algorithm") != rule.has("cheapest"), Errc::parse_error,
                 "{}: a collectives.{} rule names either an `algorithm` or a `cheapest: [...]` "
                 "list of candidates to price, not {}",
                 rule.where(), key, rule.has("algorithm") ? "both" : "neither");
    if (rule.has("algorithm")) {
      r.algorithm = rule.string("algorithm");
      known(r.algorithm, rule.where());
    } else {
      for (auto& [name, where] : rule.strings("cheapest")) {
        known(name, where);
        r.cheapest.push_back(name);
      }
      COCEMU_CHECK(!r.cheapest.empty(), Errc::parse_error,
                   "{}: collectives.{} `cheapest` lists no candidate", rule.where(), key);
    }
    COCEMU_CHECK(r.max_bytes > previous, Errc::parse_error,
                 "{}: collectives.{} rules must have increasing max_bytes ({} after {})",
                 rule.where(), key, r.max_bytes, previous);
    previous = r.max_bytes;
    rule.finish();
    rules.push_back(r);
  }
  COCEMU_CHECK(!rules.empty() && rules.back().max_bytes == inf, Errc::parse_error,
               "{}: collectives.{} must end with a rule of max_bytes .inf", coll.where(), key);
  return rules;
}

}  // namespace

namespace {

constexpr int kMaxBaseDepth = 4;

/// A profile file's text: a regular file of at most 4 MiB (not a directory, nor a device or a
/// named pipe, whose reads may block or never end).
std::string read_profile_file(const std::string& path) {
  return read_input_file(path, "device profile");
}

/// Where a name or path of a profile lives: a name is configs/devices/<name>.yaml; a path (with a
/// '/' or ending in .yaml) is taken as given, or for a base, relative to the deriving file.
std::string profile_path(const std::string& name_or_path, const std::string& relative_to = "") {
  const bool path =
      name_or_path.find('/') != std::string::npos ||
      (name_or_path.size() > 5 && name_or_path.compare(name_or_path.size() - 5, 5, ".yaml") == 0);
  if (!path) return config_dir() + "/devices/" + name_or_path + ".yaml";
  if (relative_to.empty() || std::filesystem::path(name_or_path).is_absolute()) return name_or_path;
  return (std::filesystem::path(relative_to).parent_path() / name_or_path).string();
}

/// The base's tree with the deriving file's over it: mappings merge key by key (recursively);
/// anything else the deriving file gives (a number, a string, a list) replaces the base's.
YAML::Node overlay(const YAML::Node& base, const YAML::Node& top) {
  if (!base.IsMap() || !top.IsMap()) return top;
  YAML::Node out(YAML::NodeType::Map);
  for (const auto& kv : base) {
    const std::string key = kv.first.Scalar();
    const YAML::Node mine = top[key];
    out[key] = mine ? overlay(kv.second, mine) : kv.second;
  }
  for (const auto& kv : top)
    if (!base[kv.first.Scalar()]) out[kv.first.Scalar()] = kv.second;
  return out;
}

/// A parsed profile and its document with its bases' keys under it (what a profile deriving from
/// this one overlays).
struct Parsed {
  DeviceProfile profile;
  YAML::Node tree;
};

/// Parses `text`. With `base:`, the base is parsed first, each file once (so its errors name its
/// own file and line), and this document's keys overlay the base's resolved tree.
Parsed parse_profile(const std::string& text, const std::string& origin, int depth) {
  using detail::YamlReader;
  YamlReader top = YamlReader::parse(text, origin, "device profile");
  if (top.has("base")) {
    COCEMU_CHECK(top.has("name"), Errc::parse_error,
                 "{}: a profile with a base must give its own 'name' (it would take the base's)",
                 top.where());
    const std::string base = top.string("base"), where = top.where(top.node()["base"]);
    COCEMU_CHECK(depth < kMaxBaseDepth, Errc::parse_error,
                 "{}: base '{}': profiles derive from one another more than {} deep (a cycle?)",
                 where, base, kMaxBaseDepth);
    const std::string path = profile_path(base, origin);
    std::string base_text;
    try {
      base_text = read_profile_file(path);
    } catch (const Error& e) {
      COCEMU_FAIL(Errc::parse_error, "{}: base '{}': {}", where, base, e.message());
    }
    YAML::Node merged = overlay(parse_profile(base_text, path, depth + 1).tree, top.node());
    merged.remove("base");
    top = YamlReader(merged, origin + " (over " + base + ")", "");
  }
  const YAML::Node tree = top.node();
  DeviceProfile p;
  p.source = origin;
  p.name = top.string("name");
  COCEMU_CHECK(p.name.find_first_not_of(" \t") != std::string::npos, Errc::parse_error,
               "{}: 'name' is empty; a profile needs a name (reports, traces and derived profiles "
               "show it)",
               top.where(tree["name"]));
  top.string_or("description", "");
  if (top.has("topology")) {
    for (const char* old_key : {"ranks_per_node", "links"})
      COCEMU_CHECK(!top.has(old_key), Errc::parse_error,
                   "{}: '{}' and 'topology' both given; write the topology only "
                   "(topology.devices_per_node, topology.intra_node, topology.inter_node)",
                   top.where(top.node()[old_key]), old_key);
    p.topology = parse_topology(top.map("topology"));
  } else {
    // The one-node form of earlier profiles: ranks_per_node and links {per_peer_bytes_per_s,
    // per_rank_bytes_per_s, latency_ns} describe a full mesh inside one node, no network.
    p.topology.devices_per_node = int(top.integer("ranks_per_node", 1, 1024));
    YamlReader links = top.map("links");
    p.topology.intra_per_peer = links.number("per_peer_bytes_per_s", 1e6, 1e15);
    p.topology.intra_per_device = links.number("per_rank_bytes_per_s", 1e6, 1e15);
    p.topology.intra_latency_ns = links.number("latency_ns", 0, 1e8);
    COCEMU_CHECK(p.topology.intra_per_device >= p.topology.intra_per_peer, Errc::parse_error,
                 "{}: links.per_rank_bytes_per_s ({}) must be >= links.per_peer_bytes_per_s ({})",
                 links.where(), p.topology.intra_per_device, p.topology.intra_per_peer);
    links.finish();
  }

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
  if (compute.has("kernel_overhead_ns"))
    p.kernel_overhead_ns = compute.number("kernel_overhead_ns", 0, 1e7);
  if (compute.has("in_training_efficiency"))
    p.in_training_efficiency = compute.number("in_training_efficiency", 0.01, 1.0);
  if (compute.has("attention_efficiency"))
    p.attention_efficiency = compute.number("attention_efficiency", 0.01, 1.0);
  if (compute.has("attention_row_overhead_keys"))
    p.attention_row_overhead_keys = compute.number("attention_row_overhead_keys", 0, 1e7);
  if (compute.has("attention_backward_efficiency"))
    p.attention_backward_efficiency = compute.number("attention_backward_efficiency", 0.01, 1.0);
  compute.finish();

  YamlReader memory = top.map("memory");
  p.memory_bandwidth = memory.number("bandwidth_bytes_per_s", 1e6, 1e15);
  if (memory.has("in_training_efficiency"))
    p.memory_in_training_efficiency = memory.number("in_training_efficiency", 0.01, 1.0);
  if (memory.has("capacity_bytes")) p.memory_capacity = memory.number("capacity_bytes", 1e6, 1e15);
  memory.finish();

  YamlReader coll = top.map("collectives");
  for (const char* algo : {"ring", "direct", "hierarchical", "tree"}) {
    const bool optional = std::string(algo) == "hierarchical" || std::string(algo) == "tree";
    if (optional && !coll.has(algo)) continue;
    YamlReader a = coll.map(algo);
    CollectiveAlgorithmCost c;
    c.step_latency_ns = a.number("step_latency_ns", 0, 1e8);
    c.bandwidth_efficiency = a.number("bandwidth_efficiency", 0.01, 1.0);
    if (std::string(algo) == "hierarchical" && a.has("inter_node")) {
      const std::string how = a.string("inter_node");
      COCEMU_CHECK(how == "ring" || how == "halving_doubling", Errc::parse_error,
                   "{}: collectives.hierarchical.inter_node '{}'; allowed: ring, halving_doubling",
                   a.where(), how);
      c.inter_node = how == "ring" ? CollectiveAlgorithmCost::InterNode::ring
                                   : CollectiveAlgorithmCost::InterNode::halving_doubling;
    }
    a.finish();
    p.algorithms[algo] = c;
  }
  p.auto_rules = parse_auto_rules(coll, "auto", p.algorithms);
  if (coll.has("auto_multi_node"))
    p.auto_rules_multi_node = parse_auto_rules(coll, "auto_multi_node", p.algorithms);
  coll.finish();

  YamlReader host = top.map("host");
  p.launch_overhead_ns = host.number("launch_overhead_ns", 0, 1e8);
  p.fused_launch_overhead_ns = host.number("fused_launch_overhead_ns", 0, 1e8);
  host.finish();

  YamlReader cont = top.map("contention");
  p.contention.compute_slowdown = cont.number("compute_slowdown", 1.0, 10.0);
  p.contention.comm_slowdown = cont.number("comm_slowdown", 1.0, 10.0);
  // Running ops share the device memory whose bandwidth `memory:` gives (ContentionModel).
  p.contention.memory_bytes_per_ns =
      cont.boolean_or("shared_memory", true) ? p.memory_bandwidth / 1e9 : 0.0;
  cont.finish();
  if (top.has("tp_overlap")) {
    for (const auto& [mechanism, where] : top.strings("tp_overlap")) {
      COCEMU_CHECK(mechanism == "mindspeed_coc" || mechanism == "lcoc_fused" ||
                       mechanism == "te_userbuffers",
                   Errc::parse_error,
                   "{}: tp_overlap '{}' is not a mechanism cocemu knows; allowed: mindspeed_coc, "
                   "lcoc_fused, te_userbuffers",
                   where, mechanism);
      COCEMU_CHECK(!p.has_tp_overlap(mechanism), Errc::parse_error,
                   "{}: tp_overlap lists '{}' twice", where, mechanism);
      p.tp_overlap.push_back(mechanism);
    }
    COCEMU_CHECK(!p.has_tp_overlap("te_userbuffers") || p.tp_overlap.size() == 1, Errc::parse_error,
                 "{}: tp_overlap mixes Megatron-LM's te_userbuffers with Ascend's MindSpeed "
                 "mechanisms; a platform runs one software stack",
                 top.where(top.node()["tp_overlap"]));
  }

  if (top.has("fused")) {
    YamlReader f = top.map("fused");
    FusedKernelCost& c = p.fused;
    c.step_overhead_ns = f.number("step_overhead_ns", 0, 1e8);
    // step_bytes: both kinds' steps; gather_steps / reduce_steps: one kind's.
    if (f.has("step_bytes"))
      c.gather.step_bytes = c.reduce.step_bytes = f.number("step_bytes", 1, 1e12);
    for (const char* kind : {"gather_steps", "reduce_steps"}) {
      if (!f.has(kind)) continue;
      COCEMU_CHECK(!f.has("step_bytes"), Errc::parse_error,
                   "{}: fused.step_bytes (both kinds' steps) and fused.{} both set; give one",
                   f.where(), kind);
      YamlReader k = f.map(kind);
      FusedKernelCost::Steps& st = std::string(kind) == "gather_steps" ? c.gather : c.reduce;
      if (k.has("step_bytes")) st.step_bytes = k.number("step_bytes", 1, 1e12);
      st.ring = k.boolean_or("ring", false);
      if (k.has("count")) st.count = int(k.integer("count", 1, 1 << 20));
      if (k.has("compute_slowdown")) st.compute_slowdown = k.number("compute_slowdown", 1.0, 10.0);
      st.separate_gemms = k.boolean_or("separate_gemms", false);
      COCEMU_CHECK(int(st.step_bytes > 0) + int(st.ring) + int(st.count > 0) <= 1,
                   Errc::parse_error,
                   "{}: fused.{} gives more than one of step_bytes, ring and count; a kernel's "
                   "steps follow one rule",
                   k.where(), kind);
      k.finish();
    }
    if (f.has("l2_rule")) {
      YamlReader r = f.map("l2_rule");
      c.cube_cores = int(r.integer("cube_cores", 1, 1 << 12));
      c.l2_bytes = r.number("l2_bytes", 1, 1e12);
      YamlReader over = r.map("overflow_slowdown");
      c.l2_overflow_slowdown[0] = over.number("all_gather", 1.0, 100.0);
      c.l2_overflow_slowdown[1] = over.number("reduce_scatter", 1.0, 100.0);
      over.finish();
      c.large_k = r.integer("large_k", 1, std::int64_t(1) << 40);
      c.large_n = r.integer("large_n", 1, std::int64_t(1) << 40);
      YamlReader kn = r.map("large_kn_slowdown");
      c.large_kn_slowdown[0] = kn.number("all_gather", 1.0, 100.0);
      c.large_kn_slowdown[1] = kn.number("reduce_scatter", 1.0, 100.0);
      kn.finish();
      r.finish();
    }
    f.finish();
  }
  if (top.has("assumptions")) {
    const std::vector<std::string> known = p.scalable_keys();
    for (const auto& [key, where] : top.strings("assumptions")) {
      COCEMU_CHECK(std::find(known.begin(), known.end(), key) != known.end(), Errc::parse_error,
                   "{}: assumption '{}' is not a parameter of this profile; allowed: {}", where,
                   key, fmt::join(known, ", "));
      p.assumptions.push_back(key);
    }
  }
  top.finish();
  return {std::move(p), tree};
}

}  // namespace

DeviceProfile parse_device_profile(const std::string& text, const std::string& origin) {
  return parse_profile(text, origin, 0).profile;
}

namespace {
/// The parameter behind a dotted key, and how it scales.
struct Param {
  double* value;
  enum Kind { plain, fraction, slowdown } kind;
};

std::vector<std::pair<std::string, Param>> params_of(DeviceProfile& p) {
  std::vector<std::pair<std::string, Param>> v;
  for (auto& [t, f] : p.peak_flops)
    v.push_back({fmt::format("compute.peak_flops.{}", name_of(t)), {&f, Param::plain}});
  v.push_back({"compute.gemm.max_efficiency", {&p.gemm.max_efficiency, Param::fraction}});
  v.push_back(
      {"compute.gemm.half_efficiency_flops", {&p.gemm.half_efficiency_flops, Param::plain}});
  v.push_back(
      {"compute.gemm.unaligned_efficiency", {&p.gemm.unaligned_efficiency, Param::fraction}});
  v.push_back({"compute.attention_efficiency", {&p.attention_efficiency, Param::fraction}});
  v.push_back(
      {"compute.attention_row_overhead_keys", {&p.attention_row_overhead_keys, Param::plain}});
  v.push_back({"compute.attention_backward_efficiency",
               {&p.attention_backward_efficiency, Param::fraction}});
  v.push_back({"compute.kernel_min_ns", {&p.kernel_min_ns, Param::plain}});
  v.push_back({"compute.in_training_efficiency", {&p.in_training_efficiency, Param::fraction}});
  v.push_back({"memory.bandwidth_bytes_per_s", {&p.memory_bandwidth, Param::plain}});
  v.push_back(
      {"memory.in_training_efficiency", {&p.memory_in_training_efficiency, Param::fraction}});
  Topology& t = p.topology;
  if (!t.intra_switch)
    v.push_back({"topology.intra_node.per_peer_bytes_per_s", {&t.intra_per_peer, Param::plain}});
  v.push_back({"topology.intra_node.per_device_bytes_per_s", {&t.intra_per_device, Param::plain}});
  v.push_back({"topology.intra_node.latency_ns", {&t.intra_latency_ns, Param::plain}});
  if (t.multi_node) {
    v.push_back(
        {"topology.inter_node.per_device_bytes_per_s", {&t.inter_per_device, Param::plain}});
    v.push_back({"topology.inter_node.latency_ns", {&t.inter_latency_ns, Param::plain}});
    if (t.inter_efficiency > 0)
      v.push_back(
          {"topology.inter_node.bandwidth_efficiency", {&t.inter_efficiency, Param::fraction}});
  }
  for (auto& [name, a] : p.algorithms) {
    v.push_back({"collectives." + name + ".step_latency_ns", {&a.step_latency_ns, Param::plain}});
    v.push_back({"collectives." + name + ".bandwidth_efficiency",
                 {&a.bandwidth_efficiency, Param::fraction}});
  }
  v.push_back({"host.launch_overhead_ns", {&p.launch_overhead_ns, Param::plain}});
  v.push_back({"host.fused_launch_overhead_ns", {&p.fused_launch_overhead_ns, Param::plain}});
  v.push_back({"contention.compute_slowdown", {&p.contention.compute_slowdown, Param::slowdown}});
  v.push_back({"contention.comm_slowdown", {&p.contention.comm_slowdown, Param::slowdown}});
  v.push_back({"fused.step_overhead_ns", {&p.fused.step_overhead_ns, Param::plain}});
  v.push_back({"fused.gather_steps.step_bytes", {&p.fused.gather.step_bytes, Param::plain}});
  v.push_back({"fused.reduce_steps.step_bytes", {&p.fused.reduce.step_bytes, Param::plain}});
  v.push_back({"compute.kernel_overhead_ns", {&p.kernel_overhead_ns, Param::plain}});
  return v;
}
}  // namespace

bool DeviceProfile::has_tp_overlap(const std::string& mechanism) const {
  return std::find(tp_overlap.begin(), tp_overlap.end(), mechanism) != tp_overlap.end();
}

std::vector<std::string> DeviceProfile::scalable_keys() const {
  DeviceProfile copy = *this;
  std::vector<std::string> keys;
  for (const auto& [key, param] : params_of(copy))
    keys.push_back(key);
  return keys;
}

double DeviceProfile::value(const std::string& key) const {
  DeviceProfile copy = *this;
  for (const auto& [k, param] : params_of(copy))
    if (k == key) return *param.value;
  COCEMU_FAIL(Errc::invalid_argument, "profile '{}' has no parameter '{}'; allowed: {}", name, key,
              fmt::join(scalable_keys(), ", "));
}

DeviceProfile DeviceProfile::scaled(const std::string& key, double factor) const {
  DeviceProfile copy = *this;
  for (auto& [k, param] : params_of(copy)) {
    if (k != key) continue;
    double& x = *param.value;
    switch (param.kind) {
      case Param::plain:
        x *= factor;
        break;
      case Param::fraction:
        x = std::min(1.0, x * factor);
        break;
      case Param::slowdown:
        x = 1.0 + (x - 1.0) * factor;
        break;
    }
    if (key.starts_with("topology.intra_node.per_") && !copy.topology.intra_switch) {
      // Keep a mesh consistent: the device total is at least one peer link.
      copy.topology.intra_per_device =
          std::max(copy.topology.intra_per_device, copy.topology.intra_per_peer);
    }
    if (copy.topology.intra_switch) copy.topology.intra_per_peer = copy.topology.intra_per_device;
    // The shared memory of the contention model is the device memory.
    if (copy.contention.memory_bytes_per_ns > 0)
      copy.contention.memory_bytes_per_ns = copy.memory_bandwidth / 1e9;
    return copy;
  }
  COCEMU_FAIL(Errc::invalid_argument, "profile '{}' has no parameter '{}'; allowed: {}", name, key,
              fmt::join(scalable_keys(), ", "));
}

DeviceProfile load_device_profile(const std::string& path) {
  return parse_device_profile(read_profile_file(path), path);
}

DeviceProfile load_named_profile(const std::string& name) {
  const std::string path = profile_path(name);
  if (!is_config_path(name)) {
    std::error_code ec;
    const std::string dir = std::filesystem::path(path).parent_path().string();
    COCEMU_CHECK_ARG(std::filesystem::exists(path, ec), "unknown device profile '{}' (no {}); {}",
                     name, path, valid_names_hint(name, yaml_names_in(dir), dir));
  }
  return load_device_profile(path);
}

}  // namespace cocemu
