#include "cocemu/runtime/checked.h"

#include "cocemu/runtime/limits.h"

namespace cocemu {

std::int64_t parse_integer(const std::string& what, const std::string& text, std::int64_t lo,
                           std::int64_t hi) {
  bool ok = !text.empty() && text.size() <= 20;
  std::size_t i = 0;
  const bool negative = ok && text[0] == '-';
  if (negative) ok = lo < 0 && text.size() > 1, i = 1;
  __int128 v = 0;
  for (; ok && i < text.size(); ++i) {
    ok = text[i] >= '0' && text[i] <= '9';
    v = v * 10 + (text[i] - '0');
  }
  if (negative) v = -v;
  ok = ok && v >= lo && v <= hi;
  COCEMU_CHECK_ARG(ok, "{}='{}' must be an integer in {}..{}", what,
                   text.size() > 40 ? text.substr(0, 40) + "..." : text, lo, hi);
  return std::int64_t(v);
}

std::int64_t available_memory_bytes() {
  return memory_limits().bytes();
}

void check_fits_in_memory(std::int64_t bytes, const std::string& what) {
  check_estimate({.what = what,
                  .memory_bytes = bytes,
                  .way_out = "use --dry-run (shapes only) or smaller sizes"});
}

}  // namespace cocemu
