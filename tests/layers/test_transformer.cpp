// The transformer layer (R-LA-7): forward and backward on n ranks equal a single-rank reference;
// deterministic strategies give identical bits; the six CoC segments are named in the trace.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <random>

#include "cocemu/layers/transformer.h"
#include "cocemu/runtime/trace.h"
#include "testing.h"

namespace cocemu::layers {
namespace {

struct LayerResult {
  Tensor y, dx, dw_qkv_r0, dw_down_r0;
  RunResult run;
};

Tensor random_rows(std::int64_t m, std::int64_t h, DType t, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0, 1);
  std::vector<double> v(std::size_t(m * h));
  for (auto& x : v)
    x = d(rng);
  return Tensor::from<double>({m, h}, v, t);
}

LayerResult run_layer(int ws, const TransformerConfig& c, const LinearOptions& o) {
  const TransformerWeights w = TransformerWeights::random(c, 5);
  const std::int64_t m = c.seq * c.batch;
  const Tensor x = random_rows(m, c.hidden, c.dtype, 1), dy = random_rows(m, c.hidden, c.dtype, 2);
  LayerResult r{
      Tensor::zeros({m, c.hidden}, c.dtype), Tensor::zeros({m, c.hidden}, c.dtype), {}, {}, {}};
  std::mutex mu;
  r.run = cocemu::testing::run_ranks(ws, [&](Rank& rank) {
    Group tp = Group::world(rank);
    TransformerLayer layer(tp, c, w);
    const std::int64_t ml = c.sequence_parallel ? m / ws : m,
                       r0 = c.sequence_parallel ? rank.id() * ml : 0;
    Tensor y = layer.forward(x.rows(r0, r0 + ml).clone(), o);
    Tensor dx = layer.backward(dy.rows(r0, r0 + ml).clone(), o);
    rank.synchronize();
    std::lock_guard lock(mu);
    if (c.sequence_parallel || rank.id() == 0) {
      r.y.rows(r0, r0 + ml).copy_from(y);
      r.dx.rows(r0, r0 + ml).copy_from(dx);
    }
    if (rank.id() == 0) {
      r.dw_qkv_r0 = layer.qkv().main_grad().clone();
      r.dw_down_r0 = layer.mlp_down().main_grad().clone();
    }
  });
  return r;
}

double rel(const Tensor& a, const Tensor& b) {
  double d = 0, s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    d = std::max(d, std::fabs(a.item(i) - b.item(i)));
    s = std::max(s, std::fabs(b.item(i)));
  }
  return d / s;
}

TEST(Transformer, TensorParallelEqualsSingleRank) {
  for (const bool llama : {false, true})
    for (bool sp : {false, true}) {
      // GPT-style (GeLU, MHA) and LLaMA-style (SwiGLU, GQA with 2 query heads per KV group).
      TransformerConfig c{.seq = 32,
                          .batch = 2,
                          .hidden = 32,
                          .heads = llama ? 8 : 4,
                          .ffn = 64,
                          .kv_heads = llama ? 4 : 0,
                          .activation = llama ? Activation::swiglu : Activation::gelu,
                          .sequence_parallel = sp,
                          .dtype = DType::f64};
      const LayerResult one = run_layer(1, c, {});
      for (const LinearOptions& o : {LinearOptions{.strategy = Strategy::serial},
                                     LinearOptions{.strategy = Strategy::script, .parallel_num = 2},
                                     LinearOptions{.strategy = Strategy::fused, .tile_rows = 8}}) {
        const LayerResult four = run_layer(4, c, o);
        EXPECT_LE(rel(four.y, one.y), 1e-12)
            << "llama " << llama << " sp " << sp << " " << to_string(o.strategy);
        EXPECT_LE(rel(four.dx, one.dx), 1e-12)
            << "llama " << llama << " sp " << sp << " " << to_string(o.strategy);
      }
    }
}

TEST(Transformer, StrategiesAreBitwiseIdenticalAndSegmentsAreNamed) {
  TransformerConfig c{.seq = 64,
                      .batch = 2,
                      .hidden = 64,
                      .heads = 4,
                      .ffn = 128,
                      .sequence_parallel = true,
                      .dtype = DType::f32};
  const LayerResult serial = run_layer(4, c, {.strategy = Strategy::serial});
  for (const LinearOptions& o : {LinearOptions{.strategy = Strategy::script, .parallel_num = 1},
                                 LinearOptions{.strategy = Strategy::script, .parallel_num = 2},
                                 LinearOptions{.strategy = Strategy::script, .parallel_num = 4},
                                 LinearOptions{.strategy = Strategy::script, .parallel_num = 8},
                                 LinearOptions{.strategy = Strategy::fused, .tile_rows = 3}}) {
    const LayerResult r = run_layer(4, c, o);
    EXPECT_TRUE(r.y.bitwise_equal(serial.y)) << to_string(o.strategy) << o.parallel_num;
    EXPECT_TRUE(r.dx.bitwise_equal(serial.dx)) << to_string(o.strategy) << o.parallel_num;
    EXPECT_TRUE(r.dw_qkv_r0.bitwise_equal(serial.dw_qkv_r0));
    EXPECT_TRUE(r.dw_down_r0.bitwise_equal(serial.dw_down_r0));
    if (o.strategy == Strategy::script && o.parallel_num == 4) {
      const std::string trace = chrome_trace_json(r.run);
      for (const char* seg :
           {"attn.qkv column fwd all_gather", "attn.out row fwd", "mlp.up column fwd all_gather",
            "mlp.down row fwd", "mlp.down row bwd all_gather", "attn.out row bwd all_gather"})
        EXPECT_NE(trace.find(seg), std::string::npos) << seg;
      for (const char* seg : {"fwd attn.qkv", "fwd attn.out", "fwd mlp.up", "fwd mlp.down",
                              "bwd mlp.down", "bwd attn.out"})
        EXPECT_NE(trace.find(fmt::format(R"("segment":"{}")", seg)), std::string::npos) << seg;
    }
  }
}

