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
/// with the emulated parts (`emulate_parts`) on layouts both can run. What it leaves out: host
/// launch gaps (small ops), and for context parallelism everything but the ring (megatron_cp_algo)
/// and Ulysses; multi-copy (micro_batch_interleave_num 2) is priced as two half micro-batches
/// whose exposed TP communication hides behind the other copy's compute (`assumption`: ideal
/// pairing; the emulated step is the reference).
#include <map>
#include <string>
#include <vector>

#include "cocemu/train/report.h"

namespace cocemu::bench {

/// Device time and exposed TP and CP communication of one model part, per micro-batch.
struct PartCost {
  double ns = 0, exposed_tp_ns = 0, exposed_cp_ns = 0;
};

struct StepParts {
  PartCost layer_fwd, layer_bwd, embedding_fwd, embedding_bwd, loss_fwd, loss_bwd;
};

/// Priced from the cost model (no threads). Throws Errc::invalid_argument for what it does not
/// model (hybrid CP, the double ring).
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
