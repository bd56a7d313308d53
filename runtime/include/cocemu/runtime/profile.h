#pragma once
/// Device profiles: the numbers the cost model prices ops with (peak FLOP/s, GEMM efficiency,
/// memory and link bandwidth, per-algorithm collective latencies, host launch overheads,
/// compute/comm contention). Loaded from YAML under `configs/devices/`, parsed strictly: unknown
/// keys, missing keys and out-of-range values are errors naming file:line.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cocemu/runtime/dtype.h"
#include "cocemu/runtime/graph.h"

namespace cocemu {

struct GemmEfficiency {
  double max_efficiency = 1.0;          ///< fraction of peak a large, aligned GEMM reaches
  double half_efficiency_flops = 0.0;   ///< GEMM size (2·m·n·k) at which it reaches half of that
  std::uint32_t alignment_bytes = 512;  ///< rows of both operands aligned to this run at full speed
  double unaligned_efficiency = 1.0;    ///< multiplier for unaligned operands
};

struct CollectiveAlgorithmCost {
  double step_latency_ns = 0;         ///< α: fixed cost of one step (one round of the plan)
  double bandwidth_efficiency = 1.0;  ///< fraction of link bandwidth the algorithm achieves
};

struct AlgorithmRule {
  double max_bytes = 0;  ///< applies to messages up to this size per rank (inclusive)
  std::string algorithm;
};

struct DeviceProfile {
  std::string name;
  std::string source;  ///< file it was loaded from
  int ranks_per_node = 8;
  std::map<DType, double> peak_flops;  ///< dense FLOP/s per device and dtype
  GemmEfficiency gemm;
  double kernel_min_ns = 0;            ///< shortest possible kernel
  double memory_bandwidth = 1;         ///< bytes/s of device memory
  double link_per_peer_bandwidth = 1;  ///< bytes/s from one rank to one peer (one direction)
  double link_per_rank_bandwidth = 1;  ///< bytes/s a rank can send (and receive) in total
  double link_latency_ns = 0;
  std::map<std::string, CollectiveAlgorithmCost> algorithms;  ///< "ring", "direct"
  std::vector<AlgorithmRule> auto_rules;                      ///< ordered by max_bytes
  double launch_overhead_ns = 0;        ///< host cost of one script-side op launch
  double fused_launch_overhead_ns = 0;  ///< host cost of launching one fused kernel
  ContentionModel contention;

  double peak(DType t) const;
  /// The algorithm the auto rule table picks for a message of `bytes` per rank.
  const std::string& auto_algorithm(std::uint64_t bytes) const;
};

/// Parses a profile; `origin` names the text in error messages (a file path or "<string>").
DeviceProfile parse_device_profile(const std::string& yaml_text, const std::string& origin);
DeviceProfile load_device_profile(const std::string& path);

/// Directory of the shipped configs: `COCEMU_CONFIG_DIR` from the environment, else the source
/// tree's `configs/`.
std::string config_dir();
/// Loads `configs/devices/<name>.yaml` (or a path, if `name_or_path` contains a '/' or ends in
/// .yaml).
DeviceProfile load_named_profile(const std::string& name_or_path);

}  // namespace cocemu
