// cocemu: emulate one accelerator node of N ranks and measure compute-communication overlap.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <new>

#include "cocemu/runtime/blas.h"
#include "cocemu/runtime/error.h"
#include "commands.h"

int main(int argc, char** argv) {
  cocemu::blas::restart_without_server_threads(argv);
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
  cocemu::cli::add_train(app);
  cocemu::cli::add_plan(app);
  // Every failure is one line on stderr and exit status 2 (help: 0).
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    if (argc > 1 && what.find("A subcommand is required") != std::string::npos)
      what = fmt::format(
          "unknown subcommand '{}'; allowed: bench, tune, validate, collbench, "
          "attention, mlpbench, train, plan",
          argv[1]);
    std::fprintf(stderr, "cocemu: error: %s (see --help)\n", what.c_str());
    return 2;
  } catch (const cocemu::Error& e) {
    // The developer's tail ("[invalid argument: check … failed at file.cpp:12]") with
    // COCEMU_DEBUG=1 only.
    std::fprintf(stderr, "cocemu: error: %s\n", cocemu::user_message(e).c_str());
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    std::fprintf(stderr, "cocemu: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "cocemu: error: out of memory on this machine; use smaller sizes, or --dry-run "
                 "where the numerics' buffers are what does not fit\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cocemu: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
