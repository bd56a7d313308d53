// cocemu quick start: 8 ranks all-reduce a vector after a producer kernel; the run records a
// modeled device timeline. Build against an installed cocemu (see CMakeLists.txt here), or with
//   g++ -std=c++20 quickstart.cpp $(pkg-config --cflags --libs cocemu)
#include <cstdio>

#include "cocemu/collectives/ops.h"
#include "cocemu/runtime/trace.h"

using namespace cocemu;

int main() {
  RunResult r = run(8, [](Rank& rank) {  // 8 rank threads
    Group world = Group::world(rank);
    Tensor x = Tensor::zeros({1024}, DType::f32);
    // A kernel on the compute stream: 5 us modeled; it writes rank + 1 into x.
    rank.compute_stream().launch({.name = "produce", .work_ns = 5000},
                                 [x, v = float(rank.id() + 1)] {
                                   for (std::int64_t i = 0; i < x.numel(); ++i)
                                     x.data<float>()[i] = v;
                                 });
    Work w = all_reduce(world, x, {.async_op = true});  // on the comm stream, after the producer
    w.wait();            // the compute stream waits for it; the host does not block
    rank.synchronize();  // the host waits for all of this rank's streams
    if (rank.id() == 0) std::printf("x[0] = %g on every rank\n", x.item(0));
  });
  std::printf("modeled time %.3f us (host wall time %.3f ms)\n",
              double(r.timeline.makespan_ns()) / 1e3, double(r.wall_ns) / 1e6);
  write_chrome_trace(r, "trace.json");  // open in Perfetto or chrome://tracing
  write_svg_timeline(r, "timeline.svg", "quickstart");
  return 0;
}
