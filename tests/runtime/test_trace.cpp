// The trace (R-RT-8): Chrome trace-event JSON that parses, one pid per rank, one tid per lane,
// no overlapping ops on a lane; and an SVG that renders as an image.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>

#include "cocemu/collectives/ops.h"
#include "cocemu/runtime/trace.h"
#include "testing.h"

namespace cocemu {
namespace {

RunResult small_program() {
  return testing::run_ranks(4, [](Rank& rank) {
    Group world = Group::world(rank);
    Tensor t = Tensor::zeros({1 << 14}, DType::f32);
    for (int i = 0; i < 3; ++i) {
      rank.compute_stream().launch({.name = fmt::format("matmul[{}/3] 128x128x128", i + 1),
                                    .work_ns = 5000,
                                    .flops = 2 * 128 * 128 * 128},
                                   [] {});
      all_reduce(world, t, {.async_op = true, .label = fmt::format("[{}/3]", i + 1)});
    }
    rank.synchronize();
  });
}

TEST(Trace, ChromeJsonHasOneProcessPerRankAndNonOverlappingLanes) {
  const RunResult r = small_program();
  const nlohmann::json j = nlohmann::json::parse(chrome_trace_json(r));
  std::set<int> pids;
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> lanes;
  std::map<std::pair<int, int>, std::string> lane_names;
  int collectives = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M") {
      if (e["name"] == "thread_name") lane_names[{e["pid"], e["tid"]}] = e["args"]["name"];
      continue;
    }
    pids.insert(e["pid"].get<int>());
    if (e["cat"] == "phase") continue;
    lanes[{e["pid"], e["tid"]}].push_back(
        {e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()});
    if (e["name"].get<std::string>().rfind("all_reduce[", 0) == 0) {
      ++collectives;
      EXPECT_EQ(e["args"]["bytes"], 65536);
      EXPECT_NE(e["args"]["detail"].get<std::string>().find("algo"), std::string::npos);
    }
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(collectives, 12);
  EXPECT_EQ(lane_names[std::make_pair(0, 0)], "host");
  EXPECT_EQ(lane_names[std::make_pair(0, 1)], "compute");
  EXPECT_EQ(lane_names[std::make_pair(0, 2)], "comm");
  for (auto& [lane, spans] : lanes) {
    std::sort(spans.begin(), spans.end());
    for (std::size_t i = 1; i < spans.size(); ++i)
      EXPECT_LE(spans[i - 1].second, spans[i].first + 1e-9)
          << "overlap on pid " << lane.first << " tid " << lane.second;
  }
  // Names say what the ops are.
  EXPECT_NE(chrome_trace_json(r).find("\"all_reduce[2/3] 64KiB\""), std::string::npos);
  EXPECT_NE(chrome_trace_json(r).find("\"matmul[1/3] 128x128x128\""), std::string::npos);
  // Wall times only when asked for.
  EXPECT_EQ(chrome_trace_json(r).find("wall_start_us"), std::string::npos);
  EXPECT_NE(chrome_trace_json(r, {.include_wall = true}).find("wall_start_us"), std::string::npos);
}

TEST(Trace, SvgRendersAsAnImage) {
  const RunResult r = small_program();
  const std::string dir = ::testing::TempDir();
  const std::string svg = dir + "/cocemu_trace_test.svg", png = dir + "/cocemu_trace_test.png";
  write_svg_timeline(r, svg, "test timeline");
  std::ifstream in(svg);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.rfind("<svg", 0), 0u);
  EXPECT_NE(text.find("rank 3 comm"), std::string::npos);
  EXPECT_NE(text.find("</svg>"), std::string::npos);
  if (std::system("command -v rsvg-convert >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "rsvg-convert not installed (bootstrap.sh installs librsvg2-bin)";
  ASSERT_EQ(std::system(("rsvg-convert -o " + png + " " + svg).c_str()), 0);
  std::ifstream p(png, std::ios::binary);
  char magic[8] = {};
  p.read(magic, 8);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
}

}  // namespace
}  // namespace cocemu
