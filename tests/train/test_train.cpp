// The training step (R-TR-1..8): pipeline schedules, gradient buckets, the distributed
// optimizer, recompute and CoC strategies change the modeled timeline, never the bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>

#include <fmt/format.h>

#include "cocemu/runtime/error.h"
#include "cocemu/train/trainer.h"

namespace cocemu::layers::train {
namespace {

DecoderShape tiny() {
  DecoderShape m;
  m.hidden = 32;
  m.heads = 4;
  m.kv_heads = 2;
  m.ffn = 64;
  m.num_layers = 4;
  m.vocab = 200;
  m.seq = 16;
  return m;
}

TrainOptions options(int tp, int dp, int pp, PipelineSchedule s = PipelineSchedule::one_f_one_b,
                     int vpp = 1) {
  TrainOptions o;
  o.model = tiny();
  o.layout.tp = tp;
  o.layout.dp = dp;
  o.layout.pp = pp;
  o.layout.vpp = vpp;
  o.layout.schedule = s;
  o.layout.micro_batch_size = 2;
  o.layout.global_batch_size = 8 * dp;
  o.layout.dtype = DType::f32;
  o.layout.bucket_mb = 0.004;  // several buckets even for the tiny model
  o.iterations = 3;
  return o;
}

TEST(Train, LossFallsAndIsFinite) {
  TrainOptions o = options(2, 2, 2);
  o.iterations = 8;
  o.adam.lr = 1e-2;
  const auto r = train(o, {});
  ASSERT_EQ(r.loss.size(), 8u);
  for (double l : r.loss)
    EXPECT_TRUE(std::isfinite(l));
  // Cross-entropy of an untrained model over a 256-entry padded vocabulary: about ln 256.
  EXPECT_NEAR(r.loss[0], std::log(256.0), 0.5);
  EXPECT_LT(r.loss[7], r.loss[0] - 0.2);
  for (double g : r.grad_norm)
    EXPECT_GT(g, 0);
  for (double l : r.loss)
    std::printf("%.4f ", l);
  std::printf("(loss per iteration)\n");
  EXPECT_FALSE(r.weights.empty());
}

}  // namespace
}  // namespace cocemu::layers::train

