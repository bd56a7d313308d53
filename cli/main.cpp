// cocemu: emulate one accelerator node of N ranks and measure compute-communication overlap.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <new>
#include <thread>

#include <unistd.h>

#include "cocemu/runtime/blas.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/sync.h"
#include "commands.h"

namespace {

/// SIGINT and SIGTERM: the first asks every run to stop (sync.h request_interrupt: the run's
/// waits fail, and it reports where each rank was); a second one, or a program that has not
/// exited kStopGrace later (it was not in a run, or a rank is stuck in a computation), ends the
/// process at once. Exit status 128 + the signal, as a shell reports it.
constexpr auto kStopGrace = std::chrono::milliseconds(1500);

void write_err(const char* text) {
  const ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

extern "C" void on_stop_signal(int sig) {
  if (cocemu::interrupt_requested() != 0) {  // the second: no more waiting
    write_err("cocemu: interrupted again; exiting now\n");
    ::_exit(128 + sig);
  }
  cocemu::request_interrupt(sig);
  write_err(sig == SIGINT ? "cocemu: interrupted (SIGINT); stopping\n"
                          : "cocemu: terminated (SIGTERM); stopping\n");
}

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  // The watchdog: a detached thread that only looks at the flag (async-signal-safe to set).
  std::thread([] {
    while (cocemu::interrupt_requested() == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::this_thread::sleep_for(kStopGrace);
    write_err("cocemu: error: interrupted; the program did not stop within 1.5 s, exiting\n");
    ::_exit(128 + cocemu::interrupt_requested());
  }).detach();
}

}  // namespace

int main(int argc, char** argv) {
  cocemu::blas::restart_without_server_threads(argv);
  install_stop_signals();
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
    if (e.code() == cocemu::Errc::cancelled && cocemu::interrupt_requested() != 0)
      return 128 + cocemu::interrupt_requested();
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
