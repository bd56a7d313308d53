#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "cocemu/runtime/error.h"
#include "cocemu/runtime/graph.h"

namespace cocemu {

const char* to_string(OpClass c) {
  switch (c) {
    case OpClass::host:
      return "host";
    case OpClass::compute:
      return "compute";
    case OpClass::comm:
      return "comm";
    case OpClass::fused:
      return "fused";
    case OpClass::wait:
      return "wait";
  }
  return "?";
}

std::string op_detail(const OpRecord& op) {
  if (!op.detail) return {};
  return op.seq < 0 ? *op.detail : *op.detail + " seq " + std::to_string(op.seq);
}

double overlapped_ns(double compute_ns, double comm_ns, const ContentionModel& cm,
                     double compute_hbm_bytes, double comm_hbm_bytes) {
  if (compute_ns <= 0 || comm_ns <= 0) return std::max({compute_ns, comm_ns, 0.0});
  // While both run, each asks for its traffic at the speed its contention factor leaves it (the
  // schedule's rule); requests beyond the memory bandwidth slow those that ask by their sum.
  double a = cm.compute_slowdown, b = cm.comm_slowdown;
  if (cm.memory_bytes_per_ns > 0) {
    const double ask_compute = compute_hbm_bytes / compute_ns / cm.memory_bytes_per_ns / a,
                 ask_comm = comm_hbm_bytes / comm_ns / cm.memory_bytes_per_ns / b;
    const double d = ask_compute + ask_comm;
    if (d > 1) {
      if (ask_compute > 0) a *= d;
      if (ask_comm > 0) b *= d;
    }
  }
  const double compute_slow = compute_ns * a, comm_slow = comm_ns * b;
  if (compute_slow <= comm_slow) return compute_slow + (comm_ns - compute_slow / b);
  return comm_slow + (compute_ns - comm_slow / a);
}

std::int64_t Timeline::makespan_ns() const {
  std::int64_t m = 0;
  for (const auto& r : times_)
    for (const auto& s : r)
      m = std::max(m, s.end_ns);
  return m;
}

namespace {

/// Event-driven simulation state. Ops are numbered globally; a "job" is either one op or a whole
/// rendezvous group, which starts when all its members can and progresses at its slowest rate.
struct Sim {
  const ModelGraph& g;
  ContentionModel cm;
  std::vector<std::size_t> base;  // global id of each rank's first op
  std::vector<const OpRecord*> ops;
  std::vector<int> unmet;                      // prerequisites not yet done
  std::vector<std::vector<std::size_t>> succ;  // ops waiting on this one
  std::vector<int> job_of;                     // job index per op
  std::vector<std::vector<std::size_t>> jobs;  // member ops per job
  std::vector<int> job_ready;                  // members whose prerequisites are met
  std::vector<double> job_left;                // remaining work (ns at full speed)
  std::vector<double> start, end, lane_free;   // lane_free: when the lane predecessor ended
  std::vector<char> done;
  std::vector<int> running;  // job ids
  std::vector<std::size_t> to_start;

  explicit Sim(const ModelGraph& graph, ContentionModel c) : g(graph), cm(c) {}

  std::size_t id(OpRef r) const { return base[r.rank] + r.index; }