namespace cocemu::layers::train {
namespace {

struct Variant {
  std::string name;
  TrainOptions o;
};

void expect_same_training(const TrainResult& want, const TrainResult& got,
                          const std::string& what) {
  ASSERT_EQ(want.loss.size(), got.loss.size()) << what;
  for (std::size_t i = 0; i < want.loss.size(); ++i)
    EXPECT_EQ(want.loss[i], got.loss[i]) << what << ": loss of iteration " << i;
  ASSERT_EQ(want.weights.size(), got.weights.size()) << what;
  for (const auto& [name, w] : want.weights) {
    const auto it = got.weights.find(name);
    ASSERT_NE(it, got.weights.end()) << what << ": " << name;
    EXPECT_TRUE(w.bitwise_equal(it->second)) << what << ": " << name << " differs";
  }
}

// R-TR-8: for a fixed tp × dp, every pipeline layout, schedule, recompute, optimizer sharding,
// CoC strategy and schedule seed gives bitwise the same losses and updated weights.
TEST(TrainTruth, BitwiseIdenticalAcrossLayouts) {
  const int tp = 2, dp = 2;
  const TrainOptions base = options(tp, dp, 1, PipelineSchedule::gpipe);
  const TrainResult want = train(base, {});
  std::vector<Variant> variants;
  auto add = [&](std::string name, auto edit) {
    TrainOptions o = base;
    edit(o);
    variants.push_back({std::move(name), o});
  };
  add("pp2 1f1b", [](TrainOptions& o) {
    o.layout.pp = 2;
    o.layout.schedule = PipelineSchedule::one_f_one_b;
  });
  add("pp2 gpipe", [](TrainOptions& o) { o.layout.pp = 2; });
  add("pp2 1f1b, uneven stages", [](TrainOptions& o) {
    o.layout.pp = 2;
    o.layout.schedule = PipelineSchedule::one_f_one_b;
    o.layout.stage_layers = {1, 3};
  });
  add("pp2 interleaved vpp2", [](TrainOptions& o) {
    o.layout.pp = 2;
    o.layout.vpp = 2;
    o.layout.schedule = PipelineSchedule::interleaved;
  });
  add("pp2 1f1b full recompute", [](TrainOptions& o) {
    o.layout.pp = 2;
    o.layout.schedule = PipelineSchedule::one_f_one_b;
    o.layout.recompute = Recompute::full;
  });
  add("dist-opt", [](TrainOptions& o) { o.layout.distributed_optimizer = true; });
  add("pp2 selective recompute", [](TrainOptions& o) {
    o.layout.pp = 2;
    o.layout.schedule = PipelineSchedule::one_f_one_b;
    o.layout.recompute = Recompute::selective;
  });
  add("pp2 dist-opt one bucket", [](TrainOptions& o) {
    o.layout.pp = 2;
    o.layout.distributed_optimizer = true;
    o.layout.bucket_mb = 1000;
  });
  add("pp2 interleaved dist-opt, param all-gathers overlap the forward", [](TrainOptions& o) {
    o.layout.pp = 2;
    o.layout.vpp = 2;
    o.layout.schedule = PipelineSchedule::interleaved;
    o.layout.distributed_optimizer = true;
    o.layout.overlap_param_gather = true;
    o.layout.bucket_params = 2;
  });
  add("bucket per parameter", [](TrainOptions& o) { o.layout.bucket_params = 1; });
  add("reductions after the backward", [](TrainOptions& o) {
    o.layout.bucket_params = 2;
    o.layout.overlap_grad_reduce = false;
  });
  add("no sequence parallel", [](TrainOptions& o) { o.layout.sequence_parallel = false; });
  add("pp2 1f1b, pipeline tensors as TP slices, all-gathered", [](TrainOptions& o) {
    o.layout.pp = 2;
    o.layout.schedule = PipelineSchedule::one_f_one_b;
    o.layout.sequence_parallel = false;
    o.layout.scatter_gather_tensors_in_pipeline = true;
  });
  add("fused cross-entropy", [](TrainOptions& o) { o.layout.cross_entropy_fusion = true; });
  add("script P=2", [](TrainOptions& o) {
    o.linear.strategy = Strategy::script;
    o.linear.parallel_num = 2;
  });
  add("fused", [](TrainOptions& o) {
    o.linear.strategy = Strategy::fused;
    o.linear.tile_rows = 8;
  });
  add("pp2 1f1b fused", [](TrainOptions& o) {
    o.layout.pp = 2;
    o.layout.schedule = PipelineSchedule::one_f_one_b;
    o.linear.strategy = Strategy::fused;
    o.linear.tile_rows = 8;
  });
  for (auto& v : variants) {
    SCOPED_TRACE(v.name);
    expect_same_training(want, train(v.o, {}), v.name);
  }
  // Schedule seeds permute the threads' interleaving, not the results.
  WorldOptions seeded;
  seeded.schedule_seed = 12345;
  TrainOptions pp2 = base;
  pp2.layout.pp = 2;
  pp2.layout.schedule = PipelineSchedule::one_f_one_b;
  expect_same_training(want, train(pp2, seeded), "schedule seed");
  // With context parallelism (a fixed cp = 2): pipeline layouts, recompute and sharding.
  TrainOptions cp2 = base;
  cp2.layout.cp = 2;
  cp2.layout.dp = 1;
  cp2.layout.global_batch_size = 8;
  cp2.model.seq = 16;
  const TrainResult want_cp = train(cp2, {});
  for (auto edit : std::vector<std::function<void(TrainOptions&)>>{
           [](TrainOptions& o) {
             o.layout.pp = 2;
             o.layout.schedule = PipelineSchedule::one_f_one_b;
           },
           [](TrainOptions& o) {
             o.layout.pp = 2;
             o.layout.recompute = Recompute::selective;
             o.layout.distributed_optimizer = true;
           },
           [](TrainOptions& o) { o.layout.recompute = Recompute::full; }}) {
    TrainOptions o = cp2;
    edit(o);
    expect_same_training(want_cp, train(o, {}), "cp2 " + o.layout.describe());
  }
  // With multi-copy (micro_batch_interleave_num 2, a fixed number of copies) too.
  TrainOptions copies = base;
  copies.layout.micro_batch_interleave = 2;
  const TrainResult want_copies = train(copies, {});
  for (auto edit : std::vector<std::function<void(TrainOptions&)>>{
           [](TrainOptions& o) {
             o.layout.pp = 2;
             o.layout.schedule = PipelineSchedule::one_f_one_b;
             o.layout.distributed_optimizer = true;
           },
           [](TrainOptions& o) {
             o.linear.strategy = Strategy::fused;
             o.linear.tile_rows = 8;
             o.layout.recompute = Recompute::full;
           },
           [](TrainOptions& o) {
             o.layout.distributed_optimizer = true;
             o.layout.overlap_param_gather = true;
           }}) {
    TrainOptions o = copies;
    edit(o);
    expect_same_training(want_copies, train(o, {}), "copies " + o.layout.describe());
  }
  // The comparison can fail: another learning rate changes the weights after one step.
  TrainOptions other = base;
  other.adam.lr *= 1.5;
  const TrainResult changed = train(other, {});
  EXPECT_EQ(changed.loss[0], want.loss[0]);  // the first loss is before any update
  EXPECT_NE(changed.loss[1], want.loss[1]);
  int differing = 0;
  for (const auto& [name, w] : want.weights)
    differing += !w.bitwise_equal(changed.weights.at(name));
  EXPECT_EQ(differing, int(want.weights.size()));
}

}  // namespace
}  // namespace cocemu::layers::train

