#pragma once
/// Writes a run's modeled timeline as Chrome trace-event JSON (Perfetto, chrome://tracing): one
/// process per rank, one thread per lane (host, compute, comm, …), complete events with modeled
/// start and duration, and bytes, FLOPs and details in args. Also as an SVG a person can open.
#include <cstdint>
#include <string>

#include "cocemu/runtime/world.h"

namespace cocemu {

struct TraceOptions {
  bool include_wall = false;  ///< add host wall times to args (makes the file run-dependent)
  bool include_host = true;   ///< include host launch lanes
};

std::string chrome_trace_json(const RunResult& run, const TraceOptions& options = {});
void write_chrome_trace(const RunResult& run, const std::string& path,
                        const TraceOptions& options = {});
/// How an SVG timeline is drawn.
struct SvgOptions {
  /// The time the x axis spans, from 0; 0 (or less than the run's makespan): the run's makespan.
  /// Give several runs the same (e.g. the longest of them) and their SVGs compare by eye.
  std::int64_t span_ns = 0;
  /// Ranks whose ops are identical in lane, name, class and modeled start and end are drawn once,
  /// as one group ("ranks 0–7 ×8").
  bool collapse_identical_ranks = true;
  double width = 1600;  ///< pixels
};

/// The modeled timeline as SVG: a row per lane, grouped by rank; a labelled band per program
/// segment (Rank::set_segment: the six CoC segments in `bench`); axis ticks in ns, µs, ms or s;
/// op labels cut at whole words (the full name, segment and times in each box's tooltip).
std::string svg_timeline(const RunResult& run, const std::string& title,
                         const SvgOptions& options = {});
void write_svg_timeline(const RunResult& run, const std::string& path, const std::string& title,
                        const SvgOptions& options = {});

/// `name` shortened to at most `max_chars` characters at a word boundary with "…" appended (whole
/// words only, never half a word); empty if not even its first word fits. Used for SVG labels.
std::string fit_label(const std::string& name, int max_chars);

}  // namespace cocemu
