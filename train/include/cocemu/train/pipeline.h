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
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "cocemu/train/layout.h"

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

/// How a stage's pipeline transfers meet its compute, as Megatron's schedules call
/// p2p_communication:
///  - overlapped: every receive is posted and waited for right before the pass that reads it,
///    every send posted after the pass that wrote it and not waited for (Megatron's interleaved
///    schedule with --overlap-p2p-comm, its default since 2023-10; GPipe);
///  - blocking_1f1b: Megatron's non-interleaved schedule (overlap is forced off there): each call
///    (recv_forward, send_forward, send_forward_recv_backward, send_backward_recv_forward,
///    send_backward, recv_backward) posts its transfers together and waits for all of them
///    (_communicate with wait_on_reqs), a send included, so a stage waits until its peer has
///    posted the matching receive and the tensor has crossed;
///  - blocking_interleaved: Megatron's interleaved schedule without --overlap-p2p-comm (2021-2022
///    Megatron, batched p2p): warm-up forwards each end with send_forward_recv_forward, the
///    steady state runs a forward and a backward back to back and then one
///    send_forward_backward_recv_forward_backward, cool-down backwards each end with
///    send_backward_recv_backward; every call waits for all its transfers.
enum class P2PMode : std::uint8_t { overlapped, blocking_1f1b, blocking_interleaved };
P2PMode p2p_mode(const TrainLayout& layout);
const char* to_string(P2PMode m);

/// One step of a stage: a pass (compute), or one p2p call (exchange) whose sends carry the outputs
/// of passes that ran (a forward's activation to the next stage, a backward's gradient to the
/// previous one) and whose receives bring the inputs of passes to come. A blocking exchange waits
/// for all its transfers; a non-blocking one only for its receives.
struct PipelineStep {
  /// The passes of one side of a call: at most two (a forward's and a backward's), kept inline.
  class Passes {
   public:
    const PipelineAction* begin() const { return a_.data(); }
    const PipelineAction* end() const { return a_.data() + n_; }
    std::size_t size() const { return n_; }
    bool empty() const { return n_ == 0; }
    void push_back(const PipelineAction& a);

   private:
    std::array<PipelineAction, 2> a_{};
    std::uint8_t n_ = 0;
  };
  enum Kind : std::uint8_t { compute, exchange } kind = compute;
  bool blocking = false;  ///< exchange
  PipelineAction action;  ///< compute
  Passes sends, recvs;    ///< exchange
};

/// Whether pass `a` of `stage` receives its input (a forward its activation, a backward its
/// gradient) from another stage, and whether it sends its output to one.
bool receives_input(const PipelineAction& a, int pp, int vpp, int stage);
bool sends_output(const PipelineAction& a, int pp, int vpp, int stage);

/// Stage `stage`'s passes (pipeline_actions) with its p2p calls between them, in `mode`.
/// Exchanges with nothing to send or receive are left out.
std::vector<PipelineStep> pipeline_steps(PipelineSchedule schedule, P2PMode mode, int pp, int vpp,
                                         int micro_batches, int stage);
/// The same from the stage's pipeline_actions, into `out` (cleared first; its storage reused).
void pipeline_steps(const std::vector<PipelineAction>& actions, PipelineSchedule schedule,
                    P2PMode mode, int pp, int vpp, int stage, std::vector<PipelineStep>& out);

/// The classic bubble fraction of a schedule with equal stage times, (pp − 1) / (vpp·m + pp − 1)
/// of the ideal time: what the modeled timeline is compared with in the tests.
double ideal_bubble_fraction(int pp, int vpp, int micro_batches);

/// "F3" / "B3" (chunk suffix ".1" when vpp > 1): the label of a block in the pipeline picture.
std::string action_label(const PipelineAction& a, int vpp);

}  // namespace cocemu::layers::train
