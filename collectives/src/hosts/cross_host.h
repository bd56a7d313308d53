#pragma once
// Collective calls on a group whose members live on several hosts (private to collectives/).
#include <functional>
#include <memory>

#include "../group_state.h"

namespace cocemu::detail {

/// One member's side of a call, as it crosses to the other hosts.
struct HostContribution {
  CallSignature sig;
  const std::byte* in = nullptr;  ///< null: no input (a dry run, a member without one)
  std::uint64_t in_bytes = 0;
  std::byte* out = nullptr;  ///< == in: in place
  std::uint64_t out_bytes = 0;
  std::vector<std::int64_t> send_counts, recv_counts;
};

/// What a group spanning hosts keeps per call in progress on this host.
struct HostCall {
  Counter arrived;                              // this host's members that joined
  Counter done;                                 // 1 once the call's steps have run here
  std::vector<Bytes> staging;                   // remote members' messages (their inputs)
  std::vector<std::vector<std::byte>> buffers;  // remote members' outputs and scratch
};

/// Runs call `seq` on member `me` (this host's) of a group whose members live on several hosts.
/// Every member sends its contribution (signature, sizes, input) to the group's other hosts; the
/// member that joins last on this host receives the remote members' contributions, publishes
/// them in their slots as if they were here (their inputs, and outputs and `scratch_bytes` of
/// scratch of their own), and calls `compute`, which runs every member's steps on this one thread
/// (merge_for_one_actor). The steps combine the same values in the same order as on one host, so
/// this host's outputs are bit for bit the same; the remote members' outputs computed here are
/// dropped (their own host computes them too). The others wait for it (bounded).
void run_cross_host(World& world, GroupState& gs, int me, std::uint64_t seq,
                    const HostContribution& mine, std::size_t scratch_bytes,
                    const std::function<void()>& compute);

/// Whether the group `ranks` (world ranks) has members on more than one host of `world`.
bool spans_hosts(const World& world, const std::vector<int>& ranks);

}  // namespace cocemu::detail
