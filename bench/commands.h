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

}  // namespace cocemu::cli