namespace cocemu::layers::train {
namespace {

// grad_reduce_in_fp32 false (2021 Megatron's fp16 runs): each bucket is reduced in the 16-bit
// dtype. The first loss is before any update and stays; the reduced gradients are rounded, so
// the gradient norm moves by about bf16's precision and the weights after the update move; and
// the result is still the same bits whatever the pipeline layout, sharding or schedule seed.
TEST(TrainTruth, SixteenBitGradientReductionRoundsTheSameWayInEveryLayout) {
  TrainOptions wide = options(1, 2, 1);
  wide.layout.dtype = DType::bf16;
  wide.iterations = 2;
  TrainOptions narrow = wide;
  narrow.layout.grad_reduce_in_fp32 = false;
  const TrainResult a = train(wide, {}), b = train(narrow, {});
  ASSERT_EQ(a.loss.size(), 2u);
  EXPECT_EQ(a.loss[0], b.loss[0]);
  EXPECT_NE(a.grad_norm[0], b.grad_norm[0]);
  EXPECT_NEAR(b.grad_norm[0] / a.grad_norm[0], 1.0, 1.0 / 128);
  int differing = 0;
  for (const auto& [name, w] : a.weights)
    differing += !w.bitwise_equal(b.weights.at(name));
  EXPECT_GT(differing, 0);
  for (auto edit : std::vector<std::function<void(TrainOptions&)>>{
           [](TrainOptions& o) {
             o.layout.pp = 2;
             o.layout.schedule = PipelineSchedule::one_f_one_b;
           },
           [](TrainOptions& o) { o.layout.distributed_optimizer = true; },
           [](TrainOptions& o) {
             o.layout.pp = 2;
             o.layout.vpp = 2;
             o.layout.schedule = PipelineSchedule::interleaved;
             o.layout.bucket_params = 3;
           }}) {
    TrainOptions o = narrow;
    edit(o);
    expect_same_training(b, train(o, {}), "16-bit reduction, " + o.layout.describe());
  }
  WorldOptions seeded;
  seeded.schedule_seed = 777;
  expect_same_training(b, train(narrow, seeded), "16-bit reduction, schedule seed");
}

}  // namespace
}  // namespace cocemu::layers::train

#include "reference_model.h"

