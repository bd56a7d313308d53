#pragma once
/// Writes a run's modeled timeline as Chrome trace-event JSON (Perfetto, chrome://tracing): one
/// process per rank, one thread per lane (host, compute, comm, …), complete events with modeled
/// start and duration, and bytes, FLOPs and details in args. Also as an SVG a person can open.
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
std::string svg_timeline(const RunResult& run, const std::string& title);
void write_svg_timeline(const RunResult& run, const std::string& path, const std::string& title);

}  // namespace cocemu
