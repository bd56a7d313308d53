// How fused matmul-communication kernels are priced from a profile's `fused:` section (the
// vendor kernels' step cost, their steps, and MC2's shape rule for in-kernel transfers), on a
// round-number profile with the arithmetic worked out beside each check.
#include <gtest/gtest.h>

#include "cocemu/collectives/ops.h"
#include "cocemu/layers/fused_kernels.h"
#include "cocemu/runtime/cost_model.h"
#include "cocemu/runtime/error.h"
#include "testing.h"

namespace cocemu::layers {
namespace {

DeviceProfile round(const std::string& overrides = "") {
  return *cocemu::testing::round_profile(overrides);
}

/// MATMUL_ALL_REDUCE on 2 ranks, x [16, 2000], w [16, 2000] (trans), f32, 1 TFLOP/s, links 1 B/ns:
/// steps of 8 rows (tiling 8 x 1). A step's GEMM is 2·8·16·2000 flop = 512 ns; its direct
/// all_reduce moves 8·16·4 B per link = 512 ns.
double all_reduce_ns(const DeviceProfile& p) {
  return fused_kernel_ns(p, FusedKind::matmul_all_reduce, 16, 2000, 16, 2, DType::f32,
                         {.tile_rows = 8, .tiles_per_step = 1}, true);
}

TEST(FusedPricing, EachStepPaysTheStepCost) {
  // Two steps: compute 512, then step 2's compute beside step 1's comm, then step 2's comm.
  // Without a step cost: 512 + 512 + 512. With 100 ns per step on the comm side: 512 + 612 +
  // 612.
  EXPECT_DOUBLE_EQ(all_reduce_ns(round()), 1536);
  EXPECT_DOUBLE_EQ(all_reduce_ns(round("fused: {step_overhead_ns: 100}")), 1736);
  // A kernel with no peers has no flags to exchange: no step cost.
  const auto one_rank = [](const DeviceProfile& p) {
    return fused_kernel_ns(p, FusedKind::matmul_all_reduce, 16, 2000, 16, 1, DType::f32,
                           {.tile_rows = 8, .tiles_per_step = 1}, true);
  };
  EXPECT_DOUBLE_EQ(one_rank(round("fused: {step_overhead_ns: 100}")), one_rank(round()));
}

TEST(FusedPricing, VendorStepsReplaceTheTilingInThePrice) {
  // step_bytes 1024 of communicated rows (64 B each: 16 columns of f32) = 16 rows: one step,
  // nothing overlaps: 1024 + 1024. A ring: one step per rank, 8 rows: as the tiling. A count of
  // 1 step: as step_bytes 1024. The all-reduce kernel follows the reductions' rule.
  EXPECT_DOUBLE_EQ(all_reduce_ns(round("fused: {step_overhead_ns: 0, step_bytes: 1024}")), 2048);
  EXPECT_DOUBLE_EQ(all_reduce_ns(round("fused: {step_overhead_ns: 0, reduce_steps: {ring: true}}")),
                   1536);
  EXPECT_DOUBLE_EQ(all_reduce_ns(round("fused: {step_overhead_ns: 0, reduce_steps: {count: 1}}")),
                   2048);
  EXPECT_DOUBLE_EQ(all_reduce_ns(round("fused: {step_overhead_ns: 0, gather_steps: {count: 1}}")),
                   1536);
  // The matmul slowed by the cores the transfers take (1.5x): step 1's compute 768, step 2's
  // (768) beside step 1's comm (512), then step 2's comm: 768 + 768 + 512.
  EXPECT_DOUBLE_EQ(all_reduce_ns(round("fused: {step_overhead_ns: 0, reduce_steps: {ring: true, "
                                       "compute_slowdown: 1.5}}")),
                   2048);
  // Split GEMMs are priced at their own size. Under a GEMM curve with half efficiency at the
  // whole product's 1.024 MFLOP, the whole runs at 1/2 of peak (2048 ns, 1024 per step), each
  // 8-row GEMM alone (0.512 MFLOP) at 1/3 (1536 ns): 1024 + 1024 + 512 against 1536 + 1536 + 512.
  const std::string curve =
      "compute: {gemm: {max_efficiency: 1.0, half_efficiency_flops: 1.024e6, alignment_bytes: 1, "
      "unaligned_efficiency: 1.0}}, ";
  EXPECT_DOUBLE_EQ(all_reduce_ns(round("{" + curve + "fused: {step_overhead_ns: 0}}")), 2560);
  EXPECT_DOUBLE_EQ(
      all_reduce_ns(round("{" + curve +
                          "fused: {step_overhead_ns: 0, reduce_steps: {separate_gemms: true}}}")),
      3584);
  testing::expect_error(
      [] { round("fused: {step_overhead_ns: 0, reduce_steps: {step_bytes: 1024, ring: true}}"); },
      Errc::parse_error, {"reduce_steps", "one rule"});
  testing::expect_error(
      [] { round("fused: {step_overhead_ns: 0, step_bytes: 1024, gather_steps: {ring: true}}"); },
      Errc::parse_error, {"step_bytes", "gather_steps"});
}

/// MATMUL_REDUCE_SCATTER on 4 ranks of an [m, k]·[k, n] product, under a profile whose l2_rule
/// has 1 core, so the working set is (128-row block + 256-column block)·k·4 bytes.
double reduce_scatter_ns(const DeviceProfile& p, std::int64_t k, std::int64_t n) {
  return fused_kernel_ns(p, FusedKind::matmul_reduce_scatter, 1024, k, n, 4, DType::f32,
                         {.tile_rows = 32, .tiles_per_step = 2}, true);
}

TEST(FusedPricing, TransfersSlowWhenTheMatmulOverflowsL2) {
  // (128 + 256)·k·4 B: k = 512 -> 786432 B. An L2 budget of 1 MB holds it, 0.5 MB does not.
  const std::string rule =
      "{cube_cores: 1, overflow_slowdown: {all_gather: 3.0, reduce_scatter: 1.5}, large_k: 100000, "
      "large_n: 100000, large_kn_slowdown: {all_gather: 1.0, reduce_scatter: 1.0}, l2_bytes: ";
  const DeviceProfile fits = round("fused: {step_overhead_ns: 0, l2_rule: " + rule + "1.0e6}}");
  const DeviceProfile overflows =
      round("fused: {step_overhead_ns: 0, l2_rule: " + rule + "5.0e5}}");
  // Overflowing, the in-kernel transfers slow by the reduce-scatter factor while the matmul runs:
  // exactly the kernel under contention.comm_slowdown 1.5 without the rule.
  EXPECT_DOUBLE_EQ(reduce_scatter_ns(fits, 512, 512), reduce_scatter_ns(round(), 512, 512));
  EXPECT_DOUBLE_EQ(reduce_scatter_ns(overflows, 512, 512),
                   reduce_scatter_ns(round("contention: {comm_slowdown: 1.5}"), 512, 512));
  EXPECT_GT(reduce_scatter_ns(overflows, 512, 512), reduce_scatter_ns(fits, 512, 512));
  // Large k and n (within the budget): the large_kn factor.
  const DeviceProfile large = round(
      "fused: {step_overhead_ns: 0, l2_rule: {cube_cores: 1, l2_bytes: 1.0e12, overflow_slowdown: "
      "{all_gather: 3.0, reduce_scatter: 1.5}, large_k: 512, large_n: 256, large_kn_slowdown: "
      "{all_gather: 1.5, reduce_scatter: 1.2}}}");
  EXPECT_DOUBLE_EQ(reduce_scatter_ns(large, 512, 512),
                   reduce_scatter_ns(round("contention: {comm_slowdown: 1.2}"), 512, 512));
  EXPECT_DOUBLE_EQ(reduce_scatter_ns(large, 256, 512), reduce_scatter_ns(round(), 256, 512));
}

// The emulated kernel is priced as fused_kernel_ns prices it, vendor steps and step cost
// included (planners price kernels without running them).
TEST(FusedPricing, EmulatedKernelMatchesThePlannersPrice) {
  const std::string profile = "fused: {step_overhead_ns: 250, step_bytes: 4096}";
  const RunResult r = cocemu::testing::run_ranks(
      4,
      [](Rank& rank) {
        Group tp = Group::world(rank);
        matmul_reduce_scatter(tp, Tensor::shape_only({1024, 512}, DType::f32),
                              Tensor::shape_only({512, 512}, DType::f32), true, Tensor(),
                              Tensor::shape_only({256, 512}, DType::f32),
                              {.tile_rows = 32, .tiles_per_step = 2});
      },
      [&] {
        WorldOptions wo;
        wo.numerics = false;
        wo.profile = cocemu::testing::round_profile(profile);
        return wo;
      }());
  double kernel = 0;
  for (const OpRecord& op : r.graph.ranks[0].ops)
    if (op.cls == OpClass::fused) kernel = op.work_ns;
  EXPECT_DOUBLE_EQ(kernel, reduce_scatter_ns(round(profile), 512, 512));
  EXPECT_GT(kernel,
            reduce_scatter_ns(round("fused: {step_overhead_ns: 0, step_bytes: 4096}"), 512, 512));
}

}  // namespace
}  // namespace cocemu::layers
