#include "cocemu/bench/layer_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <limits>
#include <map>
#include <mutex>
#include <random>

#include "cocemu/collectives/ops.h"
#include "cocemu/runtime/blas.h"
#include "cocemu/runtime/checked.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/profile.h"
#include "cocemu/train/detail/intervals.h"

namespace cocemu::bench {

using layers::Strategy;

layers::CocConfig default_bench_coc() {
  layers::CocConfig c;
  c.tile_rows = 32;
  c.tiles_per_step = 2;
  return c;
}

std::vector<BenchStrategy> default_strategies(const layers::CocConfig& coc) {
  // Every strategy with the config's switches (SoC-friendly operands, recompute, tiling).
  auto with = [&](Strategy strategy, int parallel_num) {
    return layers::options_for(coc, strategy, parallel_num);
  };
  std::vector<BenchStrategy> s{{"serial", with(Strategy::serial, 1)}};
  for (int p : {2, 4, 8})
    s.push_back({fmt::format("script P={}", p), with(Strategy::script, p)});
  s.push_back({"fused", with(Strategy::fused, 1)});
  if (!coc.customized_coc.empty()) {
    layers::LinearOptions tuned;
    tuned.per_shape = std::make_shared<const layers::CocConfig>(coc);
    s.push_back({"tuned", tuned});
  }
  return s;
}

BenchConfig default_bench_config() {
  BenchConfig c;
  c.layer = {.seq = 2048,
             .batch = 1,
             .hidden = 1024,
             .heads = 16,
             .ffn = 2816,
             .kv_heads = 8,
             .activation = layers::Activation::swiglu,
             .sequence_parallel = true,
             .dtype = DType::bf16};
  return c;
}

BenchConfig bench_config_for(const layers::ModelConfig& m) {
  // Every modeled size derives from the tokens of a micro-batch: refuse what would not fit
  // (2^32 tokens is far beyond any training run, and keeps every product in range).
  checked_mul(
      m.seq_length, m.micro_batch_size,
      fmt::format("model '{}': seq_length x micro_batch_size (tokens per micro-batch)", m.name),
      std::int64_t(1) << 32);
  BenchConfig c;
  c.model = m.name;
  c.tp = m.tensor_model_parallel_size;
  c.layer = {.seq = m.seq_length,
             .batch = m.micro_batch_size,
             .hidden = m.hidden_size,
             .heads = m.num_attention_heads,
             .ffn = m.ffn_hidden_size,
             .kv_heads = m.num_query_groups,
             .activation = m.swiglu ? layers::Activation::swiglu : layers::Activation::gelu,
             .sequence_parallel = m.sequence_parallel,
             .dtype = DType::bf16,
             .flash_attention = m.flash_attention,
             .masked_softmax_fusion = m.masked_softmax_fusion};
  return c;
}

BenchConfig bench_config(const std::string& model, const std::string& profile) {
  BenchConfig c =
      model.empty() ? default_bench_config() : bench_config_for(layers::load_model_config(model));
  c.profile = std::make_shared<const DeviceProfile>(load_named_profile(profile));
  return c;
}

// ---------------------------------------------------------------------------------------------
// Timeline accounting

namespace {

using detail::intersection;
using detail::Interval;
using detail::length;
using detail::merged;

bool on_device(const OpRecord& op) {
  return op.lane > 0 &&
         (op.cls == OpClass::compute || op.cls == OpClass::comm || op.cls == OpClass::fused);
}

/// Accumulates a set of ops into SegmentStats.
struct Accumulator {
  std::vector<Interval> compute, comm;
  double fused_overlap = 0, fused_exposed = 0, fused_comm = 0;
  SegmentStats s;
  std::int64_t first = -1, last = 0, wall_first = -1, wall_last = 0;

  void add(const OpRecord& op, const ScheduledOp& t) {
    if (op.cls == OpClass::host) {
      s.host_ns += double(t.end_ns - t.start_ns);
      return;
    }
    if (!on_device(op)) return;
    if (op.wall_start_ns >= 0) {
      wall_first = wall_first < 0 ? op.wall_start_ns : std::min(wall_first, op.wall_start_ns);
      wall_last = std::max(wall_last, op.wall_end_ns);
    }
    first = first < 0 ? t.start_ns : std::min(first, t.start_ns);
    last = std::max(last, t.end_ns);
    const double dur = double(t.end_ns - t.start_ns);
    if (op.cls == OpClass::comm) {
      comm.push_back({t.start_ns, t.end_ns});
      s.comm_work_ns += op.work_ns;
      ++s.collectives;
    } else if (op.cls == OpClass::compute) {
      compute.push_back({t.start_ns, t.end_ns});
      s.compute_work_ns += op.work_ns;
      if (op.flops > 0) ++s.gemms;
    } else {  // fused: a pipeline of compute and comm inside one op
      compute.push_back({t.start_ns, t.end_ns});
      s.compute_work_ns += op.inner_compute_ns;
      s.comm_work_ns += op.inner_comm_ns;
      fused_overlap += std::max(0.0, op.inner_compute_ns + op.inner_comm_ns - dur);
      fused_exposed += std::max(0.0, dur - op.inner_compute_ns);
      fused_comm += op.inner_comm_ns;
      s.fused_steps += int(std::max<std::size_t>(op.phases ? op.phases->size() : 0, 2) - 1);
    }
  }

