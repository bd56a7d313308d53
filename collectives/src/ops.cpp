#include "cocemu/collectives/ops.h"

#include <algorithm>
#include <cstring>

#include "cocemu/runtime/error.h"
#include "executor.h"
#include "group_state.h"
#include "hosts/cross_host.h"

namespace cocemu {

namespace detail {
std::string describe(const CallSignature& s, std::uint64_t seq) {
  std::string out =
      fmt::format("{}(seq {}, dtype {}, count {}", to_string(s.op), seq, name_of(s.dtype), s.count);
  if (s.op == CollOp::broadcast || s.op == CollOp::reduce || s.op == CollOp::gather ||
      s.op == CollOp::scatter)
    out += fmt::format(", root {}", s.root);
  if (s.op == CollOp::all_reduce || s.op == CollOp::reduce_scatter || s.op == CollOp::reduce)
    out += fmt::format(", op {}", to_string(s.reduce_op));
  out += fmt::format(", algo {}{})", to_string(s.algorithm),
                     s.deterministic ? "" : ", nondeterministic");
  return out;
}
}  // namespace detail

using detail::CallSignature;
using detail::GroupState;

void Work::wait() const {
  if (rank_) rank_->current_stream().wait(end_);
}

void Work::synchronize() const {
  end_.synchronize();
}

namespace {

struct Call {
  CallSignature sig;
  Tensor in, out;
  std::uint64_t size_bytes = 0;                        // nccl-tests "size" of the call
  std::vector<std::int64_t> send_counts, recv_counts;  // all_to_all with splits, elements
};

std::size_t acc_size(DType t) {
  return t == DType::f64 ? 8 : 4;
}

void check_member(Group& g, const char* call) {
  COCEMU_CHECK_ARG(g.is_member(), "{} on rank {}: rank is not a member of group {} (size {})", call,
                   g.owner().id(), g.name(), g.size());
}

std::string where(Group& g, const char* call) {
  return fmt::format("{} on rank {} (group {} rank {} of {})", call, g.owner().id(), g.name(),
                     g.rank(), g.size());
}

void check_tensor(Group& g, const char* call, const char* what, const Tensor& t) {
  COCEMU_CHECK_ARG(t.defined(), "{}: {} tensor is undefined", where(g, call), what);
  COCEMU_CHECK_ARG(t.has_data() || !g.owner().numerics(),
                   "{}: {} tensor {} has no storage but numerics are on", where(g, call), what,
                   t.describe());
}

void check_same_dtype(Group& g, const char* call, const Tensor& in, const Tensor& out) {
  COCEMU_CHECK_ARG(in.dtype() == out.dtype(), "{}: input {} and output {} must have the same dtype",
                   where(g, call), in.describe(), out.describe());
}

/// Output either is the input, or does not overlap it.
void check_alias(Group& g, const char* call, const Tensor& in, const Tensor& out, bool allow_same) {
  if (!in.has_data() || !out.has_data() || !in.overlaps(out)) return;
  const bool same = in.raw() == out.raw() && in.nbytes() == out.nbytes();
  COCEMU_CHECK_ARG(allow_same && same, "{}: input {} and output {} overlap in memory; allowed: {}",
                   where(g, call), in.describe(), out.describe(),
                   allow_same ? "identical (in place) or disjoint" : "disjoint only");
}

/// Calls of at most this many bytes per member are executed entirely by the member that arrives
/// last, all rounds in order: one synchronisation instead of one per round plus one. With more
/// rank threads than cores every barrier costs a pass of the scheduler over all members, so a
/// 64-member ring all_reduce of 4 KiB (126 rounds) took 52 ms per call run by its members.
constexpr std::uint64_t kFastPathBytes = 64 << 10;

bool runs_fast(const Call& call) {
  return call.send_counts.empty() && call.size_bytes <= kFastPathBytes;
}

void publish(GroupState& gs, int me, std::uint64_t seq, const CallSignature& sig,
             const detail::MemberBuffers& mine, const Call& call) {
  detail::CallSlot& slot = gs.members[std::size_t(me)].slots[detail::slot_of(seq)];
  slot.sig = sig;
  slot.in = mine.in;
  slot.out = mine.out;
  slot.scratch = mine.scratch;
  slot.send_counts = call.send_counts;
  slot.recv_counts = call.recv_counts;
  slot.seq.store(seq, std::memory_order_release);
}

std::string missing_members(GroupState& gs, std::uint64_t seq, const CallSignature& sig) {
  std::string missing;
  for (int j = 0; j < gs.size(); ++j) {
    const auto& m = gs.members[std::size_t(j)];
    if (m.slots[detail::slot_of(seq)].seq.load() == seq) continue;
    std::uint64_t last = 0;
    bool any = false;
    for (const auto& s : m.slots) {
      const std::uint64_t v = s.seq.load();
      if (v == ~0ull) continue;
      last = any ? std::max(last, v) : v;
      any = true;
    }
    missing += fmt::format(" group rank {} (world rank {}, {}),", j, gs.ranks[std::size_t(j)],
                           any ? fmt::format("last joined seq {}", last) : "joined nothing yet");
  }
  if (!missing.empty()) missing.pop_back();
  return fmt::format("peers to join {} on group {}; not yet joined:{}", detail::describe(sig, seq),
                     gs.name, missing.empty() ? " (none)" : missing);
}

/// After every member has published: all signatures must equal this member's.
void check_signatures(GroupState& gs, int me, std::uint64_t seq, const CallSignature& sig) {
  for (int j = 0; j < gs.size(); ++j) {
    const detail::CallSlot& other = gs.members[std::size_t(j)].slots[detail::slot_of(seq)];
    COCEMU_CHECK(other.sig == sig, Errc::mismatch,
                 "collective mismatch on group {}: world rank {} (group rank {}) called {}, but "
                 "world rank {} (group rank {}) called {}",
                 gs.name, gs.ranks[std::size_t(me)], me, detail::describe(sig, seq),
                 gs.ranks[std::size_t(j)], j, detail::describe(other.sig, seq));
  }
}

/// The member buffers a call's plan reads and writes, as every member published them.
std::vector<detail::MemberBuffers> published_buffers(GroupState& gs, std::uint64_t seq) {
  std::vector<detail::MemberBuffers> bufs(std::size_t(gs.size()));
  for (int j = 0; j < gs.size(); ++j) {
    const detail::CallSlot& s = gs.members[std::size_t(j)].slots[detail::slot_of(seq)];
    bufs[std::size_t(j)] = {s.in, s.out, s.scratch};
  }
  return bufs;
}

/// Publishes this member's buffers for call `seq`; a small call's scratch is its slot's.
void publish_mine(GroupState& gs, int me, std::uint64_t seq, const Call& call, const Plan& plan) {
  detail::Member& member = gs.members[std::size_t(me)];
  const std::size_t scratch_bytes = std::size_t(plan.scratch_elems) * acc_size(call.sig.dtype);
  std::vector<std::byte>& scratch =
      runs_fast(call) ? member.slots[detail::slot_of(seq)].small_scratch : member.scratch;
  if (scratch.size() < scratch_bytes) scratch.resize(scratch_bytes);
  detail::MemberBuffers mine{
      call.in.defined() && call.in.has_data() ? static_cast<std::byte*>(call.in.raw()) : nullptr,
      call.out.defined() && call.out.has_data() ? static_cast<std::byte*>(call.out.raw()) : nullptr,
      scratch.data()};
  publish(gs, me, seq, call.sig, mine, call);
}

/// A small call's start (runs_fast): this member joins it, and the member that joins last
/// executes every member's steps, round after round (merge_for_one_actor). Never waits for a peer,
/// so a stream may join the next small call before this one is done (Stream::launch_split). Returns
/// the value of `fast_done` that means this call is done.
std::uint32_t start_fast_call(GroupState& gs, int me, std::uint64_t seq, const Call& call,
                              const detail::CachedPlan& cached) {
  publish_mine(gs, me, seq, call, cached.plan);
  const std::uint32_t done = std::uint32_t(++gs.members[std::size_t(me)].fast_calls);
  bool last = false;
  gs.join(me, seq, &last);
  if (last) {
    // Every member joined this call, so each finished its previous one: the calls before this
    // one are done, and their outputs (this call's inputs, in place) are written.
    check_signatures(gs, me, seq, call.sig);
    execute_plan(
        cached.one_actor, 0, gs.size(), published_buffers(gs, seq), call.sig.dtype,
        call.sig.reduce_op, [](int) {}, /*may_stream=*/false);
    gs.fast_done.add(1);
  }
  return done;
}

void finish_fast_call(GroupState& gs, std::uint64_t seq, const CallSignature& sig,
                      std::uint32_t done) {
  gs.fast_done.wait_geq(done, [&] { return missing_members(gs, seq, sig); });
}

/// all_to_all with explicit splits: the plan for every member's published split sizes. What
/// each rank receives must be what its peers send it; every member checks every pair, so all of
/// them stop before anyone writes into a peer's buffer.
Plan splits_plan(GroupState& gs, int me, std::uint64_t seq) {
  const CallSignature& sig = gs.members[std::size_t(me)].slots[detail::slot_of(seq)].sig;
  const int n = gs.size();
  PlanRequest req{sig.op, sig.algorithm, n, 0, 0, sig.deterministic, {}};
  for (int j = 0; j < n; ++j) {
    const detail::CallSlot& s = gs.members[std::size_t(j)].slots[detail::slot_of(seq)];
    COCEMU_CHECK(s.send_counts.size() == std::size_t(n) && s.recv_counts.size() == std::size_t(n),
                 Errc::mismatch,
                 "all_to_all seq {} on group {}: group rank {} gave no split sizes while rank "
                 "{} did",
                 seq, gs.name, j, me);
    req.send_counts.push_back(s.send_counts);
  }
  for (int j = 0; j < n; ++j)
    for (int p = 0; p < n; ++p) {
      const auto sent = req.send_counts[std::size_t(j)][std::size_t(p)];
      const auto expected =
          gs.members[std::size_t(p)].slots[detail::slot_of(seq)].recv_counts[std::size_t(j)];
      COCEMU_CHECK(sent == expected, Errc::mismatch,
                   "all_to_all seq {} on group {}: group rank {} sends {} elements to group "
                   "rank {}, which expects {} (its output_splits)",
                   seq, gs.name, j, sent, p, expected);
    }
  return build_plan(req);
}

/// A call that is not small: every member runs its own steps, with a barrier per round.
void execute_call(GroupState& gs, int me, std::uint64_t seq, const Call& call,
                  std::shared_ptr<const detail::CachedPlan> cached) {
  const Plan* plan_ptr = &cached->plan;
  const CallSignature& sig = call.sig;
  publish_mine(gs, me, seq, call, *plan_ptr);
  const int n = gs.size();
  const std::uint32_t all = gs.join(me, seq);
  gs.joins[detail::slot_of(seq)].wait_geq(all, [&] { return missing_members(gs, seq, sig); });
  check_signatures(gs, me, seq, sig);
  const std::vector<detail::MemberBuffers> bufs = published_buffers(gs, seq);
  Plan exchange_plan;
  if (sig.op == CollOp::all_to_all && !call.send_counts.empty()) {
    exchange_plan = splits_plan(gs, me, seq);
    plan_ptr = &exchange_plan;
  }
  execute_plan(*plan_ptr, me, n, bufs, sig.dtype, sig.reduce_op, [&](int round) {
    gs.barrier(me, [&] {
      return fmt::format("peers to finish round {} of {} on group {}", round + 1,
                         detail::describe(sig, seq), gs.name);
    });
  });
  gs.barrier(me, [&] {
    return fmt::format("peers to finish {} on group {}", detail::describe(sig, seq), gs.name);
  });
}

/// A call on a group whose members live on several hosts (hosts/cross_host.h): this host runs
/// every member's steps on one thread once the remote inputs are here.
void execute_across_hosts(GroupState& gs, int me, std::uint64_t seq, const Call& call,
                          const detail::CachedPlan& cached, World& world) {
  publish_mine(gs, me, seq, call, cached.plan);
  const detail::CallSlot& slot = gs.members[std::size_t(me)].slots[detail::slot_of(seq)];
  detail::HostContribution mine;
  mine.sig = call.sig;
  mine.in = slot.in;
  mine.in_bytes = slot.in ? call.in.nbytes() : 0;
  mine.out = slot.out;
  mine.out_bytes = slot.out ? call.out.nbytes() : 0;
  mine.send_counts = call.send_counts;
  mine.recv_counts = call.recv_counts;
  const std::size_t scratch_bytes =
      std::size_t(cached.plan.scratch_elems) * acc_size(call.sig.dtype);
  detail::run_cross_host(world, gs, me, seq, mine, scratch_bytes, [&] {
    check_signatures(gs, me, seq, call.sig);
    Plan exchange_plan;
    const Plan* plan = &cached.plan;
    if (call.sig.op == CollOp::all_to_all && !call.send_counts.empty()) {
      exchange_plan = splits_plan(gs, me, seq);
      plan = &exchange_plan;
    }
    execute_plan(detail::merge_for_one_actor(*plan), 0, gs.size(), published_buffers(gs, seq),
                 call.sig.dtype, call.sig.reduce_op, [](int) {});
  });
}

/// A multi-round plan's rounds as the trace shows them (null for one round).
std::shared_ptr<const Phases> round_phases(const PlanCost& cost) {
  if (cost.round_ns.size() <= 1) return nullptr;
  auto phases = std::make_shared<Phases>();
  for (std::size_t r = 0; r < cost.round_ns.size(); ++r)
    phases->push_back({fmt::format("round {}/{}", r + 1, cost.round_ns.size()), cost.round_ns[r]});
  return phases;
}

/// A call between its enqueue and its completion: what its stream op runs on.
struct PendingCall {
  Group group;
  int me = 0;
  std::uint64_t seq = 0;
  Call call;
  std::shared_ptr<const detail::CachedPlan> cached;
  std::uint32_t done = 0;  ///< small calls: the fast_done value that means this call is done
};

/// Runs `step` on a pending call. On failure, peers may still be writing into this rank's
/// buffers: the call (and with it the buffers) is kept alive until the run ends.
template <class Step>
void guarded(const std::shared_ptr<PendingCall>& c, Step step) {
  try {
    step(*c);
  } catch (...) {
    c->group.owner().world().keep_alive(c);
    throw;
  }
}

/// A call's op detail without its sequence number (OpRecord::seq): the group, the plan actually
/// run (hierarchical falls back to the ring where it does not apply) and the dtype.
std::shared_ptr<const std::string> call_detail(Group& g, const Plan& plan,
                                               const CallSignature& sig) {
  return std::make_shared<const std::string>(
      fmt::format("group {} algo {} dtype {}{}", g.name(), to_string(plan.algorithm),
                  name_of(sig.dtype), sig.deterministic ? "" : " nondeterministic"));
}

Work enqueue(Group& g, Call call, const CollectiveOptions& o) {
  Rank& rank = g.owner();
  const std::uint64_t seq = g.next_sequence();
  CallSignature& sig = call.sig;
  sig.deterministic = o.deterministic.value_or(rank.deterministic());
  const DeviceProfile& prof = rank.profile();
  detail::Member& member = g.state().members[std::size_t(g.rank())];
  if (member.multi_node < 0)
    member.multi_node = std::any_of(g.ranks().begin(), g.ranks().end(), [&](int w) {
      return prof.topology.node_of(w) != prof.topology.node_of(g.ranks()[0]);
    });
  const bool multi_node = member.multi_node == 1;
  // A table rule names the algorithm; a `cheapest` rule leaves it to pricing the candidates
  // with the plan (cached with it), and the call then carries the one chosen.
  sig.algorithm = o.algo;
  if (o.algo == Algorithm::automatic) {
    const AlgorithmRule& rule = prof.auto_rule(call.size_bytes, multi_node);
    if (rule.cheapest.empty()) sig.algorithm = parse_algorithm(rule.algorithm);
  }
  std::shared_ptr<const detail::CachedPlan> cached;
  if (!call.send_counts.empty()) {  // price from this rank's own view of the exchange
    PlanRequest req{sig.op, sig.algorithm, g.size(), sig.count, sig.root, sig.deterministic, {}};
    req.send_counts.assign(std::size_t(g.size()), call.send_counts);
    for (int w : g.ranks())
      req.nodes.push_back(prof.topology.node_of(w));
    auto [plan, cost] = model_plan(prof, std::move(req), sig.dtype, call.size_bytes, g.ranks());
    auto rounds = round_phases(cost);
    auto text = call_detail(g, plan, sig);
    cached = std::make_shared<const detail::CachedPlan>(detail::CachedPlan{
        std::move(plan), std::move(cost), {}, std::move(rounds), std::move(text)});
  } else {
    auto& cache = member.plans;
    const std::uint64_t key = std::uint64_t(sig.op) | std::uint64_t(sig.algorithm) << 8 |
                              std::uint64_t(sig.deterministic) << 16 |
                              std::uint64_t(sig.dtype) << 24 | std::uint64_t(sig.root) << 32;
    auto& slot = cache[{key, sig.count}];
    if (!slot) {
      ModeledCollective m =
          model_collective(prof, sig.op, g.ranks(), sig.count, sig.dtype, call.size_bytes,
                           sig.algorithm, sig.deterministic, sig.root);
      auto rounds = round_phases(m.cost);
      auto text = call_detail(g, m.plan, sig);
      detail::CachedPlan made{
          std::move(m.plan), std::move(m.cost), {}, std::move(rounds), std::move(text)};
      if (runs_fast(call)) made.one_actor = detail::merge_for_one_actor(made.plan);
      slot = std::make_shared<const detail::CachedPlan>(std::move(made));
    }
    cached = slot;
  }
  if (sig.algorithm == Algorithm::automatic) sig.algorithm = cached->plan.algorithm;
  const PlanCost& cost = cached->cost;
  OpSpec spec;
  spec.name = fmt::format("{}{} {}", to_string(sig.op), o.label, format_bytes(call.size_bytes));
  spec.cls = OpClass::comm;
  spec.work_ns = cost.total_ns;
  spec.bytes = call.size_bytes;
  // Its device-memory traffic: what it sends is read, what it receives written, and a reduction
  // also reads the local operand it adds the received data to.
  const bool reduces =
      sig.op == CollOp::all_reduce || sig.op == CollOp::reduce_scatter || sig.op == CollOp::reduce;
  spec.hbm_bytes = cost.max_link_bytes * (reduces ? 3 : 2);
  spec.link_use = cost.link_use.empty() ? 0 : cost.link_use[std::size_t(g.rank())];
  spec.detail = cached->detail;
  spec.seq = std::int64_t(seq);
  // On several hosts the key must be the same on every host: the group's own (its number here
  // depends on the order this host's ranks made their groups in).
  spec.rendezvous.push_back({g.state().spans_hosts || rank.world().hosts()
                                 ? fmt::format("c{}/{}", g.state().key, seq)
                                 : fmt::format("c{}/{}", g.state().rendezvous_id, seq),
                             g.size()});
  if (o.emulator_only) {
    spec.work_ns = 0;
    spec.launch = LaunchKind::none;
    spec.name += " (emulator only, unpriced)";
  } else {
    spec.phases = cached->rounds;
  }
  Stream& current = rank.current_stream();
  Stream& comm = g.stream();
  if (&current != &comm) comm.wait(current.record());  // the producer has written the input
  auto pending =
      std::make_shared<PendingCall>(PendingCall{g, g.rank(), seq, std::move(call), cached});
  // The op's detail names the group and sequence number in timeout reports.
  if (g.state().spans_hosts) {
    comm.launch(std::move(spec), [pending] {
      guarded(pending, [](PendingCall& c) {
        execute_across_hosts(c.group.state(), c.me, c.seq, c.call, *c.cached,
                             c.group.owner().world());
      });
    });
  } else if (runs_fast(pending->call)) {
    // Start and finish apart: a stream joins the next small call before this one is done.
    comm.launch_split(
        std::move(spec), &g.state(),
        [pending] {
          guarded(pending, [](PendingCall& c) {
            c.done = start_fast_call(c.group.state(), c.me, c.seq, c.call, *c.cached);
          });
        },
        [pending] {
          finish_fast_call(pending->group.state(), pending->seq, pending->call.sig, pending->done);
        });
  } else {
    comm.launch(std::move(spec), [pending] {
      guarded(pending,
              [](PendingCall& c) { execute_call(c.group.state(), c.me, c.seq, c.call, c.cached); });
    });
  }
  Work w(&rank, comm.record());
  if (!o.async_op) w.wait();
  return w;
}

Call make_call(CollOp op, const Tensor& dtype_from, std::int64_t count, std::uint64_t size_bytes) {
  Call c;
  c.sig.op = op;
  c.sig.dtype = dtype_from.dtype();
  c.sig.count = count;
  c.size_bytes = size_bytes;
  return c;
}

void check_reduce_op(Group& g, const char* call, DType t, ReduceOp op) {
  COCEMU_CHECK_ARG(op != ReduceOp::avg || is_floating(t),
                   "{}: reduce op avg needs a floating dtype, got {}; allowed for integers: sum, "
                   "max, min, prod",
                   where(g, call), name_of(t));
}

}  // namespace

Work all_reduce(Group& g, const Tensor& tensor, const CollectiveOptions& o) {
  return all_reduce(g, tensor, tensor, o);
}

Work all_reduce(Group& g, const Tensor& input, const Tensor& output, const CollectiveOptions& o) {
  check_member(g, "all_reduce");
  check_tensor(g, "all_reduce", "input", input);
  check_tensor(g, "all_reduce", "output", output);
  check_same_dtype(g, "all_reduce", input, output);
  COCEMU_CHECK_ARG(input.numel() == output.numel(),
                   "{}: input {} and output {} must have the same number of elements",
                   where(g, "all_reduce"), input.describe(), output.describe());
  check_alias(g, "all_reduce", input, output, true);
  check_reduce_op(g, "all_reduce", input.dtype(), o.op);
  Call c = make_call(CollOp::all_reduce, input, input.numel(), input.nbytes());
  c.sig.reduce_op = o.op;
  c.in = input;
  c.out = output;
  return enqueue(g, std::move(c), o);
}

Work reduce_scatter(Group& g, const Tensor& output, const Tensor& input,
                    const CollectiveOptions& o) {
  check_member(g, "reduce_scatter");
  check_tensor(g, "reduce_scatter", "input", input);
  check_tensor(g, "reduce_scatter", "output", output);
  check_same_dtype(g, "reduce_scatter", input, output);
  COCEMU_CHECK_ARG(input.numel() == output.numel() * g.size(),
                   "{}: input {} must have group size × output elements ({} × {} = {}), has {}",
                   where(g, "reduce_scatter"), input.describe(), g.size(), output.numel(),
                   output.numel() * g.size(), input.numel());
  if (input.has_data() && output.has_data() && input.overlaps(output)) {
    const Tensor mine = input.flat(g.rank() * output.numel(), (g.rank() + 1) * output.numel());
    COCEMU_CHECK_ARG(mine.raw() == output.raw(),
                     "{}: output {} overlaps input {} but is not block {} of it (in-place "
                     "reduce_scatter needs exactly that block)",
                     where(g, "reduce_scatter"), output.describe(), input.describe(), g.rank());
  }
  check_reduce_op(g, "reduce_scatter", input.dtype(), o.op);
  Call c = make_call(CollOp::reduce_scatter, input, output.numel(), input.nbytes());
  c.sig.reduce_op = o.op;
  c.in = input;
  c.out = output;
  return enqueue(g, std::move(c), o);
}

Work all_gather(Group& g, const Tensor& output, const Tensor& input, const CollectiveOptions& o) {
  check_member(g, "all_gather");
  check_tensor(g, "all_gather", "input", input);
  check_tensor(g, "all_gather", "output", output);
  check_same_dtype(g, "all_gather", input, output);
  COCEMU_CHECK_ARG(output.numel() == input.numel() * g.size(),
                   "{}: output {} must have group size × input elements ({} × {} = {}), has {}",
                   where(g, "all_gather"), output.describe(), g.size(), input.numel(),
                   input.numel() * g.size(), output.numel());
  if (input.has_data() && output.has_data() && input.overlaps(output)) {
    const Tensor mine = output.flat(g.rank() * input.numel(), (g.rank() + 1) * input.numel());
    COCEMU_CHECK_ARG(mine.raw() == input.raw(),
                     "{}: input {} overlaps output {} but is not block {} of it (in-place "
                     "all_gather needs exactly that block)",
                     where(g, "all_gather"), input.describe(), output.describe(), g.rank());
  }
  Call c = make_call(CollOp::all_gather, input, input.numel(), output.nbytes());
  c.in = input;
  c.out = output;
  return enqueue(g, std::move(c), o);
}

namespace {
void check_root(Group& g, const char* call, int root) {
  COCEMU_CHECK_ARG(root >= 0 && root < g.size(), "{}: root {} out of range; allowed 0..{}",
                   where(g, call), root, g.size() - 1);
}
}  // namespace

Work broadcast(Group& g, const Tensor& tensor, int root, const CollectiveOptions& o) {
  check_member(g, "broadcast");
  check_tensor(g, "broadcast", "tensor", tensor);
  check_root(g, "broadcast", root);
  Call c = make_call(CollOp::broadcast, tensor, tensor.numel(), tensor.nbytes());
  c.sig.root = root;
  c.in = tensor;
  c.out = tensor;
  return enqueue(g, std::move(c), o);
}

Work reduce(Group& g, const Tensor& tensor, int root, const CollectiveOptions& o) {
  check_member(g, "reduce");
  check_tensor(g, "reduce", "tensor", tensor);
  check_root(g, "reduce", root);
  check_reduce_op(g, "reduce", tensor.dtype(), o.op);
  Call c = make_call(CollOp::reduce, tensor, tensor.numel(), tensor.nbytes());
  c.sig.root = root;
  c.sig.reduce_op = o.op;
  c.in = tensor;
  c.out = tensor;
  return enqueue(g, std::move(c), o);
}

Work gather(Group& g, const Tensor& output, const Tensor& input, int root,
            const CollectiveOptions& o) {
  check_member(g, "gather");
  check_tensor(g, "gather", "input", input);
  check_root(g, "gather", root);
  Call c = make_call(CollOp::gather, input, input.numel(), input.nbytes() * std::size_t(g.size()));
  c.sig.root = root;
  c.in = input;
  if (g.rank() == root) {
    check_tensor(g, "gather", "output", output);
    check_same_dtype(g, "gather", input, output);
    COCEMU_CHECK_ARG(output.numel() == input.numel() * g.size(),
                     "{}: root output {} must have group size × input elements ({})",
                     where(g, "gather"), output.describe(), input.numel() * g.size());
    check_alias(g, "gather", input, output, false);
    c.out = output;
  }
  return enqueue(g, std::move(c), o);
}

Work scatter(Group& g, const Tensor& output, const Tensor& input, int root,
             const CollectiveOptions& o) {
  check_member(g, "scatter");
  check_tensor(g, "scatter", "output", output);
  check_root(g, "scatter", root);
  Call c =
      make_call(CollOp::scatter, output, output.numel(), output.nbytes() * std::size_t(g.size()));
  c.sig.root = root;
  c.out = output;
  if (g.rank() == root) {
    check_tensor(g, "scatter", "input", input);
    check_same_dtype(g, "scatter", input, output);
    COCEMU_CHECK_ARG(input.numel() == output.numel() * g.size(),
                     "{}: root input {} must have group size × output elements ({})",
                     where(g, "scatter"), input.describe(), output.numel() * g.size());
    check_alias(g, "scatter", input, output, false);
    c.in = input;
  }
  return enqueue(g, std::move(c), o);
}

Work all_to_all(Group& g, const Tensor& output, const Tensor& input, const CollectiveOptions& o) {
  check_member(g, "all_to_all");
  check_tensor(g, "all_to_all", "input", input);
  check_tensor(g, "all_to_all", "output", output);
  check_same_dtype(g, "all_to_all", input, output);
  COCEMU_CHECK_ARG(input.numel() == output.numel() && input.numel() % g.size() == 0,
                   "{}: input {} and output {} must have the same element count, divisible by the "
                   "group size {}",
                   where(g, "all_to_all"), input.describe(), output.describe(), g.size());
  check_alias(g, "all_to_all", input, output, false);
  Call c = make_call(CollOp::all_to_all, input, input.numel() / g.size(), input.nbytes());
  c.in = input;
  c.out = output;
  return enqueue(g, std::move(c), o);
}

Work all_to_all(Group& g, const Tensor& output, const Tensor& input,
                const std::vector<std::int64_t>& output_splits,
                const std::vector<std::int64_t>& input_splits, const CollectiveOptions& o) {
  check_member(g, "all_to_all");
  check_tensor(g, "all_to_all", "input", input);
  check_tensor(g, "all_to_all", "output", output);
  check_same_dtype(g, "all_to_all", input, output);
  check_alias(g, "all_to_all", input, output, false);
  const std::size_t n = std::size_t(g.size());
  COCEMU_CHECK_ARG(output_splits.size() == n && input_splits.size() == n,
                   "{}: output_splits has {} and input_splits {} entries; both need one per group "
                   "rank ({})",
                   where(g, "all_to_all"), output_splits.size(), input_splits.size(), n);
  COCEMU_CHECK_ARG(input.ndim() >= 1 && output.ndim() >= 1 &&
                       input.shape().row_numel() == output.shape().row_numel(),
                   "{}: input {} and output {} must have the same row size", where(g, "all_to_all"),
                   input.describe(), output.describe());
  const std::int64_t row = input.shape().row_numel();
  std::int64_t in_rows = 0, out_rows = 0;
  Call c = make_call(CollOp::all_to_all, input, -1, input.nbytes());
  for (std::size_t p = 0; p < n; ++p) {
    COCEMU_CHECK_ARG(input_splits[p] >= 0 && output_splits[p] >= 0,
                     "{}: split sizes must be >= 0 (input_splits[{}] = {}, output_splits[{}] = {})",
                     where(g, "all_to_all"), p, input_splits[p], p, output_splits[p]);
    in_rows += input_splits[p];
    out_rows += output_splits[p];
    c.send_counts.push_back(input_splits[p] * row);
    c.recv_counts.push_back(output_splits[p] * row);
  }
  COCEMU_CHECK_ARG(in_rows == input.size(0) && out_rows == output.size(0),
                   "{}: input_splits sum to {} rows (input has {}), output_splits to {} (output "
                   "has {})",
                   where(g, "all_to_all"), in_rows, input.size(0), out_rows, output.size(0));
  c.in = input;
  c.out = output;
  return enqueue(g, std::move(c), o);
}

Work barrier(Group& g, const CollectiveOptions& o) {
  check_member(g, "barrier");
  Call c;
  c.sig.op = CollOp::barrier;
  c.sig.dtype = DType::f32;
  CollectiveOptions async = o;
  async.async_op = true;
  Work w = enqueue(g, std::move(c), async);
  // torch.distributed.barrier without async_op blocks the caller until every member has entered
  // (ProcessGroupNCCL's barrier work synchronizes its stream), unlike other synchronous
  // collectives, which only order the current stream.
  if (!o.async_op) w.synchronize();
  return w;
}

// ---------------------------------------------------------------------------------------------
// Point to point

namespace {
/// The key of message #index from group rank `src` to `dst` when they live on different hosts.
std::string p2p_key(const World& world, const GroupState& gs, int src, int dst,
                    std::uint64_t index) {
  return world.host_key(fmt::format("p2p/{}/{}>{}/{}", gs.key, src, dst, index));
}

Bytes encode(const detail::Message& m) {
  detail::ByteWriter w;
  w.put(m.dtype).put(m.count).put(m.tag).put(m.index).put_vector(m.data);
  return w.take();
}

detail::Message decode(const Bytes& data, const GroupState& gs, int src, std::uint64_t index) {
  detail::ByteReader r(data,
                       fmt::format("send #{} from group rank {} on group {}", index, src, gs.name));
  detail::Message m;
  m.dtype = r.get<DType>();
  m.count = r.get<std::int64_t>();
  m.tag = r.get<int>();
  m.index = r.get<std::uint64_t>();
  m.data = r.get_vector<std::byte, detail::BufferAllocator<std::byte>>();
  return m;
}
}  // namespace

Work batch_isend_irecv(Group& g, const std::vector<P2POp>& ops) {
  check_member(g, "batch_isend_irecv");
  Rank& rank = g.owner();
  const DeviceProfile& prof = rank.profile();
  GroupState& gs = g.state();
  const int me = g.rank();
  detail::Member& member = gs.members[std::size_t(me)];
  struct Planned {
    P2POp op;
    std::uint64_t index;
  };
  std::vector<Planned> planned;
  OpSpec spec;
  spec.cls = OpClass::comm;
  std::vector<double> to(static_cast<std::size_t>(g.size())), from(std::size_t(g.size()));
  for (const P2POp& op : ops) {
    const char* call = op.kind == P2POp::send ? "send" : "recv";
    check_tensor(g, call, "tensor", op.tensor);
    COCEMU_CHECK_ARG(op.peer >= 0 && op.peer < g.size(), "{}: peer {} out of range; allowed 0..{}",
                     where(g, call), op.peer, g.size() - 1);
    const std::size_t p = std::size_t(op.peer);
    const double b = double(op.tensor.nbytes());
    std::uint64_t index;
    if (op.kind == P2POp::send) {
      index = member.sends_to[p]++;
      spec.rendezvous.push_back({fmt::format("p2p/{}/{}->{}/{}", gs.key, me, op.peer, index), 2});
      to[p] += b;
    } else {
      index = member.recvs_from[p]++;
      spec.rendezvous.push_back({fmt::format("p2p/{}/{}->{}/{}", gs.key, op.peer, me, index), 2});
      from[p] += b;
    }
    spec.bytes += op.tensor.nbytes();
    planned.push_back({op, index});
  }
  // Each message on the link it crosses: a peer link (or switch port) inside the node, the NIC
  // to another node; messages sharing a link share its bandwidth.
  const Topology& topo = prof.topology;
  const int my_world = g.world_rank_of(me);
  double out_intra = 0, in_intra = 0, out_inter = 0, in_inter = 0, link_s = 0, latency = 0;
  spec.link_use = 0;
  for (std::size_t p = 0; p < to.size(); ++p) {
    const int peer_world = g.world_rank_of(int(p));
    const bool same = topo.node_of(peer_world) == topo.node_of(my_world);
    if (to[p] > 0 || from[p] > 0)
      latency = std::max(latency, topo.path_latency_ns(my_world, peer_world));
    link_s = std::max({link_s, to[p] / topo.path_bandwidth(my_world, peer_world),
                       from[p] / topo.path_bandwidth(my_world, peer_world)});
    (same ? out_intra : out_inter) += to[p];
    (same ? in_intra : in_inter) += from[p];
    if (to[p] > 0) spec.link_use |= same ? kIntraOut : kInterOut;
    if (from[p] > 0) spec.link_use |= same ? kIntraIn : kInterIn;
  }
  link_s = std::max({link_s, out_intra / topo.intra_per_device, in_intra / topo.intra_per_device,
                     out_inter / topo.inter_per_device, in_inter / topo.inter_per_device});
  spec.work_ns = latency + link_s * 1e9;
  spec.hbm_bytes = spec.bytes;  // a send reads its message, a receive writes it
  if (ops.size() == 1)
    spec.name = fmt::format("{} {} {} {}", ops[0].kind == P2POp::send ? "send" : "recv",
                            format_bytes(ops[0].tensor.nbytes()),
                            ops[0].kind == P2POp::send ? "to" : "from", ops[0].peer);
  else
    spec.name = fmt::format("batch_isend_irecv x{} {}", ops.size(), format_bytes(spec.bytes));
  spec.detail = std::make_shared<const std::string>(fmt::format("group {}", g.name()));
  Stream& current = rank.current_stream();
  Stream& comm = g.stream();
  if (&current != &comm) comm.wait(current.record());
  Group keep = g;
  comm.launch(std::move(spec), [keep, me, planned = std::move(planned)] {
    GroupState& gs = keep.state();
    detail::Member& m = gs.members[std::size_t(me)];
    // Sends are eager: into the receive its peer has posted, else copied out and queued.
    for (const Planned& p : planned) {
      if (p.op.kind != P2POp::send) continue;
      detail::Message msg;
      msg.dtype = p.op.tensor.dtype();
      msg.count = p.op.tensor.numel();
      msg.tag = p.op.tag;
      msg.index = p.index;
      const std::size_t n = p.op.tensor.nbytes();
      const int peer_world = gs.ranks[std::size_t(p.op.peer)];
      if (World& world = keep.owner().world(); !world.is_local(peer_world)) {
        msg.data.resize(n);
        if (n) std::memcpy(msg.data.data(), p.op.tensor.raw(), n);
        world.hosts()->send(world.host_of(peer_world), p2p_key(world, gs, me, p.op.peer, p.index),
                            encode(msg));
        continue;
      }
      detail::Mailbox& mb = gs.mailbox(me, p.op.peer);
      {
        std::lock_guard lock(mb.mu);
        const std::optional<detail::PostedRecv>& w = mb.waiting;
        if (w && w->index == p.index && w->dtype == msg.dtype && w->count == msg.count &&
            w->tag == msg.tag) {
          if (n) std::memmove(w->dst, p.op.tensor.raw(), n);  // a send to itself may alias
          msg.delivered = true;
          mb.waiting.reset();
        }
      }
      if (!msg.delivered) {
        msg.data.resize(n);
        if (n) std::memcpy(msg.data.data(), p.op.tensor.raw(), n);
      }
      {
        std::lock_guard lock(mb.mu);
        mb.queue.push_back(std::move(msg));
      }
      mb.posted.add(1);
    }
    for (const Planned& p : planned) {
      if (p.op.kind != P2POp::recv) continue;
      detail::Mailbox& mb = gs.mailbox(p.op.peer, me);
      const std::uint64_t idx = m.received_from[std::size_t(p.op.peer)]++;
      keep.owner().note_activity(
          fmt::format("recv #{} from group rank {} on group {}", idx, p.op.peer, gs.name));
      World& world = keep.owner().world();
      const int peer = gs.ranks[std::size_t(p.op.peer)];
      const auto awaited = [&] {
        return fmt::format(
            "send #{} from group rank {} (world rank {}{}) to group rank {} on "
            "group {} (matching recv of {} {})",
            idx, p.op.peer, peer,
            world.hosts() ? fmt::format(" on host {}", world.host_of(peer)) : "", me, gs.name,
            p.op.tensor.describe(), p.op.tag ? fmt::format("tag {}", p.op.tag) : "");
      };
      detail::Message msg;
      if (!world.is_local(peer)) {
        const Bytes data = world.hosts()->receive(p2p_key(world, gs, p.op.peer, me, idx), awaited);
        msg = decode(data, gs, p.op.peer, idx);
      } else {
        {
          std::lock_guard lock(mb.mu);
          if (mb.queue.empty())  // its message is not sent yet: the send may copy straight in
            mb.waiting = detail::PostedRecv{idx, static_cast<std::byte*>(p.op.tensor.raw()),
                                            p.op.tensor.dtype(), p.op.tensor.numel(), p.op.tag};
        }
        const auto withdraw = [&] {
          if (mb.waiting && mb.waiting->index == idx) mb.waiting.reset();
        };
        try {
          mb.posted.wait_geq(std::uint32_t(idx + 1), awaited);
        } catch (...) {
          std::lock_guard lock(mb.mu);
          withdraw();
          throw;
        }
        std::lock_guard lock(mb.mu);
        withdraw();
        msg = std::move(mb.queue.front());
        mb.queue.pop_front();
      }
      COCEMU_CHECK(msg.dtype == p.op.tensor.dtype() && msg.count == p.op.tensor.numel() &&
                       msg.tag == p.op.tag,
                   Errc::mismatch,
                   "p2p mismatch on group {}: group rank {} receives #{} from group rank {} into "
                   "{} with tag {}, but that send carries {} elements of {} with tag {}",
                   gs.name, me, idx, p.op.peer, p.op.tensor.describe(), p.op.tag, msg.count,
                   name_of(msg.dtype), msg.tag);
      if (!msg.delivered && !msg.data.empty())
        std::memcpy(p.op.tensor.raw(), msg.data.data(), msg.data.size());
    }
  });
  return Work(&rank, comm.record());
}

Work isend(Group& g, const Tensor& tensor, int dst, int tag) {
  return batch_isend_irecv(g, {P2POp{P2POp::send, tensor, dst, tag}});
}

Work irecv(Group& g, const Tensor& tensor, int src, int tag) {
  return batch_isend_irecv(g, {P2POp{P2POp::recv, tensor, src, tag}});
}

void send(Group& g, const Tensor& tensor, int dst, int tag) {
  isend(g, tensor, dst, tag).wait();
}

void recv(Group& g, const Tensor& tensor, int src, int tag) {
  irecv(g, tensor, src, tag).wait();
}

}  // namespace cocemu
