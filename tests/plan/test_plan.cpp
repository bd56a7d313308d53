// `cocemu plan`: the exhaustive search finds the true optimum of a space a test enumerates on its
// own; the heuristic returns only valid layouts that fit; the dynamic-programming partition is
// balanced; bad input is a clear error; the CLI's winner reproduces in `cocemu train`.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "cocemu/runtime/error.h"
#include "cocemu/runtime/profile.h"
#include "cocemu/train/config.h"
#include "cocemu/train/plan.h"
#include "testing.h"

namespace cocemu::bench {
namespace {

using layers::train::PipelineSchedule;
using layers::train::Recompute;
using layers::train::TrainLayout;

layers::train::DecoderShape small_model() {
  layers::train::DecoderShape m;
  m.name = "small";
  m.hidden = 2048;
  m.heads = 16;
  m.kv_heads = 8;
  m.ffn = 5632;
  m.num_layers = 8;
  m.vocab = 32000;
  m.seq = 2048;
  return m;
}

PlanQuery small_request() {
  PlanQuery r;
  r.model = small_model();
  r.model_name = "small";
  r.profile = std::make_shared<const DeviceProfile>(load_named_profile("ascend-910b"));
  r.profile_name = "ascend-910b";
  r.nodes = 1;
  r.global_batch = 16;
  r.micro_batch_sizes = {1, 2};
  r.max_cp = 2;
  r.max_vpp = 2;
  r.threads = 2;
  r.top_k = 3;
  return r;
}

// R-PL-1: the space enumerated here, independently of plan's own loops; every valid candidate
// evaluated; the minimum must be plan's best.
TEST(Plan, ExhaustiveFindsTheTrueOptimum) {
  PlanQuery r = small_request();
  r.max_vpp = 3;  // virtual sizes need not be powers of two
  std::vector<TrainLayout> space;
  for (int tp : {1, 2, 4, 8})
    for (int cp : {1, 2})
      for (std::string algo : {"megatron_cp_algo", "ulysses_cp_algo"})
        for (int pp : {1, 2, 4, 8})
          for (int vpp : {1, 2, 3})
            for (std::int64_t mbs : {1, 2})
              for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full})
                for (bool dist : {false, true})
                  for (bool sp : {false, true})
                    for (int copies : {1, 2}) {
                      if (8 % (tp * cp * pp) || (cp == 1 && algo != "megatron_cp_algo")) continue;
                      if ((vpp > 1 && pp < 2) || (!sp && tp == 1)) continue;
                      TrainLayout l;
                      l.tp = tp;
                      l.cp = cp;
                      l.cp_algo = algo;
                      l.pp = pp;
                      l.dp = 8 / (tp * cp * pp);
                      if (dist && l.dp * cp == 1) continue;
                      l.vpp = vpp;
                      l.schedule =
                          vpp > 1 ? PipelineSchedule::interleaved : PipelineSchedule::one_f_one_b;
                      l.micro_batch_size = mbs;
                      l.global_batch_size = r.global_batch;
                      l.recompute = rc;
                      l.distributed_optimizer = dist;
                      l.sequence_parallel = sp;
                      l.micro_batch_interleave = copies;
                      space.push_back(l);
                    }
  std::int64_t best = INT64_MAX, valid = 0;
  for (const TrainLayout& l : space) {
    if (!prune_reason(r, l).empty()) continue;
    ++valid;
    best = std::min(best, evaluate_candidate(r, l).report.iteration_ns);
  }
  ASSERT_GT(valid, 10);
  const PlanResult res = plan(r);
  EXPECT_EQ(res.enumerated, std::int64_t(space.size()));
  EXPECT_EQ(res.evaluated, valid);
  ASSERT_FALSE(res.top.empty());
  EXPECT_EQ(res.top.front().report.iteration_ns, best);
  std::int64_t pruned = 0;
  for (const auto& [reason, n] : res.pruned)
    pruned += n;
  EXPECT_EQ(pruned + res.evaluated, res.enumerated);
  for (std::size_t i = 1; i < res.top.size(); ++i)
    EXPECT_LE(res.top[i - 1].report.iteration_ns, res.top[i].report.iteration_ns);
  EXPECT_FALSE(res.explanation.empty());
}

