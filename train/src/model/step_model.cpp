// The step model (step_model.h): a training iteration composed from an emulated layer, the
// pipeline schedule replayed with priced transfers, and priced DP reductions.
#include "cocemu/train/step_model.h"

#include "cocemu/train/part_model.h"

#include <fmt/format.h>
#include <tbb/concurrent_unordered_map.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <map>
#include <numeric>
#include <optional>

#include "cocemu/collectives/plan.h"
#include "cocemu/runtime/cost_model.h"
#include "cocemu/runtime/error.h"
#include "cocemu/train/buckets.h"
#include "cocemu/train/detail/intervals.h"
#include "cocemu/train/pipeline.h"

namespace cocemu::bench {

using layers::train::PipelineAction;
using layers::train::TrainLayout;

namespace {

/// How a DP reduction and the backward beside it share a rank, as the emulated timeline's
/// schedule shares it (runtime/src/schedule.cpp, Sim::share), composed over the backward's
/// stretches: while compute runs alone, it slows by compute_slowdown and the reduction runs at
/// 1/comm_slowdown; a TP or CP transfer on a link the reduction also crosses splits that link
/// with it (exposed: each at half speed; hidden beside compute: the reduction at
/// 1/(2·comm_slowdown), and the part longer by split_extra_ns); a fused kernel on such a link runs
/// at half speed and the reduction at 1/(2·comm_slowdown). `stretch`: wall ns per ns of the
/// backward as it runs without the reduction; `rate`: reduction work (ns at full speed) per wall
/// ns.
struct Beside {
  double stretch = 1, rate = 1;
};
/// DP replicas run the part in step; the ranks of a CP group do not (a causal ring's ranks compute
/// different blocks and wait at different times), and a collective runs at its slowest member's
/// rate: where the part records the group's states (emulated parts), the rate follows them.
Beside beside(const PartCost& c, const ContentionModel& m, bool shares_link) {
  const double a = m.compute_slowdown, b = m.comm_slowdown, n = shares_link ? 2 : 1;
  const double e = c.exposed_tp_ns + c.exposed_cp_ns, h = c.hidden_comm_ns, f = c.fused_ns;
  const double alone = std::max(0.0, c.ns - e - h - f);
  const double x = shares_link ? c.split_extra_ns : 0;
  const double wall = a * alone + h + x + n * e + n * f;
  if (!(wall > 0) || !(c.ns > 0)) return {a, 1 / b};
  const double work = a * alone / b + (h + x) / (n * b) + e + f / b;
  if (const auto& g = c.group; g.total() > 0) {
    // Members out of phase: the collective runs at the rate of the group's state, each stretch
    // as long as the slowed part makes it.
    const double g_wall =
        g.hidden_ns + n * g.fused_ns + n * g.exposed_ns + a * g.alone_ns + g.idle_ns;
    const double g_work =
        g.hidden_ns / (n * b) + g.fused_ns / b + g.exposed_ns + a * g.alone_ns / b + g.idle_ns;
    // The ranks move in lockstep: the part takes as long as its slowest member beside it.
    return {(shares_link ? g.slowed_shared_ns : g.slowed_apart_ns) / c.ns, g_work / g_wall};
  }
  return {wall / c.ns, work / wall};
}

/// End of a transfer of `work` ns (at full speed) starting at `start` on a rank whose compute
/// runs until `compute_end`: while both run, they share the rank as `x` says; `compute_end`
/// moves accordingly.
double contended(double start, double work, double& compute_end, const Beside& x) {
  double t = start, left = work;
  if (t < compute_end) {
    double compute_left = compute_end - t;  // as it runs without the transfer
    const double both = std::min(left / x.rate, compute_left * x.stretch);
    left -= both * x.rate;
    compute_left -= both / x.stretch;
    t += both;
    compute_end = t + compute_left;
  }
  return t + left;
}

double p2p_ns(const DeviceProfile& p, double bytes, int a, int b) {
  return p.topology.path_latency_ns(a, b) + bytes / p.topology.path_bandwidth(a, b) * 1e9;
}

}  // namespace

TrainReport model_step(const TrainSetup& setup) {
  return replay_step(setup, emulate_parts(setup));
}

namespace {

/// A DP-side collective, as StepMemo keys it.
struct CollectiveKey {
  CollOp op;
  DType dtype;
  int first, stride, size;
  std::int64_t count;
  std::uint64_t bytes;
  bool deterministic;
  bool operator==(const CollectiveKey&) const = default;
};
struct CollectiveKeyHash {
  std::size_t operator()(const CollectiveKey& k) const {
    std::size_t h = std::hash<std::int64_t>()(k.count);
    for (const std::uint64_t v :
         {std::uint64_t(k.op), std::uint64_t(k.dtype), std::uint64_t(k.first),
          std::uint64_t(k.stride), std::uint64_t(k.size), k.bytes, std::uint64_t(k.deterministic)})
      h = h * 1000003u ^ std::hash<std::uint64_t>()(v);
    return h;
  }
};

struct ScheduleKey {
  layers::train::PipelineSchedule schedule;
  int pp, vpp, m, stage;
  bool operator==(const ScheduleKey&) const = default;
};
struct ScheduleKeyHash {
  std::size_t operator()(const ScheduleKey& k) const {
    std::size_t h = std::size_t(k.schedule);
    for (const int v : {k.pp, k.vpp, k.m, k.stage})
      h = h * 1000003u ^ std::hash<int>()(v);
    return h;
  }
};

/// A stage's steps (passes and p2p calls) in one P2PMode.
struct StepsKey {
  ScheduleKey schedule;
  layers::train::P2PMode mode;
  bool operator==(const StepsKey&) const = default;
};
struct StepsKeyHash {
  std::size_t operator()(const StepsKey& k) const {
    return ScheduleKeyHash()(k.schedule) * 31u + std::size_t(k.mode);
  }
};

/// A schedule's actions and the most micro-batch chunks it holds at once.
struct ScheduleEntry {
  std::vector<PipelineAction> actions;
  int peak_in_flight = 0;
  int peak_last_chunk = 0;  ///< micro-batches of the last chunk in flight
};

}  // namespace

// Lookups only read: concurrent_unordered_map finds without taking a lock, so threads that share
// hot entries do not bounce a lock's cache line between cores (concurrent_hash_map's accessors
// write one per lookup). A miss is priced outside the map; two threads that miss the same key
// at once both price it, with the same result, and the first insert stays.
struct StepMemo::Impl {
  tbb::concurrent_unordered_map<CollectiveKey, double, CollectiveKeyHash> prices;
  tbb::concurrent_unordered_map<ScheduleKey, ScheduleEntry, ScheduleKeyHash> schedules;
  tbb::concurrent_unordered_map<StepsKey, std::vector<layers::train::PipelineStep>, StepsKeyHash>
      steps;

