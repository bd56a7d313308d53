#pragma once
/// The modeled device timeline. While a program runs, every op (kernel, collective, copy, host
/// launch, wait) is recorded with its dependencies and its cost at full speed. Because ops are
/// recorded by each rank's host thread in program order, the graph does not depend on how threads
/// were scheduled; `simulate` then computes every op's modeled start and end from the graph alone:
///  - an op starts no earlier than the previous op on its lane (stream or host), its dependencies
///    (events waited on, its host launch) and, for collectives, every participant (rendezvous);
///  - a collective (all ops sharing a rendezvous key) starts and ends at the same time on all
///  ranks;
///  - compute and comm running at once on one rank slow each other by the profile's contention
///    factors; several compute ops on a rank share it equally, and so do comm ops that use a
///    common link direction (a send and a receive do not: links are full duplex).
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cocemu/runtime/stable_log.h"

namespace cocemu {

enum class OpClass : std::uint8_t {
  host,     ///< host-side launch work (advances the host clock)
  compute,  ///< a kernel on a compute engine
  comm,     ///< a collective or transfer on the links
  fused,    ///< a fused compute+comm kernel (its pipeline is priced inside its cost)
  wait,     ///< waits for dependencies; no work of its own
};
const char* to_string(OpClass c);

/// Named parts of an op's modeled time (collective rounds, pipeline steps) and their durations.
/// Shared and immutable: every call of one collective shape points to its plan's rounds.
using Phases = std::vector<std::pair<std::string, double>>;

/// Identifies one recorded op: its rank and its index in that rank's record.
struct OpRef {
  int rank = -1;
  std::uint32_t index = 0;
  bool valid() const { return rank >= 0; }
  bool operator==(const OpRef&) const = default;
};

/// Ops that must run as one transfer: every op carrying `key` starts together; exactly `members`
/// ops must carry it (a collective: one per group member; a send/recv pair: two).
struct Rendezvous {
  std::string key;
  int members = 2;
};

/// Which of its rank's links a comm op uses: the intra-node fabric and the NIC, each in two
/// directions. Links are full duplex and the fabric and the NIC are separate hardware: comm ops
/// share a rank's bandwidth only where they use a common link direction (a send and a receive,
/// or an intra-node and an inter-node transfer, run side by side at full speed).
enum LinkUse : std::uint8_t {
  kIntraOut = 1,
  kIntraIn = 2,
  kInterOut = 4,
  kInterIn = 8,
  kLinkAll = 15,
};

struct OpRecord {
  int rank = 0;
  int lane = 0;  ///< 0 = host, 1.. = streams in creation order
  std::uint32_t index = 0;
  OpClass cls = OpClass::compute;
  std::string name;
  double work_ns = 0;  ///< duration at full speed, from the cost model
  std::vector<OpRef> deps;
  std::vector<Rendezvous> rendezvous;  ///< ops sharing a key run as one collective
  std::uint64_t bytes = 0;
  std::uint64_t flops = 0;
  /// Device-memory traffic (reads plus writes) of the op at full speed: what it takes of the
  /// memory bandwidth its rank's running ops share (ContentionModel::memory_bytes_per_ns).
  std::uint64_t hbm_bytes = 0;
  std::uint8_t link_use = kLinkAll;  ///< comm ops: the links used (LinkUse bits)
  /// e.g. a collective's group, algorithm and dtype: shared by the calls that have the same, so
  /// recording one copies no string (op_detail renders it with `seq`).
  std::shared_ptr<const std::string> detail;
  std::int64_t seq = -1;                 ///< collectives: the call's sequence number in its group
  std::shared_ptr<const Phases> phases;  ///< null: none
  /// Fused ops: the compute and the comm work inside (their pipeline overlaps them).
  double inner_compute_ns = 0, inner_comm_ns = 0;
  std::string segment;  ///< the program region it belongs to (Rank::set_segment), or empty
  std::int64_t wall_start_ns = -1;  ///< host wall clock, filled by the stream worker
  std::int64_t wall_end_ns = -1;
};

struct RankGraph {
  StableLog<OpRecord> ops;  ///< stable addresses while the host appends
  std::vector<std::string> lane_names{"host"};
};

struct ModelGraph {
  std::vector<RankGraph> ranks;
  const OpRecord& op(OpRef r) const { return ranks[r.rank].ops[r.index]; }
};

/// The op's detail with its sequence number ("group tp0 algo ring dtype bf16 seq 12"), or "".
std::string op_detail(const OpRecord& op);

/// How ops running at the same time on one device slow each other. Two parts:
///  - the units a kernel holds: compute runs 1/compute_slowdown as fast while a comm kernel runs
///    on its rank (the cores a collective library's kernels occupy), comm 1/comm_slowdown as fast
///    while compute runs (its engines' share of the on-chip paths);
///  - the device memory they share: each running op asks for its traffic over its duration
///    (OpRecord::hbm_bytes / work_ns at full speed, a fraction of memory_bytes_per_ns); while
///    the requests of a rank's running ops add up to D > 1 of the bandwidth, each of those ops
///    gets its share and runs 1/D as fast. This part grows with what runs: two transfers beside a
///    memory-bound kernel slow it more than one does, a compute-bound GEMM's small request leaves
///    a transfer alone.
struct ContentionModel {
  double compute_slowdown = 1.0;   ///< compute runs 1/x as fast while comm is active on its rank
  double comm_slowdown = 1.0;      ///< comm runs 1/x as fast while compute is active on its rank
  double memory_bytes_per_ns = 0;  ///< the shared device-memory bandwidth (0: not modeled)
};

/// Time for a compute task and a comm task of `compute_ns` and `comm_ns` (at full speed) that
/// start together on one rank: each runs slowed by the other's contention factor until the
/// shorter one ends, then the other finishes at full speed — the rule `simulate` applies to
/// overlapping ops, for pipelines priced inside one op (fused kernels). `compute_hbm_bytes` and
/// `comm_hbm_bytes` are their memory traffic: while both run, requests beyond the memory
/// bandwidth slow both further by their sum over it (ContentionModel).
double overlapped_ns(double compute_ns, double comm_ns, const ContentionModel& contention,
                     double compute_hbm_bytes = 0, double comm_hbm_bytes = 0);

struct ScheduledOp {
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
};

/// Modeled start and end of every op of a graph.
class Timeline {
 public:
  Timeline() = default;
  Timeline(std::vector<std::vector<ScheduledOp>> times) : times_(std::move(times)) {}
  const ScheduledOp& at(OpRef r) const { return times_[r.rank][r.index]; }
  const std::vector<ScheduledOp>& rank(int r) const { return times_[r]; }
  int n_ranks() const { return int(times_.size()); }
  /// Latest end over all ops (0 for an empty graph).
  std::int64_t makespan_ns() const;

 private:
  std::vector<std::vector<ScheduledOp>> times_;
};

/// Computes the modeled schedule. Throws `Errc::mismatch` if a rendezvous did not get all its
/// participants, and `Errc::invalid_argument` if ops wait on each other in a cycle (a program
/// that would deadlock on the real system, e.g. unbatched isend/irecv in a ring), naming the
/// cycle op by op.
Timeline simulate(const ModelGraph& graph, const ContentionModel& contention);

}  // namespace cocemu
