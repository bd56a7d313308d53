// `cocemu plan` (plan.h): enumerate, prune by rules and memory, evaluate with the step model on
// priced parts in a oneTBB arena, rank.
#include "cocemu/train/plan.h"

#include <fmt/format.h>
#include <tbb/concurrent_hash_map.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>

#include "cocemu/layers/coc_config.h"
#include "cocemu/runtime/error.h"
#include "cocemu/train/config.h"
#include "cocemu/train/part_model.h"
#include "cocemu/train/step_model.h"

namespace cocemu::bench {

using layers::train::PipelineSchedule;
using layers::train::Recompute;
using layers::train::TrainLayout;

const char* to_string(SearchMode m) {
  switch (m) {
    case SearchMode::exhaustive:
      return "exhaustive";
    case SearchMode::dynamic_programming:
      return "dynamic_programming";
    case SearchMode::recursive_programming:
      return "recursive_programming";
  }
  return "?";
}

SearchMode parse_search_mode(const std::string& name) {
  for (const auto m :
       {SearchMode::exhaustive, SearchMode::dynamic_programming, SearchMode::recursive_programming})
    if (name == to_string(m)) return m;
  COCEMU_FAIL(Errc::invalid_argument,
              "search mode '{}'; allowed: exhaustive, dynamic_programming, recursive_programming",
              name);
}

std::string PlanCandidate::describe() const {
  return layout.describe();  // the CP algorithm, the layer split and multi-copy included
}

layers::CocConfig plan_coc_config() {
  layers::CocConfig coc;
  coc.tile_rows = 32;  // as `cocemu train` and `bench`
  return coc;
}

namespace {

// ---------------------------------------------------------------------------------------------
// The shared state of one search: memoized parts (per layer shape) and DP collective prices.

struct PartsEntry {
  StepParts parts;
  std::map<std::string, int> tuned;
  bool tp_comm_overlap = false;  ///< priced with Megatron-LM's --tp-comm-overlap on
};

/// What one micro-batch of every part costs on a stage holding all `layers` (to compare two
/// pricings of the same layout).
double micro_batch_ns(const StepParts& p, std::int64_t layers) {
  return double(layers) * (p.layer_fwd.ns + p.layer_bwd.ns) + p.embedding_fwd.ns +
         p.embedding_bwd.ns + p.loss_fwd.ns + p.loss_bwd.ns;
}

class Evaluator {
 public:
  explicit Evaluator(const PlanQuery& r) : r_(r), collectives_(r.profile) {}

  TrainSetup setup_for(const TrainLayout& l) const {
    TrainSetup s;
    s.profile = r_.profile;
    s.nodes = r_.nodes;
    s.dry_run = true;
    s.deterministic = r_.deterministic;
    s.options.model = r_.model;
    s.options.layout = l;
    s.options.linear = layers::options_for(plan_coc_config(), layers::Strategy::serial, 1);
    s.coc_name = "tuned";
    return s;
  }

  std::shared_ptr<const PartsEntry> parts(const TrainSetup& s) {
    const TrainLayout& l = s.options.layout;
    const std::string key =
        fmt::format("{} {} {} {} {} {} {}", l.tp, l.cp, l.cp_algo, l.micro_batch_size,
                    l.sequence_parallel, int(l.recompute), l.micro_batch_interleave);
    {
      Map::const_accessor a;
      if (parts_.find(a, key)) return a->second;
    }
    // The first thread to miss prices the parts while holding the entry; others wait for it.
    Map::accessor a;
    if (parts_.insert(a, key)) a->second = price(s);
    return a->second;
  }

  /// The parts with the TP overlap the platform has (its profile's tp_overlap): per GEMM shape
  /// among MindSpeed's script splits and the LCOC fused kernel, or Megatron-LM's
  /// --tp-comm-overlap for every TP linear (priced by the profile's fused: steps) when faster.
  std::shared_ptr<const PartsEntry> price(const TrainSetup& s) const {
    auto e = std::make_shared<PartsEntry>();
    const TrainLayout& l = s.options.layout;
    const DeviceProfile& p = *r_.profile;
    if (p.has_tp_overlap("te_userbuffers")) {
      e->parts = price_parts(s);
      if (l.tp > 1 && l.sequence_parallel) {  // Megatron asserts SP with --tp-comm-overlap
        TrainSetup fused = s;
        fused.options.linear = layers::options_for(plan_coc_config(), layers::Strategy::fused, 1);
        const StepParts f = price_parts(fused);
        if (micro_batch_ns(f, r_.model.num_layers) <
            micro_batch_ns(e->parts, r_.model.num_layers)) {
          e->parts = f;
          e->tp_comm_overlap = true;
        }
      }
      return e;
    }
    std::vector<int> values;
    if (p.has_tp_overlap("mindspeed_coc")) values = {2, 4, 8};
    // MindSpeed's LCOC fused kernels support TP 8 only (its feature doc, locl_coc.py).
    if (p.has_tp_overlap("lcoc_fused") && l.tp == kLcocFusedTp) values.push_back(-1);
    if (values.empty())
      e->parts = price_parts(s);
    else
      e->parts = price_parts(s, &e->tuned, values);
    return e;
  }

