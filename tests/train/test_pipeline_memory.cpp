// Pipeline schedules (R-TR-3), the layout rules (R-TR-2) and the memory model (R-TR-7).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "cocemu/runtime/error.h"
#include "cocemu/train/buckets.h"
#include "cocemu/train/pipeline.h"
#include "cocemu/train/report.h"
#include "cocemu/train/trainer.h"
#include "testing.h"

namespace cocemu::layers::train {
namespace {

/// A dry run (shapes only) of `o` on the default world.
TrainResult dry_train(const TrainOptions& o) {
  WorldOptions w;
  w.numerics = false;
  return train(o, w);
}

// Every schedule runs each (micro-batch, chunk) forward once and backward once, the backward
// after the forward, and a chunk's backwards in micro-batch order (gradients accumulate in the
// same order whatever the schedule).
TEST(Pipeline, EverySchedulePassesEachMicroBatchOnceInOrder) {
  struct C {
    PipelineSchedule s;
    int pp, vpp, m;
  };
  for (const C& c :
       {C{PipelineSchedule::gpipe, 4, 1, 6}, C{PipelineSchedule::one_f_one_b, 4, 1, 6},
        C{PipelineSchedule::one_f_one_b, 4, 1, 4}, C{PipelineSchedule::interleaved, 4, 2, 8},
        C{PipelineSchedule::interleaved, 2, 3, 4}, C{PipelineSchedule::interleaved, 4, 2, 4}})
    for (int stage = 0; stage < c.pp; ++stage) {
      SCOPED_TRACE(
          fmt::format("{} pp{} vpp{} m{} stage {}", to_string(c.s), c.pp, c.vpp, c.m, stage));
      const auto a = pipeline_actions(c.s, c.pp, c.vpp, c.m, stage);
      ASSERT_EQ(a.size(), std::size_t(2 * c.m * c.vpp));
      std::map<std::pair<int, int>, int> fwd_at;
      std::map<int, int> last_bwd_mb;
      for (int i = 0; i < int(a.size()); ++i) {
        const auto key = std::pair{a[std::size_t(i)].micro_batch, a[std::size_t(i)].chunk};
        if (a[std::size_t(i)].forward) {
          EXPECT_TRUE(fwd_at.emplace(key, i).second) << "forward twice";
        } else {
          ASSERT_TRUE(fwd_at.count(key)) << "backward before forward";
          auto [it, fresh] = last_bwd_mb.emplace(key.second, key.first);
          if (!fresh) {
            EXPECT_EQ(key.first, it->second + 1) << "backwards out of order";
          }
          it->second = key.first;
        }
      }
      EXPECT_EQ(fwd_at.size(), std::size_t(c.m * c.vpp));
    }
}

// Megatron's warm-up counts: 1F1B pp − stage − 1; interleaved (pp − stage − 1)·2 + (vpp − 1)·pp.
TEST(Pipeline, WarmupCountsAreMegatrons) {
  auto warmup = [](const std::vector<PipelineAction>& a) {
    int n = 0;
    while (n < int(a.size()) && a[std::size_t(n)].forward)
      ++n;
    return n;
  };
  for (int stage = 0; stage < 4; ++stage) {
    // The first backward follows the warm-up forwards and one steady-state forward.
    EXPECT_EQ(warmup(pipeline_actions(PipelineSchedule::one_f_one_b, 4, 1, 8, stage)),
              4 - stage - 1 + 1);
    EXPECT_EQ(warmup(pipeline_actions(PipelineSchedule::interleaved, 4, 2, 8, stage)),
              (4 - stage - 1) * 2 + (2 - 1) * 4 + 1);
    EXPECT_EQ(warmup(pipeline_actions(PipelineSchedule::gpipe, 4, 1, 8, stage)), 8);
  }
  // Megatron's interleaved order: groups of pp micro-batches per chunk.
  const auto a = pipeline_actions(PipelineSchedule::interleaved, 2, 2, 4, 0);
  const std::vector<PipelineAction> first{{true, 0, 0}, {true, 1, 0}, {true, 0, 1}, {true, 1, 1}};
  EXPECT_EQ(std::vector<PipelineAction>(a.begin(), a.begin() + 4), first);
  EXPECT_THROW(pipeline_actions(PipelineSchedule::interleaved, 4, 2, 6, 0), Error);
}

DecoderShape gpt(std::int64_t h, std::int64_t a, std::int64_t s, std::int64_t layers) {
  DecoderShape m;
  m.name = "gpt";
  m.hidden = h;
  m.heads = a;
  m.kv_heads = a;
  m.ffn = 4 * h;
  m.swiglu = false;
  m.seq = s;
  m.num_layers = layers;
  m.vocab = 51200;
  return m;
}

double sum(const std::vector<bench::MemoryTerm>& v) {
  double s = 0;
  for (const auto& t : v)
    s += t.bytes;
  return s;
}

/// "F0 >F0 <B1 | B0" style rendering of a stage's steps: a pass is its label, a call lists its
/// sends (>) and receives (<), a blocking call is wrapped in [ ].
std::string render(const std::vector<PipelineStep>& steps, int vpp) {
  std::string out;
  for (const auto& st : steps) {
    if (!out.empty()) out += ' ';
    if (st.kind == PipelineStep::compute) {
      out += action_label(st.action, vpp);
      continue;
    }
    std::string call;
    for (const auto& a : st.sends)
      call += (call.empty() ? ">" : " >") + action_label(a, vpp);
    for (const auto& a : st.recvs)
      call += (call.empty() ? "<" : " <") + action_label(a, vpp);
    out += st.blocking ? "[" + call + "]" : "(" + call + ")";
  }
  return out;
}

// The p2p calls between the passes are Megatron's. Non-interleaved 1F1B
// (forward_backward_pipelining_without_interleaving, every call waits for its transfers): a
// warm-up forward's send_forward, then recv_forward; send_forward_recv_backward after a steady
// forward, send_backward_recv_forward after a steady backward, and send_backward then
// recv_backward in the cool-down. Interleaved without overlap_p2p_comm: send_forward_recv_forward
// after each warm-up forward (the last also receives the first gradient), one
// send_forward_backward_recv_forward_backward after each steady forward-backward pair,
// send_backward_recv_backward in the cool-down. Overlapped: each receive right before its pass
// (with the previous pass's send, not waited for).
TEST(Pipeline, P2PCallsAreMegatrons) {
  // pp 3, 4 micro-batches, the middle stage: one warm-up forward.
  EXPECT_EQ(
      render(pipeline_steps(PipelineSchedule::one_f_one_b, P2PMode::blocking_1f1b, 3, 1, 4, 1), 1),
      "[<F0] F0 [>F0] [<F1] F1 [>F1 <B0] B0 [>B0 <F2] F2 [>F2 <B1] B1 [>B1 <F3] F3 "
      "[>F3 <B2] B2 [>B2] [<B3] B3 [>B3]");
  // The first stage receives no activations and sends no gradients; the last the reverse.
  EXPECT_EQ(
      render(pipeline_steps(PipelineSchedule::one_f_one_b, P2PMode::blocking_1f1b, 2, 1, 2, 0), 1),
      "F0 [>F0] F1 [>F1 <B0] B0 [<B1] B1");
  EXPECT_EQ(
      render(pipeline_steps(PipelineSchedule::one_f_one_b, P2PMode::blocking_1f1b, 2, 1, 2, 1), 1),
      "[<F0] F0 B0 [>B0 <F1] F1 B1 [>B1]");
  // Interleaved, pp 3, 2 chunks, 3 micro-batches, the last stage: every pass is warm-up (then
  // recv_backward, here nothing: the last chunk's gradient starts at the loss).
  EXPECT_EQ(render(pipeline_steps(PipelineSchedule::interleaved, P2PMode::blocking_interleaved, 3,
                                  2, 3, 2),
                   2),
            "[<F0.0] F0.0 [>F0.0 <F1.0] F1.0 [>F1.0 <F2.0] F2.0 [>F2.0 <F0.1] F0.1 [<F1.1] F1.1 "
            "[<F2.1] F2.1 B0.1 [>B0.1] B1.1 [>B1.1] B2.1 [>B2.1 <B0.0] B0.0 [>B0.0 <B1.0] B1.0 "
            "[>B1.0 <B2.0] B2.0 [>B2.0]");
  // With a steady state (pp 4, 2 chunks, 8 micro-batches): a forward and a backward back to back,
  // then one call that sends both and receives the next of each; the last warm-up forward's call
  // also receives the first gradient.
  for (int stage = 0; stage < 4; ++stage) {
    const auto st = pipeline_steps(PipelineSchedule::interleaved, P2PMode::blocking_interleaved, 4,
                                   2, 8, stage);
    int pairs = 0;
    for (std::size_t i = 0; i + 2 < st.size(); ++i) {
      if (st[i].kind != PipelineStep::compute || st[i + 1].kind != PipelineStep::compute) continue;
      ASSERT_TRUE(st[i].action.forward && !st[i + 1].action.forward) << render(st, 2);
      ++pairs;
      const auto& call = st[i + 2];
      ASSERT_EQ(call.kind, PipelineStep::exchange) << render(st, 2);
      EXPECT_TRUE(call.blocking);
      auto has = [](const PipelineStep::Passes& v, const PipelineAction& a) {
        return std::find(v.begin(), v.end(), a) != v.end();
      };
      for (const auto& a : {st[i].action, st[i + 1].action}) {
        if (sends_output(a, 4, 2, stage)) {
          EXPECT_TRUE(has(call.sends, a)) << render(st, 2);
        }
      }
    }
    const int warmup = (4 - stage - 1) * 2 + 4;
    EXPECT_EQ(pairs, 16 - warmup) << "stage " << stage;
  }
  EXPECT_EQ(
      render(pipeline_steps(PipelineSchedule::interleaved, P2PMode::overlapped, 2, 2, 2, 0), 2),
      "F0.0 (>F0.0) F1.0 (>F1.0 <F0.1) F0.1 (>F0.1 <F1.1) F1.1 (>F1.1 <B0.1) B0.1 "
      "(>B0.1 <B1.1) B1.1 (>B1.1 <B0.0) B0.0 (<B1.0) B1.0");
  EXPECT_EQ(p2p_mode(TrainLayout{.schedule = PipelineSchedule::one_f_one_b}),
            P2PMode::blocking_1f1b);
  EXPECT_EQ(p2p_mode(TrainLayout{.schedule = PipelineSchedule::interleaved}), P2PMode::overlapped);
  EXPECT_EQ(
      p2p_mode(TrainLayout{.schedule = PipelineSchedule::interleaved, .overlap_p2p_comm = false}),
      P2PMode::blocking_interleaved);
}

// Whatever the mode, every transfer a stage sends is received by its neighbour, and both list
// the transfers of each link in the same order (the links are FIFO, as NCCL's are).
TEST(Pipeline, EveryP2PSendHasItsReceiveInTheSameOrder) {
  struct C {
    PipelineSchedule s;
    P2PMode mode;
    int pp, vpp, m;
  };
  for (const C& c : {C{PipelineSchedule::one_f_one_b, P2PMode::blocking_1f1b, 4, 1, 8},
                     C{PipelineSchedule::one_f_one_b, P2PMode::blocking_1f1b, 4, 1, 4},
                     C{PipelineSchedule::interleaved, P2PMode::blocking_interleaved, 4, 2, 8},
                     C{PipelineSchedule::interleaved, P2PMode::blocking_interleaved, 3, 3, 3},
                     C{PipelineSchedule::interleaved, P2PMode::overlapped, 4, 3, 8},
                     C{PipelineSchedule::gpipe, P2PMode::overlapped, 4, 1, 6}}) {
    SCOPED_TRACE(
        fmt::format("{} {} pp{} vpp{} m{}", to_string(c.s), to_string(c.mode), c.pp, c.vpp, c.m));
    // Per link (from, to, forward): the sequence of (micro-batch, receiving chunk).
    std::map<std::tuple<int, int, bool>, std::vector<std::pair<int, int>>> sent, received;
    for (int stage = 0; stage < c.pp; ++stage)
      for (const auto& st : pipeline_steps(c.s, c.mode, c.pp, c.vpp, c.m, stage)) {
        for (const auto& a : st.sends) {
          const int to = a.forward ? (stage + 1) % c.pp : (stage + c.pp - 1) % c.pp;
          const int chunk = a.forward ? (stage == c.pp - 1 ? a.chunk + 1 : a.chunk)
                                      : (stage == 0 ? a.chunk - 1 : a.chunk);
          sent[{stage, to, a.forward}].push_back({a.micro_batch, chunk});
        }
        for (const auto& a : st.recvs) {
          const int from = a.forward ? (stage + c.pp - 1) % c.pp : (stage + 1) % c.pp;
          received[{from, stage, a.forward}].push_back({a.micro_batch, a.chunk});
        }
      }
    EXPECT_EQ(sent, received);
    EXPECT_FALSE(sent.empty());
  }
}

// Megatron's non-interleaved 1F1B waits for each send (wait_on_reqs): on a pipeline across two
// nodes, the first stage's next pass starts only once its activation has crossed. Interleaved
// with overlap_p2p_comm the stage goes on while its send is on the wire.
TEST(Pipeline, OneFOneBWaitsForItsSends) {
  for (const bool interleaved : {false, true}) {
    TrainOptions o;
    o.model = gpt(2048, 16, 1024, 4);
    o.layout.tp = 8;
    o.layout.pp = 2;
    o.layout.micro_batch_size = 1;
    o.layout.global_batch_size = 4;
    if (interleaved) {
      o.layout.vpp = 2;
      o.layout.schedule = PipelineSchedule::interleaved;
    }
    o.iterations = 1;
    WorldOptions w;
    w.numerics = false;
    w.profile = std::make_shared<const DeviceProfile>(load_named_profile("ascend-910b"));
    const auto r = train(o, w);
    const auto& ops = r.run.graph.ranks[0].ops;
    const auto& lanes = r.run.graph.ranks[0].lane_names;
    const auto& t = r.run.timeline.rank(0);
    // Each send of rank 0 and the first compute op enqueued after it.
    int sends = 0, overtaken = 0;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (lanes[std::size_t(ops[i].lane)] != "pp fwd out" || ops[i].cls != OpClass::comm) continue;
      ++sends;
      for (std::size_t j = i + 1; j < ops.size(); ++j)
        if (ops[j].cls == OpClass::compute) {
          overtaken += t[j].start_ns < t[i].end_ns;
          break;
        }
    }
    ASSERT_GT(sends, 0);
    if (interleaved)
      EXPECT_GT(overtaken, 0) << "overlapped sends";
    else
      EXPECT_EQ(overtaken, 0) << "1F1B: a pass started while the send before it was on the wire";
  }
}

// Megatron's DDP buckets (distributed_data_parallel.py, param_and_grad_buffer.py): bucket_size
// = max(40M, 1M·dp) elements on pipeline rank 0's first chunk, closed when a bucket holds at
// least that many (parameters are not split); one bucket on later pipeline ranks, on chunks > 0
// and without overlap_grad_reduce; never across chunks. MindFormers' gradient_aggregation_group:
// G groups of max((L + 1)/G, 1) layers (embedding and LM head with the first), one group of
// layers with pp > 1.
TEST(Buckets, MegatronsDdpAndMindFormersGroups) {
  const DecoderShape m = gpt(4096, 32, 2048, 32);
  // A stage's parameters in backward order: the LM head (last stage), chunks from the last,
  // layers from the last, four linears each; the embedding (first stage).
  auto params = [&](const TrainLayout& l, int stage) {
    std::vector<GradParam> v;
    if (stage == l.pp - 1) v.push_back({l.vpp - 1, -1, 51200 * 4096});
    for (int c = l.vpp - 1; c >= 0; --c) {
      const auto r = layers_of(m, l, stage, c);
      for (std::int64_t k = r.count - 1; k >= 0; --k)
        for (const std::int64_t n :
             {4096LL * 16384, 4096LL * 16384, 4096LL * 4096, 3 * 4096LL * 4096})
          v.push_back({c, r.first + k, n});
    }
    if (stage == 0) v.push_back({0, -1, 51200 * 4096});
    return v;
  };
  auto count = [](const std::vector<int>& b) {
    return b.empty() ? 0 : *std::max_element(b.begin(), b.end()) + 1;
  };
  TrainLayout l;
  l.pp = 2;
  l.vpp = 2;
  l.dp = 8;
  l.schedule = PipelineSchedule::interleaved;
  EXPECT_EQ(megatron_bucket_elements(8), 40'000'000);
  EXPECT_EQ(megatron_bucket_elements(64), 64'000'000);
  // Stage 0: chunk 1 (8 layers) in one bucket, then chunk 0 cut at >= 40M elements: each layer's
  // MLP linears (67M each) close a bucket alone, out+qkv (67M together) another: 3 per layer
  // (24), and the embedding (210M) its own.
  const auto p0 = params(l, 0);
  const auto b0 = assign_buckets(m, l, 0, p0);
  EXPECT_EQ(count(b0), 1 + 24 + 1);
  for (std::size_t i = 0; i < p0.size(); ++i) {
    if (p0[i].chunk == 1) {
      EXPECT_EQ(b0[i], 0);
    }
  }
  for (std::size_t i = 1; i < p0.size(); ++i)
    EXPECT_LE(b0[i - 1], b0[i]) << "buckets are contiguous in backward order";
  // Stage 1: one bucket per chunk.
  const auto b1 = assign_buckets(m, l, 1, params(l, 1));
  EXPECT_EQ(count(b1), 2);
  // dp 128: buckets of 128M elements: the two MLP linears (134M) close one, out+qkv with the
  // next layer's down (134M) the next, and so on: fewer buckets.
  TrainLayout wide = l;
  wide.dp = 128;
  EXPECT_LT(count(assign_buckets(m, wide, 0, p0)), count(b0));
  // Without --overlap-grad-reduce: one bucket per chunk everywhere.
  TrainLayout no_overlap = l;
  no_overlap.overlap_grad_reduce = false;
  EXPECT_EQ(count(assign_buckets(m, no_overlap, 0, p0)), 2);
  // An explicit bucket size applies on every stage (PyTorch DDP's bucket_cap_mb): 16-bit
  // gradients of 100 MB are 50M elements.
  TrainLayout cap = l;
  cap.bucket_mb = 100;
  cap.grad_reduce_in_fp32 = false;
  EXPECT_GT(count(assign_buckets(m, cap, 1, params(cap, 1))), 2);
  // MindFormers: pp 1, 32 layers, 4 groups of 33 / 4 = 8 layers; embedding and LM head with
  // layers 0-7.
  TrainLayout mf;
  mf.dp = 8;
  mf.gradient_aggregation_group = 4;
  const auto pm = params(mf, 0);
  const auto bm = assign_buckets(m, mf, 0, pm);
  EXPECT_EQ(count(bm), 4);
  for (std::size_t i = 0; i < pm.size(); ++i) {
    const std::int64_t group = pm[i].layer < 0 ? 0 : pm[i].layer / 8;
    const std::int64_t first_group = 3;  // the LM head's group appears first
    EXPECT_EQ(bm[i], group == 0 ? 0 : first_group - group + 1) << i;
  }
  mf.pp = 2;
  const auto bp = assign_buckets(m, mf, 0, params(mf, 0));
  EXPECT_EQ(count(bp), 2);  // the layers, then the embedding
}

// The emulated ranks reduce those buckets: one reduction per iteration on the second pipeline
// stage (bucketing off there), as many as assign_buckets gives on the first; with the
// distributed optimizer the same buckets are all-gathered.
TEST(Buckets, TheEmulatedRanksReduceMegatronsBuckets) {
  TrainOptions o;
  o.model = gpt(2048, 16, 1024, 4);
  o.layout.pp = 2;
  o.layout.dp = 2;
  o.layout.micro_batch_size = 1;
  o.layout.global_batch_size = 4;
  o.layout.distributed_optimizer = true;
  o.iterations = 1;
  const auto r = dry_train(o);
  auto count = [&](int rank, const char* what) {
    int n = 0;
    for (const auto& op : r.run.graph.ranks[std::size_t(rank)].ops)
      n += op.cls == OpClass::comm && op.name.find(what) != std::string::npos;
    return n;
  };
  // Stage 0 (ranks 0, 1): 2 layers of 16.8M + 16.8M + 4.2M + 12.6M elements and the embedding
  // (51200 × 2048 = 105M): buckets close at >= 40M.
  std::vector<GradParam> stage0;
  for (const std::int64_t layer : {1, 0})
    for (const std::int64_t n : {2048LL * 8192, 2048LL * 8192, 2048LL * 2048, 3 * 2048LL * 2048})
      stage0.push_back({0, layer, n});
  stage0.push_back({0, -1, 51200 * 2048});
  const auto b0 = assign_buckets(o.model, o.layout, 0, stage0);
  const int want0 = *std::max_element(b0.begin(), b0.end()) + 1;
  EXPECT_GT(want0, 1);
  EXPECT_EQ(count(0, "grad bucket"), want0);
  EXPECT_EQ(count(0, "param bucket"), want0);
  EXPECT_EQ(count(2, "grad bucket"), 1);
  EXPECT_EQ(count(2, "param bucket"), 1);
}

// R-TR-7: Megatron's GPT layer, counted tensor by tensor, gives Korthikanti et al. (2022)'s
// closed forms (Table 2: bytes per layer per micro-batch, 16-bit activations).
// Megatron's --overlap-grad-reduce: with it, a bucket's reduction starts inside the backward;
// without it (Megatron's default), every reduction starts after the last backward op.
TEST(Pipeline, GradientReductionsOverlapTheBackwardOnlyWhenAsked) {
  for (const bool overlap : {true, false}) {
    layers::train::TrainOptions o;
    o.layout.tp = 2;
    o.layout.dp = 4;
    o.layout.micro_batch_size = 2;
    o.layout.global_batch_size = 16;
    o.layout.bucket_params = 2;
    o.layout.overlap_grad_reduce = overlap;
    o.iterations = 1;
    const auto r = dry_train(o);
    const auto& ops = r.run.graph.ranks[0].ops;
    const auto& lanes = r.run.graph.ranks[0].lane_names;
    const auto& t = r.run.timeline.rank(0);
    std::int64_t first_reduction = INT64_MAX, last_backward = 0;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const std::string& lane = lanes[std::size_t(ops[i].lane)];
      if (lane == "dp comm" && ops[i].cls == OpClass::comm &&
          ops[i].name.find("grad bucket") != std::string::npos)
        first_reduction = std::min(first_reduction, t[i].start_ns);
      if (ops[i].cls == OpClass::compute && ops[i].name.find("wgrad") != std::string::npos)
        last_backward = std::max(last_backward, t[i].end_ns);
    }
    ASSERT_LT(first_reduction, INT64_MAX);
    if (overlap)
      EXPECT_LT(first_reduction, last_backward);
    else
      EXPECT_GE(first_reduction, last_backward);
  }
}

