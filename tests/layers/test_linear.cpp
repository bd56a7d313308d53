// Tensor-parallel linears with CoC (R-LA-1…3, R-LA-6, R-LA-8): every op, SP on and off, every
// strategy equals a single-rank reference (f64 within 1e-12); in deterministic mode outputs and
// all gradients are bitwise identical across serial, script P=1/2/4/8 and fused (any tiling),
// including non-power-of-two k, n and m remainders; the non-deterministic fused kernels stay
// within the bound and differ in the last bits; golden modeled times.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <random>

#include "cocemu/layers/fused_kernels.h"
#include "cocemu/layers/linear.h"
#include "cocemu/runtime/cost_model.h"
#include "testing.h"

namespace cocemu::layers {
namespace {

struct Case {
  bool column = true, sp = false;
  std::int64_t m = 32, k = 24, n = 40;
  DType dtype = DType::f64;
};

struct Full {
  Tensor x, w, b, dy;  // x [m, k], w [n, k], b [n], dy [m, n]
};

Tensor random(const Shape& s, DType t, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(std::size_t(s.numel()));
  for (auto& x : v)
    x = u(rng);
  return Tensor::from<double>(s, v, t);
}

Full inputs(const Case& c, std::uint64_t seed) {
  return {random({c.m, c.k}, c.dtype, seed), random({c.n, c.k}, c.dtype, seed + 1),
          random({c.n}, c.dtype, seed + 2), random({c.m, c.n}, c.dtype, seed + 3)};
}

Tensor cols(const Tensor& t, std::int64_t c0, std::int64_t c1) {
  Tensor out = Tensor::zeros({t.size(0), c1 - c0}, t.dtype());
  for (std::int64_t i = 0; i < t.size(0); ++i)
    out.rows(i, i + 1).copy_from(
        t.rows(i, i + 1).reshape({t.size(1)}).flat(c0, c1).reshape({1, c1 - c0}));
  return out;
}

void put_cols(const Tensor& dst, const Tensor& src, std::int64_t c0) {
  for (std::int64_t i = 0; i < src.size(0); ++i)
    dst.rows(i, i + 1)
        .reshape({dst.size(1)})
        .flat(c0, c0 + src.size(1))
        .copy_from(src.rows(i, i + 1).reshape({src.size(1)}));
}

struct Outcome {
  Tensor y, dx, dw, db;  // assembled full-size results (dw from main_grad: f32, f64 for f64)
};

Outcome run_layer(int ws, const Case& c, const Full& f, const LinearOptions& o,
                  WorldOptions wo = {}) {
  Outcome out{Tensor::zeros({c.m, c.n}, c.dtype), Tensor::zeros({c.m, c.k}, c.dtype),
              Tensor::zeros({c.n, c.k}, c.dtype == DType::f64 ? DType::f64 : DType::f32),
              Tensor::zeros({c.n}, DType::f32)};
  std::mutex mu;
  std::vector<Tensor> row_db(static_cast<std::size_t>(ws));
  cocemu::testing::run_ranks(
      ws,
      [&](Rank& rank) {
        Group tp = Group::world(rank);
        const int r = rank.id();
        if (c.column) {
          const std::int64_t nl = c.n / ws;
          ColumnParallelLinear layer(tp, f.w.rows(r * nl, (r + 1) * nl).clone(),
                                     f.b.flat(r * nl, (r + 1) * nl).clone(), c.sp);
          const std::int64_t ml = c.m / ws;
          Tensor x = c.sp ? f.x.rows(r * ml, (r + 1) * ml).clone() : f.x.clone();
          Tensor y = layer.forward(x, o);
          Tensor dx = layer.backward(cols(f.dy, r * nl, (r + 1) * nl), o);
          rank.synchronize();
          std::lock_guard lock(mu);
          put_cols(out.y, y, r * nl);
          if (c.sp)
            out.dx.rows(r * ml, (r + 1) * ml).copy_from(dx);
          else if (r == 0)
            out.dx.copy_from(dx);
          out.dw.rows(r * nl, (r + 1) * nl).copy_from(layer.main_grad());
          out.db.flat(r * nl, (r + 1) * nl).copy_from(layer.bias_grad());
        } else {
          const std::int64_t kl = c.k / ws, ml = c.m / ws;
          RowParallelLinear layer(tp, cols(f.w, r * kl, (r + 1) * kl), f.b.clone(), c.sp);
          Tensor y = layer.forward(cols(f.x, r * kl, (r + 1) * kl), o);
          Tensor dx =
              layer.backward(c.sp ? f.dy.rows(r * ml, (r + 1) * ml).clone() : f.dy.clone(), o);
          rank.synchronize();
          std::lock_guard lock(mu);
          if (c.sp)
            out.y.rows(r * ml, (r + 1) * ml).copy_from(y);
          else if (r == 0)
            out.y.copy_from(y);
          put_cols(out.dx, dx, r * kl);
          put_cols(out.dw, layer.main_grad(), r * kl);
          // Row bias is replicated: with SP each rank holds the grad of its rows (Megatron reduces
          // them later, in rank order here); without SP every rank holds the full grad.
          row_db[std::size_t(r)] = layer.bias_grad().clone();
        }
      },
      wo);
  if (!c.column)
    for (int r = 0; r < (c.sp ? ws : 1); ++r)
      for (std::int64_t j = 0; j < c.n; ++j)
        out.db.data<float>()[j] += row_db[std::size_t(r)].data<float>()[j];
  return out;
}

double rel(const Tensor& a, const Tensor& b) {
  double d = 0, s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    d = std::max(d, std::fabs(a.item(i) - b.item(i)));
    s = std::max(s, std::fabs(b.item(i)));
  }
  return s > 0 ? d / s : d;
}

Outcome reference(const Case& c, const Full& f) {
  Outcome r{Tensor::zeros({c.m, c.n}, DType::f64), Tensor::zeros({c.m, c.k}, DType::f64),
            Tensor::zeros({c.n, c.k}, DType::f64), Tensor::zeros({c.n}, DType::f64)};
  for (std::int64_t i = 0; i < c.m; ++i)
    for (std::int64_t j = 0; j < c.n; ++j) {
      double y = f.b.item(j);
      for (std::int64_t p = 0; p < c.k; ++p)
        y += f.x.item(i * c.k + p) * f.w.item(j * c.k + p);
      r.y.data<double>()[i * c.n + j] = y;
    }
  for (std::int64_t i = 0; i < c.m; ++i)
    for (std::int64_t p = 0; p < c.k; ++p) {
      double s = 0;
      for (std::int64_t j = 0; j < c.n; ++j)
        s += f.dy.item(i * c.n + j) * f.w.item(j * c.k + p);
      r.dx.data<double>()[i * c.k + p] = s;
    }
  for (std::int64_t j = 0; j < c.n; ++j) {
    double db = 0;
    for (std::int64_t i = 0; i < c.m; ++i)
      db += f.dy.item(i * c.n + j);
    r.db.data<double>()[j] = db;
    for (std::int64_t p = 0; p < c.k; ++p) {
      double s = 0;
      for (std::int64_t i = 0; i < c.m; ++i)
        s += f.dy.item(i * c.n + j) * f.x.item(i * c.k + p);
      r.dw.data<double>()[j * c.k + p] = s;
    }
  }
  return r;
}

std::vector<LinearOptions> all_strategies() {
  std::vector<LinearOptions> v;
  v.push_back({.strategy = Strategy::serial});
  for (int p : {1, 2, 4, 8})
    v.push_back({.strategy = Strategy::script, .parallel_num = p});
  for (std::int64_t tile : {1, 3, 16})
    for (int steps : {1, 2})
      v.push_back({.strategy = Strategy::fused, .tile_rows = tile, .tiles_per_step = steps});
  v.push_back({.strategy = Strategy::fused, .enable_coc_in_column_backward = true});
  v.push_back({.strategy = Strategy::fused, .recompute_all_gather = false});
  return v;
}

std::string describe(const Case& c, const LinearOptions& o) {
  return fmt::format("{} sp={} m={} k={} n={} {} strategy {} P={} tile={}x{}",
                     c.column ? "column" : "row", c.sp, c.m, c.k, c.n, name_of(c.dtype),
                     to_string(o.strategy), o.parallel_num, o.tile_rows, o.tiles_per_step);
}

TEST(Linear, EveryOpAndStrategyMatchesTheReferenceInF64) {
  for (bool column : {true, false})
    for (bool sp : {false, true}) {
      const Case c{column, sp, 48, 36, 40, DType::f64};
      const Full f = inputs(c, 7);
      const Outcome ref = reference(c, f);
      for (const LinearOptions& o : all_strategies()) {
        const Outcome got = run_layer(4, c, f, o);
        EXPECT_LE(rel(got.y, ref.y), 1e-12) << describe(c, o);
        EXPECT_LE(rel(got.dx, ref.dx), 1e-12) << describe(c, o);
        EXPECT_LE(rel(got.dw, ref.dw), 1e-12) << describe(c, o) << " (main_grad is f64)";
        EXPECT_LE(rel(got.db, ref.db), 1e-6) << describe(c, o) << " (bias grads are f32)";
      }
    }
}

// With one member in the TP group Megatron skips the layers' TP all-reduces (mappings.py's
// `_reduce`, the column backward's grad-input reduction): the results are the reference's and
// no all_reduce is recorded; with two members each layer records its reductions.
TEST(Linear, OneMemberTpLaunchesNoAllReduce) {
  for (bool column : {true, false})
    for (const Strategy s : {Strategy::serial, Strategy::script}) {
      const Case c{column, false, 48, 36, 40, DType::f64};
      const Full f = inputs(c, 9);
      const LinearOptions o{.strategy = s, .parallel_num = s == Strategy::script ? 2 : 1};
      const Outcome ref = reference(c, f), got = run_layer(1, c, f, o);
      EXPECT_LE(rel(got.y, ref.y), 1e-12) << describe(c, o);
      EXPECT_LE(rel(got.dx, ref.dx), 1e-12) << describe(c, o);
      EXPECT_LE(rel(got.dw, ref.dw), 1e-12) << describe(c, o);
      for (const int ws : {1, 2}) {
        WorldOptions wo;
        wo.numerics = false;
        const RunResult run = cocemu::testing::run_ranks(
            ws,
            [&](Rank& rank) {
              Group tp = Group::world(rank);
              if (column) {
                ColumnParallelLinear layer(tp, Tensor::shape_only({c.n / ws, c.k}, c.dtype),
                                           Tensor(), false);
                layer.backward(layer.forward(Tensor::shape_only({c.m, c.k}, c.dtype), o), o);
              } else {
                RowParallelLinear layer(tp, Tensor::shape_only({c.n, c.k / ws}, c.dtype), Tensor(),
                                        false);
                layer.forward(Tensor::shape_only({c.m, c.k / ws}, c.dtype), o);
              }
            },
            wo);
        int reductions = 0;
        for (const auto& op : run.graph.ranks[0].ops)
          reductions += op.cls == OpClass::comm && op.name.rfind("all_reduce", 0) == 0;
        EXPECT_EQ(reductions == 0, ws == 1) << describe(c, o) << " ws " << ws;
      }
    }
}

TEST(Linear, DeterministicStrategiesAreBitwiseIdentical) {
  // f32 and bf16, non-power-of-two k and n, m with remainders for P (the fallback chunk count).
  for (DType t : {DType::f32, DType::bf16})
    for (auto [m, k, n] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{64, 40, 24},
                           {48, 36, 56},
                           {24, 100, 8}})
      for (bool column : {true, false})
        for (bool sp : {false, true}) {
          const Case c{column, sp, m, k, n, t};
          const Full f = inputs(c, 11);
          const Outcome serial = run_layer(4, c, f, {.strategy = Strategy::serial});
          for (const LinearOptions& o : all_strategies()) {
            const Outcome got = run_layer(4, c, f, o);
            EXPECT_TRUE(got.y.bitwise_equal(serial.y)) << describe(c, o);
            EXPECT_TRUE(got.dx.bitwise_equal(serial.dx)) << describe(c, o);
            EXPECT_TRUE(got.dw.bitwise_equal(serial.dw)) << describe(c, o);
            EXPECT_TRUE(got.db.bitwise_equal(serial.db)) << describe(c, o);
          }
        }
}

