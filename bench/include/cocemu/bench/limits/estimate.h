#pragma once
/// Peak memory and host time of each command's work, estimated from the request before anything
/// is allocated or any thread starts (runtime/limits.h checks them against the machine): the
/// layer benchmark, the emulated training step (real numerics or a dry run), the step model's
/// replay, context-parallel attention, the MLP benchmark, collbench and the plan search.
///
/// Each estimate counts what the work holds and does, with its constants measured on one
/// reference run (named beside it) and checked against others in tests/robustness/test_limits.cpp.
#include <cstdint>
#include <string>

#include "cocemu/bench/layer_bench.h"
#include "cocemu/bench/plan/plan.h"
#include "cocemu/bench/train/train_config.h"
#include "cocemu/runtime/limits.h"

namespace cocemu::bench {

/// `cocemu bench` with real numerics: every strategy × repeats runs of the layer on tp ranks.
/// A dry run records shapes only: its cost does not grow with the sizes (none estimated).
Estimate estimate_bench(const BenchConfig& config, const std::string& what);

/// `cocemu train` on emulated ranks: real numerics (every rank's weights, gradients, optimizer
/// state and activations; the iterations' FLOPs) or a dry run (the op records of every layer
/// pass of every iteration).
Estimate estimate_train_emulated(const TrainSetup& setup, const std::string& what);

/// `cocemu train` through the step model: the schedule replay of every stage's micro-batches.
Estimate estimate_step_model(const TrainSetup& setup, const std::string& what);

/// Attention with real numerics over `cp` ranks: q, k, v, dout, out and the gradients with every
/// rank's shards and blocks; forward and backward's score elements (`visible`: the fraction of
/// the s² scores a mask keeps, 0.5 causal) and GEMM FLOPs.
Estimate estimate_attention(std::int64_t batch, std::int64_t seq, std::int64_t heads,
                            std::int64_t kv_heads, std::int64_t head_dim, int element_bytes, int cp,
                            double visible, const std::string& what);

/// `cocemu mlpbench`: x, the weights, activations and gradients of every rank and the floor's
/// operands; five strategies and the floor per repeat.
Estimate estimate_mlpbench(std::int64_t m, std::int64_t hidden, std::int64_t ffn, int ranks,
                           int repeats, const std::string& what);

/// `cocemu collbench` with real numerics: in and out buffers of every rank and the check's
/// reference; every row's warm-up and timed calls over host memory.
Estimate estimate_collbench(std::int64_t max_bytes, double total_bytes_moved, int ranks,
                            const std::string& what);

/// `cocemu plan`: the candidates it enumerates (counted, not built) and what pricing them costs:
/// each distinct collective over a group of g members builds a plan of up to g² steps.
Estimate estimate_plan(const PlanQuery& query, const std::string& what);

}  // namespace cocemu::bench