// The loss is priced as Megatron's vocab_parallel_cross_entropy runs it on a rank's [tokens,
// V/tp] logits of L elements. Unfused (its default): forward `.float()` (read 2L, write 4L bytes
// for bf16), max (4L), `-= max` (8L), exp (8L), sum (4L), softmax `div_` (8L); backward `mul_`
// (8L) and the cast to bf16 (read 4L, write 2L); in f32 the casts are no-ops. Fused
// (--cross-entropy-loss-fusion, one pass per jit-fused function): cast and max (2L + 4L),
// subtract-exp-sum (8L), div_ (8L), gradient and cast (4L + 2L); one all_reduce carries the
// target logits and the exp-sums.
TEST(Pipeline, CrossEntropyIsPricedAsMegatronsKernels) {
  for (const bool fused : {false, true})
    for (const DType dtype : {DType::bf16, DType::f32}) {
      layers::train::TrainOptions o;
      o.model.vocab = 32000;
      o.model.seq = 512;
      o.layout.tp = 2;
      o.layout.global_batch_size = 1;
      o.layout.dtype = dtype;
      o.layout.cross_entropy_fusion = fused;
      o.iterations = 1;
      const auto r = dry_train(o);
      const double elements = double(o.model.seq) *
                              double(layers::train::padded_vocab(o.model.vocab, o.layout.tp)) /
                              o.layout.tp;
      const bool cast = dtype == DType::bf16;
      const std::map<std::string, double> bytes_per_element =
          fused ? std::map<std::string, double>{{"cross-entropy max", cast ? 2 + 4 : 4},
                                                {"cross-entropy target exp-sum", 8},
                                                {"cross-entropy loss", 8},
                                                {"cross-entropy grad", cast ? 4 + 2 : 8}}
                : std::map<std::string, double>{{"cross-entropy max", cast ? 2 + 4 + 4 : 4},
                                                {"cross-entropy target", 8},
                                                {"cross-entropy exp-sum", 8 + 4},
                                                {"cross-entropy loss", 8},
                                                {"cross-entropy grad", cast ? 8 + 4 + 2 : 8}};
      const std::string what = fmt::format("{} {}", fused ? "fused" : "unfused", name_of(dtype));
      std::map<std::string, int> seen;
      int reductions = 0;
      for (const auto& op : r.run.graph.ranks[0].ops) {
        if (op.cls == OpClass::comm && op.name.find("cross-entropy") != std::string::npos)
          ++reductions;
        const auto it = bytes_per_element.find(op.name);
        if (it == bytes_per_element.end() || op.cls != OpClass::compute) continue;
        ++seen[op.name];
        const double want_ns = it->second * elements / r.run.profile->memory_bandwidth * 1e9;
        // The loss kernel also reads and writes a few f32 values per token.
        EXPECT_NEAR(op.work_ns, want_ns, want_ns * 1e-3) << op.name << ", " << what;
      }
      EXPECT_EQ(seen.size(), bytes_per_element.size()) << what;
      EXPECT_EQ(reductions, fused ? 2 : 3) << what;  // the row max, then 1 or 2 over the sums
    }
}

