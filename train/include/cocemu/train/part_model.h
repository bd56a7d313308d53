#pragma once
/// The parts of a training step — one layer, the embedding and the loss, forward and backward,
/// for one micro-batch on one device — priced from the cost model without running anything: the
/// same ops the emulated layer launches (GEMMs, memory-bound kernels, flash attention, TP
/// collectives, CP transfers), each priced by the function the emulator prices it with
/// (gemm_ns, memory_ns, attention_ns, model_collective, fused_kernel_ns), composed per CoC
/// strategy the way the streams run them (a script pipeline's chunks, an async reduction beside
/// the weight-gradient GEMM, a fused kernel's own pipeline), with the profile's contention rule
/// where compute and communication overlap.
///
/// This is what `cocemu plan` evaluates candidates with (no rank threads). A test compares it
/// with the emulated parts (`emulate_parts`) on layouts both can run, tests/train/test_engines.cpp
/// the iterations they compose. What it leaves out: host launch gaps (small ops); multi-copy
/// (micro_batch_interleave_num 2) is priced as two half micro-batches whose exposed TP
/// communication hides behind the other copy's compute (`assumption`: ideal pairing; the emulated
/// step is the reference).
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "cocemu/train/report.h"

namespace cocemu::bench {

/// Device time and exposed TP and CP communication of one model part, per micro-batch; and how
/// its time splits by what runs (what a DP reduction running beside it contends with, as the
/// emulated timeline's schedule shares the device): `hidden_comm_ns` while a TP or CP transfer
/// runs beside compute, `fused_ns` while a fused kernel runs; the rest of `ns` minus the exposed
/// communication is compute alone. `split_extra_ns`: how much longer the hidden transfers keep
/// the part when their link runs at half speed (each transfer of length B beside a compute run of
/// C from its start: min(C, 2B − C) when 2B > C; the exposed rest is counted by doubling it).
///
/// `group`: for parts emulated on a CP group (emulate_parts, cp > 1), whose ranks run out of
/// phase, the same split for the group as a DP collective beside the part sees it — at each
/// instant the state of the member that slows the collective most (a transfer beside compute or
/// a fused kernel, then an exposed transfer, then compute alone, then idle) — scaled to `ns`;
/// all zero otherwise.
struct PartCost {
  double ns = 0, exposed_tp_ns = 0, exposed_cp_ns = 0;
  double hidden_comm_ns = 0, fused_ns = 0, split_extra_ns = 0;
  struct Group {
    double hidden_ns = 0, fused_ns = 0, exposed_ns = 0, alone_ns = 0, idle_ns = 0;
    /// The part beside a DP reduction on its slowest member (the ranks move in lockstep), with
    /// the reduction on a link the part's transfers use, and on another.
    double slowed_shared_ns = 0, slowed_apart_ns = 0;
    double total() const { return hidden_ns + fused_ns + exposed_ns + alone_ns + idle_ns; }
  } group;
  PartCost& operator+=(const PartCost& o) {
    ns += o.ns;
    exposed_tp_ns += o.exposed_tp_ns;
    exposed_cp_ns += o.exposed_cp_ns;
    hidden_comm_ns += o.hidden_comm_ns;
    fused_ns += o.fused_ns;
    split_extra_ns += o.split_extra_ns;
    group.hidden_ns += o.group.hidden_ns;
    group.fused_ns += o.group.fused_ns;
    group.exposed_ns += o.group.exposed_ns;
    group.alone_ns += o.group.alone_ns;
    group.idle_ns += o.group.idle_ns;
    group.slowed_shared_ns += o.group.slowed_shared_ns;
    group.slowed_apart_ns += o.group.slowed_apart_ns;
    return *this;
  }
  PartCost operator*(double n) const {
    PartCost c;
    c.ns = ns * n;
    c.exposed_tp_ns = exposed_tp_ns * n;
    c.exposed_cp_ns = exposed_cp_ns * n;
    c.hidden_comm_ns = hidden_comm_ns * n;
    c.fused_ns = fused_ns * n;
    c.split_extra_ns = split_extra_ns * n;
    c.group = {group.hidden_ns * n,      group.fused_ns * n, group.exposed_ns * n,
               group.alone_ns * n,       group.idle_ns * n,  group.slowed_shared_ns * n,
               group.slowed_apart_ns * n};
    return c;
  }
};

/// The extra time a transfer of length `b` that starts beside a compute run of length `c` takes
/// when its link runs at half speed (PartCost::split_extra_ns).
inline double split_extra_ns(double c, double b) {
  return c > 0 && 2 * b > c ? std::min(c, 2 * b - c) : 0;
}

struct StepParts {
  PartCost layer_fwd, layer_bwd, embedding_fwd, embedding_bwd, loss_fwd, loss_bwd;
};

/// Priced from the cost model (no threads). Throws Errc::invalid_argument for a CP algorithm it
/// does not know.
/// With `tuned`, every TP op takes the fastest of serial and the customized_coc `values` (script
/// P = 2/4/8, -1 fused; those the platform has) for its [m, k, n] (what `cocemu tune` decides),
/// recorded there as MindSpeed's customized_coc.
StepParts price_parts(const TrainSetup& setup, std::map<std::string, int>* tuned = nullptr,
                      const std::vector<int>& values = {2, 4, 8, -1});
/// Emulated (dry run) on one TP×CP group: one micro-batch through the embedding, one layer and
/// the loss, each part measured on the modeled timeline of the rank where it takes longest.
/// Starts rank threads.
StepParts emulate_parts(const TrainSetup& setup);

}  // namespace cocemu::bench
