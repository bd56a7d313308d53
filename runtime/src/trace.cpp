#include "cocemu/runtime/trace.h"

#include "cocemu/runtime/error.h"

#include <cmath>
#include <fstream>

namespace cocemu {

namespace {
std::string escape(const std::string& s, bool xml = false) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '"':
        out += xml ? "&quot;" : "\\\"";
        break;
      case '\\':
        out += xml ? "\\" : "\\\\";
        break;
      case '\n':
        out += xml ? " " : "\\n";
        break;
      case '<':
        out += xml ? "&lt;" : "<";
        break;
      case '>':
        out += xml ? "&gt;" : ">";
        break;
      case '&':
        out += xml ? "&amp;" : "&";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\u{:04x}", int(c));
        else
          out += c;
    }
  }
  return out;
}
std::string us(std::int64_t ns) {
  return fmt::format("{}{}.{:03}", ns < 0 ? "-" : "", std::abs(ns) / 1000, std::abs(ns) % 1000);
}
void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  COCEMU_CHECK_ARG(out.good(), "cannot write '{}'", path);
  out << text;
  out.close();
  COCEMU_CHECK_ARG(!out.fail(), "error while writing '{}' (disk full?)", path);
}
}  // namespace

std::string chrome_trace_json(const RunResult& run, const TraceOptions& opt) {
  std::string out = "{\"displayTimeUnit\":\"ns\",\"otherData\":{";
  out += fmt::format("\"profile\":\"{}\",\"numerics\":{}", escape(run.profile->name),
                     run.numerics ? "true" : "false");
  if (!run.numerics) out += ",\"note\":\"dry run: shapes only, numerics skipped\"";
  out += "},\"traceEvents\":[\n";
  bool first = true;
  auto emit = [&](const std::string& e) {
    if (!first) out += ",\n";
    out += e;
    first = false;
  };
  for (std::size_t r = 0; r < run.graph.ranks.size(); ++r) {
    const RankGraph& g = run.graph.ranks[r];
    emit(fmt::format(R"({{"ph":"M","name":"process_name","pid":{},"args":{{"name":"rank {}"}}}})",
                     r, r));
    emit(fmt::format(
        R"({{"ph":"M","name":"process_sort_index","pid":{},"args":{{"sort_index":{}}}}})", r, r));
    for (std::size_t l = 0; l < g.lane_names.size(); ++l) {
      if (l == 0 && !opt.include_host) continue;
      emit(fmt::format(
          R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":"{}"}}}})", r, l,
          escape(g.lane_names[l])));
    }
    for (const OpRecord& op : g.ops) {
      if (op.lane == 0 && !opt.include_host) continue;
      const ScheduledOp& s = run.timeline.at({int(r), op.index});
      std::string args = fmt::format(R"("class":"{}")", to_string(op.cls));
      if (op.bytes) args += fmt::format(R"(,"bytes":{})", op.bytes);
      if (op.flops) args += fmt::format(R"(,"flops":{})", op.flops);
      if (op.detail) args += fmt::format(R"(,"detail":"{}")", escape(op_detail(op)));
      if (!op.segment.empty()) args += fmt::format(R"(,"segment":"{}")", escape(op.segment));
      args += fmt::format(R"(,"work_ns":{:.0f})", op.work_ns);
      if (opt.include_wall && op.wall_start_ns >= 0)
        args += fmt::format(R"(,"wall_start_us":{},"wall_dur_us":{})", us(op.wall_start_ns),
                            us(op.wall_end_ns - op.wall_start_ns));
      emit(fmt::format(
          R"({{"ph":"X","name":"{}","cat":"{}","pid":{},"tid":{},"ts":{},"dur":{},"args":{{{}}}}})",
          escape(op.name), to_string(op.cls), r, op.lane, us(s.start_ns), us(s.end_ns - s.start_ns),
          args));
      // Phases (collective rounds, pipeline steps) as nested slices.
      double t = double(s.start_ns);
      const double scale = op.work_ns > 0 ? double(s.end_ns - s.start_ns) / op.work_ns : 0;
      for (const auto& [name, ns] : op.phases ? *op.phases : Phases{}) {
        const std::int64_t a = std::llround(t), b = std::llround(t + ns * scale);
        emit(fmt::format(
            R"({{"ph":"X","name":"{}","cat":"phase","pid":{},"tid":{},"ts":{},"dur":{}}})",
            escape(name), r, op.lane, us(a), us(b - a)));
        t += ns * scale;
      }
    }
  }
  out += "\n]}\n";
  return out;
}