// --overlap-param-gather (Megatron's finish_param_sync, no interleaving): nothing goes out after
// iteration 1's update; iteration 2's forward pre-hooks dispatch the all-gathers one bucket
// ahead, so the first is exposed (the forward waits for it) and the later ones run beside the
// forward. Off, every all-gather ends with iteration 1, before iteration 2's forward.
TEST(Pipeline, ParameterGathersOverlapTheNextForwardOnlyWhenAsked) {
  std::int64_t iteration_ns[2] = {0, 0};
  for (const bool overlap : {true, false}) {
    layers::train::TrainOptions o;
    o.layout.tp = 2;
    o.layout.dp = 4;
    o.layout.micro_batch_size = 2;
    o.layout.global_batch_size = 16;
    o.layout.bucket_params = 2;
    o.layout.distributed_optimizer = true;
    o.layout.overlap_param_gather = overlap;
    o.model = gpt(2048, 16, 1024, 4);  // gathers long enough to see beside the launches
    o.iterations = 2;
    const auto r = dry_train(o);
    const auto& ops = r.run.graph.ranks[0].ops;
    const auto& lanes = r.run.graph.ranks[0].lane_names;
    const auto& t = r.run.timeline.rank(0);
    const std::uint32_t second = r.iteration_first_op[0][1];
    std::int64_t first_forward = INT64_MAX, start = INT64_MAX, end = 0, last_before = 0;
    std::vector<std::pair<std::int64_t, std::int64_t>> in_forward;  // iteration 2's, before Adam
    bool adam = false;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (i >= second && i < r.end_op[0] && ops[i].cls != OpClass::host) {
        start = std::min(start, t[i].start_ns);
        end = std::max(end, t[i].end_ns);
      }
      if (i >= second && ops[i].name == "adam") adam = true;
      const bool gather = lanes[std::size_t(ops[i].lane)] == "dp comm" &&
                          ops[i].name.find("param bucket") != std::string::npos;
      if (gather && i < second) last_before = std::max(last_before, t[i].end_ns);
      if (gather && i >= second && !adam) in_forward.push_back({t[i].start_ns, t[i].end_ns});
      if (i >= second && ops[i].cls == OpClass::compute &&
          ops[i].name.find("embedding") != std::string::npos)
        first_forward = std::min(first_forward, t[i].start_ns);
    }
    ASSERT_LT(first_forward, INT64_MAX);
    if (overlap) {
      EXPECT_EQ(last_before, 0) << "nothing goes out after the first update";
      ASSERT_GE(in_forward.size(), 3u);
      std::sort(in_forward.begin(), in_forward.end());
      EXPECT_LE(in_forward.front().second, first_forward) << "the first bucket is exposed";
      EXPECT_GT(in_forward.back().second, first_forward) << "the others run beside the forward";
    } else {
      EXPECT_TRUE(in_forward.empty());
      ASSERT_GT(last_before, 0);
      EXPECT_GE(first_forward, last_before);
    }
    iteration_ns[overlap ? 0 : 1] = end - start;
  }
  EXPECT_LE(iteration_ns[0], iteration_ns[1]);
  // Megatron's rule: only with the distributed optimizer.
  layers::train::TrainOptions bad;
  bad.layout.overlap_param_gather = true;
  testing::expect_error([&] { layers::train::train(bad, {}); }, Errc::invalid_argument,
                        {"overlap_param_gather", "distributed optimizer"});
}

