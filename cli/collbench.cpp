// `cocemu collbench`: nccl-tests-style tables of the emulated collectives, with host wall time and
// modeled device time side by side.
//
// Conventions (nccl-tests): size S is one rank's buffer (all_reduce send = recv = S; all_gather
// recv = S; reduce_scatter send = S; all_to_all send = recv = S; broadcast S). algbw = S / t;
// busbw = algbw · 2(n-1)/n for all_reduce, · (n-1)/n for all_gather, reduce_scatter and
// all_to_all, · 1 for broadcast. GB/s = 1e9 bytes/s. Wall time per call is the median over
// samples of (a batch of back-to-back calls after a barrier) / batch, as seen by rank 0, after
// --warmup untimed calls.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>

#include "cocemu/bench/limits/estimate.h"
#include "cocemu/collectives/ops.h"
#include "cocemu/collectives/plan.h"
#include "cocemu/runtime/checked.h"
#include "cocemu/runtime/error.h"
#include "commands.h"

namespace cocemu::cli {

namespace {

struct Row {
  std::string op;
  int ranks = 0;
  std::uint64_t size_bytes = 0;
  std::int64_t count = 0;
  std::string dtype, redop, algo;
  bool in_place = false;
  double wall_us = 0, algbw = 0, busbw = 0;
  double modeled_us = 0, modeled_busbw = 0;
  std::int64_t wrong = 0;
  std::string label;  // finds the modeled op in the graph
};

double bus_factor(CollOp op, int n) {
  switch (op) {
    case CollOp::all_reduce:
      return 2.0 * (n - 1) / n;
    case CollOp::all_gather:
    case CollOp::reduce_scatter:
    case CollOp::all_to_all:
      return double(n - 1) / n;
    default:
      return 1.0;
  }
}

CollOp parse_op(const std::string& s) {
  for (CollOp op : {CollOp::all_reduce, CollOp::all_gather, CollOp::reduce_scatter,
                    CollOp::all_to_all, CollOp::broadcast})
    if (s == to_string(op)) return op;
  COCEMU_FAIL(Errc::invalid_argument,
              "collbench: unknown op '{}'; allowed: all_reduce, all_gather, reduce_scatter, "
              "all_to_all, broadcast",
              s);
}

/// Exact small-integer input: element i of rank r.
double input_value(int r, std::int64_t i) {
  return double(r + 1) + double(i % 7);
}

struct Case {
  CollOp op;
  std::uint64_t size;
  bool in_place;
};

/// Buffers of one case on one rank.
struct Buffers {
  Tensor in, out;
};

Buffers make_buffers(const Case& c, Group& g, DType dtype) {
  const int n = g.size(), r = g.rank();
  const std::int64_t e = std::int64_t(size_of(dtype));
  const std::int64_t S = std::int64_t(c.size) / e;  // elements of the size buffer
  Buffers b;
  switch (c.op) {
    case CollOp::all_reduce:
    case CollOp::broadcast:
      b.in = Tensor::zeros({S}, dtype);
      b.out = c.in_place ? b.in : Tensor::zeros({S}, dtype);
      break;
    case CollOp::all_gather:
      b.out = Tensor::zeros({S}, dtype);
      b.in =
          c.in_place ? b.out.flat(r * (S / n), (r + 1) * (S / n)) : Tensor::zeros({S / n}, dtype);
      break;
    case CollOp::reduce_scatter:
      b.in = Tensor::zeros({S}, dtype);
      b.out =
          c.in_place ? b.in.flat(r * (S / n), (r + 1) * (S / n)) : Tensor::zeros({S / n}, dtype);
      break;
    case CollOp::all_to_all:
      b.in = Tensor::zeros({S}, dtype);
      b.out = Tensor::zeros({S}, dtype);
      break;
    default:
      break;
  }
  return b;
}

void fill_input(const Tensor& t, int rank) {
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = t.data<T>();
    for (std::int64_t i = 0; i < t.numel(); ++i)
      p[i] = store_as<T>(input_value(rank, i));
  });
}

