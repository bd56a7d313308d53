// The training step (R-TR-1..8): pipeline schedules, gradient buckets, the distributed
// optimizer, recompute and CoC strategies change the modeled timeline, never the bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "cocemu/layers/train/trainer.h"
#include "cocemu/runtime/error.h"

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
  const auto r = train(options(2, 2, 2), {});
  ASSERT_EQ(r.loss.size(), 3u);
  for (double l : r.loss)
    EXPECT_TRUE(std::isfinite(l));
  // Cross-entropy of an untrained model over a 256-entry padded vocabulary: about ln 256.
  EXPECT_NEAR(r.loss[0], std::log(256.0), 0.5);
  EXPECT_LT(r.loss[2], r.loss[0]);
  for (double g : r.grad_norm)
    EXPECT_GT(g, 0);
  std::printf("loss %.6f %.6f %.6f, grad norm %.4f\n", r.loss[0], r.loss[1], r.loss[2],
              r.grad_norm[0]);
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
  add("pp2 dist-opt one bucket", [](TrainOptions& o) {
    o.layout.pp = 2;
    o.layout.distributed_optimizer = true;
    o.layout.bucket_mb = 1000;
  });
  add("bucket per parameter", [](TrainOptions& o) { o.layout.bucket_params = 1; });
  add("no sequence parallel", [](TrainOptions& o) { o.layout.sequence_parallel = false; });
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
