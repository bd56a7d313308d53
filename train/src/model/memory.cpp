// Per-device memory of a training layout (R-TR-7): parameters, gradients, optimizer state,
// activations in flight for the schedule, communication buffers.
#include <fmt/format.h>

#include <algorithm>

#include "cocemu/train/pipeline.h"
#include "cocemu/train/report.h"
#include "cocemu/train/step_model.h"

namespace cocemu::bench {

using layers::train::DecoderShape;
using layers::train::Recompute;
using layers::train::TrainLayout;

ActivationStyle emulated_layer_style() {
  return {.flash_attention = true, .dropout = false, .norm_statistics = true};
}

ActivationStyle megatron_gpt_style() {
  return {.flash_attention = false, .dropout = true, .norm_statistics = false};
}

std::vector<MemoryTerm> layer_activations(const DecoderShape& m, const TrainLayout& l,
                                          const ActivationStyle& style) {
  const double e = double(size_of(l.dtype)), t = l.tp;
  const double s = double(m.seq) / l.cp, b = double(l.micro_batch_size), tokens = s * b;
  const double h = double(m.hidden), a = double(m.heads), d = h / a, kv = double(m.kv()) * d;
  const double f = double(m.ffn), up = m.swiglu ? 2 * f : f;
  // Tensors outside the TP region are split along the sequence with SP, whole without.
  const double outside = l.sequence_parallel && l.tp > 1 ? t : 1;
  std::vector<MemoryTerm> v;
  auto add = [&](std::string name, double bytes) { v.push_back({std::move(name), bytes}); };
  if (l.recompute == Recompute::full) {
    add("layer input (full recompute checkpoint)", e * tokens * h / outside);
    return v;
  }
  add("norm1 input", e * tokens * h / outside);
  add("qkv input (norm1 output)", e * tokens * h / outside);
  add("query", e * tokens * h / t);
  add("key", e * tokens * kv / t);
  add("value", e * tokens * kv / t);
  const bool scores = !style.flash_attention && l.recompute != Recompute::selective;
  if (scores) {
    add("softmax output", e * a * s * s * b / t);
    if (style.dropout) {
      add("softmax dropout mask", a * s * s * b / t);
      add("softmax dropout output", e * a * s * s * b / t);
    }
  }
  // Flash attention keeps only its log-sum-exp; selective recompute drops that too.
  if (style.flash_attention && l.recompute != Recompute::selective)
    add("attention log-sum-exp (f32)", 4 * a * s * b / t);
  add("attention output (out-proj input)", e * tokens * h / t);
  if (style.dropout) add("attention dropout mask", tokens * h / outside);
  add("norm2 input", e * tokens * h / outside);
  add("mlp up input (norm2 output)", e * tokens * h / outside);
  add("activation input (mlp up output)", e * tokens * up / t);
  add("mlp down input (activation output)", e * tokens * f / t);
  if (style.dropout) add("mlp dropout mask", tokens * h / outside);
  if (style.norm_statistics) add("norm statistics (f32)", 2 * 4 * tokens / outside);
  return v;
}

int peak_chunks_in_flight(const TrainLayout& l, int stage) {
  return peak_chunks_in_flight(
      layers::train::pipeline_actions(l.schedule, l.pp, l.vpp, int(l.micro_batches()), stage));
}

int peak_chunks_in_flight(const std::vector<layers::train::PipelineAction>& actions, int chunk) {
  int now = 0, peak = 0;
  for (const auto& a : actions) {
    if (chunk >= 0 && a.chunk != chunk) continue;
    now += a.forward ? 1 : -1;
    peak = std::max(peak, now);
  }
  return peak;
}

int peak_loss_in_flight(const TrainLayout& l) {
  return peak_chunks_in_flight(
      layers::train::pipeline_actions(l.schedule, l.pp, l.vpp, int(l.micro_batches()), l.pp - 1),
      l.vpp - 1);
}

namespace {

double layer_parameters(const DecoderShape& m) {
  double n = 0;
  for (const double p : linear_parameters(m))
    n += p;
  return n;
}

double layers_on_stage(const DecoderShape& m, const TrainLayout& l, int stage) {
  double n = 0;
  for (int c = 0; c < l.vpp; ++c)
    n += double(layers::train::layers_of(m, l, stage, c).count);
  return n;
}

}  // namespace

std::array<double, 4> linear_parameters(const DecoderShape& m) {
  const double h = double(m.hidden), d = h / double(m.heads);
  const double qkv = (double(m.heads) + 2.0 * double(m.kv())) * d;
  const double up = m.swiglu ? 2.0 * double(m.ffn) : double(m.ffn);
  return {double(m.ffn) * h, up * h, h * h, qkv * h};
}

std::string decimal_bytes(double b) {
  if (b >= 1e9) return fmt::format("{:.1f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  return fmt::format("{:.1f} kB", b / 1e3);
}

double stage_parameters(const DecoderShape& m, const TrainLayout& l, int stage) {
  const double vocab_rows = double(layers::train::padded_vocab(m.vocab, l.tp)) / l.tp;
  double p = layers_on_stage(m, l, stage) * layer_parameters(m) / l.tp;
  if (stage == 0) p += vocab_rows * double(m.hidden);         // embedding
  if (stage == l.pp - 1) p += vocab_rows * double(m.hidden);  // LM head (untied)
  return p;
}

double model_flops_per_iteration(const DecoderShape& m, const TrainLayout& l) {
  const double s = double(m.seq), h = double(m.hidden);
  // The LM head over the padded vocabulary, as Megatron's num_floating_point_operations counts it
  // (padded_vocab_size).
  const double vocab = double(layers::train::padded_vocab(m.vocab, l.tp));
  const double per_sequence =
      double(m.num_layers) * (2 * s * layer_parameters(m) + 4 * s * s * h) + 2 * s * h * vocab;
  return 3 * per_sequence * double(l.global_batch_size);
}

MemoryEstimate estimate_memory(const DecoderShape& m, const TrainLayout& l,
                               const DeviceProfile& profile, StepMemo* memo) {
  const double e = double(size_of(l.dtype)), wide = l.dtype == DType::f64 ? 8 : 4;
  const double tokens = double(m.seq) / l.cp * double(l.micro_batch_size);
  const double outside = l.sequence_parallel && l.tp > 1 ? l.tp : 1;
  // The emulated layer keeps what flash attention keeps; unfused attention also keeps the
  // softmax output and the dropout mask (Korthikanti et al.'s count).
  ActivationStyle style = emulated_layer_style();
  if (!m.flash_attention) {
    style.flash_attention = false;
    style.dropout = true;
  }
  double per_layer = 0;
  for (const auto& t : layer_activations(m, l, style))
    per_layer += t.bytes;
  TrainLayout no_recompute = l;
  no_recompute.recompute = Recompute::none;
  double full_layer = 0;
  for (const auto& t : layer_activations(m, no_recompute, style))
    full_layer += t.bytes;
  // A stage's terms; with `out` null only their sum (the fullest stage is found first, then
  // its terms are named).
  auto stage_bytes = [&](int stage, std::vector<MemoryTerm>* out) {
    double sum = 0;
    auto add = [&](auto&& name, double bytes) {
      sum += bytes;
      if (out) out->push_back({std::string(name), bytes});
    };
    const double params = stage_parameters(m, l, stage);
    const double per_chunk = layers_on_stage(m, l, stage) / l.vpp;
    const int in_flight =
        memo ? memo->peak_chunks_in_flight(l, stage) : peak_chunks_in_flight(l, stage);
    // Only the last stage's last chunk computes the loss: its logits are kept for the
    // micro-batches of that chunk in flight (one in 1F1B and interleaved, every one in GPipe and
    // when all are warm-up), not for every chunk's.
    const int loss_in_flight = stage != l.pp - 1 ? 0
                               : memo            ? memo->peak_loss_in_flight(l)
                                                 : peak_loss_in_flight(l);
    add("parameters", params * e);
    add("gradients (main_grad)", params * (l.grad_reduce_in_fp32 ? wide : e));
    // Megatron builds the distributed optimizer on the data-parallel group with context
    // parallelism (intra_dp_cp_group): its state is sharded over dp × cp.
    add(l.distributed_optimizer ? "optimizer state (sharded over dp × cp)" : "optimizer state",
        params * 3 * wide / (l.distributed_optimizer ? double(l.dp) * l.cp : 1.0));
    const double activations = double(in_flight) * per_chunk * per_layer;
    if (out)
      add(fmt::format("activations ({} micro-batch chunks in flight)", in_flight), activations);
    else
      sum += activations;
    if (l.recompute == Recompute::full) add("recompute working set (one layer)", full_layer);
    if (stage == l.pp - 1) {
      const double logits =
          tokens * double(layers::train::padded_vocab(m.vocab, l.tp)) / l.tp * (e + 4);
      if (out)
        add(fmt::format("logits and cross-entropy (f32, {} micro-batch{} in flight)",
                        loss_in_flight, loss_in_flight == 1 ? "" : "es"),
            double(loss_in_flight) * logits);
      else
        sum += double(loss_in_flight) * logits;
    }
    add("communication buffers (p2p, SP all-gather)",
        (l.pp > 1 ? 4 * e * tokens * double(m.hidden) / outside : 0) +
            (outside > 1 ? e * tokens * double(std::max(m.hidden, m.ffn)) : 0));
    return sum;
  };
  int fullest = 0;
  double most = 0;
  for (int stage = 0; stage < l.pp; ++stage)
    if (const double bytes = stage_bytes(stage, nullptr); stage == 0 || bytes > most) {
      fullest = stage;
      most = bytes;
    }
  MemoryEstimate best;
  best.stage = fullest;
  stage_bytes(fullest, &best.terms);
  for (const auto& t : best.terms)
    best.peak_bytes += t.bytes;
  best.capacity_bytes = profile.memory_capacity;
  if (best.capacity_bytes <= 0) {
    best.verdict = fmt::format("needs {} on stage {}; the profile gives no device memory",
                               decimal_bytes(best.peak_bytes), best.stage);
    return best;
  }
  best.oom = best.peak_bytes > best.capacity_bytes;
  if (!best.oom) {
    best.verdict = fmt::format("fits: {} of {} (stage {})", decimal_bytes(best.peak_bytes),
                               decimal_bytes(best.capacity_bytes), best.stage);
    return best;
  }
  auto terms = best.terms;
  std::sort(terms.begin(), terms.end(),
            [](const MemoryTerm& x, const MemoryTerm& y) { return x.bytes > y.bytes; });
  std::string largest;
  for (std::size_t i = 0; i < std::min<std::size_t>(3, terms.size()); ++i)
    largest += fmt::format("{}{} {}", i ? ", " : "", terms[i].name, decimal_bytes(terms[i].bytes));
  best.verdict =
      fmt::format("out of memory on stage {}: needs {}, the device has {}; largest: {}", best.stage,
                  decimal_bytes(best.peak_bytes), decimal_bytes(best.capacity_bytes), largest);
  return best;
}

}  // namespace cocemu::bench