TEST(Linear, SchedulesDoNotChangeABit) {
  const Case c{false, true, 64, 40, 48, DType::f32};
  const Full f = inputs(c, 3);
  const Outcome base = run_layer(4, c, f, {.strategy = Strategy::fused});
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    WorldOptions wo;
    wo.schedule_seed = seed;
    const LinearOptions o = seed % 2
                                ? LinearOptions{.strategy = Strategy::fused, .tile_rows = 4}
                                : LinearOptions{.strategy = Strategy::script, .parallel_num = 4};
    const Outcome got = run_layer(4, c, f, o, wo);
    EXPECT_TRUE(got.y.bitwise_equal(base.y)) << seed;
    EXPECT_TRUE(got.dx.bitwise_equal(base.dx)) << seed;
    EXPECT_TRUE(got.dw.bitwise_equal(base.dw)) << seed;
  }
}

TEST(Linear, NonDeterministicFusedKernelsStayWithinTheBoundAndDiffer) {
  // Rotated reduction order: |nondet - det| <= (ws-1)·2^-24·Σ|partial| per element (f32 sums).
  for (bool sp : {false, true}) {
    const Case c{false, sp, 64, 64, 64, DType::f32};
    const Full f = inputs(c, 5);
    const Outcome det = run_layer(8, c, f, {.strategy = Strategy::fused});
    WorldOptions wo;
    wo.deterministic = false;
    const Outcome nd = run_layer(8, c, f, {.strategy = Strategy::fused}, wo);
    int differ = 0;
    for (std::int64_t i = 0; i < det.y.numel(); ++i) {
      const double bound =
          7 * std::ldexp(1.0, -24) * 64.0 * 8;  // Σ|partial| <= ranks · k · max|x||w|
      EXPECT_LE(std::fabs(nd.y.item(i) - det.y.item(i)), bound);
      differ += nd.y.item(i) != det.y.item(i);
    }
    EXPECT_GT(differ, 0) << "sp=" << sp;
  }
}

