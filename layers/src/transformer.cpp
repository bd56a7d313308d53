#include "cocemu/layers/transformer.h"

#include <cmath>
#include <utility>

#include "cocemu/attention/local_attention.h"
#include "cocemu/layers/detail/kernels.h"
#include "cocemu/runtime/cost_model.h"
#include "cocemu/runtime/error.h"

namespace cocemu::layers {

using detail::alloc;
using detail::at;
using detail::elementwise;
using detail::rmsnorm;
using detail::rmsnorm_backward;
using detail::set;

namespace {

double gelu(double x) {
  return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double gelu_grad(double x) {
  const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  const double t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

}  // namespace

TransformerWeights TransformerWeights::random(const TransformerConfig& c, std::uint64_t seed) {
  const double s = 1.0 / std::sqrt(double(c.hidden));
  return {
      detail::random_normal({c.qkv_width(), c.hidden}, c.dtype, seed, s),
      detail::random_normal({c.hidden, c.hidden}, c.dtype, seed + 1, s),
      detail::random_normal({c.up_width(), c.hidden}, c.dtype, seed + 2, s),
      detail::random_normal({c.hidden, c.ffn}, c.dtype, seed + 3, 1.0 / std::sqrt(double(c.ffn)))};
}

TransformerWeights TransformerWeights::shapes(const TransformerConfig& c) {
  return {Tensor::shape_only({c.qkv_width(), c.hidden}, c.dtype),
          Tensor::shape_only({c.hidden, c.hidden}, c.dtype),
          Tensor::shape_only({c.up_width(), c.hidden}, c.dtype),
          Tensor::shape_only({c.hidden, c.ffn}, c.dtype)};
}

struct TransformerLayer::Saved {
  Tensor x, n1, rms1, q, k, v, attn, lse, h1, n2, rms2, up, act;
  std::vector<std::int64_t> pos;
  attn::CpAttention::Saved cp;
};

struct TransformerLayer::Context {
  std::shared_ptr<Saved> layer;
  ColumnParallelLinear::Saved qkv, up;
  Tensor out, down;
};

std::shared_ptr<TransformerLayer::Context> TransformerLayer::take_context() {
  COCEMU_CHECK_ARG(saved_, "TransformerLayer::take_context on rank {}: no forward to take",
                   tp_.owner().id());
  return std::make_shared<Context>(Context{std::exchange(saved_, nullptr), qkv_->take_saved(),
                                           up_->take_saved(), out_->take_saved(),
                                           down_->take_saved()});
}

void TransformerLayer::restore_context(std::shared_ptr<Context> c) {
  COCEMU_CHECK_ARG(c && c->layer, "TransformerLayer::restore_context on rank {}: empty context",
                   tp_.owner().id());
  saved_ = c->layer;
  qkv_->restore_saved(c->qkv);
  up_->restore_saved(c->up);
  out_->restore_saved(c->out);
  down_->restore_saved(c->down);
}

TransformerLayer::TransformerLayer(Group& tp, const TransformerConfig& c,
                                   const TransformerWeights& w, const ContextParallel* cp)
    : tp_(tp), c_(c) {
  const int ws = tp.size(), r = tp.rank();
  COCEMU_CHECK_ARG(c.hidden % c.heads == 0 && c.heads % c.kv() == 0,
                   "TransformerLayer: hidden {} must be divisible by heads {}, and heads by the KV "
                   "groups {}",
                   c.hidden, c.heads, c.kv());
  COCEMU_CHECK_ARG(c.heads % ws == 0 && c.kv() % ws == 0 && c.ffn % ws == 0,
                   "TransformerLayer: heads {}, KV groups {} and ffn {} must be divisible by the "
                   "TP size {} (Megatron asserts the same)",
                   c.heads, c.kv(), c.ffn, ws);
  if (cp && cp->group.size() > 1) {
    attn::CpConfig config = cp->config;
    config.context_parallel_size = cp->group.size();
    // The problem below is this TP rank's heads: MindSpeed's rule heads % (tp·cp) is then
    // (heads/tp) % cp, checked with tp 1 (the trainer checks the model's heads with tp).
    config.tensor_model_parallel_size = 1;
    attn::AttentionProblem problem{.batch = c.batch,
                                   .heads = c.heads / ws,
                                   .kv_heads = c.kv() / ws,
                                   .seq = c.seq,
                                   .head_dim = c.head_dim(),
                                   .dtype = c.dtype};
    Group g = cp->group;
    cp_attn_ = std::make_unique<attn::CpAttention>(g, config, problem);
    cp_size_ = g.size();
  }
  const std::int64_t s_local = c.seq / cp_size_;
  COCEMU_CHECK_ARG(!c.sequence_parallel || (s_local * c.batch) % ws == 0,
                   "TransformerLayer: local seq·batch = {} must be divisible by the TP size {} "
                   "with SP",
                   s_local * c.batch, ws);
  const std::int64_t h = c.hidden, hl = h / ws, kvl = c.kv() * c.head_dim() / ws, fl = c.ffn / ws;
  const Rank& rank = tp.owner();
  // Shards: stacked row blocks of the full weights, or column blocks (row-parallel layers).
  auto rows_of = [&](const Tensor& t, std::vector<std::pair<std::int64_t, std::int64_t>> blocks) {
    std::int64_t total = 0;
    for (const auto& b : blocks)
      total += b.second;
    Tensor out = detail::alloc(rank, {total, t.size(1)}, t.dtype());
    if (!rank.numerics()) return out;
    std::int64_t at_row = 0;
    for (const auto& [start, len] : blocks) {
      out.rows(at_row, at_row + len).copy_from(t.rows(start, start + len));
      at_row += len;
    }
    return out;
  };
  auto col_block = [&](const Tensor& t, std::int64_t c0, std::int64_t width) {
    Tensor out = detail::alloc(rank, {t.size(0), width}, t.dtype());
    if (!rank.numerics()) return out;
    for (std::int64_t i = 0; i < t.size(0); ++i)
      out.rows(i, i + 1).reshape({width}).copy_from(
          t.rows(i, i + 1).reshape({t.size(1)}).flat(c0, c0 + width));
    return out;
  };
  const std::int64_t kv_rows = c.kv() * c.head_dim();
  qkv_ = std::make_unique<ColumnParallelLinear>(
      tp, rows_of(w.qkv, {{r * hl, hl}, {h + r * kvl, kvl}, {h + kv_rows + r * kvl, kvl}}),
      Tensor(), c.sequence_parallel);
  out_ = std::make_unique<RowParallelLinear>(tp, col_block(w.out, r * hl, hl), Tensor(),
                                             c.sequence_parallel);
  up_ = std::make_unique<ColumnParallelLinear>(
      tp,
      c.activation == Activation::swiglu ? rows_of(w.up, {{r * fl, fl}, {c.ffn + r * fl, fl}})
                                         : rows_of(w.up, {{r * fl, fl}}),
      Tensor(), c.sequence_parallel);
  down_ = std::make_unique<RowParallelLinear>(tp, col_block(w.down, r * fl, fl), Tensor(),
                                              c.sequence_parallel);
}

namespace {

double sigmoid(double x) {
  return 1 / (1 + std::exp(-x));
}

/// `t` as f32 (a widened copy for 16-bit tensors): flash attention accumulates in f32.
Tensor widened(const Tensor& t) {
  return t.dtype() == DType::f32 || t.dtype() == DType::f64 ? t : t.to(DType::f32);
}
/// Stores a widened result back into `dst` (rounded once), unless it is `dst` itself.
void narrow_into(const Tensor& dst, const Tensor& wide) {
  if (wide.raw() != dst.raw()) dst.copy_from(wide.to(dst.dtype()));
}

/// Names the ops recorded in its scope as one CoC segment of the layer.
class Segment {
 public:
  Segment(Rank& rank, std::string name) : rank_(rank) { rank_.set_segment(std::move(name)); }
  ~Segment() { rank_.set_segment(""); }
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

 private:
  Rank& rank_;
};

}  // namespace

void TransformerLayer::local_attention_forward(Rank& rank, const std::shared_ptr<Saved>& s,
                                               const Tensor& out, const Tensor& lse,
                                               const char* name) const {
  const int ws = tp_.size();
  const std::int64_t heads_l = c_.heads / ws, kv_l = c_.kv() / ws, d = c_.head_dim(),
                     hl = heads_l * d, kvl = kv_l * d;
  attn::AttentionArgs a;
  a.shape = {c_.batch, heads_l, kv_l, c_.seq, c_.seq, d};
  a.layout = attn::Layout::sbh;
  a.mask.kind = attn::MaskKind::causal;
  const double flops = 2.0 * double(c_.batch * heads_l) * double(c_.seq * c_.seq) * double(d);
  rank.current_stream().launch(
      {.name = fmt::format("{} {}x{}", name, c_.seq, c_.seq),
       .cls = OpClass::compute,
       .work_ns = c_.flash_attention
                      ? attention_ns(rank.profile(), c_.batch * heads_l, c_.seq, c_.seq, d,
                                     c_.dtype, 0.5, false)
                      : unfused_attention_ns(rank.profile(), c_.batch * heads_l, c_.seq, c_.seq, d,
                                             c_.dtype, false, c_.masked_softmax_fusion),
       .flops = std::uint64_t(flops),
       .hbm_bytes = c_.flash_attention
                        ? std::uint64_t(attention_memory_bytes(c_.batch * heads_l, c_.seq, c_.seq,
                                                               d, c_.dtype, false))
                        : 0},
      [=, seq = c_.seq, batch = c_.batch] {
        attn::AttentionArgs aa = a;
        aa.q_pos = aa.k_pos = &s->pos;
        const Shape q_sbh{seq, batch, hl}, kv_sbh{seq, batch, kvl};
        const Tensor wide = widened(out);
        attn::attention_forward(aa, widened(s->q).reshape(q_sbh), widened(s->k).reshape(kv_sbh),
                                widened(s->v).reshape(kv_sbh), wide.reshape(q_sbh), lse);
        narrow_into(out, wide);
      });
}

Tensor TransformerLayer::forward(const Tensor& x, const LinearOptions& o) {
  Rank& rank = tp_.owner();
  const int ws = tp_.size();
  const std::int64_t s_local = cp_attn_ ? c_.seq / cp_size_ : c_.seq;
  const std::int64_t m = s_local * c_.batch, ml = c_.sequence_parallel ? m / ws : m;
  const std::int64_t h = c_.hidden, hl = h / ws, heads_l = c_.heads / ws, kv_l = c_.kv() / ws,
                     d = c_.head_dim(), kvl = kv_l * d, fl = c_.ffn / ws;
  COCEMU_CHECK_ARG(x.ndim() == 2 && x.size(0) == ml && x.size(1) == h && x.dtype() == c_.dtype,
                   "TransformerLayer::forward on rank {}: x {} must be {}[{}, {}]", rank.id(),
                   x.describe(), name_of(c_.dtype), ml, h);
  auto s = std::make_shared<Saved>();
  s->x = x;
  s->n1 = alloc(rank, {ml, h}, c_.dtype);
  s->rms1 = alloc(rank, {ml}, DType::f64);
  rmsnorm(rank, x, s->n1, s->rms1);
  LinearOptions lo = o;
  Tensor qkv;  // [m, hl + 2·kvl]
  {
    Segment seg(rank, "fwd attn.qkv");
    lo.label = "attn.qkv";
    qkv = qkv_->forward(s->n1, lo);
  }
  s->q = alloc(rank, {m, hl}, c_.dtype);
  s->k = alloc(rank, {m, kvl}, c_.dtype);
  s->v = alloc(rank, {m, kvl}, c_.dtype);
  detail::copy_columns(rank, s->q, qkv, 0, false);
  detail::copy_columns(rank, s->k, qkv, hl, false);
  detail::copy_columns(rank, s->v, qkv, hl + kvl, false);
  // Core attention over this rank's heads, causal, SBH layout ([S, B, heads·d] = the [m, hl] rows).
  // Queued kernels own what they read (values and the shared saved state, never `this`), so a
  // layer may be destroyed before its streams drain, as PyTorch's in-flight kernels keep theirs.
  const Shape q_sbh{s_local, c_.batch, hl}, kv_sbh{s_local, c_.batch, kvl};
  if (cp_attn_) {  // context parallel: MindSpeed's CP attention over the cp group
    const auto out =
        cp_attn_->forward(s->q.reshape(q_sbh), s->k.reshape(kv_sbh), s->v.reshape(kv_sbh));
    s->attn = out.out.reshape({m, hl});
    s->lse = out.lse;
    s->cp = cp_attn_->take_saved();
  } else {
    if (rank.numerics()) {  // positions are for the numerics only
      s->pos.resize(std::size_t(c_.seq));
      for (std::int64_t i = 0; i < c_.seq; ++i)
        s->pos[std::size_t(i)] = i;
    }
    s->attn = alloc(rank, {m, hl}, c_.dtype);
    s->lse =
        alloc(rank, {c_.batch, heads_l, c_.seq}, c_.dtype == DType::f64 ? DType::f64 : DType::f32);
    local_attention_forward(rank, s, s->attn, s->lse, "core attention fwd");
  }
  Tensor proj;
  {
    Segment seg(rank, "fwd attn.out");
    lo.label = "attn.out";
    proj = out_->forward(s->attn, lo);  // [ml, h]
  }
  s->h1 = alloc(rank, {ml, h}, c_.dtype);
  elementwise(rank, "residual", 3 * x.nbytes(), [=, h1 = s->h1] {
    for (std::int64_t i = 0; i < x.numel(); ++i)
      set(h1, i, at(x, i) + at(proj, i));
  });
  s->n2 = alloc(rank, {ml, h}, c_.dtype);
  s->rms2 = alloc(rank, {ml}, DType::f64);
  rmsnorm(rank, s->h1, s->n2, s->rms2);
  {
    Segment seg(rank, "fwd mlp.up");
    lo.label = "mlp.up";
    s->up = up_->forward(s->n2, lo);  // [m, fl] (SwiGLU: [m, 2·fl], gate then up)
  }
  s->act = alloc(rank, {m, fl}, c_.dtype);
  if (c_.activation == Activation::swiglu) {
    elementwise(rank, "swiglu", 3 * s->act.nbytes(), [up = s->up, act = s->act, fl] {
      for (std::int64_t i = 0; i < act.size(0); ++i)
        for (std::int64_t j = 0; j < fl; ++j) {
          const double g = at(up, i * 2 * fl + j), u = at(up, i * 2 * fl + fl + j);
          set(act, i * fl + j, g * sigmoid(g) * u);
        }
    });
  } else {
    elementwise(rank, "gelu", 2 * s->up.nbytes(), [up = s->up, act = s->act] {
      for (std::int64_t i = 0; i < up.numel(); ++i)
        set(act, i, gelu(at(up, i)));
    });
  }
  Tensor mlp;
  {
    Segment seg(rank, "fwd mlp.down");
    lo.label = "mlp.down";
    mlp = down_->forward(s->act, lo);
  }
  Tensor y = alloc(rank, {ml, h}, c_.dtype);
  elementwise(rank, "residual", 3 * x.nbytes(), [=, h1 = s->h1] {
    for (std::int64_t i = 0; i < y.numel(); ++i)
      set(y, i, at(h1, i) + at(mlp, i));
  });
  saved_ = s;
  return y;
}

Tensor TransformerLayer::backward(const Tensor& dy, const LinearOptions& o) {
  Rank& rank = tp_.owner();
  COCEMU_CHECK_ARG(saved_, "TransformerLayer::backward on rank {} before forward", rank.id());
  const auto s = saved_;
  const int ws = tp_.size();
  const std::int64_t s_local = cp_attn_ ? c_.seq / cp_size_ : c_.seq;
  const std::int64_t m = s_local * c_.batch, hl = c_.hidden / ws, heads_l = c_.heads / ws,
                     kv_l = c_.kv() / ws, d = c_.head_dim(), kvl = kv_l * d, fl = c_.ffn / ws;
  LinearOptions lo = o;
  // MLP: dy -> d(act) -> d(up) -> d(n2) -> d(h1) (+ residual).
  Tensor dact;
  {
    Segment seg(rank, "bwd mlp.down");
    lo.label = "mlp.down";
    dact = down_->backward(dy, lo);
  }
  Tensor dup = alloc(rank, s->up.shape(), c_.dtype);
  if (c_.activation == Activation::swiglu) {
    elementwise(rank, "swiglu backward", 3 * dup.nbytes(), [=, up = s->up] {
      for (std::int64_t i = 0; i < dact.size(0); ++i)
        for (std::int64_t j = 0; j < fl; ++j) {
          const double g = at(up, i * 2 * fl + j), u = at(up, i * 2 * fl + fl + j),
                       da = at(dact, i * fl + j), sg = sigmoid(g);
          set(dup, i * 2 * fl + j, da * u * sg * (1 + g * (1 - sg)));
          set(dup, i * 2 * fl + fl + j, da * g * sg);
        }
    });
  } else {
    elementwise(rank, "gelu backward", 3 * dup.nbytes(), [=, up = s->up] {
      for (std::int64_t i = 0; i < up.numel(); ++i)
        set(dup, i, at(dact, i) * gelu_grad(at(up, i)));
    });
  }
  lo.label = "mlp.up";
  Tensor dn2 = up_->backward(dup, lo);
  Tensor dh1 = alloc(rank, dy.shape(), c_.dtype);
  elementwise(rank, "residual grad", 2 * dy.nbytes(), [=] { dh1.copy_from(dy); });
  rmsnorm_backward(rank, s->h1, s->rms2, dn2, dh1);
  // Attention: dh1 -> d(attn) -> dq, dk, dv -> d(qkv) -> d(n1) -> dx (+ residual).
  Tensor dattn;
  {
    Segment seg(rank, "bwd attn.out");
    lo.label = "attn.out";
    dattn = out_->backward(dh1, lo);
  }
  Tensor dq, dk, dv;
  if (cp_attn_) {
    const Shape q_sbh{s_local, c_.batch, hl}, kv_sbh{s_local, c_.batch, kvl};
    if (c_.recompute_core_attention)  // selective recompute: the CP forward again (its comm too)
      cp_attn_->forward(s->q.reshape(q_sbh), s->k.reshape(kv_sbh), s->v.reshape(kv_sbh));
    else
      cp_attn_->restore_saved(s->cp);
    const auto g = cp_attn_->backward(dattn.reshape(q_sbh));
    dq = g.dq.reshape({m, hl});
    dk = g.dk.reshape({m, kvl});
    dv = g.dv.reshape({m, kvl});
  } else {
    dq = alloc(rank, {m, hl}, c_.dtype);
    dk = alloc(rank, {m, kvl}, c_.dtype);
    dv = alloc(rank, {m, kvl}, c_.dtype);
    Tensor attn = s->attn, lse = s->lse;
    if (c_.recompute_core_attention) {  // selective recompute: the forward kernel again
      attn = alloc(rank, s->attn.shape(), c_.dtype);
      lse = alloc(rank, s->lse.shape(), s->lse.dtype());
      local_attention_forward(rank, s, attn, lse, "core attention recompute");
    }
    attn::AttentionArgs a;
    a.shape = {c_.batch, heads_l, kv_l, c_.seq, c_.seq, d};
    a.layout = attn::Layout::sbh;
    a.mask.kind = attn::MaskKind::causal;
    rank.current_stream().launch(
        {.name = fmt::format("core attention bwd {}x{}", c_.seq, c_.seq),
         .cls = OpClass::compute,
         .work_ns = c_.flash_attention
                        ? attention_ns(rank.profile(), c_.batch * heads_l, c_.seq, c_.seq, d,
                                       c_.dtype, 0.5, true)
                        : unfused_attention_ns(rank.profile(), c_.batch * heads_l, c_.seq, c_.seq,
                                               d, c_.dtype, true, c_.masked_softmax_fusion),
         .hbm_bytes = c_.flash_attention
                          ? std::uint64_t(attention_memory_bytes(c_.batch * heads_l, c_.seq, c_.seq,
                                                                 d, c_.dtype, true))
                          : 0},
        [=, seq = c_.seq, batch = c_.batch] {
          attn::AttentionArgs aa = a;
          aa.q_pos = aa.k_pos = &s->pos;
          const Shape q_sbh{seq, batch, hl}, kv_sbh{seq, batch, kvl};
          const Tensor out = widened(attn).reshape(q_sbh), dout = widened(dattn).reshape(q_sbh);
          const Tensor dq32 = widened(dq), dk32 = widened(dk), dv32 = widened(dv);
          const Tensor delta = attn::attention_delta(aa, out, dout);
          attn::attention_backward(aa, widened(s->q).reshape(q_sbh), widened(s->k).reshape(kv_sbh),
                                   widened(s->v).reshape(kv_sbh), dout, lse, delta,
                                   dq32.reshape(q_sbh), dk32.reshape(kv_sbh), dv32.reshape(kv_sbh));
          narrow_into(dq, dq32);
          narrow_into(dk, dk32);
          narrow_into(dv, dv32);
        });
  }
  Tensor dqkv = alloc(rank, {m, hl + 2 * kvl}, c_.dtype);
  detail::copy_columns(rank, dq, dqkv, 0, true);
  detail::copy_columns(rank, dk, dqkv, hl, true);
  detail::copy_columns(rank, dv, dqkv, hl + kvl, true);
  lo.label = "attn.qkv";
  Tensor dn1 = qkv_->backward(dqkv, lo);
  Tensor dx = alloc(rank, dh1.shape(), c_.dtype);
  elementwise(rank, "residual grad", 2 * dh1.nbytes(), [=] { dx.copy_from(dh1); });
  rmsnorm_backward(rank, s->x, s->rms1, dn1, dx);
  return dx;
}

}  // namespace cocemu::layers
