// cocemu: emulate one accelerator node of N ranks and measure compute-communication overlap.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cocemu/runtime/error.h"
#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "cocemu: emulate an N-rank accelerator node on this computer (real numerics, "
      "modeled device time)"};
  app.require_subcommand(1);
  cocemu::cli::add_bench(app);
  cocemu::cli::add_tune(app);
  cocemu::cli::add_validate(app);
  cocemu::cli::add_collbench(app);
  cocemu::cli::add_attention(app);
  cocemu::cli::add_mlpbench(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const cocemu::Error& e) {
    std::fprintf(stderr, "cocemu: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
