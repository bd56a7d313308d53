// `cocemu bench`: the main job — a transformer layer's CoC segments under every strategy.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "cocemu/bench/layer_bench.h"
#include "cocemu/bench/limits/estimate.h"
#include "cocemu/bench/tune.h"
#include "cocemu/layers/coc_config.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/mpi_link.h"
#include "cocemu/runtime/profile.h"
#include "cocemu/runtime/trace.h"
#include "cocemu/train/config.h"
#include "commands.h"

namespace cocemu::cli {

namespace {

struct BenchOpts {
  std::string model, profile = "ascend-910b", coc_config, out_dir = "cocemu-bench-out", json;
  bool dry_run = false, no_progress = false, nondeterministic = false, sensitivity = false;
  int repeats = 3;
  double max_seconds = 0;
};

/// "script P=4" -> "script-p4": a file-name-safe form of a strategy name.
std::string slug(const std::string& name) {
  std::string s;
  for (char ch : name) {
    if (std::isalnum(static_cast<unsigned char>(ch)))
      s += char(std::tolower(static_cast<unsigned char>(ch)));
    else if (ch == ' ' && !s.empty() && s.back() != '-')
      s += '-';
  }
  return s;
}

/// A one-line progress bar on stderr, redrawn in place (only on a terminal).
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled && isatty(STDERR_FILENO)) {}
  void operator()(int done, int total, const std::string& what) const {
    if (!enabled_) return;
    constexpr int kWidth = 30;
    const int filled = total ? done * kWidth / total : kWidth;
    std::fprintf(stderr, "\r[%s%s] %d/%d %-40s", std::string(std::size_t(filled), '#').c_str(),
                 std::string(std::size_t(kWidth - filled), '.').c_str(), done, total, what.c_str());
    if (done == total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  bool enabled_;
};

}  // namespace

void add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOpts>();
  CLI::App* sub = app.add_subcommand(
      "bench",
      "the main job: serial vs script P=2/4/8 vs fused CoC on a transformer layer's six CoC "
      "segments (modeled and wall time, exposed comm, bitwise check, overlap verdicts)");
  sub->add_option("--model", o->model,
                  "model config (name under configs/models/ or a path); default: a LLaMA-style "
                  "layer sized for a real-numerics run on a laptop");
  sub->add_option("--profile", o->profile, "device profile (name under configs/devices/ or path)")
      ->capture_default_str();
  sub->add_flag("--dry-run", o->dry_run,
                "shapes only: model full-size layers in seconds, numerics skipped");
  number(sub, "--repeats", o->repeats, "real runs per strategy (wall time = median)", 1, 1000);
  sub->add_option("--coc-config", o->coc_config,
                  "a CoC config (e.g. from `cocemu tune`): its customized_coc adds the 'tuned' "
                  "strategy, its tiling sets the fused kernels'");
  sub->add_option("--out-dir", o->out_dir, "where traces, SVG timelines and bench.json go")
      ->capture_default_str();
  sub->add_option("--json", o->json, "write the results here (default: OUT_DIR/bench.json)");
  sub->add_flag("--no-progress", o->no_progress, "no progress bar");
  max_seconds_option(sub, o->max_seconds);
  sub->add_flag("--sensitivity", o->sensitivity,
                "scale each assumption of the profile x0.5 and x2 (modeled runs) and report "
                "which verdicts and best strategies flip; fragile ones are marked");
  sub->add_flag("--nondeterministic", o->nondeterministic,
                "owner-first reductions, OpenBLAS GEMMs and the library's collective plans "
                "(bits may then differ between strategies)");
  sub->callback([o] {
    bench::BenchConfig c = bench::bench_config(o->model, o->profile);
    c.dry_run = o->dry_run;
    c.repeats = o->repeats;
    c.deterministic = !o->nondeterministic;
    if (!o->coc_config.empty()) {
      const layers::CocConfig coc = layers::load_coc_config(o->coc_config);
      c.strategies = bench::default_strategies(coc);
      // A customized_coc keyed for another layout matches nothing and runs as serial: say so.
      const std::string warning = bench::unmatched_coc_warning(o->coc_config, coc.customized_coc,
                                                               bench::layer_gemm_keys(c));
      if (!warning.empty()) std::fprintf(stderr, "cocemu bench: %s\n", warning.c_str());
    }
    // Under mpirun every process is one host: each runs its share of the TP ranks, host 0
    // reports. A fused kernel's symmetric memory needs its TP group on one host.
    c.hosts = started_by_mpirun() ? mpi_hosts() : nullptr;
    if (c.hosts && c.hosts->n_hosts() > 1) {
      std::erase_if(c.strategies, [&](const bench::BenchStrategy& s) {
        if (s.options.strategy != layers::Strategy::fused) return false;
        if (c.hosts->host() == 0)
          std::fprintf(stderr,
                       "cocemu bench: %s left out: its kernels read the TP group's memory in "
                       "place, and the %d TP ranks are on %d hosts\n",
                       s.name.c_str(), c.tp, c.hosts->n_hosts());
        return true;
      });
    }
    check_estimate(bench::estimate_bench(
                       c, "bench" + (o->model.empty() ? std::string() : " --model " + o->model)),
                   time_budget(o->max_seconds));
    // Outputs are checked before the run, not after it.
    check_output_dir("--out-dir", o->out_dir);
    if (!o->json.empty()) check_output_file("--json", o->json);
    const bench::BenchResult r = bench::run_bench(c, ProgressBar(!o->no_progress));
    std::optional<bench::Sensitivity> sens;
    if (o->sensitivity) {
      bench::BenchConfig dry = c;
      dry.dry_run = true;  // conclusions come from the modeled timeline only
      sens = bench::sensitivity(*c.profile, [&](std::shared_ptr<const DeviceProfile> p) {
        dry.profile = std::move(p);
        return bench::bench_conclusions(bench::run_bench(dry));
      });
    }
    if (c.hosts && c.hosts->host() != 0) {
      const int per = c.tp / c.hosts->n_hosts();
      std::printf("cocemu bench: %s ran ranks %d..%d over %s; host 0 reports\n",
                  c.hosts->describe().c_str(), c.hosts->host() * per,
                  c.hosts->host() * per + per - 1, c.hosts->transport().c_str());
      return;
    }
    if (c.hosts)
      std::printf("# %d hosts over %s; this is host 0 (wall times: its ranks)\n",
                  c.hosts->n_hosts(), c.hosts->transport().c_str());
    std::fputs(bench::format_report(r, sens ? &*sens : nullptr).c_str(), stdout);
    if (sens) std::fputs(bench::format_sensitivity(*sens).c_str(), stdout);

    const std::string json_path = o->json.empty() ? o->out_dir + "/bench.json" : o->json;
    std::printf("\n# outputs%s\n", c.dry_run ? " (dry run: modeled only)" : "");
    SvgOptions svg;  // one x scale for every strategy's timeline, so they compare by eye
    for (const bench::StrategyResult& s : r.strategies)
      svg.span_ns = std::max(svg.span_ns, s.run.timeline.makespan_ns());
    for (const bench::StrategyResult& s : r.strategies) {
      const std::string base = o->out_dir + "/" + slug(s.name);
      write_chrome_trace(s.run, base + ".trace.json");
      write_svg_timeline(s.run, base + ".svg",
                         fmt::format("cocemu bench: {} — {}", c.model, s.name), svg);
      std::printf("%-12s trace %s.trace.json  timeline %s.svg\n", s.name.c_str(), base.c_str(),
                  base.c_str());
    }
    nlohmann::json j = bench::to_json(r);
    if (sens) j["sensitivity"] = bench::to_json(*sens);
    write_file(o->json.empty() ? "--out-dir" : "--json", json_path, j.dump(2) + "\n");
    std::printf("results      %s\n", json_path.c_str());
    if (c.dry_run)
      std::printf(
          "\nnext: this is one layer on one TP group; for a whole-cluster layout (tp, cp, "
          "pp, dp, recompute, CoC per shape) run `cocemu plan --model %s --nodes N "
          "--global-batch B`\n",
          o->model.empty() ? "MODEL" : o->model.c_str());
  });
}

}  // namespace cocemu::cli