// The emulated report's exposed DP over one steady-state period: with --overlap-param-gather
// the all-gathers that the forward does not wait for are hidden, so exposed DP drops with the
// iteration (the last update's trailing all-gathers, with no forward after them, are not
// counted; the ones the last iteration's forward overlapped are). With TP the forward's compute
// pauses for its TP collectives: a gather beside one is not what the step waits for either.
TEST(Pipeline, ExposedDataParallelCountsOnlyTheGathersTheForwardWaitsFor) {
  for (const int tp : {1, 2}) {
    double exposed[2] = {0, 0};
    std::int64_t iteration[2] = {0, 0};
    for (const bool overlap : {false, true}) {
      bench::TrainSetup s;
      s.dry_run = true;
      s.profile = std::make_shared<const DeviceProfile>(load_named_profile("ascend-910b"));
      auto& o = s.options;
      o.model = gpt(2048, 16, 1024, 4);
      o.layout.tp = tp;
      o.layout.dp = 4;
      o.layout.micro_batch_size = 2;
      o.layout.global_batch_size = 16;
      o.layout.bucket_params = 2;
      o.layout.distributed_optimizer = true;
      o.layout.overlap_param_gather = overlap;
      o.iterations = 3;
      WorldOptions w;
      w.profile = s.profile;
      w.numerics = false;
      const auto rep = bench::report_from_run(s, train(o, w));
      exposed[overlap] = rep.exposed_comm_ns.at("DP");
      iteration[overlap] = rep.iteration_ns;
    }
    const double saved = double(iteration[0] - iteration[1]);
    ASSERT_GT(saved, 0) << "tp " << tp;
    EXPECT_LT(exposed[1], exposed[0] - 0.5 * saved)
        << "tp " << tp << ": exposed DP " << exposed[0] << " ns without, " << exposed[1]
        << " ns with; iteration " << iteration[0] << " vs " << iteration[1];
  }
}

