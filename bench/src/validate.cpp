#include "cocemu/bench/validate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "cocemu/collectives/plan.h"
#include "cocemu/runtime/cost_model.h"
#include "cocemu/runtime/detail/yaml_reader.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/profile.h"

namespace cocemu::bench {

namespace {

/// The modeled bandwidth (GB/s) of `op` on `n` ranks over a buffer of `bytes` as the source
/// counts it (the whole buffer; all_gather's output, reduce_scatter's input), placed on ranks
/// 0..n−1 of the profile's cluster: busbw (nccl-tests' correction) or algbw (bytes / time).
double modeled_collective(const DeviceProfile& p, const std::string& op_name, int n,
                          std::int64_t bytes, DType t, bool busbw) {
  COCEMU_CHECK_ARG(
      op_name == "all_reduce" || op_name == "all_gather" || op_name == "reduce_scatter",
      "validate: op '{}' unsupported; allowed all_reduce, all_gather, reduce_scatter", op_name);
  const CollOp op = op_name == "all_reduce"   ? CollOp::all_reduce
                    : op_name == "all_gather" ? CollOp::all_gather
                                              : CollOp::reduce_scatter;
  p.check_world(n);
  const std::int64_t count = bytes / std::int64_t(size_of(t));
  // Our count is the per-rank piece for all_gather and reduce_scatter.
  const std::int64_t plan_count = op == CollOp::all_reduce ? count : count / n;
  std::vector<int> ranks(static_cast<std::size_t>(n)), nodes;
  bool multi = false;
  for (int r = 0; r < n; ++r) {
    ranks[std::size_t(r)] = r;
    nodes.push_back(p.topology.node_of(r));
    multi = multi || nodes.back() != nodes.front();
  }
  // The libraries' plans are not rank-ordered: price the non-deterministic ones.
  const std::uint64_t per_rank = std::uint64_t(plan_count) * size_of(t);
  PlanRequest req{op, parse_algorithm(p.auto_algorithm(per_rank, multi)), n, plan_count, 0, false,
                  {}};
  req.nodes = nodes;
  const double ns = price_plan(build_plan(req), p, t, ranks).total_ns;
  const double algbw = double(bytes) / ns;  // bytes per ns = GB/s
  if (!busbw) return algbw;
  return algbw * (op == CollOp::all_reduce ? 2.0 * (n - 1) / n : double(n - 1) / n);
}

}  // namespace

Validation validate(const std::string& text, const std::string& origin) {
  auto top = detail::YamlReader::parse(text, origin);
  Validation v;
  for (detail::YamlReader e : top.sequence("references")) {
    Reference r;
    r.name = e.string("name");
    r.kind = e.string("kind");
    r.device = e.string("device");
    r.published = e.number("published", 1e-9, 1e12);
    r.source = e.string("source");
    DeviceProfile p = load_named_profile(r.device);
    if (e.has("fitted"))
      for (const auto& [key, where] : e.strings("fitted")) {
        const auto keys = p.scalable_keys();
        COCEMU_CHECK(std::find(keys.begin(), keys.end(), key) != keys.end(), Errc::parse_error,
                     "{}: fitted parameter '{}' is not a parameter of profile '{}'", where, key,
                     r.device);
        r.fitted.push_back(key);
      }
    DType t = DType::f32;
    if (e.has("dtype")) {
      const std::string name = e.string("dtype");
      try {
        t = parse_dtype(name);
      } catch (const Error&) {
        COCEMU_FAIL(Errc::parse_error,
                    "{}: dtype '{}' is unknown; allowed f32, f64, f16, bf16, "
                    "i8, i32",
                    e.where(), name);
      }
    }
    if (r.kind == "collective") {
      const std::string op = e.string("op");
      const int n = int(e.integer("ranks", 2, 1 << 16));
      const std::int64_t bytes = e.integer("bytes", 1, std::int64_t(1) << 40);
      const std::string metric = e.string("metric");
      COCEMU_CHECK(metric == "busbw" || metric == "algbw", Errc::parse_error,
                   "{}: metric '{}' unknown; allowed busbw, algbw", e.where(), metric);
      if (e.has("inter_node_per_device_bytes_per_s"))
        p.topology.inter_per_device = e.number("inter_node_per_device_bytes_per_s", 1e6, 1e15);
      r.nodes = (n + p.topology.devices_per_node - 1) / p.topology.devices_per_node;
      r.unit = "GB/s " + metric;
      r.modeled = modeled_collective(p, op, n, bytes, t, metric == "busbw");
    } else if (r.kind == "gemm") {
      const std::int64_t m = e.integer("m", 1, 1 << 24), n = e.integer("n", 1, 1 << 24),
                         k = e.integer("k", 1, 1 << 24);
      r.unit = "TFLOPS";
      r.modeled = 2.0 * double(m) * double(n) * double(k) / gemm_ns(p, m, n, k, t) / 1e3;
    } else if (r.kind == "attention") {
      const std::int64_t s = e.integer("seq", 1, 1 << 24), d = e.integer("head_dim", 1, 1024);
      const double visible = e.boolean("causal") ? 0.5 : 1.0;
      // Priced as the layers price core attention (cost_model.h attention_ns).
      r.unit = "TFLOPS";
      r.modeled = 4.0 * double(s) * double(s) * double(d) * visible /
                  attention_ns(p, 1, s, s, d, t, visible) / 1e3;
    } else if (r.kind == "memory") {
      const std::int64_t bytes = e.integer("bytes", 1, std::int64_t(1) << 40);
      const std::string counted = e.string("counted");
      COCEMU_CHECK(counted == "input" || counted == "moved", Errc::parse_error,
                   "{}: counted '{}' unknown; allowed input (the source divides the input bytes "
                   "by time), moved (reads plus writes)",
                   e.where(), counted);
      // An elementwise kernel reads its input and writes as much.
      r.unit = "GB/s";
      r.modeled =
          double(bytes) / memory_ns(p, std::uint64_t(2 * bytes)) * (counted == "moved" ? 2.0 : 1.0);
    } else {
      COCEMU_FAIL(Errc::parse_error,
                  "{}: kind '{}' unknown; allowed collective, gemm, attention, memory", e.where(),
                  r.kind);
    }
    e.finish();
    r.delta_pct = 100.0 * (r.modeled - r.published) / r.published;
    v.rows.push_back(r);
  }
  top.finish();
  COCEMU_CHECK(!v.rows.empty(), Errc::parse_error, "{}: no references", origin);
  int tests = 0;
  for (const Reference& r : v.rows) {
    v.mean_abs_delta_pct += std::fabs(r.delta_pct) / double(v.rows.size());
    v.max_abs_delta_pct = std::max(v.max_abs_delta_pct, std::fabs(r.delta_pct));
    if (r.fitted.empty()) {
      v.mean_abs_delta_tests_pct += std::fabs(r.delta_pct);
      ++tests;
    }
  }
  if (tests > 0) v.mean_abs_delta_tests_pct /= tests;
  return v;
}

Validation validate_shipped() {
  const std::string path = config_dir() + "/validation.yaml";
  std::ifstream f(path);
  COCEMU_CHECK(f.good(), Errc::invalid_argument, "validate: cannot read '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return validate(ss.str(), path);
}

std::string format_validation(const Validation& v) {
  std::string out = fmt::format("{:<3} {:<72} {:>10} {:>10} {:>8}\n", "#", "reference", "published",
                                "modeled", "delta %");
  for (std::size_t i = 0; i < v.rows.size(); ++i) {
    const Reference& r = v.rows[i];
    out += fmt::format(
        "{:<3} {:<72} {:>10.1f} {:>10.1f} {:>+8.1f}   {} on {}{}{}\n", i + 1, r.name, r.published,
        r.modeled, r.delta_pct, r.unit, r.device,
        r.nodes > 1 ? fmt::format(", {} nodes", r.nodes) : "",
        r.fitted.empty() ? "" : "  [fitted: " + fmt::format("{}", fmt::join(r.fitted, ", ")) + "]");
  }
  out += fmt::format(
      "\nmean |delta| {:.1f}%   max |delta| {:.1f}%   ({} references; [fitted] rows set the "
      "named parameters, the others only test the model: mean |delta| over those {:.1f}%)\n",
      v.mean_abs_delta_pct, v.max_abs_delta_pct, v.rows.size(), v.mean_abs_delta_tests_pct);
  out += "\nsources:\n";
  for (std::size_t i = 0; i < v.rows.size(); ++i)
    out += fmt::format("[{}] {}\n", i + 1, v.rows[i].source);
  return out;
}

std::string validation_json(const Validation& v) {
  nlohmann::json refs = nlohmann::json::array();
  for (const Reference& r : v.rows)
    refs.push_back({{"name", r.name},
                    {"kind", r.kind},
                    {"device", r.device},
                    {"nodes", r.nodes},
                    {"source", r.source},
                    {"unit", r.unit},
                    {"published", r.published},
                    {"modeled", r.modeled},
                    {"delta", r.delta_pct / 100.0},
                    {"fitted", r.fitted}});
  const nlohmann::json j{{"references", refs},
                         {"mean_abs_delta", v.mean_abs_delta_pct / 100.0},
                         {"max_abs_delta", v.max_abs_delta_pct / 100.0},
                         {"mean_abs_delta_of_tests", v.mean_abs_delta_tests_pct / 100.0}};
  return j.dump(2) + "\n";
}

}  // namespace cocemu::bench
