// `cocemu validate`: the cost model against published measurements.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cocemu/runtime/error.h"
#include "cocemu/runtime/input_file.h"
#include "cocemu/train/validate.h"
#include "commands.h"

namespace cocemu::cli {

void add_validate(CLI::App& app) {
  auto file = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand(
      "validate",
      "compare the cost model with published measurements (reference | modeled | delta %)");
  sub->add_option("--references", *file, "references YAML (default: configs/validation.yaml)");
  auto with_plan = std::make_shared<bool>(false);
  sub->add_flag("--plan", *with_plan,
                "also run `cocemu plan` on each published training run's cluster and batch and "
                "report whether its best is the published layout");
  auto markdown = std::make_shared<bool>(false);
  sub->add_flag("--markdown", *markdown,
                "print the references and the calibration (each fitted parameter: fitted on, "
                "tested by) as Markdown tables instead of the text report");
  auto json = std::make_shared<std::string>();
  sub->add_option("--json", *json, "also write references[], mean_abs_delta, max_abs_delta here");
  sub->callback([file, json, with_plan, markdown] {
    if (!json->empty()) check_output_file("--json", *json);
    bench::Validation v;
    if (file->empty()) {
      v = bench::validate_shipped();
    } else {
      v = bench::validate(read_input_file(*file, "--references"), *file);
    }
    if (*with_plan) bench::plan_training(v);
    std::fputs((*markdown ? bench::format_markdown(v) : bench::format_validation(v)).c_str(),
               stdout);
    if (*with_plan) std::fputs(bench::format_plan_check(v).c_str(), stdout);
    if (!json->empty()) write_file("--json", *json, bench::validation_json(v));
  });
}

}  // namespace cocemu::cli
