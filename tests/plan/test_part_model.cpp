// The step's parts priced from the cost model (no threads) against the emulated parts (dry run
// of the layer code on one TP×CP group): the price `cocemu plan` ranks candidates with must track
// what the emulator would charge.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "cocemu/layers/coc_config.h"
#include "cocemu/runtime/profile.h"
#include "cocemu/train/part_model.h"
#include "cocemu/train/trainer.h"

namespace cocemu::bench {
namespace {

using layers::Strategy;
using layers::train::Recompute;

layers::train::DecoderShape mid_model() {
  layers::train::DecoderShape m;
  m.name = "mid";
  m.hidden = 4096;
  m.heads = 32;
  m.kv_heads = 8;
  m.ffn = 11008;
  m.num_layers = 1;
  m.vocab = 32000;
  m.seq = 4096;
  return m;
}

struct Case {
  int tp;
  bool sp;
  Strategy coc;
  int parallel_num;
  Recompute recompute;
  int cp = 1;
  std::string cp_algo = "megatron_cp_algo";
  int copies = 1;
  std::int64_t mbs = 1;
};

TrainSetup setup_for(const Case& c) {
  TrainSetup s;
  s.dry_run = true;
  s.profile = std::make_shared<const DeviceProfile>(load_named_profile("ascend-910b"));
  auto& o = s.options;
  o.model = mid_model();
  auto& l = o.layout;
  l.tp = c.tp;
  l.cp = c.cp;
  l.cp_algo = c.cp_algo;
  l.sequence_parallel = c.sp;
  l.recompute = c.recompute;
  l.micro_batch_interleave = c.copies;
  l.micro_batch_size = c.mbs;
  l.global_batch_size = c.mbs;
  layers::CocConfig coc;
  coc.tile_rows = 32;
  o.linear = layers::options_for(coc, c.coc, c.parallel_num);
  return s;
}

TEST(PartModel, TracksTheEmulatedParts) {
  const std::vector<Case> cases{
      {8, true, Strategy::serial, 1, Recompute::none},
      {8, true, Strategy::script, 4, Recompute::none},
      {8, true, Strategy::fused, 1, Recompute::none},
      {8, false, Strategy::serial, 1, Recompute::none},
      {8, false, Strategy::script, 2, Recompute::selective},
      {8, false, Strategy::fused, 1, Recompute::none},
      {4, true, Strategy::serial, 1, Recompute::full},
      {2, true, Strategy::script, 8, Recompute::none},
      {1, false, Strategy::serial, 1, Recompute::none},
      {4, true, Strategy::serial, 1, Recompute::none, 2},
      {2, true, Strategy::serial, 1, Recompute::selective, 4, "ulysses_cp_algo"},
      // 2 KV heads per TP rank over cp 4: MindSpeed repeats them to the query heads, and K and
      // V travel at the query heads' width.
      {4, true, Strategy::serial, 1, Recompute::none, 4, "ulysses_cp_algo"},
      {8, true, Strategy::serial, 1, Recompute::none, 1, "megatron_cp_algo", 2, 2},
  };
  double worst_layer = 0, worst_other = 0;
  for (const Case& c : cases) {
    const TrainSetup s = setup_for(c);
    const StepParts priced = price_parts(s), emulated = emulate_parts(s);
    const std::string what = s.options.layout.describe() + " " + s.options.layout.cp_algo;
    auto near = [&](const char* part, const PartCost& p, const PartCost& e, double tol) {
      (std::string(part).rfind("layer", 0) == 0 ? worst_layer : worst_other) =
          std::max(std::string(part).rfind("layer", 0) == 0 ? worst_layer : worst_other,
                   std::abs(p.ns / e.ns - 1));
      // Exposed communication as the emulated report counts it (comm time no compute covers);
      // two copies cover each other's in ways the pairing rule does not model.
      if (c.copies == 1) {
        EXPECT_NEAR(p.exposed_tp_ns, e.exposed_tp_ns, 0.02 * e.ns) << what << " " << part;
        EXPECT_NEAR(p.exposed_cp_ns, e.exposed_cp_ns, 0.02 * e.ns) << what << " " << part;
      }
      EXPECT_NEAR(p.ns / e.ns, 1.0, tol)
          << what << " " << part << ": priced " << p.ns << " ns, emulated " << e.ns << " ns";
    };
    near("layer fwd", priced.layer_fwd, emulated.layer_fwd, 0.05);
    near("layer bwd", priced.layer_bwd, emulated.layer_bwd, 0.05);
    near("loss fwd", priced.loss_fwd, emulated.loss_fwd, 0.15);
    near("loss bwd", priced.loss_bwd, emulated.loss_bwd, 0.15);
    near("embedding fwd", priced.embedding_fwd, emulated.embedding_fwd, 0.15);
    near("embedding bwd", priced.embedding_bwd, emulated.embedding_bwd, 0.15);
  }
  std::printf(
      "part model vs emulated, %zu layouts: layer parts within %.1f%%, embedding and loss "
      "within %.1f%%\n",
      cases.size(), 100 * worst_layer, 100 * worst_other);
}

// The check can fail: a different CoC strategy prices differently, and the emulator agrees on
// which is faster.
TEST(PartModel, RanksStrategiesAsTheEmulatorDoes) {
  const TrainSetup serial = setup_for({8, true, Strategy::serial, 1, Recompute::none}),
                   fused = setup_for({8, true, Strategy::fused, 1, Recompute::none});
  const double ps = price_parts(serial).layer_fwd.ns, pf = price_parts(fused).layer_fwd.ns;
  const double es = emulate_parts(serial).layer_fwd.ns, ef = emulate_parts(fused).layer_fwd.ns;
  EXPECT_GT(ps, pf * 1.05);
  EXPECT_EQ(ps > pf, es > ef);
}

// The ranks of a causal ring do different blocks: the first sees every later rank's block cut to
// half its queries (more keys per row, a faster kernel), the last every earlier rank's cut to
// half its keys. A part costs what it costs on its slowest rank, so the emulated layer is the
// longest of the ranks' spans, and longer than the first rank's.
TEST(PartModel, EmulatedPartsAreTheSlowestRanks) {
  const TrainSetup s = setup_for({4, true, Strategy::serial, 1, Recompute::none, 2});
  const StepParts emulated = emulate_parts(s);
  layers::train::TrainOptions o = s.options;
  o.iterations = 1;
  o.record_pieces = true;
  o.layout.overlap_grad_reduce = false;
  o.layout.overlap_param_gather = false;
  WorldOptions w;
  w.profile = s.profile;
  w.numerics = false;
  const auto r = layers::train::train(o, w);
  std::map<int, double> span;  // "layer fwd" per rank: its stream ops, first start to last end
  for (const auto& p : r.pieces) {
    if (p.what != "layer fwd") continue;
    std::int64_t lo = INT64_MAX, hi = 0;
    for (std::uint32_t i = p.first_op; i < p.end_op; ++i) {
      const OpRecord& op = r.run.graph.ranks[std::size_t(p.rank)].ops[i];
      if (op.lane == 0 || op.cls == OpClass::host || op.cls == OpClass::wait) continue;
      const ScheduledOp& t = r.run.timeline.rank(p.rank)[i];
      lo = std::min(lo, t.start_ns);
      hi = std::max(hi, t.end_ns);
    }
    span[p.rank] = double(hi - lo);
  }
  ASSERT_EQ(span.size(), 8u);  // tp 4 × cp 2
  double slowest = 0;
  for (const auto& [rank, ns] : span)
    slowest = std::max(slowest, ns);
  EXPECT_DOUBLE_EQ(emulated.layer_fwd.ns, slowest);
  EXPECT_GT(slowest, span[0] * 1.001);
}

// Tuning picks, per [m, k, n], the fastest strategy; the tuned parts are no slower than any
// uniform strategy, and the chosen config replays in the emulator at the priced time.
TEST(PartModel, TunedPerShapeIsNoSlowerThanAnyUniformStrategy) {
  const TrainSetup base = setup_for({8, true, Strategy::serial, 1, Recompute::none});
  std::map<std::string, int> tuned;
  const StepParts t = price_parts(base, &tuned);
  ASSERT_FALSE(tuned.empty());
  for (const auto& [strategy, p] : std::vector<std::pair<Strategy, int>>{{Strategy::serial, 1},
                                                                         {Strategy::script, 2},
                                                                         {Strategy::script, 8},
                                                                         {Strategy::fused, 1}}) {
    const StepParts u = price_parts(setup_for({8, true, strategy, p, Recompute::none}));
    EXPECT_LE(t.layer_fwd.ns + t.layer_bwd.ns, u.layer_fwd.ns + u.layer_bwd.ns + 1);
  }
  TrainSetup replay = base;
  layers::CocConfig coc;
  coc.tile_rows = 32;
  coc.customized_coc = tuned;
  replay.options.linear = layers::options_for(coc, Strategy::serial, 1);
  replay.options.linear.per_shape = std::make_shared<const layers::CocConfig>(coc);
  const StepParts e = emulate_parts(replay);
  EXPECT_NEAR(t.layer_fwd.ns / e.layer_fwd.ns, 1.0, 0.05);
  EXPECT_NEAR(t.layer_bwd.ns / e.layer_bwd.ns, 1.0, 0.05);
}

}  // namespace
}  // namespace cocemu::bench