  const ScheduleEntry& schedule(layers::train::PipelineSchedule s, int pp, int vpp, int m,
                                int stage) {
    const ScheduleKey key{s, pp, vpp, m, stage};
    if (const auto it = schedules.find(key); it != schedules.end()) return it->second;
    ScheduleEntry e;
    e.actions = layers::train::pipeline_actions(s, pp, vpp, m, stage);
    e.peak_in_flight = bench::peak_chunks_in_flight(e.actions);
    e.peak_last_chunk = bench::peak_chunks_in_flight(e.actions, vpp - 1);
    return schedules.emplace(key, std::move(e)).first->second;  // elements never move
  }
};

const std::vector<PipelineAction>& StepMemo::actions(layers::train::PipelineSchedule s, int pp,
                                                     int vpp, int m, int stage) {
  return impl_->schedule(s, pp, vpp, m, stage).actions;
}

const std::vector<layers::train::PipelineStep>& StepMemo::steps(const TrainLayout& l, int stage) {
  const auto mode = layers::train::p2p_mode(l);
  const int m = int(l.micro_batches());
  const StepsKey key{{l.schedule, l.pp, l.vpp, m, stage}, mode};
  if (const auto it = impl_->steps.find(key); it != impl_->steps.end()) return it->second;
  std::vector<layers::train::PipelineStep> steps;
  layers::train::pipeline_steps(actions(l.schedule, l.pp, l.vpp, m, stage), l.schedule, mode, l.pp,
                                l.vpp, stage, steps);
  return impl_->steps.emplace(key, std::move(steps)).first->second;  // elements never move
}

int StepMemo::peak_chunks_in_flight(const TrainLayout& l, int stage) {
  return impl_->schedule(l.schedule, l.pp, l.vpp, int(l.micro_batches()), stage).peak_in_flight;
}

int StepMemo::peak_loss_in_flight(const TrainLayout& l) {
  return impl_->schedule(l.schedule, l.pp, l.vpp, int(l.micro_batches()), l.pp - 1).peak_last_chunk;
}

StepMemo::StepMemo(std::shared_ptr<const DeviceProfile> profile)
    : profile_(std::move(profile)), impl_(std::make_unique<Impl>()) {}
StepMemo::~StepMemo() = default;
std::size_t StepMemo::size() const {
  return impl_->prices.size();
}

double StepMemo::price(CollOp op, int first, int stride, int size, std::int64_t count, DType dtype,
                       std::uint64_t bytes, bool deterministic) {
  // A group shifted by whole nodes crosses the same links: its price is the same.
  first %= profile_->topology.devices_per_node;
  const CollectiveKey key{op, dtype, first, stride, size, count, bytes, deterministic};
  if (const auto it = impl_->prices.find(key); it != impl_->prices.end()) return it->second;
  std::vector<int> members(static_cast<std::size_t>(size));
  for (int i = 0; i < size; ++i)
    members[std::size_t(i)] = first + i * stride;
  const double ns = model_collective(*profile_, op, members, count, dtype, bytes,
                                     Algorithm::automatic, deterministic)
                        .cost.total_ns;
  return impl_->prices.emplace(key, ns).first->second;
}

namespace {

/// A stretch of a stage's timeline during which its DP reductions run beside its compute, which
/// runs `stretch` times slower there (Beside).
struct DpWindow {
  double start, end, stretch;
};
using DpWindows = std::vector<std::vector<DpWindow>>;  // per stage, in time order

/// How long compute of `d` ns (as it runs alone) starting at `now` takes through the windows.
double stretched(const std::vector<DpWindow>& windows, double now, double d) {
  double t = now, left = d;
  for (const auto& w : windows) {
    if (!(left > 0)) break;
    if (w.end <= t) continue;
    if (w.start > t) {
      const double run = std::min(left, w.start - t);
      t += run;
      left -= run;
      if (!(left > 0)) break;
    }
    const double in = std::min(left * w.stretch, w.end - t);
    t += in;
    left -= in / w.stretch;
  }
  return t + left - now;
}

/// The replay (replay_step). `slowed`: the DP windows of an earlier replay, whose slowdown of
/// each stage's compute the schedule now carries (a stage that runs slower sends its gradients
/// later, so the stages upstream wait); `windows`: where to record this replay's.
TrainReport replay(const TrainSetup& setup, const StepParts& parts, StepMemo* memo,
                   bool record_pipeline, const DpWindows* slowed, DpWindows* windows);

}  // namespace

TrainReport replay_step(const TrainSetup& setup, const StepParts& parts, StepMemo* memo,
                        bool record_pipeline) {
  std::optional<StepMemo> own_memo;  // without one, equal buckets still share their prices
  if (!memo) memo = &own_memo.emplace(setup.profile);
  const TrainLayout& l = setup.options.layout;
  // With pipeline stages, the DP reductions' slowdown of a stage's last backwards delays the
  // stages that wait for its gradients: a first replay finds where each stage's reductions run,
  // a second carries their slowdown through the schedule.
  if (l.pp == 1 || !l.overlap_grad_reduce || l.dp * l.cp == 1)
    return replay(setup, parts, memo, record_pipeline, nullptr, nullptr);
  DpWindows windows(static_cast<std::size_t>(l.pp));
  replay(setup, parts, memo, false, nullptr, &windows);
  return replay(setup, parts, memo, record_pipeline, &windows, nullptr);
}

namespace {

TrainReport replay(const TrainSetup& setup, const StepParts& parts, StepMemo* memo,
                   bool record_pipeline, const DpWindows* slowed, DpWindows* windows) {
  const auto& o = setup.options;
  const TrainLayout& l = o.layout;
  const DeviceProfile& prof = *setup.profile;
  const bool det = setup.deterministic;
  TrainReport rep;
  rep.warnings = layers::train::check_layout(o.model, l, l.world()).warnings;
  rep.model = o.model.name;
  rep.layout = l.describe();
  rep.cp_algo = l.cp > 1 ? l.cp_algo : "";
  rep.micro_batch_interleave = l.micro_batch_interleave;
  rep.profile = prof.name;
  rep.source = "step model";
  rep.dry_run = true;
  rep.deterministic = setup.deterministic;
  rep.world = l.world();
  rep.nodes = setup.nodes;
  prof.check_world(rep.world);

  const PartCost lf = parts.layer_fwd, lb = parts.layer_bwd, ef = parts.embedding_fwd,
                 eb = parts.embedding_bwd, sf = parts.loss_fwd, sb = parts.loss_bwd;
  const int pp = l.pp, vpp = l.vpp, m = int(l.micro_batches());
  const int per_stage = rep.world / pp;
  std::vector<double> layer_count(std::size_t(pp) * std::size_t(vpp));  // by (stage, chunk)
  for (int s = 0; s < pp; ++s)
    for (int c = 0; c < vpp; ++c)
      layer_count[std::size_t(s) * std::size_t(vpp) + std::size_t(c)] =
          double(layers::train::layers_of(o.model, l, s, c).count);
  auto layers_in = [&](int s, int c) {
    return layer_count[std::size_t(s) * std::size_t(vpp) + std::size_t(c)];
  };
  // One action of stage s: its chunk's layers, plus the embedding on the first chunk of the
  // first stage and the loss on the last chunk of the last.
  auto action_cost = [&](int s, const PipelineAction& a) {
    const bool first = s == 0 && a.chunk == 0, last = s == pp - 1 && a.chunk == vpp - 1;
    const double n = layers_in(s, a.chunk);
    const PartCost& layer = a.forward ? lf : lb;
    PartCost c = layer * n;
    for (const auto& [on, part] :
         {std::pair{first, a.forward ? ef : eb}, std::pair{last, a.forward ? sf : sb}})
      if (on) c += part;
    return c;
  };
  auto duration = [&](int s, const PipelineAction& a) { return action_cost(s, a).ns; };
  // Transfers: an activation (or its gradient) of one micro-batch, between stage s and s + 1.
  const double outside = l.sequence_parallel && l.tp > 1 ? l.tp : 1;
  const double act_bytes = double(o.model.seq) / l.cp * double(l.micro_batch_size) *
                           double(o.model.hidden) / outside * double(size_of(l.dtype));
  // With Megatron 2021-2022's scatter/gather, each TP rank sends its 1/tp slice and the
  // receiving stage all-gathers the slices over its TP group before it may start.
  const bool sliced = l.pipeline_scatter_gather();
  const double sent_bytes = sliced ? act_bytes / l.tp : act_bytes;
  const std::int64_t slice_elems = std::int64_t(act_bytes) / std::int64_t(size_of(l.dtype)) / l.tp;
  std::vector<double> link_ns(static_cast<std::size_t>(pp));
  for (int s = 0; s < pp; ++s) {
    const int to = (s + 1) % pp;
    link_ns[std::size_t(s)] = p2p_ns(prof, sent_bytes, per_stage * s, per_stage * to);
    if (sliced)
      link_ns[std::size_t(s)] += memo->price(CollOp::all_gather, per_stage * to, 1, l.tp,
                                             slice_elems, l.dtype, std::uint64_t(act_bytes), det);
  }

  // Each stage's gradient buffer (buckets.h, as the emulated ranks build it): its parameters in
  // the order the backward finalizes them — the LM head, the chunks' layers from the last (each
  // layer's linears in backward order), the embedding — and their buckets.
  const DType grad_t = layers::train::reduce_dtype(l);
  const double grad_bytes_each = double(size_of(grad_t));
  const double vocab_rows = double(layers::train::padded_vocab(o.model.vocab, l.tp)) / l.tp;
  const double h = double(o.model.hidden);
  const auto layer_params = linear_parameters(o.model);  // per linear, before TP
  // Gradients are reduced over dp × cp (rank = tp + tp·(cp + cp·(dp + dp·pp))).
  const int dpc = l.dp * l.cp;
  struct StageBuckets {
    std::vector<layers::train::GradParam> params;
    std::vector<int> bucket_of;
    std::vector<double> elements;  ///< per bucket (padded to dp × cp when sharded)
    std::vector<double> gather;    ///< per bucket: its parameter all-gather (sharded)
    std::vector<int> chunk;        ///< per bucket
  };
  std::vector<StageBuckets> plan(static_cast<std::size_t>(pp));
  for (int s = 0; s < pp; ++s) {
    auto& b = plan[std::size_t(s)];
    if (s == pp - 1) b.params.push_back({vpp - 1, -1, std::int64_t(vocab_rows * h)});
    for (int c = vpp - 1; c >= 0; --c) {
      const auto range = layers::train::layers_of(o.model, l, s, c);
      for (std::int64_t k = range.count - 1; k >= 0; --k)
        for (const double p : layer_params)
          b.params.push_back({c, range.first + k, std::int64_t(p / l.tp)});
    }
    if (s == 0) b.params.push_back({0, -1, std::int64_t(vocab_rows * h)});
    b.bucket_of = layers::train::assign_buckets(o.model, l, s, b.params);
    const int n =
        b.bucket_of.empty() ? 0 : 1 + *std::max_element(b.bucket_of.begin(), b.bucket_of.end());
    b.elements.assign(std::size_t(n), 0);
    b.chunk.assign(std::size_t(n), 0);
    for (std::size_t i = 0; i < b.params.size(); ++i) {
      b.elements[std::size_t(b.bucket_of[i])] += double(b.params[i].numel);
      b.chunk[std::size_t(b.bucket_of[i])] = b.params[i].chunk;
    }
    for (auto& e : b.elements) {
      if (l.distributed_optimizer) e = std::ceil(e / dpc) * dpc;
      b.gather.push_back(l.distributed_optimizer
                             ? memo->price(CollOp::all_gather, per_stage * s, l.tp, dpc,
                                           std::int64_t(e / dpc), l.dtype,
                                           std::uint64_t(e * double(size_of(l.dtype))), det)
                             : 0);
    }
  }
  // --overlap-param-gather (buckets.h, parts.h ParamGather): the all-gathers of the last update
  // go out during this iteration's first forwards. Without interleaving (chained) the first
  // forward's pre-hooks dispatch them one bucket ahead, the first one exposed: the extra time that
  // forward pays. With interleaving (aligned) the first two chunks' go out at the start, chunk
  // c's at the forward whose unit + stage is the first micro-batch of chunk c − 1, and a chunk's
  // first forward waits for its chunk's.
  const bool overlapped_gathers = l.overlap_param_gather && l.distributed_optimizer;
  std::vector<double> gather_stall(static_cast<std::size_t>(pp), 0);  // exposed DP, per stage
  std::vector<double> first_forward_extra(static_cast<std::size_t>(pp), 0);
  if (overlapped_gathers && vpp == 1)
    for (int s = 0; s < pp; ++s) {
      const auto& b = plan[std::size_t(s)];
      // Where the first forward first reads each bucket (compute time from its start).
      const double embedding = s == 0 ? ef.ns : 0;
      std::vector<double> need(b.elements.size(), INFINITY);
      const auto first_layer = layers::train::layers_of(o.model, l, s, 0).first;
      for (std::size_t i = 0; i < b.params.size(); ++i) {
        const auto& p = b.params[i];
        const double at = p.layer >= 0 ? embedding + double(p.layer - first_layer) * lf.ns
                          : s == 0 && i + 1 == b.params.size()
                              ? 0
                              : embedding + layers_in(s, 0) * lf.ns;  // the LM head
        auto& x = need[std::size_t(b.bucket_of[i])];
        x = std::min(x, at);
      }
      double stall = 0, dp_free = 0;
      std::vector<double> done_at_k(b.elements.size(), NAN);
      for (int k = int(b.elements.size()) - 1; k >= 0; --k) {  // forward order
        const double reach = need[std::size_t(k)] + stall;
        if (std::isnan(done_at_k[std::size_t(k)]))
          done_at_k[std::size_t(k)] = dp_free = std::max(reach, dp_free) + b.gather[std::size_t(k)];
        const double resume = std::max(reach, done_at_k[std::size_t(k)]);
        stall += resume - reach;
        if (k > 0 && b.chunk[std::size_t(k - 1)] == b.chunk[std::size_t(k)])
          done_at_k[std::size_t(k) - 1] = dp_free =
              std::max(resume, dp_free) + b.gather[std::size_t(k) - 1];
      }
      first_forward_extra[std::size_t(s)] = stall;
      gather_stall[std::size_t(s)] = stall;
    }
  // Aligned: per stage, when each chunk's all-gathers are done (dispatched as the replay goes).
  std::vector<double> chunk_gathered(std::size_t(pp) * std::size_t(vpp), 0),
      gather_free(static_cast<std::size_t>(pp), 0);
  std::vector<int> forward_units(static_cast<std::size_t>(pp), 0);
  auto dispatch_chunk = [&](int s, int c, double at) {
    const auto& b = plan[std::size_t(s)];
    double& free = gather_free[std::size_t(s)];
    double& done_c = chunk_gathered[std::size_t(s) * std::size_t(vpp) + std::size_t(c)];
    for (std::size_t k = 0; k < b.elements.size(); ++k)
      if (b.chunk[k] == c) done_c = free = std::max(at, free) + b.gather[k];
  };
  if (overlapped_gathers && vpp > 1)
    for (int s = 0; s < pp; ++s)
      for (int c = 0; c < std::min(vpp, 2); ++c)
        dispatch_chunk(s, c, 0);

  // Replay: every stage runs its steps (pipeline_steps: passes and p2p calls) in order.
  std::vector<const std::vector<layers::train::PipelineStep>*> steps(static_cast<std::size_t>(pp));
  for (int s = 0; s < pp; ++s)
    steps[std::size_t(s)] = &memo->steps(l, s);
  // End time of every action, by (stage, direction, micro-batch, chunk); NaN: not run yet.
  std::vector<double> done_at(std::size_t(pp) * 2 * std::size_t(m) * std::size_t(vpp), NAN);
  auto done = [&](int stage, bool fwd, int mb, int chunk) -> double& {
    return done_at[((std::size_t(stage) * 2 + (fwd ? 1 : 0)) * std::size_t(m) + std::size_t(mb)) *
                       std::size_t(vpp) +
                   std::size_t(chunk)];
  };
  // Transfers, by the pass that receives them (stage, direction, micro-batch, chunk): when the
  // sender and the receiver posted them (blocking calls), and when they end; NaN: not yet.
  struct Transfer {
    double send_post = NAN, recv_post = NAN, end = NAN;
  };
  std::vector<Transfer> transfers(done_at.size());
  auto slot = [&](int stage, bool fwd, int mb, int chunk) {
    return std::size_t(&done(stage, fwd, mb, chunk) - done_at.data());
  };
  // A send of pass `a` of stage s: the receiving pass's slot, and the link it crosses (forward:
  // s to s + 1, the last stage's chunk c to the first stage's chunk c + 1; backward: the other
  // way); link_ns[i] and the link's queue are those of the pair (i, i + 1).
  struct Route {
    std::size_t slot;
    int link, from, to;
  };
  auto route_of_send = [&](int s, const PipelineAction& a) {
    if (a.forward) {
      const int to = (s + 1) % pp, chunk = s == pp - 1 ? a.chunk + 1 : a.chunk;
      return Route{slot(to, true, a.micro_batch, chunk), s, s, to};
    }
    const int to = (s + pp - 1) % pp, chunk = s == 0 ? a.chunk - 1 : a.chunk;
    return Route{slot(to, false, a.micro_batch, chunk), to, s, to};
  };
  auto route_of_recv = [&](int s, const PipelineAction& a) {
    const int from = a.forward ? (s + pp - 1) % pp : (s + 1) % pp;
    return a.forward ? Route{slot(s, true, a.micro_batch, a.chunk), from, from, s}
                     : Route{slot(s, false, a.micro_batch, a.chunk), s, from, s};
  };
  // A transfer leaves through its sender's port and enters through its receiver's, inside the
  // node or across it (the emulated timeline's link classes), and the timeline shares a port
  // between the transfers that cross it at once: here each port keeps its busy intervals, and a
  // transfer takes the first stretch from its ready time where both its ports are free.
  std::vector<std::vector<std::pair<double, double>>> out_busy(2 * std::size_t(pp)),
      in_busy(2 * std::size_t(pp));
  // Overlapped p2p keeps the queue of each link and direction, as before: a stage that runs far
  // ahead (nothing blocks it) would otherwise fill its ports' calendars out of time order.
  std::vector<double> fwd_link_free(static_cast<std::size_t>(pp), 0),
      bwd_link_free(static_cast<std::size_t>(pp), 0);
  auto queue_transfer = [&](const Route& r, bool fwd, double ready) {
    auto& link = (fwd ? fwd_link_free : bwd_link_free)[std::size_t(r.link)];
    link = std::max(ready, link) + link_ns[std::size_t(r.link)];
    transfers[r.slot].end = link;
  };
  auto run_transfer = [&](const Route& r, double ready) {
    const std::size_t across =
        prof.topology.node_of(per_stage * r.from) != prof.topology.node_of(per_stage * r.to);
    auto& out = out_busy[2 * std::size_t(r.from) + across];
    auto& in = in_busy[2 * std::size_t(r.to) + across];
    const double w = link_ns[std::size_t(r.link)];
    // A port's intervals do not overlap, so they are sorted by end as by start.
    double t = ready;
    for (bool moved = true; moved;) {
      moved = false;
      for (const auto* port : {&out, &in}) {
        auto it = std::lower_bound(
            port->begin(), port->end(), t,
            [](const std::pair<double, double>& iv, double x) { return iv.second <= x; });
        for (; it != port->end() && it->first < t + w; ++it) {
          t = it->second;
          moved = true;
        }
      }
    }
    for (auto* port : {&out, &in})
      port->insert(std::upper_bound(port->begin(), port->end(), std::pair{t, t + w}),
                   std::pair{t, t + w});
    transfers[r.slot].end = t + w;
  };
  std::vector<std::size_t> next(static_cast<std::size_t>(pp), 0);
  std::vector<char> posted(static_cast<std::size_t>(pp), 0);  // the current call is posted
  // Each stage first zeroes its gradient buffer (ParamBuffers::zero_grad: one pass writing it).
  std::vector<double> free_at(static_cast<std::size_t>(pp), 0);
  for (int s = 0; s < pp; ++s) {
    const auto& e = plan[std::size_t(s)].elements;
    free_at[std::size_t(s)] =
        memory_ns(prof, std::uint64_t(std::accumulate(e.begin(), e.end(), 0.0) * grad_bytes_each));
  }
  std::vector<double> busy(static_cast<std::size_t>(pp), 0),
      exposed_pp(static_cast<std::size_t>(pp), 0), exposed_tp_sum(static_cast<std::size_t>(pp), 0),
      exposed_cp_sum(static_cast<std::size_t>(pp), 0);
  double first_start = INFINITY, last_end = 0;  // the span of all stages' actions
  std::size_t remaining = 0;
  for (const auto& st : steps)
    remaining += st->size();
  // Stages run until they block on a neighbour; a stage that moved (or posted a call) wakes its
  // neighbours, the only stages it exchanges with.
  std::deque<int> queue;
  std::vector<char> queued(static_cast<std::size_t>(pp), 1);
  for (int s = 0; s < pp; ++s)
    queue.push_back(s);
  while (!queue.empty()) {
    const int s = queue.front();
    queue.pop_front();
    queued[std::size_t(s)] = 0;
    bool progressed = false;
    {
      auto& i = next[std::size_t(s)];
      auto& now = free_at[std::size_t(s)];
      while (i < steps[std::size_t(s)]->size()) {
        const auto& step = (*steps[std::size_t(s)])[i];
        if (step.kind == layers::train::PipelineStep::compute) {
          const PipelineAction& a = step.action;
          const PartCost cost = action_cost(s, a);
          if (overlapped_gathers && a.forward) {
            if (vpp > 1) {
              for (int c = 2; c < vpp; ++c)
                if (forward_units[std::size_t(s)] + s == (c - 1) * pp) dispatch_chunk(s, c, now);
              ++forward_units[std::size_t(s)];
              if (a.micro_batch == 0) {  // the chunk's pre-hooks wait for its all-gathers
                const double gathered =
                    chunk_gathered[std::size_t(s) * std::size_t(vpp) + std::size_t(a.chunk)];
                if (gathered > now) {
                  gather_stall[std::size_t(s)] += gathered - now;
                  now = gathered;
                }
              }
            } else if (a.micro_batch == 0) {
              now += first_forward_extra[std::size_t(s)];  // its pre-hooks' waits
            }
          }
          const double d = slowed ? stretched((*slowed)[std::size_t(s)], now, cost.ns) : cost.ns;
          done(s, a.forward, a.micro_batch, a.chunk) = now + d;
          first_start = std::min(first_start, now);
          last_end = std::max(last_end, now + d);
          if (record_pipeline)
            rep.pipeline.push_back({s, layers::train::action_label(a, vpp), a.forward,
                                    std::int64_t(now), std::int64_t(now + d)});
          now += d;
          busy[std::size_t(s)] += d;
          exposed_tp_sum[std::size_t(s)] += cost.exposed_tp_ns;
          exposed_cp_sum[std::size_t(s)] += cost.exposed_cp_ns;
        } else if (!step.blocking) {
          // Sends leave as soon as the pass is done and their link is free; the stage waits
          // only for its receives.
          if (!posted[std::size_t(s)]) {
            for (const auto& a : step.sends)
              queue_transfer(route_of_send(s, a), a.forward, now);
            posted[std::size_t(s)] = 1;
            progressed = progressed || !step.sends.empty();
          }
          bool ready = true;
          for (const auto& a : step.recvs)
            ready = ready && !std::isnan(transfers[route_of_recv(s, a).slot].end);
          if (!ready) break;
          posted[std::size_t(s)] = 0;
          double arrive = now, wire = 0;
          for (const auto& a : step.recvs) {
            const Route r = route_of_recv(s, a);
            arrive = std::max(arrive, transfers[r.slot].end);
            wire = std::max(wire, link_ns[std::size_t(r.link)]);
          }
          // Waiting for a transfer: the part of the wait the transfer itself takes is exposed
          // PP communication, the rest is the bubble.
          exposed_pp[std::size_t(s)] += std::min(arrive - now, wire);
          now = arrive;
        } else {
          // A blocking call: its transfers start when both ends have posted them (and the link
          // is free); the stage goes on when all of them are done.
          if (!posted[std::size_t(s)]) {
            for (const auto& a : step.sends)
              transfers[route_of_send(s, a).slot].send_post = now;
            for (const auto& a : step.recvs)
              transfers[route_of_recv(s, a).slot].recv_post = now;
            posted[std::size_t(s)] = 1;
            progressed = true;
          }
          bool complete = true;
          // The call's transfers on the wire (a call has at most two sends and two receives).
          std::array<std::pair<double, double>, 4> wires;
          std::size_t n_wires = 0;
          auto settle = [&](const Route& r) {
            if (std::isnan(transfers[r.slot].end)) {
              if (std::isnan(transfers[r.slot].send_post) ||
                  std::isnan(transfers[r.slot].recv_post)) {
                complete = false;
                return;
              }
              run_transfer(r, std::max(transfers[r.slot].send_post, transfers[r.slot].recv_post));
            }
            COCEMU_CHECK(n_wires < wires.size(), Errc::internal,
                         "step model: a p2p call with more than {} transfers", wires.size());
            wires[n_wires++] = {transfers[r.slot].end - link_ns[std::size_t(r.link)],
                                transfers[r.slot].end};
          };
          for (const auto& a : step.sends)
            settle(route_of_send(s, a));
          for (const auto& a : step.recvs)
            settle(route_of_recv(s, a));
          if (!complete) break;
          for (std::size_t k = 1; k < n_wires; ++k)  // by start (insertion sort of <= 4)
            for (std::size_t j = k; j > 0 && wires[j] < wires[j - 1]; --j)
              std::swap(wires[j], wires[j - 1]);
          double end = now;
          for (std::size_t k = 0; k < n_wires; ++k)
            end = std::max(end, wires[k].second);
          // Exposed PP: the time within the wait that a transfer of this call is on the wire.
          double covered = 0, reach = now;
          for (std::size_t k = 0; k < n_wires; ++k) {
            const auto [lo, hi] = wires[k];
            const double a = std::max(lo, reach), b = std::min(hi, end);
            if (b > a) covered += b - a;
            reach = std::max(reach, hi);
          }
          exposed_pp[std::size_t(s)] += covered;
          now = end;
          posted[std::size_t(s)] = 0;
        }
        ++i;
        --remaining;
        progressed = true;
      }
    }
    if (progressed)
      for (const int n : {(s + 1) % pp, (s + pp - 1) % pp})
        if (!queued[std::size_t(n)]) {
          queued[std::size_t(n)] = 1;
          queue.push_back(n);
        }
  }
  COCEMU_CHECK(remaining == 0, Errc::internal, "step model: the {} schedule stalled ({} p2p)",
               layers::train::to_string(l.schedule),
               layers::train::to_string(layers::train::p2p_mode(l)));

  // Whether stage s's DP reductions cross a link its TP or CP transfers use: a group uses the
  // node's fabric when two of its members share a node, the network when it spans nodes.
  auto links_of = [&](int first, int stride, int size) {
    unsigned u = 0;
    for (int i = 1; i < size; ++i) {
      const bool same = prof.topology.node_of(first + (i - 1) * stride) ==
                        prof.topology.node_of(first + i * stride);
      u |= same ? 1u : 2u;
    }
    return u;
  };
  auto shares_link = [&](int s) {
    const int base = per_stage * s;
    const unsigned dp_links = links_of(base, l.tp, dpc);
    const unsigned tp_cp = links_of(base, 1, l.tp) | links_of(base, l.tp, l.cp);
    return (dp_links & tp_cp) != 0;
  };
  // DP: each bucket's reduction launches when its last gradient is final in the last
  // micro-batch's backward (without --overlap-grad-reduce, after the backward), in that order on
  // the stage's DP stream.
  std::vector<double> stage_end(static_cast<std::size_t>(pp)),
      optimizer_ns(static_cast<std::size_t>(pp)), exposed_dp(static_cast<std::size_t>(pp), 0);
  for (int s = 0; s < pp; ++s) {
    const auto& b = plan[std::size_t(s)];
    auto dp_price = [&](CollOp op, std::int64_t count, DType t, std::uint64_t bytes) {
      return memo->price(op, per_stage * s, l.tp, dpc, count, t, bytes, det);
    };
    // When each parameter's gradient is final, in b.params' order.
    std::vector<double> bucket_ready(b.elements.size(), 0);
    {
      std::size_t i = 0;
      auto final_at = [&](double t) {
        auto& r = bucket_ready[std::size_t(b.bucket_of[i++])];
        r = std::max(r, l.overlap_grad_reduce ? t : free_at[std::size_t(s)]);
      };
      for (int c = vpp - 1; c >= 0; --c) {
        const double end = done(s, false, m - 1, c);
        double at = end - duration(s, {false, m - 1, c});
        if (s == pp - 1 && c == vpp - 1) final_at(at += sb.ns);
        for (double k = 0, n = layers_in(s, c); k < n; ++k) {
          at += lb.ns;
          for (std::size_t p = 0; p < layer_params.size(); ++p)
            final_at(at);
        }
        if (s == 0 && c == 0) final_at(end);
      }
    }
    std::vector<int> order(b.elements.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
      return bucket_ready[std::size_t(x)] < bucket_ready[std::size_t(y)];
    });
    double dp_free = 0, owned = 0, gather_ns = 0;
    // The stage's compute end; a reduction overlapping compute slows it (and is slowed), as the
    // last micro-batch's backward shares the rank with it. Buckets that become ready later are
    // late by what the reductions before them have slowed the backward.
    double compute_end = free_at[std::size_t(s)];
    const double unslowed_end = compute_end;
    PartCost last_backward;
    for (int c = 0; c < vpp; ++c)
      last_backward += action_cost(s, {false, m - 1, c});
    // When the replay already carries the reductions' slowdown of the compute, only their own
    // rate remains to apply.
    const Beside full = beside(last_backward, prof.contention, shares_link(s));
    const Beside mix = slowed ? Beside{1, full.rate} : full;
    for (const int k : order) {
      const double n = b.elements[std::size_t(k)];
      owned += l.distributed_optimizer ? n / dpc : n;
      if (dpc > 1) {
        const auto op = l.distributed_optimizer ? CollOp::reduce_scatter : CollOp::all_reduce;
        const std::int64_t count = std::int64_t(l.distributed_optimizer ? n / dpc : n);
        const double ns = dp_price(op, count, grad_t, std::uint64_t(n * grad_bytes_each));
        const double ready = bucket_ready[std::size_t(k)];
        const double start =
            std::max(ready < unslowed_end ? ready + (compute_end - unslowed_end) : ready, dp_free);
        const double compute_before = compute_end;
        dp_free = contended(start, ns, compute_end, mix);
        if (windows && start < compute_before)
          (*windows)[std::size_t(s)].push_back(
              {start, std::min(dp_free, compute_end), full.stretch});
      }
      if (!overlapped_gathers) gather_ns += b.gather[std::size_t(k)];
    }
    const double last = compute_end;
    // The grad norm's pass over the gradients this rank updates (trainer.cpp: its owned grads,
    // the shards with the distributed optimizer), before the norm's all-reduce.
    stage_end[std::size_t(s)] =
        std::max(last, dp_free) + memory_ns(prof, std::uint64_t(owned * grad_bytes_each));
    exposed_dp[std::size_t(s)] = std::max(0.0, dp_free - last) + gather_stall[std::size_t(s)];
    // Adam reads the gradient and the f32 (f64) master weights and moments, writes those three
    // back and the weights in their dtype; without --overlap-param-gather the all-gathers follow.
    const double state_bytes = l.dtype == DType::f64 ? 8 : 4;
    const double adam_bytes =
        owned * (6 * state_bytes + grad_bytes_each + double(size_of(l.dtype)));
    optimizer_ns[std::size_t(s)] = memory_ns(prof, std::uint64_t(adam_bytes)) + gather_ns;
    exposed_dp[std::size_t(s)] += gather_ns;
  }
  // The grad-norm all-reduce joins every stage, then each stage updates.
  const DType norm_t = l.dtype == DType::f64 ? DType::f64 : DType::f32;
  const double norm_ns = memo->price(CollOp::all_reduce, 0, 1, rep.world, 1, norm_t,
                                     std::uint64_t(size_of(norm_t)), det);
  const double sync = *std::max_element(stage_end.begin(), stage_end.end()) + norm_ns;
  const double iteration = sync + *std::max_element(optimizer_ns.begin(), optimizer_ns.end());
  rep.iteration_ns = std::int64_t(std::llround(iteration));
  const double seconds = iteration * 1e-9;
  rep.tokens_per_s = double(l.global_batch_size * o.model.seq) / seconds;
  rep.tflops_per_device = model_flops_per_iteration(o.model, l) / rep.world / seconds / 1e12;
  rep.mfu = rep.tflops_per_device * 1e12 / prof.peak(l.dtype);
  double idle = 0, tp = 0, cps = 0, pps = 0, dps = 0;
  for (int s = 0; s < pp; ++s) {
    idle += 1 - busy[std::size_t(s)] / (last_end - first_start);
    tp += exposed_tp_sum[std::size_t(s)];
    cps += exposed_cp_sum[std::size_t(s)];
    pps += exposed_pp[std::size_t(s)];
    dps += exposed_dp[std::size_t(s)] + norm_ns;
  }
  rep.bubble_fraction = idle / pp;
  rep.pipeline_span_ns = last_end - first_start;
  rep.ideal_bubble_fraction = layers::train::ideal_bubble_fraction(pp, vpp, m);
  rep.exposed_comm_ns = {{"TP", tp / pp}, {"CP", cps / pp}, {"DP", dps / pp}, {"PP", pps / pp}};
  rep.memory = estimate_memory(o.model, l, prof, memo);
  return rep;
}

}  // namespace

}  // namespace cocemu::bench
