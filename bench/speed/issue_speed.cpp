// Host cost of issuing a small collective (#14): every rank of an N-rank world issues CALLS
// async 4 KiB all_reduces back to back and times the issue loop alone (its streams run the calls
// meanwhile); then synchronizes. Prints the median over ranks and rounds of the host time per
// issued call, and the wall time per call of the whole round.
//
//   issue_speed [RANKS=8] [CALLS=200] [ROUNDS=5]
#include <fmt/format.h>

#include <sys/resource.h>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <vector>

#include "cocemu/collectives/ops.h"
#include "cocemu/runtime/blas.h"
#include "cocemu/runtime/world.h"

int main(int argc, char** argv) {
  using namespace cocemu;
  using Clock = std::chrono::steady_clock;
  blas::restart_without_server_threads(argv);  // OpenBLAS's idle pool would take a core
  const int ranks = argc > 1 ? std::atoi(argv[1]) : 8;
  const int calls = argc > 2 ? std::atoi(argv[2]) : 200;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 5;
  if (ranks < 1 || ranks > 256 || calls < 1 || rounds < 1) {
    fmt::print(stderr,
               "issue_speed: ranks {}, calls {}, rounds {}; usage: issue_speed [RANKS 1..256] "
               "[CALLS >= 1] [ROUNDS >= 1]\n",
               ranks, calls, rounds);
    return 2;
  }
  WorldOptions wo;
  wo.n_ranks = ranks;
  wo.record_wall_times = false;
  std::mutex mu;
  std::vector<double> issue_ns, wall_ns, faults, cpu_ns;
  const auto thread_cpu_ns = [] {  // CPU time of this thread (the issue loop's wall includes
    timespec ts{};                 // the time other threads ran on its core)
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) * 1e9 + double(ts.tv_nsec);
  };
  const auto minor_faults = [] {  // this thread's page faults served without I/O
    rusage u{};
    getrusage(RUSAGE_THREAD, &u);
    return double(u.ru_minflt);
  };
  run(wo, [&](Rank& rank) {
    Group world = Group::world(rank);
    Tensor in = Tensor::zeros({1024}, DType::f32), out = Tensor::zeros({1024}, DType::f32);
    CollectiveOptions co{.async_op = true};
    all_reduce(world, in, out, co).synchronize();  // plans cached, streams warm
    for (int r = 0; r < rounds; ++r) {
      barrier(world, {.async_op = true}).synchronize();
      const double f0 = minor_faults();
      const double c0 = thread_cpu_ns();
      const auto t0 = Clock::now();
      for (int c = 0; c < calls; ++c)
        all_reduce(world, in, out, co);
      const auto t1 = Clock::now();
      const double c1 = thread_cpu_ns();
      const double f1 = minor_faults();
      rank.comm_stream().synchronize();
      const auto t2 = Clock::now();
      std::lock_guard lock(mu);
      issue_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / calls);
      wall_ns.push_back(std::chrono::duration<double, std::nano>(t2 - t0).count() / calls);
      faults.push_back((f1 - f0) / calls);
      cpu_ns.push_back((c1 - c0) / calls);
    }
  });
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  fmt::print("issue_speed: {} ranks, {} async 4 KiB all_reduces per round, {} rounds\n", ranks,
             calls, rounds);
  fmt::print("host issue per call  {:8.2f} us (median over ranks and rounds)\n",
             median(issue_ns) / 1e3);
  fmt::print("host issue CPU per call {:5.2f} us (median; the thread's own CPU time)\n",
             median(cpu_ns) / 1e3);
  fmt::print("page faults per call  {:8.3f} (issuing thread)\n", median(faults));
  fmt::print("wall per call        {:8.2f} us\n", median(wall_ns) / 1e3);
}