// LLaMA-style in bf16 (attention widened to f32 inside): every strategy has the serial bits.
TEST(Transformer, LlamaStyleBf16StrategiesAreBitwiseIdentical) {
  TransformerConfig c{.seq = 32,
                      .batch = 2,
                      .hidden = 64,
                      .heads = 8,
                      .ffn = 96,
                      .kv_heads = 4,
                      .activation = Activation::swiglu,
                      .sequence_parallel = true,
                      .dtype = DType::bf16};
  const LayerResult serial = run_layer(4, c, {.strategy = Strategy::serial});
  double norm = 0;
  for (std::int64_t i = 0; i < serial.dx.numel(); ++i)
    norm += std::fabs(serial.dx.item(i));
  EXPECT_GT(norm, 0) << "the backward produced an all-zero gradient";
  for (const LinearOptions& o : {LinearOptions{.strategy = Strategy::script, .parallel_num = 4},
                                 LinearOptions{.strategy = Strategy::fused, .tile_rows = 4}}) {
    const LayerResult r = run_layer(4, c, o);
    EXPECT_TRUE(r.y.bitwise_equal(serial.y)) << to_string(o.strategy);
    EXPECT_TRUE(r.dx.bitwise_equal(serial.dx)) << to_string(o.strategy);
    EXPECT_TRUE(r.dw_qkv_r0.bitwise_equal(serial.dw_qkv_r0)) << to_string(o.strategy);
  }
}

// A dry run (shapes only) records the same modeled program as the real run, so its modeled
// times are the real ones; and a full-size layer is modeled without allocating its weights.
TEST(Transformer, DryRunModelsTheSameTimelineAsTheRealRun) {
  TransformerConfig c{.seq = 64,
                      .batch = 1,
                      .hidden = 64,
                      .heads = 8,
                      .ffn = 160,
                      .kv_heads = 4,
                      .activation = Activation::swiglu,
                      .sequence_parallel = true,
                      .dtype = DType::bf16};
  for (const LinearOptions& o : {LinearOptions{.strategy = Strategy::serial},
                                 LinearOptions{.strategy = Strategy::script, .parallel_num = 4},
                                 LinearOptions{.strategy = Strategy::fused, .tile_rows = 4}}) {
    const LayerResult real = run_layer(4, c, o);
    WorldOptions wo;
    wo.numerics = false;
    const TransformerWeights shapes = TransformerWeights::shapes(c);
    const RunResult dry = cocemu::testing::run_ranks(
        4,
        [&](Rank& rank) {
          Group tp = Group::world(rank);
          TransformerLayer layer(tp, c, shapes);
          const std::int64_t ml = c.seq * c.batch / 4;
          layer.forward(Tensor::shape_only({ml, c.hidden}, c.dtype), o);
          layer.backward(Tensor::shape_only({ml, c.hidden}, c.dtype), o);
          rank.synchronize();
        },
        wo);
    EXPECT_EQ(dry.timeline.makespan_ns(), real.run.timeline.makespan_ns()) << to_string(o.strategy);
    EXPECT_GT(dry.timeline.makespan_ns(), 0);
  }
  // LLaMA2-70B's shapes: 8192 hidden, 28672 FFN, 4096 tokens; modeled, nothing allocated.
  TransformerConfig big{.seq = 4096,
                        .batch = 1,
                        .hidden = 8192,
                        .heads = 64,
                        .ffn = 28672,
                        .kv_heads = 8,
                        .activation = Activation::swiglu,
                        .sequence_parallel = true,
                        .dtype = DType::bf16};
  WorldOptions wo;
  wo.numerics = false;
  const RunResult dry = cocemu::testing::run_ranks(
      8,
      [&](Rank& rank) {
        Group tp = Group::world(rank);
        TransformerLayer layer(tp, big, TransformerWeights::shapes(big));
        layer.forward(Tensor::shape_only({512, 8192}, DType::bf16), {});
        layer.backward(Tensor::shape_only({512, 8192}, DType::bf16), {});
        rank.synchronize();
      },
      wo);
  EXPECT_GT(dry.timeline.makespan_ns(), 1'000'000);  // milliseconds of modeled work
}

}  // namespace
}  // namespace cocemu::layers
