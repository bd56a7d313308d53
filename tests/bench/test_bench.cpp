// `cocemu bench` and `tune` (R-BE-1..3): bitwise equality with serial, deterministic dry runs of
// every model config, MindSpeed's overlap verdicts under profiles built to fail each criterion,
// tuning that never models slower than the best single P, and the CLI's outputs (the SVG
// rendered to PNG). `validate`'s tests are in tests/train/test_validate.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "cocemu/bench/layer_bench.h"
#include "cocemu/bench/tune.h"
#include "cocemu/layers/coc_config.h"
#include "cocemu/runtime/blas.h"
#include "cocemu/runtime/profile.h"
#include "testing.h"

namespace cocemu::bench {
namespace {

const char* const kSegments[] = {"fwd attn.qkv", "fwd attn.out", "fwd mlp.up",
                                 "fwd mlp.down", "bwd mlp.down", "bwd attn.out"};

/// A small LLaMA-style layer on 4 ranks.
BenchConfig small(std::shared_ptr<const DeviceProfile> profile, bool dry_run) {
  BenchConfig c;
  c.model = "small";
  c.tp = 4;
  c.layer = {.seq = 128,
             .batch = 1,
             .hidden = 128,
             .heads = 8,
             .ffn = 192,
             .kv_heads = 4,
             .activation = layers::Activation::swiglu,
             .sequence_parallel = true,
             .dtype = DType::bf16};
  c.profile = std::move(profile);
  c.dry_run = dry_run;
  c.repeats = 1;
  layers::CocConfig coc;
  coc.tile_rows = 8;
  c.strategies = default_strategies(coc);
  return c;
}

const StrategyResult& find(const BenchResult& r, const std::string& name) {
  for (const auto& s : r.strategies)
    if (s.name == name) return s;
  throw std::runtime_error("no strategy " + name);
}

TEST(Bench, EveryStrategyIsBitwiseEqualToSerialAndTheJsonSaysSo) {
  // Links as fast as the small GEMMs: comm is worth hiding at this size.
  const BenchResult r = run_bench(
      small(testing::round_profile("topology: {intra_node: {fabric: mesh, per_peer_bytes_per_s: "
                                   "1.0e10, per_device_bytes_per_s: 1.0e10, latency_ns: 0}}"),
            false));
  ASSERT_EQ(r.strategies.size(), 5u);
  const nlohmann::json j = to_json(r);
  EXPECT_FALSE(j["dry_run"].get<bool>());
  for (const auto& s : j["strategies"]) {
    EXPECT_TRUE(s["bitwise_equal_serial"].get<bool>()) << s["name"];
    EXPECT_GT(s["modeled_ns"].get<double>(), 0);
    EXPECT_GT(s["wall_ns"].get<double>(), 0);
    EXPECT_GE(s["exposed_comm_ns"].get<double>(), 0);
    EXPECT_LE(s["exposed_comm_ns"].get<double>(), s["comm_ns"].get<double>() + 1);
  }
  ASSERT_EQ(j["segments"].size(), 6u);
  for (std::size_t k = 0; k < 6; ++k) {
    EXPECT_EQ(j["segments"][k]["name"], kSegments[k]);
    EXPECT_GT(j["segments"][k]["serial_wall_ns"].get<double>(), 0);
    for (const auto& st : j["segments"][k]["strategies"])
      EXPECT_GT(st["wall_ns"].get<double>(), 0) << st["name"];
    for (const auto& st : j["segments"][k]["strategies"])
      EXPECT_NEAR(st["speedup_vs_serial"].get<double>(),
                  j["segments"][k]["serial_ns"].get<double>() / st["modeled_ns"].get<double>(),
                  1e-9);
    EXPECT_FALSE(j["segments"][k]["recommendation"].get<std::string>().empty());
  }
  // Script P=4 hides more of its communication than serial does.
  EXPECT_LT(find(r, "script P=4").exposed_comm_ns / find(r, "script P=4").comm_ns,
            r.strategies[0].exposed_comm_ns / r.strategies[0].comm_ns);
}

// Non-deterministic mode prices the library's (unordered) collective plans: on a ring profile
// (H100 picks ring for large messages) serial communication models faster than the rank-ordered
// plans of deterministic mode.
TEST(Bench, NonDeterministicModeIsReportedAndPricesTheLibraryPlans) {
  BenchConfig c = bench_config_for(layers::load_model_config("llama2-7b"));
  c.profile = std::make_shared<const DeviceProfile>(load_named_profile("h100-sxm"));
  c.dry_run = true;
  const BenchResult det = run_bench(c);
  c.deterministic = false;
  const BenchResult fast = run_bench(c);
  EXPECT_FALSE(to_json(fast)["deterministic"].get<bool>());
  EXPECT_TRUE(to_json(det)["deterministic"].get<bool>());
  EXPECT_LT(fast.strategies[0].comm_ns, det.strategies[0].comm_ns);
  BenchConfig real = small(nullptr, false);
  real.deterministic = false;
  const BenchResult r = run_bench(real);
  EXPECT_NE(format_report(r).find("non-deterministic mode"), std::string::npos);
  EXPECT_TRUE(r.strategies[1].bitwise_equal_serial.has_value());
}

TEST(Bench, DryRunOfEveryModelIsDeterministicAndCountsNonCocWork) {
  for (const char* model : {"llama2-7b", "llama2-70b", "bloom-7b", "bloom-176b", "gpt3-175b"}) {
    BenchConfig c = bench_config_for(layers::load_model_config(model));
    c.dry_run = true;
    const auto t0 = std::chrono::steady_clock::now();
    const BenchResult a = run_bench(c);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const BenchResult b = run_bench(c);
    EXPECT_EQ(to_json(a).dump(), to_json(b).dump()) << model;
    EXPECT_FALSE(a.strategies[0].bitwise_equal_serial.has_value());
    EXPECT_NE(format_report(a).find("DRY RUN"), std::string::npos);
    EXPECT_NE(to_json(a)["note"].get<std::string>().find("numerics skipped"), std::string::npos);
    // The layer is more than its CoC segments: attention, norms, activations are modeled too.
    double segments = 0;
    for (const SegmentStats& s : a.strategies[0].segments)
      segments += s.span_ns;
    EXPECT_GT(double(a.strategies[0].modeled_ns), segments * 1.05) << model;
    std::printf("[ dry run ] %-11s %.2f s, serial %.1f us per layer\n", model, seconds,
                double(a.strategies[0].modeled_ns) / 1e3);
  }
}

// Each criterion of R-BE-3 fails under a profile built for it.
TEST(Bench, VerdictsNameTheFailedCriterion) {
  auto verdicts_of = [](const std::string& overrides, const std::string& strategy) {
    const BenchResult r = run_bench(small(testing::round_profile(overrides), true));
    std::vector<Verdict> v = find(r, strategy).verdicts;
    EXPECT_EQ(v.size(), 6u);
    return v;
  };
  auto count = [](const std::vector<Verdict>& v, const std::string& failed) {
    return std::count_if(v.begin(), v.end(), [&](const Verdict& x) { return x.failed == failed; });
  };
  // Balanced compute and comm, no overheads: the split overlaps.
  const auto ok = verdicts_of(
      "topology: {intra_node: {fabric: mesh, per_peer_bytes_per_s: 1.0e10, per_device_bytes_per_s: "
      "1.0e10, latency_ns: 0}}",
      "script P=4");
  EXPECT_GE(count(ok, ""), 3) << ok[0].text;
  // Launching costs far more than the chunks' work: host bound.
  const auto host = verdicts_of(
      "{topology: {intra_node: {fabric: mesh, per_peer_bytes_per_s: 1.0e8, per_device_bytes_per_s: "
      "1.0e8, latency_ns: 0}}, host: "
      "{launch_overhead_ns: 1.0e7, fused_launch_overhead_ns: 1.0e7}}",
      "script P=4");
  EXPECT_EQ(count(host, "host bound"), 6) << host[0].text;
  EXPECT_NE(host[0].text.find("waited for their host launch"), std::string::npos);
  // GEMMs lose efficiency when split small: matmul too small.
  const auto small_mm = verdicts_of(
      "{topology: {intra_node: {fabric: mesh, per_peer_bytes_per_s: 1.0e8, per_device_bytes_per_s: "
      "1.0e8, latency_ns: 0}}, compute: {gemm: "
      "{max_efficiency: 1.0, half_efficiency_flops: 1.0e9, alignment_bytes: 1, "
      "unaligned_efficiency: 1.0}}}",
      "script P=8");
  EXPECT_GE(count(small_mm, "matmul too small"), 4) << small_mm[0].text;
  // Every comm step pays a large latency: splitting multiplies it, comm degradation.
  const auto degrade = verdicts_of(
      "{topology: {intra_node: {fabric: mesh, per_peer_bytes_per_s: 1.0e8, per_device_bytes_per_s: "
      "1.0e8, latency_ns: 0}}, collectives: {direct: "
      "{step_latency_ns: 5.0e6, bandwidth_efficiency: 1.0}}}",
      "script P=4");
  EXPECT_GE(count(degrade, "comm degradation"), 4) << degrade[0].text;
}

// #33 item 19: on LLaMA2-70B (910B) a segment where script P=4 is the fastest script split and
// beats serial, yet MindSpeed's criteria say "matmul too small", and the fused kernel is faster
// still (`bwd attn.out`; the review's case was `fwd attn.qkv`, where with the fused kernels'
// calibrated step cost P=4 is now the fastest of all). The verdict says to use P=4 without the
// fused kernels; the criteria stay, as diagnostics, beside it.
TEST(Bench, RecommendationSaysWhetherToUseEachSplit) {
  BenchConfig c = bench_config_for(layers::load_model_config("llama2-70b"));
  c.profile = std::make_shared<const DeviceProfile>(load_named_profile("ascend-910b"));
  c.dry_run = true;
  const BenchResult r = run_bench(c);
  const nlohmann::json j = to_json(r);
  const nlohmann::json& qkv = j["segments"][5];
  ASSERT_EQ(qkv["name"], "bwd attn.out");
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& st : qkv["strategies"])
    by_name[st["name"].get<std::string>()] = st;
  const nlohmann::json& p4 = by_name.at("script P=4");
  EXPECT_LT(p4["modeled_ns"].get<double>(), by_name.at("script P=2")["modeled_ns"].get<double>());
  EXPECT_LT(p4["modeled_ns"].get<double>(), qkv["serial_ns"].get<double>());
  EXPECT_EQ(p4["use"], "without fused kernels") << p4.dump(2);
  EXPECT_NE(p4["recommendation"].get<std::string>().find("the fastest script split"),
            std::string::npos)
      << p4.dump(2);
  EXPECT_EQ(p4["criteria_met"], false);
  EXPECT_EQ(p4["criteria_failed"], "matmul too small");
  EXPECT_EQ(by_name.at("fused")["use"], "yes");
  EXPECT_EQ(by_name.at("script P=2")["use"], "no");
  EXPECT_NE(
      by_name.at("script P=2")["recommendation"].get<std::string>().find("not faster than serial"),
      std::string::npos);
  EXPECT_EQ(qkv["best_strategy"], "fused");
  EXPECT_EQ(qkv["best_script_split"], "script P=4");
  // The report says it in words, and keeps the criteria apart.
  const std::string text = format_report(r);
  EXPECT_NE(text.find("bwd attn.out   use fused: "), std::string::npos) << text;
  EXPECT_NE(text.find("without fused kernels: script P=4"), std::string::npos) << text;
  EXPECT_NE(text.find("not met  matmul too small"), std::string::npos) << text;
  EXPECT_EQ(text.find("failed"), std::string::npos) << text;
}

// For every segment of every model: "yes" exactly for the fastest (serial included), "without
// fused kernels" only for the fastest script split when it beats serial but is not the fastest,
// "no" for everything else — with serial fastest, no split is recommended.
TEST(Bench, RecommendationsFollowTheModeledTimes) {
  for (const char* model : {"llama2-7b", "bloom-7b"})
    for (const char* profile : {"ascend-910b", "h100-sxm"}) {
      BenchConfig c = bench_config_for(layers::load_model_config(model));
      c.profile = std::make_shared<const DeviceProfile>(load_named_profile(profile));
      c.dry_run = true;
      const BenchResult r = run_bench(c);
      for (std::size_t k = 0; k < r.strategies[0].segments.size(); ++k) {
        double fastest = r.strategies[0].segments[k].span_ns, fastest_script = -1;
        for (std::size_t i = 1; i < r.strategies.size(); ++i) {
          const double t = r.strategies[i].segments[k].span_ns;
          fastest = std::min(fastest, t);
          if (r.strategies[i].name.rfind("script", 0) == 0 &&
              (fastest_script < 0 || t < fastest_script))
            fastest_script = t;
        }
        for (std::size_t i = 1; i < r.strategies.size(); ++i) {
          const double t = r.strategies[i].segments[k].span_ns;
          const Recommendation& rec = r.strategies[i].recommendations.at(k);
          const bool script = r.strategies[i].name.rfind("script", 0) == 0;
          const Recommendation::Use want =
              t <= fastest ? Recommendation::Use::yes
              : script && t == fastest_script && t < r.strategies[0].segments[k].span_ns
                  ? Recommendation::Use::without_fused
                  : Recommendation::Use::no;
          EXPECT_EQ(rec.use, want) << model << " " << profile << " " << r.strategies[i].name << " "
                                   << r.strategies[0].segments[k].name << ": " << rec.text;
        }
      }
    }
}

TEST(Bench, BadConfigurationsAreClearErrors) {
  BenchConfig c = small(testing::round_profile(), true);
  c.repeats = 0;
  testing::expect_error([&] { run_bench(c); }, Errc::invalid_argument, {"repeats = 0", ">= 1"});
  c = small(testing::round_profile(), true);
  std::swap(c.strategies[0], c.strategies[1]);
  testing::expect_error([&] { run_bench(c); }, Errc::invalid_argument,
                        {"first strategy must be serial", "script P=2"});
  c = small(testing::round_profile(), true);
  c.tp = 3;  // 8 heads do not split over 3 ranks
  testing::expect_error([&] { run_bench(c); }, Errc::invalid_argument, {"heads 8", "TP size 3"});
  testing::expect_error([&] { segment_key(c, "fwd mlp.gate"); }, Errc::invalid_argument,
                        {"fwd mlp.gate", "allowed"});
}

TEST(Bench, JudgeAppliesTheBalanceAndGainCriteria) {
  SegmentStats serial{
      .name = "s", .span_ns = 1000, .compute_work_ns = 500, .comm_work_ns = 500, .gemms = 1};
  SegmentStats split = serial;
  split.gemms = 4;
  split.span_ns = 700;
  split.overlap_ns = 300;
  EXPECT_TRUE(judge(serial, split).success) << judge(serial, split).text;
  SegmentStats slow = split;
  slow.span_ns = 1100;
  EXPECT_EQ(judge(serial, slow).failed, "no gain");
  SegmentStats apart = split;
  apart.overlap_ns = 10;
  EXPECT_EQ(judge(serial, apart).failed, "no concurrency");
  EXPECT_NE(judge(serial, apart).text.find("overlapped 0.0 us, less than half of the 0.4 us"),
            std::string::npos)
      << judge(serial, apart).text;
  SegmentStats comm_heavy{
      .name = "s", .span_ns = 1000, .compute_work_ns = 100, .comm_work_ns = 900, .gemms = 1};
  SegmentStats comm_split = comm_heavy;
  comm_split.gemms = 4;
  comm_split.span_ns = 950;
  EXPECT_EQ(judge(comm_heavy, comm_split).failed, "comm dominated");
  SegmentStats unsplit = serial;
  unsplit.collectives = 1;
  EXPECT_EQ(judge(serial, unsplit).failed, "not split");
  EXPECT_NE(judge(serial, unsplit)
                .text.find("runs as 1 GEMM and 1 collective, unsplit (nothing overlapped)"),
            std::string::npos)
      << judge(serial, unsplit).text;
}

// A backward segment that a strategy does not chunk (as many GEMMs as serial) but whose GEMMs and
// collectives overlap: the verdict says how many of each and what overlapped, never "one GEMM and
// one collective (nothing to overlap)".
TEST(Bench, JudgeSaysWhatAnUnsplitSegmentOfManyOpsOverlaps) {
  SegmentStats serial{.name = "bwd",
                      .span_ns = 5e6,
                      .compute_work_ns = 3e6,
                      .comm_work_ns = 2e6,
                      .overlap_ns = 1062e3,
                      .gemms = 4,
                      .collectives = 3};
  const SegmentStats same = serial;
  const Verdict v = judge(serial, same);
  EXPECT_FALSE(v.success);
  EXPECT_EQ(v.failed, "not split");
  EXPECT_EQ(v.text.find("one GEMM"), std::string::npos) << v.text;
  EXPECT_EQ(v.text.find("nothing to overlap"), std::string::npos) << v.text;
  for (const char* part :
       {"runs its 4 GEMMs and 3 collectives unchunked", "1062.0 us of them overlapped"})
    EXPECT_NE(v.text.find(part), std::string::npos) << part << " in: " << v.text;
}

TEST(Bench, TunedConfigNeverModelsSlowerThanTheBestSingleP) {
  for (const char* model : {"llama2-7b", "llama2-70b", "bloom-7b", "bloom-176b", "gpt3-175b"}) {
    BenchConfig c = bench_config_for(layers::load_model_config(model));
    const TuneResult t = tune(c, default_bench_coc());
    // Six segments; GeLU models share one shape between fwd mlp.up and bwd mlp.down.
    EXPECT_EQ(t.choices.size(), std::string(model).rfind("llama", 0) == 0 ? 6u : 5u);
    // The YAML is what the layers and `bench --coc-config` accept.
    const layers::CocConfig loaded = layers::parse_coc_config(
        to_yaml(t), "tuned.yaml", [](const std::string&) { return std::optional<std::string>(); });
    EXPECT_EQ(loaded.customized_coc, t.coc.customized_coc);
    c.dry_run = true;
    c.strategies = default_strategies(loaded);
    ASSERT_EQ(c.strategies.back().name, "tuned");
    const BenchResult r = run_bench(c);
    std::int64_t best_single = r.strategies[0].modeled_ns;
    for (const auto& s : r.strategies)
      if (s.name != "tuned") best_single = std::min(best_single, s.modeled_ns);
    EXPECT_LE(find(r, "tuned").modeled_ns, best_single) << model;
    for (const TuneChoice& ch : t.choices)
      EXPECT_FALSE(ch.reason.empty()) << ch.key;
  }
}

TEST(BenchCli, WritesTraceSvgAndJsonAndTheSvgRendersToPng) {
  const std::string dir = ::testing::TempDir() + "/cocemu_bench_cli";
  std::filesystem::remove_all(dir);
  int status = 0;
  const std::string out =
      testing::run_command(std::string(COCEMU_BINARY) +
                               " bench --dry-run --model llama2-7b --no-progress --out-dir " + dir,
                           &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("DRY RUN"), std::string::npos);
  EXPECT_NE(out.find(dir + "/bench.json"), std::string::npos);
  for (const char* f : {"serial.trace.json", "script-p4.svg", "fused.svg", "bench.json"})
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + f)) << f;
  std::ifstream j(dir + "/bench.json");
  const nlohmann::json results = nlohmann::json::parse(j);
  EXPECT_TRUE(results["dry_run"].get<bool>());
  EXPECT_EQ(results["strategies"].size(), 5u);
  if (std::system("command -v rsvg-convert >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "rsvg-convert not installed (bootstrap.sh installs librsvg2-bin)";
  ASSERT_EQ(std::system(("rsvg-convert -o " + dir + "/p4.png " + dir + "/script-p4.svg").c_str()),
            0);
  std::ifstream p(dir + "/p4.png", std::ios::binary);
  char magic[8] = {};
  p.read(magic, 8);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
  // A bad model name is a clear error, not a crash.
  const std::string bad = testing::run_command(
      std::string(COCEMU_BINARY) + " bench --dry-run --model no-such-model", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(bad.find("no-such-model"), std::string::npos) << bad;
}

/// The text of every element `<tag class="cls" …>TEXT</tag>` in `svg`.
std::vector<std::string> svg_texts(const std::string& svg, const std::string& cls) {
  std::vector<std::string> out;
  const std::regex re("class=\"" + cls + "\"[^>]*>([^<]*)<");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator();
       ++it)
    out.push_back((*it)[1]);
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// #33 item 20: bench's timelines mark the six CoC segments, draw the 8 identical TP ranks once,
// and share one x scale across strategies so they compare by eye.
TEST(BenchCli, TimelinesMarkSegmentsCollapseRanksAndShareAScale) {
  const std::string dir = ::testing::TempDir() + "/cocemu_bench_svg";
  std::filesystem::remove_all(dir);
  int status = 0;
  const std::string out =
      testing::run_command(std::string(COCEMU_BINARY) +
                               " bench --dry-run --model llama2-70b --no-progress --out-dir " + dir,
                           &status);
  ASSERT_EQ(status, 0) << out;
  std::vector<std::string> ticks;
  for (const char* name : {"serial", "script-p4", "fused"}) {
    const std::string svg = read_text(dir + "/" + name + ".svg");
    for (const char* seg : kSegments)
      EXPECT_NE(svg.find(std::string("<title>segment ") + seg + " ["), std::string::npos)
          << name << " " << seg;
    EXPECT_EQ(svg_texts(svg, "rank-label"), (std::vector<std::string>{"ranks 0\u2013"
                                                                      "7 \u00d7"
                                                                      "8"}))
        << name;
    if (ticks.empty())
      ticks = svg_texts(svg, "tick");
    else
      EXPECT_EQ(svg_texts(svg, "tick"), ticks) << name;
  }
  EXPECT_GE(ticks.size(), 4u);
}

// A mistyped model name lists the valid ones and suggests the nearest.
TEST(BenchCli, MistypedModelNameListsTheValidOnes) {
  int status = 0;
  const std::string out = testing::run_command(
      std::string(COCEMU_BINARY) + " bench --dry-run --model llama-2-70b", &status);
  EXPECT_EQ(WEXITSTATUS(status), 2) << out;
  EXPECT_NE(out.find("unknown model 'llama-2-70b' (no "), std::string::npos) << out;
  EXPECT_NE(out.find("models/llama-2-70b.yaml); valid names: "), std::string::npos) << out;
  EXPECT_NE(out.find("llama2-7b"), std::string::npos) << out;
  EXPECT_NE(out.find("(did you mean 'llama2-70b'?)"), std::string::npos) << out;
  const std::string profile =
      testing::run_command(std::string(COCEMU_BINARY) + " bench --dry-run --profile h100", &status);
  EXPECT_EQ(WEXITSTATUS(status), 2) << profile;
  EXPECT_NE(profile.find("(did you mean 'h100-sxm'?)"), std::string::npos) << profile;
}

// #33 item 21: a generic OpenBLAS core on a CPU with AVX2 (forced here with OpenBLAS's own
// OPENBLAS_CORETYPE) is reported with its remedy by mlpbench and by a real-numerics bench.
TEST(BenchCli, GenericOpenBlasCoreIsReported) {
  if (!blas::cpu_vectors().avx2) GTEST_SKIP() << "this CPU has no AVX2: old kernels fit it";
  const std::string model = ::testing::TempDir() + "/cocemu_tiny_model.yaml";
  std::ofstream(model) << "name: tiny\nhidden_size: 128\nnum_attention_heads: 8\n"
                          "num_query_groups: 4\nffn_hidden_size: 192\nnum_layers: 1\n"
                          "seq_length: 128\nmicro_batch_size: 1\ntensor_model_parallel_size: 4\n"
                          "sequence_parallel: true\n";
  const std::string dir = ::testing::TempDir() + "/cocemu_bench_blas";
  for (const std::string& run :
       {std::string(COCEMU_BINARY) + " mlpbench -n 2 --m 64 --hidden 64 --ffn 128 --repeats 1",
        std::string(COCEMU_BINARY) + " bench --no-progress --repeats 1 --model " + model +
            " --out-dir " + dir}) {
    int status = 0;
    std::string out = testing::run_command("env OPENBLAS_CORETYPE=Prescott " + run, &status);
    ASSERT_EQ(status, 0) << out;
    EXPECT_NE(out.find("WARNING: OpenBLAS runs its generic Prescott kernels"), std::string::npos)
        << out;
    EXPECT_NE(out.find("OPENBLAS_CORETYPE=Prescott selects them"), std::string::npos) << out;
    EXPECT_NE(out.find(blas::cpu_vectors().avx512 ? "OPENBLAS_CORETYPE=SkylakeX"
                                                  : "OPENBLAS_CORETYPE=Haswell"),
              std::string::npos)
        << out;
    out = testing::run_command("env OPENBLAS_CORETYPE=Haswell " + run, &status);
    ASSERT_EQ(status, 0) << out;
    EXPECT_EQ(out.find("WARNING: OpenBLAS"), std::string::npos) << out;
  }
  std::ifstream j(dir + "/bench.json");
  EXPECT_FALSE(nlohmann::json::parse(j)["openblas_core"].get<std::string>().empty());
}

TEST(BenchCli, StartsOpenBlasWithoutServerThreads) {
  // Started without OPENBLAS_NUM_THREADS, the binary sets it and executes itself again, so that
  // OpenBLAS loads without its idle thread pool; a value the user set is kept.
  const std::string run =
      std::string(COCEMU_BINARY) + " mlpbench -n 2 --m 64 --hidden 64 --ffn 128 --repeats 1";
  int status = 0;
  std::string out = testing::run_command("env -u OPENBLAS_NUM_THREADS " + run, &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("server threads started at load: 0"), std::string::npos) << out;
  out = testing::run_command("env OPENBLAS_NUM_THREADS=2 " + run, &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("server threads started at load: 1"), std::string::npos) << out;
  // The allocator the build chose: oneTBB's with COCEMU_SCALABLE_MALLOC; else libc's, or the
  // sanitizer runtime's (libtsan) in sanitizer builds.
  const bool tbb_malloc = out.find("malloc from libtbbmalloc_proxy") != std::string::npos;
  EXPECT_EQ(tbb_malloc, bool(COCEMU_SCALABLE_MALLOC)) << out;
  EXPECT_NE(out.find("malloc from lib"), std::string::npos) << out;
}

}  // namespace
}  // namespace cocemu::bench
