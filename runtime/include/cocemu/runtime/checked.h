#pragma once
/// Checked arithmetic for sizes: element counts, bytes and modeled times are multiplied through
/// these, so an enormous request is refused with its figures instead of wrapping around.
#include <cstdint>
#include <string>

#include "cocemu/runtime/error.h"

namespace cocemu {

/// a · b for non-negative a and b, or an `Errc::invalid_argument` naming `what` when the product
/// exceeds `limit`.
inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::string& what,
                                std::int64_t limit = std::int64_t(1) << 62) {
  COCEMU_CHECK_ARG(a >= 0 && b >= 0, "{}: negative size ({} x {})", what, a, b);
  COCEMU_CHECK_ARG(a == 0 || b <= limit / a, "{}: {} x {} exceeds {} (2^{})", what, a, b, limit,
                   63 - __builtin_clzll(std::uint64_t(limit)));
  return a * b;
}

/// `text` as a decimal integer in [lo, hi] — digits only (a leading '-' where lo < 0), no
/// spaces, no wrap-around — or an `Errc::invalid_argument` "<what>='<text>' must be an integer in
/// lo..hi". For environment variables and other strings that carry numbers.
std::int64_t parse_integer(const std::string& what, const std::string& text, std::int64_t lo,
                           std::int64_t hi);

/// Bytes of memory this process may still use (limits.h: the least of MemAvailable, the cgroup's
/// room and RLIMIT_AS's), or 8 GiB when unknown.
std::int64_t available_memory_bytes();

/// Refuses up front (Errc::too_large) a real-numerics request estimated at `bytes` that needs more
/// than half of that, saying what would fit (`what` names the request and its options).
void check_fits_in_memory(std::int64_t bytes, const std::string& what);

}  // namespace cocemu
