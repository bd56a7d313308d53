#pragma once
// Shared state of one process group (private to collectives/).
#include <array>
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "cocemu/collectives/plan.h"
#include "cocemu/runtime/hosts.h"
#include "cocemu/runtime/sync.h"
#include "cocemu/runtime/world.h"

namespace cocemu::detail {

/// What a rank says it is calling; ranks must agree on all of it.
struct CallSignature {
  CollOp op = CollOp::barrier;
  DType dtype = DType::f32;
  std::int64_t count = 0;
  int root = 0;
  ReduceOp reduce_op = ReduceOp::sum;
  Algorithm algorithm = Algorithm::direct;
  bool deterministic = true;
  bool operator==(const CallSignature&) const = default;
};
std::string describe(const CallSignature& s, std::uint64_t seq);

/// Calls a member may have joined and not finished: a stream keeps up to kSplitWindow small calls
/// started (Stream::launch_split), so call s's slot is reused by call s + kCallSlots only after s
/// is done.
constexpr std::size_t kCallSlots = std::size_t(Stream::kSplitWindow);
inline std::size_t slot_of(std::uint64_t seq) {
  return std::size_t(seq % kCallSlots);
}

/// One member's published view of a call: written before the entry barrier, read by peers after.
struct CallSlot {
  std::atomic<std::uint64_t> seq{~0ull};
  CallSignature sig;
  std::byte* in = nullptr;
  std::byte* out = nullptr;
  std::byte* scratch = nullptr;
  /// A small call's scratch (runs_fast), owned by its slot: the member may publish its next small
  /// calls while a peer still runs this one, so they cannot share (and regrow) one buffer.
  std::vector<std::byte> small_scratch;
  std::vector<std::int64_t> send_counts;  // all_to_all with splits (elements)
  std::vector<std::int64_t> recv_counts;
};

struct Message {
  Bytes data;  ///< a buffer of the message cache: a repeated send lands in pages already touched
  DType dtype = DType::f32;
  std::int64_t count = 0;
  int tag = 0;
  std::uint64_t index = 0;
  bool delivered = false;  ///< copied straight into the posted receive: `data` is empty
};

/// A receive waiting for its message: a send that matches it copies into `dst` directly, under
/// the mailbox's lock, so a receive that gives up and withdraws it never races the copy.
struct PostedRecv {
  std::uint64_t index = 0;
  std::byte* dst = nullptr;
  DType dtype = DType::f32;
  std::int64_t count = 0;
  int tag = 0;
};

/// An ordered channel src -> dst for point-to-point messages.
struct Mailbox {
  std::mutex mu;
  std::deque<Message> queue;
  std::optional<PostedRecv> waiting;  ///< the receive of the next message, posted before it
  Counter posted;
};

/// A plan and its price, reused for repeated calls of the same shape (host side).
struct CachedPlan {
  Plan plan;
  PlanCost cost;
  Plan one_actor;  ///< small calls: `plan` merged for the last arriver (see executor.h)
  std::shared_ptr<const Phases> rounds;  ///< the trace's phases: each round's modeled time
  /// The calls' op detail ("group tp0 algo ring dtype bf16"), shared by every call of the plan.
  std::shared_ptr<const std::string> detail;
};

struct Member {
  std::array<CallSlot, kCallSlots> slots;  // by slot_of(sequence)
  std::vector<std::byte> scratch;
  std::uint64_t barriers = 0;    // barriers this member has passed (worker side)
  std::uint64_t fast_calls = 0;  // small calls completed by their last arriver (worker side)
  std::array<std::uint64_t, kCallSlots> joined{};  // calls joined, by slot (worker side)
  std::uint64_t host_seq = 0;                      // next collective sequence number (host side)
  Stream* stream = nullptr;  // where this member's ops run; null: its rank's comm stream
  std::vector<std::uint64_t> sends_to, recvs_from;  // p2p counters per peer (host side)
  std::vector<std::uint64_t> received_from;         // p2p counters per peer (worker side)
  std::map<std::pair<std::uint64_t, std::int64_t>, std::shared_ptr<const CachedPlan>> plans;
  std::int8_t multi_node = -1;  // whether the group spans nodes; -1: not yet looked up (host side)
};

struct HostCall;

struct GroupState {
  int id = 0;
  std::string name;
  std::string key;  // the world-shared key; unique per group
  /// A small number unique in the world, for the calls' rendezvous keys ("c3/1234": short enough
  /// for a string's inline buffer, so recording a call allocates nothing for its key).
  std::uint32_t rendezvous_id = 0;
  std::vector<int> ranks;  // world ranks by group rank
  std::vector<Member> members;
  Counter arrivals;   // group barrier
  Counter fast_done;  // small calls finished by their last arriving member
  /// Members joining calls, by slot_of(sequence): every call starts with a join. A member may
  /// join small calls up to s + kCallSlots − 1 before call s is done (Stream::launch_split),
  /// never call s + kCallSlots, so calls sharing a counter never overlap.
  std::array<Counter, kCallSlots> joins;
  std::vector<std::unique_ptr<Mailbox>> mailboxes;  // [src * n + dst]
  /// Members on more than one host (WorldOptions::hosts): calls run as hosts/cross_host.h says.
  bool spans_hosts = false;
  std::mutex host_calls_mu;
  std::map<std::uint64_t, std::shared_ptr<HostCall>> host_calls;  // by sequence, in progress

  GroupState(int id_, std::string name_, std::vector<int> ranks_);
  int size() const { return int(ranks.size()); }
  Mailbox& mailbox(int src, int dst) { return *mailboxes[std::size_t(src * size() + dst)]; }
  /// Member `me` arrives at its next barrier and waits for all (bounded).
  void barrier(int me, const std::function<std::string()>& what);
  /// Joins call `seq` without waiting. Returns the value of joins[slot_of(seq)] at which every
  /// member has joined it; `last` (if given): whether this member completed it.
  std::uint32_t join(int me, std::uint64_t seq, bool* last = nullptr);
};

}  // namespace cocemu::detail
