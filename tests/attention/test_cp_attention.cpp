// Context-parallel attention (R-AT-2…4): every algorithm × mask × layout × head configuration ×
// cp degree × (Ulysses degree, window) factorisation equals a single-rank dense f64 reference;
// gradients pass finite differences; overlap and schedule seeds do not change a bit; MindSpeed's
// validation rules give clear errors; transfers match closed-form volumes; the modeled ring
// schedules are MindSpeed's, with golden times.
#include <gtest/gtest.h>

#include "attention_testing.h"

namespace cocemu::attn {
namespace {

using testing::Full;
using testing::random_inputs;
using testing::rel_error;
using testing::run_cp;

std::shared_ptr<GeneralMask> test_mask(std::int64_t S) {
  auto m = std::make_shared<GeneralMask>();
  m->seq = S;
  m->visible.assign(std::size_t(S * S), 0);
  std::mt19937 rng(5);
  for (std::int64_t i = 0; i < S; ++i)
    for (std::int64_t j = 0; j < S; ++j) {
      bool v = rng() % 10 < 5;
      if (i < S / 4 && j >= S / 2) v = false;                // an empty block
      if (i >= S / 2 && j < S / 4) v = true;                 // a full block
      if (i >= S / 4 && i < S / 2 && j % 3 == 0) v = false;  // stripes
      if (i == 1) v = false;                                 // a row that sees nothing
      m->visible[std::size_t(i * S + j)] = v;
    }
  return m;
}

struct Reference {
  Tensor out, lse, dq, dk, dv;
};

Reference reference(const AttentionProblem& p, const Full& in, bool causal) {
  std::vector<std::int64_t> pos(std::size_t(p.seq));
  for (std::int64_t i = 0; i < p.seq; ++i)
    pos[std::size_t(i)] = i;
  AttentionArgs a;
  a.shape = {p.batch, p.heads, p.kv_heads, p.seq, p.seq, p.head_dim};
  a.layout = Layout::sbh;
  a.mask.kind = causal ? MaskKind::causal : MaskKind::general;
  a.mask.general = p.general_mask;
  a.q_pos = a.k_pos = &pos;
  Reference r{Tensor::zeros(in.q.shape(), p.dtype),
              Tensor::zeros({p.batch, p.heads, p.seq}, p.dtype),
              Tensor::zeros(in.q.shape(), p.dtype), Tensor::zeros(in.k.shape(), p.dtype),
              Tensor::zeros(in.v.shape(), p.dtype)};
  reference_attention(a, in.q, in.k, in.v, r.out, r.lse);
  reference_attention_backward(a, in.q, in.k, in.v, in.dout, r.dq, r.dk, r.dv);
  return r;
}

struct Algo {
  std::string name;
  int cp, u, w;
};

std::vector<Algo> all_factorisations() {
  std::vector<Algo> v;
  for (int cp : {1, 2, 4, 8}) {
    v.push_back({"ulysses_cp_algo", cp, cp, 1});
    for (int w = 1; w < std::max(cp, 2); ++w)
      if (w == 1 || (cp % w == 0 && w < cp)) v.push_back({"megatron_cp_algo", cp, 1, w});
    for (int u = 1; u < cp; ++u)
      if (cp % u == 0 && cp / u > 1)
        for (int w = 1; w < std::max(cp / u, 2); ++w)
          if (w == 1 || ((cp / u) % w == 0 && w < cp / u))
            v.push_back({"hybrid_cp_algo", cp, u, w});
  }
  return v;
}

CpConfig config_of(const Algo& a, bool causal, bool bnsd, bool overlap = false) {
  CpConfig c;
  c.context_parallel_size = a.cp;
  c.context_parallel_algo = a.name;
  c.cp_window_size = a.w;
  c.ulysses_degree_in_cp = a.name == "hybrid_cp_algo" ? a.u : 0;
  c.attention_mask_type = causal ? "causal" : "general";
  c.megatron_cp_in_bnsd = bnsd;
  c.use_cp_send_recv_overlap = overlap;
  return c;
}

std::string label(const Algo& a, bool causal, bool bnsd, std::int64_t kvh) {
  return fmt::format("{} cp={} u={} w={} {} {} kv_heads={}", a.name, a.cp, a.u, a.w,
                     causal ? "causal" : "general", bnsd ? "bnsd" : "sbh", kvh);
}

TEST(CpAttention, EveryAlgorithmMatchesTheDenseReference) {
  const std::int64_t S = 32, B = 2, H = 8, D = 8;
  int runs = 0;
  for (bool causal : {true, false})
    for (std::int64_t G : {H, H / 2, std::int64_t(1)}) {
      AttentionProblem p{B, H, G, S, D, DType::f64, causal ? nullptr : test_mask(S), 0};
      const Full in = random_inputs(p, 100 + std::uint64_t(G));
      const Reference ref = reference(p, in, causal);
      for (const Algo& a : all_factorisations())
        for (bool bnsd : {true, false}) {
          const auto r = run_cp(config_of(a, causal, bnsd), p, in);
          const std::string what = label(a, causal, bnsd, G);
          EXPECT_LE(rel_error(r.out, ref.out), 1e-12) << what;
          EXPECT_LE(rel_error(r.lse, ref.lse), 1e-12) << what;
          EXPECT_LE(rel_error(r.dq, ref.dq), 1e-12) << what;
          EXPECT_LE(rel_error(r.dk, ref.dk), 1e-12) << what;
          EXPECT_LE(rel_error(r.dv, ref.dv), 1e-12) << what;
          ++runs;
        }
    }
  EXPECT_EQ(runs, 2 * 3 * 2 * int(all_factorisations().size()));
}

TEST(CpAttention, F32WithinItsStatedBound) {
  // f32: within 5e-5 of the f64 reference (relative to the largest magnitude of each tensor).
  const std::int64_t S = 64, B = 1, H = 4, D = 16;
  AttentionProblem p64{B, H, 2, S, D, DType::f64, nullptr, 0};
  const Full in = random_inputs(p64, 7);
  const Reference ref = reference(p64, in, true);
  AttentionProblem p32 = p64;
  p32.dtype = DType::f32;
  const Full in32{in.q.to(DType::f32), in.k.to(DType::f32), in.v.to(DType::f32),
                  in.dout.to(DType::f32)};
  for (const Algo& a : {Algo{"megatron_cp_algo", 4, 1, 2}, Algo{"hybrid_cp_algo", 4, 2, 1},
                        Algo{"ulysses_cp_algo", 4, 4, 1}}) {
    const auto r = run_cp(config_of(a, true, true), p32, in32);
    EXPECT_LE(rel_error(r.out.to(DType::f64), ref.out), 5e-5) << a.name;
    EXPECT_LE(rel_error(r.dq.to(DType::f64), ref.dq), 5e-5) << a.name;
    EXPECT_LE(rel_error(r.dk.to(DType::f64), ref.dk), 5e-5) << a.name;
    EXPECT_LE(rel_error(r.dv.to(DType::f64), ref.dv), 5e-5) << a.name;
  }
}

TEST(CpAttention, OddRingSizesWork) {
  for (int cp : {3, 5, 7})
    for (bool causal : {true, false}) {
      const std::int64_t S = 2 * cp * 3;
      AttentionProblem p{1, 2, 1, S, 8, DType::f64, causal ? nullptr : test_mask(S), 0};
      const Full in = random_inputs(p, 3);
      const Reference ref = reference(p, in, causal);
      // Odd rings need the overlap option off (MindSpeed's parity pairing; see below).
      const auto r = run_cp(config_of({"megatron_cp_algo", cp, 1, 1}, causal, true, false), p, in);
      EXPECT_LE(rel_error(r.out, ref.out), 1e-12) << cp;
      EXPECT_LE(rel_error(r.dq, ref.dq), 1e-12) << cp;
      EXPECT_LE(rel_error(r.dk, ref.dk), 1e-12) << cp;
    }
}

TEST(CpAttention, AdversarialInputs) {
  // Logits around ±1e4 and a general mask with an empty row, empty, full and striped blocks.
  const std::int64_t S = 32;
  AttentionProblem p{1, 4, 2, S, 8, DType::f64, test_mask(S), 0};
  const Full in = random_inputs(p, 9, 60.0);
  const Reference ref = reference(p, in, false);
  const auto r = run_cp(config_of({"hybrid_cp_algo", 4, 2, 1}, false, true), p, in);
  for (const Tensor* t : {&r.out, &r.dq, &r.dk, &r.dv})
    for (std::int64_t i = 0; i < t->numel(); ++i)
      ASSERT_FALSE(std::isnan(t->item(i)));
  EXPECT_LE(rel_error(r.out, ref.out), 1e-12);
  EXPECT_LE(rel_error(r.dk, ref.dk), 1e-11);
  for (std::int64_t d = 0; d < 4 * 8; ++d)
    EXPECT_EQ(r.out.item(1 * 4 * 8 + d), 0.0);  // row 1
  EXPECT_TRUE(std::isinf(r.lse.item(1)));
}

TEST(CpAttention, FiniteDifferenceGradients) {
  const std::int64_t S = 16;
  for (const Algo& a : {Algo{"ulysses_cp_algo", 2, 2, 1}, Algo{"megatron_cp_algo", 2, 1, 1},
                        Algo{"megatron_cp_algo", 4, 1, 2}, Algo{"hybrid_cp_algo", 4, 2, 1}}) {
    AttentionProblem p{1, 4, 2, S, 4, DType::f64, nullptr, 0};
    Full in = random_inputs(p, 21);
    const CpConfig c = config_of(a, true, true);
    const auto r = run_cp(c, p, in);
    // Loss L = Σ out ∘ dout; dL/dx by central differences at a few elements of q, k and v.
    auto loss = [&](const Full& x) {
      const auto o = run_cp(c, p, x, {}, false);
      double l = 0;
      for (std::int64_t i = 0; i < o.out.numel(); ++i)
        l += o.out.item(i) * x.dout.item(i);
      return l;
    };
    const double h = 1e-5;
    for (int which = 0; which < 3; ++which)
      for (std::int64_t idx : {std::int64_t(3), std::int64_t(37), std::int64_t(101)}) {
        Full plus = {in.q.clone(), in.k.clone(), in.v.clone(), in.dout};
        Full minus = {in.q.clone(), in.k.clone(), in.v.clone(), in.dout};
        Tensor& tp = which == 0 ? plus.q : which == 1 ? plus.k : plus.v;
        Tensor& tm = which == 0 ? minus.q : which == 1 ? minus.k : minus.v;
        tp.data<double>()[idx] += h;
        tm.data<double>()[idx] -= h;
        const double fd = (loss(plus) - loss(minus)) / (2 * h);
        const Tensor& g = which == 0 ? r.dq : which == 1 ? r.dk : r.dv;
        EXPECT_NEAR(g.item(idx), fd, 1e-7 * std::max(1.0, std::fabs(fd)))
            << a.name << " tensor " << which << " idx " << idx;
      }
  }
}

TEST(CpAttention, OverlapAndSchedulesDoNotChangeABit) {
  const std::int64_t S = 64;
  for (const Algo& a : {Algo{"megatron_cp_algo", 4, 1, 1}, Algo{"megatron_cp_algo", 8, 1, 2},
                        Algo{"hybrid_cp_algo", 8, 2, 2}}) {
    AttentionProblem p{1, 4, 2, S, 8, DType::f64, nullptr, 0};
    const Full in = random_inputs(p, 31);
    const auto off = run_cp(config_of(a, true, true, false), p, in);
    for (std::uint64_t seed = 0; seed <= (a.cp == 4 ? 20u : 3u); ++seed) {
      WorldOptions o;
      o.schedule_seed = seed;
      const auto on = run_cp(config_of(a, true, true, true), p, in, o);
      for (auto [x, y] : {std::pair{&on.out, &off.out},
                          {&on.lse, &off.lse},
                          {&on.dq, &off.dq},
                          {&on.dk, &off.dk},
                          {&on.dv, &off.dv}})
        EXPECT_TRUE(x->bitwise_equal(*y)) << a.name << " cp " << a.cp << " seed " << seed;
    }
  }
}

TEST(CpAttention, MindSpeedValidationRules) {
  using cocemu::testing::expect_error;
  AttentionProblem p{1, 8, 8, 64, 8, DType::f64, nullptr, 0};
  auto check = [&](CpConfig c, AttentionProblem pp, std::vector<std::string> frags) {
    expect_error([&] { validate(c, pp); }, Errc::invalid_argument, frags);
  };
  CpConfig c;
  c.context_parallel_size = 4;
  c.context_parallel_algo = "ring_cp_algo";
  check(c, p, {"'ring_cp_algo'", "ulysses_cp_algo, megatron_cp_algo, hybrid_cp_algo"});
  c.context_parallel_algo = "ulysses_cp_algo";
  AttentionProblem h6 = p;
  h6.heads = 6;
  h6.kv_heads = 6;
  check(c, h6, {"num_attention_heads 6", "4"});
  c.tensor_model_parallel_size = 4;
  check(c, p, {"num_attention_heads 8", "4 × 4"});
  c.tensor_model_parallel_size = 1;
  AttentionProblem s30 = p;
  s30.seq = 30;
  check(c, s30, {"sequence length 30", "context_parallel_size 4"});
  c.context_parallel_algo = "megatron_cp_algo";
  AttentionProblem s36 = p;
  s36.seq = 36;
  check(c, s36, {"sequence length 36", "2 × context_parallel_size = 8"});
  c.cp_window_size = 3;
  check(c, p, {"cp_window_size = 3", "divide"});
  c.cp_window_size = 4;
  check(c, p, {"cp_window_size = 4", "< context_parallel_size 4"});
  c.cp_window_size = 1;
  c.context_parallel_algo = "hybrid_cp_algo";
  check(c, p, {"ulysses_degree_in_cp >= 1"});
  c.ulysses_degree_in_cp = 4;
  check(c, p, {"ulysses_degree_in_cp = 4", "ring degree > 1"});
  c.ulysses_degree_in_cp = 3;
  check(c, p, {"ulysses_degree_in_cp = 3", "divide"});
  c.ulysses_degree_in_cp = 2;
  AttentionProblem h3 = p;
  h3.heads = 3;
  h3.kv_heads = 1;
  check(c, h3, {"num_attention_heads 3", "2 × 1"});
  c.cp_window_size = 2;
  check(c, p, {"cp_window_size = 2", "ring degree 2"});
  c.cp_window_size = 1;
  c.attention_mask_type = "sliding";
  check(c, p, {"'sliding'", "causal, general"});
  c.attention_mask_type = "general";
  check(c, p, {"general needs a [seq, seq] mask"});
  c.attention_mask_type = "causal";
  AttentionProblem g3 = p;
  g3.kv_heads = 3;
  check(c, g3, {"num_query_groups", "3"});
  c.context_parallel_algo = "ulysses_cp_algo";
  c.cp_window_size = 2;
  check(c, p, {"cp_window_size = 2", "megatron_cp_algo and hybrid_cp_algo only"});
  // The cp group must match context_parallel_size.
  expect_error(
      [&] {
        cocemu::testing::run_ranks(2, [&](Rank& rank) {
          Group world = Group::world(rank);
          CpConfig cc;
          cc.context_parallel_size = 4;
          CpAttention a(world, cc, p);
        });
      },
      Errc::invalid_argument, {"context_parallel_size = 4", "has 2 ranks"});
}

std::uint64_t total(const std::vector<TransferRecord>& t, const std::string& phase_prefix,
                    int* messages) {
  std::uint64_t b = 0;
  for (const auto& r : t)
    if (r.phase.rfind(phase_prefix, 0) == 0) {
      b += r.bytes;
      *messages += r.messages;
    }
  return b;
}

TEST(CpAttention, TransfersMatchClosedFormVolumes) {
  const std::int64_t S = 64, B = 2, H = 8, D = 8, e = 8;
  for (std::int64_t G : {H, std::int64_t(2)})
    for (const Algo& a : {Algo{"megatron_cp_algo", 4, 1, 1}, Algo{"megatron_cp_algo", 8, 1, 2},
                          Algo{"ulysses_cp_algo", 4, 4, 1}, Algo{"hybrid_cp_algo", 8, 2, 2}}) {
      AttentionProblem p{B, H, G, S, D, DType::f64, nullptr, 0};
      const Full in = random_inputs(p, 1);
      const auto r = run_cp(config_of(a, true, true, true), p, in);
      const std::int64_t Sl = S / a.cp, R = a.cp / a.u, w = a.w, nw = R / w;
      const bool repeated = a.u > 1 && G % a.u != 0;
      const std::int64_t kvh_local = repeated ? H / a.u : G / a.u;
      // A KV message carries K and V of one ring member's tokens (u·S_l of them) and local heads.
      const std::uint64_t kv_msg = std::uint64_t(2 * a.u * Sl * B * kvh_local * D * e);
      for (int rank = 0; rank < a.cp; ++rank) {
        const auto& f = r.fwd_transfers[std::size_t(rank)];
        const auto& b = r.bwd_transfers[std::size_t(rank)];
        int m = 0;
        // Forward ring: w-1 inner transfers per window, nw-1 outer ones (a plain ring: R-1).
        EXPECT_EQ(total(f, "kv", &m), std::uint64_t(nw * (w - 1) + (nw - 1)) * kv_msg) << a.name;
        EXPECT_EQ(m, nw * (w - 1) + (nw - 1));
        m = 0;
        // Backward: the same KV transfers, plus dK/dV after every one of the R steps.
        EXPECT_EQ(total(b, "kv", &m), std::uint64_t(nw * (w - 1) + (nw - 1)) * kv_msg);
        m = 0;
        EXPECT_EQ(total(b, "dkv", &m), R > 1 ? std::uint64_t(R) * kv_msg : 0u);
        EXPECT_EQ(m, R > 1 ? R : 0);
        if (a.u > 1) {
          // Ulysses: each all_to_all sends (u-1)/u of a local tensor.
          const std::int64_t kvh = repeated ? H : G;
          m = 0;
          const std::uint64_t fwd_a2a = total(f, "a2a", &m);
          // q, k, v and out: (u−1)/u · b·s·d·e·(2H + 2G) (reference/cp-semantics.md §1.4). The
          // LSE goes back to the caller's layout too, but that is emulator-only and not counted:
          // MindSpeed keeps it inside its flash-attention kernels.
          const std::int64_t elems = Sl * B * D * (H + 2 * kvh + H);
          EXPECT_EQ(fwd_a2a, std::uint64_t(elems * (a.u - 1) / a.u * e)) << a.name << " G " << G;
          EXPECT_EQ(m, 4 * (a.u - 1));
          m = 0;
          const std::uint64_t bwd_a2a = total(b, "a2a", &m);
          EXPECT_EQ(bwd_a2a, std::uint64_t(Sl * B * D * (H + H + 2 * kvh) * (a.u - 1) / a.u * e));
          EXPECT_EQ(m, 4 * (a.u - 1));
        }
      }
    }
}

// Modeled ring schedules as MindSpeed's AttentionWithCp runs them (ring_context_parallel.py), on
// the round-number profile (1 TFLOP/s, links 1 B/ns full duplex, no latency), dry run, bf16,
// causal (zigzag), cp = 4, one head, head_dim 128, c = S/8 tokens per chunk, 2c per rank:
//   KV (and dK|dV) message  T  = 2·2c·128·2 B            = 4c·256 ns
//   forward block, half      F  = 4·2c²·128 flop / 1e3
//   forward block, diagonal  F0 = 4·(2c² + c)·128 / 1e3
//   backward blocks          B, B0 = 10/4 of F, F0
// Each transfer is posted before the block it hides behind. Without use_cp_send_recv_overlap a
// rank's send and receive share one communicator and go one after the other, in parity order
// (even ranks send first): an exchange takes 2T; with it, T.
struct RingTimes {
  std::vector<ScheduledOp> blocks, sends, recvs;
};

RingTimes ring_times(std::int64_t c, bool overlap, bool backward) {
  WorldOptions o;
  o.numerics = false;
  o.profile = cocemu::testing::round_profile();
  const AttentionProblem p{1, 1, 1, 8 * c, 128, DType::bf16, nullptr, 0};
  const CpConfig cfg = config_of({"megatron_cp_algo", 4, 1, 1}, true, true, overlap);
  const RunResult run = cocemu::testing::run_ranks(
      4,
      [&](Rank& rank) {
        Group world = Group::world(rank);
        CpAttention attn(world, cfg, p);
        const Tensor q = Tensor::shape_only({2 * c, 1, 128}, DType::bf16);
        attn.forward(q, q, q);
        if (backward) attn.backward(q);
      },
      o);
  RingTimes t;
  for (const auto& op : run.graph.ranks[0].ops) {
    if (op.lane == 0) continue;
    const ScheduledOp when = run.timeline.at({0, op.index});
    if (op.name.rfind(backward ? "attn bwd[" : "attn fwd[", 0) == 0) t.blocks.push_back(when);
    if (backward && op.name.rfind("attn fwd[", 0) == 0) {  // the backward's transfers only
      t.sends.clear();
      t.recvs.clear();
    }
    if (op.name.rfind("send ", 0) == 0) t.sends.push_back(when);
    if (op.name.rfind("recv ", 0) == 0) t.recvs.push_back(when);
  }
  return t;
}

TEST(CpAttention, RingForwardPostsEachTransferBeforeItsBlock) {
  // c = 250: T = 256000 ns, F = 64000, F0 = 64128: the transfers are longer than the blocks.
  const double T = 256000, F = 64000;
  for (bool overlap : {true, false}) {
    const RingTimes t = ring_times(250, overlap, false);
    ASSERT_EQ(t.blocks.size(), 4u);
    ASSERT_EQ(t.sends.size(), 3u);
    const double x = overlap ? T : 2 * T;  // one exchange
    const double t0 = double(t.blocks[0].start_ns);
    // Rank 0 (even) sends first: its send of step 1's block starts with step 0's block.
    EXPECT_NEAR(double(t.sends[0].start_ns), t0, 2) << overlap;
    for (int k = 1; k < 4; ++k)
      EXPECT_NEAR(double(t.blocks[std::size_t(k)].start_ns) - t0, k * x, 4) << overlap << k;
    EXPECT_NEAR(double(t.blocks[3].end_ns) - t0, 3 * x + F, 4) << overlap;
  }
}

TEST(CpAttention, RingBackwardHidesEachDkvTransferBehindTheNextBlock) {
  // c = 2000: T = 2048000 ns, B = 10240000, B0 = 10242560: a block hides a KV and a dK|dV
  // exchange even when sends and receives serialise (4T < B). From step 1 on, the received
  // accumulator is added to the block's contribution (A = 3·T bytes at 1e15 B/s = 6.144 ns)
  // before it moves on. The blocks run back to back (B0 + 3B + 2A); only the last dK|dV
  // transfer, to the block's owner, is exposed: T, or 2T without the overlap option. (Before,
  // each dK|dV transfer was waited for right after its block: B0 + 3B + 4T.)
  const double T = 2048000, B = 10240000, B0 = 10242560, A = 6.144;
  for (bool overlap : {true, false}) {
    const RingTimes t = ring_times(2000, overlap, true);
    ASSERT_EQ(t.blocks.size(), 4u);
    const double t0 = double(t.blocks[0].start_ns);
    EXPECT_NEAR(double(t.blocks[1].start_ns) - t0, B0, 2) << overlap;
    EXPECT_NEAR(double(t.blocks[3].end_ns) - t0, B0 + 3 * B + 2 * A, 2) << overlap;
    ASSERT_FALSE(t.recvs.empty());
    EXPECT_NEAR(double(t.recvs.back().end_ns) - t0, B0 + 3 * B + 3 * A + (overlap ? T : 2 * T), 2)
        << overlap;
  }
}

TEST(CpAttention, CausalRingBlocksArePricedOnTheirVisiblePart) {
  // MindSpeed's causal ring (ring_context_parallel.py) launches a block from an earlier rank on
  // the first half of its keys and one from a later rank on the second half of the queries. On
  // the 910B profile (row overhead 250 keys) a block is therefore priced as the kernel on that
  // shape. cp = 4, c = 512 tokens per chunk: rank 0 holds chunks 0 and 7, so each later rank's
  // block is c query rows × 2c keys; rank 3 holds chunks 3 and 4, so each earlier rank's block
  // is 2c rows × c keys. Before, both were priced as 2c rows with c keys per row on average.
  const std::int64_t c = 512, H = 2, D = 128;
  WorldOptions o;
  o.numerics = false;
  const AttentionProblem p{1, H, H, 8 * c, D, DType::bf16, nullptr, 0};
  const CpConfig cfg = config_of({"megatron_cp_algo", 4, 1, 1}, true, true);
  const RunResult run = cocemu::testing::run_ranks(
      4,
      [&](Rank& rank) {
        Group world = Group::world(rank);
        CpAttention attn(world, cfg, p);
        const Tensor x = Tensor::shape_only({2 * c, 1, H * D}, DType::bf16);
        attn.forward(x, x, x);
        attn.backward(x);
      },
      o);
  const DeviceProfile& prof = *run.profile;
  for (const int r : {0, 3})
    for (const bool backward : {false, true}) {
      std::vector<double> blocks;
      for (const auto& op : run.graph.ranks[std::size_t(r)].ops)
        if (op.name.rfind(backward ? "attn bwd[" : "attn fwd[", 0) == 0)
          blocks.push_back(op.work_ns);
      ASSERT_EQ(blocks.size(), 4u) << r << backward;
      const std::int64_t rows = r == 0 ? c : 2 * c, keys = r == 0 ? 2 * c : c;
      const double expected = attention_ns(prof, H, rows, keys, D, DType::bf16, 1.0, backward);
      for (std::size_t step = 1; step < 4; ++step)
        EXPECT_DOUBLE_EQ(blocks[step], expected) << "rank " << r << " step " << step << backward;
    }
}

TEST(CpAttention, SendRecvOverlapNeedsAnEvenRing) {
  AttentionProblem p{1, 2, 1, 36, 8, DType::f64, nullptr, 0};
  cocemu::testing::expect_error(
      [&] {
        validate(config_of({"megatron_cp_algo", 3, 1, 1}, true, true, true), p);
      },
      Errc::invalid_argument, {"use_cp_send_recv_overlap", "ring of 3 ranks", "even"});
  AttentionProblem p2{1, 2, 1, 48, 8, DType::f64, nullptr, 0};
  cocemu::testing::expect_error(
      [&] {
        validate(config_of({"megatron_cp_algo", 6, 1, 2}, true, true, true), p2);
      },
      Errc::invalid_argument, {"outer ring (across windows) of 3 ranks"});
  validate(config_of({"megatron_cp_algo", 3, 1, 1}, true, true, false), p);  // no overlap: fine
}

}  // namespace
}  // namespace cocemu::attn

namespace cocemu::attn {
namespace {

// An attention layer called every step reuses its communicators and their streams.
TEST(CpAttention, CommunicatorsAreMadeOncePerConfiguration) {
  WorldOptions o;
  o.numerics = false;
  CpConfig cfg = config_of({"megatron_cp_algo", 4, 1, 2}, true, true, true);
  const AttentionProblem p{1, 2, 2, 64, 16, DType::bf16, nullptr, 0};
  cocemu::testing::run_ranks(
      4,
      [&](Rank& rank) {
        Group world = Group::world(rank);
        std::size_t lanes = 0;
        for (int call = 0; call < 3; ++call) {
          CpAttention a(world, cfg, p);
          const Tensor q = Tensor::shape_only({16, 1, 32}, DType::bf16);
          a.forward(q, q, q);
          if (call == 0) lanes = rank.graph().lane_names.size();
          EXPECT_EQ(rank.graph().lane_names.size(), lanes) << "call " << call;
        }
        EXPECT_EQ(lanes, 6u);  // host, compute, comm, and three communicators' streams
      },
      o);
}

}  // namespace
}  // namespace cocemu::attn