  void build() {
    std::size_t n = 0;
    for (const auto& rg : g.ranks) {
      base.push_back(n);
      n += rg.ops.size();
    }
    ops.reserve(n);
    for (const auto& rg : g.ranks)
      for (const auto& op : rg.ops)
        ops.push_back(&op);
    unmet.assign(n, 0);
    succ.assign(n, {});
    start.assign(n, 0);
    end.assign(n, 0);
    lane_free.assign(n, -1);
    done.assign(n, 0);
    // Lane order.
    for (std::size_t r = 0; r < g.ranks.size(); ++r) {
      std::unordered_map<int, std::size_t> last;
      for (const auto& op : g.ranks[r].ops) {
        const std::size_t me = base[r] + op.index;
        if (auto it = last.find(op.lane); it != last.end()) {
          succ[it->second].push_back(me);
          ++unmet[me];
        }
        last[op.lane] = me;
        for (const OpRef& d : op.deps) {
          COCEMU_CHECK(d.rank >= 0 && std::size_t(d.rank) < g.ranks.size() &&
                           d.index < g.ranks[d.rank].ops.size(),
                       Errc::internal, "op '{}' on rank {} depends on a missing op", op.name, r);
          succ[id(d)].push_back(me);
          ++unmet[me];
        }
      }
    }
    // Rendezvous groups via union-find over shared keys.
    std::vector<std::size_t> parent(n);
    std::iota(parent.begin(), parent.end(), 0);
    auto find = [&](std::size_t x) {
      while (parent[x] != x)
        x = parent[x] = parent[parent[x]];
      return x;
    };
    std::unordered_map<std::string, std::size_t> first;
    std::unordered_map<std::string, int> joined;
    for (std::size_t i = 0; i < n; ++i)
      for (const auto& rv : ops[i]->rendezvous) {
        auto [it, inserted] = first.emplace(rv.key, i);
        ++joined[rv.key];
        if (!inserted) parent[find(i)] = find(it->second);
      }
    for (std::size_t i = 0; i < n; ++i)
      for (const auto& rv : ops[i]->rendezvous)
        COCEMU_CHECK(joined[rv.key] == rv.members, Errc::mismatch,
                     "modeled schedule: '{}' on rank {} ('{}'{}) expects {} participants, {} "
                     "joined (a collective or send/recv that not every participant called)",
                     rv.key, ops[i]->rank, ops[i]->name,
                     ops[i]->detail ? ", " + op_detail(*ops[i]) : std::string(), rv.members,
                     joined[rv.key]);
    job_of.assign(n, -1);
    std::unordered_map<std::size_t, int> job_of_root;
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t root = find(i);
      auto [it, inserted] = job_of_root.emplace(root, int(jobs.size()));
      if (inserted) {
        jobs.emplace_back();
        job_left.push_back(0);
      }
      job_of[i] = it->second;
      jobs[it->second].push_back(i);
      job_left[it->second] = std::max(job_left[it->second], std::max(0.0, ops[i]->work_ns));
    }
    job_ready.assign(jobs.size(), 0);
  }

  /// Ops of a rank running now: compute ones, comm ones, and comm ones per link (LinkUse bit);
  /// and, per event, the memory each rank's running ops ask for (fractions of the bandwidth).
  struct Load {
    std::vector<int> compute, comm;
    std::vector<std::array<int, 4>> link;
    std::vector<double> memory;
    double bandwidth = 0;  // bytes per ns; 0: memory not shared
    explicit Load(std::size_t ranks, double bytes_per_ns)
        : compute(ranks), comm(ranks), link(ranks), memory(ranks), bandwidth(bytes_per_ns) {}
    /// The op's request at full speed: its traffic over its duration, in bandwidths.
    double request(const OpRecord& op) const {
      if (bandwidth <= 0 || op.hbm_bytes == 0 || op.work_ns <= 0) return 0;
      return double(op.hbm_bytes) / op.work_ns / bandwidth;
    }
    /// 1/D for an op that asks for memory while its rank's requests add up to D > 1, else 1.
    double memory_rate(const OpRecord& op) const {
      const double d = memory[std::size_t(op.rank)];
      return request(op) > 0 && d > 1 ? 1 / d : 1;
    }
    void add(const OpRecord& op, int d) {
      const std::size_t r = std::size_t(op.rank);
      if (op.cls == OpClass::compute || op.cls == OpClass::fused) compute[r] += d;
      if (op.cls == OpClass::comm || op.cls == OpClass::fused) {
        comm[r] += d;
        for (int b = 0; b < 4; ++b)
          if (uses(op, b)) link[r][std::size_t(b)] += d;
      }
    }
    /// Fused kernels move their tiles over the intra-node fabric.
    static bool uses(const OpRecord& op, int bit) {
      const std::uint8_t use = op.cls == OpClass::fused ? (kIntraOut | kIntraIn) : op.link_use;
      return use & (1u << bit);
    }
    /// How many running ops share the busiest link `op` uses.
    int sharing(const OpRecord& op) const {
      int n = 1;
      for (int b = 0; b < 4; ++b)
        if (uses(op, b)) n = std::max(n, link[std::size_t(op.rank)][std::size_t(b)]);
      return n;
    }
  };