  PlanCandidate evaluate(const TrainLayout& l) {
    PlanCandidate c;
    c.layout = l;
    // With the distributed optimizer the parameter all-gathers overlap the next forward
    // (Megatron's --overlap-param-gather): never slower in the model, so not a dimension.
    c.layout.overlap_param_gather = l.distributed_optimizer;
    c.layout.cross_entropy_fusion = r_.cross_entropy_fusion;
    TrainSetup s = setup_for(c.layout);
    const auto e = parts(s);
    c.customized_coc = e->tuned;
    c.tp_comm_overlap = e->tp_comm_overlap;
    c.report = replay_step(s, e->parts, &collectives_, false);
    return c;
  }

  std::size_t memo_sizes() const { return parts_.size() + collectives_.size(); }
  StepMemo* memo() { return &collectives_; }

 private:
  using Map = tbb::concurrent_hash_map<std::string, std::shared_ptr<const PartsEntry>>;
  const PlanQuery& r_;
  Map parts_;
  StepMemo collectives_;
};

int world_of(const PlanQuery& r) {
  return r.nodes * r.profile->topology.devices_per_node;
}

std::vector<int> powers_of_two_up_to(int n) {
  std::vector<int> v;
  for (int x = 1; x <= n; x *= 2)
    v.push_back(x);
  return v;
}

void check_request(const PlanQuery& r) {
  COCEMU_CHECK_ARG(r.profile, "plan: no device profile");
  COCEMU_CHECK_ARG(r.nodes >= 1 && r.nodes <= 4096, "plan: --nodes {}; allowed 1..4096", r.nodes);
  COCEMU_CHECK_ARG(r.global_batch >= 1, "plan: --global-batch {}; must be >= 1", r.global_batch);
  COCEMU_CHECK_ARG(r.model.seq >= 2 && r.model.num_layers >= 1 && r.model.hidden >= 1,
                   "plan: model {} has seq {}, layers {}, hidden {}; all must be positive",
                   r.model.name, r.model.seq, r.model.num_layers, r.model.hidden);
  COCEMU_CHECK_ARG(r.top_k >= 1 && r.top_k <= 1000, "plan: --top {}; allowed 1..1000", r.top_k);
  COCEMU_CHECK_ARG(r.threads >= 0 && r.threads <= 1024, "plan: --threads {}; allowed 0..1024",
                   r.threads);
  COCEMU_CHECK_ARG(r.dtype == DType::bf16 || r.dtype == DType::f32,
                   "plan: --dtype {} is not searched; allowed: bf16, f32 (training dtypes with a "
                   "peak rate in every profile; f64 is for `cocemu train`'s accuracy runs)",
                   name_of(r.dtype));
}

}  // namespace

void for_each_layout(const PlanQuery& r, const std::function<void(const TrainLayout&)>& visit) {
  check_request(r);
  const int world = world_of(r), per_node = r.profile->topology.devices_per_node;
  const auto& m = r.model;
  for (const int tp : powers_of_two_up_to(per_node))
    for (const int cp : powers_of_two_up_to(r.max_cp))
      for (const char* algo : {"megatron_cp_algo", "ulysses_cp_algo"}) {
        if (cp == 1 && std::string(algo) != "megatron_cp_algo") continue;
        if (world % (tp * cp) != 0) continue;
        const int rest = world / (tp * cp);
        for (int pp = 1; pp <= rest; ++pp) {
          if (rest % pp != 0 || pp > m.num_layers) continue;
          const int dp = rest / pp;
          // Every virtual size up to the limit, as Megatron's layers per virtual stage allow
          // (Narayanan et al.'s 76B and Korthikanti et al.'s 175B and 530B ran vpp 3).
          for (int vpp = 1; vpp <= r.max_vpp; ++vpp) {
            if (vpp > 1 && pp < 2) continue;
            for (const std::int64_t mbs : r.micro_batch_sizes)
              for (const Recompute rc : {Recompute::none, Recompute::selective, Recompute::full})
                for (const bool dist : {false, true}) {
                  if (dist && dp * cp == 1) continue;  // nothing to shard
                  for (const bool sp : {true, false}) {
                    if (!sp && tp == 1) continue;  // SP needs TP
                    for (const int copies : {1, 2}) {
                      TrainLayout l;
                      l.tp = tp;
                      l.cp = cp;
                      l.cp_algo = algo;
                      l.pp = pp;
                      l.dp = dp;
                      l.vpp = vpp;
                      l.schedule =
                          vpp > 1 ? PipelineSchedule::interleaved : PipelineSchedule::one_f_one_b;
                      l.micro_batch_size = mbs;
                      l.global_batch_size = r.global_batch;
                      l.recompute = rc;
                      l.distributed_optimizer = dist;
                      l.sequence_parallel = sp && tp > 1;
                      l.micro_batch_interleave = copies;
                      l.dtype = r.dtype;
                      visit(l);
                    }
                  }
                }
          }
        }
      }
}

std::vector<TrainLayout> enumerate_layouts(const PlanQuery& r) {
  std::vector<TrainLayout> out;
  for_each_layout(r, [&](const TrainLayout& l) { out.push_back(l); });
  return out;
}

std::string prune_reason(const PlanQuery& r, const TrainLayout& l, StepMemo* memo) {
  const auto& m = r.model;
  if (m.heads % l.tp || m.kv() % l.tp || m.ffn % l.tp)
    return "tp does not divide the heads, KV heads or ffn";
  if (l.cp > 1) {
    if (!m.flash_attention)
      return "cp: context-parallel attention is flash attention; the model's is unfused";
    if (m.seq % (2 * l.cp)) return "cp: sequence not divisible into 2·cp chunks";
    // MindSpeed's _validate_cp_args: heads % (tp·cp); KV heads that do not divide are repeated.
    if (l.cp_algo == "ulysses_cp_algo" && (m.heads / l.tp) % l.cp)
      return "ulysses: heads per TP rank not divisible by cp";
  }
  if (l.stage_layers.empty() && m.num_layers % (std::int64_t(l.pp) * l.vpp))
    return "layers not divisible by pp·vpp (even split)";
  if (r.global_batch % (l.micro_batch_size * l.dp)) return "global batch not divisible by mbs·dp";
  if (l.vpp > 1 && l.micro_batches() % l.pp)
    return "interleaved: micro-batches not divisible by pp";
  if (l.micro_batch_interleave == 2 && (l.micro_batch_size % 2 || l.cp > 1))
    return "multi-copy: needs an even micro-batch and cp 1";
  if (l.sequence_parallel && (m.seq / l.cp) % l.tp)
    return "sp: sequence per cp rank not divisible by tp";
  try {
    (void)layers::train::check_layout(m, l, l.world());
  } catch (const Error&) {
    return "other Megatron/MindFormers rule";
  }
  const MemoryEstimate mem = estimate_memory(m, l, *r.profile, memo);
  if (mem.oom) return "out of memory";
  return "";
}

PlanCandidate evaluate_candidate(const PlanQuery& r, const TrainLayout& l) {
  Evaluator ev(r);
  return ev.evaluate(l);
}

namespace {

/// Layers per stage minimising the slowest stage (forward + backward of one micro-batch), the
/// embedding on the first stage and the LM head and loss on the last, among the partitions
/// Megatron-LM can run: the first and the last stage free (--decoder-first-pipeline-num-layers,
/// --decoder-last-pipeline-num-layers), the middle stages equal. Ties go to the partition
/// closest to the even split. O(L²).
std::vector<std::int64_t> balanced_stages(const StepParts& p, int pp, std::int64_t layers) {
  const double layer = p.layer_fwd.ns + p.layer_bwd.ns;
  const double first = p.embedding_fwd.ns + p.embedding_bwd.ns,
               last = p.loss_fwd.ns + p.loss_bwd.ns;
  const std::int64_t middle = pp - 2, even = layers / pp;
  std::vector<std::int64_t> best;
  double best_cost = std::numeric_limits<double>::infinity();
  std::int64_t best_distance = 0;
  for (std::int64_t f = 1; f < layers; ++f)
    for (std::int64_t k = middle > 0 ? 1 : 0; k == 0 || f + k * middle < layers; ++k) {
      const std::int64_t l = layers - f - k * middle;
      if (l < 1) break;
      const double cost = std::max({first + double(f) * layer, double(l) * layer + last,
                                    middle > 0 ? double(k) * layer : 0.0});
      const std::int64_t distance =
          std::abs(f - even) + std::abs(l - even) + (middle > 0 ? std::abs(k - even) : 0);
      if (cost < best_cost || (cost == best_cost && distance < best_distance)) {
        best_cost = cost;
        best_distance = distance;
        best.assign(std::size_t(pp), k);
        best.front() = f;
        best.back() = l;
      }
      if (middle == 0) break;  // two stages: the last takes the rest
    }
  return best;
}

bool better(const PlanCandidate& a, const PlanCandidate& b) {
  if (a.report.iteration_ns != b.report.iteration_ns)
    return a.report.iteration_ns < b.report.iteration_ns;
  return a.describe() < b.describe();  // a total order: ties break the same way every run
}

/// MindSpore's recursive_programming in spirit: from a start layout, move one dimension at a time
/// to the best valid neighbour until none improves.
std::optional<PlanCandidate> heuristic_search(const PlanQuery& r, Evaluator& ev,
                                              std::int64_t& evaluations) {
  const int world = world_of(r), per_node = r.profile->topology.devices_per_node;
  auto valid = [&](const TrainLayout& l) {
    if (l.tp < 1 || l.cp < 1 || l.pp < 1 || l.vpp < 1 || l.micro_batch_size < 1) return false;
    if (l.tp > per_node || l.cp > r.max_cp || l.vpp > r.max_vpp) return false;
    if (std::int64_t(l.tp) * l.cp * l.pp > world || world % (l.tp * l.cp * l.pp)) return false;
    if (l.pp > r.model.num_layers || (l.vpp > 1 && l.pp < 2)) return false;
    if (l.distributed_optimizer && l.dp * l.cp == 1) return false;
    return prune_reason(r, l, ev.memo()).empty();
  };
  auto with_dp = [&](TrainLayout l) {
    if (l.tp * l.cp * l.pp > 0 && world % (l.tp * l.cp * l.pp) == 0)  // halving 1 gives 0
      l.dp = world / (l.tp * l.cp * l.pp);
    l.schedule = l.vpp > 1 ? PipelineSchedule::interleaved : PipelineSchedule::one_f_one_b;
    l.sequence_parallel = l.sequence_parallel && l.tp > 1;
    return l;
  };
  // Start: TP across the node, no CP, the fewest stages that fit (recompute if needed).
  std::optional<TrainLayout> start;
  for (int tp = per_node; tp >= 1 && !start; tp /= 2)
    for (const Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
      for (int pp = 1; pp <= world / tp && !start; ++pp) {
        TrainLayout l;
        l.tp = tp;
        l.pp = pp;
        l.micro_batch_size = r.micro_batch_sizes.front();
        l.global_batch_size = r.global_batch;
        l.recompute = rc;
        l.sequence_parallel = true;
        l.dtype = r.dtype;
        l = with_dp(l);
        l.distributed_optimizer = l.dp > 1;
        if (valid(l)) start = l;
      }
      if (start) break;
    }
  if (!start) return std::nullopt;
  PlanCandidate cur = ev.evaluate(*start);
  ++evaluations;
  for (int round = 0; round < 64; ++round) {
    const TrainLayout& c = cur.layout;
    std::vector<TrainLayout> next;
    auto add = [&](TrainLayout l) {
      l = with_dp(l);
      if (valid(l)) next.push_back(l);
    };
    for (const int f : {2, -2}) {
      TrainLayout l = c;
      l.tp = f > 0 ? c.tp * 2 : c.tp / 2;
      add(l);
      l = c;
      l.cp = f > 0 ? c.cp * 2 : c.cp / 2;
      add(l);
      l = c;
      l.vpp = f > 0 ? c.vpp * 2 : c.vpp / 2;
      add(l);
      l = c;
      l.vpp = c.vpp + f / 2;  // and the neighbouring sizes, which need not be powers of two
      if (l.vpp != c.vpp * 2 && l.vpp != c.vpp / 2) add(l);
      l = c;
      l.micro_batch_size = f > 0 ? c.micro_batch_size * 2 : c.micro_batch_size / 2;
      add(l);
    }
    for (int pp = 1; pp <= world; ++pp)  // the neighbouring valid stage counts
      if (pp != c.pp && (pp == c.pp + 1 || pp == c.pp - 1 || pp == c.pp * 2 || pp * 2 == c.pp)) {
        TrainLayout l = c;
        l.pp = pp;
        add(l);
      }
    for (const Recompute rc : {Recompute::none, Recompute::selective, Recompute::full})
      if (rc != c.recompute) {
        TrainLayout l = c;
        l.recompute = rc;
        add(l);
      }
    {
      TrainLayout l = c;
      l.distributed_optimizer = !c.distributed_optimizer;
      add(l);
      l = c;
      l.sequence_parallel = !c.sequence_parallel;
      add(l);
      l = c;
      l.micro_batch_interleave = 3 - c.micro_batch_interleave;
      add(l);
      if (c.cp > 1) {
        l = c;
        l.cp_algo = c.cp_algo == "ulysses_cp_algo" ? "megatron_cp_algo" : "ulysses_cp_algo";
        add(l);
      }
    }
    std::optional<PlanCandidate> best;
    for (const TrainLayout& l : next) {
      PlanCandidate cand = ev.evaluate(l);
      ++evaluations;
      if (!best || better(cand, *best)) best = std::move(cand);
    }
    if (!best || !better(*best, cur)) break;
    cur = std::move(*best);
  }
  return cur;
}

/// One enumerated layout, pruned (with the reason) or evaluated.
struct Assessed {
  std::string reason;
  std::optional<PlanCandidate> candidate;
};

/// Prunes or evaluates a layout. In dynamic_programming mode a 1F1B layout with stages takes
/// the balanced partition in place of the even split (checked against the rules and memory with
/// the most even split first: a pp that does not divide the layers is allowed here).
Assessed assess(const PlanQuery& q, Evaluator& ev, TrainLayout l) {
  if (q.mode == SearchMode::dynamic_programming && l.pp > 1 && l.vpp == 1) {
    TrainLayout even = l;
    even.stage_layers.clear();
    if (const std::int64_t extra = q.model.num_layers % l.pp; extra != 0) {
      even.stage_layers.assign(std::size_t(l.pp), q.model.num_layers / l.pp);
      for (std::int64_t k = 0; k < extra; ++k)
        ++even.stage_layers[std::size_t(k)];
    }
    if (std::string why = prune_reason(q, even, ev.memo()); !why.empty())
      return {std::move(why), {}};
    l.stage_layers = balanced_stages(ev.parts(ev.setup_for(l))->parts, l.pp, q.model.num_layers);
    if (std::all_of(l.stage_layers.begin(), l.stage_layers.end(),
                    [&](std::int64_t n) { return n == l.stage_layers.front(); }))
      l.stage_layers.clear();
  }
  if (std::string why = prune_reason(q, l, ev.memo()); !why.empty()) return {std::move(why), {}};
  try {
    return {"", ev.evaluate(l)};
  } catch (const Error& e) {
    // build_plan refuses ring and direct plans too large to build (kMaxFlatPlanSteps).
    if (e.code() != Errc::too_large) throw;
    return {fmt::format("a collective too large to price (a ring or direct plan over > {:.0f} "
                        "members)",
                        std::sqrt(kMaxFlatPlanSteps)),
            {}};
  }
}

/// What one candidate's iteration is spent on, per device averaged over stages (ms): the
/// pipeline bubble without the waits for transfers, exposed TP, CP, DP and PP communication,
/// and device compute (busy time without the exposed TP and CP communication inside it).
std::vector<std::pair<std::string, double>> iteration_terms(const TrainReport& r) {
  auto exposed = [&](const char* k) {
    const auto it = r.exposed_comm_ns.find(k);
    return it == r.exposed_comm_ns.end() ? 0.0 : it->second / 1e6;
  };
  const double span = r.pipeline_span_ns / 1e6;
  const double idle = r.bubble_fraction * span;  // holds the PP waits
  return {{"pipeline bubble", idle - exposed("PP")},
          {"exposed TP communication", exposed("TP")},
          {"exposed CP communication", exposed("CP")},
          {"exposed DP communication", exposed("DP")},
          {"exposed PP communication", exposed("PP")},
          {"device compute", span - idle - exposed("TP") - exposed("CP")}};
}

/// Why the winner beats the runner-up: the terms that differ, largest first, and what they
/// leave (the optimizer step and stages finishing at different times).
std::string explain(const PlanCandidate& a, const PlanCandidate& b,
                    std::vector<std::pair<std::string, double>>& out) {
  const TrainReport &x = a.report, &y = b.report;
  const double gap = double(y.iteration_ns - x.iteration_ns) / 1e6;
  const auto ta = iteration_terms(x), tb = iteration_terms(y);
  std::vector<std::pair<double, std::string>> terms;
  double sum = 0;
  for (std::size_t i = 0; i < ta.size(); ++i) {
    const double d = tb[i].second - ta[i].second;
    sum += d;
    out.push_back({ta[i].first, d});
    if (std::abs(d) >= 0.05) terms.push_back({d, ta[i].first});  // shown to 0.1 ms
  }
  const double rest = gap - sum;
  out.push_back({"optimizer step and stage imbalance", rest});
  if (std::abs(rest) >= 0.05) terms.push_back({rest, "optimizer step and stage imbalance"});
  std::sort(terms.begin(), terms.end(),
            [](const auto& p, const auto& q) { return std::abs(p.first) > std::abs(q.first); });
  std::string s = fmt::format(
      "The winner ({}) is {:.1f} ms ({:.1f}%) faster per iteration than "
      "the runner-up ({}).",
      a.describe(), gap, 100 * gap / (double(y.iteration_ns) / 1e6), b.describe());
  std::string parts;
  for (std::size_t i = 0; i < terms.size(); ++i)
    parts += fmt::format("{}{} {} by {:.1f} ms", i ? "; " : "", terms[i].second,
                         terms[i].first > 0 ? "lower" : "higher", std::abs(terms[i].first));
  if (!parts.empty())
    s += " Per iteration and device (averaged over stages; the bubble without the waits for "
         "pipeline transfers, which count as exposed PP): " +
         parts + ".";
  return s;
}

}  // namespace

PlanResult plan(const PlanQuery& request) {
  check_request(request);
  const auto t0 = std::chrono::steady_clock::now();
  PlanResult res;
  res.request = request;
  res.world = world_of(request);
  // oneTBB runs at most its default concurrency (the cores this process may use); a larger
  // request is capped, and the result says so.
  const int cores = std::max(1, tbb::info::default_concurrency());
  const int threads = request.threads > 0 ? std::min(request.threads, cores) : cores;
  if (request.threads > cores)
    res.threads_note =
        fmt::format("--threads {} is more than the {} core(s) oneTBB can use here: searched on {}",
                    request.threads, cores, threads);
  res.threads = threads;
  Evaluator ev(request);

  if (request.mode == SearchMode::recursive_programming) {
    std::int64_t evaluations = 0;
    tbb::task_arena arena(threads);
    std::optional<PlanCandidate> best;
    arena.execute([&] { best = heuristic_search(request, ev, evaluations); });
    res.evaluated = evaluations;
    res.enumerated = evaluations;
    COCEMU_CHECK_ARG(best,
                     "plan: no valid layout of {} on {} devices with global batch {} fits (the "
                     "heuristic's start failed every rule or memory); run the exhaustive search "
                     "for the counts by reason",
                     request.model.name, res.world, request.global_batch);
    res.top.push_back(std::move(*best));
    if (res.top[0].layout.micro_batch_interleave > 1) {
      // Megatron-LM and MindSpeed have no multi-copy: their flags take the same layout in one
      // copy, when it is valid.
      TrainLayout one = res.top[0].layout;
      one.micro_batch_interleave = 1;
      if (prune_reason(request, one, ev.memo()).empty()) res.flags_winner = ev.evaluate(one);
    }
  } else {
    std::vector<TrainLayout> layouts = enumerate_layouts(request);
    COCEMU_CHECK_ARG(!layouts.empty(),
                     "plan: {} devices admit no tp × cp × pp × dp factorisation with tp ≤ {} and "
                     "pp ≤ {} layers",
                     res.world, request.profile->topology.devices_per_node,
                     request.model.num_layers);
    // dynamic_programming needs no candidates of its own: the space already holds every pp
    // that does not divide the layers (the exhaustive search prunes them), and assess() gives
    // each 1F1B one its balanced partition, once.
    res.enumerated = std::int64_t(layouts.size());
    std::vector<Assessed> assessed(layouts.size());
    tbb::task_arena arena(threads);
    const auto e0 = std::chrono::steady_clock::now();
    // Each chunk counts what it finished (release); the acquire below checks that every
    // candidate was assessed before its result is read.
    std::atomic<std::size_t> finished{0};
    arena.execute([&] {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, layouts.size(), 16),
                        [&](const tbb::blocked_range<std::size_t>& rg) {
                          for (std::size_t i = rg.begin(); i != rg.end(); ++i)
                            assessed[i] = assess(request, ev, layouts[i]);
                          finished.fetch_add(rg.size(), std::memory_order_release);
                        });
    });
    COCEMU_CHECK(finished.load(std::memory_order_acquire) == layouts.size(), Errc::internal,
                 "plan: {} of {} candidates assessed", finished.load(), layouts.size());
    res.evaluation_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - e0).count();
    std::vector<PlanCandidate> all;
    for (Assessed& a : assessed) {
      if (!a.reason.empty()) ++res.pruned[a.reason];
      if (a.candidate) all.push_back(std::move(*a.candidate));
    }
    res.evaluated = std::int64_t(all.size());
    if (all.empty()) {
      std::string why;
      for (const auto& [reason, n] : res.pruned)
        why += fmt::format("\n  {}: {}", reason, n);
      COCEMU_FAIL(Errc::invalid_argument,
                  "plan: every one of the {} candidates for {} on {} devices (global batch {}, "
                  "seq {}) was pruned:{}",
                  res.enumerated, request.model.name, res.world, request.global_batch,
                  request.model.seq, why);
    }
    const std::size_t k = std::min<std::size_t>(std::size_t(request.top_k), all.size());
    std::partial_sort(all.begin(), all.begin() + std::ptrdiff_t(k), all.end(), better);
    if (all.front().layout.micro_batch_interleave > 1) {
      // Megatron-LM and MindSpeed have no multi-copy: their flags take the best candidate in
      // one copy.
      std::optional<std::size_t> one;
      for (std::size_t i = 0; i < all.size(); ++i)
        if (all[i].layout.micro_batch_interleave == 1 && (!one || better(all[i], all[*one])))
          one = i;
      if (one) res.flags_winner = all[*one];
    }
    all.resize(k);
    res.top = std::move(all);
    if (request.compare_heuristic) {
      std::int64_t evaluations = 0;
      arena.execute([&] { res.heuristic = heuristic_search(request, ev, evaluations); });
      res.heuristic_evaluated = evaluations;
    }
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (res.evaluation_seconds == 0) res.evaluation_seconds = res.seconds;
  res.candidates_per_s = double(res.enumerated) / std::max(res.evaluation_seconds, 1e-9);
  if (res.top.size() >= 2) res.explanation = explain(res.top[0], res.top[1], res.explanation_terms);
  return res;
}

