#include "cocemu/runtime/trace.h"

#include "cocemu/runtime/error.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <utility>
#include <vector>

#include <fmt/ranges.h>
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

namespace {

/// Characters counted as glyphs (UTF-8 continuation bytes do not start one).
int glyphs(const std::string& s) {
  int n = 0;
  for (unsigned char c : s)
    n += (c & 0xC0) != 0x80;
  return n;
}

/// A time in the unit of the axis: "0", "250 µs", "1.5 ms".
std::string time_label(double ns, double unit_ns, const char* unit) {
  if (ns == 0) return "0";
  return fmt::format("{:g} {}", std::round(ns / unit_ns * 1000) / 1000, unit);
}

/// The ranks of a group: "rank 3", "ranks 0–7 ×8", "ranks 0–3, 6 ×5".
std::string ranks_label(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return fmt::format("rank {}", ranks[0]);
  std::string out = "ranks ";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1)
      ++j;
    out += i ? ", " : "";
    out += j > i ? fmt::format("{}\u2013{}", ranks[i], ranks[j]) : fmt::format("{}", ranks[i]);
    i = j + 1;
  }
  return out + fmt::format(" \u00d7{}", ranks.size());
}

/// Two ranks draw the same picture: the same lanes and, op for op, the same lane, class, name
/// and modeled start and end.
bool same_timeline(const RunResult& run, std::size_t a, std::size_t b) {
  const RankGraph &ga = run.graph.ranks[a], &gb = run.graph.ranks[b];
  if (ga.lane_names != gb.lane_names || ga.ops.size() != gb.ops.size()) return false;
  for (std::size_t i = 0; i < ga.ops.size(); ++i) {
    const OpRecord &x = ga.ops[i], &y = gb.ops[i];
    if (x.lane != y.lane || x.cls != y.cls || x.name != y.name) return false;
    const ScheduledOp &sx = run.timeline.at({int(a), x.index}),
                      &sy = run.timeline.at({int(b), y.index});
    if (sx.start_ns != sy.start_ns || sx.end_ns != sy.end_ns) return false;
  }
  return true;
}

std::size_t timeline_hash(const RunResult& run, std::size_t rank) {
  const RankGraph& g = run.graph.ranks[rank];
  std::size_t h = g.ops.size();
  const auto mix = [&h](std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  for (const std::string& lane : g.lane_names)
    mix(std::hash<std::string>{}(lane));
  for (const OpRecord& op : g.ops) {
    const ScheduledOp& s = run.timeline.at({int(rank), op.index});
    mix(std::hash<std::string>{}(op.name));
    mix(std::size_t(op.lane) * 16 + std::size_t(op.cls));
    mix(std::size_t(s.start_ns));
    mix(std::size_t(s.end_ns));
  }
  return h;
}

/// A stretch of one rank's program in one segment: from its first device op's start to its last
/// one's end (waits excluded; host ops only when the stretch has no device work).
struct Band {
  std::string segment;
  std::int64_t start = 0, end = 0;
};

std::vector<Band> segment_bands(const RunResult& run, std::size_t rank) {
  std::vector<Band> bands;
  std::vector<bool> has_device;  // per band: extended by device work (not host ops, not waits)
  for (const OpRecord& op : run.graph.ranks[rank].ops) {
    if (op.segment.empty()) continue;
    const ScheduledOp& s = run.timeline.at({int(rank), op.index});
    const bool device = op.lane > 0 && op.cls != OpClass::wait;
    if (bands.empty() || bands.back().segment != op.segment) {
      bands.push_back({op.segment, s.start_ns, s.end_ns});
      has_device.push_back(device);
      continue;
    }
    Band& b = bands.back();
    if (device && !has_device.back()) {  // device work defines the stretch once there is some
      b.start = s.start_ns;
      b.end = s.end_ns;
      has_device.back() = true;
    } else if (device || !has_device.back()) {
      b.start = std::min(b.start, s.start_ns);
      b.end = std::max(b.end, s.end_ns);
    }
  }
  return bands;
}

}  // namespace

std::string fit_label(const std::string& name, int max_chars) {
  if (glyphs(name) <= max_chars) return name;
  // Whole words that fit with the ellipsis after them.
  std::string out;
  std::size_t pos = 0;
  while (pos < name.size()) {
    const std::size_t sp = name.find(' ', pos);
    const std::string word =
        name.substr(pos, sp == std::string::npos ? std::string::npos : sp - pos);
    const std::string next = out.empty() ? word : out + " " + word;
    if (glyphs(next) + 1 > max_chars) break;
    out = next;
    if (sp == std::string::npos) break;
    pos = sp + 1;
  }
  return out.empty() ? std::string() : out + "\u2026";
}

