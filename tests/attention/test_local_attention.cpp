// Local blockwise attention (R-AT-1): equal to a dense f64 reference for every mask, layout and
// head configuration; adversarial inputs stay finite; merging partial results by LSE is exact.
#include <gtest/gtest.h>

#include "attention_testing.h"

namespace cocemu::attn {
namespace {

using testing::random_sbh;
using testing::rel_error;

std::shared_ptr<GeneralMask> striped_mask(std::int64_t S) {
  auto m = std::make_shared<GeneralMask>();
  m->seq = S;
  m->visible.assign(std::size_t(S * S), 0);
  std::mt19937 rng(11);
  for (std::int64_t i = 0; i < S; ++i)
    for (std::int64_t j = 0; j < S; ++j) {
      bool v = rng() % 10 < 6;                             // random
      if (i >= S / 4 && i < S / 2 && j < S / 4) v = true;  // a full block
      if (i >= S / 2 && j % 4 == 0) v = false;             // stripes
      if (i == 3) v = false;                               // a row that sees nothing
      m->visible[std::size_t(i * S + j)] = v;
    }
  return m;
}

struct Case {
  MaskKind mask;
  Layout layout;
  std::int64_t kv_heads;
};

TEST(LocalAttention, MatchesDenseReferenceForwardAndBackward) {
  const std::int64_t S = 300, B = 2, H = 4, D = 16;  // 300 rows: two tiles, one ragged
  std::vector<std::int64_t> pos(S);
  for (std::int64_t i = 0; i < S; ++i)
    pos[std::size_t(i)] = i;
  for (MaskKind mk : {MaskKind::none, MaskKind::causal, MaskKind::general})
    for (Layout layout : {Layout::bnsd, Layout::sbh})
      for (std::int64_t G : {H, H / 2, std::int64_t(1)}) {
        AttentionArgs a;
        a.shape = {B, H, G, S, S, D};
        a.layout = layout;
        a.mask.kind = mk;
        if (mk == MaskKind::general) a.mask.general = striped_mask(S);
        a.q_pos = a.k_pos = &pos;
        auto conv = [&](const Tensor& t, std::int64_t heads) {
          return convert_layout(t, Layout::sbh, layout, heads, D);
        };
        Tensor q = conv(random_sbh(S, B, H, D, DType::f64, 1), H);
        Tensor k = conv(random_sbh(S, B, G, D, DType::f64, 2), G);
        Tensor v = conv(random_sbh(S, B, G, D, DType::f64, 3), G);
        Tensor dout = conv(random_sbh(S, B, H, D, DType::f64, 4), H);
        Tensor o = Tensor::zeros(q.shape(), DType::f64), l = Tensor::zeros({B, H, S}, DType::f64);
        Tensor ro = Tensor::zeros(q.shape(), DType::f64), rl = Tensor::zeros({B, H, S}, DType::f64);
        attention_forward(a, q, k, v, o, l);
        reference_attention(a, q, k, v, ro, rl);
        const std::string what =
            fmt::format("mask {} layout {} kv heads {}", int(mk), int(layout), G);
        EXPECT_LE(rel_error(o, ro), 1e-12) << what;
        EXPECT_LE(rel_error(l, rl), 1e-12) << what;
        Tensor dq = Tensor::zeros(q.shape(), DType::f64), dk = Tensor::zeros(k.shape(), DType::f64),
               dv = Tensor::zeros(v.shape(), DType::f64);
        Tensor rq = dq.clone(), rk = dk.clone(), rv = dv.clone();
        attention_backward(a, q, k, v, dout, l, attention_delta(a, o, dout), dq, dk, dv);
        reference_attention_backward(a, q, k, v, dout, rq, rk, rv);
        EXPECT_LE(rel_error(dq, rq), 1e-12) << what;
        EXPECT_LE(rel_error(dk, rk), 1e-12) << what;
        EXPECT_LE(rel_error(dv, rv), 1e-12) << what;
        if (mk == MaskKind::general) {  // row 3 sees nothing: output 0, LSE -inf, no NaN
          for (std::int64_t d = 0; d < D; ++d) {
            const std::int64_t idx = layout == Layout::bnsd ? 3 * D + d : 3 * B * H * D + d;
            EXPECT_EQ(o.item(idx), 0.0);
          }
          EXPECT_TRUE(std::isinf(l.item(3)) && l.item(3) < 0);
        }
      }
}

TEST(LocalAttention, F32StaysWithinItsStatedBound) {
  // f32 bound: 2e-5 relative to the largest magnitude (fast exp ~2 ulp, f32 GEMM accumulation
  // over 256-wide tiles and 300 keys).
  const std::int64_t S = 300, B = 1, H = 2, D = 32;
  std::vector<std::int64_t> pos(S);
  for (std::int64_t i = 0; i < S; ++i)
    pos[std::size_t(i)] = i;
  AttentionArgs a;
  a.shape = {B, H, H, S, S, D};
  a.mask.kind = MaskKind::causal;
  a.q_pos = a.k_pos = &pos;
  a.layout = Layout::sbh;
  Tensor q = random_sbh(S, B, H, D, DType::f64, 5), k = random_sbh(S, B, H, D, DType::f64, 6),
         v = random_sbh(S, B, H, D, DType::f64, 7);
  Tensor ro = Tensor::zeros(q.shape(), DType::f64), rl = Tensor::zeros({B, H, S}, DType::f64);
  reference_attention(a, q, k, v, ro, rl);
  Tensor o = Tensor::zeros(q.shape(), DType::f32), l = Tensor::zeros({B, H, S}, DType::f32);
  attention_forward(a, q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), o, l);
  EXPECT_LE(rel_error(o.to(DType::f64), ro), 2e-5);
  EXPECT_LE(rel_error(l.to(DType::f64), rl), 2e-5);
}

TEST(LocalAttention, HugeLogitsStayFinite) {
  const std::int64_t S = 64, B = 1, H = 2, D = 8;
  std::vector<std::int64_t> pos(S);
  for (std::int64_t i = 0; i < S; ++i)
    pos[std::size_t(i)] = i;
  AttentionArgs a;
  a.shape = {B, H, H, S, S, D};
  a.mask.kind = MaskKind::causal;
  a.q_pos = a.k_pos = &pos;
  a.layout = Layout::sbh;
  // Scores around ±1e4: q and k of magnitude ~ 60 with head_dim 8 and scale 1/sqrt(8).
  Tensor q = random_sbh(S, B, H, D, DType::f64, 8, 60.0),
         k = random_sbh(S, B, H, D, DType::f64, 9, 60.0),
         v = random_sbh(S, B, H, D, DType::f64, 10);
  for (DType t : {DType::f64, DType::f32}) {
    Tensor o = Tensor::zeros(q.shape(), t), l = Tensor::zeros({B, H, S}, t);
    attention_forward(a, q.to(t), k.to(t), v.to(t), o, l);
    Tensor ro = Tensor::zeros(q.shape(), DType::f64), rl = Tensor::zeros({B, H, S}, DType::f64);
    reference_attention(a, q, k, v, ro, rl);
    for (std::int64_t i = 0; i < o.numel(); ++i)
      ASSERT_TRUE(std::isfinite(o.item(i)));
    EXPECT_LE(rel_error(o.to(DType::f64), ro), t == DType::f64 ? 1e-12 : 1e-4);
    EXPECT_LE(rel_error(l.to(DType::f64), rl), t == DType::f64 ? 1e-12 : 1e-5);
  }
}

TEST(LocalAttention, MergingHalvesEqualsTheWhole) {
  const std::int64_t S = 96, B = 1, H = 2, D = 8;
  std::vector<std::int64_t> qpos(S), k1, k2;
  for (std::int64_t i = 0; i < S; ++i) {
    qpos[std::size_t(i)] = i;
    (i % 3 ? k1 : k2).push_back(i);  // an interleaved split of the keys
  }
  Tensor q = random_sbh(S, B, H, D, DType::f64, 1), k = random_sbh(S, B, H, D, DType::f64, 2),
         v = random_sbh(S, B, H, D, DType::f64, 3);
  auto rows = [&](const Tensor& t, const std::vector<std::int64_t>& p) {
    return testing::gather_rows(t, p);
  };
  AttentionArgs whole;
  whole.shape = {B, H, H, S, S, D};
  whole.layout = Layout::sbh;
  whole.mask.kind = MaskKind::causal;
  whole.q_pos = whole.k_pos = &qpos;
  Tensor ro = Tensor::zeros(q.shape(), DType::f64), rl = Tensor::zeros({B, H, S}, DType::f64);
  reference_attention(whole, q, k, v, ro, rl);
  Tensor o = Tensor::zeros(q.shape(), DType::f64), l = Tensor::zeros({B, H, S}, DType::f64);
  for (std::int64_t i = 0; i < l.numel(); ++i)
    l.data<double>()[i] = -INFINITY;
  for (auto* part : {&k1, &k2}) {
    AttentionArgs a = whole;
    a.shape.kv_len = std::int64_t(part->size());
    a.k_pos = part;
    Tensor ob = Tensor::zeros(q.shape(), DType::f64), lb = Tensor::zeros({B, H, S}, DType::f64);
    attention_forward(a, q, rows(k, *part), rows(v, *part), ob, lb);
    merge_partial(a, o, l, ob, lb);
  }
  EXPECT_LE(rel_error(o, ro), 1e-13);
  EXPECT_LE(rel_error(l, rl), 1e-13);
}

TEST(LocalAttention, VisibilityCountsWhatAKernelTouches) {
  // Brute force over the positions, for each mask kind: pairs and rows per (batch, head), keys
  // once. The last keys come after every query, so under the causal mask no query sees them;
  // query 3 is the striped mask's row that sees nothing.
  const std::int64_t S = 64, B = 2, H = 3;
  std::vector<std::int64_t> qpos, kpos;
  for (std::int64_t i = 0; i < S; ++i) {
    if (i == 3 || (i >= S / 2 && i < S - 4))
      qpos.push_back(i);  // row 3: the striped mask's empty one
    if (i % 3 == 0) kpos.push_back(i);
  }
  const auto mask = striped_mask(S);
  for (MaskKind kind : {MaskKind::none, MaskKind::causal, MaskKind::general}) {
    AttentionArgs a;
    a.shape = {B, H, H, std::int64_t(qpos.size()), std::int64_t(kpos.size()), 8};
    a.layout = Layout::sbh;
    a.mask.kind = kind;
    a.mask.general = mask;
    a.q_pos = &qpos;
    a.k_pos = &kpos;
    const auto sees = [&](std::int64_t q, std::int64_t k) {
      return kind == MaskKind::none     ? true
             : kind == MaskKind::causal ? k <= q
                                        : bool(mask->at(q, k));
    };
    std::int64_t pairs = 0, rows = 0, keys = 0;
    for (std::int64_t q : qpos) {
      std::int64_t n = 0;
      for (std::int64_t k : kpos)
        n += sees(q, k);
      pairs += n;
      rows += n > 0;
    }
    for (std::int64_t k : kpos) {
      bool seen = false;
      for (std::int64_t q : qpos)
        seen = seen || sees(q, k);
      keys += seen;
    }
    const Visibility v = visibility(a);
    EXPECT_EQ(v.pairs, pairs * B * H) << int(kind);
    EXPECT_EQ(v.rows, rows * B * H) << int(kind);
    EXPECT_EQ(v.keys, keys) << int(kind);
    EXPECT_EQ(visible_pairs(a), v.pairs) << int(kind);
    if (kind == MaskKind::causal) {
      EXPECT_LT(keys, std::int64_t(kpos.size()));
    }
    if (kind == MaskKind::general) {
      EXPECT_LT(rows, std::int64_t(qpos.size()));
    }
  }
}

TEST(LocalAttention, BadArgumentsAreRejected) {
  std::vector<std::int64_t> pos(4);
  AttentionArgs a;
  a.shape = {1, 3, 2, 4, 4, 8};
  a.q_pos = a.k_pos = &pos;
  Tensor t = Tensor::zeros({1, 3, 4, 8}, DType::f64);
  cocemu::testing::expect_error([&] { attention_forward(a, t, t, t, t, t); },
                                Errc::invalid_argument, {"query heads 3", "key/value heads 2"});
  a.shape = {1, 2, 2, 4, 4, 8};
  Tensor bf = Tensor::zeros({1, 2, 4, 8}, DType::bf16);
  cocemu::testing::expect_error([&] { attention_forward(a, bf, bf, bf, bf, bf); },
                                Errc::invalid_argument, {"f32 and f64", "bf16"});
}

}  // namespace
}  // namespace cocemu::attn