// The search keeps what fits and what MindSpeed allows. LLaMA2-70B on 8 × 8 910B at 16K: the
// interleaved tp8 cp2 pp4 vpp4 layout with the distributed optimizer needs about 53 GB once the
// optimizer state is sharded over dp × cp (Megatron's intra_dp_cp_group) and the last stage
// holds one micro-batch of logits; Ulysses with one KV head per TP rank over cp 2 repeats the KV
// heads (MindSpeed needs only heads % (tp·cp)).
TEST(Plan, KeepsLayoutsThatFitAndUlyssesWithRepeatedKvHeads) {
  PlanQuery r;
  r.model = load_decoder("llama2-70b");
  r.model.seq = 16384;
  r.model_name = "llama2-70b";
  r.profile = std::make_shared<const DeviceProfile>(load_named_profile("ascend-910b"));
  r.profile_name = "ascend-910b";
  r.nodes = 8;
  r.global_batch = 32;
  TrainLayout l;
  l.tp = 8;
  l.cp = 2;
  l.dp = 1;
  l.pp = 4;
  l.vpp = 4;
  l.schedule = PipelineSchedule::interleaved;
  l.micro_batch_size = 1;
  l.global_batch_size = 32;
  l.distributed_optimizer = true;
  l.overlap_param_gather = true;
  EXPECT_EQ(prune_reason(r, l), "");
  const MemoryEstimate mem = estimate_memory(r.model, l, *r.profile);
  EXPECT_GT(mem.peak_bytes, 50e9) << mem.verdict;
  EXPECT_LT(mem.peak_bytes, 56e9) << mem.verdict;
  TrainLayout ulysses = l;
  ulysses.cp_algo = "ulysses_cp_algo";
  EXPECT_EQ(prune_reason(r, ulysses), "");
  EXPECT_GT(evaluate_candidate(r, ulysses).report.iteration_ns, 0);
  ulysses.cp = 16;  // 8 heads per TP rank over cp 16: 64 % (8 · 16) != 0, MindSpeed refuses
  EXPECT_NE(prune_reason(r, ulysses).find("ulysses"), std::string::npos);
}

// Megatron sets the virtual size through layers per virtual stage, so any divisor is a layout
// (Narayanan et al.'s 76B and Korthikanti et al.'s 175B and 530B ran vpp 3): with 12 layers,
// pp 2 and vpp 3 (2 layers per chunk) is searched and valid.
TEST(Plan, VirtualSizesNeedNotBePowersOfTwo) {
  PlanQuery r = small_request();
  r.model.num_layers = 12;
  r.max_vpp = 4;
  int vpp3 = 0;
  for (const TrainLayout& l : enumerate_layouts(r))
    if (l.vpp == 3 && l.pp == 2 && l.tp == 2 && l.cp == 1 && l.micro_batch_size == 1 &&
        l.recompute == Recompute::none && !l.distributed_optimizer && l.sequence_parallel &&
        l.micro_batch_interleave == 1) {
      ++vpp3;
      EXPECT_EQ(prune_reason(r, l), "") << l.describe();
    }
  EXPECT_EQ(vpp3, 1);
}

// The same answer on one thread and on two (the memo is shared; results do not depend on which
// thread priced what first).
TEST(Plan, SameResultOnOneAndTwoThreads) {
  PlanQuery r = small_request();
  r.threads = 1;
  const PlanResult one = plan(r);
  r.threads = 2;
  const PlanResult two = plan(r);
  ASSERT_EQ(one.top.size(), two.top.size());
  for (std::size_t i = 0; i < one.top.size(); ++i) {
    EXPECT_EQ(one.top[i].describe(), two.top[i].describe());
    EXPECT_EQ(one.top[i].report.iteration_ns, two.top[i].report.iteration_ns);
    EXPECT_EQ(one.top[i].customized_coc, two.top[i].customized_coc);
  }
  EXPECT_EQ(one.pruned, two.pruned);
}

