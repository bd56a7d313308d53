#pragma once
/// One error type for all of cocemu. Every failure a caller can act on is an `Error` whose message
/// names what was wrong, the value seen, what was allowed and, in multi-rank code, the rank, group
/// and call. Caller mistakes and runtime faults carry different codes.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace cocemu {

enum class Errc {
  invalid_argument,  ///< the caller passed something out of range or inconsistent
  mismatch,          ///< ranks disagree about a collective call (op, dtype, count, root …)
  timeout,           ///< a bounded wait expired
  remote_failure,    ///< another rank failed, this one was unwound
  parse_error,       ///< a configuration file is malformed (message carries file:line)
  rank_exception,    ///< a rank's function threw something other than a cocemu::Error
  too_large,  ///< valid, but beyond what cocemu can do within this machine's memory or time budget
  internal,   ///< a bug in cocemu itself
  resource_exhausted,  ///< memory, threads or another resource of the machine ran out mid-run
  cancelled,           ///< the run was interrupted (a signal: Ctrl-C, SIGTERM) and stopped
};

const char* to_string(Errc code);

class Error : public std::runtime_error {
 public:
  /// `origin` is the developer's tail ("[invalid argument: check `x` failed at file.cpp:12]");
  /// what() is the message followed by it. `rank` is set when `run` rethrows a rank's failure.
  Error(Errc code, std::string message, std::string origin = {}, int rank = -1)
      : std::runtime_error(origin.empty() ? message : message + " " + origin),
        code_(code),
        rank_(rank),
        message_(std::move(message)),
        origin_(std::move(origin)) {}
  Errc code() const { return code_; }
  /// The rank whose failure this is, when `run` rethrows a rank's failure; -1 otherwise.
  int rank() const { return rank_; }
  /// What a user needs: the message without the developer's tail.
  const std::string& message() const { return message_; }
  /// Where the error was raised, for developers (may be empty).
  const std::string& origin() const { return origin_; }

 private:
  Errc code_;
  int rank_ = -1;
  std::string message_, origin_;
};

/// The text to show a user for `e`: a cocemu::Error's message without its origin tail, unless
/// the environment sets COCEMU_DEBUG=1 (then what(), with the file and line); what() otherwise.
std::string user_message(const std::exception& e);

namespace detail {
[[noreturn]] void fail(Errc code, const char* condition, const char* file, int line,
                       std::string message);
}  // namespace detail

}  // namespace cocemu

/// Throws `cocemu::Error{code}` with a fmt-formatted message when `cond` is false. The message
/// should say what was seen and what was allowed; file, line and the condition are appended.
#define COCEMU_CHECK(cond, code, ...)                                                        \
  do {                                                                                       \
    if (!(cond)) [[unlikely]]                                                                \
      ::cocemu::detail::fail((code), #cond, __FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
  } while (0)

/// Shorthand for the most common case: a bad argument from the caller.
#define COCEMU_CHECK_ARG(cond, ...) \
  COCEMU_CHECK(cond, ::cocemu::Errc::invalid_argument, __VA_ARGS__)

#define COCEMU_FAIL(code, ...) \
  ::cocemu::detail::fail((code), "", __FILE__, __LINE__, ::fmt::format(__VA_ARGS__))
