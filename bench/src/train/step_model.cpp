// The step model (step_model.h): a training iteration composed from an emulated layer, the
// pipeline schedule replayed with priced transfers, and priced DP reductions.
#include "cocemu/bench/train/step_model.h"

#include "cocemu/bench/plan/part_model.h"

#include <fmt/format.h>
#include <tbb/concurrent_unordered_map.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string_view>

#include "../intervals.h"
#include "cocemu/collectives/plan.h"
#include "cocemu/layers/train/pipeline.h"
#include "cocemu/runtime/cost_model.h"
#include "cocemu/runtime/error.h"

namespace cocemu::bench {

using layers::train::PipelineAction;
using layers::train::TrainLayout;

StepParts emulate_parts(const TrainSetup& setup) {
  layers::train::TrainOptions o = setup.options;
  TrainLayout& l = o.layout;
  l.dp = 1;
  l.pp = 1;
  l.vpp = 1;
  l.schedule = layers::train::PipelineSchedule::one_f_one_b;
  l.stage_layers.clear();
  l.global_batch_size = l.micro_batch_size;
  l.distributed_optimizer = false;
  // The probe measures the parts, not the gradient reduction (priced below): with cp > 1 its
  // gradients would be reduced over the cp group during the layer's backward and slow it.
  l.overlap_grad_reduce = false;
  l.overlap_param_gather = false;
  l.grad_reduce_in_fp32 = true;  // the reduction's dtype is priced below
  o.model.num_layers = 1;
  o.iterations = 1;
  o.record_pieces = true;
  WorldOptions w;
  w.profile = setup.profile;
  w.numerics = false;
  w.deterministic = setup.deterministic;
  const auto r = layers::train::train(o, w);
  // A part costs what it costs on its slowest rank: the ranks of a CP ring do different blocks
  // (a causal ring's first rank sees only later ranks' blocks, cut to half their queries), and
  // the next part's first exchange waits for the last of them.
  std::vector<layers::train::PieceRange> pieces = r.pieces;  // in rank order: ties go to the first
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const auto& a, const auto& b) { return a.rank < b.rank; });
  std::map<std::string, PartCost> parts;
  for (const auto& p : pieces) {
    const auto& ops = r.run.graph.ranks[std::size_t(p.rank)].ops;
    const auto& times = r.run.timeline.rank(p.rank);
    const auto& lanes = r.run.graph.ranks[std::size_t(p.rank)].lane_names;
    std::int64_t lo = INT64_MAX, hi = 0;
    std::vector<detail::Interval> compute, tp, cp;
    for (std::uint32_t i = p.first_op; i < p.end_op; ++i) {
      if (ops[i].lane == 0 || ops[i].cls == OpClass::host || ops[i].cls == OpClass::wait) continue;
      lo = std::min(lo, times[i].start_ns);
      hi = std::max(hi, times[i].end_ns);
      const char* k = comm_kind(lanes[std::size_t(ops[i].lane)]);
      const std::string_view kind = k ? k : "";
      if (ops[i].cls != OpClass::comm)
        compute.push_back({times[i].start_ns, times[i].end_ns});
      else if (kind == "TP")
        tp.push_back({times[i].start_ns, times[i].end_ns});
      else if (kind == "CP")
        cp.push_back({times[i].start_ns, times[i].end_ns});
    }
    PartCost c;
    if (hi > lo) c.ns = double(hi - lo);
    // Exposed communication: comm time not covered by any compute of the part.
    const auto covered_by = detail::merged(compute);
    auto exposed = [&](const std::vector<detail::Interval>& comm) {
      return detail::uncovered(detail::merged(comm), covered_by);
    };
    c.exposed_tp_ns = exposed(tp);
    c.exposed_cp_ns = exposed(cp);
    if (const auto [it, fresh] = parts.try_emplace(p.what, c); !fresh && c.ns > it->second.ns)
      it->second = c;
  }
  auto part = [&](const char* what) {
    const auto it = parts.find(what);
    return it == parts.end() ? PartCost{} : it->second;
  };
  return {part("layer fwd"),     part("layer bwd"), part("embedding fwd"),
          part("embedding bwd"), part("loss fwd"),  part("loss bwd")};
}

