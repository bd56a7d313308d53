#pragma once
// Subcommands of the `cocemu` executable.
#include <CLI/CLI.hpp>

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

}  // namespace cocemu::cli