TEST(Memory, LayerActivationsMatchKorthikantiClosedForms) {
  const DecoderShape m = gpt(4096, 32, 2048, 32);
  const double s = 2048, b = 2, h = 4096, a = 32;
  for (int t : {1, 2, 8}) {
    TrainLayout l;
    l.tp = t;
    l.micro_batch_size = 2;
    l.dtype = DType::bf16;
    const auto style = bench::megatron_gpt_style();
    l.sequence_parallel = false;
    EXPECT_DOUBLE_EQ(sum(bench::layer_activations(m, l, style)),
                     s * b * h * (10 + 24.0 / t + 5 * a * s / (h * t)))
        << "tp " << t;
    l.sequence_parallel = true;
    if (t > 1) {
      EXPECT_DOUBLE_EQ(sum(bench::layer_activations(m, l, style)),
                       s * b * h / t * (34 + 5 * a * s / h))
          << "tp " << t << " SP";
    }
    l.recompute = Recompute::selective;
    if (t > 1) {
      EXPECT_DOUBLE_EQ(sum(bench::layer_activations(m, l, style)), 34 * s * b * h / t)
          << "tp " << t << " SP + selective";
    }
    l.sequence_parallel = false;
    EXPECT_DOUBLE_EQ(sum(bench::layer_activations(m, l, style)), s * b * h * (10 + 24.0 / t))
        << "tp " << t << " selective";
    l.recompute = Recompute::full;
    EXPECT_DOUBLE_EQ(sum(bench::layer_activations(m, l, style)), 2 * s * b * h)
        << "tp " << t << " full";
  }
}

