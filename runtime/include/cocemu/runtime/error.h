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
  too_large,         ///< valid, but beyond what cocemu can model in this machine's memory
  internal,          ///< a bug in cocemu itself
};

const char* to_string(Errc code);

class Error : public std::runtime_error {
 public:
  Error(Errc code, std::string message, int rank = -1)
      : std::runtime_error(std::move(message)), code_(code), rank_(rank) {}
  Errc code() const { return code_; }
  /// The rank whose failure this is, when `run` rethrows a rank's failure; -1 otherwise.
  int rank() const { return rank_; }

 private:
  Errc code_;
  int rank_ = -1;
};

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
