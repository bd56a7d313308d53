#include "cocemu/train/validate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include "cocemu/collectives/plan.h"
#include "cocemu/layers/coc_config.h"
#include "cocemu/runtime/cost_model.h"
#include "cocemu/runtime/detail/yaml_reader.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/input_file.h"
#include "cocemu/runtime/profile.h"
#include "cocemu/train/config.h"
#include "cocemu/train/part_model.h"
#include "cocemu/train/plan.h"
#include "cocemu/train/step_model.h"

namespace cocemu::bench {

namespace {

/// The modeled bandwidth (GB/s) of `op` on `n` ranks over a buffer of `bytes` as the source
/// counts it (the whole buffer; all_gather's output, reduce_scatter's input), placed on ranks
/// 0..n−1 of the profile's cluster: busbw (nccl-tests' correction) or algbw (bytes / time).
double modeled_collective(const DeviceProfile& p, const std::string& op_name, int n,
                          std::int64_t bytes, DType t, bool busbw) {
  COCEMU_CHECK_ARG(
      op_name == "all_reduce" || op_name == "all_gather" || op_name == "reduce_scatter",
      "validate: op '{}' unsupported; allowed all_reduce, all_gather, reduce_scatter", op_name);
  const CollOp op = op_name == "all_reduce"   ? CollOp::all_reduce
                    : op_name == "all_gather" ? CollOp::all_gather
                                              : CollOp::reduce_scatter;
  p.check_world(n);
  const std::int64_t count = bytes / std::int64_t(size_of(t));
  // Our count is the per-rank piece for all_gather and reduce_scatter.
  const std::int64_t plan_count = op == CollOp::all_reduce ? count : count / n;
  std::vector<int> ranks(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    ranks[std::size_t(r)] = r;
  // The libraries' plans are not rank-ordered: price the non-deterministic ones.
  const std::uint64_t per_rank = std::uint64_t(plan_count) * size_of(t);
  const double ns = model_collective(p, op, ranks, plan_count, t, per_rank, Algorithm::automatic,
                                     /*deterministic=*/false)
                        .cost.total_ns;
  const double algbw = double(bytes) / ns;  // bytes per ns = GB/s
  if (!busbw) return algbw;
  return algbw * (op == CollOp::all_reduce ? 2.0 * (n - 1) / n : double(n - 1) / n);
}

/// A published run as its reference states it: the model and the settings of its layout.
struct Published {
  layers::train::DecoderShape model;
  TrainSettings settings;
};

/// A published run's model, GPU count and layout as published (and the settings the source
/// leaves open, marked `assumption` in the file), set up as `cocemu train --dry-run` sets it up:
/// the `layout:` map holds the fields of `cocemu train`'s own `train:` section and goes through
/// the same reader and resolver (config.h).
Published published_settings(detail::YamlReader& e, Reference& r, const DeviceProfile& profile) {
  Published pub;
  layers::train::DecoderShape& m = pub.model;
  {
    auto mm = e.map("model");
    m.name = r.name;
    m.hidden = mm.integer("hidden", 1, 1 << 20);
    m.heads = mm.integer("heads", 1, 1 << 16);
    m.kv_heads = mm.has("kv_heads") ? mm.integer("kv_heads", 1, 1 << 16) : 0;
    m.ffn = mm.has("ffn") ? mm.integer("ffn", 1, 1 << 22) : 4 * m.hidden;
    m.num_layers = mm.integer("layers", 1, 1 << 12);
    m.vocab = mm.integer("vocab", 1, 1 << 24);
    m.seq = mm.integer("seq", 1, 1 << 24);
    m.swiglu = mm.boolean_or("swiglu", false);
    const std::string attention = mm.string_or("attention", "flash");
    COCEMU_CHECK(attention == "flash" || attention == "unfused", Errc::parse_error,
                 "{}: attention '{}'; allowed flash, unfused", mm.where(), attention);
    m.flash_attention = attention == "flash";
    m.masked_softmax_fusion = mm.boolean_or("masked_softmax_fusion", true);
    COCEMU_CHECK(m.masked_softmax_fusion || !m.flash_attention, Errc::parse_error,
                 "{}: masked_softmax_fusion: false needs attention: unfused (flash attention "
                 "has no separate softmax)",
                 mm.where());
    mm.finish();
  }
  const int gpus = int(e.integer("gpus", 1, 1 << 20));
  TrainSettings& s = pub.settings;
  {
    auto ll = e.map("layout");
    read_layout_fields(ll, s);
    ll.finish();
    // What every published run must state (or mark as an assumption in the file).
    const std::pair<const char*, bool> required[] = {
        {"tp", bool(s.tp.value)},
        {"pp", bool(s.pp.value)},
        {"micro_batch_size", bool(s.micro_batch_size.value)},
        {"global_batch_size", bool(s.global_batch_size.value)},
        {"recompute", bool(s.recompute.value)},
        {"sequence_parallel", bool(s.sequence_parallel.value)},
        {"distributed_optimizer", bool(s.distributed_optimizer.value)},
        {"overlap_grad_reduce", bool(s.overlap_grad_reduce.value)}};
    for (const auto& [key, given] : required)
      COCEMU_CHECK(given, Errc::parse_error, "{}: missing required key '{}.{}'", ll.where(),
                   ll.path(), key);
  }
  const int per_node = profile.topology.devices_per_node;
  const std::int64_t inner = *s.tp.value * s.pp.value.value() * s.cp.value.value_or(1);
  COCEMU_CHECK(gpus % per_node == 0 && gpus % inner == 0, Errc::parse_error,
               "{}: {} GPUs must fill whole nodes of {} and be divisible by tp·pp·cp = {}",
               e.where(), gpus, per_node, inner);
  s.nodes.set(gpus / per_node, e.where() + " gpus");
  r.nodes = gpus / per_node;
  return pub;
}

/// The run set up as `cocemu train --dry-run` sets it up, with NCCL/HCCL's algorithms (as the
/// published runs used them).
std::shared_ptr<TrainSetup> resolve_published(const Published& pub, const DeviceProfile& profile) {
  auto setup = std::make_shared<TrainSetup>(resolve_settings(
      pub.settings, true, pub.model, "published", std::make_shared<const DeviceProfile>(profile)));
  setup->deterministic = false;
  return setup;
}

/// What makes two rows the same run: the model's shape and how it is split and computed per
/// micro-batch (the parallel degrees, micro-batch, recompute, sequence parallelism). The global
/// batch, the overlap switches and the CoC mode are left out: they change how a run's parts are
/// scheduled, not which layer is measured.
std::string run_signature(const TrainSetup& setup) {
  const auto& m = setup.options.model;
  const auto& l = setup.options.layout;
  return fmt::format(
      "h{} a{} kv{} f{} L{} V{} s{} swiglu{} flash{} msf{} | tp{} cp{} pp{} vpp{} dp{} "
      "stages[{}] mbs{} recompute{} sp{}",
      m.hidden, m.heads, m.kv(), m.ffn, m.num_layers, m.vocab, m.seq, m.swiglu, m.flash_attention,
      m.masked_softmax_fusion, l.tp, l.cp, l.pp, l.vpp, l.dp, fmt::join(l.stage_layers, ","),
      l.micro_batch_size, int(l.recompute), l.sequence_parallel);
}

std::shared_ptr<TrainSetup> published_setup(detail::YamlReader& e, Reference& r,
                                            const DeviceProfile& profile) {
  return resolve_published(published_settings(e, r, profile), profile);
}

/// A published training run (kind: training), modeled by `cocemu train`'s step model. Returns
/// the setup; `r` gets the modeled model-TFLOP/s per device and the published figure converted
/// to model FLOPs.
std::shared_ptr<const TrainSetup> modeled_training(detail::YamlReader& e, Reference& r,
                                                   const DeviceProfile& profile) {
  const std::shared_ptr<TrainSetup> setup = published_setup(e, r, profile);
  const auto& m = setup->options.model;
  const auto& l = setup->options.layout;
  const int gpus = l.tp * l.cp * l.pp * l.dp;
  // What the source's figure counts: model FLOPs (no recompute), or Narayanan et al.'s hardware
  // FLOPs with full recompute, 96·B·s·l·h²·(1 + s/6h + V/16lh), converted to model FLOPs
  // 72·B·s·l·h²·(1 + s/6h + V/12lh) — the formula model_flops_per_iteration uses.
  const std::string flops = e.string("flops");
  COCEMU_CHECK(flops == "model" || flops == "hardware_full_recompute" ||
                   flops == "iteration_seconds" || flops == "tokens_per_second_per_device",
               Errc::parse_error,
               "{}: flops '{}'; allowed model, hardware_full_recompute, iteration_seconds, "
               "tokens_per_second_per_device",
               e.where(), flops);
  r.published_as_stated = r.published;
  if (flops == "iteration_seconds") {
    // A published iteration time: the model FLOPs of one iteration over it, per device.
    const double work = model_flops_per_iteration(m, l);
    r.published = work / gpus / r.published_as_stated / 1e12;
    r.conversion = fmt::format("s per iteration: {:.4g} model FLOPs / {} devices / {} s", work,
                               gpus, r.published_as_stated);
  } else if (flops == "tokens_per_second_per_device") {
    // MindSpeed-LLM's throughput (tokens/p/s): the iteration's tokens over all devices and the
    // rate give the iteration time, whose model FLOPs per device are the figure compared.
    const double tokens = double(l.global_batch_size) * double(m.seq);
    const double seconds = tokens / (r.published_as_stated * gpus);
    const double work = model_flops_per_iteration(m, l);
    r.published = work / gpus / seconds / 1e12;
    r.conversion = fmt::format(
        "tokens/s per device: {:.4g} tokens / ({} x {} devices) = {:.4g} s per iteration", tokens,
        r.published_as_stated, gpus, seconds);
  } else if (flops == "hardware_full_recompute") {
    const double s = double(m.seq), h = double(m.hidden), L = double(m.num_layers),
                 V = double(m.vocab);
    const double factor =
        72 * (1 + s / (6 * h) + V / (12 * L * h)) / (96 * (1 + s / (6 * h) + V / (16 * L * h)));
    r.published *= factor;
    r.conversion = fmt::format("hardware FLOPs with full recompute x {:.3f} = model FLOPs", factor);
  } else {
    r.conversion = "model FLOPs as published";
  }
  r.unit = "model TFLOP/s per device";
  r.run_signature = run_signature(*setup);
  const TrainReport rep = model_step(*setup);
  r.modeled = rep.tflops_per_device;
  r.iteration_ms = double(rep.iteration_ns) / 1e6;
  r.bubble_fraction = rep.bubble_fraction;
  for (const auto& [kind, ns] : rep.exposed_comm_ns)
    r.exposed_comm_ms[kind] = ns / 1e6;
  return setup;
}

}  // namespace

bool Validation::is_test_row(std::size_t i) const {
  COCEMU_CHECK_ARG(i < rows.size(), "validate: row {} out of range; {} rows", i, rows.size());
  if (!rows[i].fitted.empty()) return false;
  if (rows[i].repeats_fit.empty()) return true;
  return std::any_of(calibration.begin(), calibration.end(), [&](const Calibration& c) {
    return std::find(c.tested_by.begin(), c.tested_by.end(), i) != c.tested_by.end();
  });
}

Validation validate(const std::string& text, const std::string& origin) {
  auto top = detail::YamlReader::parse(text, origin, "validation references");
  Validation v;
  for (detail::YamlReader e : top.sequence("references")) {
    Reference r;
    r.name = e.string("name");
    r.kind = e.string("kind");
    r.device = e.string("device");
    r.published = e.number("published", -1e12, 1e12);
    r.source = e.string("source");
    if (e.has("assumption")) {
      r.assumption = e.string("assumption");
      COCEMU_CHECK(!r.assumption.empty(), Errc::parse_error,
                   "{}: assumption is empty; say which settings no source states and why",
                   e.where());
    }
    DeviceProfile p = load_named_profile(r.device);
    for (const char* list : {"fitted", "tests"})
      if (e.has(list))
        for (const auto& [key, where] : e.strings(list)) {
          const auto keys = p.scalable_keys();
          COCEMU_CHECK(std::find(keys.begin(), keys.end(), key) != keys.end(), Errc::parse_error,
                       "{}: {} parameter '{}' is not a parameter of profile '{}'", where,
                       list == std::string("fitted") ? "fitted" : "tested", key, r.device);
          (list == std::string("fitted") ? r.fitted : r.tests).push_back(key);
        }
    // Kernel and collective references measure one kernel at a time: they are priced at the
    // isolated rates; training runs and layers at what a kernel sustains inside a step.
    DeviceProfile isolated = p;
    isolated.in_training_efficiency = 1.0;
    isolated.memory_in_training_efficiency = 1.0;
    DType t = DType::f32;
    if (e.has("dtype")) {
      const std::string name = e.string("dtype");
      try {
        t = parse_dtype(name);
      } catch (const Error&) {
        COCEMU_FAIL(Errc::parse_error,
                    "{}: dtype '{}' is unknown; allowed f32, f64, f16, bf16, "
                    "i8, i32",
                    e.where(), name);
      }
    }
    if (r.kind == "collective") {
      const std::string op = e.string("op");
      const int n = int(e.integer("ranks", 2, 1 << 16));
      const std::int64_t bytes = e.integer("bytes", 1, std::int64_t(1) << 40);
      const std::string metric = e.string("metric");
      COCEMU_CHECK(metric == "busbw" || metric == "algbw", Errc::parse_error,
                   "{}: metric '{}' unknown; allowed busbw, algbw", e.where(), metric);
      if (e.has("inter_node_per_device_bytes_per_s"))
        p.topology.inter_per_device = e.number("inter_node_per_device_bytes_per_s", 1e6, 1e15);
      r.nodes = (n + p.topology.devices_per_node - 1) / p.topology.devices_per_node;
      r.unit = "GB/s " + metric;
      try {
        r.modeled = modeled_collective(p, op, n, bytes, t, metric == "busbw");
      } catch (const Error& err) {  // say which reference (a plan too large to build)
        throw Error(err.code(), fmt::format("{}: '{}': {}", e.where(), r.name, err.message()),
                    err.origin());
      }
    } else if (r.kind == "gemm") {
      const std::int64_t m = e.integer("m", 1, 1 << 24), n = e.integer("n", 1, 1 << 24),
                         k = e.integer("k", 1, 1 << 24);
      r.unit = "TFLOPS";
      r.modeled = 2.0 * double(m) * double(n) * double(k) / gemm_ns(isolated, m, n, k, t) / 1e3;
    } else if (r.kind == "attention") {
      const std::int64_t s = e.integer("seq", 1, 1 << 24), d = e.integer("head_dim", 1, 1024),
                         batch = e.integer("batch", 1, 1 << 24),
                         heads = e.integer("heads", 1, 1 << 16);
      const double visible = e.boolean("causal") ? 0.5 : 1.0;
      const std::string pass = e.string("pass");
      COCEMU_CHECK(pass == "forward" || pass == "backward" || pass == "forward+backward",
                   Errc::parse_error, "{}: pass '{}'; allowed forward, backward, forward+backward",
                   e.where(), pass);
      // Priced as the layers price core attention (cost_model.h attention_ns); FLOPs counted as
      // FlashAttention's benchmarks count them (4·b·h·s²·d·visible forward, 2.5 times that
      // backward).
      const std::int64_t bh = batch * heads;
      const double fwd_flops = 4.0 * double(bh) * double(s) * double(s) * double(d) * visible;
      double flops = 0, ns = 0;
      if (pass != "backward") {
        flops += fwd_flops;
        ns += attention_ns(isolated, bh, s, s, d, t, visible, false);
      }
      if (pass != "forward") {
        flops += 2.5 * fwd_flops;
        ns += attention_ns(isolated, bh, s, s, d, t, visible, true);
      }
      r.unit = "TFLOPS";
      r.modeled = flops / ns / 1e3;
    } else if (r.kind == "memory") {
      const std::int64_t bytes = e.integer("bytes", 1, std::int64_t(1) << 40);
      const std::string counted = e.string("counted");
      COCEMU_CHECK(counted == "input" || counted == "moved", Errc::parse_error,
                   "{}: counted '{}' unknown; allowed input (the source divides the input bytes "
                   "by time), moved (reads plus writes)",
                   e.where(), counted);
      // An elementwise kernel reads its input and writes as much.
      r.unit = "GB/s";
      r.modeled = double(bytes) / memory_ns(isolated, std::uint64_t(2 * bytes)) *
                  (counted == "moved" ? 2.0 : 1.0);
    } else if (r.kind == "training") {
      r.training = modeled_training(e, r, p);
    } else if (r.kind == "coc_gain") {
      // A published end-to-end gain of the fused CoC kernels over the serial TP linears: the
      // same run modeled with each (as `cocemu train --compare-coc`), gain = serial / fused - 1.
      Published pub = published_settings(e, r, p);
      const TrainSettings& s = pub.settings;
      COCEMU_CHECK(!s.coc.value && !s.coc_config.value && !s.use_ascend_coc.value &&
                       !s.coc_fused_kernel.value && !s.tp_comm_overlap.value,
                   Errc::parse_error,
                   "{}: a coc_gain reference compares serial with fused itself; its layout must "
                   "not set coc (or a CoC switch)",
                   e.where());
      // The gain of one layout; returns the serial iteration (ns) through `serial_ns`.
      auto gain = [&](Published run, double* serial_ns) {
        run.settings.coc.set("serial", e.where());
        const auto serial_setup = resolve_published(run, p);
        const double serial = double(model_step(*serial_setup).iteration_ns);
        run.settings.coc.set("fused", e.where());
        const TrainReport f = model_step(*resolve_published(run, p));
        if (serial_ns) *serial_ns = serial;
        if (r.run_signature.empty()) r.run_signature = run_signature(*serial_setup);
        return 100.0 * (serial / double(f.iteration_ns) - 1);
      };
      double serial = 0;
      r.unit = "% end-to-end gain (delta in points)";
      r.modeled = gain(pub, &serial);
      r.iteration_ms = serial / 1e6;
      r.gain_row = true;
      // Layouts the source does not rule out, each a few `layout:` fields over the row's: the
      // spread of the modeled gain over them (the row's own layout first).
      if (e.has("plausible_layouts")) {
        COCEMU_CHECK(!r.assumption.empty(), Errc::parse_error,
                     "{}: plausible_layouts needs `assumption:` (alternatives to a layout are for "
                     "a layout no source states)",
                     e.where());
        r.plausible_gains.push_back(r.modeled);
        const std::vector<detail::YamlReader> alts = e.sequence("plausible_layouts");
        COCEMU_CHECK(!alts.empty(), Errc::parse_error,
                     "{}: plausible_layouts is empty; list at least one layout (a few `layout:` "
                     "fields) or leave the key out",
                     e.where());
        int n = 0;
        for (detail::YamlReader alt : alts) {
          const std::string which = fmt::format("{}: plausible_layouts[{}]", alt.where(), n++);
          // Strictly read on its own first (unknown keys and bad values name the alternative),
          // then merged over the row's `layout:` and read as the row is.
          TrainSettings scratch;
          read_layout_fields(alt, scratch);
          alt.finish();
          COCEMU_CHECK(!scratch.coc.value && !scratch.coc_config.value &&
                           !scratch.use_ascend_coc.value && !scratch.coc_fused_kernel.value &&
                           !scratch.tp_comm_overlap.value,
                       Errc::parse_error,
                       "{} must not set coc (or a CoC switch): the row compares serial with "
                       "fused itself",
                       which);
          // New maps over the row's nodes (which keep their lines for errors); the row's own
          // nodes are not changed.
          YAML::Node row(YAML::NodeType::Map), layout(YAML::NodeType::Map);
          // (Keys by value: a YAML::Node key would match by identity and add a duplicate.)
          for (const auto& kv : e.node())
            row[kv.first.as<std::string>()] = kv.second;
          for (const auto& kv : e.node()["layout"])
            layout[kv.first.as<std::string>()] = kv.second;
          for (const auto& kv : alt.node())
            layout[kv.first.as<std::string>()] = kv.second;
          row["layout"] = layout;
          detail::YamlReader merged(row, e.file(), e.path());
          Reference scratch_row = r;
          Published run;
          try {
            run = published_settings(merged, scratch_row, p);
          } catch (const Error& err) {  // say which alternative
            throw Error(err.code(), fmt::format("{}: {}", which, err.message()), err.origin());
          }
          try {
            r.plausible_gains.push_back(gain(run, nullptr));
          } catch (const Error& err) {  // say which alternative (an invalid combination)
            throw Error(err.code(), fmt::format("{}: {}", which, err.message()), err.origin());
          }
        }
      }
    } else if (r.kind == "layer") {
      // One transformer layer's forward or backward (with what the layout recomputes in it) on
      // one device for one micro-batch, as the step model prices it (price_parts).
      const std::string pass = e.string("pass");
      COCEMU_CHECK(pass == "forward" || pass == "backward", Errc::parse_error,
                   "{}: pass '{}'; allowed forward, backward", e.where(), pass);
      const std::shared_ptr<TrainSetup> setup = published_setup(e, r, p);
      r.run_signature = run_signature(*setup);
      const StepParts parts = price_parts(*setup);
      r.unit = "ms";
      r.modeled = (pass == "forward" ? parts.layer_fwd.ns : parts.layer_bwd.ns) / 1e6;
    } else {
      COCEMU_FAIL(Errc::parse_error,
                  "{}: kind '{}' unknown; allowed collective, gemm, attention, memory, training, "
                  "layer, coc_gain",
                  e.where(), r.kind);
    }
    e.finish();
    COCEMU_CHECK(r.gain_row || r.published > 0, Errc::parse_error,
                 "reference '{}': published {} must be positive (only a coc_gain may be zero or "
                 "negative)",
                 r.name, r.published);
    r.delta_pct =
        r.gain_row ? r.modeled - r.published : 100.0 * (r.modeled - r.published) / r.published;
    v.rows.push_back(r);
  }
  top.finish();
  COCEMU_CHECK(!v.rows.empty(), Errc::parse_error, "{}: no references", origin);
  // Each fitted parameter: fitted on its rows; its candidate tests are the other rows of its
  // profile of the kinds it was fitted on, and rows that name it under `tests:`; a candidate
  // that repeats the run of one of its fitted-on rows (the same run_signature) is that fit
  // again, counted same-as-fit.
  for (std::size_t i = 0; i < v.rows.size(); ++i)
    for (const std::string& key : v.rows[i].fitted) {
      auto it = std::find_if(v.calibration.begin(), v.calibration.end(), [&](const auto& c) {
        return c.device == v.rows[i].device && c.key == key;
      });
      if (it == v.calibration.end()) {
        v.calibration.push_back(
            {v.rows[i].device, key, load_named_profile(v.rows[i].device).value(key), {}, {}, {}});
        it = std::prev(v.calibration.end());
      }
      it->fitted_on.push_back(i);
    }
  for (Calibration& c : v.calibration)
    for (std::size_t j = 0; j < v.rows.size(); ++j) {
      const Reference& r = v.rows[j];
      if (r.device != c.device ||
          std::find(c.fitted_on.begin(), c.fitted_on.end(), j) != c.fitted_on.end())
        continue;
      const bool named = std::find(r.tests.begin(), r.tests.end(), c.key) != r.tests.end();
      const bool same_kind = std::any_of(c.fitted_on.begin(), c.fitted_on.end(),
                                         [&](std::size_t i) { return v.rows[i].kind == r.kind; });
      // A row fitted on some parameter is not a test of another (fits were made together); the
      // network's parameters are tested only by references that span nodes.
      const bool crosses = !c.key.starts_with("topology.inter_node") || r.nodes > 1;
      if (!named && !(same_kind && r.fitted.empty() && crosses)) continue;
      std::vector<std::size_t> repeated;
      if (!r.run_signature.empty())
        for (std::size_t i : c.fitted_on)
          if (v.rows[i].run_signature == r.run_signature) repeated.push_back(i);
      (repeated.empty() ? c.tested_by : c.same_as_fit).push_back(j);
      for (std::size_t i : repeated)
        if (std::find(r.repeats_fit.begin(), r.repeats_fit.end(), i) == r.repeats_fit.end())
          v.rows[j].repeats_fit.push_back(i);
    }
  for (Reference& r : v.rows)
    std::sort(r.repeats_fit.begin(), r.repeats_fit.end());
  int tests = 0, relative = 0;
  for (const Reference& r : v.rows)
    relative += !r.gain_row;
  for (std::size_t i = 0; i < v.rows.size(); ++i) {
    const Reference& r = v.rows[i];
    if (r.gain_row) continue;  // points of gain, not a relative error: reported apart
    v.mean_abs_delta_pct += std::fabs(r.delta_pct) / double(relative);
    v.max_abs_delta_pct = std::max(v.max_abs_delta_pct, std::fabs(r.delta_pct));
    if (v.is_test_row(i)) {
      v.mean_abs_delta_tests_pct += std::fabs(r.delta_pct);
      ++tests;
    }
  }
  if (tests > 0) v.mean_abs_delta_tests_pct /= tests;
  return v;
}

Validation validate_shipped() {
  const std::string path = config_dir() + "/validation.yaml";
  return validate(read_input_file(path, "validation references"), path);
}

namespace {

/// The fitted rows (1-based numbers) whose run row i repeats.
std::vector<std::size_t> repeated_fits(const Validation& v, std::size_t i) {
  std::vector<std::size_t> fits;
  for (std::size_t f : v.rows[i].repeats_fit)
    fits.push_back(f + 1);
  return fits;
}

/// "6.10 to 8.20" over a coc_gain row's plausible layouts.
std::string gain_range(const Reference& r) {
  const auto [lo, hi] = std::minmax_element(r.plausible_gains.begin(), r.plausible_gains.end());
  return fmt::format("{:+.2f} to {:+.2f}", *lo, *hi);
}

std::vector<std::size_t> untested_parameters(const Validation& v) {
  std::vector<std::size_t> out;
  for (std::size_t k = 0; k < v.calibration.size(); ++k)
    if (v.calibration[k].untested()) out.push_back(k);
  return out;
}

/// How many rows only test the model (with or without the gains, which are reported apart).
int test_rows(const Validation& v, bool gains) {
  int n = 0;
  for (std::size_t i = 0; i < v.rows.size(); ++i)
    n += v.is_test_row(i) && (gains || !v.rows[i].gain_row);
  return n;
}

}  // namespace

std::string format_validation(const Validation& v) {
  std::string out = fmt::format("{:<3} {:<72} {:>10} {:>10} {:>8}\n", "#", "reference", "published",
                                "modeled", "delta %");
  for (std::size_t i = 0; i < v.rows.size(); ++i) {
    const Reference& r = v.rows[i];
    const auto repeats = repeated_fits(v, i);
    out += fmt::format(
        "{:<3} {:<72} {:>10.1f} {:>10.1f} {:>+8.1f}   {} on {}{}{}{}{}\n", i + 1, r.name,
        r.published, r.modeled, r.delta_pct, r.unit, r.device,
        r.nodes > 1 ? fmt::format(", {} nodes", r.nodes) : "",
        r.fitted.empty() ? "" : "  [fitted: " + fmt::format("{}", fmt::join(r.fitted, ", ")) + "]",
        repeats.empty()
            ? ""
            : fmt::format("  [same as fit: the run of [{}]{}]", fmt::join(repeats, "], ["),
                          v.is_test_row(i) ? "; tests other parameters" : ""),
        r.assumption.empty() ? "" : "  [layout assumed]");
  }
  out += fmt::format(
      "\nmean |delta| {:.1f}%   max |delta| {:.1f}%   ({} references; [fitted] rows set the "
      "named parameters, [same as fit] rows repeat a fitted run, the other {} only test the "
      "model: mean |delta| over the {} that are not gains {:.1f}%)\n",
      v.mean_abs_delta_pct, v.max_abs_delta_pct, v.rows.size(), test_rows(v, true),
      test_rows(v, false), v.mean_abs_delta_tests_pct);
  double train_sum = 0, train_max = 0;
  int train_rows = 0;
  for (const Reference& r : v.rows)
    if (r.training) {
      train_sum += std::fabs(r.delta_pct);
      train_max = std::max(train_max, std::fabs(r.delta_pct));
      ++train_rows;
    }
  if (train_rows > 0) {
    out += fmt::format(
        "training runs: {} references, mean |delta| {:.1f}%, max |delta| {:.1f}% (model TFLOP/s "
        "per device; published figures converted as noted)\n",
        train_rows, train_sum / train_rows, train_max);
    for (std::size_t i = 0; i < v.rows.size(); ++i)
      if (v.rows[i].training && v.rows[i].published_as_stated != v.rows[i].published)
        out += fmt::format("  [{}] published {:.4g}: {}\n", i + 1, v.rows[i].published_as_stated,
                           v.rows[i].conversion);
    // The modeled iterations, and the published figure as an iteration time: the gap between
    // the two is what a row's delta says in milliseconds.
    out += "  modeled iteration (step model) vs the published figure as an iteration:\n";
    for (std::size_t i = 0; i < v.rows.size(); ++i) {
      const Reference& r = v.rows[i];
      if (!r.training) continue;
      std::string exposed;
      for (const auto& [kind, ms] : r.exposed_comm_ms)
        if (ms > 0) exposed += fmt::format(" {} {:.1f}", kind, ms);
      // A bubble within rounding of zero (one stage: busy time and iteration differ by float
      // error) prints as 0.0, not -0.0.
      const double bubble = std::abs(r.bubble_fraction) < 5e-4 ? 0.0 : 100 * r.bubble_fraction;
      out += fmt::format(
          "  [{}] modeled {:.1f} ms, published {:.1f} ms; exposed comm (ms):{}; bubble {:.1f}%\n",
          i + 1, r.iteration_ms, r.iteration_ms * r.modeled / r.published,
          exposed.empty() ? " none" : exposed, bubble);
    }
  }
  int gains = 0;
  double gain_sum = 0, gain_max = 0;
  for (const Reference& r : v.rows)
    if (r.gain_row) {
      ++gains;
      gain_sum += std::fabs(r.delta_pct);
      gain_max = std::max(gain_max, std::fabs(r.delta_pct));
    }
  if (gains > 0) {
    out += fmt::format(
        "end-to-end gains: {} references, mean |delta| {:.2f} points, max {:.2f} points (modeled "
        "gain of the fused CoC kernels over serial TP linears minus the published gain)\n",
        gains, gain_sum / gains, gain_max);
    for (std::size_t i = 0; i < v.rows.size(); ++i) {
      const Reference& r = v.rows[i];
      if (!r.gain_row || r.plausible_gains.empty()) continue;
      out += fmt::format(
          "  [{}] published {:+.2f}%, modeled {:+.2f}% at the row's layout, {}% over {} "
          "plausible layouts\n",
          i + 1, r.published, r.modeled, gain_range(r), r.plausible_gains.size());
    }
  }
  if (!v.calibration.empty()) {
    out +=
        "\ncalibration: each fitted parameter, the references it was fitted on, those that repeat "
        "a fitted run (same model and layout: the fit again, not a test) and those that test it "
        "(delta %, points for gains):\n";
    for (const Calibration& c : v.calibration) {
      auto list = [&](const std::vector<std::size_t>& rows) {
        std::string s;
        for (std::size_t i : rows)
          s += fmt::format("{}[{}] {:+.1f}", s.empty() ? "" : ", ", i + 1, v.rows[i].delta_pct);
        return s.empty() ? std::string("none") : s;
      };
      out += fmt::format("  {} {} = {:.6g}{}\n    fitted on ({}): {}\n", c.device, c.key, c.value,
                         c.untested() ? "  UNTESTED" : "", c.fitted_on.size(), list(c.fitted_on));
      if (!c.same_as_fit.empty())
        out += fmt::format("    same as fit ({}): {}\n", c.same_as_fit.size(), list(c.same_as_fit));
      out += fmt::format("    tested by ({}): {}\n", c.tested_by.size(),
                         c.untested() ? "none (untested)" : list(c.tested_by));
    }
    const auto untested = untested_parameters(v);
    std::vector<std::string> names;
    for (std::size_t k : untested)
      names.push_back(v.calibration[k].device + " " + v.calibration[k].key);
    out += fmt::format("  {} fitted parameters, {} untested{}{}\n", v.calibration.size(),
                       untested.size(), untested.empty() ? "" : ": ", fmt::join(names, ", "));
  }
  bool assumed = false;
  for (std::size_t i = 0; i < v.rows.size(); ++i)
    if (!v.rows[i].assumption.empty()) {
      if (!assumed) out += "\nassumed layouts (settings no source states, and why):\n";
      assumed = true;
      out += fmt::format("[{}] {}\n", i + 1, v.rows[i].assumption);
    }
  out += "\nsources:\n";
  for (std::size_t i = 0; i < v.rows.size(); ++i)
    out += fmt::format("[{}] {}\n", i + 1, v.rows[i].source);
  return out;
}

std::string format_markdown(const Validation& v) {
  // Table cells: no pipes, no line breaks.
  auto cell = [](std::string s) {
    for (char& c : s)
      if (c == '|' || c == '\n') c = c == '|' ? '/' : ' ';
    return s;
  };
  auto delta = [&](const Reference& r) {
    return r.gain_row ? fmt::format("{:+.2f} pts", r.delta_pct)
                      : fmt::format("{:+.1f}%", r.delta_pct);
  };
  std::string out = "## References\n\n";
  out += fmt::format(
      "{} published measurements, each modeled on its device profile (`cocemu validate`). A "
      "reference marked *fits* set the named profile parameters; one marked *same as fit* "
      "repeats the model and layout of a fitted reference (a rule in `validate`: the same model "
      "shape, parallel degrees, micro-batch, recompute and sequence parallelism), so it does not "
      "test the parameters fitted there; the other {} only test the model. *layout assumed*: the "
      "source does not state "
      "part of the run's layout (below, with why).\n\n",
      v.rows.size(), test_rows(v, true));
  out += "| # | reference | profile | unit | published | modeled | delta | role |\n";
  out += "|---|---|---|---|---|---|---|---|\n";
  for (std::size_t i = 0; i < v.rows.size(); ++i) {
    const Reference& r = v.rows[i];
    std::string role = "tests";
    const auto repeats = repeated_fits(v, i);
    if (!r.fitted.empty())
      role = "fits " + fmt::format("`{}`", fmt::join(r.fitted, "`, `"));
    else if (!repeats.empty())
      role = fmt::format("same as fit #{}{}", fmt::join(repeats, ", #"),
                         v.is_test_row(i) ? "; tests other parameters" : "");
    if (!r.assumption.empty()) role += "; *layout assumed*";
    out += fmt::format("| {} | {} | {}{} | {} | {:.4g} | {:.4g} | {} | {} |\n", i + 1, cell(r.name),
                       r.device, r.nodes > 1 ? fmt::format(" ({} nodes)", r.nodes) : "",
                       cell(r.unit), r.published, r.modeled, delta(r), role);
  }
  out += fmt::format(
      "\nDevice and cluster references and training runs: mean |delta| {:.1f}%, max {:.1f}%; "
      "over the {} references that only test the model, mean {:.1f}%.\n",
      v.mean_abs_delta_pct, v.max_abs_delta_pct, test_rows(v, false), v.mean_abs_delta_tests_pct);
  bool ranges = false;
  for (const Reference& r : v.rows)
    ranges = ranges || !r.plausible_gains.empty();
  if (ranges) {
    out +=
        "\n## Fused CoC gains over plausible layouts\n\nThe source gives each gain and TP 8 "
        "only; the row's layout is assumed. The modeled gain at that layout and its range over "
        "the layouts listed under the row's `plausible_layouts:` in "
        "`configs/validation.yaml` (the row's own included).\n\n"
        "| # | reference | published | modeled at the row's layout | modeled over plausible "
        "layouts | layouts |\n|---|---|---|---|---|---|\n";
    for (std::size_t i = 0; i < v.rows.size(); ++i) {
      const Reference& r = v.rows[i];
      if (r.plausible_gains.empty()) continue;
      out += fmt::format("| {} | {} | {:+.2f}% | {:+.2f}% | {}% | {} |\n", i + 1, cell(r.name),
                         r.published, r.modeled, gain_range(r), r.plausible_gains.size());
    }
  }
  const auto untested = untested_parameters(v);
  out += fmt::format(
      "\n## Calibration\n\n{} fitted parameters. Each with every reference it was fitted on, "
      "those that repeat a fitted run (*same as fit*: not tests), and those that test it, with "
      "their counts and the delta of each reference; {} {} **untested** (no reference tests "
      "{}).\n\n",
      v.calibration.size(), untested.size(), untested.size() == 1 ? "is" : "are",
      untested.size() == 1 ? "it" : "them");
  out +=
      "| profile | parameter | value | rows: fitted on / same as fit / tested by | fitted on | "
      "same "
      "as fit | tested by |\n|---|---|---|---|---|---|---|\n";
  for (const Calibration& c : v.calibration) {
    auto list = [&](const std::vector<std::size_t>& rows) {
      std::string s;
      for (std::size_t i : rows)
        s += fmt::format("{}#{} {} ({})", s.empty() ? "" : "; ", i + 1, cell(v.rows[i].name),
                         delta(v.rows[i]));
      return s.empty() ? std::string("—") : s;
    };
    out += fmt::format("| {} | `{}` | {:.6g} | {} / {} / {} | {} | {} | {} |\n", c.device, c.key,
                       c.value, c.fitted_on.size(), c.same_as_fit.size(), c.tested_by.size(),
                       list(c.fitted_on), list(c.same_as_fit),
                       c.untested() ? std::string("**untested**") : list(c.tested_by));
  }
  bool assumed = false;
  for (std::size_t i = 0; i < v.rows.size(); ++i)
    if (!v.rows[i].assumption.empty()) {
      if (!assumed)
        out +=
            "\n## Assumed layouts\n\nReferences whose layout no source states in full: what is "
            "assumed and why (`assumption:` in `configs/validation.yaml`).\n\n";
      assumed = true;
      out += fmt::format("- #{} {}: {}\n", i + 1, cell(v.rows[i].name), cell(v.rows[i].assumption));
    }
  out += "\n## Sources\n\n";
  for (std::size_t i = 0; i < v.rows.size(); ++i)
    out += fmt::format("{}. {}\n", i + 1, cell(v.rows[i].source));
  return out;
}

std::string validation_json(const Validation& v) {
  nlohmann::json refs = nlohmann::json::array();
  for (std::size_t i = 0; i < v.rows.size(); ++i) {
    const Reference& r = v.rows[i];
    refs.push_back({{"name", r.name},
                    {"kind", r.kind},
                    {"device", r.device},
                    {"nodes", r.nodes},
                    {"source", r.source},
                    {"unit", r.unit},
                    {"published", r.published},
                    {"modeled", r.modeled},
                    {"delta", r.delta_pct / 100.0},
                    {"fitted", r.fitted},
                    {"same_as_fit", repeated_fits(v, i)},
                    {"assumption", r.assumption},
                    {"plausible_gains", r.plausible_gains},
                    {"published_as_stated", r.published_as_stated},
                    {"conversion", r.conversion},
                    {"iteration_ms", r.iteration_ms},
                    {"bubble_fraction", r.bubble_fraction},
                    {"exposed_comm_ms", r.exposed_comm_ms},
                    {"plan_best", r.plan_best},
                    {"plan_matches", r.plan_matches},
                    {"plan_gain", r.plan_gain_pct / 100.0},
                    {"plan_published_mfu", r.plan_published_mfu},
                    {"plan_best_mfu", r.plan_best_mfu},
                    {"plan_best_tp_overlap", r.plan_best_overlap}});
  }
  // Rows as 1-based numbers, as every other output numbers them.
  auto numbers = [](const std::vector<std::size_t>& rows) {
    std::vector<std::size_t> n;
    for (std::size_t i : rows)
      n.push_back(i + 1);
    return n;
  };
  nlohmann::json cal = nlohmann::json::array();
  for (const Calibration& c : v.calibration)
    cal.push_back({{"device", c.device},
                   {"parameter", c.key},
                   {"value", c.value},
                   {"fitted_on", numbers(c.fitted_on)},
                   {"same_as_fit", numbers(c.same_as_fit)},
                   {"tested_by", numbers(c.tested_by)},
                   {"untested", c.untested()}});
  const nlohmann::json j{{"references", refs},
                         {"calibration", cal},
                         {"mean_abs_delta", v.mean_abs_delta_pct / 100.0},
                         {"max_abs_delta", v.max_abs_delta_pct / 100.0},
                         {"mean_abs_delta_of_tests", v.mean_abs_delta_tests_pct / 100.0}};
  return j.dump(2) + "\n";
}

void plan_training(Validation& v, int threads) {
  for (Reference& r : v.rows) {
    if (!r.training) continue;
    const TrainSetup& t = *r.training;
    PlanQuery q;
    q.model = t.options.model;
    q.model_name = r.name;
    q.profile = t.profile;
    q.profile_name = r.device;
    q.nodes = t.nodes;
    q.global_batch = t.options.layout.global_batch_size;
    q.threads = threads;
    q.top_k = 1;
    q.compare_heuristic = false;
    // A published uneven partition (--num-layer-list) is searched as plan's balanced partition.
    if (!t.options.layout.stage_layers.empty()) q.mode = SearchMode::dynamic_programming;
    const PlanResult res = plan(q);
    const PlanCandidate& best = res.top.front();
    // The published layout, priced the way plan prices its candidates.
    layers::train::TrainLayout published = t.options.layout;
    const std::string why = prune_reason(q, published);
    const auto& b = best.layout;
    r.plan_best = best.describe();
    r.plan_matches = b.tp == published.tp && b.pp == published.pp && b.dp == published.dp &&
                     b.cp == published.cp && b.vpp == published.vpp &&
                     b.micro_batch_size == published.micro_batch_size &&
                     b.recompute == published.recompute;
    r.plan_best_mfu = best.report.mfu;
    std::vector<std::string> overlap;
    if (best.tp_comm_overlap) overlap.push_back("te_userbuffers");
    bool script = false, fused = false;
    for (const auto& [shape, value] : best.customized_coc) {
      script = script || value > 1;
      fused = fused || value == -1;
    }
    if (script) overlap.push_back("mindspeed_coc");
    if (fused) overlap.push_back("lcoc_fused");
    r.plan_best_overlap = overlap.empty() ? "none" : fmt::format("{}", fmt::join(overlap, "+"));
    if (why.empty()) {
      const TrainReport mine = evaluate_candidate(q, published).report;
      r.plan_gain_pct = 100.0 * (double(mine.iteration_ns) / double(best.report.iteration_ns) - 1);
      r.plan_published_mfu = mine.mfu;
    } else {
      r.plan_best += " (the published layout is pruned here: " + why + ")";
      r.plan_gain_pct = NAN;
      r.plan_published_mfu = NAN;
    }
  }
}

std::string format_plan_check(const Validation& v) {
  std::string out = fmt::format(
      "\n{:<3} {:<44} {:>9} {:<64} {:>9} {:<16} {}\n", "#", "published run", "its MFU",
      "plan's best on the same cluster and batch", "best MFU", "best TP overlap", "faster by");
  auto pct = [](double x) {
    return std::isnan(x) ? std::string("—") : fmt::format("{:.1f}%", 100 * x);
  };
  for (std::size_t i = 0; i < v.rows.size(); ++i) {
    const Reference& r = v.rows[i];
    if (!r.training) continue;
    out += fmt::format("{:<3} {:<44} {:>9} {:<64} {:>9} {:<16} {}\n", i + 1, r.name,
                       pct(r.plan_published_mfu), r.plan_best, pct(r.plan_best_mfu),
                       r.plan_best_overlap,
                       r.plan_matches                ? "— the published layout"
                       : std::isnan(r.plan_gain_pct) ? "—"
                                                     : fmt::format("{:.1f}%", r.plan_gain_pct));
  }
  out +=
      "MFU as plan prices candidates (the model's FLOPs over the profile's peak); the best "
      "uses only its profile's TP overlap (tp_overlap).\n";
  return out;
}

}  // namespace cocemu::bench
