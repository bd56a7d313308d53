// Collective calls on a group whose members live on several hosts (cross_host.h).
#include "cross_host.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>

#include "cocemu/runtime/error.h"

namespace cocemu::detail {

namespace {

std::string call_key(const World& world, const GroupState& gs, std::uint64_t seq, int member) {
  return world.host_key(fmt::format("call/{}/{}/{}", gs.key, seq, member));
}

Bytes encode(const HostContribution& c) {
  ByteWriter w;
  w.put(c.sig).put<std::uint8_t>(c.in != nullptr).put(c.in_bytes);
  w.put<std::uint8_t>(c.out != nullptr).put<std::uint8_t>(c.out != nullptr && c.out == c.in);
  w.put(c.out_bytes).put_vector(c.send_counts).put_vector(c.recv_counts);
  if (c.in) w.align(64).put_bytes(c.in, c.in_bytes);
  return w.take();
}

std::shared_ptr<HostCall> host_call(GroupState& gs, std::uint64_t seq) {
  std::lock_guard lock(gs.host_calls_mu);
  auto& slot = gs.host_calls[seq];
  if (!slot) slot = std::make_shared<HostCall>();
  return slot;
}

/// Puts remote member `j`'s contribution (`message`, kept in `call`) into its slot for `seq`.
void publish_remote(GroupState& gs, int j, std::uint64_t seq, HostCall& call, Bytes message,
                    std::size_t scratch_bytes) {
  call.staging.push_back(std::move(message));
  const Bytes& m = call.staging.back();
  ByteReader r(m, fmt::format("call {} on group {} from group rank {}", seq, gs.name, j));
  CallSlot& slot = gs.members[std::size_t(j)].slots[slot_of(seq)];
  slot.sig = r.get<CallSignature>();
  const bool has_in = r.get<std::uint8_t>();
  const auto in_bytes = r.get<std::uint64_t>();
  const bool has_out = r.get<std::uint8_t>();
  const bool in_place = r.get<std::uint8_t>();
  const auto out_bytes = r.get<std::uint64_t>();
  slot.send_counts = r.get_vector<std::int64_t>();
  slot.recv_counts = r.get_vector<std::int64_t>();
  // The plan reads a remote input where it arrived; nothing writes it but an in-place call.
  if (has_in) r.align(64);
  slot.in = has_in ? const_cast<std::byte*>(r.take(in_bytes)) : nullptr;
  slot.out = nullptr;
  if (has_out && in_place) {
    slot.out = slot.in;
  } else if (has_out) {
    call.buffers.emplace_back(out_bytes);
    slot.out = call.buffers.back().data();
  }
  call.buffers.emplace_back(scratch_bytes);
  slot.scratch = call.buffers.back().data();
  slot.seq.store(seq, std::memory_order_release);
}

/// "world ranks 1 and 3 on host 0, world rank 5 on host 2": the members the call waits for.
std::string remote_members(const World& world, const GroupState& gs) {
  std::map<int, std::vector<int>> by_host;
  for (const int r : gs.ranks)
    if (world.host_of(r) != world.hosts()->host()) by_host[world.host_of(r)].push_back(r);
  std::string out;
  for (const auto& [h, ranks] : by_host) {
    if (!out.empty()) out += ", ";
    out += fmt::format("world rank{} {} on host {}", ranks.size() == 1 ? "" : "s",
                       fmt::join(ranks, ranks.size() == 2 ? " and " : ", "), h);
  }
  return out;
}

}  // namespace

bool spans_hosts(const World& world, const std::vector<int>& ranks) {
  if (!world.hosts()) return false;
  return std::any_of(ranks.begin(), ranks.end(),
                     [&](int r) { return world.host_of(r) != world.host_of(ranks.front()); });
}

void run_cross_host(World& world, GroupState& gs, int me, std::uint64_t seq,
                    const HostContribution& mine, std::size_t scratch_bytes,
                    const std::function<void()>& compute) {
  HostLink& link = *world.hosts();
  const int here = link.host();
  std::set<int> other_hosts;
  int local = 0;
  for (const int r : gs.ranks) {
    const int h = world.host_of(r);
    if (h == here)
      ++local;
    else
      other_hosts.insert(h);
  }
  const Bytes message = encode(mine);
  for (const int h : other_hosts)
    link.send(h, call_key(world, gs, seq, me), message);
  const std::shared_ptr<HostCall> call = host_call(gs, seq);
  if (call->arrived.add(1) != std::uint32_t(local)) {
    call->done.wait_geq(1, [&] {
      return fmt::format(
          "the member of group {} on this host that joins {} last to run it "
          "with {}",
          gs.name, describe(mine.sig, seq), remote_members(world, gs));
    });
    return;
  }
  // Every member here has joined: run the call for all of them.
  for (int j = 0; j < gs.size(); ++j) {
    const int w = gs.ranks[std::size_t(j)];
    if (world.host_of(w) == here) continue;
    Bytes theirs = link.receive(call_key(world, gs, seq, j), [&] {
      return fmt::format("group rank {} (world rank {} on host {}) to join {} on group {}", j, w,
                         world.host_of(w), describe(mine.sig, seq), gs.name);
    });
    publish_remote(gs, j, seq, *call, std::move(theirs), scratch_bytes);
  }
  try {
    compute();
  } catch (...) {
    world.keep_alive(call);  // a peer here may still read the staging while the failure spreads
    throw;
  }
  {
    std::lock_guard lock(gs.host_calls_mu);
    gs.host_calls.erase(seq);
  }
  call->done.add(1);
}

}  // namespace cocemu::detail