Work issue(const Case& c, Group& g, const Buffers& b, const CollectiveOptions& o) {
  switch (c.op) {
    case CollOp::all_reduce:
      return all_reduce(g, b.in, b.out, o);
    case CollOp::all_gather:
      return all_gather(g, b.out, b.in, o);
    case CollOp::reduce_scatter:
      return reduce_scatter(g, b.out, b.in, o);
    case CollOp::all_to_all:
      return all_to_all(g, b.out, b.in, o);
    case CollOp::broadcast:
      return broadcast(g, b.in, 0, o);
    default:
      COCEMU_FAIL(Errc::internal, "collbench op");
  }
}

/// Counts elements of this rank's output that differ from the exact answer.
std::int64_t count_wrong(const Case& c, Group& g, const Buffers& b) {
  const int n = g.size(), r = g.rank();
  const Tensor& out = c.op == CollOp::broadcast ? b.in : b.out;
  std::int64_t wrong = 0;
  const std::int64_t m = out.numel();
  for (std::int64_t i = 0; i < m; ++i) {
    double want = 0;
    switch (c.op) {
      case CollOp::all_reduce:
        for (int j = 0; j < n; ++j)
          want += input_value(j, i);
        break;
      case CollOp::all_gather:
        want = input_value(int(i / (m / n)), i % (m / n));
        break;
      case CollOp::reduce_scatter:
        for (int j = 0; j < n; ++j)
          want += input_value(j, r * m + i);
        break;
      case CollOp::all_to_all: {
        const std::int64_t k = m / n, p = i / k;
        want = input_value(int(p), r * k + i % k);
        break;
      }
      case CollOp::broadcast:
        want = input_value(0, i);
        break;
      default:
        break;
    }
    if (out.item(i) != want) ++wrong;
  }
  return wrong;
}

/// The per-rank element count `model_collective` takes for a case (ops.h conventions).
std::int64_t plan_count(const Case& c, int n, DType dtype) {
  const std::int64_t S = std::int64_t(c.size / size_of(dtype));
  switch (c.op) {
    case CollOp::all_gather:
    case CollOp::reduce_scatter:
    case CollOp::all_to_all:
      return S / n;
    default:
      return S;
  }
}

/// --dry-run: every case priced without running it (one representative call: every member of
/// the world group does the same), modeled columns only.
void dry_run_rows(const DeviceProfile& profile, const std::vector<Case>& cases, int n, DType dtype,
                  Algorithm algo, bool deterministic, const std::string& json) {
  std::vector<int> ranks(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    ranks[std::size_t(r)] = r;
  std::printf(
      "# cocemu collbench DRY RUN: %d ranks (%d nodes), dtype %s, profile %s, %s reductions — "
      "modeled only, no threads, no numerics, no wall time\n",
      n, (n + profile.topology.devices_per_node - 1) / profile.topology.devices_per_node,
      name_of(dtype).data(), profile.name.c_str(),
      deterministic ? "deterministic" : "nondeterministic");
  nlohmann::json rows = nlohmann::json::array();
  std::string current;
  for (const Case& c : cases) {
    if (c.in_place) continue;  // the same plan and price as out of place
    const ModeledCollective m = model_collective(profile, c.op, ranks, plan_count(c, n, dtype),
                                                 dtype, c.size, algo, deterministic);
    const double us = m.cost.total_ns / 1e3;
    const double busbw = double(c.size) / (us * 1e-6) / 1e9 * bus_factor(c.op, n);
    if (current != to_string(c.op)) {
      current = to_string(c.op);
      std::printf("\n# %s\n%12s %12s %5s %12s %11s %8s\n", current.c_str(), "size", "count", "type",
                  "algo", "modeled us", "m.busbw");
    }
    std::printf("%12llu %12lld %5s %12s %11.1f %8.2f\n", (unsigned long long)c.size,
                (long long)(c.size / size_of(dtype)), name_of(dtype).data(),
                to_string(m.plan.algorithm), us, busbw);
    rows.push_back({{"op", current},
                    {"ranks", n},
                    {"size_bytes", c.size},
                    {"algo", to_string(m.plan.algorithm)},
                    {"modeled_us", us},
                    {"modeled_busbw_gbps", busbw}});
  }
  if (json.empty()) return;
  write_file(
      "--json", json,
      nlohmann::json{{"profile", profile.name}, {"dry_run", true}, {"rows", rows}}.dump(2) + "\n");
}

}  // namespace

