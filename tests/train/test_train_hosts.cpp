// A training step on several hosts (runtime/hosts.h, joined in process by the loopback
// transport): the same losses, norms, weights and modeled timeline as on one host, whichever
// groups cross between hosts (pipeline p2p, data-parallel reductions, the distributed
// optimizer's all-gathers) — the path `mpirun -n H cocemu train` takes with MPI.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "cocemu/runtime/error.h"
#include "cocemu/train/trainer.h"
#include "testing.h"

namespace cocemu::layers::train {
namespace {

TrainOptions eight_ranks(int tp, int dp, int pp) {
  TrainOptions o;
  o.model.hidden = 32;
  o.model.heads = 4;
  o.model.kv_heads = 2;
  o.model.ffn = 64;
  o.model.num_layers = 4;
  o.model.vocab = 200;
  o.model.seq = 16;
  o.layout.tp = tp;
  o.layout.dp = dp;
  o.layout.pp = pp;
  o.layout.micro_batch_size = 2;
  o.layout.global_batch_size = 4 * dp;
  o.layout.dtype = DType::f32;
  o.layout.bucket_mb = 0.004;  // several buckets
  o.iterations = 2;
  return o;
}

/// `train` on `hosts` in-process hosts; each host's result.
std::vector<TrainResult> train_on_hosts(const TrainOptions& o, int hosts, bool numerics = true) {
  return testing::on_loopback_hosts<TrainResult>(hosts, [&](std::shared_ptr<HostLink> link) {
    WorldOptions w;
    w.hosts = std::move(link);
    w.numerics = numerics;
    return train(o, w);
  });
}

void expect_same(const TrainResult& want, const TrainResult& got, const std::string& what) {
  ASSERT_EQ(want.loss.size(), got.loss.size()) << what;
  for (std::size_t i = 0; i < want.loss.size(); ++i) {
    EXPECT_EQ(std::memcmp(&want.loss[i], &got.loss[i], sizeof(double)), 0)
        << what << ": loss " << i << " " << want.loss[i] << " vs " << got.loss[i];
    EXPECT_EQ(std::memcmp(&want.grad_norm[i], &got.grad_norm[i], sizeof(double)), 0)
        << what << ": grad norm " << i;
  }
  ASSERT_EQ(want.weights.size(), got.weights.size()) << what;
  for (const auto& [name, t] : want.weights) {
    const auto it = got.weights.find(name);
    ASSERT_NE(it, got.weights.end()) << what << ": " << name;
    ASSERT_EQ(t.nbytes(), it->second.nbytes()) << what << ": " << name;
    EXPECT_EQ(std::memcmp(t.raw(), it->second.raw(), t.nbytes()), 0) << what << ": " << name;
  }
  EXPECT_EQ(want.run.timeline.makespan_ns(), got.run.timeline.makespan_ns()) << what;
  ASSERT_EQ(want.run.timeline.n_ranks(), got.run.timeline.n_ranks()) << what;
  for (int r = 0; r < want.run.timeline.n_ranks(); ++r) {
    const auto& a = want.run.timeline.rank(r);
    const auto& b = got.run.timeline.rank(r);
    ASSERT_EQ(a.size(), b.size()) << what << ": rank " << r;
    for (std::size_t i = 0; i < a.size(); ++i)
      ASSERT_TRUE(a[i].start_ns == b[i].start_ns && a[i].end_ns == b[i].end_ns)
          << what << ": rank " << r << " op " << i;
  }
}

struct Case {
  const char* name;
  int tp, dp, pp;
  bool distributed_optimizer;
  Strategy coc;
};

TEST(TrainHosts, SameStepOnOneTwoAndFourHosts) {
  // pp2: the pipeline's sends cross between hosts of 4; dp4: the gradient reductions do; the
  // distributed optimizer adds reduce-scatters and all-gathers across them; fused CoC keeps
  // its symmetric memory inside a host (tp 2).
  for (const Case& c : {Case{"tp2 dp2 pp2", 2, 2, 2, false, Strategy::serial},
                        Case{"tp2 dp4, distributed optimizer", 2, 4, 1, true, Strategy::serial},
                        Case{"tp2 dp4, fused CoC", 2, 4, 1, false, Strategy::fused}}) {
    TrainOptions o = eight_ranks(c.tp, c.dp, c.pp);
    o.layout.distributed_optimizer = c.distributed_optimizer;
    o.linear.strategy = c.coc;
    const TrainResult one = train(o, {});
    ASSERT_FALSE(one.weights.empty()) << c.name;
    for (const int hosts : {2, 4}) {
      const auto results = train_on_hosts(o, hosts);
      for (int h = 0; h < hosts; ++h)
        expect_same(one, results[std::size_t(h)],
                    fmt::format("{} on host {} of {}", c.name, h, hosts));
    }
  }
}

TEST(TrainHosts, ADryRunOnTwoHostsHasOneHostsTimeline) {
  TrainOptions o = eight_ranks(2, 2, 2);
  o.model.hidden = 4096;  // full-size shapes cost nothing without numerics
  o.model.ffn = 11008;
  o.model.heads = o.model.kv_heads = 32;
  o.model.seq = 4096;
  o.model.vocab = 32000;
  WorldOptions dry;
  dry.numerics = false;
  const TrainResult one = train(o, dry);
  for (const TrainResult& r : train_on_hosts(o, 2, false))
    expect_same(one, r, "dry run, 2 hosts");
}

TEST(TrainHosts, TensorParallelAcrossHostsWithFusedCocIsRefused) {
  TrainOptions o = eight_ranks(8, 1, 1);
  o.model.heads = 8;
  o.model.kv_heads = 8;
  o.linear.strategy = Strategy::fused;
  try {
    train_on_hosts(o, 2);
    FAIL() << "a fused kernel on a group across hosts ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("spans hosts"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cocemu::layers::train