void write_chrome_trace(const RunResult& run, const std::string& path, const TraceOptions& opt) {
  write_file(path, chrome_trace_json(run, opt));
}

std::string svg_timeline(const RunResult& run, const std::string& title) {
  const double width = 1600, left = 150, right = 20, lane_h = 18, top = 50;
  const std::int64_t span = std::max<std::int64_t>(run.timeline.makespan_ns(), 1);
  const double scale = (width - left - right) / double(span);
  int n_lanes = 0;
  for (const auto& g : run.graph.ranks)
    n_lanes += int(g.lane_names.size());
  const double height = top + n_lanes * lane_h + double(run.graph.ranks.size()) * 6 + 40;
  std::string out = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{:.0f}" height="{:.0f}" font-family="sans-serif" font-size="11">)"
      "\n",
      width, height);
  out += fmt::format(R"(<rect width="100%" height="100%" fill="white"/>)"
                     "\n<text x=\"10\" y=\"18\" font-size=\"14\">{}{}</text>\n",
                     escape(title, true),
                     run.numerics ? "" : " (DRY RUN: shapes only, numerics skipped)");
  // Time axis with ~10 ticks.
  double tick = std::pow(10.0, std::floor(std::log10(double(span) / 10.0)));
  for (double f : {1.0, 2.0, 5.0, 10.0})
    if (double(span) / (tick * f) <= 10) {
      tick *= f;
      break;
    }
  tick = std::max(tick, 1.0);
  for (double t = 0; t <= double(span); t += tick) {
    const double x = left + t * scale;
    out += fmt::format(R"(<line x1="{:.1f}" y1="{}" x2="{:.1f}" y2="{:.0f}" stroke="#ddd"/>)"
                       R"(<text x="{:.1f}" y="{}" fill="#555">{}us</text>)"
                       "\n",
                       x, top - 12, x, height - 30, x + 2, top - 14, us(std::int64_t(t)));
  }
  auto color = [](OpClass c) {
    switch (c) {
      case OpClass::host:
        return "#b0b0b0";
      case OpClass::compute:
        return "#4c78a8";
      case OpClass::comm:
        return "#f58518";
      case OpClass::fused:
        return "#54a24b";
      case OpClass::wait:
        return "#eeeeee";
    }
    return "#000";
  };
  double y = top;
  for (std::size_t r = 0; r < run.graph.ranks.size(); ++r) {
    const RankGraph& g = run.graph.ranks[r];
    for (std::size_t l = 0; l < g.lane_names.size(); ++l) {
      out += fmt::format(R"(<text x="4" y="{:.0f}">rank {} {}</text>)"
                         "\n",
                         y + lane_h - 5, r, escape(g.lane_names[l], true));
      for (const OpRecord& op : g.ops) {
        if (std::size_t(op.lane) != l) continue;
        const ScheduledOp& s = run.timeline.at({int(r), op.index});
        if (s.end_ns <= s.start_ns) continue;
        const double x = left + double(s.start_ns) * scale;
        const double w = std::max(0.5, double(s.end_ns - s.start_ns) * scale);
        out += fmt::format(
            R"(<rect x="{:.2f}" y="{:.0f}" width="{:.2f}" height="{:.0f}" fill="{}" stroke="white" stroke-width="0.3"><title>{} [{}us, {}us]</title></rect>)"
            "\n",
            x, y + 1, w, lane_h - 2, color(op.cls), escape(op.name, true), us(s.start_ns),
            us(s.end_ns));
        if (w > 60)
          out += fmt::format(R"(<text x="{:.1f}" y="{:.0f}" fill="white" font-size="9">{}</text>)"
                             "\n",
                             x + 2, y + lane_h - 6,
                             escape(op.name.substr(0, std::size_t(w / 5.5)), true));
      }
      y += lane_h;
    }
    y += 6;
  }
  out += fmt::format(
      R"(<text x="10" y="{:.0f}" fill="#555">modeled time; blue compute, orange comm, green fused, grey host</text>)"
      "\n</svg>\n",
      height - 10);
  return out;
}

void write_svg_timeline(const RunResult& run, const std::string& path, const std::string& title) {
  write_file(path, svg_timeline(run, title));
}

}  // namespace cocemu
