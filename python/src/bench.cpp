// Bindings of the bench library's run analysis: per-segment figures of a RunResult, MindSpeed's
// overlap verdicts, the run's summary and JSON.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cocemu/bench/layer_bench.h"
#include "common.h"

namespace cocemu::python {

namespace {

using namespace pybind11::literals;

std::string summary(const RunResult& r, int rank) {
  std::string out =
      fmt::format("# cocemu run: {} ranks on {}, {}\n", r.graph.ranks.size(), r.profile->name,
                  r.numerics ? "real numerics" : "dry run (shapes only)");
  out += fmt::format("modeled {:.3f} us", double(r.timeline.makespan_ns()) / 1e3);
  out += r.numerics ? fmt::format(", host wall {:.3f} ms\n", double(r.wall_ns) / 1e6) : "\n";
  const auto segments = bench::segment_stats(r, rank);
  if (segments.empty())
    return out +
           "no segments (name program regions with rank.segment(name) for per-region "
           "figures)\n";
  out += fmt::format(
      "\n# segments on rank {}: modeled us from first device op to last; compute and comm at "
      "full speed; comm link busy time, overlapped and exposed\n",
      rank);
  out += fmt::format("{:<16} {:>10} {:>11} {:>9} {:>9} {:>10} {:>10} {:>6}\n", "segment", "span us",
                     "compute us", "comm us", "link us", "overlap us", "exposed us", "gemms");
  for (const bench::SegmentStats& s : segments)
    out += fmt::format("{:<16} {:>10.3f} {:>11.3f} {:>9.3f} {:>9.3f} {:>10.3f} {:>10.3f} {:>6}\n",
                       s.name, s.span_ns / 1e3, s.compute_work_ns / 1e3, s.comm_work_ns / 1e3,
                       s.comm_time_ns / 1e3, s.overlap_ns / 1e3, s.exposed_comm_ns / 1e3, s.gemms);
  return out;
}

nlohmann::json segment_json(const bench::SegmentStats& s) {
  return {{"name", s.name},
          {"span_ns", s.span_ns},
          {"compute_work_ns", s.compute_work_ns},
          {"comm_work_ns", s.comm_work_ns},
          {"comm_time_ns", s.comm_time_ns},
          {"overlap_ns", s.overlap_ns},
          {"exposed_comm_ns", s.exposed_comm_ns},
          {"host_ns", s.host_ns},
          {"wall_ns", s.wall_ns},
          {"gemms", s.gemms},
          {"fused_steps", s.fused_steps},
          {"device_ops", s.device_ops},
          {"host_gated", s.host_gated}};
}

std::string to_json(const RunResult& r, std::optional<int> indent) {
  nlohmann::json ops = nlohmann::json::array();
  nlohmann::json lanes = nlohmann::json::array();
  for (std::size_t q = 0; q < r.graph.ranks.size(); ++q) {
    const RankGraph& g = r.graph.ranks[q];
    lanes.push_back(g.lane_names);
    for (const OpRecord& op : g.ops) {
      const ScheduledOp& t = r.timeline.at({int(q), op.index});
      ops.push_back({{"rank", op.rank},
                     {"lane", op.lane},
                     {"index", op.index},
                     {"name", op.name},
                     {"kind", to_string(op.cls)},
                     {"segment", op.segment},
                     {"detail", op_detail(op)},
                     {"start_ns", t.start_ns},
                     {"end_ns", t.end_ns},
                     {"work_ns", op.work_ns},
                     {"bytes", op.bytes},
                     {"flops", op.flops}});
    }
  }
  nlohmann::json segments = nlohmann::json::array();
  if (!r.graph.ranks.empty())
    for (const auto& s : bench::segment_stats(r, 0))
      segments.push_back(segment_json(s));
  nlohmann::json j = {{"n_ranks", r.graph.ranks.size()},
                      {"profile", r.profile->name},
                      {"numerics", r.numerics},
                      {"makespan_ns", r.timeline.makespan_ns()},
                      {"wall_ns", r.wall_ns},
                      {"lanes", lanes},
                      {"segments", segments},
                      {"ops", ops}};
  return j.dump(indent ? *indent : -1);
}

}  // namespace

void bind_bench(py::module_& m, Classes& classes) {
  py::class_<bench::SegmentStats>(
      m, "SegmentStats", "One program region (Rank.segment) of one rank's modeled timeline.")
      .def_readonly("name", &bench::SegmentStats::name)
      .def_readonly("span_ns", &bench::SegmentStats::span_ns)
      .def_readonly("compute_work_ns", &bench::SegmentStats::compute_work_ns)
      .def_readonly("comm_work_ns", &bench::SegmentStats::comm_work_ns)
      .def_readonly("comm_time_ns", &bench::SegmentStats::comm_time_ns)
      .def_readonly("overlap_ns", &bench::SegmentStats::overlap_ns)
      .def_readonly("exposed_comm_ns", &bench::SegmentStats::exposed_comm_ns)
      .def_readonly("host_ns", &bench::SegmentStats::host_ns)
      .def_readonly("wall_ns", &bench::SegmentStats::wall_ns)
      .def_readonly("gemms", &bench::SegmentStats::gemms)
      .def_readonly("fused_steps", &bench::SegmentStats::fused_steps)
      .def_readonly("device_ops", &bench::SegmentStats::device_ops)
      .def_readonly("host_gated", &bench::SegmentStats::host_gated)
      .def("__repr__", [](const bench::SegmentStats& s) {
        return fmt::format("cocemu.SegmentStats('{}', span_ns={:.0f}, exposed_comm_ns={:.0f})",
                           s.name, s.span_ns, s.exposed_comm_ns);
      });
  py::class_<bench::Verdict>(m, "Verdict", "MindSpeed's overlap criteria applied to a segment.")
      .def_readonly("success", &bench::Verdict::success)
      .def_readonly("failed", &bench::Verdict::failed)
      .def_readonly("text", &bench::Verdict::text)
      .def("__repr__", [](const bench::Verdict& v) { return "cocemu.Verdict(" + v.text + ")"; });
  m.def("judge", &bench::judge, "serial"_a, "split"_a,
        "MindSpeed's overlap verdict for a split segment against its serial version (as "
        "`cocemu bench` prints it).");

  (*classes.run_result)
      .def(
          "segments",
          [](const PyRunResult& r, int rank) { return bench::segment_stats(*r.result, rank); },
          "rank"_a = 0, "Per program region (Rank.segment) figures of one rank, in order.")
      .def(
          "summary", [](const PyRunResult& r, int rank) { return summary(*r.result, rank); },
          "rank"_a = 0, "Modeled and wall time, and the per-segment table bench prints.")
      .def(
          "to_json",
          [](const PyRunResult& r, std::optional<int> indent) {
            return to_json(*r.result, indent);
          },
          "indent"_a = py::none(),
          "The run as JSON: makespan_ns, wall_ns, lanes, rank 0's segments and every op.");
}

}  // namespace cocemu::python
