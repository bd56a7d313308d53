// w8A16 MATMUL_ALL_REDUCE (R-LA-3, R-LA-8): int8 weights dequantised per tile as (W + offset)·scale
// with per-tensor, per-channel and per-group scales (ragged last group) and optional offsets.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <random>

#include "cocemu/collectives/ops.h"
#include "cocemu/layers/fused_kernels.h"
#include "testing.h"

namespace cocemu::layers {
namespace {

Tensor normal(const Shape& s, DType t, std::uint64_t seed, double sigma = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0, sigma);
  std::vector<double> v(std::size_t(s.numel()));
  for (auto& x : v)
    x = d(rng);
  return Tensor::from<double>(s, v, t);
}

/// Symmetric int8 quantisation of w [k, n] (offset 0): scale = max|w| / 127 over each region.
W8A16Weight quantize(const Tensor& w, QuantGranularity gran, std::int64_t g) {
  const std::int64_t k = w.size(0), n = w.size(1);
  W8A16Weight q;
  q.granularity = gran;
  q.group_size = g;
  const std::int64_t groups = gran == QuantGranularity::per_group ? (k + g - 1) / g : 1;
  const std::int64_t count = gran == QuantGranularity::per_tensor ? 1 : groups * n;
  q.scale = Tensor::zeros({count}, DType::f32);
  auto region = [&](std::int64_t i, std::int64_t j) {
    return gran == QuantGranularity::per_tensor    ? 0
           : gran == QuantGranularity::per_channel ? j
                                                   : (i / g) * n + j;
  };
  std::vector<double> mx(std::size_t(count), 0.0);
  for (std::int64_t i = 0; i < k; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      mx[std::size_t(region(i, j))] =
          std::max(mx[std::size_t(region(i, j))], std::fabs(w.item(i * n + j)));
  for (std::int64_t c = 0; c < count; ++c)
    q.scale.data<float>()[c] = float(mx[std::size_t(c)] / 127.0);
  q.weight = Tensor::zeros({k, n}, DType::i8);
  for (std::int64_t i = 0; i < k; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      q.weight.data<std::int8_t>()[i * n + j] =
          std::int8_t(std::lround(w.item(i * n + j) / q.scale.data<float>()[region(i, j)]));
  return q;
}

TEST(W8A16, RelativeErrorAgainstF32WeightsStaysBelowTwoPercent) {
  const int ws = 4;
  const std::int64_t m = 64, k = 256, n = 96;
  for (auto [gran, g] : {std::pair{QuantGranularity::per_tensor, std::int64_t(0)},
                         {QuantGranularity::per_channel, std::int64_t(0)},
                         {QuantGranularity::per_group, std::int64_t(64)}}) {
    Tensor out_full;
    std::vector<Tensor> xs, ws_f32;
    for (int r = 0; r < ws; ++r) {
      xs.push_back(normal({m, k}, DType::bf16, 10 + r));
      ws_f32.push_back(normal({k, n}, DType::f32, 20 + r, 0.05));
    }
    std::mutex mu;
    cocemu::testing::run_ranks(ws, [&](Rank& rank) {
      Group tp = Group::world(rank);
      Tensor out = Tensor::zeros({m, n}, DType::bf16);
      w8a16_matmul_all_reduce(tp, xs[std::size_t(rank.id())],
                              quantize(ws_f32[std::size_t(rank.id())], gran, g), Tensor(), out, {});
      rank.synchronize();
      std::lock_guard lock(mu);
      if (rank.id() == 0) out_full = out;
    });
    double num = 0, den = 0;
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double ref = 0;
        for (int r = 0; r < ws; ++r)
          for (std::int64_t p = 0; p < k; ++p)
            ref += xs[std::size_t(r)].item(i * k + p) * ws_f32[std::size_t(r)].item(p * n + j);
        num += std::pow(out_full.item(i * n + j) - ref, 2);
        den += ref * ref;
      }
    const double rel = std::sqrt(num / den);
    std::printf("w8A16 %s: relative error %.4f%% vs f32 weights\n",
                gran == QuantGranularity::per_tensor    ? "per-tensor"
                : gran == QuantGranularity::per_channel ? "per-channel"
                                                        : "per-group(64)",
                100 * rel);
    ::testing::Test::RecordProperty(gran == QuantGranularity::per_tensor    ? "per_tensor_error"
                                    : gran == QuantGranularity::per_channel ? "per_channel_error"
                                                                            : "per_group_error",
                                    fmt::format("{:.6f}", rel));
    EXPECT_LT(rel, 0.02);
  }
}

TEST(W8A16, RaggedGroupsAndOffsetsEqualDequantiseThenMatmul) {
  const int ws = 4;
  const std::int64_t m = 40, k = 100, n = 24, g = 32;  // 4 groups, the last of 4 rows
  for (DType act : {DType::f16, DType::bf16})
    for (bool with_offset : {false, true}) {
      std::vector<W8A16Weight> qs;
      std::vector<Tensor> xs;
      std::mt19937 rng(3);
      for (int r = 0; r < ws; ++r) {
        W8A16Weight q;
        q.granularity = QuantGranularity::per_group;
        q.group_size = g;
        q.weight = Tensor::zeros({k, n}, DType::i8);
        for (std::int64_t i = 0; i < k * n; ++i)
          q.weight.data<std::int8_t>()[i] = std::int8_t(int(rng() % 255) - 127);
        q.scale = Tensor::zeros({4, n}, DType::f32);
        for (std::int64_t i = 0; i < 4 * n; ++i)
          q.scale.data<float>()[i] = 0.001f * float(1 + rng() % 9);
        if (with_offset) {
          q.offset = Tensor::zeros({4, n}, DType::f32);
          for (std::int64_t i = 0; i < 4 * n; ++i)
            q.offset.data<float>()[i] = float(int(rng() % 9) - 4);
        }
        qs.push_back(q);
        xs.push_back(normal({m, k}, act, 50 + r));
      }
      cocemu::testing::run_ranks(ws, [&](Rank& rank) {
        Group tp = Group::world(rank);
        const W8A16Weight& q = qs[std::size_t(rank.id())];
        Tensor bias = normal({n}, act, 99);
        Tensor fused = Tensor::zeros({m, n}, act);
        w8a16_matmul_all_reduce(tp, xs[std::size_t(rank.id())], q, bias, fused,
                                {.tile_rows = 8, .tiles_per_step = 2});
        // Reference: dequantise, matmul, all_reduce, bias — as separate ops.
        Tensor deq = dequantize(q, act), y = Tensor::zeros({m, n}, act);
        rank.compute_stream().launch({.name = "ref matmul"}, [&] {
          Tensor a = xs[std::size_t(rank.id())].to(DType::f32), b = deq.to(DType::f32),
                 c = Tensor::zeros({m, n}, DType::f32);
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < n; ++j) {
              float acc = 0;
              for (std::int64_t p = 0; p < k; ++p)
                acc = std::fma(a.data<float>()[i * k + p], b.data<float>()[p * n + j], acc);
              c.data<float>()[i * n + j] = acc;
            }
          y.copy_from(c.to(act));
        });
        all_reduce(tp, y);
        rank.synchronize();
        Tensor yb = y.to(DType::f32), bb = bias.to(DType::f32),
               want = Tensor::zeros({m, n}, DType::f32);
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < n; ++j)
            want.data<float>()[i * n + j] = yb.data<float>()[i * n + j] + bb.data<float>()[j];
        EXPECT_TRUE(fused.bitwise_equal(want.to(act))) << name_of(act) << " offset " << with_offset;
        // Spot-check the dequantisation formula itself, including the ragged last group.
        const std::int64_t i = 99, j = 5, idx = (i / g) * n + j;
        const float v = (float(q.weight.data<std::int8_t>()[i * n + j]) +
                         (with_offset ? q.offset.data<float>()[idx] : 0.f)) *
                        q.scale.data<float>()[idx];
        EXPECT_EQ(deq.item(i * n + j),
                  Tensor::from<double>({1}, std::vector<double>{double(v)}, act).item(0));
      });
    }
}

TEST(W8A16, BadScaleShapesAreRejected) {
  cocemu::testing::run_ranks(2, [](Rank& rank) {
    Group tp = Group::world(rank);
    W8A16Weight q;
    q.granularity = QuantGranularity::per_group;
    q.group_size = 32;
    q.weight = Tensor::zeros({100, 8}, DType::i8);
    q.scale = Tensor::zeros({3, 8}, DType::f32);  // needs ceil(100/32) = 4 groups
    cocemu::testing::expect_error(
        [&] {
          w8a16_matmul_all_reduce(tp, Tensor::zeros({4, 100}, DType::bf16), q, Tensor(),
                                  Tensor::zeros({4, 8}, DType::bf16), {});
        },
        Errc::invalid_argument, {"scale f32[3, 8]", "32 f32 values", "[ceil(k/g), n]", "g = 32"});
    cocemu::testing::expect_error(
        [&] {
          w8a16_matmul_all_reduce(tp, Tensor::zeros({4, 100}, DType::f32), q, Tensor(),
                                  Tensor::zeros({4, 8}, DType::f32), {});
        },
        Errc::invalid_argument, {"f16 or bf16"});
  });
}

}  // namespace
}  // namespace cocemu::layers
