// The trace (R-RT-8): Chrome trace-event JSON that parses, one pid per rank, one tid per lane,
// no overlapping ops on a lane; and an SVG that renders as an image.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
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
  EXPECT_NE(text.find(">comm</text>"), std::string::npos);
  EXPECT_NE(text.find("</svg>"), std::string::npos);
  if (std::system("command -v rsvg-convert >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "rsvg-convert not installed (bootstrap.sh installs librsvg2-bin)";
  ASSERT_EQ(std::system(("rsvg-convert -o " + png + " " + svg).c_str()), 0);
  std::ifstream p(png, std::ios::binary);
  char magic[8] = {};
  p.read(magic, 8);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
}

/// Two segments on every rank; `odd_rank` (if >= 0) runs one extra kernel, so its timeline differs.
RunResult segmented_program(int odd_rank, std::int64_t kernel_ns = 5000) {
  return testing::run_ranks(4, [=](Rank& rank) {
    Group world = Group::world(rank);
    Tensor t = Tensor::zeros({1 << 14}, DType::f32);
    for (const char* segment : {"fwd attn.qkv", "fwd mlp.up"}) {
      rank.set_segment(segment);
      rank.compute_stream().launch(
          {.name = "attn.out MATMUL_REDUCE_SCATTER 4096x1024x8192", .work_ns = double(kernel_ns)},
          [] {});
      all_reduce(world, t, {.async_op = true});
      rank.compute_stream().launch({.name = "ffn", .work_ns = double(kernel_ns)}, [] {});
    }
    rank.set_segment("");
    if (rank.id() == odd_rank)
      rank.compute_stream().launch({.name = "extra", .work_ns = 1000}, [] {});
    rank.synchronize();
  });
}

/// The text of every element `<tag class="cls" …>TEXT</tag>` in `svg`.
std::vector<std::string> texts_of(const std::string& svg, const std::string& cls) {
  std::vector<std::string> out;
  const std::regex re("class=\"" + cls + "\"[^>]*>([^<]*)<");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator();
       ++it)
    out.push_back((*it)[1]);
  return out;
}

// The newcomer review's SVG findings: identical TP ranks repeated, labels cut mid-word, no
// segment marks, axis "2000.000us", different x scales per strategy.
TEST(Trace, SvgCollapsesIdenticalRanksIntoOneGroupWithACount) {
  std::string svg = svg_timeline(segmented_program(-1), "same");
  EXPECT_EQ(texts_of(svg, "rank-label"), (std::vector<std::string>{"ranks 0\u2013"
                                                                   "3 \u00d7"
                                                                   "4"}))
      << svg.substr(0, 2000);
  EXPECT_NE(svg.find("data-ranks=\"0,1,2,3\""), std::string::npos);
  // A rank whose ops differ keeps its own rows.
  svg = svg_timeline(segmented_program(3), "one differs");
  EXPECT_EQ(texts_of(svg, "rank-label"), (std::vector<std::string>{"ranks 0\u2013"
                                                                   "2 \u00d7"
                                                                   "3",
                                                                   "rank 3"}));
  // And collapsing can be turned off.
  svg = svg_timeline(segmented_program(-1), "all", {.collapse_identical_ranks = false});
  EXPECT_EQ(texts_of(svg, "rank-label"),
            (std::vector<std::string>{"rank 0", "rank 1", "rank 2", "rank 3"}));
}

TEST(Trace, SvgMarksSegmentsAndCutsLabelsAtWholeWords) {
  const RunResult r = segmented_program(-1);
  const std::string svg = svg_timeline(r, "segments", {.width = 700});
  // One labelled band per segment stretch, its full name in the tooltip.
  EXPECT_EQ(texts_of(svg, "segment-label"),
            (std::vector<std::string>{"fwd attn.qkv", "fwd mlp.up"}));
  EXPECT_NE(svg.find("<title>segment fwd attn.qkv ["), std::string::npos);
  // Every op label is its op's name or whole words of it followed by an ellipsis.
  std::set<std::string> names;
  for (const OpRecord& op : r.graph.ranks[0].ops)
    names.insert(op.name);
  const std::vector<std::string> labels = texts_of(svg, "op-label");
  ASSERT_FALSE(labels.empty());
  int shortened = 0;
  for (const std::string& label : labels) {
    if (names.count(label)) continue;
    const std::string ellipsis = "\u2026";
    ASSERT_GE(label.size(), ellipsis.size()) << label;
    ASSERT_EQ(label.substr(label.size() - ellipsis.size()), ellipsis) << label;
    const std::string head = label.substr(0, label.size() - ellipsis.size());
    bool whole_words = false;
    for (const std::string& n : names)
      whole_words = whole_words || (n.rfind(head + " ", 0) == 0);
    EXPECT_TRUE(whole_words) << "'" << label << "' cuts a word";
    ++shortened;
  }
  EXPECT_GT(shortened, 0) << "the 700 px drawing should shorten the long kernel name";
  // Ticks in one unit with no trailing zeros: "0", "5 µs", "1.5 ms".
  const std::regex tick("^0$|^[0-9]+(\\.[0-9]+)? (ns|\u00b5s|ms|s)$");
  const std::vector<std::string> ticks = texts_of(svg, "tick");
  ASSERT_GE(ticks.size(), 3u);
  for (const std::string& t : ticks)
    EXPECT_TRUE(std::regex_match(t, tick)) << t;
}

TEST(Trace, SvgsWithTheSameSpanShareTheirXScale) {
  const RunResult fast = segmented_program(-1, 5000), slow = segmented_program(-1, 80000);
  ASSERT_LT(fast.timeline.makespan_ns(), slow.timeline.makespan_ns());
  // Each on its own scale: different ticks.
  EXPECT_NE(texts_of(svg_timeline(fast, "a"), "tick"), texts_of(svg_timeline(slow, "b"), "tick"));
  // On the slower one's span: the same ticks at the same places.
  const SvgOptions same{.span_ns = slow.timeline.makespan_ns()};
  const std::string a = svg_timeline(fast, "a", same), b = svg_timeline(slow, "b", same);
  EXPECT_EQ(texts_of(a, "tick"), texts_of(b, "tick"));
  const std::regex line("<line x1=\"([0-9.]+)\"[^>]*/><text class=\"tick\"");
  std::vector<std::string> xa, xb;
  for (auto it = std::sregex_iterator(a.begin(), a.end(), line); it != std::sregex_iterator(); ++it)
    xa.push_back((*it)[1]);
  for (auto it = std::sregex_iterator(b.begin(), b.end(), line); it != std::sregex_iterator(); ++it)
    xb.push_back((*it)[1]);
  EXPECT_EQ(xa, xb);
  EXPECT_FALSE(xa.empty());
}

TEST(Trace, FitLabelKeepsWholeWords) {
  EXPECT_EQ(fit_label("attn.out MATMUL_REDUCE_SCATTER", 40), "attn.out MATMUL_REDUCE_SCATTER");
  EXPECT_EQ(fit_label("attn.out MATMUL_REDUCE_SCATTER", 12), "attn.out\u2026");
  EXPECT_EQ(fit_label("mlp.down row bwd grad-input matmul", 20), "mlp.down row bwd\u2026");
  EXPECT_EQ(fit_label("mlp.down row", 5), "");
  EXPECT_EQ(fit_label("", 5), "");
}

}  // namespace
}  // namespace cocemu
