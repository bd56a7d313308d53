// `cocemu train`'s report from an emulated run's modeled timeline, as JSON, text and SVG.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "cocemu/train/detail/intervals.h"
#include "cocemu/train/report.h"

namespace cocemu::bench {

namespace {

using detail::Interval;
using detail::merged;
using detail::uncovered;

}  // namespace

const char* comm_kind(const std::string& lane) {
  if (lane == "comm") return "TP";
  if (lane == "dp comm") return "DP";
  if (lane.rfind("pp ", 0) == 0) return "PP";
  if (lane.rfind("cp", 0) == 0) return "CP";
  return nullptr;
}

TrainReport report_from_run(const TrainSetup& setup, const layers::train::TrainResult& r) {
  const auto& o = setup.options;
  const auto& l = o.layout;
  const RunResult& run = r.run;
  TrainReport rep;
  rep.model = o.model.name;
  rep.layout = l.describe();
  rep.cp_algo = l.cp > 1 ? l.cp_algo : "";
  rep.micro_batch_interleave = l.micro_batch_interleave;
  rep.profile = setup.profile ? setup.profile->name : run.profile->name;
  rep.source = "emulated";
  rep.dry_run = !run.numerics;
  rep.deterministic = setup.deterministic;
  rep.world = l.world();
  rep.nodes = setup.nodes;
  rep.loss = r.loss;
  rep.grad_norm = r.grad_norm;
  rep.warnings = r.warnings;
  // The last iteration: from the end of the one before to the end of its last op.
  const int iters = int(r.iteration_first_op.empty() ? 0 : r.iteration_first_op[0].size());
  auto iteration_end = [&](int it) {
    std::int64_t end = 0;
    for (int rank = 0; rank < run.timeline.n_ranks(); ++rank) {
      const auto& firsts = r.iteration_first_op[std::size_t(rank)];
      const std::uint32_t lo = firsts[std::size_t(it)];
      const std::uint32_t hi =
          it + 1 < int(firsts.size()) ? firsts[std::size_t(it) + 1] : r.end_op[std::size_t(rank)];
      for (std::uint32_t i = lo; i < hi; ++i)
        end = std::max(end, run.timeline.rank(rank)[i].end_ns);
    }
    return end;
  };
  const std::int64_t t0 = iters >= 2 ? iteration_end(iters - 2) : 0, t1 = iteration_end(iters - 1);
  rep.iteration_ns = t1 - t0;
  const double seconds = double(rep.iteration_ns) * 1e-9;
  rep.tokens_per_s = double(l.global_batch_size * o.model.seq) / seconds;
  const double flops = model_flops_per_iteration(o.model, l);
  rep.tflops_per_device = flops / double(rep.world) / seconds / 1e12;
  rep.mfu = rep.tflops_per_device * 1e12 / run.profile->peak(l.dtype);
  // The pipeline picture and the bubble: one rank per stage (tp, cp, dp rank 0).
  const int per_stage = rep.world / l.pp;
  std::vector<std::int64_t> busy(std::size_t(l.pp), 0);
  std::int64_t lo = INT64_MAX, hi = 0;
  for (const auto& b : r.blocks) {
    if (b.rank % per_stage != 0) continue;
    std::int64_t s = INT64_MAX, e = 0;
    const auto& ops = run.graph.ranks[std::size_t(b.rank)].ops;
    for (std::uint32_t i = b.first_op; i < b.end_op; ++i) {
      if (ops[i].cls != OpClass::compute && ops[i].cls != OpClass::fused) continue;
      s = std::min(s, run.timeline.rank(b.rank)[i].start_ns);
      e = std::max(e, run.timeline.rank(b.rank)[i].end_ns);
    }
    if (e == 0) continue;
    rep.pipeline.push_back(
        {b.stage, layers::train::action_label(b.action, l.vpp), b.action.forward, s, e});
    busy[std::size_t(b.stage)] += e - s;
    lo = std::min(lo, s);
    hi = std::max(hi, e);
  }
  if (hi > lo) {
    double idle = 0;
    for (const auto v : busy)
      idle += 1.0 - double(v) / double(hi - lo);
    rep.bubble_fraction = idle / l.pp;
  }
  rep.ideal_bubble_fraction =
      layers::train::ideal_bubble_fraction(l.pp, l.vpp, int(l.micro_batches()));
  // Exposed communication by kind, mean over ranks, over one steady-state period of each rank:
  // from the end of its compute in the iteration before the last (its optimizer step) to the end
  // of its compute in the last. The parameter all-gathers that --overlap-param-gather launches
  // after an update belong to the period of the forward they overlap, not to the update's (the
  // last update's have no forward after them in the run).
  for (const char* k : {"TP", "CP", "DP", "PP"})
    rep.exposed_comm_ns[k] = 0;
  auto is_compute = [](const OpRecord& op) {
    return op.cls == OpClass::compute || op.cls == OpClass::fused;
  };
  for (int rank = 0; rank < run.timeline.n_ranks(); ++rank) {
    const auto& g = run.graph.ranks[std::size_t(rank)];
    const auto& times = run.timeline.rank(rank);
    const auto& firsts = r.iteration_first_op[std::size_t(rank)];
    // The end of this rank's last compute op in iteration `it` (0 before the first).
    auto compute_end = [&](int it) {
      std::int64_t end = 0;
      if (it < 0) return end;
      const std::uint32_t hi =
          it + 1 < int(firsts.size()) ? firsts[std::size_t(it) + 1] : r.end_op[std::size_t(rank)];
      for (std::uint32_t i = firsts[std::size_t(it)]; i < hi; ++i)
        if (is_compute(g.ops[i])) end = std::max(end, times[i].end_ns);
      return end;
    };
    const std::int64_t lo = compute_end(iters - 2), hi = compute_end(iters - 1);
    std::vector<Interval> compute;
    std::map<std::string, std::vector<Interval>> comm;
    for (std::uint32_t i = 0; i < r.end_op[std::size_t(rank)]; ++i) {
      const auto& op = g.ops[i];
      const auto& t = times[i];
      if (t.end_ns <= lo || t.start_ns >= hi) continue;
      const Interval in{std::max(t.start_ns, lo), std::min(t.end_ns, hi)};
      if (is_compute(op))
        compute.push_back(in);
      else if (op.cls == OpClass::comm)
        if (const char* k = comm_kind(g.lane_names[std::size_t(op.lane)])) comm[k].push_back(in);
    }
    // A kind's exposed time is its time that neither compute nor a more synchronous kind
    // covers: the layer waits for its TP (and CP) collectives where it issues them, a stage for
    // its pipeline transfers between passes, while DP reductions and gathers run in the
    // background; where a DP op overlaps a TP transfer the step waits for the TP one.
    std::vector<Interval> cover = compute;
    for (const char* k : {"TP", "CP", "PP", "DP"}) {
      const auto it = comm.find(k);
      if (it == comm.end()) continue;
      rep.exposed_comm_ns[k] += uncovered(merged(it->second), merged(cover)) / rep.world;
      cover.insert(cover.end(), it->second.begin(), it->second.end());
    }
  }
  rep.memory = estimate_memory(o.model, l, *run.profile);
  return rep;
}

nlohmann::json to_json(const TrainReport& r) {
  nlohmann::json j;
  j["model"] = r.model;
  j["layout"] = r.layout;
  if (!r.cp_algo.empty()) j["context_parallel_algo"] = r.cp_algo;
  j["micro_batch_interleave_num"] = r.micro_batch_interleave;
  j["profile"] = r.profile;
  j["source"] = r.source;
  j["dry_run"] = r.dry_run;
  j["deterministic"] = r.deterministic;
  if (r.dry_run) j["note"] = "dry run: shapes only, no numerics (modeled times and memory only)";
  j["world"] = r.world;
  j["nodes"] = r.nodes;
  j["iteration_ns"] = r.iteration_ns;
  j["tokens_per_s"] = r.tokens_per_s;
  j["tflops_per_device"] = r.tflops_per_device;
  j["mfu"] = r.mfu;
  j["bubble_fraction"] = r.bubble_fraction;
  j["ideal_bubble_fraction"] = r.ideal_bubble_fraction;
  j["exposed_comm_ns"] = r.exposed_comm_ns;
  nlohmann::json mem = nlohmann::json::object();
  for (const auto& t : r.memory.terms)
    mem[t.name] = t.bytes;
  j["memory"] = mem;
  j["memory_stage"] = r.memory.stage;
  j["peak_memory_bytes"] = r.memory.peak_bytes;
  j["device_memory_bytes"] = r.memory.capacity_bytes;
  j["oom"] = r.memory.oom;
  j["memory_verdict"] = r.memory.verdict;
  j["loss"] = r.loss;
  j["grad_norm"] = r.grad_norm;
  j["warnings"] = r.warnings;
  return j;
}

std::string format_report(const TrainReport& r) {
  std::string out;
  out += fmt::format("cocemu train: {} on {} ({} devices, {} node{}), {}\n", r.model, r.profile,
                     r.world, r.nodes, r.nodes == 1 ? "" : "s", r.layout);
  if (r.dry_run) out += "[ dry run: shapes only, no numerics; times and memory are modeled ]\n";
  out += fmt::format("  source            {}\n", r.source == "emulated"
                                                     ? "emulated ranks (modeled timeline)"
                                                     : "step model (one layer emulated, "
                                                       "pipeline and data parallel composed)");
  out += fmt::format("  collectives       {}\n",
                     r.deterministic ? "deterministic: rank-ordered sums and the algorithms that "
                                       "keep them (--nondeterministic: NCCL/HCCL's)"
                                     : "non-deterministic: NCCL/HCCL's algorithms (multi-channel "
                                       "rings, hierarchical all_reduce)");
  out += fmt::format("  iteration         {:.3f} ms\n", double(r.iteration_ns) / 1e6);
  out += fmt::format("  tokens/s          {:.0f}\n", r.tokens_per_s);
  out += fmt::format("  model TFLOP/s     {:.3g} per device, MFU {:.3g}%\n", r.tflops_per_device,
                     100 * r.mfu);
  out += fmt::format("  bubble            {:.1f}% (ideal (p-1)/(v·m+p-1): {:.1f}%)\n",
                     100 * r.bubble_fraction, 100 * r.ideal_bubble_fraction);
  out += "  exposed comm      ";
  for (const auto& [k, v] : r.exposed_comm_ns)
    out += fmt::format("{} {:.3f} ms  ", k, v / 1e6);
  out += "\n";
  out += fmt::format("  memory            {}\n", r.memory.verdict);
  for (const auto& t : r.memory.terms)
    out += fmt::format("    {:<48} {:>10}\n", t.name, decimal_bytes(t.bytes));
  if (!r.loss.empty()) {
    out += "  loss              ";
    for (const double v : r.loss)
      out += fmt::format("{:.6f} ", v);
    out += "\n";
  }
  for (const auto& w : r.warnings)
    out += fmt::format("  warning: {}\n", w);
  return out;
}

std::string pipeline_svg(const TrainReport& r) {
  const int stages = [&] {
    int n = 0;
    for (const auto& b : r.pipeline)
      n = std::max(n, b.stage + 1);
    return std::max(n, 1);
  }();
  std::int64_t lo = INT64_MAX, hi = 0;
  for (const auto& b : r.pipeline) {
    lo = std::min(lo, b.start_ns);
    hi = std::max(hi, b.end_ns);
  }
  if (hi <= lo) lo = 0, hi = 1;
  const double width = 1200, left = 90, row = 34, top = 50;
  const double scale = (width - left - 20) / double(hi - lo);
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n",
      width, top + stages * row + 40);
  svg += fmt::format(
      "<text x=\"10\" y=\"20\" font-size=\"14\">{} — {} — iteration {:.3f} ms, "
      "bubble {:.1f}%{}</text>\n",
      r.model, r.layout, double(r.iteration_ns) / 1e6, 100 * r.bubble_fraction,
      r.dry_run ? " [dry run: no numerics]" : "");
  svg +=
      "<text x=\"10\" y=\"38\" fill=\"#555\">forward blocks blue, backward green; numbers "
      "are micro-batches (.chunk with interleaving)</text>\n";
  for (int s = 0; s < stages; ++s)
    svg += fmt::format("<text x=\"10\" y=\"{}\">stage {}</text>\n", top + s * row + 20, s);
  for (const auto& b : r.pipeline) {
    const double x = left + double(b.start_ns - lo) * scale;
    const double w = std::max(1.0, double(b.end_ns - b.start_ns) * scale);
    const double y = top + b.stage * row;
    svg += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\" "
        "stroke=\"#333\" stroke-width=\"0.5\"><title>{} {:.3f}–{:.3f} ms</title></rect>\n",
        x, y, w, row - 6, b.forward ? "#7fb3e6" : "#8fd18f", b.label, double(b.start_ns) / 1e6,
        double(b.end_ns) / 1e6);
    if (w > 14)
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                         x + w / 2, y + row / 2 + 1, b.label.substr(1));
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#555\">time → ({:.3f} ms shown)</text>\n",
                     left, top + stages * row + 20, double(hi - lo) / 1e6);
  svg += "</svg>\n";
  return svg;
}

}  // namespace cocemu::bench