// --cross-entropy-loss-fusion: every candidate is priced with it, the best models faster than
// without, and the winner's YAML and flags carry it.
TEST(Plan, CrossEntropyFusionReachesTheWinnersFiles) {
  PlanQuery r = small_request();
  r.compare_heuristic = false;
  const PlanResult unfused = plan(r);
  r.cross_entropy_fusion = true;
  const PlanResult fused = plan(r);
  ASSERT_FALSE(unfused.top.empty());
  ASSERT_FALSE(fused.top.empty());
  EXPECT_LT(fused.top[0].report.iteration_ns, unfused.top[0].report.iteration_ns);
  for (const auto& c : fused.top)
    EXPECT_TRUE(c.layout.cross_entropy_fusion) << c.describe();
  EXPECT_NE(winner_flags(fused).find("--cross-entropy-loss-fusion"), std::string::npos);
  EXPECT_NE(winner_yaml(fused).find("cross_entropy_loss_fusion: true"), std::string::npos);
  EXPECT_EQ(winner_flags(unfused).find("cross-entropy"), std::string::npos);
}

// The heuristic never returns an invalid or out-of-memory candidate, and is never better than
// the exhaustive best.
TEST(Plan, HeuristicReturnsOnlyValidLayoutsThatFit) {
  for (const auto& [nodes, gbs, memory_gb] : std::vector<std::tuple<int, std::int64_t, double>>{
           {1, 16, 64}, {2, 32, 64}, {1, 8, 8}, {4, 64, 16}}) {
    PlanQuery r = small_request();
    r.nodes = nodes;
    r.global_batch = gbs;
    auto prof = load_named_profile("ascend-910b");
    prof.memory_capacity = memory_gb * 1e9;
    r.profile = std::make_shared<const DeviceProfile>(prof);
    const PlanResult res = plan(r);
    ASSERT_TRUE(res.heuristic) << nodes << " nodes";
    EXPECT_EQ(prune_reason(r, res.heuristic->layout), "") << res.heuristic->describe();
    EXPECT_FALSE(res.heuristic->report.memory.oom);
    EXPECT_GE(res.heuristic->report.iteration_ns, res.top.front().report.iteration_ns);
    EXPECT_LT(res.heuristic_evaluated, res.evaluated) << "the heuristic should evaluate fewer";
  }
}

// dynamic_programming: a heavy LM head (large vocabulary) makes the last stage slow; the
// balanced partition gives it fewer layers and is no slower than the even split.
TEST(Plan, DynamicProgrammingBalancesTheStages) {
  PlanQuery r = small_request();
  r.model.vocab = 256000;
  r.model.num_layers = 10;
  r.compare_heuristic = false;
  r.top_k = 1000;
  const PlanResult even = plan(r);
  r.mode = SearchMode::dynamic_programming;
  const PlanResult dp = plan(r);
  EXPECT_LE(dp.top.front().report.iteration_ns, even.top.front().report.iteration_ns);
  bool uneven = false;
  for (const auto& c : dp.top)
    if (!c.layout.stage_layers.empty()) {
      uneven = true;
      std::int64_t sum = 0;
      for (const auto n : c.layout.stage_layers) {
        EXPECT_GE(n, 1);
        sum += n;
      }
      EXPECT_EQ(sum, r.model.num_layers);
      EXPECT_LE(c.layout.stage_layers.back(), c.layout.stage_layers[1]) << c.describe();
    }
  EXPECT_TRUE(uneven) << "some candidate should take an uneven partition";
}

// #33 item 16: dynamic_programming searches the exhaustive space once (no candidate twice), and
// every uneven partition it takes is one Megatron-LM can run (first and last stage free, the
// middle stages equal).
TEST(Plan, DynamicProgrammingEvaluatesEachCandidateOnce) {
  PlanQuery r = small_request();
  r.model.vocab = 256000;
  r.model.num_layers = 10;  // pp 4 and 8 do not divide it
  r.compare_heuristic = false;
  r.top_k = 1000;
  const PlanResult even = plan(r);
  r.mode = SearchMode::dynamic_programming;
  const PlanResult dp = plan(r);
  EXPECT_EQ(dp.enumerated, even.enumerated);
  std::set<std::string> seen;
  bool uneven = false;
  for (const auto& c : dp.top) {
    EXPECT_TRUE(seen.insert(c.describe()).second) << "evaluated twice: " << c.describe();
    const auto& st = c.layout.stage_layers;
    if (st.size() > 2) {
      uneven = true;
      for (std::size_t i = 2; i + 1 < st.size(); ++i)
        EXPECT_EQ(st[i], st[1]) << c.describe();
    }
  }
  EXPECT_TRUE(uneven) << "pp 4 over 10 layers is uneven";
}

