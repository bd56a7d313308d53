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
  /// hierarchical only: how the node peers exchange between nodes, which sets the steps (α) of
  /// that phase for N nodes: a ring, 2·(N − 1) (NCCL), or recursive halving-doubling,
  /// 2·⌈log₂ N⌉ (HCCL's H-D_R, and its NHR and NB, which are logarithmic too).
  enum class InterNode : std::uint8_t { ring, halving_doubling } inter_node = InterNode::ring;
};

/// The cluster a profile describes: nodes of `devices_per_node` devices; inside a node a full
/// mesh of per-peer links (Ascend HCCS) or a switch (NVSwitch), between nodes one NIC per device
/// (rail-optimised RoCE or InfiniBand). World rank r sits on node r / devices_per_node.
/// Bandwidths are bytes/s in one direction; links are full duplex.
struct Topology {
  int devices_per_node = 8;
  bool intra_switch = false;    ///< switch: any peer can use the device's whole port
  double intra_per_peer = 1;    ///< mesh: one peer link; switch: = intra_per_device
  double intra_per_device = 1;  ///< all of a device's intra-node traffic
  double intra_latency_ns = 0;  ///< one hop inside a node
  bool multi_node = false;      ///< an inter-node network is described
  double inter_per_device = 1;  ///< one device's NIC
  double inter_latency_ns = 0;  ///< one hop between nodes
  /// The fraction of the NIC's rate a collective's transfers reach; 0: the algorithm's
  /// bandwidth_efficiency, as on the links inside a node.
  double inter_efficiency = 0;
  int node_of(int world_rank) const { return world_rank / devices_per_node; }
  /// Bandwidth of the path from world rank a to b (peer link or NIC).
  double path_bandwidth(int a, int b) const {
    return node_of(a) == node_of(b) ? intra_per_peer : inter_per_device;
  }
  double path_latency_ns(int a, int b) const {
    return node_of(a) == node_of(b) ? intra_latency_ns : inter_latency_ns;
  }
};

/// Fused matmul-communication kernels as the vendor's kernels run them (`fused:` in a profile;
/// absent: none of these costs). A fused kernel cuts its matmul into steps whose transfers
/// overlap the next step's matmul; each step pays a fixed cost, and the in-kernel transfers run
/// slower while the matmul runs, more so when the matmul's working set overflows the L2 cache
/// or its k and n are large (Ascend's MC2 tiling model).
struct FusedKernelCost {
  double step_overhead_ns = 0;  ///< fixed cost of one step (flag handshakes, task hand-off)
  /// How one kind of kernel cuts its matmul into steps, for pricing (none given: the kernel
  /// options' tiling): steps of about step_bytes of communicated rows per rank, one step per
  /// rank of the group (a ring exchange), or `count` steps; and the matmul's slowdown while the
  /// kernel runs (the compute units its transfers take).
  struct Steps {
    double step_bytes = 0;
    bool ring = false;
    int count = 0;
    double compute_slowdown = 1;
    /// Each step's matmul is a GEMM of its own (Transformer Engine's split GEMMs), priced at its
    /// size; otherwise the steps share one kernel's matmul at the whole product's efficiency.
    bool separate_gemms = false;
  };
  Steps gather;         ///< ALL_GATHER_MATMUL
  Steps reduce;         ///< MATMUL_REDUCE_SCATTER and MATMUL_ALL_REDUCE
  int cube_cores = 0;   ///< matrix cores the matmul's blocks spread over (0: no L2 rule)
  double l2_bytes = 0;  ///< the L2 budget of the matmul's working set
  /// In-kernel transfers' extra slowdown (beyond contention.comm_slowdown) while the matmul
  /// runs: when its working set overflows l2_bytes, or else when k >= large_k and n > large_n.
  /// Index 0: gathers (ALL_GATHER_MATMUL), 1: reductions (MATMUL_REDUCE_SCATTER); the
  /// all-reduce kernel has no shape rule.
  double l2_overflow_slowdown[2] = {1, 1};
  double large_kn_slowdown[2] = {1, 1};
  std::int64_t large_k = 0, large_n = 0;
};

struct AlgorithmRule {
  double max_bytes = 0;   ///< applies to messages up to this size per rank (inclusive)
  std::string algorithm;  ///< the algorithm, or empty for a priced choice
  /// `cheapest: [...]`: the candidate whose plan prices lowest for the call (as NCCL's tuner
  /// picks by its cost model), ties to the first listed.
  std::vector<std::string> cheapest;
};

