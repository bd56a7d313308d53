#pragma once
// Interval arithmetic on modeled timelines: how long ops of one kind ran, overlapped, or ran
// while nothing of another kind covered them (exposed communication).
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace cocemu::bench::detail {

using Interval = std::pair<std::int64_t, std::int64_t>;

/// Sorted, merged intervals (empty ones dropped).
inline std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const auto& iv : v) {
    if (iv.second <= iv.first) continue;
    if (!out.empty() && iv.first <= out.back().second)
      out.back().second = std::max(out.back().second, iv.second);
    else
      out.push_back(iv);
  }
  return out;
}

inline double length(const std::vector<Interval>& v) {
  double s = 0;
  for (const auto& [a, b] : v)
    s += double(b - a);
  return s;
}

/// Total length of the intersection of two merged interval lists.
inline double intersection(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double s = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const std::int64_t lo = std::max(a[i].first, b[j].first),
                       hi = std::min(a[i].second, b[j].second);
    if (hi > lo) s += double(hi - lo);
    (a[i].second < b[j].second ? i : j)++;
  }
  return s;
}

/// Length of merged `a` not covered by merged `b`.
inline double uncovered(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  return length(a) - intersection(a, b);
}

}  // namespace cocemu::bench::detail