// #33 item 17: the explanation's terms sum to the gap, the bubble does not count the pipeline
// waits a second time (they are exposed PP), and no term is printed negative.
TEST(Plan, ExplanationCountsEachMillisecondOnce) {
  PlanQuery r = small_request();
  r.compare_heuristic = false;
  r.top_k = 2;
  const PlanResult res = plan(r);
  ASSERT_EQ(res.top.size(), 2u);
  const double gap = double(res.top[1].report.iteration_ns - res.top[0].report.iteration_ns) / 1e6;
  double sum = 0;
  for (const auto& [name, ms] : res.explanation_terms)
    sum += ms;
  EXPECT_NEAR(sum, gap, 1e-6);
  auto idle_without_pp = [](const TrainReport& t) {
    const auto pp = t.exposed_comm_ns.find("PP");
    return (t.bubble_fraction * t.pipeline_span_ns -
            (pp == t.exposed_comm_ns.end() ? 0 : pp->second)) /
           1e6;
  };
  ASSERT_FALSE(res.explanation_terms.empty());
  EXPECT_EQ(res.explanation_terms[0].first, "pipeline bubble");
  EXPECT_NEAR(res.explanation_terms[0].second,
              idle_without_pp(res.top[1].report) - idle_without_pp(res.top[0].report), 1e-6);
  EXPECT_GT(res.top[0].report.pipeline_span_ns, 0);
  EXPECT_EQ(res.explanation.find("by -"), std::string::npos) << res.explanation;
  EXPECT_EQ(res.explanation.find("remaining -"), std::string::npos) << res.explanation;
}

// #33 item 1: a profile says which TP overlap its platform has, and plan searches only that.
TEST(Plan, SearchesOnlyThePlatformsTpOverlap) {
  auto search = [](const std::string& profile, std::optional<std::vector<std::string>> overlap,
                   bool wide = false) {
    PlanQuery r = small_request();
    r.compare_heuristic = false;
    r.top_k = 1000;
    if (wide) {  // linears large enough at TP 8 for the LCOC fused kernels to pay
      r.model.hidden = 8192;
      r.model.heads = 64;
      r.model.ffn = 28672;
      r.model.seq = 4096;
    }
    auto prof = load_named_profile(profile);
    if (overlap) prof.tp_overlap = *overlap;
    r.profile = std::make_shared<const DeviceProfile>(prof);
    r.profile_name = profile;
    return plan(r);
  };
  auto values = [](const PlanResult& res) {
    std::set<int> v;
    for (const auto& c : res.top)
      for (const auto& [key, x] : c.customized_coc)
        v.insert(x);
    return v;
  };
  const PlanResult ascend = search("ascend-910b", std::nullopt, true);
  EXPECT_TRUE(values(ascend).count(-1)) << "the LCOC fused kernels are searched";
  std::set<int> fused_tps, tps;
  for (const auto& c : ascend.top) {
    tps.insert(c.layout.tp);
    for (const auto& [key, x] : c.customized_coc)
      if (x == -1) fused_tps.insert(c.layout.tp);
  }
  EXPECT_EQ(fused_tps, std::set<int>{kLcocFusedTp})
      << "MindSpeed's LCOC fused kernels run at TP 8 only";
  EXPECT_GT(tps.size(), 2u) << "the search covers other TP sizes too";
  const PlanResult script = search("ascend-910b", std::vector<std::string>{"mindspeed_coc"});
  EXPECT_FALSE(values(script).count(-1)) << "no fused kernels on this platform";
  EXPECT_TRUE(values(script).count(2) || values(script).count(4) || values(script).count(8));
  const PlanResult none = search("ascend-910b", std::vector<std::string>{});
  EXPECT_TRUE(values(none).empty());
  for (const auto& c : none.top)
    EXPECT_FALSE(c.tp_comm_overlap);
  // On NVIDIA the overlap is Transformer Engine's split GEMMs, which pay on large linears: the
  // search runs on a wider model (hidden 8192, FFN 28672) to find a winner that uses them.
  const PlanResult nvidia = [&] {
    PlanQuery r = small_request();
    r.compare_heuristic = false;
    r.top_k = 1000;
    r.model.hidden = 8192;
    r.model.heads = 64;
    r.model.ffn = 28672;
    r.model.seq = 4096;
    r.profile = std::make_shared<const DeviceProfile>(load_named_profile("h100-sxm"));
    r.profile_name = "h100-sxm";
    return plan(r);
  }();
  EXPECT_TRUE(values(nvidia).empty()) << "Megatron-LM has no per-shape CoC";
  bool overlapped = false;
  for (const auto& c : nvidia.top) {
    if (c.tp_comm_overlap) overlapped = true;
    if (c.layout.tp == 1 || !c.layout.sequence_parallel) {
      EXPECT_FALSE(c.tp_comm_overlap) << c.describe() << ": --tp-comm-overlap needs tp and SP";
    }
  }
  EXPECT_TRUE(overlapped);
  for (const PlanResult* res : {&nvidia, &none})
    for (const char* ascend_flag : {"--use-ascend-coc", "--coc-fused-kernel", "--coc-parallel-num"})
      EXPECT_EQ(winner_flags(*res).find(ascend_flag), std::string::npos) << winner_flags(*res);
  // The profile key is strict.
  const std::string base = "name: x\nbase: ascend-910b\n";
  EXPECT_THROW((void)parse_device_profile(base + "tp_overlap: [nccl_magic]\n", "p.yaml"), Error);
  EXPECT_THROW(
      (void)parse_device_profile(base + "tp_overlap: [te_userbuffers, lcoc_fused]\n", "p.yaml"),
      Error);
  EXPECT_TRUE(load_named_profile("a100-sxm-cuda11").tp_overlap.empty());
  EXPECT_TRUE(load_named_profile("a100-sxm").has_tp_overlap("te_userbuffers"));
}

