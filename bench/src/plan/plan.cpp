// `cocemu plan` (plan.h): enumerate, prune by rules and memory, evaluate with the step model on
// priced parts in a oneTBB arena, rank.
#include "cocemu/bench/plan/plan.h"

#include <fmt/format.h>
#include <tbb/concurrent_hash_map.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <thread>

#include "cocemu/bench/plan/part_model.h"
#include "cocemu/bench/train/step_model.h"
#include "cocemu/layers/coc_config.h"
#include "cocemu/runtime/error.h"

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
};

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
    if (parts_.insert(a, key)) {
      auto e = std::make_shared<PartsEntry>();
      e->parts = price_parts(s, &e->tuned);
      a->second = std::move(e);
    }
    return a->second;
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
}

}  // namespace

std::vector<TrainLayout> enumerate_layouts(const PlanQuery& r) {
  check_request(r);
  const int world = world_of(r), per_node = r.profile->topology.devices_per_node;
  const auto& m = r.model;
  std::vector<TrainLayout> out;
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
                      out.push_back(l);
                    }
                  }
                }
          }
        }
      }
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
/// embedding on the first stage and the LM head and loss on the last: dynamic programming over
/// (stages, layers), O(pp · L²).
std::vector<std::int64_t> balanced_stages(const StepParts& p, int pp, std::int64_t layers) {
  const double layer = p.layer_fwd.ns + p.layer_bwd.ns;
  const double first = p.embedding_fwd.ns + p.embedding_bwd.ns,
               last = p.loss_fwd.ns + p.loss_bwd.ns;
  const auto L = std::size_t(layers), P = std::size_t(pp);
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][i]: the slowest of stages 0..s holding the first i layers; cut[s][i]: stage s's start.
  std::vector<std::vector<double>> best(P, std::vector<double>(L + 1, inf));
  std::vector<std::vector<std::size_t>> cut(P, std::vector<std::size_t>(L + 1, 0));
  auto cost = [&](std::size_t s, std::size_t n) {
    return double(n) * layer + (s == 0 ? first : 0) + (s + 1 == P ? last : 0);
  };
  for (std::size_t i = 1; i <= L; ++i)
    best[0][i] = cost(0, i);
  for (std::size_t s = 1; s < P; ++s)
    for (std::size_t i = s + 1; i <= L; ++i)
      for (std::size_t j = s; j < i; ++j) {
        const double v = std::max(best[s - 1][j], cost(s, i - j));
        if (v < best[s][i]) {
          best[s][i] = v;
          cut[s][i] = j;
        }
      }
  std::vector<std::int64_t> out(P);
  std::size_t i = L;
  for (std::size_t s = P; s-- > 0;) {
    const std::size_t j = s == 0 ? 0 : cut[s][i];
    out[s] = std::int64_t(i - j);
    i = j;
  }
  return out;
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

/// Why the winner beats the runner-up: the terms that differ, largest first.
std::string explain(const PlanCandidate& a, const PlanCandidate& b) {
  const TrainReport &x = a.report, &y = b.report;
  const double gap = double(y.iteration_ns - x.iteration_ns) / 1e6;
  std::vector<std::pair<double, std::string>> terms;
  auto term = [&](const std::string& name, double va, double vb) {
    if (std::abs(vb - va) > 1e-3) terms.push_back({vb - va, name});
  };
  const double it_a = double(x.iteration_ns) / 1e6, it_b = double(y.iteration_ns) / 1e6;
  term("pipeline bubble", x.bubble_fraction * it_a, y.bubble_fraction * it_b);
  for (const char* k : {"TP", "CP", "DP", "PP"}) {
    const auto fa = x.exposed_comm_ns.find(k), fb = y.exposed_comm_ns.find(k);
    term(fmt::format("exposed {} communication", k),
         fa == x.exposed_comm_ns.end() ? 0 : fa->second / 1e6,
         fb == y.exposed_comm_ns.end() ? 0 : fb->second / 1e6);
  }
  std::sort(terms.begin(), terms.end(),
            [](const auto& p, const auto& q) { return std::abs(p.first) > std::abs(q.first); });
  std::string s = fmt::format(
      "The winner ({}) is {:.1f} ms ({:.1f}%) faster per iteration than "
      "the runner-up ({}).",
      a.describe(), gap, 100 * gap / it_b, b.describe());
  std::string parts;
  for (std::size_t i = 0; i < terms.size() && i < 4; ++i)
    parts += fmt::format("{}{} {} by {:.1f} ms", i ? "; " : "", terms[i].second,
                         terms[i].first > 0 ? "lower" : "higher", std::abs(terms[i].first));
  if (!parts.empty()) s += " Per iteration and device (averaged over stages): " + parts + ".";
  const double rest = std::accumulate(terms.begin(), terms.end(), gap,
                                      [](double left, const auto& t) { return left - t.first; });
  if (std::abs(rest) > 0.05)
    s += fmt::format(
        " The remaining {:.1f} ms is device compute (micro-batch shape, recompute, "
        "the optimizer).",
        rest);
  return s;
}

}  // namespace