  SegmentStats finish() {
    const auto c = merged(compute), m = merged(comm);
    const double both = intersection(c, m);
    s.overlap_ns = both + fused_overlap;
    s.exposed_comm_ns = length(m) - both + fused_exposed;
    s.comm_time_ns = length(m) + fused_comm;
    s.span_ns = first < 0 ? 0 : double(last - first);
    s.wall_ns = wall_first < 0 ? -1 : double(wall_last - wall_first);
    return s;
  }
};

/// The host op that launched `op`, if any.
const OpRecord* host_launch(const ModelGraph& g, const OpRecord& op) {
  for (const OpRef& d : op.deps)
    if (d.rank == op.rank && g.op(d).cls == OpClass::host) return &g.op(d);
  return nullptr;
}

}  // namespace

std::vector<SegmentStats> segment_stats(const RunResult& run, int rank) {
  COCEMU_CHECK_ARG(rank >= 0 && rank < int(run.graph.ranks.size()),
                   "segment_stats: rank {} out of range 0..{}", rank,
                   int(run.graph.ranks.size()) - 1);
  std::vector<std::string> order;
  std::map<std::string, Accumulator> acc;
  std::map<std::pair<std::string, int>, bool> lane_seen;  // (segment, lane): first op seen
  std::map<int, std::int64_t> lane_end;                   // last modeled end per lane
  const auto& ops = run.graph.ranks[std::size_t(rank)].ops;
  for (const OpRecord& op : ops) {
    const ScheduledOp& t = run.timeline.at({rank, op.index});
    if (!op.segment.empty()) {
      auto [it, fresh] = acc.try_emplace(op.segment);
      if (fresh) {
        order.push_back(op.segment);
        it->second.s.name = op.segment;
      }
      it->second.add(op, t);
      if (on_device(op)) {
        bool& seen = lane_seen[{op.segment, op.lane}];
        if (seen) {
          ++it->second.s.device_ops;
          // Waited for the host: the lane was idle and the op began when its launch ended.
          const OpRecord* h = host_launch(run.graph, op);
          if (h) {
            const ScheduledOp& ht = run.timeline.at({rank, h->index});
            if (ht.end_ns == t.start_ns && lane_end[op.lane] < t.start_ns)
              ++it->second.s.host_gated;
          }
        }
        seen = true;
      }
    }
    if (op.lane > 0) lane_end[op.lane] = std::max(lane_end[op.lane], t.end_ns);
  }
  std::vector<SegmentStats> out;
  for (const auto& name : order)
    out.push_back(acc[name].finish());
  return out;
}

Verdict judge(const SegmentStats& serial, const SegmentStats& split) {
  constexpr double kTolerance = 0.15, kDominance = 4.0;
  auto us = [](double ns) { return ns / 1e3; };
  // Chunks of the split product: pipeline steps, or the GEMM launches beyond serial's.
  const int chunks = split.fused_steps > 0 ? split.fused_steps : split.gemms - serial.gemms + 1;
  if (chunks <= 1) {
    // No chunks: the strategy launched the same GEMMs as serial. Whatever the segment overlaps
    // then comes from its unsplit GEMMs and collectives running side by side (a backward's weight
    // gradient beside its input gradient's reduction), not from splitting.
    if (split.fused_steps > 0)
      return {false, "not split",
              "runs as a fused kernel of one step (nothing overlapped inside it)"};
    const std::string ops =
        fmt::format("{} GEMM{} and {} collective{}", split.gemms, split.gemms == 1 ? "" : "s",
                    split.collectives, split.collectives == 1 ? "" : "s");
    if (split.overlap_ns <= 0)
      return {false, "not split", fmt::format("runs as {}, unsplit (nothing overlapped)", ops)};
    return {false, "not split",
            fmt::format("runs its {} unchunked, as serial does; {:.1f} us of them overlapped "
                        "({:.1f} us serial)",
                        ops, us(split.overlap_ns), us(serial.overlap_ns))};
  }
  if (split.device_ops >= 2 && 2 * split.host_gated >= split.device_ops)
    return {false, "host bound",
            fmt::format("host bound: {} of {} chunk ops waited for their host launch ({:.1f} us "
                        "of launches for {:.1f} us of compute)",
                        split.host_gated, split.device_ops, us(split.host_ns),
                        us(split.compute_work_ns))};
  if (split.compute_work_ns > (1 + kTolerance) * serial.compute_work_ns)
    return {false, "matmul too small",
            fmt::format("matmul too small: split compute takes {:.2f}x the unsplit ({:.1f} vs "
                        "{:.1f} us)",
                        split.compute_work_ns / serial.compute_work_ns, us(split.compute_work_ns),
                        us(serial.compute_work_ns))};
  if (split.comm_work_ns > (1 + kTolerance) * serial.comm_work_ns)
    return {false, "comm degradation",
            fmt::format("comm degradation: split comm takes {:.2f}x the unsplit ({:.1f} vs "
                        "{:.1f} us)",
                        split.comm_work_ns / serial.comm_work_ns, us(split.comm_work_ns),
                        us(serial.comm_work_ns))};
  if (split.comm_work_ns > kDominance * split.compute_work_ns)
    return {false, "comm dominated",
            fmt::format("comm dominated: comm {:.1f} us is {:.1f}x the compute {:.1f} us",
                        us(split.comm_work_ns), split.comm_work_ns / split.compute_work_ns,
                        us(split.compute_work_ns))};
  if (split.compute_work_ns > kDominance * split.comm_work_ns)
    return {false, "compute dominated",
            fmt::format("compute dominated: compute {:.1f} us is {:.1f}x the comm {:.1f} us",
                        us(split.compute_work_ns), split.compute_work_ns / split.comm_work_ns,
                        us(split.comm_work_ns))};
  const double possible =
      std::min(split.compute_work_ns, split.comm_work_ns) * double(chunks - 1) / double(chunks);
  if (split.overlap_ns < 0.5 * possible)
    return {false, "no concurrency",
            fmt::format("no concurrency: compute and comm overlapped {:.1f} us, less than "
                        "half of the {:.1f} us possible from the second chunk on",
                        us(split.overlap_ns), us(possible))};
  if (split.span_ns >= serial.span_ns)
    return {false, "no gain",
            fmt::format("no gain: {:.1f} us vs {:.1f} us serial", us(split.span_ns),
                        us(serial.span_ns))};
  return {true, "",
          fmt::format("overlap succeeded: {:.1f} -> {:.1f} us ({:+.1f}%), {:.1f} us overlapped",
                      us(serial.span_ns), us(split.span_ns),
                      100.0 * (split.span_ns / serial.span_ns - 1), us(split.overlap_ns))};
}

const char* to_string(Recommendation::Use use) {
  switch (use) {
    case Recommendation::Use::yes:
      return "yes";
    case Recommendation::Use::without_fused:
      return "without fused kernels";
    case Recommendation::Use::no:
      return "no";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Running

namespace {

bool is_script(const BenchConfig& c, std::size_t strategy) {
  const layers::LinearOptions& o = c.strategies.at(strategy).options;
  return o.strategy == Strategy::script && !o.per_shape;
}

/// Per segment, whether to use each strategy (Recommendation): by modeled span on rank 0.
void recommend(BenchResult& r) {
  const auto& base = r.strategies.at(0).segments;
  const auto us = [](double ns) { return ns / 1e3; };
  for (std::size_t k = 0; k < base.size(); ++k) {
    const double serial = base[k].span_ns;
    const auto span = [&](std::size_t i) {
      return k < r.strategies[i].segments.size() ? r.strategies[i].segments[k].span_ns
                                                 : std::numeric_limits<double>::infinity();
    };
    std::size_t best = 0, best_script = 0;  // 0: serial / none
    for (std::size_t i = 1; i < r.strategies.size(); ++i) {
      if (span(i) < span(best)) best = i;
      if (is_script(r.config, i) && (best_script == 0 || span(i) < span(best_script)))
        best_script = i;
    }
    const auto vs_serial = [&](std::size_t i) { return 100.0 * (span(i) / serial - 1); };
    for (std::size_t i = 1; i < r.strategies.size(); ++i) {
      Recommendation rec;
      if (k >= r.strategies[i].segments.size()) {
        rec.text = "no: this strategy has no such segment";
      } else if (span(i) <= span(best)) {
        rec.use = Recommendation::Use::yes;
        rec.text = fmt::format(
            "use: the fastest on this segment, {:.1f} us vs serial {:.1f} us "
            "({:+.1f}%)",
            us(span(i)), us(serial), vs_serial(i));
      } else if (span(i) >= serial) {
        rec.text = fmt::format("no: not faster than serial ({:.1f} vs {:.1f} us)", us(span(i)),
                               us(serial));
      } else if (i == best_script) {
        rec.use = Recommendation::Use::without_fused;
        rec.text = fmt::format(
            "use without fused kernels: the fastest script split, {:.1f} us ({:+.1f}% vs "
            "serial); {} is {:.1f} us faster",
            us(span(i)), vs_serial(i), r.strategies[best].name, us(span(i) - span(best)));
      } else {
        const std::size_t better = is_script(r.config, i) ? best_script : best;
        rec.text = fmt::format("no: {} is faster ({:.1f} vs {:.1f} us)", r.strategies[better].name,
                               us(span(better)), us(span(i)));
      }
      r.strategies[i].recommendations.push_back(std::move(rec));
    }
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Tensor random_rows(std::int64_t m, std::int64_t h, DType t, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0, 1);
  Tensor f = Tensor::zeros({m, h}, DType::f32);
  for (std::int64_t i = 0; i < f.numel(); ++i)
    f.data<float>()[i] = d(rng);
  return t == DType::f32 ? f : f.to(t);
}

/// Whole-layer comm and exposed comm on rank 0.
std::pair<double, double> layer_comm(const RunResult& run) {
  Accumulator a;
  for (const OpRecord& op : run.graph.ranks[0].ops)
    if (op.segment != "setup") a.add(op, run.timeline.at({0, op.index}));
  const SegmentStats s = a.finish();
  return {s.comm_time_ns, s.exposed_comm_ns};
}

/// End of the setup barrier (the same on every rank): the layer's modeled time starts there.
std::int64_t setup_end(const RunResult& run) {
  std::int64_t end = 0;
  for (const OpRecord& op : run.graph.ranks[0].ops)
    if (op.segment == "setup") end = std::max(end, run.timeline.at({0, op.index}).end_ns);
  return end;
}

/// The forward's and the backward's device time, each on the rank where it takes longest (as
/// `cocemu train` measures the parts it composes a step from): from its first device op's start
/// to its last one's end, ops [first, mid) and [mid, end) of each rank.
std::pair<double, double> device_spans(const RunResult& run,
                                       const std::vector<std::array<std::size_t, 3>>& passes) {
  double fwd = 0, bwd = 0;
  for (std::size_t r = 0; r < passes.size(); ++r) {
    const auto& ops = run.graph.ranks[r].ops;
    auto span = [&](std::size_t first, std::size_t end) {
      std::int64_t lo = std::numeric_limits<std::int64_t>::max(), hi = 0;
      for (std::size_t i = first; i < end && i < ops.size(); ++i) {
        if (ops[i].lane == 0 || ops[i].cls == OpClass::host || ops[i].cls == OpClass::wait)
          continue;
        const auto t = run.timeline.at({int(r), ops[i].index});
        lo = std::min(lo, t.start_ns);
        hi = std::max(hi, t.end_ns);
      }
      return hi > lo ? double(hi - lo) : 0.0;
    };
    fwd = std::max(fwd, span(passes[r][0], passes[r][1]));
    bwd = std::max(bwd, span(passes[r][1], passes[r][2]));
  }
  return {fwd, bwd};
}

}  // namespace

BenchResult run_bench(const BenchConfig& c, const Progress& progress) {
  COCEMU_CHECK_ARG(c.tp >= 1 && c.tp <= 64, "bench: tp = {} must be in 1..64", c.tp);
  COCEMU_CHECK_ARG(c.repeats >= 1, "bench: repeats = {} must be >= 1", c.repeats);
  COCEMU_CHECK_ARG(!c.strategies.empty() && c.strategies[0].options.strategy == Strategy::serial &&
                       !c.strategies[0].options.per_shape,
                   "bench: the first strategy must be serial (the baseline); got '{}'",
                   c.strategies.empty() ? "<none>" : c.strategies[0].name);
  BenchResult result{c, {}};
  auto profile = c.profile
                     ? c.profile
                     : std::make_shared<const DeviceProfile>(load_named_profile("ascend-910b"));
  result.config.profile = profile;
  const layers::TransformerConfig& lc = c.layer;
  const std::int64_t m = lc.seq * lc.batch, ml = lc.sequence_parallel ? m / c.tp : m;
  const layers::TransformerWeights weights = c.dry_run ? layers::TransformerWeights::shapes(lc)
                                                       : layers::TransformerWeights::random(lc, 7);
  const Tensor x = c.dry_run ? Tensor::shape_only({m, lc.hidden}, lc.dtype)
                             : random_rows(m, lc.hidden, lc.dtype, 1);
  const Tensor dy = c.dry_run ? Tensor::shape_only({m, lc.hidden}, lc.dtype)
                              : random_rows(m, lc.hidden, lc.dtype, 2);
  const int runs = c.dry_run ? 1 : c.repeats;
  const int total = int(c.strategies.size()) * runs;
  int done = 0;
  std::vector<std::vector<std::byte>> serial_bits;
  for (const BenchStrategy& st : c.strategies) {
    StrategyResult sr;
    sr.name = st.name;
    std::vector<double> walls;
    std::map<std::string, std::vector<double>> segment_walls;
    std::vector<std::vector<std::byte>> bits(std::size_t(c.tp));
    // Each rank's ops [first, mid) are the forward's, [mid, end) the backward's (last run).
    std::vector<std::array<std::size_t, 3>> passes(std::size_t(c.tp));
    for (int rep = 0; rep < runs; ++rep) {
      WorldOptions wo;
      wo.n_ranks = c.tp;
      wo.hosts = c.hosts;
      wo.profile = profile;
      wo.numerics = !c.dry_run;
      wo.deterministic = c.deterministic;
      wo.record_wall_times = !c.dry_run;  // per-segment wall times
      std::vector<double> per_rank(std::size_t(c.tp));
      std::mutex mu;
      sr.run = run(wo, [&](Rank& rank) {
        Group tp = Group::world(rank);
        layers::TransformerLayer layer(tp, lc, weights);
        const std::int64_t r0 = lc.sequence_parallel ? rank.id() * ml : 0;
        const Tensor xr =
            c.dry_run ? Tensor::shape_only({ml, lc.hidden}, lc.dtype) : x.rows(r0, r0 + ml).clone();
        const Tensor dyr = c.dry_run ? Tensor::shape_only({ml, lc.hidden}, lc.dtype)
                                     : dy.rows(r0, r0 + ml).clone();
        rank.set_segment("setup");
        barrier(tp).synchronize();
        rank.set_segment("");
        const auto t0 = std::chrono::steady_clock::now();
        auto& pass = passes[std::size_t(rank.id())];
        pass[0] = rank.graph().ops.size();
        const Tensor y = layer.forward(xr, st.options);
        pass[1] = rank.graph().ops.size();
        const Tensor dx = layer.backward(dyr, st.options);
        pass[2] = rank.graph().ops.size();
        rank.synchronize();
        per_rank[std::size_t(rank.id())] = double((std::chrono::steady_clock::now() - t0).count());
        if (rep == 0 && !c.dry_run) {
          std::vector<std::byte> b;
          for (const Tensor* t : {&y, &dx, &layer.qkv().main_grad(), &layer.attn_out().main_grad(),
                                  &layer.mlp_up().main_grad(), &layer.mlp_down().main_grad()}) {
            const auto* p = static_cast<const std::byte*>(t->raw());
            b.insert(b.end(), p, p + t->nbytes());
          }
          std::lock_guard lock(mu);
          bits[std::size_t(rank.id())] = std::move(b);
        }
      });
      walls.push_back(*std::max_element(per_rank.begin(), per_rank.end()));
      for (const SegmentStats& s : segment_stats(sr.run, 0))
        segment_walls[s.name].push_back(s.wall_ns);
      if (progress) progress(++done, total, fmt::format("{} run {}/{}", st.name, rep + 1, runs));
    }
    if (c.hosts) {  // each host knows its own ranks' passes (the others' are zero)
      merge_disjoint_parts(*c.hosts, std::as_writable_bytes(std::span(passes)),
                           "bench passes of " + st.name);
    }
    sr.modeled_ns = sr.run.timeline.makespan_ns() - setup_end(sr.run);
    std::tie(sr.forward_device_ns, sr.backward_device_ns) = device_spans(sr.run, passes);
    if (!c.dry_run) {
      sr.wall_ns = median(walls);  // on several hosts: this host's ranks
      if (result.strategies.empty()) serial_bits = bits;
      sr.bitwise_equal_serial = bits == serial_bits;  // on several hosts: this host's ranks
      if (c.hosts) {
        std::vector<std::uint8_t> differs(std::size_t(c.hosts->n_hosts()), 0);
        differs[std::size_t(c.hosts->host())] = !sr.bitwise_equal_serial;
        merge_disjoint_parts(*c.hosts, std::as_writable_bytes(std::span(differs)),
                             "bench bits of " + st.name);
        sr.bitwise_equal_serial =
            std::count(differs.begin(), differs.end(), 0) == int(differs.size());
      }
    }
    std::tie(sr.comm_ns, sr.exposed_comm_ns) = layer_comm(sr.run);
    for (SegmentStats& s : segment_stats(sr.run, 0))
      if (s.name != "setup") {
        if (!c.dry_run) s.wall_ns = median(segment_walls[s.name]);
        sr.segments.push_back(std::move(s));
      }
    if (!result.strategies.empty()) {
      const auto& serial = result.strategies[0].segments;
      for (const SegmentStats& s : sr.segments) {
        auto it = std::find_if(serial.begin(), serial.end(),
                               [&](const SegmentStats& t) { return t.name == s.name; });
        sr.verdicts.push_back(it == serial.end()
                                  ? Verdict{false, "no baseline", "serial has no such segment"}
                                  : judge(*it, s));
      }
    }
    result.strategies.push_back(std::move(sr));
  }
  recommend(result);
  return result;
}

// ---------------------------------------------------------------------------------------------
// Reports

namespace {

std::string describe(const BenchConfig& c) {
  const auto& l = c.layer;
  return fmt::format(
      "{}: hidden {}, heads {} (KV groups {}), FFN {} ({}), seq {} x batch {}, TP={}{}, {}, "
      "{} attention, profile {}",
      c.model, l.hidden, l.heads, l.kv(), l.ffn,
      l.activation == layers::Activation::swiglu ? "SwiGLU" : "GeLU", l.seq, l.batch, c.tp,
      l.sequence_parallel ? " with SP" : "", name_of(l.dtype),
      l.flash_attention         ? "flash"
      : l.masked_softmax_fusion ? "unfused"
                                : "unfused (softmax unfused, f32)",
      c.profile ? c.profile->name : "?");
}

/// The strategies recommended for segment `seg`: the one to use (0 = serial) and the one to use
/// without the fused kernels (-1 = none).
std::pair<std::size_t, int> recommended(const BenchResult& r, std::size_t seg) {
  std::size_t use = 0;
  int script = -1;
  for (std::size_t i = 1; i < r.strategies.size(); ++i) {
    if (seg >= r.strategies[i].recommendations.size()) continue;
    const Recommendation::Use u = r.strategies[i].recommendations[seg].use;
    if (u == Recommendation::Use::yes && use == 0) use = i;
    if (u == Recommendation::Use::without_fused) script = int(i);
    if (u == Recommendation::Use::yes && script < 0 && is_script(r.config, i)) script = int(i);
  }
  return {use, script};
}

/// One line: what to use on segment `k`, and what without the fused kernels.
std::string segment_advice(const BenchResult& r, std::size_t k) {
  const auto& base = r.strategies.at(0).segments;
  const double serial = base[k].span_ns;
  const auto [use, script] = recommended(r, k);
  const auto span = [&](std::size_t i) { return r.strategies[i].segments[k].span_ns; };
  if (use == 0) {
    std::size_t runner = 0;
    for (std::size_t i = 1; i < r.strategies.size(); ++i)
      if (k < r.strategies[i].segments.size() && (runner == 0 || span(i) < span(runner)))
        runner = i;
    return runner == 0
               ? fmt::format("use serial ({:.1f} us)", serial / 1e3)
               : fmt::format("use serial ({:.1f} us): no split is faster (best split {} {:.1f} us)",
                             serial / 1e3, r.strategies[runner].name, span(runner) / 1e3);
  }
  std::string out =
      fmt::format("use {}: {:.1f} us vs serial {:.1f} us ({:+.1f}%)", r.strategies[use].name,
                  span(use) / 1e3, serial / 1e3, 100.0 * (span(use) / serial - 1));
  if (script >= 0 && std::size_t(script) != use)
    out += fmt::format("; without fused kernels: {} {:.1f} us ({:+.1f}%)",
                       r.strategies[std::size_t(script)].name, span(std::size_t(script)) / 1e3,
                       100.0 * (span(std::size_t(script)) / serial - 1));
  else if (script < 0 && !is_script(r.config, use))
    out += "; without fused kernels: serial (no script split is faster)";
  return out;
}

}  // namespace

nlohmann::json to_json(const BenchResult& r) {
  const bool dry = r.config.dry_run;
  nlohmann::json j;
  j["dry_run"] = dry;
  if (dry) j["note"] = "dry run: shapes only, numerics skipped; modeled times only";
  j["model"] = r.config.model;
  j["config"] = describe(r.config);
  j["deterministic"] = r.config.deterministic;
  j["repeats"] = dry ? 0 : r.config.repeats;
  if (!dry) {
    j["openblas_core"] = blas::core_name();
    j["openblas_core_advice"] = blas::core_advice();
  }
  const double serial = double(r.strategies.at(0).modeled_ns);
  for (const StrategyResult& s : r.strategies) {
    nlohmann::json e{
        {"name", s.name},
        {"modeled_ns", s.modeled_ns},
        {"speedup_vs_serial", serial / double(std::max<std::int64_t>(1, s.modeled_ns))},
        {"forward_device_ns", s.forward_device_ns},
        {"backward_device_ns", s.backward_device_ns},
        {"comm_ns", s.comm_ns},
        {"exposed_comm_ns", s.exposed_comm_ns}};
    e["wall_ns"] = dry ? nlohmann::json(nullptr) : nlohmann::json(s.wall_ns);
    e["bitwise_equal_serial"] =
        s.bitwise_equal_serial ? nlohmann::json(*s.bitwise_equal_serial) : nlohmann::json(nullptr);
    j["strategies"].push_back(e);
  }
  const auto& base = r.strategies.at(0).segments;
  for (std::size_t k = 0; k < base.size(); ++k) {
    nlohmann::json seg{{"name", base[k].name}, {"serial_ns", base[k].span_ns}};
    seg["serial_wall_ns"] = dry ? nlohmann::json(nullptr) : nlohmann::json(base[k].wall_ns);
    for (std::size_t i = 1; i < r.strategies.size(); ++i) {
      const StrategyResult& s = r.strategies[i];
      if (k >= s.segments.size()) continue;
      const SegmentStats& t = s.segments[k];
      seg["strategies"].push_back(
          {{"name", s.name},
           {"modeled_ns", t.span_ns},
           {"speedup_vs_serial", base[k].span_ns / std::max(1.0, t.span_ns)},
           {"wall_ns", dry ? nlohmann::json(nullptr) : nlohmann::json(t.wall_ns)},
           {"compute_ns", t.compute_work_ns},
           {"comm_ns", t.comm_work_ns},
           {"overlap_ns", t.overlap_ns},
           {"exposed_comm_ns", t.exposed_comm_ns},
           {"host_ns", t.host_ns},
           {"gemms", t.gemms},
           {"fused_steps", t.fused_steps},
           {"use", to_string(s.recommendations[k].use)},
           {"recommendation", s.recommendations[k].text},
           {"criteria_met", s.verdicts[k].success},
           {"criteria_failed", s.verdicts[k].failed},
           {"criteria", s.verdicts[k].text}});
    }
    const auto [use, script] = recommended(r, k);
    seg["best_strategy"] = r.strategies[use].name;
    seg["best_script_split"] =
        script >= 0 ? nlohmann::json(r.strategies[std::size_t(script)].name) : nlohmann::json();
    seg["recommendation"] = segment_advice(r, k);
    j["segments"].push_back(seg);
  }
  return j;
}

Conclusions bench_conclusions(const BenchResult& r) {
  Conclusions c;
  const auto& base = r.strategies.at(0).segments;
  for (std::size_t k = 0; k < base.size(); ++k) {
    const auto [use, script] = recommended(r, k);
    c[base[k].name + " best strategy"] = r.strategies[use].name;
    c[base[k].name + " best script split"] =
        script >= 0 ? r.strategies[std::size_t(script)].name : "none";
    for (std::size_t i = 1; i < r.strategies.size(); ++i)
      if (k < r.strategies[i].verdicts.size()) {
        const Verdict& v = r.strategies[i].verdicts[k];
        c[base[k].name + " " + r.strategies[i].name + " criteria"] =
            v.success ? "overlap succeeded" : v.failed;
      }
  }
  std::size_t fastest = 0;
  for (std::size_t i = 1; i < r.strategies.size(); ++i)
    if (r.strategies[i].modeled_ns < r.strategies[fastest].modeled_ns) fastest = i;
  c["fastest strategy"] = r.strategies[fastest].name;
  return c;
}

std::string format_report(const BenchResult& r, const Sensitivity* sens) {
  const auto fragile = [&](const std::string& what) {
    const std::string why = sens ? sens->fragile(what) : "";
    return why.empty() ? std::string() : "  [fragile: " + why + "]";
  };
  const bool dry = r.config.dry_run;
  std::string out = fmt::format("# cocemu bench — {}\n", describe(r.config));
  out += dry ? "# DRY RUN: shapes only, numerics skipped — modeled times only, no wall time, no "
               "bitwise check\n"
             : fmt::format("# real numerics, {} mode; wall = median of {} runs on this host\n",
                           r.config.deterministic ? "deterministic" : "non-deterministic",
                           r.config.repeats);
  if (!dry)
    if (const std::string advice = blas::core_advice(); !advice.empty())
      out += "# WARNING: " + advice + "\n";
  if (r.config.deterministic)
    out +=
        "# deterministic mode prices the rank-ordered collective plans it runs (slower than "
        "a library's ring where the profile picks ring)\n";
  out += "# forward+backward of one layer; modeled on the device profile (rank 0 for comm)\n\n";
  out += fmt::format("{:<12} {:>12} {:>8} {:>11} {:>12} {:>10} {:>8}\n", "strategy", "modeled us",
                     "speedup", "comm us", "exposed us", "wall ms", "bitwise");
  const double serial = double(r.strategies.at(0).modeled_ns);
  for (const StrategyResult& s : r.strategies)
    out += fmt::format("{:<12} {:>12.1f} {:>7.2f}x {:>11.1f} {:>12.1f} {:>10} {:>8}\n", s.name,
                       double(s.modeled_ns) / 1e3,
                       serial / double(std::max<std::int64_t>(1, s.modeled_ns)), s.comm_ns / 1e3,
                       s.exposed_comm_ns / 1e3,
                       dry ? std::string("-") : fmt::format("{:.1f}", s.wall_ns / 1e6),
                       !s.bitwise_equal_serial ? "-" : (*s.bitwise_equal_serial ? "yes" : "NO"));
  out += "\n# CoC segments: modeled us (rank 0, first device op to last)\n";
  out += fmt::format("{:<14}", "segment");
  for (const StrategyResult& s : r.strategies)
    out += fmt::format(" {:>11}", s.name);
  out += "\n";
  const auto& base = r.strategies.at(0).segments;
  for (std::size_t k = 0; k < base.size(); ++k) {
    out += fmt::format("{:<14}", base[k].name);
    for (const StrategyResult& s : r.strategies)
      out += k < s.segments.size() ? fmt::format(" {:>11.1f}", s.segments[k].span_ns / 1e3)
                                   : fmt::format(" {:>11}", "-");
    out += "\n";
  }
  if (!dry) {
    out += "\n# CoC segments: host wall ms (rank 0, median of runs)\n";
    out += fmt::format("{:<14}", "segment");
    for (const StrategyResult& s : r.strategies)
      out += fmt::format(" {:>11}", s.name);
    out += "\n";
    for (std::size_t k = 0; k < base.size(); ++k) {
      out += fmt::format("{:<14}", base[k].name);
      for (const StrategyResult& s : r.strategies)
        out += k < s.segments.size() ? fmt::format(" {:>11.2f}", s.segments[k].wall_ns / 1e6)
                                     : fmt::format(" {:>11}", "-");
      out += "\n";
    }
  }
  out +=
      "\n# which strategy to use per CoC segment (the fastest modeled time; without the fused "
      "kernels, the fastest script split)\n";
  for (std::size_t k = 0; k < base.size(); ++k) {
    out += fmt::format("{:<14} {}{}{}\n", base[k].name, segment_advice(r, k),
                       fragile(base[k].name + " best strategy"),
                       fragile(base[k].name + " best script split"));
    for (std::size_t i = 1; i < r.strategies.size(); ++i)
      if (k < r.strategies[i].recommendations.size())
        out += fmt::format("  {:<11} {}\n", r.strategies[i].name,
                           r.strategies[i].recommendations[k].text);
  }
  out +=
      "\n# MindSpeed's overlap criteria per segment (R-BE-3: no matmul/comm degradation, "
      "concurrency from the 2nd chunk, balance, gain) — diagnostics of why a split gains or "
      "not; the recommendation above is by modeled time\n";
  for (std::size_t k = 0; k < base.size(); ++k) {
    out += base[k].name + "\n";
    for (std::size_t i = 1; i < r.strategies.size(); ++i)
      if (k < r.strategies[i].verdicts.size()) {
        const Verdict& v = r.strategies[i].verdicts[k];
        out += fmt::format("  {:<11} {:<8} {}{}\n", r.strategies[i].name,
                           v.success ? "met" : "not met", v.text,
                           fragile(base[k].name + " " + r.strategies[i].name + " criteria"));
      }
  }
  return out;
}

}  // namespace cocemu::bench