// #34: a dtype plan does not search, and more threads than oneTBB can use, are not taken as
// given.
TEST(Plan, DtypeAndThreadsTakeEffectOrAreErrors) {
  PlanQuery r = small_request();
  r.compare_heuristic = false;
  for (const DType t : {DType::f64, DType::i8}) {
    r.dtype = t;
    testing::expect_error([&] { (void)plan(r); }, Errc::invalid_argument,
                          {std::string(name_of(t)), "allowed: bf16, f32"});
  }
  r.dtype = DType::bf16;
  r.threads = 1024;
  const PlanResult res = plan(r);
  EXPECT_LT(res.threads, 1024);
  EXPECT_NE(res.threads_note.find("--threads 1024"), std::string::npos) << res.threads_note;
  EXPECT_NE(format_plan(res).find("--threads 1024"), std::string::npos);
}

TEST(Plan, BadInputIsAClearError) {
  PlanQuery r = small_request();
  r.global_batch = 7;  // no mbs·dp divides it but dp 1, which does not fit 8 devices' layouts?
  r.micro_batch_sizes = {2};
  try {
    (void)plan(r);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("was pruned"), std::string::npos) << m;
    EXPECT_NE(m.find("global batch not divisible by mbs·dp"), std::string::npos) << m;
  }
  r = small_request();
  auto prof = load_named_profile("ascend-910b");
  prof.memory_capacity = 1e8;  // 100 MB: nothing fits
  r.profile = std::make_shared<const DeviceProfile>(prof);
  try {
    (void)plan(r);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
  r = small_request();
  r.global_batch = 0;
  EXPECT_THROW((void)plan(r), Error);
  EXPECT_THROW((void)parse_search_mode("greedy"), Error);
}

std::string run(const std::string& args, int* status) {
  const std::string cmd = std::string(COCEMU_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p))
    out.append(buf, n);
  *status = pclose(p);
  return out;
}

/// Runs `cocemu ARGS --json FILE` and returns the JSON it wrote (null if the run failed, which
/// is a test failure); the command's output goes to *out.
nlohmann::json run_json(const std::string& args, const std::string& file, std::string* out) {
  int status = 0;
  *out = run(args + " --json " + file, &status);
  EXPECT_EQ(status, 0) << *out;
  if (status != 0) return nullptr;
  std::ifstream in(file);
  return nlohmann::json::parse(in);
}

/// `cocemu train --config WINNER --dry-run` on a plan's winner (in `dir`), as JSON.
nlohmann::json train_winner(const std::string& dir, const std::string& extra, std::string* out) {
  return run_json("train --config " + dir + "/plan.winner.yaml --dry-run " + extra + " --out-dir " +
                      dir + "/train",
                  dir + "/train.json", out);
}