TEST(Linear, ScriptChunkCountFallsBackWhenMIsNotDivisible) {
  // m = 24 rows on 4 ranks with SP: 6 local rows, P = 4 does not divide -> P = 2 is used.
  const Case c{false, true, 24, 16, 8, DType::f32};
  const Full f = inputs(c, 1);
  cocemu::testing::run_ranks(4, [&](Rank& rank) {
    Group tp = Group::world(rank);
    RowParallelLinear layer(tp, cols(f.w, rank.id() * 4, rank.id() * 4 + 4), Tensor(), true);
    layer.forward(cols(f.x, rank.id() * 4, rank.id() * 4 + 4),
                  {.strategy = Strategy::script, .parallel_num = 4});
    rank.synchronize();
    int chunks = 0;
    for (const auto& op : rank.graph().ops)
      chunks +=
          op.cls == OpClass::compute && op.name.find("row fwd matmul[2/2]") != std::string::npos;
    EXPECT_EQ(chunks, 1);
  });
}

TEST(Linear, BadShapesAreClearErrors) {
  cocemu::testing::run_ranks(2, [](Rank& rank) {
    Group tp = Group::world(rank);
    cocemu::testing::expect_error(
        [&] {
          ColumnParallelLinear bad(tp, Tensor::zeros({4, 8}, DType::f32),
                                   Tensor::zeros({5}, DType::f32), false);
        },
        Errc::invalid_argument, {"bias", "[4]"});
    ColumnParallelLinear l(tp, Tensor::zeros({4, 8}, DType::f32), Tensor(), true);
    cocemu::testing::expect_error(
        [&] {
          l.forward(Tensor::zeros({3, 7}, DType::f32));
        },
        Errc::invalid_argument, {"on rank", "f32[3, 7]", "[m, 8]"});
    cocemu::testing::expect_error(
        [&] {
          l.forward(Tensor::zeros({4, 8}, DType::f32),
                    {.strategy = Strategy::script, .parallel_num = 3});
        },
        Errc::invalid_argument, {"parallel_num = 3", "1, 2, 4, 8"});
  });
}