namespace {

/// End of a transfer of `work` ns (at full speed) starting at `start` on a rank whose compute
/// runs until `compute_end`: while both run, the transfer progresses at 1/comm_slowdown and the
/// compute at 1/compute_slowdown (the emulated timeline's contention rule); `compute_end` moves
/// accordingly.
double contended(double start, double work, double& compute_end, const ContentionModel& c) {
  double t = start, left = work;
  if (t < compute_end) {
    double compute_left = compute_end - t;  // at full speed
    const double both = std::min(left * c.comm_slowdown, compute_left * c.compute_slowdown);
    left -= both / c.comm_slowdown;
    compute_left -= both / c.compute_slowdown;
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

TrainReport replay_step(const TrainSetup& setup, const StepParts& parts, StepMemo* memo,
                        bool record_pipeline) {
  std::optional<StepMemo> own_memo;  // without one, equal buckets still share their prices
  if (!memo) memo = &own_memo.emplace(setup.profile);
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
    PartCost c{n * layer.ns, n * layer.exposed_tp_ns, n * layer.exposed_cp_ns};
    for (const auto& [on, part] :
         {std::pair{first, a.forward ? ef : eb}, std::pair{last, a.forward ? sf : sb}})
      if (on) {
        c.ns += part.ns;
        c.exposed_tp_ns += part.exposed_tp_ns;
        c.exposed_cp_ns += part.exposed_cp_ns;
      }
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

  // Replay: every stage runs its actions in order; an action waits for its input's transfer.
  std::vector<const std::vector<PipelineAction>*> actions(static_cast<std::size_t>(pp));
  for (int s = 0; s < pp; ++s)
    actions[std::size_t(s)] = &memo->actions(l.schedule, pp, vpp, m, s);
  // End time of every action, by (stage, direction, micro-batch, chunk); NaN: not run yet.
  std::vector<double> done_at(std::size_t(pp) * 2 * std::size_t(m) * std::size_t(vpp), NAN);
  auto done = [&](int stage, bool fwd, int mb, int chunk) -> double& {
    return done_at[((std::size_t(stage) * 2 + (fwd ? 1 : 0)) * std::size_t(m) + std::size_t(mb)) *
                       std::size_t(vpp) +
                   std::size_t(chunk)];
  };
  std::vector<std::size_t> next(static_cast<std::size_t>(pp), 0);
  std::vector<double> free_at(static_cast<std::size_t>(pp), 0),
      busy(static_cast<std::size_t>(pp), 0), exposed_pp(static_cast<std::size_t>(pp), 0),
      exposed_tp_sum(static_cast<std::size_t>(pp), 0),
      exposed_cp_sum(static_cast<std::size_t>(pp), 0);
  std::vector<double> fwd_link_free(static_cast<std::size_t>(pp), 0),
      bwd_link_free(static_cast<std::size_t>(pp), 0);
  double first_start = INFINITY, last_end = 0;  // the span of all stages' actions
  std::size_t remaining = 0;
  for (const auto& a : actions)
    remaining += a->size();
  while (remaining > 0) {
    bool progressed = false;
    for (int s = 0; s < pp; ++s) {
      auto& i = next[std::size_t(s)];
      while (i < actions[std::size_t(s)]->size()) {
        const PipelineAction& a = (*actions[std::size_t(s)])[i];
        double ready = free_at[std::size_t(s)], transfer = 0;
        const bool first = s == 0 && a.chunk == 0, last = s == pp - 1 && a.chunk == vpp - 1;
        if (a.forward && !first) {
          const int from = s == 0 ? pp - 1 : s - 1, chunk = s == 0 ? a.chunk - 1 : a.chunk;
          const double input = done(from, true, a.micro_batch, chunk);
          if (std::isnan(input)) break;
          auto& link = fwd_link_free[std::size_t(from)];
          const double start = std::max(input, link);
          link = start + link_ns[std::size_t(from)];
          transfer = link;
        } else if (!a.forward && !last) {
          const int from = s == pp - 1 ? 0 : s + 1, chunk = s == pp - 1 ? a.chunk + 1 : a.chunk;
          const double input = done(from, false, a.micro_batch, chunk);
          if (std::isnan(input)) break;
          auto& link = bwd_link_free[std::size_t(s)];
          const double start = std::max(input, link);
          link = start + link_ns[std::size_t(s)];
          transfer = link;
        }
        if (transfer > ready) {
          // Waiting for a transfer: the part of the wait the transfer itself takes is exposed
          // PP communication, the rest is the bubble.
          const double wire =
              a.forward ? link_ns[std::size_t(s == 0 ? pp - 1 : s - 1)] : link_ns[std::size_t(s)];
          exposed_pp[std::size_t(s)] += std::min(transfer - ready, wire);
          ready = transfer;
        }
        const PartCost cost = action_cost(s, a);
        const double d = cost.ns;
        done(s, a.forward, a.micro_batch, a.chunk) = ready + d;
        first_start = std::min(first_start, ready);
        last_end = std::max(last_end, ready + d);
        if (record_pipeline)
          rep.pipeline.push_back({s, layers::train::action_label(a, vpp), a.forward,
                                  std::int64_t(ready), std::int64_t(ready + d)});
        free_at[std::size_t(s)] = ready + d;
        busy[std::size_t(s)] += d;
        exposed_tp_sum[std::size_t(s)] += cost.exposed_tp_ns;
        exposed_cp_sum[std::size_t(s)] += cost.exposed_cp_ns;
        ++i;
        --remaining;
        progressed = true;
      }
    }
    COCEMU_CHECK(progressed, Errc::internal, "step model: the {} schedule stalled",
                 layers::train::to_string(l.schedule));
  }

  // DP: buckets of each stage, in the order the backward finalizes gradients.
  const DType grad_t = l.dtype == DType::f64                            ? DType::f64
                       : l.grad_reduce_in_fp32 || l.dtype == DType::f32 ? DType::f32
                                                                        : l.dtype;
  const double grad_bytes_each = double(size_of(grad_t));
  const double cap = l.bucket_mb * 1e6 / grad_bytes_each;
  const double vocab_rows = double(layers::train::padded_vocab(o.model.vocab, l.tp)) / l.tp;
  const double h = double(o.model.hidden);
  const auto layer_params = linear_parameters(o.model);  // per linear, before TP
  std::vector<double> stage_end(static_cast<std::size_t>(pp)),
      optimizer_ns(static_cast<std::size_t>(pp)), exposed_dp(static_cast<std::size_t>(pp), 0);
  // Gradients are reduced over dp × cp (rank = tp + tp·(cp + cp·(dp + dp·pp))).
  const int dpc = l.dp * l.cp;
  for (int s = 0; s < pp; ++s) {
    auto dp_price = [&](CollOp op, std::int64_t count, DType t, std::uint64_t bytes) {
      return memo->price(op, per_stage * s, l.tp, dpc, count, t, bytes, det);
    };
    double dp_free = 0, bucket = 0, ready = 0, held = 0, owned = 0, gather_ns = 0;
    // The stage's compute end; a reduction overlapping compute slows it (and is slowed).
    double compute_end = free_at[std::size_t(s)];
    auto launch = [&] {
      if (bucket == 0) return;
      double n = bucket;
      if (l.distributed_optimizer) n = std::ceil(n / dpc) * dpc;
      owned += l.distributed_optimizer ? n / dpc : n;
      if (dpc > 1) {
        const auto op = l.distributed_optimizer ? CollOp::reduce_scatter : CollOp::all_reduce;
        const std::int64_t count = std::int64_t(l.distributed_optimizer ? n / dpc : n);
        const double ns = dp_price(op, count, grad_t, std::uint64_t(n * grad_bytes_each));
        const double start = std::max(ready, dp_free);
        dp_free = contended(start, ns, compute_end, prof.contention);
      }
      if (l.distributed_optimizer) {
        gather_ns += dp_price(CollOp::all_gather, std::int64_t(n / dpc), l.dtype,
                              std::uint64_t(n * double(size_of(l.dtype))));
      }
      bucket = 0;
      held = 0;
    };
    // Every parameter, as its gradient becomes final (ready time, elements), joins a bucket.
    auto add = [&](double t, double n) {
      bucket += n;
      held += 1;
      // Without --overlap-grad-reduce every reduction waits for the end of the backward.
      ready = l.overlap_grad_reduce ? t : free_at[std::size_t(s)];
      if ((l.bucket_params > 0 && held >= l.bucket_params) ||
          (l.bucket_params == 0 && bucket >= cap))
        launch();
    };
    for (int c = vpp - 1; c >= 0; --c) {
      const double end = done(s, false, m - 1, c);
      const double start = end - duration(s, {false, m - 1, c});
      double at = start;
      if (s == pp - 1 && c == vpp - 1) {
        at += sb.ns;
        add(at, vocab_rows * h);
      }
      for (double k = 0, n = layers_in(s, c); k < n; ++k) {
        at += lb.ns;
        for (const double p : layer_params)
          add(at, p / l.tp);
      }
      if (s == 0 && c == 0) add(end, vocab_rows * h);
    }
    launch();
    const double last = compute_end;
    stage_end[std::size_t(s)] = std::max(last, dp_free);
    exposed_dp[std::size_t(s)] = std::max(0.0, dp_free - last);
    if (l.overlap_param_gather && gather_ns > 0) {
      // --overlap-param-gather: the all-gathers run beside the next iteration's first forward
      // pass on this stage (all its chunks of micro-batch 0), both slowed while they overlap;
      // what the iteration pays is how much later that forward ends.
      double forward = 0;
      for (int c = 0; c < vpp; ++c)
        forward += duration(s, {true, 0, c});
      double compute_after = forward;
      const double gathered = contended(0, gather_ns, compute_after, prof.contention);
      gather_ns = std::max(gathered, compute_after) - forward;  // exposed below, once
    }
    // Adam reads the gradient and the f32 (f64) master weights and moments, writes those three
    // back and the weights in their dtype.
    const double state_bytes = l.dtype == DType::f64 ? 8 : 4;
    const double adam_bytes =
        owned * (6 * state_bytes + grad_bytes_each + double(size_of(l.dtype)));
    const double all_params = stage_parameters(o.model, l, s);
    optimizer_ns[std::size_t(s)] = memory_ns(prof, std::uint64_t(all_params * grad_bytes_each)) +
                                   memory_ns(prof, std::uint64_t(adam_bytes)) + gather_ns;
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
  rep.ideal_bubble_fraction = layers::train::ideal_bubble_fraction(pp, vpp, m);
  rep.exposed_comm_ns = {{"TP", tp / pp}, {"CP", cps / pp}, {"DP", dps / pp}, {"PP", pps / pp}};
  rep.memory = estimate_memory(o.model, l, prof, memo);
  return rep;
}

}  // namespace cocemu::bench