void add_collbench(CLI::App& app) {
  struct Opts {
    int ranks = 8;
    std::vector<std::string> ops{"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                 "broadcast"};
    std::uint64_t min_bytes = 4096, max_bytes = 64ull << 20;
    int factor = 4;
    std::string dtype = "f32", algo = "auto", profile = "ascend-910b", json;
    int samples = 0, warmup = 1;
    double max_seconds = 0;
    bool nondeterministic = false, check = true, dry_run = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand(
      "collbench", "nccl-tests-style table per collective: host wall time and modeled time");
  number(sub, "-n,--ranks", o->ranks, "number of ranks (1..256; 1..1024 with --dry-run)", 1, 1024);
  sub->add_option("--ops", o->ops, "collectives to run")->delimiter(',')->capture_default_str();
  number(sub, "-b,--min-bytes", o->min_bytes, "smallest size S in bytes", std::uint64_t(1),
         std::uint64_t(1) << 40);
  number(sub, "-e,--max-bytes", o->max_bytes, "largest size S in bytes", std::uint64_t(1),
         std::uint64_t(1) << 40);
  number(sub, "-f,--factor", o->factor, "size multiplier between rows", 2, 1024);
  sub->add_option("-d,--dtype", o->dtype, "f32, f64, f16, bf16, i32")->capture_default_str();
  sub->add_option("-a,--algo", o->algo, "auto, ring, direct, hierarchical or tree")
      ->capture_default_str();
  sub->add_option("-p,--profile", o->profile, "device profile name or YAML path")
      ->capture_default_str();
  number(sub, "--samples", o->samples, "timed samples per row (0 = by size)", 0, 1000);
  number(sub, "-w,--warmup", o->warmup,
         "untimed calls per row before its samples (nccl-tests' -w); a world's first calls "
         "fault in its op log and heap",
         1, 100000);
  sub->add_flag("--nondeterministic", o->nondeterministic,
                "reduce in arrival-like order instead of rank order");
  sub->add_option("--check", o->check, "verify results (#wrong): true/false, 1/0")
      ->check(
          CLI::IsMember({"0", "1", "true", "false", "on", "off", "yes", "no"}, CLI::ignore_case))
      ->capture_default_str();
  sub->add_option("--json", o->json, "write rows as JSON to this file");
  max_seconds_option(sub, o->max_seconds);
  sub->add_flag("--dry-run", o->dry_run,
                "modeled only: each call priced as the emulator prices it (model_collective) on "
                "world ranks 0..n-1 of the profile's cluster, without threads or numerics; -n "
                "up to 1024");
  sub->callback([o] {
    COCEMU_CHECK_ARG(o->factor >= 2, "collbench: --factor {} must be >= 2", o->factor);
    COCEMU_CHECK_ARG(o->min_bytes >= 1 && o->min_bytes <= o->max_bytes,
                     "collbench: need 1 <= --min-bytes ({}) <= --max-bytes ({})", o->min_bytes,
                     o->max_bytes);
    const DType dtype = parse_dtype(o->dtype);
    const Algorithm algo = parse_algorithm(o->algo);
    std::vector<CollOp> ops;
    for (const auto& s : o->ops)
      ops.push_back(parse_op(s));
    WorldOptions wo;
    wo.n_ranks = o->ranks;
    wo.profile = std::make_shared<const DeviceProfile>(load_named_profile(o->profile));
    wo.deterministic = !o->nondeterministic;
    wo.record_wall_times = false;
    const int n = o->ranks;
    COCEMU_CHECK_ARG(n >= 1 && n <= (o->dry_run ? 1024 : 256),
                     "collbench: -n {} is out of range; allowed 1..256 (1..1024 with --dry-run)",
                     n);
    const std::uint64_t align = std::uint64_t(n) * size_of(dtype);
    if (!o->json.empty()) check_output_file("--json", o->json);
    std::vector<Case> cases;
    for (CollOp op : ops)
      for (std::uint64_t s = o->min_bytes; s <= o->max_bytes; s *= std::uint64_t(o->factor)) {
        const std::uint64_t size = std::max(align, s / align * align);
        for (bool in_place : {false, true})
          cases.push_back({op, size, in_place});
        if (s > o->max_bytes / std::uint64_t(o->factor)) break;  // the next row would overflow
      }
    if (!o->dry_run) {  // every row's warm-up, check and timed calls on every rank
      double moved = 0;
      for (const Case& c : cases)
        moved += double(o->warmup + 1 + (o->samples > 0 ? o->samples : 9)) * double(c.size) * n;
      check_estimate(
          bench::estimate_collbench(std::int64_t(o->max_bytes), moved, n,
                                    fmt::format("collbench -n {} -e {}", n, o->max_bytes)),
          time_budget(o->max_seconds));
    }
    std::vector<Row> rows(cases.size());
    if (o->dry_run)
      return dry_run_rows(*wo.profile, cases, n, dtype, algo, wo.deterministic, o->json);
    std::mutex mu;
    RunResult result = run(wo, [&](Rank& rank) {
      Group world = Group::world(rank);
      for (std::size_t ci = 0; ci < cases.size(); ++ci) {
        const Case& c = cases[ci];
        Buffers b = make_buffers(c, world, dtype);
        CollectiveOptions co;
        co.algo = algo;
        co.async_op = true;
        co.label = fmt::format(" #{}", ci);
        // Correctness: one call on exact inputs.
        std::int64_t wrong = 0;
        if (o->check) {
          b.out.fill_zero();
          fill_input(b.in, rank.id());
          issue(c, world, b, co).synchronize();
          wrong = count_wrong(c, world, b);
        }
        co.label = fmt::format(" timed#{}", ci);
        const int iters = int(std::clamp<std::uint64_t>((8ull << 20) / c.size, 1, 50));
        const int samples = o->samples > 0 ? o->samples : (c.size >= (16u << 20) ? 5 : 9);
        for (int w = 0; w < o->warmup; ++w)  // untimed
          issue(c, world, b, co);
        rank.comm_stream().synchronize();
        std::vector<double> times;
        for (int s = 0; s < samples; ++s) {
          barrier(world, {.async_op = true}).synchronize();
          const auto t0 = std::chrono::steady_clock::now();
          for (int it = 0; it < iters; ++it)
            issue(c, world, b, co);
          rank.comm_stream().synchronize();
          const auto t1 = std::chrono::steady_clock::now();
          times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / iters);
        }
        std::sort(times.begin(), times.end());
        std::lock_guard lock(mu);
        Row& row = rows[ci];
        row.wrong += wrong;
        if (rank.id() == 0) {
          row.op = to_string(c.op);
          row.ranks = n;
          row.size_bytes = c.size;
          row.count = std::int64_t(c.size / size_of(dtype));
          row.dtype = std::string(name_of(dtype));
          row.redop = c.op == CollOp::all_reduce || c.op == CollOp::reduce_scatter ? "sum" : "none";
          row.in_place = c.in_place;
          row.wall_us = times[times.size() / 2];
          row.label = co.label;
        }
      }
    });
    // Modeled time of one timed call, from rank 0's timeline.
    const RankGraph& g0 = result.graph.ranks[0];
    std::map<std::string, std::pair<double, std::string>> modeled;
    for (const OpRecord& op : g0.ops) {
      if (op.cls != OpClass::comm) continue;
      const auto pos = op.name.find(" timed#");
      if (pos == std::string::npos) continue;
      const std::string label = op.name.substr(pos, op.name.find(' ', pos + 1) - pos);
      if (modeled.count(label)) continue;
      const ScheduledOp& s = result.timeline.at({0, op.index});
      const std::string detail = op_detail(op);
      const auto a = detail.find("algo ");
      modeled[label] = {double(s.end_ns - s.start_ns) / 1e3,
                        detail.substr(a + 5, detail.find(' ', a + 5) - a - 5)};
    }
    for (std::size_t ci = 0; ci < rows.size(); ++ci) {
      Row& r = rows[ci];
      const double f = bus_factor(cases[ci].op, n);
      r.algbw = double(r.size_bytes) / (r.wall_us * 1e-6) / 1e9;
      r.busbw = r.algbw * f;
      auto it = modeled.find(r.label);
      if (it != modeled.end()) {
        r.modeled_us = it->second.first;
        r.algo = it->second.second;
        r.modeled_busbw = double(r.size_bytes) / (r.modeled_us * 1e-6) / 1e9 * f;
      }
    }
    std::printf("# cocemu collbench: %d ranks, dtype %s, algo %s, profile %s, %s reductions\n", n,
                name_of(dtype).data(), o->algo.c_str(), wo.profile->name.c_str(),
                wo.deterministic ? "deterministic" : "nondeterministic");
    std::printf(
        "# wall = host time on this machine (median per call, after %d untimed calls per row); "
        "modeled = device time from the cost model; GB/s = 1e9 B/s; malloc from %s\n",
        o->warmup, malloc_library().c_str());
    std::string current;
    for (std::size_t ci = 0; ci < rows.size(); ci += 2) {
      const Row& a = rows[ci];
      const Row& b = rows[ci + 1];
      if (a.op != current) {
        current = a.op;
        std::printf("\n# %s\n", current.c_str());
        std::printf(
            "%12s %12s %5s %6s %6s | %10s %8s %8s %6s %11s %8s | %10s %8s %8s %6s %11s %8s\n",
            "size", "count", "type", "redop", "algo", "oop us", "algbw", "busbw", "#wrong",
            "modeled us", "m.busbw", "inpl us", "algbw", "busbw", "#wrong", "modeled us",
            "m.busbw");
      }
      std::printf(
          "%12llu %12lld %5s %6s %6s | %10.1f %8.3f %8.3f %6lld %11.1f %8.2f | %10.1f %8.3f "
          "%8.3f %6lld %11.1f %8.2f\n",
          (unsigned long long)a.size_bytes, (long long)a.count, a.dtype.c_str(), a.redop.c_str(),
          a.algo.c_str(), a.wall_us, a.algbw, a.busbw, (long long)a.wrong, a.modeled_us,
          a.modeled_busbw, b.wall_us, b.algbw, b.busbw, (long long)b.wrong, b.modeled_us,
          b.modeled_busbw);
    }
    std::int64_t total_wrong = 0;
    for (const Row& r : rows)
      total_wrong += r.wrong;
    std::printf("\n# out of bounds values: %lld %s\n", (long long)total_wrong,
                total_wrong ? "WRONG" : "OK");
    if (!o->json.empty()) {
      nlohmann::json j = nlohmann::json::array();
      for (const Row& r : rows)
        j.push_back({{"op", r.op},
                     {"ranks", r.ranks},
                     {"size_bytes", r.size_bytes},
                     {"count", r.count},
                     {"dtype", r.dtype},
                     {"redop", r.redop},
                     {"algo", r.algo},
                     {"in_place", r.in_place},
                     {"wall_us", r.wall_us},
                     {"algbw_gbps", r.algbw},
                     {"busbw_gbps", r.busbw},
                     {"modeled_us", r.modeled_us},
                     {"modeled_busbw_gbps", r.modeled_busbw},
                     {"wrong", r.wrong}});
      write_file(
          "--json", o->json,
          nlohmann::json{{"profile", wo.profile->name}, {"warmup_calls", o->warmup}, {"rows", j}}
                  .dump(2) +
              "\n");
      std::printf("# wrote %s\n", o->json.c_str());
    }
    if (total_wrong)
      throw Error(Errc::internal, fmt::format("collbench: {} wrong values", total_wrong));
  });
}

}  // namespace cocemu::cli