// Golden modeled time: a row-parallel forward (no SP) on 2 ranks on the round-number profile, with
// compute and communication of equal cost. m=64, k=2000, n=16: the matmul is 2·64·16·2000 flop =
// 4096 ns; the direct all_reduce of 64·16 f32 moves 4·1024 bytes per link = 4096 ns. Serial: 8192.
// P chunks: C/P + P·(M/P) = 4096/P + 4096 = (P+1)/(2P) of serial.
double row_forward_ns(int P, double launch_ns) {
  WorldOptions wo;
  wo.profile = cocemu::testing::round_profile(fmt::format(
      "host: {{launch_overhead_ns: {}, fused_launch_overhead_ns: {}}}", launch_ns, launch_ns));
  const RunResult r = cocemu::testing::run_ranks(
      2,
      [&](Rank& rank) {
        Group tp = Group::world(rank);
        RowParallelLinear layer(tp, Tensor::zeros({16, 2000}, DType::f32), Tensor(), false);
        layer.forward(Tensor::zeros({64, 2000}, DType::f32),
                      P == 0 ? LinearOptions{.strategy = Strategy::serial}
                             : LinearOptions{.strategy = Strategy::script, .parallel_num = P});
      },
      wo);
  return double(r.timeline.makespan_ns());
}

