#pragma once
// Subcommands of the `cocemu` executable.
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <string>
#include <type_traits>

namespace cocemu::cli {

/// Registers `cocemu collbench` on `app`.
void add_collbench(CLI::App& app);
/// Registers `cocemu attention` on `app`.
void add_attention(CLI::App& app);
/// Registers `cocemu mlpbench` on `app`.
void add_mlpbench(CLI::App& app);
/// Registers `cocemu bench` (the main job) on `app`.
void add_bench(CLI::App& app);
/// Registers `cocemu tune` on `app`.
void add_tune(CLI::App& app);
/// Registers `cocemu validate` on `app`.
void add_validate(CLI::App& app);
/// Registers `cocemu train` on `app`.
void add_train(CLI::App& app);
void add_plan(CLI::App& app);

/// The shared library the process's malloc comes from ("libtbbmalloc_proxy.so.2" when the
/// binary is linked with oneTBB's scalable allocator, "libc.so.6" otherwise).
std::string malloc_library();

}  // namespace cocemu::cli

namespace cocemu::cli {

/// A numeric option limited to [lo, hi]: anything else (0, negatives, 2^64, text, nan, inf) is
/// a usage error naming the option and the range.
template <class T>
CLI::Option* number(CLI::App* app, const std::string& name, T& value, const std::string& help, T lo,
                    T hi) {
  CLI::Option* o = app->add_option(name, value, help);
  if constexpr (std::is_floating_point_v<T>)  // CLI11's Range lets nan through (no order)
    o->check(CLI::Validator(
        [lo, hi](std::string& text) -> std::string {
          char* end = nullptr;
          const double v = std::strtod(text.c_str(), &end);
          if (end == text.c_str() || *end != '\0' || !(v >= double(lo) && v <= double(hi)))
            return "Value " + text + " not in range " + std::to_string(lo) + " to " +
                   std::to_string(hi);
          return {};
        },
        "finite", "finite"));
  return o->check(CLI::Range(lo, hi))->capture_default_str();
}

/// Adds --max-seconds: the host time a request may take, checked against its estimate before any
/// work (runtime/limits.h); unset (0), COCEMU_MAX_SECONDS or 600 s.
inline CLI::Option* max_seconds_option(CLI::App* app, double& value) {
  return number<double>(app, "--max-seconds", value,
                        "refuse up front work estimated to take longer (host seconds; default "
                        "COCEMU_MAX_SECONDS or 600)",
                        1, 1e7);
}
/// The time budget: `value` when --max-seconds was given, else the default.
double time_budget(double value);

/// Fails up front (before any work) if `dir` cannot be created or written.
void check_output_dir(const std::string& option, const std::string& dir);
/// Fails up front if `path` cannot be written (its folder missing, a directory, read-only).
void check_output_file(const std::string& option, const std::string& path);
/// Writes `text` to `path`; a failed open or write (disk full) is an error naming the option.
void write_file(const std::string& option, const std::string& path, const std::string& text);

}  // namespace cocemu::cli
