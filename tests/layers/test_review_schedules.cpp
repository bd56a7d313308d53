// Regressions of the schedule and pricing review (issue "Eleven verified defects"), layers part:
// each test pins the real systems' op order or price on a round-number profile, with the
// arithmetic worked out beside it, and failed before the fix.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <new>
#include <thread>

#include "cocemu/collectives/ops.h"
#include "cocemu/layers/fused_kernels.h"
#include "cocemu/layers/linear.h"
#include "cocemu/layers/transformer.h"
#include "cocemu/runtime/cost_model.h"
#include "testing.h"

namespace cocemu::layers {
namespace {

/// The first device op (not its host launch) on `rank` whose name contains `part` (fails the test
/// if there is none).
const OpRecord& op_named(const RunResult& r, int rank, const std::string& part) {
  for (const OpRecord& op : r.graph.ranks[std::size_t(rank)].ops)
    if (op.lane != 0 && op.name.find(part) != std::string::npos) return op;
  ADD_FAILURE() << "no op named '" << part << "' on rank " << rank;
  return r.graph.ranks[std::size_t(rank)].ops.front();
}

Tensor filled(const Shape& shape, double v) {
  return Tensor::from<double>(shape, std::vector<double>(std::size_t(shape.numel()), v),
                              DType::f32);
}

ScheduledOp when(const RunResult& r, const OpRecord& op) {
  return r.timeline.at({op.rank, op.index});
}

int count_named(const RunResult& r, int rank, const std::string& part) {
  int n = 0;
  for (const OpRecord& op : r.graph.ranks[std::size_t(rank)].ops)
    n += op.lane != 0 && op.name.find(part) != std::string::npos;
  return n;
}

WorldOptions dry(const std::string& profile_overrides = "") {
  WorldOptions wo;
  wo.numerics = false;
  wo.profile = cocemu::testing::round_profile(profile_overrides);
  return wo;
}

// 1. Megatron's and MindSpeed's SP column backward: all_gather(x) ∥ dgrad; wait AG; issue the
// reduce_scatter async; wgrad; wait RS. 2 ranks, m = 1000 (500 local rows), k = 100, n/tp = 2000,
// f32, 1 TFLOP/s, links 1 B/ns:
//   AG   reads 500·100·4 B from the peer          = 200000 ns  [0, 200000]
//   dgrad 2·1000·2000·100 flop                     = 400000 ns  [0, 400000]
//   RS   reads 500·100·4 B                         = 200000 ns  [400000, 600000]
//   wgrad 2·2000·1000·100 flop                     = 400000 ns  [400000, 800000]
// Before the fix the wgrad waited for the RS and started at 600000.
TEST(ReviewSchedules, ColumnBackwardWeightGradientOverlapsTheReduceScatter) {
  for (Strategy s : {Strategy::serial, Strategy::script}) {
    const RunResult r = cocemu::testing::run_ranks(
        2,
        [&](Rank& rank) {
          Group tp = Group::world(rank);
          ColumnParallelLinear layer(tp, Tensor::shape_only({2000, 100}, DType::f32), Tensor(),
                                     true);
          const LinearOptions o{.strategy = s, .parallel_num = 2};
          layer.forward(Tensor::shape_only({500, 100}, DType::f32), o);
          layer.backward(Tensor::shape_only({1000, 2000}, DType::f32), o);
        },
        dry());
    // Times from the backward's start (the forward's last op).
    const std::int64_t t0 = when(r, op_named(r, 0, "column bwd grad-input matmul")).start_ns;
    const ScheduledOp wgrad = when(r, op_named(r, 0, "column bwd wgrad"));
    const ScheduledOp rs = when(r, op_named(r, 0, "reduce_scatter column bwd"));
    const ScheduledOp ag = when(r, op_named(r, 0, "column bwd re-gather"));
    EXPECT_EQ(ag.start_ns - t0, 0) << to_string(s);
    EXPECT_EQ(ag.end_ns - t0, 200000) << to_string(s);
    EXPECT_EQ(rs.start_ns - t0, 400000) << to_string(s);
    EXPECT_EQ(rs.end_ns - t0, 600000) << to_string(s);
    EXPECT_EQ(wgrad.start_ns - t0, 400000) << to_string(s);
    EXPECT_EQ(wgrad.end_ns - t0, 800000) << to_string(s);
  }
}

// 5. Script column forward: the gathered input is reordered back only when it is kept
// (recompute_all_gather off); the output is always reordered.
TEST(ReviewSchedules, ScriptColumnForwardReordersTheGatheredInputOnlyWhenKept) {
  for (bool recompute : {true, false}) {
    const RunResult r = cocemu::testing::run_ranks(
        2,
        [&](Rank& rank) {
          Group tp = Group::world(rank);
          ColumnParallelLinear layer(tp, Tensor::shape_only({64, 32}, DType::f32), Tensor(), true);
          layer.forward(
              Tensor::shape_only({16, 32}, DType::f32),
              {.strategy = Strategy::script, .parallel_num = 2, .recompute_all_gather = recompute});
        },
        dry());
    EXPECT_EQ(count_named(r, 0, "reorder"), recompute ? 1 : 2) << "recompute " << recompute;
  }
}

// 6a. matmul_soc_friendly changes the layout, not the shape: with the weight made column-major,
// a 4096×1024·1024×704 bf16 GEMM is priced as aligned, 2·4096·704·1024 flop at 1 TFLOP/s; the
// row-major weight pays the unaligned factor (704·2 B rows are not 512-byte aligned).
TEST(ReviewSchedules, ColumnMajorWeightIsPricedWithItsTrueShape) {
  const auto p = cocemu::testing::round_profile(
      "compute: {gemm: {max_efficiency: 1.0, half_efficiency_flops: 0, alignment_bytes: 512, "
      "unaligned_efficiency: 0.5}}");
  const double flops = 2.0 * 4096 * 704 * 1024;
  EXPECT_DOUBLE_EQ(gemm_ns(*p, 4096, 704, 1024, DType::bf16, {false, true}), flops / 1000);
  EXPECT_DOUBLE_EQ(gemm_ns(*p, 4096, 704, 1024, DType::bf16), 2 * flops / 1000);
}

const char* kUnaligned =
    "compute: {gemm: {max_efficiency: 1.0, half_efficiency_flops: 0, alignment_bytes: 512, "
    "unaligned_efficiency: 0.5}}";

/// Row-parallel SP backward on 2 ranks: dX[m, k/tp] = all_gather(dY)[m, n] · W[n, k/tp], with W
/// row-major; n = 256 (512 B in bf16, aligned), k/tp = 352 (704 B, not aligned).
RunResult row_backward(const LinearOptions& o) {
  return cocemu::testing::run_ranks(
      2,
      [&](Rank& rank) {
        Group tp = Group::world(rank);
        RowParallelLinear layer(tp, Tensor::shape_only({256, 352}, DType::bf16), Tensor(), true);
        layer.forward(Tensor::shape_only({1024, 352}, DType::bf16), {.strategy = Strategy::serial});
        layer.backward(Tensor::shape_only({512, 256}, DType::bf16), o);
      },
      dry(kUnaligned));
}

// 6a/b. Script P = 2: MindSpeed copies W to column-major (k = 256 aligned, n = 352 not): one copy
// of 2·256·352·2 B, and each chunk's GEMM [512, 256]·[256, 352] is priced aligned:
// 2·512·352·256 flop = 92274.688 ns. Serial (P = 1) and fused are not made SoC friendly: the
// serial GEMM pays the unaligned factor on its true shape, 2·1024·352·256·2 flop.
TEST(ReviewSchedules, SocFriendlyAppliesToSplitScriptOpsOnlyAndKeepsTheShape) {
  const RunResult script = row_backward({.strategy = Strategy::script, .parallel_num = 2});
  const OpRecord& copy = op_named(script, 0, "soc-friendly weight 256x352 to column-major");
  EXPECT_DOUBLE_EQ(copy.work_ns, 2.0 * 256 * 352 * 2 / 1e15 * 1e9);
  const OpRecord& chunk = op_named(script, 0, "row bwd all_gather matmul[1/2]");
  EXPECT_DOUBLE_EQ(chunk.work_ns, 2.0 * 512 * 352 * 256 / 1000);

  const RunResult serial = row_backward({.strategy = Strategy::serial});
  EXPECT_EQ(count_named(serial, 0, "soc-friendly"), 0);
  EXPECT_DOUBLE_EQ(op_named(serial, 0, "row bwd all_gather matmul").work_ns,
                   2 * (2.0 * 1024 * 352 * 256 / 1000));
  // A per-shape config that says "off" (1) or "fused" (-1) for this shape: no SoC-friendly copy.
  for (int v : {1, -1}) {
    auto cfg = std::make_shared<CocConfig>();
    cfg->customized_coc["[1024, 256, 352]"] = v;
    const RunResult r = row_backward({.per_shape = cfg});
    EXPECT_EQ(count_named(r, 0, "soc-friendly"), 0) << v;
  }
}

// 6c. k in [k_min, k_max] and not 32-byte aligned, m/P and n aligned: both operands are zero-padded
// to a 512-byte multiple of k and the GEMM runs with the padded k. Column SP forward on 2 ranks,
// P = 2: local x [256, 1032] bf16 (2064 B rows), W [256, 1032]; k pads to 1280. Pad copy: (256 +
// 256)·(1032 + 1280)·2 B; each chunk GEMM [256, 1280]·[1280, 256] is 2·256·256·1280 flop.
TEST(ReviewSchedules, SocFriendlyPaddingPricesThePaddedGemm) {
  const RunResult r = cocemu::testing::run_ranks(
      2,
      [&](Rank& rank) {
        Group tp = Group::world(rank);
        ColumnParallelLinear layer(tp, Tensor::shape_only({256, 1032}, DType::bf16), Tensor(),
                                   true);
        layer.forward(Tensor::shape_only({256, 1032}, DType::bf16),
                      {.strategy = Strategy::script, .parallel_num = 2});
      },
      dry(kUnaligned));
  const OpRecord& pad = op_named(r, 0, "soc-friendly pad k 1032 -> 1280");
  EXPECT_DOUBLE_EQ(pad.work_ns, (256.0 + 256) * (1032 + 1280) * 2 / 1e15 * 1e9);
  EXPECT_DOUBLE_EQ(op_named(r, 0, "column fwd all_gather matmul[1/2]").work_ns,
                   2.0 * 256 * 256 * 1280 / 1000);
}

// Sweep: Megatron's gradient_accumulation_fusion (its default) accumulates the weight gradient
// into main_grad inside the GEMM; the separate main_grad += pass (3 f32 passes over the weight)
// exists only without it. In f32 both give the same bits.
TEST(ReviewSchedules, GradientAccumulationFusionHasNoSeparatePass) {
  for (bool fusion : {true, false}) {
    Tensor grad;
    const RunResult r = cocemu::testing::run_ranks(2, [&](Rank& rank) {
      Group tp = Group::world(rank);
      ColumnParallelLinear layer(tp, filled({8, 16}, 0.5), Tensor(), true);
      const LinearOptions o{.gradient_accumulation_fusion = fusion};
      layer.forward(filled({4, 16}, 0.25), o);
      layer.backward(filled({8, 8}, 0.125), o);
      rank.synchronize();
      if (rank.id() == 0) grad = layer.main_grad().clone();
    });
    EXPECT_EQ(count_named(r, 0, "main_grad +="), fusion ? 0 : 1);
    const OpRecord& wgrad = op_named(r, 0, "column bwd wgrad");
    EXPECT_EQ(wgrad.name.find("(+= main_grad)") != std::string::npos, fusion);
    for (std::int64_t i = 0; i < grad.numel(); ++i)
      ASSERT_EQ(grad.item(i), 8 * 0.125 * 0.25);  // Σ over 8 rows of dy·x
  }
}

// 4. Fused kernels pay the same contention as script-side overlap. MATMUL_ALL_REDUCE on 2 ranks,
// x [16, 2000], w [16, 2000], 2 steps of 8 rows: each step's GEMM is 2·8·16·2000 flop = 512 ns and
// its direct all_reduce moves 8·16·4 B per link = 512 ns. Pipeline: 512 + overlapped + 512. With
// no contention the overlapped step is 512 (1536 in all); with both slowed 2× it is 512·2 + (512 −
// 1024/2) = 1024 (2048 in all) — what the schedule charges two overlapping script ops.
double fused_all_reduce_ns(const std::string& contention) {
  const RunResult r = cocemu::testing::run_ranks(
      2,
      [&](Rank& rank) {
        Group tp = Group::world(rank);
        matmul_all_reduce(tp, Tensor::shape_only({16, 2000}, DType::f32),
                          Tensor::shape_only({16, 2000}, DType::f32), Tensor(),
                          Tensor::shape_only({16, 16}, DType::f32),
                          {.tile_rows = 8, .tiles_per_step = 1});
      },
      dry(contention));
  return double(r.timeline.makespan_ns());
}

TEST(ReviewSchedules, FusedKernelsPayContentionOnOverlappedSteps) {
  EXPECT_EQ(fused_all_reduce_ns(""), 1536);
  EXPECT_EQ(fused_all_reduce_ns("contention: {compute_slowdown: 2.0, comm_slowdown: 2.0}"), 2048);
  // The rule itself, as the schedule applies it: 1000 ns compute beside 500 ns comm, both 2×.
  EXPECT_DOUBLE_EQ(overlapped_ns(1000, 500, {2.0, 2.0}), 1500);
  EXPECT_DOUBLE_EQ(overlapped_ns(500, 1000, {2.0, 2.0}), 1500);
  EXPECT_DOUBLE_EQ(overlapped_ns(1000, 500, {1.0, 1.0}), 1000);
}

// 10. Queued kernels own what they read: a layer destroyed (and its memory overwritten) before
// its streams drain still computes the right thing.
TEST(ReviewSchedules, TransformerLayerMayBeDestroyedBeforeItsStreamsDrain) {
  const TransformerConfig c{
      .seq = 16, .batch = 1, .hidden = 32, .heads = 2, .ffn = 64, .dtype = DType::f32};
  const TransformerWeights w = TransformerWeights::random(c, 3);
  const Tensor x = filled({8, 32}, 0.25);
  Tensor reference;
  cocemu::testing::run_ranks(2, [&](Rank& rank) {
    Group tp = Group::world(rank);
    TransformerLayer layer(tp, c, w);
    Tensor y = layer.forward(x.clone(), {});
    rank.synchronize();
    if (rank.id() == 0) reference = y.clone();
  });
  cocemu::testing::run_ranks(2, [&](Rank& rank) {
    Group tp = Group::world(rank);
    std::atomic<bool> go{false};
    // Hold the compute stream until the layer is gone (bounded: 5 s).
    rank.compute_stream().launch({.name = "hold"}, [&go] {
      for (int i = 0; i < 5000 && !go.load(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    alignas(TransformerLayer) std::byte storage[sizeof(TransformerLayer)];
    auto* layer = new (storage) TransformerLayer(tp, c, w);
    Tensor y = layer->forward(x.clone(), {});
    layer->~TransformerLayer();
    std::memset(storage, 0xff, sizeof storage);
    go.store(true);
    rank.synchronize();
    if (rank.id() == 0) {
      EXPECT_TRUE(y.bitwise_equal(reference));
    }
  });
}

// 11. Two disjoint groups with the same display name run fused kernels independently.
TEST(ReviewSchedules, FusedKernelsOnSameNamedGroupsDoNotMerge) {
  cocemu::testing::run_ranks(4, [](Rank& rank) {
    Group a = new_group(rank, {0, 1}, "tp"), b = new_group(rank, {2, 3}, "tp");
    Group& g = a.is_member() ? a : b;
    const Tensor x = filled({8, 4}, 1.0), w = filled({4, 4}, 1.0);
    Tensor out = Tensor::zeros({8, 4}, DType::f32);
    matmul_all_reduce(g, x, w, Tensor(), out, {.tile_rows = 4});
    rank.synchronize();
    for (std::int64_t i = 0; i < out.numel(); ++i)
      ASSERT_EQ(out.item(i), 8.0);  // Σ over 2 ranks of 4 products of 1
  });
}

}  // namespace
}  // namespace cocemu::layers
