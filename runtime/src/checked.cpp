#include "cocemu/runtime/checked.h"

#include <fstream>
#include <sstream>

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
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("MemAvailable:", 0) == 0) {
      std::istringstream ss(line.substr(13));
      std::int64_t kib = 0;
      if (ss >> kib && kib > 0) return kib * 1024;
    }
  return std::int64_t(8) << 30;
}

void check_fits_in_memory(std::int64_t bytes, const std::string& what) {
  const std::int64_t avail = available_memory_bytes();
  COCEMU_CHECK_ARG(bytes <= avail / 2,
                   "{} needs about {:.1f} GiB for real numerics, more than half of the {:.1f} GiB "
                   "this machine has available; use --dry-run (shapes only) or smaller sizes",
                   what, double(bytes) / double(1 << 30), double(avail) / double(1 << 30));
}

}  // namespace cocemu