// Korthikanti et al. (2022), section 4.2.3: the first stage of 1F1B holds pp micro-batches of
// L/pp layers (L layers' worth, whatever pp); interleaved holds L·(1 + (p − 1)/(p·v)).
TEST(Memory, FirstStageHoldsKorthikantisLayerCount) {
  for (int p : {2, 4, 8})
    for (int v : {1, 2, 4}) {
      TrainLayout l;
      l.pp = p;
      l.vpp = v;
      l.schedule = v > 1 ? PipelineSchedule::interleaved : PipelineSchedule::one_f_one_b;
      l.micro_batch_size = 1;
      l.global_batch_size = 4 * p;
      const double layers = 64, per_chunk = layers / (p * v);
      const double want = v == 1 ? layers : layers * (1 + (p - 1.0) / (p * v));
      EXPECT_DOUBLE_EQ(bench::peak_chunks_in_flight(l, 0) * per_chunk, want)
          << "pp " << p << " vpp " << v;
    }
}

// Megatron builds the distributed optimizer on the data-parallel group with context parallelism
// (intra_dp_cp_group), as the emulated ranks shard it (ParamBuffers over dp × cp): cp 4 dp 1
// shards the state four ways, like cp 1 dp 4.
TEST(Memory, DistributedOptimizerShardsOverDpTimesCp) {
  DeviceProfile prof;
  prof.memory_capacity = 1e12;
  const DecoderShape m = gpt(4096, 32, 4096, 32);
  auto optimizer = [&](int cp, int dp, bool dist) {
    TrainLayout l;
    l.tp = 2;
    l.cp = cp;
    l.dp = dp;
    l.micro_batch_size = 1;
    l.global_batch_size = dp;
    l.distributed_optimizer = dist;
    for (const auto& t : bench::estimate_memory(m, l, prof).terms)
      if (t.name.rfind("optimizer state", 0) == 0) return t;
    return bench::MemoryTerm{};
  };
  const double params = bench::stage_parameters(m, TrainLayout{.tp = 2}, 0);
  const auto cp4 = optimizer(4, 1, true), dp4 = optimizer(1, 4, true),
             none = optimizer(4, 1, false);
  EXPECT_DOUBLE_EQ(none.bytes, params * 12);
  EXPECT_DOUBLE_EQ(cp4.bytes, params * 12 / 4);
  EXPECT_DOUBLE_EQ(dp4.bytes, cp4.bytes);
  EXPECT_DOUBLE_EQ(optimizer(2, 2, true).bytes, params * 12 / 4);
  EXPECT_NE(cp4.name.find("dp × cp"), std::string::npos) << cp4.name;
}

