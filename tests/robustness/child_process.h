#pragma once
// Runs a program as a child process with a deadline, and reports what a robustness test asserts
// on: its exit status, its stderr, its wall time and its peak resident memory (getrusage of the
// child and what it waited for, so a wrapper such as prlimit, which execs, is measured as the
// program itself).
#include <string>
#include <vector>

namespace cocemu::testing {

struct ChildOutcome {
  int exit = -1;           ///< exit status; 128 + signal when killed; 124 on the deadline
  std::string err;         ///< stderr (stdout is discarded)
  double seconds = 0;      ///< wall time
  double peak_rss_mb = 0;  ///< ru_maxrss of the child (MiB)
  bool timed_out = false;
};

/// Runs `argv` (argv[0] searched on PATH) with `env` added to the environment ("NAME=value"),
/// killing its process group after `deadline_s` seconds.
ChildOutcome run_child(const std::vector<std::string>& argv, double deadline_s,
                       const std::vector<std::string>& env = {});

/// "prog a b" → {"prog", "a", "b"} (split on spaces; no quoting).
std::vector<std::string> split_args(const std::string& line);

}  // namespace cocemu::testing
