#include "cocemu/bench/limits/estimate.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "cocemu/collectives/plan.h"
#include "cocemu/train/pipeline.h"
#include "cocemu/train/report.h"
#include "cocemu/train/trainer.h"

namespace cocemu::bench {

namespace {

/// What a process holds before the work: the binary, its libraries, the allocator's arenas
/// (measured: `cocemu bench --dry-run` peaks at 19 MB; rounded up).
constexpr double kBaselineBytes = 64.0 * (1 << 20);

/// A double estimate as bytes, saturated (an absurd request must still compare as huge).
std::int64_t to_bytes(double b) {
  return b >= 4e18 ? std::int64_t(4e18) : std::int64_t(std::max(0.0, b));
}

// kHostFlopsPerCore and kHostElementsPerCore are rates of the reference machine (runtime/limits.h),
// scaled by this machine's speed.
double compute_seconds(double flops, bool deterministic) {
  return flops / (double(host_cores()) * kHostFlopsPerCore * host_speed().gemm(deterministic));
}

double element_seconds(double elements) {
  return elements / (double(host_cores()) * kHostElementsPerCore * host_speed().elements);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// bench

/// Fitted: `cocemu bench` (the default layer, real numerics) peaked at 1.22 GB RSS while the
/// count below gives 0.77 GB; the factor covers what it leaves out (the allocator's free lists,
/// each strategy's kept outputs, the transient f32 copies of GEMM operands).
constexpr double kBenchMemoryFactor = 1.6;

Estimate estimate_bench(const BenchConfig& c, const std::string& what) {
  Estimate e;
  e.what = what;
  e.threads = std::int64_t(c.tp) * 3;
  e.way_out =
      "use --dry-run (shapes only: the modeled times of full-size layers, in seconds) or a "
      "smaller --model";
  if (c.dry_run) return e;
  const auto& l = c.layer;
  const double h = double(l.hidden), heads = double(std::max<std::int64_t>(l.heads, 1));
  const double kv = double(l.kv_heads > 0 ? l.kv_heads : l.heads), hd = h / heads;
  const double qkv = h + 2 * kv * hd, ffn = double(l.ffn), tp = double(c.tp);
  const double tokens = double(l.seq) * double(l.batch);
  const double gated = l.activation == layers::Activation::swiglu ? 3 : 2;
  const double params = h * qkv + h * h + gated * h * ffn;
  // The full bf16 weights the bench draws, the ranks' bf16 shards, their f32 main_grads and the
  // f32 copies a GEMM converts its operands to.
  const double weights = params * (2 + 2 + 4 + 4);
  // Per rank, in f32 (bf16 tensors and their f32 GEMM copies): the gathered input and its
  // gradient, norms and residuals (~6 h), q/k/v and their gradients, the MLP's intermediate
  // (gate, up, activation) and its gradients.
  const double activations = tp * 4 * tokens * (6 * h + 4 * qkv / tp + 6 * ffn / tp);
  e.memory_bytes = to_bytes(kBaselineBytes + kBenchMemoryFactor * (weights + activations));
  // Forward and backward GEMMs (2·tokens·params each way, backward twice) and causal attention
  // (4·s²·h forward, twice that backward, half the scores visible).
  const double attention = 12 * double(l.batch) * double(l.seq) * double(l.seq) * h * 0.5;
  const double per_run = 6 * tokens * params + attention;
  const double runs = double(c.strategies.size()) * double(std::max(c.repeats, 1));
  e.host_seconds = compute_seconds(per_run * runs, c.deterministic);
  return e;
}

// ---------------------------------------------------------------------------------------------
// train

/// Peak RSS of the emulated step (real numerics), fitted on eleven runs (`cocemu train` with the
/// built-in model on 1, 2, 4 and 8 nodes, 338 MB to 2.57 GB; and `--model M` on 8 ranks, hidden
/// 128 to 512, 2 or 4 layers, seq 256 or 512, vocab 2000 or 8000, 0.70 to 6.07 GB), each within
/// 0.86 to 1.19 of the fit: a start, a fixed part per rank (its threads' touched stacks, malloc
/// arenas and OpenBLAS buffers), the step model's device memory per rank times a factor (the
/// emulated ranks keep f32 copies beside the bf16 tensors and every micro-batch's saved inputs)
/// and the attention scores of every sequence, layer, head and iteration (the op records keep
/// them). A factor on device memory alone reads 0.6× the peak on 64 ranks of a small model.
constexpr double kTrainStartBytes = 36e6;
constexpr double kTrainRankBytes = 23e6;
constexpr double kTrainDeviceMemoryFactor = 2.6;
constexpr double kTrainScoreBytes = 4.5;
/// The CPU time of the emulated step (real numerics) on the reference machine (the probe's,
/// estimate.h), fitted on six decoders (`cocemu train --model M`: hidden 128 to 512, ffn 3·hidden,
/// 2 or 4 layers, seq 256 or 512, vocab 2000 or 8000; tp 2 × dp 4, 16 sequences, 3 iterations;
/// 4.3 s to 88 s of CPU, each within 12% of the fit). A start and three terms: the GEMMs (model
/// FLOPs as model_flops_per_iteration counts them: TP shards of few rows), the elementwise work of
/// every layer pass (conversions, norms, residuals, softmax, page faults: per token, layer and
/// hidden element) and the cross-entropy over the vocabulary (per token and vocabulary entry, in
/// f32). A FLOP rate alone misses by 3.5× between hidden 256 and 512: the elementwise work grows
/// with h, the GEMMs with h². Held out: the decoder of tests/robustness/test_limits.cpp (hidden
/// 256, 2 layers) at 0.90 of its CPU time, at 6 iterations 0.95, on tp 8 0.96 and tp 1 0.79.
constexpr double kTrainFlopsPerSecond = 4.4e10;
constexpr double kTrainLayerElementSeconds = 3.7e-7;
constexpr double kTrainVocabElementSeconds = 5.0e-8;
constexpr double kTrainStartSeconds = 0.67;
/// Fitted: `cocemu train --dry-run --engine emulate --model llama2-7b --iterations 10` (8 ranks,
/// 32 layers, 4 micro-batches: 10,240 layer passes) took 9.35 s of CPU (user and system) and
/// peaked at 870 MB: the op records and host work of one rank's layer pass (forward and
/// backward, its collectives) cost about this much.
constexpr double kDryPassBytes = 85e3;
constexpr double kDryPassSeconds = 0.91e-3;

Estimate estimate_train_emulated(const TrainSetup& s, const std::string& what) {
  const auto& o = s.options;
  const auto& l = o.layout;
  const double world = double(l.world());
  Estimate e;
  e.what = what;
  // The rank thread, compute and comm streams, and the dp, cp and two pipeline streams.
  e.threads = std::int64_t(world) * 7;
  const double passes = world * double(o.model.num_layers) / double(l.pp) *
                        double(l.micro_batches()) * double(l.micro_batch_interleave) *
                        double(o.iterations);
  if (s.dry_run) {
    e.way_out =
        "use --engine model (the step model prices one iteration in milliseconds), or fewer "
        "--iterations or devices";
    e.memory_bytes = to_bytes(kBaselineBytes + passes * kDryPassBytes);
    e.host_seconds = passes * kDryPassSeconds / double(host_cores());
    return e;
  }
  e.way_out =
      "use --dry-run (modeled time and memory, no numerics), or a smaller model, micro-batch or "
      "world";
  const MemoryEstimate per_device = estimate_memory(o.model, l, *s.profile);
  const double scores = double(l.global_batch_size) * double(o.model.seq) * double(o.model.seq) *
                        double(o.model.heads) * double(o.model.num_layers) * double(o.iterations);
  e.memory_bytes =
      to_bytes(kTrainStartBytes +
               world * (kTrainRankBytes + kTrainDeviceMemoryFactor * per_device.peak_bytes) +
               scores * kTrainScoreBytes);
  // Model FLOPs and layer passes of every iteration, plus the recomputed forward where the
  // layout recomputes; CPU seconds on the reference machine, then on this one's cores.
  const double recompute = l.recompute == layers::train::Recompute::full ? 4.0 / 3.0 : 1.0;
  const double iterations = double(o.iterations);
  const double tokens = double(l.global_batch_size) * double(o.model.seq) * iterations;
  const double vocab = double(layers::train::padded_vocab(o.model.vocab, l.tp));
  const HostSpeed speed = host_speed();
  const double gemm_seconds =
      model_flops_per_iteration(o.model, l) * iterations * recompute / kTrainFlopsPerSecond;
  const double element_seconds = kTrainStartSeconds +
                                 tokens * double(o.model.num_layers) * double(o.model.hidden) *
                                     recompute * kTrainLayerElementSeconds +
                                 tokens * vocab * kTrainVocabElementSeconds;
  e.host_seconds = (gemm_seconds / speed.gemm(s.deterministic) + element_seconds / speed.elements) /
                   double(host_cores());
  return e;
}

/// Fitted: `cocemu train --dry-run` of the shipped 64-node example (configs/train/) with
/// micro_batch_num 65,536 on its 8 stages (1.05 million forward and backward actions) took 2.1 s
/// of CPU (user and system: the pages it touches cost a third) and peaked at 387 MB: per action
/// of the schedule replay and its pipeline picture.
constexpr double kReplayActionBytes = 370;
constexpr double kReplayActionSeconds = 2.0e-6;

Estimate estimate_step_model(const TrainSetup& s, const std::string& what) {
  const auto& l = s.options.layout;
  Estimate e;
  e.what = what;
  e.way_out = "use a smaller global batch or a larger micro-batch (fewer micro-batches)";
  const double actions =
      2 * double(l.pp) * double(l.vpp) * double(l.micro_batches()) * l.micro_batch_interleave;
  e.memory_bytes = to_bytes(kBaselineBytes + actions * kReplayActionBytes);
  e.host_seconds = actions * kReplayActionSeconds;
  return e;
}

// ---------------------------------------------------------------------------------------------
// attention, mlpbench, collbench

Estimate estimate_attention(std::int64_t batch, std::int64_t seq, std::int64_t heads,
                            std::int64_t kv_heads, std::int64_t head_dim, int element_bytes, int cp,
                            double visible, const std::string& what) {
  Estimate e;
  e.what = what;
  e.threads = std::int64_t(cp) * 3;
  e.way_out = "use --dry-run (shapes only), a shorter --seq, or fewer heads";
  const double b = double(batch), s = double(seq), d = double(head_dim);
  const double q = b * s * double(heads) * d, kv = b * s * double(kv_heads) * d;
  // q, dout, out, dq and k, v, dk, dv, each whole and as every rank's shards, kernel layouts and
  // blocks (about twice over).
  e.memory_bytes = to_bytes(kBaselineBytes + 2.0 * (4 * q + 4 * kv) * element_bytes);
  // Every visible score: forward QKᵀ and PV (4·d FLOPs), backward five GEMMs' worth (10·d), and
  // the exp, scale and mask of forward and backward (about 8 element operations).
  // (f64 GEMMs run at half the f32 rate.)
  const double scores = b * double(heads) * s * s * visible;
  e.host_seconds = compute_seconds(scores * 14 * d * (element_bytes >= 8 ? 2 : 1), true) +
                   element_seconds(scores * 8);
  return e;
}

Estimate estimate_mlpbench(std::int64_t m, std::int64_t hidden, std::int64_t ffn, int ranks,
                           int repeats, const std::string& what) {
  Estimate e;
  e.what = what;
  e.threads = std::int64_t(ranks) * 3;
  e.way_out = "use smaller --m, --hidden or --ffn";
  const double f = double(ffn) / ranks, h = double(hidden), md = double(m);
  // x, the weights, activations and gradients of every rank, and the floor's operands.
  const double per_rank = md * (h + 2 * f) * 4 + h * 2 * f * 8;
  e.memory_bytes = to_bytes(kBaselineBytes + per_rank * 3 * ranks);
  // Six GEMMs of m·h·ffn (two forward, four backward) per strategy run and for the floor.
  const double per_run = 6 * 2 * md * h * double(ffn);
  e.host_seconds =
      compute_seconds(per_run * 6 * double(repeats), true);  // either mode: the default
  return e;
}

/// Assumption: host memory traffic per core (a copy or a reduction streams a few GB/s per core
/// on a laptop or a VM; STREAM triad on the 2-core VM: see bench/compare_peers.sh).
constexpr double kHostBytesPerCore = 5e9;

Estimate estimate_collbench(std::int64_t max_bytes, double total_bytes_moved, int ranks,
                            const std::string& what) {
  Estimate e;
  e.what = what;
  e.threads = std::int64_t(ranks) * 3;
  e.way_out = "use a smaller -e (max bytes), fewer ranks, --samples or --dry-run";
  // In and out buffers of every rank, plus the check's reference.
  e.memory_bytes = to_bytes(kBaselineBytes + double(max_bytes) * 4 * double(ranks));
  e.host_seconds = total_bytes_moved / (double(host_cores()) * kHostBytesPerCore);
  return e;
}

// ---------------------------------------------------------------------------------------------
// plan

/// Fitted on `cocemu plan --model llama2-7b --nodes 16 --global-batch 4096` (34,416 candidates,
/// groups of at most 128: 6.9 s of CPU, 135 MB): a candidate's rules, step model and result.
constexpr double kPlanCandidateSeconds = 2.0e-4;
constexpr double kPlanCandidateBytes = 2.0e3;
/// Fitted on the same search at 128 nodes (48,624 candidates, data-parallel groups up to 1,024:
/// 34.3 s of CPU, 1.89 GB): a step of a ring plan (a Step with its buffer lists, built and
/// priced), the 24.6 s and 1.73 GB the candidates leave over the 15 million ring steps of its
/// distinct collectives, the largest (1,024² steps) built on each of 2 threads at once.
constexpr double kPlanStepSeconds = 1.64e-6;
constexpr double kPlanStepBytes = 850;
/// Fitted on `cocemu validate` of an all_reduce of 1 MiB over 8,192 H100s (1,024 nodes): its
/// hierarchical plan's 8.4 million buffer references took 380 MB and at most 1.6 s.
constexpr double kPlanRefSeconds = 0.19e-6;
constexpr double kPlanRefBytes = 42;

Estimate estimate_plan(const PlanQuery& q, const std::string& what) {
  Estimate e;
  e.what = what;
  e.way_out =
      "use fewer --nodes, --search-mode recursive_programming (a few hundred candidates), or "
      "narrower --max-cp / --max-vpp";
  const int per_node = std::max(1, q.profile->topology.devices_per_node);
  double candidates = 0, seconds = 0, largest_bytes = 0;
  // What dominates a large cluster's candidates is their gradient reduction over the dp·cp group
  // (g members): the distributed optimizer's reduce_scatter and all_gather are rings of g² steps;
  // an all_reduce across nodes is the hierarchical plan, g²/L buffer references for L members per
  // node (a ring or direct plan of g² steps inside a node, or in deterministic mode). Plans past
  // collectives' limits are refused and pruned at once. The step model prices each distinct
  // collective once (its memo): they differ by group and stage size (tp, cp, pp) and optimizer.
  std::set<std::tuple<int, int, int, int, bool>> priced;
  for_each_layout(q, [&](const layers::train::TrainLayout& l) {
    candidates += 1;
    const double g = double(l.dp) * double(l.cp);
    if (g < 2 || !priced.insert({l.dp * l.cp, l.tp, l.cp, l.pp, l.distributed_optimizer}).second)
      return;
    auto ring = [&](double steps) {
      if (steps > kMaxFlatPlanSteps) return;
      seconds += steps * kPlanStepSeconds;
      largest_bytes = std::max(largest_bytes, steps * kPlanStepBytes);
    };
    if (l.distributed_optimizer) {
      ring(g * g);
      ring(g * g);
      return;
    }
    const double span = g * double(l.tp) * double(l.cp);  // devices the group's members cover
    if (q.deterministic || span <= per_node) return ring(g * g);
    const double local = std::clamp(double(per_node) / (double(l.tp) * double(l.cp)), 1.0, g);
    const double refs = g * g / local;
    if (refs > 4 * kMaxFlatPlanSteps) return;
    seconds += refs * kPlanRefSeconds;
    largest_bytes = std::max(largest_bytes, refs * kPlanRefBytes);
  });
  const int threads = std::max(1, q.threads > 0 ? q.threads : host_cores());
  e.memory_bytes = to_bytes(kBaselineBytes + candidates * kPlanCandidateBytes +
                            std::min(threads, 64) * largest_bytes);
  e.host_seconds = (candidates * kPlanCandidateSeconds + seconds) / std::min(threads, host_cores());
  return e;
}

}  // namespace cocemu::bench
