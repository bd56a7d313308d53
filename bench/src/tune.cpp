#include "cocemu/bench/tune.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "cocemu/runtime/error.h"

namespace cocemu::bench {

std::string segment_key(const BenchConfig& c, const std::string& segment) {
  const auto& l = c.layer;
  const std::int64_t m = l.seq * l.batch, h = l.hidden, tp = c.tp;
  auto key = [](std::int64_t a, std::int64_t b, std::int64_t d) {
    return fmt::format("[{}, {}, {}]", a, b, d);
  };
  // Column forward and row backward: AG then [m, k]·[k, n]; row forward: [m, k]·[k, n] then AR/RS.
  if (segment == "fwd attn.qkv") return key(m, h, l.qkv_width() / tp);
  if (segment == "fwd attn.out") return key(m, h / tp, h);
  if (segment == "fwd mlp.up") return key(m, h, l.up_width() / tp);
  if (segment == "fwd mlp.down") return key(m, l.ffn / tp, h);
  if (segment == "bwd mlp.down") return key(m, h, l.ffn / tp);
  if (segment == "bwd attn.out") return key(m, h, h / tp);
  COCEMU_FAIL(Errc::invalid_argument,
              "tune: unknown segment '{}'; allowed fwd attn.qkv, fwd attn.out, fwd mlp.up, fwd "
              "mlp.down, bwd mlp.down, bwd attn.out",
              segment);
}

std::vector<std::string> layer_gemm_keys(const BenchConfig& c) {
  const auto& l = c.layer;
  const std::int64_t m = l.seq * l.batch, h = l.hidden, tp = c.tp;
  std::vector<std::string> keys;
  auto both = [&](std::int64_t k, std::int64_t n) {  // forward [m, k, n], backward [m, n, k]
    keys.push_back(fmt::format("[{}, {}, {}]", m, k, n));
    keys.push_back(fmt::format("[{}, {}, {}]", m, n, k));
  };
  both(h, l.qkv_width() / tp);
  both(h / tp, h);
  both(h, l.up_width() / tp);
  both(l.ffn / tp, h);
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

BenchConfig bench_config_for_run(const TrainSetup& setup) {
  const auto& m = setup.options.model;
  const auto& l = setup.options.layout;
  BenchConfig c;
  c.model = m.name;
  c.tp = l.tp;
  c.profile = setup.profile;
  c.layer = {.seq = m.seq / l.cp,
             .batch = l.micro_batch_size / l.micro_batch_interleave,
             .hidden = m.hidden,
             .heads = m.heads,
             .ffn = m.ffn,
             .kv_heads = m.kv_heads,
             .activation = m.swiglu ? layers::Activation::swiglu : layers::Activation::gelu,
             .sequence_parallel = l.sequence_parallel && l.tp > 1,
             .dtype = l.dtype,
             .flash_attention = m.flash_attention,
             .masked_softmax_fusion = m.masked_softmax_fusion};
  return c;
}

namespace {

/// customized_coc value of a bench strategy.
int value_of(const BenchStrategy& s) {
  switch (s.options.strategy) {
    case layers::Strategy::serial:
      return 1;
    case layers::Strategy::script:
      return s.options.parallel_num;
    case layers::Strategy::fused:
      return -1;
  }
  return 1;
}

std::string label(int v) {
  return v == 1 ? "off" : v == -1 ? "fused" : fmt::format("P={}", v);
}

}  // namespace

TuneResult tune(BenchConfig c, const layers::CocConfig& base, const std::vector<int>& values) {
  c.dry_run = true;
  c.strategies = default_strategies(base);
  c.strategies.erase(std::remove_if(c.strategies.begin(), c.strategies.end(),
                                    [&](const BenchStrategy& s) {
                                      const int v = value_of(s);
                                      return bool(s.options.per_shape) ||
                                             (v != 1 && std::find(values.begin(), values.end(),
                                                                  v) == values.end());
                                    }),
                     c.strategies.end());
  COCEMU_CHECK_ARG(c.strategies.size() >= 2,
                   "tune: nothing to choose from besides serial (values {}); allowed 2, 4, 8, "
                   "-1",
                   fmt::join(values, ", "));
  const BenchResult r = run_bench(c);
  TuneResult t{r.config, base, {}};
  t.coc.customized_coc.clear();
  // Per key: every candidate's modeled time summed over the segments that share the key.
  std::map<std::string, std::size_t> index;
  const auto& base_segments = r.strategies.at(0).segments;
  for (std::size_t k = 0; k < base_segments.size(); ++k) {
    const std::string key = segment_key(c, base_segments[k].name);
    auto [it, fresh] = index.try_emplace(key, t.choices.size());
    if (fresh) {
      t.choices.push_back({key, {}, 1, {}, ""});
      for (const BenchStrategy& s : c.strategies)
        t.choices.back().modeled.push_back({label(value_of(s)), 0.0});
    }
    TuneChoice& ch = t.choices[it->second];
    ch.segments.push_back(base_segments[k].name);
    for (std::size_t i = 0; i < r.strategies.size(); ++i)
      ch.modeled[i].second += r.strategies[i].segments.at(k).span_ns;
  }
  for (TuneChoice& ch : t.choices) {
    // The fastest; ties go to the earlier (simpler) candidate: off, P=2, 4, 8, fused.
    std::size_t best = 0;
    for (std::size_t i = 1; i < ch.modeled.size(); ++i)
      if (ch.modeled[i].second < ch.modeled[best].second) best = i;
    ch.value = value_of(c.strategies[best]);
    const double serial = ch.modeled[0].second;
    // Why: the verdict of the chosen candidate, or of the best split when none gains.
    const std::size_t k =
        std::size_t(std::find_if(base_segments.begin(), base_segments.end(),
                                 [&](const SegmentStats& s) { return s.name == ch.segments[0]; }) -
                    base_segments.begin());
    if (best == 0) {
      std::size_t runner = 1;
      for (std::size_t i = 2; i < ch.modeled.size(); ++i)
        if (ch.modeled[i].second < ch.modeled[runner].second) runner = i;
      const Verdict& v = r.strategies[runner].verdicts.at(k);
      ch.reason = fmt::format(
          "off: no split beats serial ({:.1f} us); best split {} {:.1f} us — {}", serial / 1e3,
          ch.modeled[runner].first, ch.modeled[runner].second / 1e3, v.text);
    } else {
      const Verdict& v = r.strategies[best].verdicts.at(k);
      ch.reason = fmt::format("{}: gain {:.1f} -> {:.1f} us ({:+.1f}%){}", ch.modeled[best].first,
                              serial / 1e3, ch.modeled[best].second / 1e3,
                              100.0 * (ch.modeled[best].second / serial - 1),
                              v.success ? "" : "; note — " + v.text);
    }
    t.coc.customized_coc[ch.key] = ch.value;
  }
  return t;
}

std::string to_yaml(const TuneResult& t) {
  std::string y = fmt::format(
      "# cocemu tune: {} on {} (modeled, dry run: shapes only)\n"
      "# Layer as tuned: {} tokens per micro-batch copy (seq {} x batch {}), tp {}, sequence "
      "parallel {}: the keys match runs with that layout only.\n"
      "# Per CoC GEMM shape \"[m, k, n]\" (m = tokens, gathered under SP): 1 = off, 2/4/8 = "
      "script split, -1 = fused.\n"
      "# Candidates modeled per shape (us, summed over the segments sharing it):\n",
      t.config.model, t.config.profile ? t.config.profile->name : "?",
      t.config.layer.seq * t.config.layer.batch, t.config.layer.seq, t.config.layer.batch,
      t.config.tp, t.config.layer.sequence_parallel);
  for (const TuneChoice& ch : t.choices) {
    std::string cands;
    for (const auto& [name, ns] : ch.modeled)
      cands += fmt::format(" {} {:.1f}", name, ns / 1e3);
    y += fmt::format("#   {} ({}):{}\n", ch.key, fmt::join(ch.segments, ", "), cands);
  }
  y += fmt::format(
      "matmul_soc_friendly: {}  # as modeled\n"
      "recompute_all_gather: {}\n"
      "enable_coc_in_column_backward: {}\n"
      "k_min: {}\nk_max: {}\ntile_rows: {}\ntiles_per_step: {}\ncustomized_coc:\n",
      t.coc.matmul_soc_friendly, t.coc.recompute_all_gather, t.coc.enable_coc_in_column_backward,
      t.coc.k_min, t.coc.k_max, t.coc.tile_rows, t.coc.tiles_per_step);
  for (const TuneChoice& ch : t.choices)
    y += fmt::format("  \"{}\": {}  # {}: {}\n", ch.key, ch.value, fmt::join(ch.segments, ", "),
                     ch.reason);
  return y;
}

}  // namespace cocemu::bench