// ---------------------------------------------------------------------------------------------
// Output.

namespace {

std::string coc_summary(const PlanCandidate& c) {
  if (c.layout.tp == 1) return "-";
  if (c.tp_comm_overlap) return "tp-comm-overlap";
  std::map<int, int> n;
  for (const auto& [key, v] : c.customized_coc)
    ++n[v];
  std::string s;
  for (const auto& [v, count] : n)
    s += fmt::format("{}{}×{}", s.empty() ? "" : " ",
                     v == -1  ? "fused"
                     : v == 1 ? "off"
                              : fmt::format("P{}", v),
                     count);
  return s;
}

double exposed(const TrainReport& r, const char* k) {
  const auto it = r.exposed_comm_ns.find(k);
  return it == r.exposed_comm_ns.end() ? 0 : it->second / 1e6;
}

}  // namespace

std::string format_plan(const PlanResult& r) {
  const PlanQuery& q = r.request;
  std::string s = fmt::format(
      "cocemu plan — {} on {} × {} {} ({} devices), global batch {}, seq {}, {}\n"
      "[ modeled: candidates are priced by the step model from the cost model — no numerics, no "
      "rank threads ]\n\n",
      q.model.name, q.nodes, q.profile->topology.devices_per_node, q.profile->name, r.world,
      q.global_batch, q.model.seq, name_of(q.dtype));
  s += fmt::format(
      "search {}: {} candidates, {} evaluated, {} pruned; {:.2f} s on {} thread(s), "
      "of which pruning and evaluation {:.2f} s ({:.0f} candidates/s)\n",
      to_string(q.mode), r.enumerated, r.evaluated, r.enumerated - r.evaluated, r.seconds,
      r.threads, r.evaluation_seconds, r.candidates_per_s);
  for (const auto& [reason, n] : r.pruned)
    s += fmt::format("  pruned {:>7}  {}\n", n, reason);
  if (!r.threads_note.empty()) s += "  note: " + r.threads_note + "\n";
  s += "TP overlap searched (the profile's tp_overlap): " + tp_overlap_summary(*q.profile) + "\n";
  s += fmt::format(
      "\n{:>2}  {:<58} {:>10} {:>9} {:>7} {:>6} {:>8} {:>7}  {:>7} {:>7} {:>7} "
      "{:>7}  {}\n",
      "#", "layout", "iter ms", "tokens/s", "TFLOP/s", "MFU", "mem GB", "bubble", "TP ms", "CP ms",
      "DP ms", "PP ms", "CoC per shape");
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    const auto& c = r.top[i];
    const auto& t = c.report;
    s += fmt::format(
        "{:>2}  {:<58} {:>10.1f} {:>9.0f} {:>7.1f} {:>5.1f}% {:>8.1f} {:>6.1f}%  "
        "{:>7.1f} {:>7.1f} {:>7.1f} {:>7.1f}  {}\n",
        i + 1, c.describe(), double(t.iteration_ns) / 1e6, t.tokens_per_s, t.tflops_per_device,
        100 * t.mfu, t.memory.peak_bytes / 1e9, 100 * t.bubble_fraction, exposed(t, "TP"),
        exposed(t, "CP"), exposed(t, "DP"), exposed(t, "PP"), coc_summary(c));
  }
  if (!r.explanation.empty()) s += "\n" + r.explanation + "\n";
  if (r.flags_winner)
    s += fmt::format(
        "\nThe winner uses MindSpore's multi-copy (micro_batch_interleave_num 2), which "
        "Megatron-LM and MindSpeed do not have: the flags file holds the best layout they can "
        "run, {} at {:.1f} ms.\n",
        r.flags_winner->describe(), double(r.flags_winner->report.iteration_ns) / 1e6);
  if (r.heuristic && !r.top.empty()) {
    const double h = double(r.heuristic->report.iteration_ns),
                 best = double(r.top[0].report.iteration_ns);
    s += fmt::format(
        "\nrecursive_programming heuristic: {} in {:.1f} ms after {} evaluations — "
        "{}\n",
        r.heuristic->describe(), h / 1e6, r.heuristic_evaluated,
        h == best ? "the exhaustive best"
                  : fmt::format("{:.1f}% slower than the exhaustive best", 100 * (h / best - 1)));
  }
  return s;
}