struct DeviceProfile {
  std::string name;
  std::string source;  ///< file it was loaded from
  Topology topology;
  std::map<DType, double> peak_flops;  ///< dense FLOP/s per device and dtype
  GemmEfficiency gemm;
  /// Flash attention's efficiency relative to a GEMM of its size (softmax and its rescaling
  /// share the cores with the matmuls).
  double attention_efficiency = 1.0;
  /// Per query row, a flash-attention kernel pays a fixed cost (loading the Q block, the final
  /// rescale, writing O and its log-sum-exp) worth this many keys of its loop: a kernel whose
  /// rows each visit L keys runs at L / (L + overhead) of the long-row efficiency. 0: none.
  double attention_row_overhead_keys = 0;
  /// The backward kernel's efficiency relative to the forward's (it recomputes the scores and
  /// accumulates dK, dV and dQ with more synchronisation).
  double attention_backward_efficiency = 1.0;
  /// The fraction of its isolated-kernel compute rate (GEMM, attention) a kernel sustains inside
  /// a training step: what a step's published time says the kernels run at beside each other,
  /// under sustained load, against the rates measured one kernel at a time. 1: the isolated
  /// rate. `validate` prices its isolated-kernel references with 1.
  double in_training_efficiency = 1.0;
  double kernel_min_ns = 0;  ///< shortest possible kernel
  /// Added to every memory-bound kernel's time: the cycle of back-to-back launches on one stream
  /// (a kernel's start-up and drain), which bounds how fast small kernels follow each other.
  /// GEMM and attention kernels hold theirs in their efficiency curves. 0: none.
  double kernel_overhead_ns = 0;
  double memory_bandwidth = 1;  ///< bytes/s of device memory
  /// The fraction of memory_bandwidth a memory-bound kernel sustains inside a training step
  /// (as in_training_efficiency for compute). 1: the isolated streaming rate.
  double memory_in_training_efficiency = 1.0;
  double memory_capacity = 0;  ///< bytes of device memory (0: not given; memory verdicts say so)
  std::map<std::string, CollectiveAlgorithmCost> algorithms;  ///< "ring", "direct", …
  std::vector<AlgorithmRule> auto_rules;                      ///< ordered by max_bytes
  std::vector<AlgorithmRule> auto_rules_multi_node;  ///< groups spanning nodes (default: auto)
  double launch_overhead_ns = 0;                     ///< host cost of one script-side op launch
  double fused_launch_overhead_ns = 0;               ///< host cost of launching one fused kernel
  ContentionModel contention;
  FusedKernelCost fused;
  /// Dotted keys of the numbers no public source pins down (`assumptions:` in the YAML), each a
  /// key `scaled` accepts; sensitivity analyses scale them one at a time.
  std::vector<std::string> assumptions;
  /// The TP communication overlap the platform's training software offers (`tp_overlap:`), as
  /// the framework names it: "mindspeed_coc" (MindSpeed's script-side CoC: --use-ascend-coc,
  /// --coc-parallel-num and customized_coc), "lcoc_fused" (Ascend's LCOC fused kernels,
  /// --coc-fused-kernel) and "te_userbuffers" (Megatron-LM's --tp-comm-overlap on Transformer
  /// Engine's userbuffers). Empty: none (the key absent). `cocemu plan` searches only these, and
  /// `cocemu train` refuses a platform flag whose mechanism is not listed.
  std::vector<std::string> tp_overlap;
  bool has_tp_overlap(const std::string& mechanism) const;

  double peak(DType t) const;
  /// A copy with the parameter at dotted `key` (e.g. "host.launch_overhead_ns",
  /// "collectives.ring.bandwidth_efficiency", "compute.peak_flops.bf16") multiplied by `factor`.
  /// Fractions (efficiencies) are capped at 1; contention factors scale their excess over 1.
  DeviceProfile scaled(const std::string& key, double factor) const;
  /// Every key `scaled` accepts for this profile.
  std::vector<std::string> scalable_keys() const;
  /// The value of the parameter at dotted `key` (one `scaled` accepts).
  double value(const std::string& key) const;
  /// The auto table's rule for a message of `bytes` per rank, for a group inside one node or
  /// spanning nodes (collectives' model_plan applies it).
  const AlgorithmRule& auto_rule(std::uint64_t bytes, bool multi_node = false) const;
  /// Throws a clear error if a world of `n_ranks` needs an inter-node network the profile lacks.
  void check_world(int n_ranks) const;
};

/// Parses a profile; `origin` names the text in error messages (a file path or "<string>").
/// A profile with `base: <name or path>` is that profile with this one's keys over it (mappings
/// merge key by key; a number, string or list replaces the base's); it must give its own `name`.
/// A base given by path is relative to `origin`'s directory; a chain deeper than 4 is an error.
DeviceProfile parse_device_profile(const std::string& yaml_text, const std::string& origin);
DeviceProfile load_device_profile(const std::string& path);

/// Directory of the shipped configs: `COCEMU_CONFIG_DIR` from the environment if set; else, for
/// an installed program or library (`<prefix>/bin`, `<prefix>/lib…`, the Python module), its
/// prefix's `share/cocemu`; else, for a program of the build tree, the source tree's `configs/`.
/// Throws if none applies, naming where the code lives.
std::string config_dir();
/// Loads `configs/devices/<name>.yaml` (or a path, if `name_or_path` contains a '/' or ends in
/// .yaml).
DeviceProfile load_named_profile(const std::string& name_or_path);

}  // namespace cocemu