TEST(Linear, GoldenOverlapIsPPlusOneOverTwoP) {
  EXPECT_EQ(row_forward_ns(0, 0), 8192);
  for (int P : {2, 4, 8})
    EXPECT_EQ(row_forward_ns(P, 0), 8192.0 * (P + 1) / (2 * P)) << P;
}

TEST(Linear, HighLaunchOverheadMakesEightChunksSlowerThanFour) {
  // 1 µs per launch: P=8 pays 16 launches (matmul + all_reduce per chunk) against 8 for P=4.
  EXPECT_GT(row_forward_ns(8, 1000), row_forward_ns(4, 1000));
  EXPECT_LT(row_forward_ns(8, 0), row_forward_ns(4, 0));
}

TEST(Linear, PrintTensorValueShowsEachBlock) {
  Tensor t = Tensor::from<double>(
      {8, 2}, std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
      DType::f32);
  const std::string s = print_tensor_value("out", t, 3, 4, 3);
  EXPECT_NE(s.find("[rank 3] out block 1/4: [0, 1, 2]"), std::string::npos) << s;
  EXPECT_NE(s.find("[rank 3] out block 4/4: [12, 13, 14]"), std::string::npos) << s;
}

}  // namespace
}  // namespace cocemu::layers

namespace cocemu::layers {
namespace {

// Checked mode: a correct run raises nothing; a deliberately broken protocol is caught, naming
// rank, peer, slot and step.
void run_fused(bool reduce_scatter, const FusedOptions& o, std::uint64_t schedule_seed = 0) {
  WorldOptions wo;
  wo.schedule_seed = schedule_seed;
  cocemu::testing::run_ranks(
      4,
      [&](Rank& rank) {
        Group tp = Group::world(rank);
        Tensor x = Tensor::zeros({32, 16}, DType::f32), w = Tensor::zeros({8, 16}, DType::f32);
        Tensor out = Tensor::zeros({reduce_scatter ? 8 : 32, 8}, DType::f32);
        if (reduce_scatter)
          matmul_reduce_scatter(tp, x, w, true, Tensor(), out, o);
        else
          matmul_all_reduce(tp, x, w, Tensor(), out, o);
        rank.synchronize();
      },
      wo);
}

TEST(FusedProtocol, CheckedModeAcceptsTheRealProtocol) {
  for (bool rs : {false, true})
    for (std::uint64_t seed : {0, 1, 2, 3, 4})  // several interleavings, 32 steps each
      run_fused(rs, {.tile_rows = 1, .tiles_per_step = 1, .checked = true}, seed);
}

TEST(FusedProtocol, ReadBeforeTheFlagIsCaught) {
  for (bool rs : {false, true})
    cocemu::testing::expect_error(
        [&] {
          run_fused(rs, {.tile_rows = 2,
                         .checked = true,
                         .test_hook = {.rank = 0,
                                       .skip_ready_wait = true,
                                       .delay_others = std::chrono::milliseconds(40)}});
        },
        Errc::internal,
        {"protocol violation: rank 0 read peer", "slot 0 at step 0", "before its flag was raised"});
}

TEST(FusedProtocol, OverwriteBeforeConsumptionIsCaught) {
  for (bool rs : {false, true})
    cocemu::testing::expect_error(
        [&] {
          run_fused(rs, {.tile_rows = 2,
                         .checked = true,
                         .test_hook = {.rank = 0,
                                       .overwrite_early = true,
                                       .delay_others = std::chrono::milliseconds(40)}});
        },
        Errc::internal, {"protocol violation: rank 0 overwrote slot 0 at step 2 before peer"});
}

}  // namespace
}  // namespace cocemu::layers
