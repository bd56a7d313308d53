#pragma once
/// The step model: a training iteration of a world too large to run rank by rank (hundreds of
/// devices, hundreds of micro-batches), composed from parts that are emulated or priced the way
/// the emulator prices them:
///  - one micro-batch through one layer, the embedding and the loss is emulated (dry run) on one
///    TP group with the same CoC options, recompute and sequence parallelism: the duration of
///    each part on the device and its exposed TP communication;
///  - the pipeline schedule (pipeline.h) is replayed stage by stage with those durations and
///    Megatron's p2p calls between the passes (pipeline_steps); each activation or gradient
///    transfer is priced on the link between the two stages' devices (the profile's topology).
///    Overlapped calls (interleaved with overlap_p2p_comm, GPipe) queue each transfer on its
///    link and direction as soon as its pass is done, and the stage waits only for its receives;
///    a blocking call (Megatron's 1F1B; interleaved without overlap_p2p_comm) waits until both
///    ends have posted each of its transfers and all of them have crossed, each transfer taking
///    the first stretch where its sender's and receiver's ports are free, as the emulated
///    timeline shares a port between transfers;
///  - each gradient bucket's DP reduction is priced by `model_collective` on the DP group's
///    placement, launched when its last gradient is final in the last micro-batch's backward and
///    serialized on the DP stream;
///  - the grad-norm all-reduce over the world, then Adam (memory-bound) and, sharded, the
///    parameter all-gathers.
/// What it leaves out: the slowdown of compute and communication sharing a device (the emulated
/// timeline applies the profile's contention factors), so an overlapped DP reduction costs it
/// nothing. A test compares it with the emulated step on layouts both can run.
#include "cocemu/collectives/plan.h"
#include "cocemu/train/pipeline.h"
#include "cocemu/train/report.h"

namespace cocemu::bench {

TrainReport model_step(const TrainSetup& setup);

struct StepParts;

/// What many replays on one profile share (a search): the prices of DP-side collectives
/// (model_collective) and the schedules' action lists; safe to share between threads.
class StepMemo {
 public:
  explicit StepMemo(std::shared_ptr<const DeviceProfile> profile);
  ~StepMemo();
  StepMemo(const StepMemo&) = delete;
  StepMemo& operator=(const StepMemo&) = delete;
  /// model_collective(...).cost.total_ns for a group whose world ranks are first + i·stride
  /// (keyed by first modulo the node size: a group shifted by whole nodes costs the same).
  double price(CollOp op, int first, int stride, int size, std::int64_t count, DType dtype,
               std::uint64_t bytes, bool deterministic);
  /// pipeline_actions(schedule, pp, vpp, m, stage), computed once.
  const std::vector<layers::train::PipelineAction>& actions(layers::train::PipelineSchedule s,
                                                            int pp, int vpp, int m, int stage);
  /// pipeline_steps(layout's schedule, p2p_mode(layout), pp, vpp, m, stage), computed once.
  const std::vector<layers::train::PipelineStep>& steps(const layers::train::TrainLayout& layout,
                                                        int stage);
  /// peak_chunks_in_flight(layout, stage), from the memoized actions.
  int peak_chunks_in_flight(const layers::train::TrainLayout& layout, int stage);
  /// peak_loss_in_flight(layout), from the memoized actions.
  int peak_loss_in_flight(const layers::train::TrainLayout& layout);
  std::size_t size() const;

 private:
  struct Impl;
  std::shared_ptr<const DeviceProfile> profile_;
  std::unique_ptr<Impl> impl_;
};

/// The step from given parts (emulated, or priced by part_model.h): the schedule replay, the DP
/// reductions and the optimizer, as above. `memo` (shared between calls, e.g. a search's
/// candidates; one of its own otherwise) must be on setup's profile;
/// without `record_pipeline` the report's pipeline picture stays empty (searches).
TrainReport replay_step(const TrainSetup& setup, const StepParts& parts, StepMemo* memo = nullptr,
                        bool record_pipeline = true);

}  // namespace cocemu::bench
