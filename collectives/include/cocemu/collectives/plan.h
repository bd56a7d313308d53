#pragma once
/// Collective algorithms as plans. Each algorithm is written once, as a list of rounds of steps
/// (copy or reduce between buffers of group members); the executor runs a rank's steps round by
/// round with a group barrier between rounds, and the cost model prices the very same plan
/// (α per round plus the bytes each link carries ÷ its bandwidth). There is no second copy of the
/// algorithm inside the cost model.
#include <cstdint>
#include <string>
#include <vector>

#include "cocemu/runtime/dtype.h"
#include "cocemu/runtime/profile.h"

namespace cocemu {

enum class CollOp : std::uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  reduce,
  gather,
  scatter,
  all_to_all,
  barrier,
};
const char* to_string(CollOp op);

enum class ReduceOp : std::uint8_t { sum, avg, max, min, prod };
const char* to_string(ReduceOp op);

/// hierarchical: for groups spanning nodes, intra-node reduce-scatter, an inter-node all-reduce
/// among the members with the same local index, intra-node all-gather (NCCL's and HCCL's
/// multi-node all_reduce); tree: for groups spanning nodes, a reduction to each node's first
/// member, up and down a tree over the nodes, and a copy to the node (NCCL's tree, for small
/// multi-node all_reduces). Both fall back to the ring for other ops; in deterministic mode the
/// hierarchical plan falls back to the direct plan, the tree to the ring (both rank-ordered).
enum class Algorithm : std::uint8_t { automatic, ring, direct, hierarchical, tree };
const char* to_string(Algorithm a);
Algorithm parse_algorithm(const std::string& s);

/// A buffer of one member: its input, its output, or its scratch (accumulation dtype).
enum class Buf : std::uint8_t { in, out, scratch };

struct BufRef {
  int rank = 0;  ///< group rank owning the buffer
  Buf buf = Buf::in;
  std::int64_t offset = 0;  ///< in elements of that buffer
};

struct Step {
  enum Kind : std::uint8_t { copy, reduce } kind = copy;
  int actor = 0;             ///< group rank that executes the step
  std::vector<BufRef> srcs;  ///< reduce: combined in this order
  std::vector<BufRef> dsts;  ///< the result is written to each
  std::int64_t count = 0;    ///< elements
  bool finalize = false;     ///< last reduction of these elements (avg divides here)
};

struct Plan {
  CollOp op = CollOp::barrier;
  Algorithm algorithm = Algorithm::direct;
  std::vector<std::vector<Step>> rounds;
  std::int64_t scratch_elems = 0;  ///< per member, in the accumulation dtype
};

/// Everything that defines one collective call's data movement.
struct PlanRequest {
  CollOp op = CollOp::barrier;
  Algorithm algorithm = Algorithm::direct;  ///< ring or direct (already resolved)
  int n = 1;                                ///< group size
  std::int64_t count = 0;  ///< per-op element count, see ops.h for each op's meaning
  int root = 0;
  bool deterministic = true;
  /// all_to_all only: send_counts[r][p] = elements rank r sends to p (empty = equal split).
  std::vector<std::vector<std::int64_t>> send_counts;
  /// hierarchical and tree: the node of each member (empty: one node).
  std::vector<int> nodes;
};

Plan build_plan(const PlanRequest& request);

// Per-algorithm builders (collectives/src/algorithms/*.cpp).
Plan build_direct_plan(const PlanRequest& request);
Plan build_ring_plan(const PlanRequest& request);
Plan build_hierarchical_plan(const PlanRequest& request);
Plan build_tree_plan(const PlanRequest& request);

/// Modeled cost of a plan: total and per round (ns at full speed).
struct PlanCost {
  double total_ns = 0;
  std::vector<double> round_ns;
  std::uint64_t max_link_bytes = 0;    ///< bytes the busiest rank sends over links
  std::vector<std::uint8_t> link_use;  ///< per member: the links it uses (LinkUse bits)
};
/// Prices a plan on the profile's topology: every transfer on the link it crosses (a peer link
/// or switch port inside a node, the NICs between nodes), transfers of a round that share a link
/// or NIC sharing its bandwidth. `world_ranks` places the members (group rank i is world rank
/// world_ranks[i]); empty puts them all on one node.
PlanCost price_plan(const Plan& plan, const DeviceProfile& profile, DType dtype,
                    const std::vector<int>& world_ranks = {});

/// What the emulator charges one collective call on a group placed at `world_ranks` (the
/// algorithm `algo` — automatic: the profile's table for the size and whether the group spans
/// nodes, where a `cheapest` rule prices each candidate's plan for this call and keeps the
/// cheapest —, its plan and its price), without running it. `enqueue` prices every call this way,
/// so a dry run can price a representative group of a large world without its threads.
struct ModeledCollective {
  Plan plan;
  PlanCost cost;
};
/// A ring or direct plan has a step for every member and segment, n · min(n, count) per phase:
/// build_plan refuses larger ones (a ring of a large buffer over more than 2048 members) with an
/// Errc::too_large error, instead of building a plan that would not fit in memory.
constexpr double kMaxFlatPlanSteps = 2048.0 * 2048.0;
ModeledCollective model_collective(const DeviceProfile& profile, CollOp op,
                                   const std::vector<int>& world_ranks, std::int64_t count,
                                   DType dtype, std::uint64_t size_bytes, Algorithm algo,
                                   bool deterministic, int root = 0);
/// The same for a whole request (its algorithm may be automatic; `nodes` places the members,
/// `size_bytes` selects the auto rule), e.g. an all_to_all with explicit split sizes.
ModeledCollective model_plan(const DeviceProfile& profile, PlanRequest request, DType dtype,
                             std::uint64_t size_bytes, const std::vector<int>& world_ranks);

/// Segment s of `count` elements split into n near-equal parts (the first count % n one longer).
std::int64_t segment_offset(std::int64_t count, int n, int s);
std::int64_t segment_length(std::int64_t count, int n, int s);

}  // namespace cocemu