// Only the last stage's last chunk computes the loss: its logits are held for that chunk's
// micro-batches in flight, counted from the schedule's action list. Interleaved, every forward
// of that chunk is followed by its backward (one in flight) unless every action is warm-up
// (micro-batches = pp); 1F1B's last stage holds one, GPipe every micro-batch.
TEST(Memory, LossLogitsCountTheLastChunksMicroBatches) {
  struct C {
    PipelineSchedule s;
    int pp, vpp, m, want;
  };
  for (const C& c :
       {C{PipelineSchedule::interleaved, 4, 4, 8, 1}, C{PipelineSchedule::interleaved, 4, 2, 16, 1},
        C{PipelineSchedule::interleaved, 8, 3, 16, 1}, C{PipelineSchedule::interleaved, 4, 2, 4, 4},
        C{PipelineSchedule::one_f_one_b, 4, 1, 8, 1}, C{PipelineSchedule::gpipe, 4, 1, 8, 8}}) {
    TrainLayout l;
    l.pp = c.pp;
    l.vpp = c.vpp;
    l.schedule = c.s;
    l.micro_batch_size = 1;
    l.global_batch_size = c.m;
    const std::string what = fmt::format("{} pp{} vpp{} m{}", to_string(c.s), c.pp, c.vpp, c.m);
    EXPECT_EQ(bench::peak_loss_in_flight(l), c.want) << what;
    // The estimate's logits term: that many micro-batches of [tokens, V/tp] logits, 2 + 4 bytes
    // (a vocabulary large enough that the last stage is the fullest, whose terms are named).
    DeviceProfile prof;
    DecoderShape m = gpt(1024, 16, 2048, c.pp * c.vpp);
    m.vocab = 1 << 21;
    const auto est = bench::estimate_memory(m, l, prof);
    ASSERT_EQ(est.stage, c.pp - 1) << what;
    double logits = -1;
    for (const auto& t : est.terms)
      if (t.name.rfind("logits", 0) == 0) logits = t.bytes;
    EXPECT_DOUBLE_EQ(logits, c.want * 2048.0 * double(m.vocab) * 6) << what;
  }
  // The LLaMA-3-8B layout of the review (pp4 vpp4, 64 micro-batches, cp 2): one micro-batch of
  // 3.15 GB of logits on the last stage, not 13; stage 0 is the fullest.
  DecoderShape llama3;
  llama3.hidden = 4096;
  llama3.heads = 32;
  llama3.kv_heads = 8;
  llama3.ffn = 14336;
  llama3.num_layers = 32;
  llama3.vocab = 128256;
  llama3.seq = 8192;
  TrainLayout l;
  l.cp = 2;
  l.pp = 4;
  l.vpp = 4;
  l.schedule = PipelineSchedule::interleaved;
  l.micro_batch_size = 1;
  l.global_batch_size = 64;
  DeviceProfile prof;
  prof.memory_capacity = 64e9;
  const auto est = bench::estimate_memory(llama3, l, prof);
  EXPECT_FALSE(est.oom) << est.verdict;
  EXPECT_EQ(est.stage, 0) << est.verdict;
}

// An out-of-memory verdict names the numbers and the largest terms.
TEST(Memory, OutOfMemoryVerdictNamesTheLargestTerms) {
  DeviceProfile prof;
  prof.memory_capacity = 8e9;
  TrainLayout l;
  l.tp = 1;
  l.micro_batch_size = 1;
  l.global_batch_size = 1;
  const auto est = bench::estimate_memory(gpt(4096, 32, 2048, 32), l, prof);
  EXPECT_TRUE(est.oom);
  EXPECT_NE(est.verdict.find("out of memory on stage 0"), std::string::npos) << est.verdict;
  EXPECT_NE(est.verdict.find("optimizer state"), std::string::npos) << est.verdict;
  EXPECT_NE(est.verdict.find("8.0 GB"), std::string::npos) << est.verdict;
  TrainLayout sharded = l;
  sharded.dp = 8;
  sharded.global_batch_size = 8;
  sharded.distributed_optimizer = true;
  const auto s = bench::estimate_memory(gpt(4096, 32, 2048, 32), sharded, prof);
  EXPECT_LT(s.peak_bytes, est.peak_bytes);
}

}  // namespace
}  // namespace cocemu::layers::train