  /// The op's speed from the units it shares: compute ops split the cores, comm ops their busiest
  /// link, and each slows by the other side's contention factor while that side runs.
  double share(const OpRecord& op, const Load& load) const {
    const std::size_t k = std::size_t(op.rank);
    double x = 1.0;
    switch (op.cls) {
      case OpClass::compute:
        x = 1.0 / std::max(1, load.compute[k]);
        if (load.comm[k] > 0) x /= cm.compute_slowdown;
        break;
      case OpClass::comm:
        x = 1.0 / load.sharing(op);
        if (load.compute[k] > 0) x /= cm.comm_slowdown;
        break;
      case OpClass::fused:
        x = 1.0 / std::max(load.compute[k], load.sharing(op));
        break;
      default:
        break;
    }
    return x;
  }

  /// A job's speed without the memory term: its slowest member's share.
  double share(int job, const Load& load) const {
    double r = std::numeric_limits<double>::infinity();
    for (std::size_t m : jobs[job])
      r = std::min(r, share(*ops[m], load));
    return r;
  }

  /// Every running job's speed: its share, and, where a rank's running ops ask for more memory
  /// than it has (each asks its request times the speed its share lets it run at, so ops that
  /// already split the cores do not count twice), 1/D of it for the ops that ask.
  void rates(const std::vector<int>& jobs_running, Load& load, std::vector<double>& out) const {
    out.resize(jobs_running.size());
    for (std::size_t k = 0; k < jobs_running.size(); ++k)
      out[k] = share(jobs_running[k], load);
    if (load.bandwidth <= 0) return;
    for (const int j : jobs_running)
      for (std::size_t m : jobs[j])
        load.memory[std::size_t(ops[m]->rank)] = 0;
    for (std::size_t k = 0; k < jobs_running.size(); ++k)
      for (std::size_t m : jobs[jobs_running[k]])
        load.memory[std::size_t(ops[m]->rank)] += out[k] * load.request(*ops[m]);
    for (std::size_t k = 0; k < jobs_running.size(); ++k) {
      double r = std::numeric_limits<double>::infinity();
      for (std::size_t m : jobs[jobs_running[k]])
        r = std::min(r, share(*ops[m], load) * load.memory_rate(*ops[m]));
      out[k] = r;
    }
  }

  std::string describe(std::size_t i) const {
    const OpRecord& op = *ops[i];
    const auto& lanes = g.ranks[std::size_t(op.rank)].lane_names;
    return fmt::format("rank {} {} op #{} '{}'", op.rank,
                       std::size_t(op.lane) < lanes.size() ? lanes[std::size_t(op.lane)]
                                                           : fmt::format("lane {}", op.lane),
                       op.index, op.name);
  }

  /// Nothing can start, yet ops remain: every participant joined each rendezvous (checked in
  /// build), so the ops wait on each other in a cycle. Finds one — edges are "queued behind" (lane
  /// order), "waits for" (events, launches) and "must start together with" (rendezvous) — and
  /// reports it with the way out.
  [[noreturn]] void report_deadlock(std::size_t left) const {
    const std::size_t n = ops.size();
    std::vector<std::vector<std::size_t>> pred(n);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t s : succ[i])
        if (!done[i]) pred[s].push_back(i);
    auto next = [&](std::size_t i) {
      std::vector<std::size_t> out;
      if (unmet[i] > 0) {
        for (std::size_t p : pred[i])
          if (!done[p]) out.push_back(p);
      } else {
        for (std::size_t m : jobs[std::size_t(job_of[i])])
          if (m != i && !done[m] && unmet[m] > 0) out.push_back(m);
      }
      return out;
    };
    // Iterative depth-first search for a cycle among the ops not done.
    std::vector<int> state(n, 0);  // 0 new, 1 on the path, 2 finished
    std::vector<std::size_t> path, cycle;
    for (std::size_t root = 0; root < n && cycle.empty(); ++root) {
      if (done[root] || state[root]) continue;
      std::vector<std::pair<std::size_t, std::vector<std::size_t>>> stack;
      stack.push_back({root, next(root)});
      state[root] = 1;
      path.assign(1, root);
      while (!stack.empty() && cycle.empty()) {
        auto& [node, todo] = stack.back();
        if (todo.empty()) {
          state[node] = 2;
          stack.pop_back();
          path.pop_back();
          continue;
        }
        const std::size_t v = todo.back();
        todo.pop_back();
        if (state[v] == 1) {
          cycle.assign(std::find(path.begin(), path.end(), v), path.end());
        } else if (state[v] == 0) {
          state[v] = 1;
          path.push_back(v);
          stack.push_back({v, next(v)});
        }
      }
    }
    std::string text;
    bool p2p = false;
    for (std::size_t k = 0; k < cycle.size(); ++k) {
      const std::size_t a = cycle[k], b = cycle[(k + 1) % cycle.size()];
      const bool together = job_of[a] == job_of[b];
      const bool same_lane = ops[a]->rank == ops[b]->rank && ops[a]->lane == ops[b]->lane;
      for (const auto& rv : ops[a]->rendezvous)
        p2p = p2p || rv.key.starts_with("p2p/");
      text += fmt::format("\n  {} {} {}", describe(a),
                          together    ? "must start together with"
                          : same_lane ? "is queued behind"
                                      : "waits for",
                          describe(b));
    }
    if (cycle.empty())
      for (std::size_t i = 0, shown = 0; i < n && shown < 8; ++i)
        if (!done[i]) {
          text += fmt::format("\n  {} ({} prerequisites unmet)", describe(i), unmet[i]);
          ++shown;
        }
    COCEMU_FAIL(Errc::invalid_argument,
                "the program deadlocks: {} of {} ops can never start, because they wait on each "
                "other in a cycle:{}{}",
                left, n, text,
                p2p ? "\nOn NCCL and HCCL such a program hangs: an unbatched isend/irecv starts "
                      "only when its peer's matching call does, and here each is queued behind "
                      "another that waits for it. Post the sends and receives of one exchange "
                      "together with batch_isend_irecv, or order them by rank parity (even ranks "
                      "send first, odd ranks receive first, as MindSpeed's RingP2P does)."
                    : "");
  }

