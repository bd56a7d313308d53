#pragma once
/// `cocemu bench`: a transformer layer's forward+backward under each CoC strategy (serial,
/// script P=2/4/8, fused, optionally a tuned per-shape config), with modeled and wall times,
/// communication and exposed communication, bitwise equality with serial, and per CoC segment
/// MindSpeed's overlap verdict (R-BE-3).
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cocemu/bench/sensitivity.h"
#include "cocemu/layers/linear.h"
#include "cocemu/layers/model_config.h"
#include "cocemu/layers/transformer.h"
#include "cocemu/runtime/world.h"

namespace cocemu::bench {

struct BenchStrategy {
  std::string name;  ///< "serial", "script P=4", "fused", "tuned"
  layers::LinearOptions options;
};

/// The CoC config bench uses unless given one: MindSpeed's defaults, with fused tiles of 32 rows
/// × 2 per step (several pipeline steps even for the default layer's 256 local rows).
layers::CocConfig default_bench_coc();
/// serial, script P=2/4/8 and fused (tiling from `coc`); plus "tuned" when `coc` has
/// customized_coc entries (each op then takes its own choice, as MindSpeed's get_parallel_num).
std::vector<BenchStrategy> default_strategies(const layers::CocConfig& coc = default_bench_coc());

struct BenchConfig {
  std::string model = "llama-style default";  ///< shown in reports
  layers::TransformerConfig layer;
  int tp = 8;
  std::shared_ptr<const DeviceProfile> profile;  ///< empty: ascend-910b
  bool dry_run = false;                          ///< shapes only: modeled times, no numerics
  int repeats = 3;                               ///< real runs per strategy (median wall time)
  /// Rank-ordered reductions and tiling-invariant GEMMs (bitwise comparable strategies); their
  /// rank-ordered collective plans are also what gets priced.
  bool deterministic = true;
  std::vector<BenchStrategy> strategies = default_strategies();
  /// Several hosts (runtime/hosts.h, `mpirun -n H cocemu bench`): this process runs its share
  /// of the TP ranks; every host gets the whole result. Null: one host.
  std::shared_ptr<HostLink> hosts;
};

/// The default: a LLaMA-style layer (SwiGLU, GQA) at TP=8, bf16, sized so that every strategy's
/// real-numerics run takes seconds on a laptop.
BenchConfig default_bench_config();
/// A model config's layer (its shapes, TP and SP), bf16.
BenchConfig bench_config_for(const layers::ModelConfig& model);
/// The command line's choice: `model` (a name under configs/models/ or a path; empty = the
/// default layer) on device profile `profile` (a name under configs/devices/ or a path).
BenchConfig bench_config(const std::string& model, const std::string& profile);

/// One CoC segment of one run, measured on rank 0's modeled timeline.
struct SegmentStats {
  std::string name;
  double span_ns = 0;          ///< first device op start to last device op end
  double compute_work_ns = 0;  ///< Σ full-speed compute work (GEMMs, reorders; fused: inside)
  double comm_work_ns = 0;     ///< Σ full-speed link time of its collectives (fused: inside)
  double comm_time_ns = 0;     ///< modeled link busy time (slowed by contention)
  double overlap_ns = 0;       ///< time compute and comm ran at once
  double exposed_comm_ns = 0;  ///< time comm ran while compute did not
  double host_ns = 0;          ///< host launch time of its ops
  double wall_ns = -1;         ///< host wall time of its device ops on rank 0; -1 in dry runs
  int gemms = 0;               ///< GEMM launches (split chunks and unsplit GEMMs alike)
  int collectives = 0;         ///< collective launches (comm ops on the device)
  int fused_steps = 0;         ///< pipeline steps of its fused kernels
  int device_ops = 0;          ///< compute and comm ops after the first of each lane
  int host_gated = 0;          ///< of those, ops whose start waited for their host launch
};

/// Groups rank `rank`'s ops by segment (Rank::set_segment), in first-appearance order.
std::vector<SegmentStats> segment_stats(const RunResult& run, int rank = 0);

/// MindSpeed's criteria for a successful overlap, applied to one segment split vs serial:
/// 1. after splitting, total matmul time and total comm time are not much larger (≤ 15% more)
///    — else "matmul too small" or "comm degradation";
/// 2. from the second chunk on, compute and comm run concurrently — else "host bound" when most
///    chunk ops waited for their host launch, or "no concurrency";
/// 3. neither side dominates (comm/compute within 1/4..4) — else "comm dominated" or
///    "compute dominated";
/// 4. the segment's total time went down — else "no gain".
struct Verdict {
  bool success = false;
  std::string failed;  ///< the first failed criterion's name; empty on success
  std::string text;    ///< one line with the figures behind it
};
Verdict judge(const SegmentStats& serial, const SegmentStats& split);

/// Whether to use a strategy on one segment, by modeled time: the fastest strategy (serial
/// included) is the one to use; the fastest script split, when it beats serial but not the
/// fastest, is the one to use without the fused kernels (MindSpeed's script-side CoC). MindSpeed's
/// criteria (`Verdict`) are diagnostics beside it: they say why a split gains or not, not whether
/// to use it.
struct Recommendation {
  enum class Use { yes, without_fused, no };
  Use use = Use::no;
  std::string text;  ///< "use: …", "use without fused kernels: …" or "no: …" with the figures
};
/// "yes", "without fused kernels", "no".
const char* to_string(Recommendation::Use use);

struct StrategyResult {
  std::string name;
  std::int64_t modeled_ns = 0;  ///< the layer's forward+backward (modeled makespan)
  /// The forward's and the backward's device time, each from its first device op to its last on
  /// the rank where it takes longest: the layer's parts `cocemu train` composes a step from. They
  /// leave out the time the standalone layer's device waits for its first launches, which
  /// inside a step the host has issued ahead.
  double forward_device_ns = 0, backward_device_ns = 0;
  double wall_ns = -1;                       ///< median host wall time; -1 in a dry run
  std::optional<bool> bitwise_equal_serial;  ///< empty in a dry run
  double comm_ns = 0, exposed_comm_ns = 0;   ///< rank 0, whole layer: link busy, not hidden
  std::vector<SegmentStats> segments;
  std::vector<Verdict> verdicts;                ///< per segment against serial (empty for serial)
  std::vector<Recommendation> recommendations;  ///< per segment (empty for serial)
  RunResult run;                                ///< the last run (trace)
};

struct BenchResult {
  BenchConfig config;
  std::vector<StrategyResult> strategies;
};

/// progress(done, total, what) after each run.
using Progress = std::function<void(int, int, const std::string&)>;
BenchResult run_bench(const BenchConfig& config, const Progress& progress = {});

/// strategies[] and segments[] as documented in the README.
nlohmann::json to_json(const BenchResult& result);
/// The human-readable tables; with a sensitivity analysis, fragile conclusions are marked.
std::string format_report(const BenchResult& result, const Sensitivity* sensitivity = nullptr);
/// The conclusions bench draws: per segment "<segment> best strategy" (serial included),
/// "<segment> best script split" (the fastest script split if it beats serial, else "none") and
/// "<segment> <strategy> criteria" (MindSpeed's failed criterion, or "overlap succeeded"); and
/// "fastest strategy" for the whole layer.
Conclusions bench_conclusions(const BenchResult& result);

}  // namespace cocemu::bench
