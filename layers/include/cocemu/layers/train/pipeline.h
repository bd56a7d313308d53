#pragma once
/// The order in which one pipeline stage runs its forward and backward passes (R-TR-3):
///  - GPipe: every micro-batch's forward, then every backward (micro-batch order);
///  - 1F1B (Megatron's forward_backward_pipelining_without_interleaving): pp − stage − 1 warm-up
///    forwards, then one forward and one backward in turn, then the remaining backwards;
///  - interleaved 1F1B (Megatron's forward_backward_pipelining_with_interleaving): vpp model
///    chunks per stage, micro-batches taken in groups of pp per chunk, (pp − stage − 1)·2 +
///    (vpp − 1)·pp warm-up forwards (all of them when micro-batches = pp).
/// In every schedule a chunk's backwards run in micro-batch order, so gradients accumulate in
/// the same order whatever the schedule (bitwise-identical training, R-TR-8).
#include <cstdint>
#include <string>
#include <vector>

#include "cocemu/layers/train/layout.h"

namespace cocemu::layers::train {

struct PipelineAction {
  bool forward = true;
  int micro_batch = 0;
  int chunk = 0;  ///< model chunk on this stage (0 without interleaving)
  bool operator==(const PipelineAction&) const = default;
};

/// Stage `stage`'s actions for `micro_batches` micro-batches. Throws on an impossible request
/// (interleaved with micro-batches not a multiple of pp, fewer micro-batches than stages).
std::vector<PipelineAction> pipeline_actions(PipelineSchedule schedule, int pp, int vpp,
                                             int micro_batches, int stage);

/// The classic bubble fraction of a schedule with equal stage times, (pp − 1) / (vpp·m + pp − 1)
/// of the ideal time: what the modeled timeline is compared with in the tests.
double ideal_bubble_fraction(int pp, int vpp, int micro_batches);

/// "F3" / "B3" (chunk suffix ".1" when vpp > 1): the label of a block in the pipeline picture.
std::string action_label(const PipelineAction& a, int vpp);

}  // namespace cocemu::layers::train