std::string svg_timeline(const RunResult& run, const std::string& title, const SvgOptions& opt) {
  constexpr double kLaneH = 18, kGroupHeaderH = 16, kGroupGap = 8, kBandH = 15, kRight = 40;
  constexpr std::size_t kMaxBandEdges = 24;
  constexpr double kLabelCharPx = 6.4;  // 11 px sans-serif, a generous average glyph width
  constexpr double kOpCharPx = 5.4;     // 9 px
  const std::size_t n_ranks = run.graph.ranks.size();
  const std::int64_t span =
      std::max<std::int64_t>({run.timeline.makespan_ns(), opt.span_ns, std::int64_t(1)});

  // Groups of ranks with identical timelines (each drawn once); a hash of each rank's timeline
  // picks the candidates, so a large run compares each rank in full with few others.
  std::vector<std::vector<int>> groups;
  std::vector<std::size_t> group_hash;
  for (std::size_t r = 0; r < n_ranks; ++r) {
    const std::size_t h = opt.collapse_identical_ranks ? timeline_hash(run, r) : 0;
    bool placed = false;
    for (std::size_t g = 0; opt.collapse_identical_ranks && g < groups.size() && !placed; ++g)
      if (group_hash[g] == h && same_timeline(run, std::size_t(groups[g][0]), r)) {
        groups[g].push_back(int(r));
        placed = true;
      }
    if (!placed) {
      groups.push_back({int(r)});
      group_hash.push_back(h);
    }
  }

  // The left column fits the longest lane name.
  std::size_t longest = 8;
  for (const auto& g : groups)
    for (const std::string& lane : run.graph.ranks[std::size_t(g[0])].lane_names)
      longest = std::max(longest, std::size_t(glyphs(lane)));
  const double left = std::clamp(16 + double(longest) * kLabelCharPx, 90.0, 480.0);
  const double width = std::max(opt.width, left + kRight + 200);
  const double scale = (width - left - kRight) / double(span);
  const auto x_of = [&](double ns) { return left + ns * scale; };

  // Segment bands of the first group's rank, in two alternating rows so neighbours never overlap.
  const std::vector<Band> bands =
      n_ranks ? segment_bands(run, std::size_t(groups[0][0])) : std::vector<Band>{};
  const double axis_y = 46, bands_top = axis_y + 10;
  const double lanes_top = bands_top + (bands.empty() ? 4 : 2 * kBandH + 8);
  double height = lanes_top;
  for (const auto& g : groups)
    height += kGroupHeaderH +
              double(run.graph.ranks[std::size_t(g[0])].lane_names.size()) * kLaneH + kGroupGap;
  const double plot_bottom = height;
  height += 44;

  std::string out = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{:.0f}" height="{:.0f}" font-family="sans-serif" font-size="11">)"
      "\n",
      width, height);
  out += fmt::format(R"(<rect width="100%" height="100%" fill="white"/>)"
                     "\n<text class=\"title\" x=\"10\" y=\"20\" font-size=\"14\">{}{}</text>\n",
                     escape(title, true),
                     run.numerics ? "" : " (DRY RUN: shapes only, numerics skipped)");

  // Time axis: 1-2-5 steps, about 8 ticks, in the unit of the step.
  double tick = std::pow(10.0, std::floor(std::log10(double(span) / 8.0)));
  for (double f : {1.0, 2.0, 5.0, 10.0})
    if (double(span) / (tick * f) <= 8.5) {
      tick *= f;
      break;
    }
  tick = std::max(tick, 1.0);
  const auto [unit_ns, unit] = tick >= 1e9   ? std::pair{1e9, "s"}
                               : tick >= 1e6 ? std::pair{1e6, "ms"}
                               : tick >= 1e3 ? std::pair{1e3, "\u00b5s"}
                                             : std::pair{1.0, "ns"};
  for (double t = 0; t <= double(span) + 0.5; t += tick)
    out += fmt::format(
        R"(<line x1="{0:.1f}" y1="{1:.0f}" x2="{0:.1f}" y2="{2:.0f}" stroke="#ddd"/><text class="tick" x="{0:.1f}" y="{3:.0f}" fill="#555" text-anchor="middle">{4}</text>)"
        "\n",
        x_of(t), axis_y - 8, plot_bottom, axis_y - 12, time_label(t, unit_ns, unit));

  // Segment bands: a labelled band per stretch, dashed edges through the lanes.
  static const char* const kBandColors[] = {"#dbe7f5", "#fde2c8", "#d9efd5",
                                            "#eadcf2", "#f6f0c8", "#f3d6dc"};
  std::vector<std::string> seen;
  for (std::size_t i = 0; i < bands.size(); ++i) {
    const Band& b = bands[i];
    std::size_t color = std::find(seen.begin(), seen.end(), b.segment) - seen.begin();
    if (color == seen.size()) seen.push_back(b.segment);
    const double x = x_of(double(b.start)), w = std::max(1.0, double(b.end - b.start) * scale);
    const double y = bands_top + double(i % 2) * kBandH;
    out += fmt::format(
        R"(<g class="segment"><rect x="{:.2f}" y="{:.0f}" width="{:.2f}" height="{:.0f}" fill="{}" stroke="#999" stroke-width="0.5"><title>segment {} [{} – {}]</title></rect>)",
        x, y, w, kBandH - 1, kBandColors[color % std::size(kBandColors)], escape(b.segment, true),
        time_label(double(b.start), unit_ns, unit), time_label(double(b.end), unit_ns, unit));
    // The label may run on past its band up to the next band of its row.
    const double room =
        (i + 2 < bands.size() ? x_of(double(bands[i + 2].start)) : width - kRight) - x;
    const std::string label = fit_label(b.segment, int((std::max(w, room) - 4) / kOpCharPx));
    if (!label.empty())
      out += fmt::format(
          R"(<text class="segment-label" x="{:.1f}" y="{:.0f}" font-size="9" fill="#222">{}</text>)",
          x + 2, y + kBandH - 4, escape(label, true));
    // Edges through the lanes while they stay few enough to read (a bench layer's six
    // segments; not a training step's hundreds).
    if (bands.size() <= kMaxBandEdges)
      out += fmt::format(
          R"(<line x1="{0:.2f}" y1="{1:.0f}" x2="{0:.2f}" y2="{2:.0f}" stroke="#aaa" stroke-width="0.6" stroke-dasharray="3,3"/>)",
          x, y + kBandH - 1, plot_bottom);
    out += "</g>\n";
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
  const auto text_color = [](OpClass c) {
    return c == OpClass::host || c == OpClass::wait ? "#222" : "white";
  };
  double y = lanes_top;
  for (const auto& g : groups) {
    const std::size_t r = std::size_t(g[0]);
    const RankGraph& rg = run.graph.ranks[r];
    out += fmt::format(R"(<g class="rank-group" data-ranks="{}">)"
                       "\n"
                       R"(<text class="rank-label" x="4" y="{:.0f}" font-weight="bold">{}</text>)"
                       "\n",
                       fmt::join(g, ","), y + kGroupHeaderH - 4, escape(ranks_label(g), true));
    y += kGroupHeaderH;
    for (std::size_t l = 0; l < rg.lane_names.size(); ++l) {
      out += fmt::format(R"(<text class="lane-label" x="12" y="{:.0f}">{}</text>)"
                         "\n",
                         y + kLaneH - 5, escape(rg.lane_names[l], true));
      for (const OpRecord& op : rg.ops) {
        if (std::size_t(op.lane) != l) continue;
        const ScheduledOp& s = run.timeline.at({int(r), op.index});
        if (s.end_ns <= s.start_ns) continue;
        const double x = x_of(double(s.start_ns));
        const double w = std::max(0.5, double(s.end_ns - s.start_ns) * scale);
        out += fmt::format(
            R"(<rect class="op" x="{:.2f}" y="{:.0f}" width="{:.2f}" height="{:.0f}" fill="{}" stroke="white" stroke-width="0.3"><title>{}{} [{} – {}, {}]</title></rect>)"
            "\n",
            x, y + 1, w, kLaneH - 2, color(op.cls), escape(op.name, true),
            op.segment.empty() ? std::string() : " (" + escape(op.segment, true) + ")",
            us(s.start_ns), us(s.end_ns), time_label(double(s.end_ns - s.start_ns), unit_ns, unit));
        const std::string label = w > 24 ? fit_label(op.name, int((w - 4) / kOpCharPx)) : "";
        if (!label.empty())
          out += fmt::format(
              R"(<text class="op-label" x="{:.1f}" y="{:.0f}" fill="{}" font-size="9">{}</text>)"
              "\n",
              x + 2, y + kLaneH - 6, text_color(op.cls), escape(label, true));
      }
      y += kLaneH;
    }
    out += "</g>\n";
    y += kGroupGap;
  }
  const bool collapsed = groups.size() < n_ranks;
  out += fmt::format(
      R"(<text class="legend" x="10" y="{:.0f}" fill="#555">modeled time; blue compute, orange comm, green fused, grey host{}{}; hover a box for its name and times</text>)"
      "\n</svg>\n",
      height - 14, bands.empty() ? "" : "; bands on top: program segments",
      collapsed ? "; ranks with identical timelines drawn once" : "");
  return out;
}

void write_svg_timeline(const RunResult& run, const std::string& path, const std::string& title,
                        const SvgOptions& options) {
  write_file(path, svg_timeline(run, title, options));
}

}  // namespace cocemu
