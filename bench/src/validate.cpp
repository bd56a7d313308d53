#include "cocemu/bench/validate.h"

#include <fmt/format.h>

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

/// nccl-tests bus bandwidth (GB/s) of `op` on `n` ranks with `bytes` per rank, as modeled.
double modeled_busbw(const DeviceProfile& p, const std::string& op_name, int n,
                     std::int64_t bytes) {
  COCEMU_CHECK_ARG(
      op_name == "all_reduce" || op_name == "all_gather" || op_name == "reduce_scatter",
      "validate: op '{}' unsupported; allowed all_reduce, all_gather, reduce_scatter", op_name);
  const CollOp op = op_name == "all_reduce"   ? CollOp::all_reduce
                    : op_name == "all_gather" ? CollOp::all_gather
                                              : CollOp::reduce_scatter;
  const DType t = DType::f32;
  const std::int64_t count = bytes / std::int64_t(size_of(t));
  // NCCL's ring is not rank-ordered: price the non-deterministic plan.
  // nccl-tests sizes: all_reduce moves one buffer of S bytes; all_gather and reduce_scatter a
  // per-rank piece of S/n (our count is the per-rank piece for both).
  const std::int64_t plan_count = op == CollOp::all_reduce ? count : count / n;
  const Algorithm a = parse_algorithm(p.auto_algorithm(std::uint64_t(bytes)));
  const double ns = price_plan(build_plan({op, a, n, plan_count, 0, false, {}}), p, t).total_ns;
  const double algbw = double(bytes) / ns;  // bytes per ns = GB/s
  const double factor = op == CollOp::all_reduce ? 2.0 * (n - 1) / n : double(n - 1) / n;
  return algbw * factor;
}

}  // namespace

Validation validate(const std::string& text, const std::string& origin) {
  auto top = detail::YamlReader::parse(text, origin);
  Validation v;
  for (detail::YamlReader e : top.sequence("references")) {
    Reference r;
    r.name = e.string("name");
    r.kind = e.string("kind");
    r.profile = e.string("profile");
    r.value = e.number("value", 1e-9, 1e12);
    r.source = e.string("source");
    const DeviceProfile p = load_named_profile(r.profile);
    if (r.kind == "collective_busbw") {
      const std::string op = e.string("op");
      const int n = int(e.integer("ranks", 2, 64));
      const std::int64_t bytes = e.integer("bytes", 1, std::int64_t(1) << 40);
      r.unit = "GB/s";
      r.modeled = modeled_busbw(p, op, n, bytes);
    } else if (r.kind == "gemm_tflops") {
      const std::int64_t m = e.integer("m", 1, 1 << 24), n = e.integer("n", 1, 1 << 24),
                         k = e.integer("k", 1, 1 << 24);
      const DType t = parse_dtype(e.string("dtype"));
      r.unit = "TFLOPS";
      r.modeled = 2.0 * double(m) * double(n) * double(k) / gemm_ns(p, m, n, k, t) / 1e3;
    } else if (r.kind == "attention_tflops") {
      const std::int64_t s = e.integer("seq", 1, 1 << 24), d = e.integer("head_dim", 1, 1024);
      const DType t = parse_dtype(e.string("dtype"));
      // Priced as the layers price core attention (cost_model.h attention_ns).
      r.unit = "TFLOPS";
      r.modeled = 4.0 * double(s) * double(s) * double(d) / attention_ns(p, 1, s, s, d, t) / 1e3;
    } else {
      COCEMU_FAIL(Errc::parse_error,
                  "{}: kind '{}' unknown; allowed collective_busbw, gemm_tflops, attention_tflops",
                  e.where(), r.kind);
    }
    e.finish();
    r.delta_pct = 100.0 * (r.modeled - r.value) / r.value;
    v.rows.push_back(r);
  }
  top.finish();
  COCEMU_CHECK(!v.rows.empty(), Errc::parse_error, "{}: no references", origin);
  for (const Reference& r : v.rows) {
    v.mean_abs_delta_pct += std::fabs(r.delta_pct) / double(v.rows.size());
    v.max_abs_delta_pct = std::max(v.max_abs_delta_pct, std::fabs(r.delta_pct));
  }
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
  std::string out = fmt::format("{:<4} {:<62} {:>10} {:>10} {:>8}\n", "#", "reference", "published",
                                "modeled", "delta %");
  for (std::size_t i = 0; i < v.rows.size(); ++i) {
    const Reference& r = v.rows[i];
    out += fmt::format("{:<4} {:<62} {:>10.1f} {:>10.1f} {:>+8.1f}   {} on {}\n", i + 1, r.name,
                       r.value, r.modeled, r.delta_pct, r.unit, r.profile);
  }
  out += fmt::format("\nmean |delta| {:.1f}%   max |delta| {:.1f}%   ({} references)\n",
                     v.mean_abs_delta_pct, v.max_abs_delta_pct, v.rows.size());
  out += "\nsources:\n";
  for (std::size_t i = 0; i < v.rows.size(); ++i)
    out += fmt::format("[{}] {}\n", i + 1, v.rows[i].source);
  return out;
}

}  // namespace cocemu::bench