PlanResult plan(const PlanQuery& request) {
  check_request(request);
  const auto t0 = std::chrono::steady_clock::now();
  PlanResult res;
  res.request = request;
  res.world = world_of(request);
  const int threads = request.threads > 0 ? request.threads
                                          : int(std::max(1u, std::thread::hardware_concurrency()));
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
  } else {
    std::vector<TrainLayout> layouts = enumerate_layouts(request);
    COCEMU_CHECK_ARG(!layouts.empty(),
                     "plan: {} devices admit no tp × cp × pp × dp factorisation with tp ≤ {} and "
                     "pp ≤ {} layers",
                     res.world, request.profile->topology.devices_per_node,
                     request.model.num_layers);
    if (request.mode == SearchMode::dynamic_programming) {
      // Uneven partitions: every pp that does not divide the layers becomes possible too.
      const int world = res.world;
      for (const int tp : powers_of_two_up_to(request.profile->topology.devices_per_node))
        for (const int cp : powers_of_two_up_to(request.max_cp))
          for (int pp = 2; pp <= request.model.num_layers; ++pp) {
            if (world % (tp * cp * pp) || request.model.num_layers % pp == 0) continue;
            for (const TrainLayout& base : layouts)
              if (base.tp == tp && base.cp == cp && base.pp == 1 && base.vpp == 1) {
                TrainLayout l = base;
                l.pp = pp;
                l.dp = world / (tp * cp * pp);
                if (l.distributed_optimizer && l.dp * l.cp == 1) continue;
                l.stage_layers.assign(std::size_t(pp), 0);  // filled by the partition below
                layouts.push_back(l);
              }
          }
    }
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
  if (res.top.size() >= 2) res.explanation = explain(res.top[0], res.top[1]);
  return res;
}

// ---------------------------------------------------------------------------------------------
// Output.

