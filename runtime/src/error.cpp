#include "cocemu/runtime/error.h"

#include <cstdlib>
#include <cstring>

namespace cocemu {

const char* to_string(Errc code) {
  switch (code) {
    case Errc::invalid_argument:
      return "invalid argument";
    case Errc::mismatch:
      return "mismatch";
    case Errc::timeout:
      return "timeout";
    case Errc::remote_failure:
      return "remote failure";
    case Errc::parse_error:
      return "parse error";
    case Errc::rank_exception:
      return "exception in rank";
    case Errc::too_large:
      return "too large to model";
    case Errc::internal:
      return "internal error";
    case Errc::resource_exhausted:
      return "resource exhausted";
    case Errc::cancelled:
      return "cancelled";
  }
  return "unknown";
}

namespace detail {
void fail(Errc code, const char* condition, const char* file, int line, std::string message) {
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  std::string origin =
      condition && *condition
          ? fmt::format("[{}: check `{}` failed at {}:{}]", to_string(code), condition, base, line)
          : fmt::format("[{} at {}:{}]", to_string(code), base, line);
  throw Error(code, std::move(message), std::move(origin));
}
}  // namespace detail

std::string user_message(const std::exception& e) {
  const char* debug = std::getenv("COCEMU_DEBUG");
  if (debug && std::strcmp(debug, "0") != 0 && *debug) return e.what();
  if (const auto* err = dynamic_cast<const Error*>(&e)) return err->message();
  return e.what();
}

}  // namespace cocemu
