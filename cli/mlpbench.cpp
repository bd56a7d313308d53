// `cocemu mlpbench`: a real-numerics tensor-parallel MLP block (column up, row down, sequence
// parallel) forward+backward under every CoC strategy, against the compute floor of this machine:
// the same GEMMs run back to back by n threads with plain OpenBLAS in the same process.
#include <cblas.h>
#include <nlohmann/json.hpp>

#include <barrier>
#include <chrono>
#include <fstream>
#include <random>
#include <thread>

#include "cocemu/bench/limits/estimate.h"
#include "cocemu/collectives/ops.h"
#include "cocemu/layers/linear.h"
#include "cocemu/runtime/blas.h"
#include "cocemu/runtime/checked.h"
#include "cocemu/runtime/error.h"
#include "commands.h"

namespace cocemu::cli {

namespace {

using layers::LinearOptions;
using layers::Strategy;

struct MlpOpts {
  int ranks = 8, repeats = 3;
  std::int64_t m = 2048, hidden = 2048, ffn = 8192, tile_rows = 128, tiles_per_step = 2;
  bool nondeterministic = false;
  std::string json;
  double max_seconds = 0;
};

Tensor random_tensor(const Shape& s, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  Tensor t = Tensor::zeros(s, DType::f32);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = u(rng);
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// One sample of the compute floor: every thread runs the block's six GEMMs with single-threaded
/// OpenBLAS.
double floor_sample(const MlpOpts& o) {
  const std::int64_t m = o.m, h = o.hidden, f = o.ffn / o.ranks;
  {
    std::barrier sync(o.ranks);
    std::vector<double> times(std::size_t(o.ranks));
    std::vector<std::thread> threads;
    for (int r = 0; r < o.ranks; ++r)
      threads.emplace_back([&, r] {
        openblas_set_num_threads(1);
        std::vector<float> x(std::size_t(m * h), 0.01f), w1(std::size_t(f * h), 0.01f),
            w2(std::size_t(h * f), 0.01f);
        std::vector<float> a(std::size_t(m * f)), y(std::size_t(m * h)), g1(std::size_t(f * h)),
            g2(std::size_t(h * f));
        sync.arrive_and_wait();
        const auto t0 = std::chrono::steady_clock::now();
        // forward: a = x·w1ᵀ, y = a·w2ᵀ; backward: da = dy·w2, dw2 = dyᵀ·a, dx = da·w1, dw1 = daᵀ·x
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(f), int(h), 1, x.data(),
                    int(h), w1.data(), int(h), 0, a.data(), int(f));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(h), int(f), 1, a.data(),
                    int(f), w2.data(), int(f), 0, y.data(), int(h));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(f), int(h), 1, y.data(),
                    int(h), w2.data(), int(f), 0, a.data(), int(f));
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(h), int(f), int(m), 1, y.data(),
                    int(h), a.data(), int(f), 0, g2.data(), int(f));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(h), int(f), 1, a.data(),
                    int(f), w1.data(), int(h), 0, x.data(), int(h));
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(f), int(h), int(m), 1, a.data(),
                    int(f), x.data(), int(h), 0, g1.data(), int(h));
        sync.arrive_and_wait();
        times[std::size_t(r)] = double((std::chrono::steady_clock::now() - t0).count());
      });
    for (auto& t : threads)
      t.join();
    return *std::max_element(times.begin(), times.end());
  }
}

struct StrategyResult {
  std::string name;
  double wall_ns = 0;
  std::int64_t modeled_ns = 0;
  bool bitwise_equal_serial = false;
};

}  // namespace