namespace {

std::string coc_summary(const PlanCandidate& c) {
  if (c.layout.tp == 1) return "-";
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
  if (r.heuristic) {
    j["heuristic"] = cand(*r.heuristic);
    j["heuristic_evaluated"] = r.heuristic_evaluated;
  }
  return j;
}

std::string winner_yaml(const PlanResult& r) {
  COCEMU_CHECK_ARG(!r.top.empty(), "plan: no winner to write");
  const PlanCandidate& c = r.top[0];
  const TrainLayout& l = c.layout;
  std::string s = fmt::format(
      "# cocemu plan's winner: {}\n"
      "# modeled {:.1f} ms per iteration, {:.1f}% MFU on {} × {} {}.\n"
      "# Reproduce: cocemu train --config THIS_FILE --dry-run\n",
      c.describe(), double(c.report.iteration_ns) / 1e6, 100 * c.report.mfu, r.request.nodes,
      r.request.profile->topology.devices_per_node, r.request.profile->name);
  s += fmt::format("parallel:\n  gradients_mean: true\n  enable_parallel_optimizer: {}\n",
                   l.distributed_optimizer);
  s += fmt::format(
      "parallel_config:\n  data_parallel: {}\n  model_parallel: {}\n  context_parallel: {}\n"
      "  pipeline_stage: {}\n  use_seq_parallel: {}\n  micro_batch_num: {}\n",
      l.dp, l.tp, l.cp, l.pp, l.sequence_parallel, l.micro_batches());
  if (l.vpp > 1) s += fmt::format("  pp_interleave_num: {}\n", l.vpp);
  if (l.cp > 1) s += fmt::format("  context_parallel_algo: {}\n", l.cp_algo);
  s += fmt::format("micro_batch_interleave_num: {}\n", l.micro_batch_interleave);
  s += fmt::format("recompute_config:\n  recompute: {}\n  select_recompute: {}\n",
                   l.recompute == Recompute::full, l.recompute == Recompute::selective);
  s += fmt::format("runner_config:\n  batch_size: {}\n", l.micro_batch_size);
  s += fmt::format(
      "train:\n  model: {}\n  profile: {}\n  nodes: {}\n  seq_length: {}\n"
      "  dtype: {}\n",
      r.request.model_name, r.request.profile_name, r.request.nodes, r.request.model.seq,
      name_of(l.dtype));
  if (l.overlap_param_gather) s += "  overlap_param_gather: true\n";
  if (l.cross_entropy_fusion) s += "  cross_entropy_loss_fusion: true\n";
  s += fmt::format("  deterministic: {}  # {}\n", r.request.deterministic,
                   r.request.deterministic ? "rank-ordered collectives"
                                           : "NCCL/HCCL's collective algorithms, as priced");
  if (l.tp > 1) s += "  coc_config: plan.coc.yaml  # customized_coc per GEMM shape\n";
  if (!l.stage_layers.empty()) {
    s += "  stage_layers: [";
    for (std::size_t i = 0; i < l.stage_layers.size(); ++i)
      s += fmt::format("{}{}", i ? ", " : "", l.stage_layers[i]);
    s += "]  # dynamic_programming's partition\n";
  }
  return s;
}

std::string winner_flags(const PlanResult& r) {
  COCEMU_CHECK_ARG(!r.top.empty(), "plan: no winner to write");
  const TrainLayout& l = r.top[0].layout;
  std::string s = fmt::format(
      "--tensor-model-parallel-size {} --pipeline-model-parallel-size {} "
      "--context-parallel-size {} --micro-batch-size {} --global-batch-size {} --seq-length {}",
      l.tp, l.pp, l.cp, l.micro_batch_size, l.global_batch_size, r.request.model.seq);
  if (l.vpp > 1)
    s += fmt::format(" --num-layers-per-virtual-pipeline-stage {}",
                     r.request.model.num_layers / (l.pp * l.vpp));
  if (l.sequence_parallel) s += " --sequence-parallel";
  s += " --overlap-grad-reduce";
  if (l.distributed_optimizer) s += " --use-distributed-optimizer --overlap-param-gather";
  if (l.cross_entropy_fusion) s += " --cross-entropy-loss-fusion";
  if (l.recompute == Recompute::selective) s += " --recompute-activations";
  if (l.recompute == Recompute::full)
    s += " --recompute-granularity full --recompute-method uniform --recompute-num-layers 1";
  if (l.cp > 1) s += " --context-parallel-algo " + l.cp_algo;
  if (l.tp > 1) s += " --use-ascend-coc --coc-fused-kernel  # with plan.coc.yaml's customized_coc";
  if (l.micro_batch_interleave > 1) s += "  # MindSpore only: micro_batch_interleave_num 2";
  if (!l.stage_layers.empty()) {
    s += "  # layers per stage";
    for (std::size_t i = 0; i < l.stage_layers.size(); ++i)
      s += fmt::format("{}{}", i ? "/" : " ", l.stage_layers[i]);
    s += " (Megatron sets only the first and last: --decoder-first-pipeline-num-layers, "
         "--decoder-last-pipeline-num-layers)";
  }
  return s;
}

}  // namespace cocemu::bench
