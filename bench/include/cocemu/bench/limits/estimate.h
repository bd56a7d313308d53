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
#include "cocemu/runtime/limits.h"
#include "cocemu/train/config.h"
#include "cocemu/train/plan.h"

namespace cocemu::bench {

/// The host time of real numerics depends on the machine: its core, its clock, its memory, its
/// vector units (cocemu's deterministic GEMM has an AVX-512 kernel), the kernels OpenBLAS picks
/// for it (SkylakeX, Zen, Haswell, or a generic Prescott several times slower). The time
/// estimates' constants are rates of a reference machine; each is scaled by this machine's speed
/// relative to that one, measured on probes of the emulator's kind (a few ms of CPU, once per
/// process): a bf16 GEMM of 256³ with cocemu's deterministic kernel and with OpenBLAS scales the
/// GEMM FLOPs of a deterministic or non-deterministic run, and a bf16 to f32 conversion and back
/// of 2^18 elements scales the elementwise work.
///
/// The probes on the reference machine, a 2-core AMD EPYC (Zen 4) VM where OpenBLAS runs its
/// Cooperlake kernels, with and without other work on the cores: deterministic GEMM 9.3·10¹⁰ to
/// 9.7·10¹⁰ FLOP/s, OpenBLAS 7.5·10¹⁰ to 9.4·10¹⁰ (its Prescott kernels 1.8·10¹⁰ to 3.7·10¹⁰),
/// conversions 6.4·10⁹ to 7.7·10⁹ elements/s (`Limits.TheHostSpeedProbes…` prints them).
/// The train constants (estimate.cpp) were fitted there; the layer benchmark's (runtime/limits.h:
/// kHostFlopsPerCore) hold there within 15% (`Limits.TheBenchEstimateHoldsForAnotherLayer`).
inline constexpr double kReferenceDetGemmFlopsPerSecond = 9.3e10;
inline constexpr double kReferenceBlasGemmFlopsPerSecond = 8.8e10;
inline constexpr double kReferenceElementsPerSecond = 7.0e9;
/// The speeds' range: a probe outside it measured a broken clock, not a machine.
inline constexpr double kMinHostSpeed = 0.02, kMaxHostSpeed = 50;

/// This machine against the reference, per core: 2 where it is twice as fast.
struct HostSpeed {
  double det_gemm_flops_per_second = 0;   ///< the GEMM probe, deterministic kernel
  double blas_gemm_flops_per_second = 0;  ///< the GEMM probe, OpenBLAS
  double elements_per_second = 0;         ///< the elementwise probe
  double det_gemm = 1;   ///< det_gemm_flops_per_second / kReferenceDetGemmFlopsPerSecond
  double blas_gemm = 1;  ///< blas_gemm_flops_per_second / kReferenceBlasGemmFlopsPerSecond
  double elements = 1;   ///< elements_per_second / kReferenceElementsPerSecond
  /// The GEMM speed of a run in that mode.
  double gemm(bool deterministic) const { return deterministic ? det_gemm : blas_gemm; }
};
/// Measured once per process (cached), within [kMinHostSpeed, kMaxHostSpeed].
HostSpeed host_speed();

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
