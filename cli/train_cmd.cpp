// `cocemu train`: a whole training step (TP × CP × DP × PP) — emulated rank by rank, or for
// worlds too large to run, composed by the step model.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cocemu/bench/limits/estimate.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/input_file.h"
#include "cocemu/runtime/mpi_link.h"
#include "cocemu/runtime/trace.h"
#include "cocemu/train/config.h"
#include "cocemu/train/part_model.h"
#include "cocemu/train/step_model.h"
#include "commands.h"

namespace cocemu::cli {

namespace {

struct TrainOpts {
  bench::TrainSettings flags;
  std::string config, out_dir = "cocemu-train-out", json, engine = "auto";
  bool dry_run = false, compare_coc = false;
  // Raw flag values (CLI11 fills them; copied into `flags` with their names when given).
  std::string model, profile, schedule, recompute_granularity, dtype, coc, coc_config, cp_algo,
      cp_comm_type, attention_backend, recompute_method;
  std::int64_t cp_window = 0, ulysses = 0, interleave = 0, seq = 0, first_layers = 0,
               last_layers = 0, recompute_layers = 0, coc_parallel_num = 0;
  double max_seconds = 0;
  bool cp_overlap = false;
  std::int64_t tp = 0, cp = 0, pp = 0, dp = 0, vstage = 0, nodes = 0, iterations = 0, mbs = 0,
               gbs = 0, aggregation_groups = 0;
  double bucket_mb = 0;
  bool sp = false, no_sp = false, dist_opt = false, nondeterministic = false,
       deterministic_mode = false, overlap_param_gather = false, ce_fusion = false,
       pp_scatter_gather = false, overlap_grad_reduce = false, no_overlap_grad_reduce = false,
       no_overlap_p2p = false, grads_fp32 = false, grads_bf16 = false, flash_attn = false,
       recompute_activations = false, ascend_coc = false, coc_fused_kernel = false,
       tp_comm_overlap = false;
};

/// The largest world the emulator runs rank by rank; larger ones go to the step model.
constexpr int kMaxEmulatedWorld = 64;
/// Dry runs above this many (rank × layer × micro-batch) passes go to the step model under
/// --engine auto: LLaMA2-70B at 64 devices (40960 passes) takes 112 s emulated, 0.02 s modeled.
constexpr double kMaxEmulatedPasses = 4000;

/// The --config file's text: a regular file of at most 4 MiB (input_file.h).
std::string read_text(const std::string& path) {
  return read_input_file(path, "--config");
}

bool fits(const Estimate& e, double max_seconds) {
  try {
    check_estimate(e, max_seconds);
    return true;
  } catch (const Error& err) {
    if (err.code() != Errc::too_large) throw;
    return false;
  }
}

/// An estimate for one host's share of a world spread over `hosts` hosts (its ranks' memory and
/// threads; the host time is the slowest host's, about the same share).
Estimate per_host(Estimate e, const std::shared_ptr<HostLink>& hosts) {
  if (!hosts || hosts->n_hosts() == 1) return e;
  const int n = hosts->n_hosts();
  e.memory_bytes /= n;
  e.threads = (e.threads + n - 1) / n;
  e.host_seconds /= n;
  e.what += fmt::format(" (its share on {})", hosts->describe());
  return e;
}

bench::TrainReport run_one(const bench::TrainSetup& setup, const std::string& engine,
                           layers::train::TrainResult* keep, double max_seconds,
                           const std::shared_ptr<HostLink>& hosts) {
  const auto& l = setup.options.layout;
  const int world = l.world();
  // auto: emulate what fits (up to 64 devices), unless a dry run would record more layer passes
  // than the emulator records in about ten seconds on two cores, or more than this machine's
  // memory or the time budget allow (many iterations); those go to the step model.
  const double layer_passes = double(world) * double(setup.options.model.num_layers) / l.pp *
                              double(l.micro_batches()) * l.micro_batch_interleave;
  const auto check_replay = [&] {
    check_estimate(bench::estimate_step_model(
                       setup, fmt::format("train's step model ({} micro-batches on {} stages)",
                                          l.micro_batches(), l.pp)),
                   max_seconds);
  };
  if (engine == "priced") {
    COCEMU_CHECK_ARG(setup.dry_run,
                     "--engine priced prices the iteration from the cost model, without "
                     "numerics; add --dry-run ({} devices)",
                     world);
    check_replay();
    return bench::replay_step(setup, bench::price_parts(setup));
  }
  const std::string what = fmt::format("train on {} emulated ranks ({} iterations{})", world,
                                       setup.options.iterations, setup.dry_run ? ", dry run" : "");
  const bool model =
      engine == "model" ||
      (engine == "auto" &&
       (world > kMaxEmulatedWorld ||
        (setup.dry_run &&
         (layer_passes > kMaxEmulatedPasses ||
          !fits(per_host(bench::estimate_train_emulated(setup, what), hosts), max_seconds)))));
  if (model) {
    COCEMU_CHECK_ARG(setup.dry_run || engine != "model",
                     "--engine model prices the iteration from the cost model, without numerics; "
                     "add --dry-run ({} devices)",
                     world);
    COCEMU_CHECK_ARG(setup.dry_run,
                     "{} devices are more than the {} the emulator runs with real numerics; add "
                     "--dry-run (the step model prices the iteration)",
                     world, kMaxEmulatedWorld);
    check_replay();
    return bench::model_step(setup);
  }
  COCEMU_CHECK_ARG(world <= kMaxEmulatedWorld,
                   "--engine emulate: {} devices are more than the {} the emulator runs; use "
                   "--engine model with --dry-run",
                   world, kMaxEmulatedWorld);
  check_estimate(per_host(bench::estimate_train_emulated(setup, what), hosts), max_seconds);
  WorldOptions w;
  w.hosts = hosts;
  w.profile = setup.profile;
  w.numerics = !setup.dry_run;
  w.deterministic = setup.deterministic;
  auto result = layers::train::train(setup.options, w);
  auto rep = bench::report_from_run(setup, result);
  if (keep) *keep = std::move(result);
  return rep;
}

/// The flags as settings, each named by its flag (only those given).
void collect_flags(TrainOpts& o, CLI::App* sub) {
  auto& f = o.flags;
  auto given = [&](const char* name) { return sub->count(name) > 0; };
  auto both = [&](bool a, const char* name_a, bool b, const char* name_b) {
    COCEMU_CHECK_ARG(!(a && b), "{} and {} cannot both be given", name_a, name_b);
  };
  if (given("--model")) f.model.set(o.model, "--model");
  if (given("--profile")) f.profile.set(o.profile, "--profile");
  if (given("--nodes")) f.nodes.set(o.nodes, "--nodes");
  if (given("--tensor-model-parallel-size")) f.tp.set(o.tp, "--tensor-model-parallel-size");
  if (given("--context-parallel-size")) f.cp.set(o.cp, "--context-parallel-size");
  if (given("--context-parallel-algo")) f.cp_algo.set(o.cp_algo, "--context-parallel-algo");
  if (given("--cp-comm-type")) {
    // Megatron-LM's names for the same algorithms (Transformer Engine's cp_comm_type).
    const std::string algo = o.cp_comm_type == "p2p" ? "megatron_cp_algo" : "ulysses_cp_algo";
    COCEMU_CHECK_ARG(!f.cp_algo.value || *f.cp_algo.value == algo,
                     "--cp-comm-type {} ({}) disagrees with --context-parallel-algo {}",
                     o.cp_comm_type, algo, o.cp_algo);
    f.cp_algo.set(algo, "--cp-comm-type " + o.cp_comm_type);
  }
  if (given("--cp-window-size")) f.cp_window_size.set(o.cp_window, "--cp-window-size");
  if (given("--ulysses-degree-in-cp"))
    f.ulysses_degree_in_cp.set(o.ulysses, "--ulysses-degree-in-cp");
  if (o.cp_overlap) f.cp_send_recv_overlap.set(true, "--use-cp-send-recv-overlap");
  if (given("--micro-batch-interleave-num"))
    f.micro_batch_interleave.set(o.interleave, "--micro-batch-interleave-num");
  if (given("--pipeline-model-parallel-size")) f.pp.set(o.pp, "--pipeline-model-parallel-size");
  if (given("--data-parallel-size")) f.dp.set(o.dp, "--data-parallel-size");
  if (given("--num-layers-per-virtual-pipeline-stage"))
    f.layers_per_virtual_stage.set(o.vstage, "--num-layers-per-virtual-pipeline-stage");
  if (given("--decoder-first-pipeline-num-layers"))
    f.first_stage_layers.set(o.first_layers, "--decoder-first-pipeline-num-layers");
  if (given("--decoder-last-pipeline-num-layers"))
    f.last_stage_layers.set(o.last_layers, "--decoder-last-pipeline-num-layers");
  if (given("--micro-batch-size")) f.micro_batch_size.set(o.mbs, "--micro-batch-size");
  if (given("--global-batch-size")) f.global_batch_size.set(o.gbs, "--global-batch-size");
  if (given("--seq-length")) f.seq_length.set(o.seq, "--seq-length");
  if (o.dist_opt) f.distributed_optimizer.set(true, "--use-distributed-optimizer");
  if (o.overlap_param_gather) f.overlap_param_gather.set(true, "--overlap-param-gather");
  both(o.overlap_grad_reduce, "--overlap-grad-reduce", o.no_overlap_grad_reduce,
       "--no-overlap-grad-reduce");
  if (o.overlap_grad_reduce) f.overlap_grad_reduce.set(true, "--overlap-grad-reduce");
  if (o.no_overlap_grad_reduce) f.overlap_grad_reduce.set(false, "--no-overlap-grad-reduce");
  if (o.no_overlap_p2p) f.overlap_p2p_comm.set(false, "--no-overlap-p2p-communication");
  both(o.grads_fp32, "--accumulate-allreduce-grads-in-fp32", o.grads_bf16, "--grad-reduce-in-bf16");
  if (o.grads_fp32) f.grad_reduce_in_fp32.set(true, "--accumulate-allreduce-grads-in-fp32");
  if (o.grads_bf16) f.grad_reduce_in_fp32.set(false, "--grad-reduce-in-bf16");
  if (given("--attention-backend")) {
    const bool flash = o.attention_backend != "unfused" && o.attention_backend != "local";
    both(o.flash_attn && !flash, "--use-flash-attn", !flash,
         ("--attention-backend " + o.attention_backend).c_str());
    f.flash_attention.set(flash, "--attention-backend " + o.attention_backend);
  } else if (o.flash_attn) {
    f.flash_attention.set(true, "--use-flash-attn");
  }
  if (o.ce_fusion) f.cross_entropy_loss_fusion.set(true, "--cross-entropy-loss-fusion");
  if (o.pp_scatter_gather)
    f.scatter_gather_tensors_in_pipeline.set(true, "--scatter-gather-tensors-in-pipeline");
  if (given("--recompute-granularity"))
    f.recompute.set(o.recompute_granularity, "--recompute-granularity");
  if (o.recompute_activations) {
    // Megatron: --recompute-activations is --recompute-granularity selective.
    COCEMU_CHECK_ARG(!f.recompute.value || *f.recompute.value == "selective",
                     "--recompute-activations (selective) disagrees with --recompute-granularity "
                     "{}",
                     o.recompute_granularity);
    f.recompute.set("selective", "--recompute-activations");
  }
  if (given("--recompute-method")) f.recompute_method.set(o.recompute_method, "--recompute-method");
  if (given("--recompute-num-layers"))
    f.recompute_num_layers.set(o.recompute_layers, "--recompute-num-layers");
  both(o.sp, "--sequence-parallel", o.no_sp, "--no-sequence-parallel");
  if (o.sp) f.sequence_parallel.set(true, "--sequence-parallel");
  if (o.no_sp) f.sequence_parallel.set(false, "--no-sequence-parallel");
  if (given("--schedule")) f.schedule.set(o.schedule, "--schedule");
  if (given("--dtype")) f.dtype.set(o.dtype, "--dtype");
  if (given("--coc")) f.coc.set(o.coc, "--coc");
  if (given("--coc-config")) f.coc_config.set(o.coc_config, "--coc-config");
  if (o.ascend_coc) f.use_ascend_coc.set(true, "--use-ascend-coc");
  if (o.coc_fused_kernel) f.coc_fused_kernel.set(true, "--coc-fused-kernel");
  if (given("--coc-parallel-num")) f.coc_parallel_num.set(o.coc_parallel_num, "--coc-parallel-num");
  if (o.tp_comm_overlap) f.tp_comm_overlap.set(true, "--tp-comm-overlap");
  if (given("--gradient-aggregation-group"))
    f.aggregation_groups.set(o.aggregation_groups, "--gradient-aggregation-group");
  if (given("--bucket-mb")) f.bucket_mb.set(o.bucket_mb, "--bucket-mb");
  if (given("--iterations")) f.iterations.set(o.iterations, "--iterations");
  both(o.nondeterministic, "--nondeterministic", o.deterministic_mode, "--deterministic-mode");
  if (o.nondeterministic) f.deterministic.set(false, "--nondeterministic");
  if (o.deterministic_mode) f.deterministic.set(true, "--deterministic-mode");
}

/// --compare-coc's strategies, in the order it reports them.
constexpr const char* kCompared[] = {"serial", "script-p2", "script-p4", "script-p8", "fused"};

/// `settings` with every TP linear on CoC strategy `name`: a CoC config's per-shape choices (and
/// the platform's CoC flags) give way to it, the config's other keys stay.
bench::TrainSettings strategy(bench::TrainSettings s, const char* name) {
  s.use_ascend_coc = {};
  s.coc_parallel_num = {};
  s.coc_fused_kernel = {};
  s.tp_comm_overlap = {};
  s.coc.set(name, "--compare-coc");
  s.coc_overrides_config = true;
  return s;
}

/// The ranks each host runs.
int rep_world(const bench::TrainSetup& setup, const HostLink& hosts) {
  return setup.options.layout.world() / hosts.n_hosts();
}

/// The first of `settings` that is given ("" if none).
template <class... S>
std::string first_given(const S&... settings) {
  std::string out;
  auto one = [&](const auto& s) {
    if (out.empty() && s.value) out = s.where;
  };
  (one(settings), ...);
  return out;
}

/// One stderr line per CoC config whose customized_coc matches none of the run's GEMM shapes.
void warn_unmatched_coc(const bench::TrainSettings& settings, const bench::TrainSetup& setup) {
  const auto& per_shape = setup.options.linear.per_shape;
  if (!settings.coc_config.value || !per_shape) return;
  const std::string line = bench::unmatched_coc_warning(
      *settings.coc_config.value, per_shape->customized_coc, bench::run_gemm_keys(setup));
  if (!line.empty()) std::fprintf(stderr, "cocemu train: %s\n", line.c_str());
}

}  // namespace

void add_train(CLI::App& app) {
  auto o = std::make_shared<TrainOpts>();
  CLI::App* sub = app.add_subcommand(
      "train",
      "a whole training step: TP × CP × DP × PP, GPipe/1F1B/interleaved pipelines, bucketed DP "
      "gradient reduction, distributed optimizer, recompute, CoC — iteration time, MFU, bubble, "
      "exposed comm by kind, memory. Takes Megatron-LM's and MindSpeed's flags for what it "
      "models (the flags `cocemu plan` writes) and MindFormers YAML");
  sub->add_option("--config", o->config,
                  "a MindFormers-style YAML (parallel, parallel_config, recompute_config, "
                  "runner_config, model.model_config, and cocemu's own train: section), read with "
                  "MindFormers' meaning: runner_config.batch_size is one copy, pipeline_stage 1 "
                  "counts micro-batches with gradient_accumulation_steps, gradients_mean false in "
                  "semi-auto parallel (the default parallel_mode) gives averaged gradients; paths "
                  "inside resolve relative to the file; flags that disagree with it are an error");
  sub->add_option("--model", o->model,
                  "model config (name under configs/models/ or a path); default: a tiny built-in "
                  "decoder for real-numerics runs");
  sub->add_option("--profile", o->profile, "device profile (name under configs/devices/ or path)");
  number<std::int64_t>(sub, "--nodes", o->nodes, "nodes; the world is nodes × devices per node", 1,
                       4096);
  number<std::int64_t>(sub, "--tensor-model-parallel-size", o->tp, "tp", 1, 1 << 16);
  number<std::int64_t>(sub, "--context-parallel-size", o->cp, "cp", 1, 1 << 16);
  sub->add_option("--context-parallel-algo", o->cp_algo,
                  "MindSpeed's: megatron_cp_algo (ring, default), ulysses_cp_algo or "
                  "hybrid_cp_algo");
  sub->add_option("--cp-comm-type", o->cp_comm_type,
                  "Megatron-LM's: p2p (the ring, megatron_cp_algo) or a2a (Ulysses)")
      ->check(CLI::IsMember({"p2p", "a2a"}));
  number<std::int64_t>(sub, "--cp-window-size", o->cp_window,
                       "double ring window (ring or hybrid, context parallel > 1)", 1, 1 << 16);
  number<std::int64_t>(sub, "--ulysses-degree-in-cp", o->ulysses, "hybrid_cp_algo's Ulysses degree",
                       1, 1 << 16);
  sub->add_flag("--use-cp-send-recv-overlap", o->cp_overlap,
                "ring sends and receives on two communicators");
  number<std::int64_t>(sub, "--micro-batch-interleave-num", o->interleave,
                       "MindSpore's multi-copy: 2 splits each micro-batch in two copies whose "
                       "communication and compute overlap",
                       1, 2);
  number<std::int64_t>(sub, "--pipeline-model-parallel-size", o->pp, "pp", 1, 1 << 16);
  number<std::int64_t>(sub, "--data-parallel-size", o->dp, "dp (default: the rest of the world)", 1,
                       1 << 20);
  number<std::int64_t>(sub, "--num-layers-per-virtual-pipeline-stage", o->vstage,
                       "layers per model chunk: interleaved 1F1B", 1, 1 << 16);
  number<std::int64_t>(sub, "--decoder-first-pipeline-num-layers", o->first_layers,
                       "layers of the first pipeline stage (the middle stages split the rest "
                       "evenly)",
                       1, 1 << 16);
  number<std::int64_t>(sub, "--decoder-last-pipeline-num-layers", o->last_layers,
                       "layers of the last pipeline stage", 1, 1 << 16);
  number<std::int64_t>(sub, "--micro-batch-size", o->mbs,
                       "sequences per micro-batch (both copies together with multi-copy)", 1,
                       1 << 20);
  number<std::int64_t>(sub, "--global-batch-size", o->gbs, "sequences per iteration", 1,
                       std::int64_t(1) << 30);
  number<std::int64_t>(sub, "--seq-length", o->seq, "sequence length (default: the model config's)",
                       1, std::int64_t(1) << 24);
  sub->add_flag("--use-distributed-optimizer", o->dist_opt,
                "shard master weights and Adam state over dp (reduce-scatter, all-gather)");
  sub->add_flag("--overlap-grad-reduce", o->overlap_grad_reduce,
                "each gradient bucket's DP reduction starts when its last gradient is final "
                "(cocemu's default)");
  sub->add_flag("--no-overlap-grad-reduce", o->no_overlap_grad_reduce,
                "every DP reduction after the backward (Megatron-LM without "
                "--overlap-grad-reduce; cocemu's own flag)");
  sub->add_flag("--no-overlap-p2p-communication", o->no_overlap_p2p,
                "interleaved 1F1B: blocking batched p2p calls (Megatron-LM's flag; the 2021-2022 "
                "papers' runs); non-interleaved 1F1B always blocks");
  sub->add_flag("--overlap-param-gather", o->overlap_param_gather,
                "the distributed optimizer's parameter all-gathers overlap the next forward "
                "(each bucket waited where the forward first reads it)");
  sub->add_flag("--accumulate-allreduce-grads-in-fp32", o->grads_fp32,
                "gradients accumulated and reduced in f32 (the default; Megatron forces it with "
                "bf16)");
  sub->add_flag("--grad-reduce-in-bf16", o->grads_bf16,
                "gradients reduced in bf16 (priced by the step model only: --dry-run)");
  sub->add_flag("--use-flash-attn", o->flash_attn, "flash attention (the default)");
  sub->add_option("--attention-backend", o->attention_backend,
                  "Megatron-LM's: flash, fused, auto (flash-style kernels, the default) or "
                  "unfused, local (core attention as GEMMs and a softmax over the scores)")
      ->check(CLI::IsMember({"flash", "fused", "auto", "unfused", "local"}));
  sub->add_flag("--cross-entropy-loss-fusion", o->ce_fusion,
                "the loss as Megatron's jit-fused cross-entropy kernels (fewer passes over the "
                "logits, one all_reduce for the target logits and exp-sums); same numerics");
  sub->add_flag("--scatter-gather-tensors-in-pipeline", o->pp_scatter_gather,
                "Megatron 2021-2022: without SP, each TP rank sends its 1/tp slice of a pipeline "
                "tensor and the receiving stage all-gathers them over TP; same numerics");
  sub->add_option("--recompute-granularity", o->recompute_granularity, "full or selective");
  sub->add_flag("--recompute-activations", o->recompute_activations,
                "selective recompute (Megatron's shorthand)");
  sub->add_option("--recompute-method", o->recompute_method,
                  "with full recompute: uniform (the modeled one)");
  number<std::int64_t>(sub, "--recompute-num-layers", o->recompute_layers,
                       "with full recompute: 1 (the modeled one)", 1, 1 << 16);
  sub->add_flag("--sequence-parallel", o->sp, "sequence parallelism (default with tp > 1)");
  sub->add_flag("--no-sequence-parallel", o->no_sp, "no sequence parallelism");
  sub->add_option("--schedule", o->schedule,
                  "gpipe, 1f1b or interleaved (default: 1f1b; interleaved with virtual stages)");
  sub->add_option("--dtype", o->dtype, "bf16 (default), f32 or f64");
  sub->add_option("--coc", o->coc,
                  "cocemu's shorthand: every TP linear runs this CoC strategy — serial, "
                  "script-p2/p4/p8 or fused — on any profile (not with a CoC config or the "
                  "platform's CoC flags)");
  sub->add_option("--coc-config", o->coc_config,
                  "a CoC config with customized_coc per GEMM shape (from `cocemu tune` or "
                  "`cocemu plan`), standing in for MindSpeed's user_config");
  sub->add_flag("--use-ascend-coc", o->ascend_coc,
                "MindSpeed's CoC (profiles whose tp_overlap has mindspeed_coc): shapes not in the "
                "CoC config's customized_coc run --coc-parallel-num, or the fused kernel with "
                "--coc-fused-kernel");
  number<std::int64_t>(sub, "--coc-parallel-num", o->coc_parallel_num,
                       "MindSpeed's script-side split: 1, 2, 4 or 8", 1, 8);
  sub->add_flag("--coc-fused-kernel", o->coc_fused_kernel,
                "MindSpeed's LCOC fused kernels (tp_overlap lcoc_fused)");
  sub->add_flag("--tp-comm-overlap", o->tp_comm_overlap,
                "Megatron-LM's TP overlap on Transformer Engine's userbuffers (tp_overlap "
                "te_userbuffers; needs --sequence-parallel); priced as TE runs it: the profile's "
                "fused: steps (split GEMMs, ring exchange, SMs the reduce-scatter takes)");
  number<std::int64_t>(sub, "--gradient-aggregation-group", o->aggregation_groups,
                       "MindFormers' fusion groups of the layers' gradients (one group with "
                       "pipeline stages)",
                       1, 1 << 20);
  number<double>(
      sub, "--bucket-mb", o->bucket_mb,
      "MB (1e6 bytes) of reduced gradients per DP bucket on every stage, as PyTorch DDP's "
      "bucket_cap_mb (default: Megatron's DDP buckets, max(40M, 1M x dp) elements on "
      "the first stage's first chunk, one bucket elsewhere)",
      1e-6, 1e6);
  number<std::int64_t>(sub, "--iterations", o->iterations, "training iterations (default 3)", 1,
                       1000);
  sub->add_flag("--dry-run", o->dry_run, "shapes only: modeled time and memory, no numerics");
  sub->add_option("--engine", o->engine,
                  "emulate (rank by rank, up to 64 devices), model (the step model on emulated "
                  "parts, dry runs), priced (the step model on priced parts, as `cocemu plan` "
                  "evaluates candidates) or auto")
      ->check(CLI::IsMember({"auto", "emulate", "model", "priced"}))
      ->capture_default_str();
  sub->add_flag("--compare-coc", o->compare_coc,
                "run the step with each CoC strategy and report each one's gain over serial");
  sub->add_flag("--nondeterministic", o->nondeterministic,
                "collectives as NCCL/HCCL run them (multi-channel rings, hierarchical all_reduce, "
                "arrival-order sums) instead of rank-ordered sums (R-CO-5)");
  sub->add_flag("--deterministic-mode", o->deterministic_mode,
                "rank-ordered sums (Megatron-LM's flag; cocemu's default)");
  sub->add_option("--out-dir", o->out_dir, "trace, SVG and train.json go here")
      ->capture_default_str();
  sub->add_option("--json", o->json, "write the report here (default: OUT_DIR/train.json)");
  max_seconds_option(sub, o->max_seconds);
  sub->callback([o, sub] {
    collect_flags(*o, sub);
    bench::TrainSettings settings = o->flags;
    if (!o->config.empty())
      settings = bench::merge_settings(o->flags,
                                       bench::parse_train_config(read_text(o->config), o->config));
    COCEMU_CHECK_ARG(!(o->compare_coc && settings.coc.value),
                     "--compare-coc runs every CoC strategy; do not also give {}",
                     settings.coc.where);
    const bench::TrainSetup setup = bench::resolve_settings(settings, o->dry_run);
    for (const std::string& note : setup.notes)
      std::fprintf(stderr, "cocemu train: note: %s\n", note.c_str());
    warn_unmatched_coc(settings, setup);
    check_output_dir("--out-dir", o->out_dir);
    if (!o->json.empty()) check_output_file("--json", o->json);

    // Under mpirun every process is one host of the world: each runs its ranks, host 0 reports.
    const std::shared_ptr<HostLink> hosts = started_by_mpirun() ? mpi_hosts() : nullptr;
    layers::train::TrainResult kept;
    const bench::TrainReport rep =
        run_one(setup, o->engine, &kept, time_budget(o->max_seconds), hosts);
    if (hosts && hosts->host() != 0) {
      std::printf("cocemu train: %s ran ranks %d..%d over %s; host 0 reports\n",
                  hosts->describe().c_str(), hosts->host() * rep_world(setup, *hosts),
                  (hosts->host() + 1) * rep_world(setup, *hosts) - 1, hosts->transport().c_str());
      if (o->compare_coc)  // host 0's runs are this host's too
        for (const char* name : kCompared)
          run_one(bench::resolve_settings(strategy(settings, name), o->dry_run), o->engine, nullptr,
                  time_budget(o->max_seconds), hosts);
      return;
    }
    if (hosts)
      std::printf("# %d hosts over %s; this is host 0\n", hosts->n_hosts(),
                  hosts->transport().c_str());
    std::fputs(bench::format_report(rep).c_str(), stdout);
    nlohmann::json j = bench::to_json(rep);
    j["coc"] = setup.coc_name;
    if (o->compare_coc) {
      const std::string configured =
          first_given(settings.coc_config, settings.use_ascend_coc, settings.tp_comm_overlap);
      std::printf("\n# --compare-coc: the same step with each CoC strategy%s\n",
                  setup.dry_run ? " (dry run: modeled only)" : "");
      if (!configured.empty())
        std::printf(
            "# each strategy below overrides the per-shape choices of %s (its other keys stay); "
            "'as configured' is the run above\n",
            configured.c_str());
      std::printf("%-14s %14s %10s %12s\n", "strategy", "iteration ms", "MFU %", "gain vs serial");
      nlohmann::json rows = nlohmann::json::array();
      double serial_ns = 0;
      auto row = [&](const std::string& name, const bench::TrainReport& r) {
        if (serial_ns == 0) serial_ns = double(r.iteration_ns);
        const double gain = serial_ns / double(r.iteration_ns) - 1;
        std::printf("%-14s %14.3f %10.1f %+11.1f%%\n", name.c_str(), double(r.iteration_ns) / 1e6,
                    100 * r.mfu, 100 * gain);
        rows.push_back({{"coc", name},
                        {"iteration_ns", r.iteration_ns},
                        {"mfu", r.mfu},
                        {"gain_over_serial", gain}});
      };
      for (const char* name : kCompared)
        row(name, run_one(bench::resolve_settings(strategy(settings, name), o->dry_run), o->engine,
                          nullptr, time_budget(o->max_seconds), hosts));
      if (!configured.empty()) row("as configured", rep);
      j["compare_coc"] = rows;
    }
    const std::string base = o->out_dir + "/train";
    std::printf("\n# outputs%s\n", setup.dry_run ? " (dry run: modeled only)" : "");
    write_file("--out-dir", base + ".pipeline.svg", bench::pipeline_svg(rep));
    std::printf("pipeline     %s.pipeline.svg\n", base.c_str());
    if (rep.source == "emulated") {
      write_chrome_trace(kept.run, base + ".trace.json");
      write_svg_timeline(kept.run, base + ".svg",
                         fmt::format("cocemu train: {} — {}{}", rep.model, rep.layout,
                                     setup.dry_run ? " [dry run: no numerics]" : ""));
      std::printf("trace        %s.trace.json  timeline %s.svg\n", base.c_str(), base.c_str());
    }
    const std::string json_path = o->json.empty() ? base + ".json" : o->json;
    write_file(o->json.empty() ? "--out-dir" : "--json", json_path, j.dump(2) + "\n");
    std::printf("results      %s\n", json_path.c_str());
  });
}

}  // namespace cocemu::cli