void add_mlpbench(CLI::App& app) {
  auto o = std::make_shared<MlpOpts>();
  CLI::App* sub = app.add_subcommand(
      "mlpbench",
      "real-numerics TP MLP block fwd+bwd per CoC strategy vs the OpenBLAS compute floor");
  number(sub, "-n,--ranks", o->ranks, "TP size", 1, 64);
  number(sub, "--m", o->m, "tokens (sequence × micro batch)", std::int64_t(1),
         std::int64_t(1) << 24);
  number(sub, "--hidden", o->hidden,
         "hidden size (the up projection's input, the down projection's output)", std::int64_t(1),
         std::int64_t(1) << 20);
  number(sub, "--ffn", o->ffn,
         "FFN size, all TP ranks together (each rank holds ffn / --ranks columns)", std::int64_t(1),
         std::int64_t(1) << 20);
  number(sub, "--repeats", o->repeats,
         "timed runs per strategy, interleaved with the floor's; the median is reported", 1, 1000);
  number(sub, "--tile-rows", o->tile_rows, "fused kernels' tile rows", std::int64_t(1),
         std::int64_t(1) << 20);
  number(sub, "--tiles-per-step", o->tiles_per_step, "fused kernels' tiles per step",
         std::int64_t(1), std::int64_t(15));
  sub->add_flag("--nondeterministic", o->nondeterministic,
                "OpenBLAS GEMMs and owner-first reductions (bits may differ between strategies)");
  sub->add_option("--json", o->json, "write floor_ns and strategies[] here");
  max_seconds_option(sub, o->max_seconds);
  sub->callback([o] {
    COCEMU_CHECK_ARG(
        o->m % o->ranks == 0 && o->ffn % o->ranks == 0 && o->repeats >= 1,
        "mlpbench: m ({}) and ffn ({}) must be divisible by the ranks ({}); repeats >= 1", o->m,
        o->ffn, o->ranks);
    const std::int64_t m = o->m, h = o->hidden, f = o->ffn / o->ranks, ml = m / o->ranks;
    check_estimate(bench::estimate_mlpbench(
                       m, h, o->ffn, o->ranks, o->repeats,
                       fmt::format("mlpbench with --m {} --hidden {} --ffn {}", m, h, o->ffn)),
                   time_budget(o->max_seconds));
    if (!o->json.empty()) check_output_file("--json", o->json);
    std::vector<std::pair<std::string, LinearOptions>> strategies{
        {"serial", {.strategy = Strategy::serial}},
        {"script P=2", {.strategy = Strategy::script, .parallel_num = 2}},
        {"script P=4", {.strategy = Strategy::script, .parallel_num = 4}},
        {"script P=8", {.strategy = Strategy::script, .parallel_num = 8}},
        {"fused",
         {.strategy = Strategy::fused,
          .tile_rows = o->tile_rows,
          .tiles_per_step = int(o->tiles_per_step)}}};
    // Repeats interleave the floor and every strategy, so that the machine's drift (a shared,
    // noisy host) hits them alike; each figure is the median over repeats.
    std::vector<double> floor_samples;
    std::vector<std::vector<double>> walls(strategies.size());
    std::vector<std::vector<std::vector<std::byte>>> bits(strategies.size());
    std::vector<std::int64_t> modeled(strategies.size());
    for (int rep = 0; rep < o->repeats; ++rep) {
      floor_samples.push_back(floor_sample(*o));
      for (std::size_t si = 0; si < strategies.size(); ++si) {
        const LinearOptions& lo = strategies[si].second;
        WorldOptions wo;
        wo.n_ranks = o->ranks;
        wo.record_wall_times = false;
        wo.deterministic = !o->nondeterministic;
        std::vector<double> per_rank(std::size_t(o->ranks));
        if (rep == 0) bits[si].resize(std::size_t(o->ranks));
        RunResult run_result = run(wo, [&](Rank& rank) {
          Group tp = Group::world(rank);
          const int r = rank.id();
          layers::ColumnParallelLinear up(tp, random_tensor({f, h}, 10 + r), Tensor(), true);
          layers::RowParallelLinear down(tp, random_tensor({h, f}, 20 + r), Tensor(), true);
          Tensor x = random_tensor({ml, h}, 30 + r), dy = random_tensor({ml, h}, 40 + r);
          LinearOptions up_o = lo, down_o = lo;
          up_o.label = "mlp.up";
          down_o.label = "mlp.down";
          barrier(tp).synchronize();
          const auto t0 = std::chrono::steady_clock::now();
          Tensor a = up.forward(x, up_o);
          Tensor y = down.forward(a, down_o);
          Tensor da = down.backward(dy, down_o);
          Tensor dx = up.backward(da, up_o);
          rank.synchronize();
          per_rank[std::size_t(r)] = double((std::chrono::steady_clock::now() - t0).count());
          if (rep == 0) {
            std::vector<std::byte> b;
            for (const Tensor* t : std::initializer_list<const Tensor*>{&y, &dx, &up.main_grad(),
                                                                        &down.main_grad()}) {
              const auto* p = static_cast<const std::byte*>(t->raw());
              b.insert(b.end(), p, p + t->nbytes());
            }
            bits[si][std::size_t(r)] = std::move(b);
          }
        });
        walls[si].push_back(*std::max_element(per_rank.begin(), per_rank.end()));
        modeled[si] = run_result.timeline.makespan_ns();
      }
    }
    const double floor = median(floor_samples);
    std::vector<StrategyResult> results;
    for (std::size_t si = 0; si < strategies.size(); ++si)
      results.push_back(
          {strategies[si].first, median(walls[si]), modeled[si], bits[si] == bits[0]});
    std::printf(
        "# cocemu mlpbench: TP=%d MLP block (column up %lldx%lld->%lld, row down, sequence "
        "parallel), f32, fwd+bwd, %s mode\n",
        o->ranks, (long long)m, (long long)h, (long long)o->ffn,
        o->nondeterministic ? "non-deterministic (OpenBLAS GEMMs)"
                            : "deterministic (tiling-invariant det_gemm)");
    std::printf(
        "# floor = the same 6 GEMMs per rank run back to back by %d threads with plain "
        "single-threaded OpenBLAS\n",
        o->ranks);
    std::printf("# OpenBLAS: %s; core %s; server threads started at load: %d; malloc from %s\n",
                blas::config().c_str(), blas::core_name().c_str(), blas::threads_at_load() - 1,
                malloc_library().c_str());
    const std::string advice = blas::core_advice();
    if (!advice.empty()) std::printf("# WARNING: %s\n", advice.c_str());
    std::printf("%-12s %12s %10s %14s %8s\n", "strategy", "wall ms", "x floor", "modeled us",
                "bitwise");
    std::printf("# wall = median of %d repeats, interleaved with the floor's\n", o->repeats);
    std::printf("%-12s %12.1f %10s %14s %8s\n", "floor", floor / 1e6, "1.00", "-", "-");
    for (const auto& r : results)
      std::printf("%-12s %12.1f %10.2f %14.1f %8s\n", r.name.c_str(), r.wall_ns / 1e6,
                  r.wall_ns / floor, r.modeled_ns / 1e3, r.bitwise_equal_serial ? "yes" : "NO");
    if (!o->json.empty()) {
      nlohmann::json s = nlohmann::json::array();
      for (const auto& r : results)
        s.push_back({{"name", r.name},
                     {"wall_ns", r.wall_ns},
                     {"ratio_to_floor", r.wall_ns / floor},
                     {"modeled_ns", r.modeled_ns},
                     {"bitwise_equal_serial", r.bitwise_equal_serial}});
      write_file("--json", o->json,
                 nlohmann::json{{"floor_ns", floor},
                                {"strategies", s},
                                {"ranks", o->ranks},
                                {"m", m},
                                {"hidden", h},
                                {"ffn", o->ffn},
                                {"deterministic", !o->nondeterministic},
                                {"openblas_core", blas::core_name()},
                                {"openblas_core_advice", advice}}
                         .dump(2) +
                     "\n");
    }
  });
}

}  // namespace cocemu::cli
