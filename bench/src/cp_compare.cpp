#include "cocemu/bench/cp_compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>

#include "cocemu/runtime/error.h"

namespace cocemu::bench {

CpPassTimes cp_pass_times(const RunResult& r, const std::vector<std::uint32_t>& boundary) {
  COCEMU_CHECK_ARG(boundary.size() == r.graph.ranks.size(),
                   "cp_pass_times: {} boundaries for a run of {} ranks", boundary.size(),
                   r.graph.ranks.size());
  CpPassTimes t;
  std::int64_t fwd_end = -1, end = -1;
  for (std::size_t rk = 0; rk < r.graph.ranks.size(); ++rk) {
    std::int64_t rank_fwd_end = 0, rank_end = 0, fwd_busy = 0, bwd_busy = 0;
    for (const OpRecord& op : r.graph.ranks[rk].ops) {
      const ScheduledOp& s = r.timeline.at({int(rk), op.index});
      const bool forward = op.index < boundary[rk];
      if (forward) rank_fwd_end = std::max(rank_fwd_end, s.end_ns);
      rank_end = std::max(rank_end, s.end_ns);
      if (op.lane == 1 && op.cls == OpClass::compute)
        (forward ? fwd_busy : bwd_busy) += s.end_ns - s.start_ns;
    }
    if (rank_fwd_end > fwd_end) {
      fwd_end = rank_fwd_end;
      t.forward_compute_ns = fwd_busy;
      t.forward_rank = int(rk);
    }
    if (rank_end > end) {
      end = rank_end;
      t.backward_compute_ns = bwd_busy;
      t.backward_rank = int(rk);
    }
  }
  t.forward_ns = std::max<std::int64_t>(fwd_end, 0);
  t.backward_ns = std::max<std::int64_t>(end, 0) - t.forward_ns;
  return t;
}

CpPassTimes model_cp_attention(const attn::CpConfig& c, const attn::AttentionProblem& p,
                               std::shared_ptr<const DeviceProfile> profile) {
  WorldOptions wo;
  wo.n_ranks = c.context_parallel_size;
  wo.numerics = false;
  wo.profile = std::move(profile);
  std::vector<std::uint32_t> boundary(std::size_t(c.context_parallel_size), 0);
  std::mutex mu;
  const RunResult r = run(wo, [&](Rank& rank) {
    Group world = Group::world(rank);
    attn::CpAttention attn(world, c, p);
    const std::int64_t S = std::int64_t(attn.positions().size());
    rank.set_segment("attention forward");
    attn.forward(Tensor::shape_only({S, p.batch, p.heads * p.head_dim}, p.dtype),
                 Tensor::shape_only({S, p.batch, p.kv_heads * p.head_dim}, p.dtype),
                 Tensor::shape_only({S, p.batch, p.kv_heads * p.head_dim}, p.dtype));
    const auto b = std::uint32_t(rank.graph().ops.size());
    rank.set_segment("attention backward");
    attn.backward(Tensor::shape_only({S, p.batch, p.heads * p.head_dim}, p.dtype));
    std::lock_guard lock(mu);
    boundary[std::size_t(rank.id())] = b;
  });
  return cp_pass_times(r, boundary);
}

namespace {

/// An error's message without the developer's "[invalid argument: check … failed at …]" tail.
std::string plain(const Error& e) {
  std::string m = e.what();
  const std::size_t at = m.rfind(" [");
  if (at != std::string::npos && !m.empty() && m.back() == ']') m.resize(at);
  return m;
}

}  // namespace

std::string cp_label(const attn::CpConfig& c) {
  const int w = c.cp_window_size;
  if (c.context_parallel_algo == "ulysses_cp_algo")
    return fmt::format("Ulysses {}", c.context_parallel_size);
  if (c.context_parallel_algo == "megatron_cp_algo")
    return w > 1 ? fmt::format("double ring, window {}", w) : "ring";
  const int u = std::max(1, c.ulysses_degree_in_cp);
  const int r = c.context_parallel_size / u;
  return w > 1 ? fmt::format("hybrid: Ulysses {} x double ring {}, window {}", u, r, w)
               : fmt::format("hybrid: Ulysses {} x ring {}", u, r);
}

void check_cp_heads(const attn::CpConfig& c, const attn::AttentionProblem& p, int tp) {
  const std::int64_t heads = p.heads * tp;
  if (c.context_parallel_algo == "ulysses_cp_algo")
    COCEMU_CHECK_ARG(heads % (std::int64_t(tp) * c.context_parallel_size) == 0,
                     "ulysses_cp_algo: num_attention_heads {} must be divisible by "
                     "tensor_model_parallel_size x context_parallel_size = {} x {}",
                     heads, tp, c.context_parallel_size);
  if (c.context_parallel_algo == "hybrid_cp_algo" && c.ulysses_degree_in_cp >= 1)
    COCEMU_CHECK_ARG(heads % (std::int64_t(tp) * c.ulysses_degree_in_cp) == 0,
                     "hybrid_cp_algo: num_attention_heads {} must be divisible by "
                     "ulysses_degree_in_cp x tensor_model_parallel_size = {} x {}",
                     heads, c.ulysses_degree_in_cp, tp);
}

namespace {

std::string family_of(const attn::CpConfig& c) {
  if (c.context_parallel_algo == "megatron_cp_algo") return "ring";
  if (c.context_parallel_algo == "ulysses_cp_algo") return "Ulysses";
  return fmt::format("hybrid Ulysses {}", c.ulysses_degree_in_cp);
}

bool same_choice(const attn::CpConfig& a, const attn::CpConfig& b) {
  const bool hybrid = a.context_parallel_algo == "hybrid_cp_algo";
  return a.context_parallel_algo == b.context_parallel_algo &&
         a.cp_window_size == b.cp_window_size &&
         (!hybrid || a.ulysses_degree_in_cp == b.ulysses_degree_in_cp);
}

}  // namespace

std::string CpOption::mindspeed_flags() const {
  std::string f = "--context-parallel-algo " + config.context_parallel_algo;
  if (config.context_parallel_algo == "hybrid_cp_algo")
    f += fmt::format(" --ulysses-degree-in-cp {}", config.ulysses_degree_in_cp);
  if (config.cp_window_size > 1) f += fmt::format(" --cp-window-size {}", config.cp_window_size);
  return f;
}

std::string CpOption::cocemu_flags() const {
  std::string f = "--algo " + config.context_parallel_algo;
  if (config.context_parallel_algo == "hybrid_cp_algo")
    f += fmt::format(" --ulysses-degree {}", config.ulysses_degree_in_cp);
  if (config.cp_window_size > 1) f += fmt::format(" --window {}", config.cp_window_size);
  return f;
}

const CpOption* CpComparison::requested() const {
  for (const CpOption& o : options)
    if (o.requested) return &o;
  return nullptr;
}

CpComparison cp_options(const attn::CpConfig& request, const attn::AttentionProblem& p,
                        int devices_per_node, int tp) {
  CpComparison out;
  const int cp = request.context_parallel_size;
  out.cp = cp;
  out.devices_per_node = devices_per_node;
  std::vector<attn::CpConfig> tries;
  const auto with = [&](const char* algo, int u, int w) {
    attn::CpConfig c = request;
    c.context_parallel_algo = algo;
    c.ulysses_degree_in_cp = u;
    c.cp_window_size = w;
    tries.push_back(c);
  };
  const auto windows = [](int ring) {
    std::vector<int> w{1};
    for (int d = 2; d < ring; ++d)
      if (ring % d == 0) w.push_back(d);
    return w;
  };
  for (int w : windows(cp))
    with("megatron_cp_algo", 0, w);
  with("ulysses_cp_algo", 0, 1);
  for (int u = 2; u < cp; ++u)
    if (cp % u == 0 && devices_per_node % u == 0)
      for (int w : windows(cp / u))
        with("hybrid_cp_algo", u, w);
  if (std::none_of(tries.begin(), tries.end(),
                   [&](const attn::CpConfig& c) { return same_choice(c, request); }))
    tries.push_back(request);
  for (const attn::CpConfig& c : tries) {
    try {
      check_cp_heads(c, p, tp);
      attn::validate(c, p);
      out.options.push_back({c, cp_label(c), family_of(c), same_choice(c, request), {}});
    } catch (const Error& e) {
      out.skipped.emplace_back(cp_label(c) + (same_choice(c, request) ? " (requested)" : ""),
                               plain(e));
    }
  }
  COCEMU_CHECK_ARG(!out.options.empty(),
                   "attention --compare: no algorithm MindSpeed accepts for cp {} with this "
                   "request; for example the ring: {}",
                   cp, out.skipped.empty() ? "" : out.skipped.front().second);
  return out;
}

void model_options(CpComparison& cmp, const attn::AttentionProblem& p,
                   std::shared_ptr<const DeviceProfile> profile) {
  cmp.profile = profile->name;
  for (CpOption& o : cmp.options)
    o.times = model_cp_attention(o.config, p, profile);
  cmp.best = 0;
  for (std::size_t i = 1; i < cmp.options.size(); ++i)
    if (cmp.options[i].times.total_ns() < cmp.options[cmp.best].times.total_ns()) cmp.best = i;
}

Conclusions cp_conclusions(const CpComparison& cmp) {
  Conclusions c{{"best configuration", cmp.options.at(cmp.best).label}};
  std::vector<std::string> families;
  for (const CpOption& o : cmp.options)
    if (std::find(families.begin(), families.end(), o.family) == families.end())
      families.push_back(o.family);
  for (const std::string& f : families) {
    const CpOption* best = nullptr;
    int n = 0;
    for (const CpOption& o : cmp.options)
      if (o.family == f) {
        ++n;
        if (!best || o.times.total_ns() < best->times.total_ns()) best = &o;
      }
    if (n > 1) c["best window: " + f] = std::to_string(best->config.cp_window_size);
  }
  return c;
}

std::string format_cp_comparison(const CpComparison& cmp, const std::string& heading,
                                 const Sensitivity* sens) {
  std::string out = heading + "\n";
  std::size_t width = 13;
  for (const CpOption& o : cmp.options)
    width = std::max(width, o.label.size() + (o.requested ? 12 : 0));
  out += fmt::format("{:<{}}  {:>11} {:>12} {:>10}  {}\n", "configuration", width, "forward ms",
                     "backward ms", "total ms", "vs best");
  const CpOption& best = cmp.options.at(cmp.best);
  const double best_ns = double(best.times.total_ns());
  for (std::size_t i = 0; i < cmp.options.size(); ++i) {
    const CpOption& o = cmp.options[i];
    out += fmt::format(
        "{:<{}}  {:>11.3f} {:>12.3f} {:>10.3f}  {}\n",
        o.label + (o.requested ? " (requested)" : ""), width, double(o.times.forward_ns) / 1e6,
        double(o.times.backward_ns) / 1e6, double(o.times.total_ns()) / 1e6,
        i == cmp.best
            ? std::string("best")
            : fmt::format("{:+.1f}%", 100.0 * (double(o.times.total_ns()) / best_ns - 1)));
  }
  for (const auto& [label, why] : cmp.skipped)
    out += fmt::format("not valid: {:<{}} {}\n", label, width > 11 ? width - 11 : 0, why);
  out += fmt::format("best: {}, {:.3f} ms (forward {:.3f} + backward {:.3f})", best.label,
                     best_ns / 1e6, double(best.times.forward_ns) / 1e6,
                     double(best.times.backward_ns) / 1e6);
  if (const CpOption* req = cmp.requested(); req && req != &best)
    out += fmt::format(", {:.1f}% faster than the requested {} ({:.3f} ms)",
                       100.0 * (1 - best_ns / double(req->times.total_ns())), req->label,
                       double(req->times.total_ns()) / 1e6);
  out += "\n";
  if (cmp.options.size() > 1) {
    std::size_t runner = cmp.best == 0 ? 1 : 0;
    for (std::size_t i = 0; i < cmp.options.size(); ++i)
      if (i != cmp.best && cmp.options[i].times.total_ns() < cmp.options[runner].times.total_ns())
        runner = i;
    out += fmt::format("  runner-up: {}, {:+.1f}%\n", cmp.options[runner].label,
                       100.0 * (double(cmp.options[runner].times.total_ns()) / best_ns - 1));
  }
  out += fmt::format("  MindSpeed flags: --context-parallel-size {} {}\n", cmp.cp,
                     best.mindspeed_flags());
  out += fmt::format("  cocemu flags:    --cp {} {}\n", cmp.cp, best.cocemu_flags());
  if (!sens) {
    out +=
        "  robustness: not checked (--sensitivity scales each assumption of the profile x0.5 and "
        "x2 and says whether the best changes)\n";
    return out;
  }
  const std::string flips = sens->fragile("best configuration");
  out +=
      flips.empty()
          ? fmt::format(
                "  robust: stays the best with each of the {} assumptions of {} scaled "
                "x{:g} and x{:g}\n",
                sens->parameters.size(), sens->profile, sens->factors.front(), sens->factors.back())
          : fmt::format("  fragile: the best changes when {}\n", flips);
  for (const auto& [what, value] : sens->base)
    if (what.rfind("best window: ", 0) == 0) {
      const std::string f = sens->fragile(what);
      out += fmt::format("  {} = {} ({})\n", what, value,
                         f.empty() ? "robust" : "fragile: changes when " + f);
    }
  return out;
}

nlohmann::json to_json(const CpComparison& cmp) {
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t i = 0; i < cmp.options.size(); ++i) {
    const CpOption& o = cmp.options[i];
    rows.push_back(
        {{"label", o.label},
         {"context_parallel_algo", o.config.context_parallel_algo},
         {"cp_window_size", o.config.cp_window_size},
         {"ulysses_degree_in_cp",
          o.config.context_parallel_algo == "hybrid_cp_algo" ? o.config.ulysses_degree_in_cp : 0},
         {"forward_ns", o.times.forward_ns},
         {"backward_ns", o.times.backward_ns},
         {"total_ns", o.times.total_ns()},
         {"requested", o.requested},
         {"best", i == cmp.best},
         {"mindspeed_flags", o.mindspeed_flags()}});
  }
  nlohmann::json skipped = nlohmann::json::array();
  for (const auto& [label, why] : cmp.skipped)
    skipped.push_back({{"label", label}, {"reason", why}});
  return {{"context_parallel_size", cmp.cp},
          {"devices_per_node", cmp.devices_per_node},
          {"profile", cmp.profile},
          {"configurations", rows},
          {"best", cmp.options.at(cmp.best).label},
          {"not_valid", skipped}};
}

}  // namespace cocemu::bench
