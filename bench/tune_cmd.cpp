// `cocemu tune`: per-shape CoC choices for a model, written as a customized_coc YAML.
#include <cstdio>
#include <fstream>

#include "cocemu/bench/tune.h"
#include "cocemu/layers/coc_config.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/profile.h"
#include "commands.h"

namespace cocemu::cli {

void add_tune(CLI::App& app) {
  struct Opts {
    std::string model, profile = "ascend-910b", base, out = "tuned_coc.yaml";
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = app.add_subcommand(
      "tune",
      "model P = 1/2/4/8 and fused for every CoC GEMM shape of a layer and write the fastest as "
      "a customized_coc YAML (with the reasons)");
  sub->add_option("--model", o->model,
                  "model config (name under configs/models/ or a path); default: bench's layer");
  sub->add_option("--profile", o->profile, "device profile")->capture_default_str();
  sub->add_option("--coc-config", o->base, "base CoC config (its other keys and fused tiling)");
  sub->add_option("-o,--out", o->out, "the YAML to write")->capture_default_str();
  sub->callback([o] {
    bench::BenchConfig c = bench::bench_config(o->model, o->profile);
    const layers::CocConfig base =
        o->base.empty() ? bench::default_bench_coc() : layers::load_coc_config(o->base);
    const bench::TuneResult t = bench::tune(c, base);
    const std::string yaml = bench::to_yaml(t);
    std::fputs(yaml.c_str(), stdout);
    std::ofstream f(o->out);
    COCEMU_CHECK_ARG(f.good(), "tune: cannot write '{}'", o->out);
    f << yaml;
    std::printf("\n# written to %s — apply with: cocemu bench%s --coc-config %s\n", o->out.c_str(),
                o->model.empty() ? "" : (" --model " + o->model).c_str(), o->out.c_str());
  });
}

}  // namespace cocemu::cli