namespace cocemu::layers::train {
namespace {

/// max |a − b| / max |b| over a tensor.
double rel_diff(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 0;
  for (std::int64_t i = 0; i < b.numel(); ++i) {
    diff = std::max(diff, std::abs(a.item(i) - b.item(i)));
    scale = std::max(scale, std::abs(b.item(i)));
  }
  return diff / scale;
}

// R-TR-8: changing tp, dp or pp changes how sums are split; in f64 every layout equals a plain
// single-rank f64 implementation within 1e-12.
TEST(TrainTruth, F64MatchesThePlainSingleRankReference) {
  struct L {
    int tp, dp, pp, cp;
    bool dist_opt;
    std::string cp_algo = "megatron_cp_algo";
    int copies = 1;
    std::int64_t heads = 4;
  };
  for (const L& c :
       {L{1, 1, 1, 1, false}, L{2, 2, 1, 1, false}, L{4, 1, 2, 1, true}, L{2, 2, 2, 1, true},
        L{1, 4, 2, 1, false}, L{1, 1, 1, 2, false}, L{2, 1, 2, 2, true},
        L{1, 2, 1, 2, false, "ulysses_cp_algo"}, L{1, 1, 1, 4, false, "hybrid_cp_algo"},
        // Multi-copy: the copies' losses add up (MindSpore's MicroBatchInterleaved).
        L{2, 2, 1, 1, false, "megatron_cp_algo", 2}, L{1, 1, 2, 1, true, "megatron_cp_algo", 2},
        // MindSpeed's head rules on the model's heads: 8 % (tp 2 × cp 4) and 4 % (Ulysses 2 ×
        // tp 2); one KV head per TP rank is repeated over the Ulysses group.
        L{2, 1, 1, 4, false, "ulysses_cp_algo", 1, 8}, L{2, 1, 1, 4, false, "hybrid_cp_algo"}}) {
    SCOPED_TRACE(fmt::format("tp{} cp{} dp{} pp{} {} copies {} heads {}", c.tp, c.cp, c.dp, c.pp,
                             c.cp_algo, c.copies, c.heads));
    TrainOptions o = options(c.tp, c.dp, c.pp);
    o.model.heads = c.heads;
    o.layout.cp = c.cp;
    o.layout.cp_algo = c.cp_algo;
    if (c.cp_algo == "hybrid_cp_algo") o.layout.ulysses_degree_in_cp = 2;
    o.layout.dtype = DType::f64;
    o.layout.global_batch_size = 8;
    o.layout.micro_batch_size = 8 / (c.dp * std::max(2, c.pp));
    o.layout.micro_batch_interleave = c.copies;
    o.model.seq = 8 * c.cp;  // 2·cp chunks of the load-balanced causal split
    o.layout.distributed_optimizer = c.dist_opt;
    o.model.kv_heads = c.tp == 4 ? 4 : 2;  // KV groups divisible by tp
    o.iterations = 2;
    const auto want = reference::train_reference(o);
    const auto got = train(o, {});
    ASSERT_EQ(got.loss.size(), want.loss.size());
    for (std::size_t i = 0; i < want.loss.size(); ++i)
      EXPECT_LE(std::abs(got.loss[i] - want.loss[i]), 1e-12 * std::abs(want.loss[i]));
    ASSERT_EQ(got.grad_norm.size(), want.grad_norm.size());
    for (std::size_t i = 0; i < want.grad_norm.size(); ++i)
      EXPECT_LE(std::abs(got.grad_norm[i] - want.grad_norm[i]), 1e-12 * want.grad_norm[i])
          << "grad norm of iteration " << i << ": " << got.grad_norm[i] << " vs "
          << want.grad_norm[i];
    ASSERT_EQ(got.weights.size(), want.shards.size());
    for (const auto& [name, w] : want.shards)
      EXPECT_LE(rel_diff(got.weights.at(name), w), 1e-12) << name;
  }
}

}  // namespace
}  // namespace cocemu::layers::train

namespace cocemu::layers::train {
namespace {

// R-TR-8, f32 (README, "How far f32 may drift"): against the f64 reference, the first loss is
// within λ·D·√k·u relative (Higham & Mary's probabilistic rounding bound, λ = 4, over D rounding
// stages of reductions of at most k terms), and after one Adam step every weight within
// 2·lr + 2u·|w| (an Adam first step moves a weight by less than lr, whatever the gradient).
TEST(TrainTruth, F32StaysWithinTheDerivedBound) {
  struct L {
    int tp, dp, pp;
  };
  for (const L& c : {L{1, 1, 1}, L{2, 2, 2}, L{4, 1, 2}, L{1, 4, 2}}) {
    SCOPED_TRACE(fmt::format("tp{} dp{} pp{}", c.tp, c.dp, c.pp));
    TrainOptions o = options(c.tp, c.dp, c.pp);
    o.model.kv_heads = c.tp == 4 ? 4 : 2;
    o.layout.dtype = DType::f32;
    o.layout.global_batch_size = 8;
    o.layout.micro_batch_size = 8 / (c.dp * std::max(2, c.pp));
    o.iterations = 1;
    const auto want = reference::train_reference(o);
    const auto got = train(o, {});
    const double u = std::ldexp(1.0, -24), lambda = 4;
    const double stages = 12.0 * double(o.model.num_layers) + 6;
    const double k = double(std::max({o.model.hidden, o.model.ffn, o.model.seq}));
    const double loss_bound = lambda * stages * std::sqrt(k) * u;
    const double loss_rel = std::abs(got.loss[0] - want.loss[0]) / want.loss[0];
    EXPECT_LE(loss_rel, loss_bound);
    std::printf("tp%d dp%d pp%d: f32 loss relative error %.3g (bound %.3g)\n", c.tp, c.dp, c.pp,
                loss_rel, loss_bound);
    double worst_all = 0;
    for (const auto& [name, w] : want.shards) {
      const Tensor& g = got.weights.at(name);
      double worst = 0;
      for (std::int64_t i = 0; i < w.numel(); ++i) {
        const double bound = 2 * o.adam.lr + 2 * u * std::abs(w.item(i));
        worst = std::max(worst, std::abs(g.item(i) - w.item(i)) / bound);
      }
      EXPECT_LE(worst, 1.0) << name;
      worst_all = std::max(worst_all, worst);
    }
    std::printf("  weights after one step: worst |Δw| / bound = %.3g\n", worst_all);
  }
}

}  // namespace
}  // namespace cocemu::layers::train