nlohmann::json to_json(const PlanResult& r) {
  auto cand = [](const PlanCandidate& c) {
    nlohmann::json j = to_json(c.report);
    j["describe"] = c.describe();
    j["customized_coc"] = c.customized_coc;
    j["stage_layers"] = c.layout.stage_layers;
    j["micro_batch_interleave_num"] = c.layout.micro_batch_interleave;
    j["cp_algo"] = c.layout.cp_algo;
    j["tp_comm_overlap"] = c.tp_comm_overlap;
    return j;
  };
  nlohmann::json j;
  j["model"] = r.request.model.name;
  j["profile"] = r.request.profile->name;
  j["nodes"] = r.request.nodes;
  j["world"] = r.world;
  j["global_batch"] = r.request.global_batch;
  j["seq"] = r.request.model.seq;
  j["mode"] = to_string(r.request.mode);
  j["note"] = "modeled: step model on parts priced from the cost model; no numerics";
  j["enumerated"] = r.enumerated;
  j["evaluated"] = r.evaluated;
  j["pruned"] = r.pruned;
  j["seconds"] = r.seconds;
  j["threads"] = r.threads;
  j["candidates_per_s"] = r.candidates_per_s;
  j["evaluation_seconds"] = r.evaluation_seconds;
  j["candidates"] = nlohmann::json::array();
  for (const auto& c : r.top)
    j["candidates"].push_back(cand(c));
  if (!r.top.empty()) j["best"] = cand(r.top[0]);
  j["explanation"] = r.explanation;
  j["explanation_terms_ms"] = nlohmann::json::object();
  for (const auto& [name, ms] : r.explanation_terms)
    j["explanation_terms_ms"][name] = ms;
  if (r.flags_winner) j["flags_candidate"] = cand(*r.flags_winner);
  if (!r.threads_note.empty()) j["threads_note"] = r.threads_note;
  j["tp_overlap"] = r.request.profile->tp_overlap;
  if (r.heuristic) {
    j["heuristic"] = cand(*r.heuristic);
    j["heuristic_evaluated"] = r.heuristic_evaluated;
  }
  return j;
}

}  // namespace cocemu::bench