  void complete(std::size_t i, double t) {
    done[i] = 1;
    end[i] = t;
    for (std::size_t s : succ[i]) {
      if (ops[s]->lane == ops[i]->lane && ops[s]->rank == ops[i]->rank)
        lane_free[s] = std::max(lane_free[s], t);
      if (--unmet[s] == 0) to_start.push_back(s);
    }
  }

  Timeline run() {
    build();
    const std::size_t n = ops.size();
    for (std::size_t i = 0; i < n; ++i)
      if (unmet[i] == 0) to_start.push_back(i);
    Load load(g.ranks.size(), cm.memory_bytes_per_ns);
    double t = 0;
    std::size_t n_done = 0;
    while (n_done < n) {
      // Start everything that became ready at time t (zero-work jobs finish at once).
      while (!to_start.empty()) {
        const std::size_t i = to_start.back();
        to_start.pop_back();
        const int j = job_of[i];
        if (++job_ready[j] < int(jobs[j].size())) continue;
        for (std::size_t m : jobs[j]) {
          // Waits show from when their lane was free; everything else from when it starts.
          start[m] =
              ops[m]->cls == OpClass::wait && lane_free[m] >= 0 ? std::min(lane_free[m], t) : t;
        }
        if (job_left[j] <= 0) {
          for (std::size_t m : jobs[j])
            complete(m, t), ++n_done;
        } else {
          running.push_back(j);
          for (std::size_t m : jobs[j])
            load.add(*ops[m], +1);
        }
      }
      if (n_done == n) break;
      if (running.empty()) report_deadlock(n - n_done);
      // Advance to the next completion.
      std::vector<double> rates;
      this->rates(running, load, rates);
      double dt = std::numeric_limits<double>::infinity();
      for (std::size_t k = 0; k < running.size(); ++k)
        dt = std::min(dt, job_left[running[k]] / rates[k]);
      t += dt;
      std::vector<int> still;
      for (std::size_t k = 0; k < running.size(); ++k) {
        const int j = running[k];
        job_left[j] -= rates[k] * dt;
        if (job_left[j] <= 1e-6 * std::max(1.0, rates[k] * dt)) {
          for (std::size_t m : jobs[j]) {
            load.add(*ops[m], -1);
            complete(m, t);
            ++n_done;
          }
        } else {
          still.push_back(j);
        }
      }
      running.swap(still);
    }
    std::vector<std::vector<ScheduledOp>> times(g.ranks.size());
    for (std::size_t r = 0; r < g.ranks.size(); ++r) {
      times[r].resize(g.ranks[r].ops.size());
      for (std::size_t k = 0; k < times[r].size(); ++k) {
        const std::size_t i = base[r] + k;
        times[r][k] = {std::llround(start[i]), std::llround(end[i])};
      }
    }
    return Timeline(std::move(times));
  }
};

}  // namespace

Timeline simulate(const ModelGraph& graph, const ContentionModel& contention) {
  return Sim(graph, contention).run();
}

}  // namespace cocemu