// R-PL-2: table, explanation, JSON, and a winner that `cocemu train --config` reproduces.
TEST(PlanCli, WinnerReproducesInTrain) {
  const std::string dir = ::testing::TempDir() + "/cocemu_plan_cli";
  std::filesystem::remove_all(dir);
  int status = 0;
  std::string out, train;
  const auto j = run_json(
      "plan --model llama2-7b --nodes 2 --global-batch 64 --seq 4096 "
      "--out-dir " +
          dir,
      dir + "/plan.json", &out);
  ASSERT_FALSE(j.is_null());
  EXPECT_NE(out.find("no numerics"), std::string::npos) << out;
  EXPECT_NE(out.find("faster per iteration than the runner-up"), std::string::npos) << out;
  EXPECT_NE(out.find("recursive_programming heuristic"), std::string::npos) << out;
  ASSERT_TRUE(j.contains("candidates") && j.contains("pruned") && j.contains("best"));
  EXPECT_FALSE(j["candidates"].empty());
  const double planned = j["best"]["iteration_ns"].get<double>();
  const auto t = train_winner(dir, "--engine model", &train);
  ASSERT_FALSE(t.is_null());
  EXPECT_EQ(t["layout"].get<std::string>(), j["best"]["layout"].get<std::string>());
  // train composes emulated parts, plan priced ones: they agree within the part model's error.
  EXPECT_NEAR(t["iteration_ns"].get<double>() / planned, 1.0, 0.01) << train;
  // Priced with NCCL/HCCL's algorithms, and the winner's file says so to train.
  EXPECT_FALSE(t["deterministic"].get<bool>()) << train;
  EXPECT_NE(train.find("non-deterministic"), std::string::npos) << train;
  // --deterministic prices rank-ordered collectives; the winner's file carries the mode, and
  // train reproduces that price.
  const auto dj = run_json(
      "plan --model llama2-7b --nodes 2 --global-batch 64 --seq 4096 "
      "--deterministic --no-heuristic-compare --out-dir " +
          dir + "/det",
      dir + "/det.json", &out);
  ASSERT_FALSE(dj.is_null());
  const auto dt = train_winner(dir + "/det", "--engine model", &train);
  ASSERT_FALSE(dt.is_null());
  EXPECT_TRUE(dt["deterministic"].get<bool>()) << train;
  EXPECT_NEAR(dt["iteration_ns"].get<double>() / dj["best"]["iteration_ns"].get<double>(), 1.0,
              0.01)
      << train;
  // dynamic_programming: an uneven partition reproduces too (train's stage_layers).
  const auto d = run_json(
      "plan --model bloom-176b --nodes 12 --global-batch 112 "
      "--search-mode dynamic_programming --no-heuristic-compare --out-dir " +
          dir + "/dp",
      dir + "/dp.json", &out);
  ASSERT_FALSE(d.is_null());
  ASSERT_FALSE(d["best"]["stage_layers"].empty()) << out;
  const auto pt = train_winner(dir + "/dp", "", &train);
  ASSERT_FALSE(pt.is_null());
  EXPECT_NEAR(pt["iteration_ns"].get<double>() / d["best"]["iteration_ns"].get<double>(), 1.0, 0.01)
      << train;
  // The explanation of the newcomer's run (#33 item 17) prints no negative remainder.
  const auto k = run_json(
      "plan --model llama2-70b --nodes 64 --global-batch 1000 --seq 4096 --threads 1 "
      "--no-heuristic-compare --top 2 --out-dir " +
          dir + "/k",
      dir + "/k.json", &out);
  ASSERT_FALSE(k.is_null());
  const std::string why = k["explanation"].get<std::string>();
  EXPECT_EQ(why.find("remaining -"), std::string::npos) << why;
  EXPECT_EQ(why.find("by -"), std::string::npos) << why;
  const std::string f64 = run("plan --model llama2-7b --global-batch 8 --dtype f64", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(f64.find("--dtype"), std::string::npos) << f64;
  // Bad input from the command line: one line naming the value.
  const std::string bad = run("plan --model no-such-model --global-batch 8", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(bad.find("no-such-model"), std::string::npos) << bad;
  const std::string zero = run("plan --model llama2-7b --global-batch 0", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(zero.find("--global-batch"), std::string::npos) << zero;
}

}  // namespace
}  // namespace cocemu::bench
