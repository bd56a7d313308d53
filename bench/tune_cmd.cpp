// `cocemu tune`: per-shape CoC choices for a model, written as a customized_coc YAML.
#include <cstdio>
#include <fstream>
#include <optional>

#include "cocemu/bench/sensitivity.h"
#include "cocemu/bench/tune.h"
#include "cocemu/layers/coc_config.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/profile.h"
#include "commands.h"

namespace cocemu::cli {

void add_tune(CLI::App& app) {
  struct Opts {
    std::string model, profile = "ascend-910b", base, out = "tuned_coc.yaml";
    bool sensitivity = false;
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
  sub->add_flag("--sensitivity", o->sensitivity,
                "scale each assumption of the profile x0.5 and x2 and report which shapes' "
                "choices flip (fragile ones are marked in the YAML's comments)");
  sub->callback([o] {
    check_output_file("-o", o->out);
    bench::BenchConfig c = bench::bench_config(o->model, o->profile);
    const layers::CocConfig base =
        o->base.empty() ? bench::default_bench_coc() : layers::load_coc_config(o->base);
    bench::TuneResult t = bench::tune(c, base);
    std::optional<bench::Sensitivity> sens;
    if (o->sensitivity) {
      sens = bench::sensitivity(*c.profile, [&](std::shared_ptr<const DeviceProfile> p) {
        bench::BenchConfig scaled = c;
        scaled.profile = std::move(p);
        bench::Conclusions out;
        for (const bench::TuneChoice& ch : bench::tune(scaled, base).choices)
          out[ch.key + " choice"] = std::to_string(ch.value);
        return out;
      });
      for (bench::TuneChoice& ch : t.choices)
        if (const std::string why = sens->fragile(ch.key + " choice"); !why.empty())
          ch.reason += " [fragile: " + why + "]";
    }
    const std::string yaml = bench::to_yaml(t);
    std::fputs(yaml.c_str(), stdout);
    write_file("-o", o->out, yaml);
    std::printf("\n# written to %s — apply with: cocemu bench%s --coc-config %s\n", o->out.c_str(),
                o->model.empty() ? "" : (" --model " + o->model).c_str(), o->out.c_str());
    if (sens) std::fputs(bench::format_sensitivity(*sens).c_str(), stdout);
  });
}

}  // namespace cocemu::cli
