// The step's parts (part_model.h): priced from the cost model — each function mirrors what the
// emulated code launches, the comments name the code it mirrors — or emulated on one TP (× CP)
// group (emulate_parts, at the end).
#include "cocemu/train/part_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <string_view>
#include <vector>

#include "cocemu/collectives/plan.h"
#include "cocemu/layers/coc_config.h"
#include "cocemu/layers/fused_kernels.h"
#include "cocemu/runtime/cost_model.h"
#include "cocemu/runtime/error.h"
#include "cocemu/runtime/graph.h"
#include "cocemu/train/detail/intervals.h"
#include "cocemu/train/trainer.h"

namespace cocemu::bench {

using layers::LinearOptions;
using layers::Strategy;

namespace {

/// A stretch of device time: its length, the compute work inside it (full speed), the exposed
/// communication — time a transfer runs while no compute does, as the emulated report counts it
/// (a fused kernel is compute: its transfers are inside it) —, the time a transfer runs beside
/// compute (hidden) and the time a fused kernel runs.
struct Span {
  double ns = 0, compute_ns = 0, exposed_ns = 0, hidden_ns = 0, fused_ns = 0, split_extra_ns = 0;
  Span& operator+=(const Span& o) {
    ns += o.ns;
    compute_ns += o.compute_ns;
    exposed_ns += o.exposed_ns;
    hidden_ns += o.hidden_ns;
    fused_ns += o.fused_ns;
    split_extra_ns += o.split_extra_ns;
    return *this;
  }
  Span operator*(double n) const {
    return {ns * n,        compute_ns * n, exposed_ns * n,
            hidden_ns * n, fused_ns * n,   split_extra_ns * n};
  }
  double exposed() const { return exposed_ns; }
};
Span compute(double ns) {
  return {ns, ns, 0};
}
Span comm(double ns) {
  return {ns, 0, ns};
}
Span fused_span(double ns, double compute_ns) {
  return {ns, compute_ns, 0, 0, ns};
}

/// One TP group's (and its CP group's) pricing for one micro-batch.
class Pricer {
 public:
  Pricer(const TrainSetup& setup, std::int64_t batch, std::map<std::string, int>* tuned,
         const std::vector<int>& values)
      : s_(setup),
        tuned_(tuned),
        values_(values),
        p_(*setup.profile),
        m_(setup.options.model),
        l_(setup.options.layout),
        e_(size_of(l_.dtype)),
        ws_(l_.tp),
        tokens_(m_.seq / l_.cp * batch) {
    tp_members_.resize(std::size_t(ws_));
    std::iota(tp_members_.begin(), tp_members_.end(), 0);
    for (int i = 0; i < l_.cp; ++i)
      cp_members_.push_back(i * ws_);
  }

  std::int64_t tokens() const { return tokens_; }
  std::int64_t local_rows() const {
    return l_.sequence_parallel && ws_ > 1 ? tokens_ / ws_ : tokens_;
  }

  double mem(double bytes) const { return memory_ns(p_, std::uint64_t(std::max(0.0, bytes))); }
  double gemm(std::int64_t m, std::int64_t n, std::int64_t k, GemmLayout g = {}) const {
    return gemm_ns(p_, m, n, k, l_.dtype, g);
  }
  /// A TP collective as ops.cpp calls it: count per rank as the call counts it, bytes as
  /// nccl-tests' "size".
  double coll(CollOp op, std::int64_t count, double size_bytes) const {
    return coll(op, count, size_bytes, l_.dtype);
  }
  double coll(CollOp op, std::int64_t count, double size_bytes, DType t) const {
    return model_collective(p_, op, tp_members_, count, t, std::uint64_t(size_bytes),
                            Algorithm::automatic, s_.deterministic)
        .cost.total_ns;
  }
  /// A layer's TP all-reduce (mappings.h): none with one member, as Megatron skips it.
  double tp_reduce(std::int64_t count, double size_bytes) const {
    return ws_ == 1 ? 0 : coll(CollOp::all_reduce, count, size_bytes);
  }
  double overlapped(double compute_ns, double comm_ns) const {
    return overlapped_ns(compute_ns, comm_ns, p_.contention);
  }
  /// Compute and a transfer that start together (the schedule's contention rule): the transfer
  /// is exposed for whatever outlasts the slowed compute.
  Span together(double compute_ns, double comm_ns) const {
    const double t = overlapped(compute_ns, comm_ns);
    const double exposed = std::max(0.0, t - compute_ns * p_.contention.compute_slowdown);
    // The transfer runs until it ends (all of t when it outlasts the compute).
    const double busy = comm_ns > 0 ? std::min(t, comm_ns * p_.contention.comm_slowdown) : 0;
    return {t,       compute_ns,
            exposed, std::max(0.0, busy - exposed),
            0,       split_extra_ns(compute_ns * p_.contention.compute_slowdown, busy)};
  }

  /// The options an op of [m, k, n] runs with (linear.cpp's resolve).
  LinearOptions options(std::int64_t m, std::int64_t k, std::int64_t n) const {
    const LinearOptions& o = s_.options.linear;
    if (!o.per_shape) return o;
    LinearOptions r = layers::options_for(*o.per_shape, m, k, n);
    r.gradient_accumulation_fusion = o.gradient_accumulation_fusion;
    return r;
  }
  /// The op's span under its options — or, when tuning, under the fastest of serial, script
  /// P = 2/4/8 and fused, recorded as MindSpeed's customized_coc value for its [m, k, n] (a key
  /// already chosen by another op keeps its value: one config serves every op).
  template <class Fn>
  Span choose(std::int64_t m, std::int64_t k, std::int64_t n, Fn fn) const {
    if (!tuned_ || ws_ == 1) return fn(options(m, k, n));
    const LinearOptions& base = s_.options.linear;
    const layers::CocConfig c = layers::switches_of(base);
    auto run = [&](int value) {
      LinearOptions o = value == -1  ? layers::options_for(c, Strategy::fused, 1)
                        : value == 1 ? layers::options_for(c, Strategy::serial, 1)
                                     : layers::options_for(c, Strategy::script, value);
      o.gradient_accumulation_fusion = base.gradient_accumulation_fusion;
      return fn(o);
    };
    const std::string key = fmt::format("[{}, {}, {}]", m, k, n);
    if (const auto it = tuned_->find(key); it != tuned_->end()) return run(it->second);
    int best_value = 1;
    Span best = run(1);
    for (const int v : values_) {
      const Span sp = run(v);
      if (sp.ns < best.ns) {
        best = sp;
        best_value = v;
      }
    }
    (*tuned_)[key] = best_value;
    return best;
  }

  static int chunks(const LinearOptions& o, std::int64_t rows) {
    if (o.strategy != Strategy::script) return 1;
    for (int p = o.parallel_num; p > 1; p /= 2)
      if (rows % p == 0) return p;
    return 1;
  }
  layers::FusedOptions fused(const LinearOptions& o) const {
    return {o.tile_rows, o.tiles_per_step, s_.deterministic, ""};
  }

  /// linear.cpp's soc_prepare: the copy or pad op it adds and how the chunk GEMMs change.
  struct Soc {
    double prep_ns = 0;
    bool col_major = false;
    std::int64_t k = 0;
  };
  Soc soc(const LinearOptions& o, int P, std::int64_t m, std::int64_t local_rows, std::int64_t k,
          std::int64_t n, bool weight_col_major) const {
    const layers::SocFriendly f =
        layers::soc_friendly(layers::switches_of(o), m, k, n, P, e_, weight_col_major);
    if (f.transpose_weight) return {mem(2.0 * double(k * n * e_)), true, k};
    if (f.padded_k != k)
      return {mem(double((local_rows + n) * (k + f.padded_k) * e_)), weight_col_major, f.padded_k};
    return {0, weight_col_major, k};
  }

  /// linear.cpp's gather_then_matmul: all_gather x [ml, k] to [m, k], then · W (n columns).
  Span gather_then_matmul(const LinearOptions& o, std::int64_t k, std::int64_t n, bool trans_w,
                          bool keep_gathered) const {
    const std::int64_t ml = local_rows(), m = ml * ws_;
    if (o.strategy == Strategy::fused) {
      const double t = layers::fused_kernel_ns(p_, layers::FusedKind::all_gather_matmul, m, k, n,
                                               ws_, l_.dtype, fused(o), trans_w);
      return fused_span(t, gemm(m, n, k, {false, trans_w}));
    }
    if (o.strategy == Strategy::serial) {
      Span s = comm(coll(CollOp::all_gather, ml * k, double(m * k * e_)));
      s += compute(gemm(m, n, k, {false, trans_w}));
      return s;
    }
    const int P = chunks(o, ml);
    const std::int64_t per = ml / P;
    const Soc sc = soc(o, P, m, ml, k, n, trans_w);
    const double c = coll(CollOp::all_gather, per * k, double(ws_ * per * k * e_));
    const double g = gemm(ws_ * per, n, sc.k, {false, sc.col_major});
    double shuffles = mem(2.0 * double(m * n * e_));
    if (keep_gathered) shuffles += mem(2.0 * double(m * k * e_));
    // Chunk i's gather runs beside chunk i−1's product.
    Span s = compute(sc.prep_ns);
    s += comm(c);
    s += together(g, c) * double(P - 1);
    s += compute(g + shuffles);
    return s;
  }

  /// The row-parallel forward's product and reduction (linear.cpp RowParallelLinear::forward).
  Span row_forward(std::int64_t kl, std::int64_t n) const {
    return choose(tokens_, kl, n, [&](const LinearOptions& o) { return row_forward(o, kl, n); });
  }
  Span row_forward(const LinearOptions& o, std::int64_t kl, std::int64_t n) const {
    const std::int64_t m = tokens_;
    const bool sp = l_.sequence_parallel && ws_ > 1;
    const double whole = gemm(m, n, kl, {false, true});
    if (o.strategy == Strategy::fused)
      return fused_span(layers::fused_kernel_ns(p_,
                                                sp ? layers::FusedKind::matmul_reduce_scatter
                                                   : layers::FusedKind::matmul_all_reduce,
                                                m, kl, n, ws_, l_.dtype, fused(o), true),
                        whole);
    const int P = chunks(o, sp ? m / ws_ : m);
    const std::int64_t rows = m / P;  // a chunk's product rows
    auto reduce = [&](std::int64_t r) {
      return sp ? coll(CollOp::reduce_scatter, r / ws_ * n, double(r * n * e_))
                : tp_reduce(r * n, double(r * n * e_));
    };
    if (o.strategy == Strategy::serial) {
      Span s = compute(whole);
      s += comm(reduce(m));
      return s;
    }
    const Soc sc = soc(o, P, sp ? m : m * ws_, m, kl, n, true);
    const double shuffle = sp && P > 1 ? mem(2.0 * double(m * kl * e_)) : 0;
    const double g = gemm(rows, n, sc.k, {false, sc.col_major}), c = reduce(rows);
    // Chunk i's reduction runs beside chunk i+1's product.
    Span s = compute(sc.prep_ns + shuffle + g);
    s += together(g, c) * double(P - 1);
    s += comm(c);
    return s;
  }

  /// ColumnParallelLinear::forward.
  Span column_forward(std::int64_t k, std::int64_t nl) const {
    const std::int64_t m = tokens_;
    const bool sp = l_.sequence_parallel && ws_ > 1;
    if (!sp) return compute(gemm(m, nl, k, {false, true}));
    return choose(m, k, nl, [&](const LinearOptions& o) {
      return gather_then_matmul(o, k, nl, true, !o.recompute_all_gather);
    });
  }

  double weight_grad(std::int64_t rows, std::int64_t cols, const LinearOptions& o) const {
    const std::int64_t m = tokens_;
    double t = gemm(rows, cols, m, {true, false});
    if (!o.gradient_accumulation_fusion) t += mem(3.0 * double(rows * cols * 4));
    return t;
  }

  /// ColumnParallelLinear::backward (dy [m, nl], weight [nl, k]).
  Span column_backward(std::int64_t k, std::int64_t nl) const {
    return choose(tokens_, nl, k,
                  [&](const LinearOptions& o) { return column_backward(o, k, nl); });
  }
  Span column_backward(const LinearOptions& o, std::int64_t k, std::int64_t nl) const {
    const std::int64_t m = tokens_, ml = local_rows();
    const bool sp = l_.sequence_parallel && ws_ > 1;
    const double gd = gemm(m, k, nl), gw = weight_grad(nl, k, o);
    if (!sp) {
      const double ar = tp_reduce(m * k, double(m * k * e_));
      Span s = compute(gd);
      s += together(gw, ar);  // the async all_reduce beside the weight-gradient GEMM
      return s;
    }
    const double regather =
        o.recompute_all_gather ? coll(CollOp::all_gather, ml * k, double(m * k * e_)) : 0;
    if (o.strategy == Strategy::fused && o.enable_coc_in_column_backward) {
      const double f = layers::fused_kernel_ns(p_, layers::FusedKind::matmul_reduce_scatter, m, nl,
                                               k, ws_, l_.dtype, fused(o), false);
      Span s = together(f, regather);
      s.fused_ns += f;
      s += compute(gw);
      return s;
    }
    const double rs = coll(CollOp::reduce_scatter, ml * k, double(m * k * e_));
    Span s = together(gd, regather);  // the re-gather beside the grad-input GEMM
    s += together(gw, rs);            // the reduce_scatter beside the weight-gradient GEMM
    return s;
  }

  /// RowParallelLinear::backward (dy [ml, n], weight [n, kl]).
  Span row_backward(std::int64_t kl, std::int64_t n) const {
    const std::int64_t m = tokens_;
    const bool sp = l_.sequence_parallel && ws_ > 1;
    if (!sp) return compute(gemm(m, kl, n) + weight_grad(n, kl, options(m, n, kl)));
    return choose(m, n, kl, [&](const LinearOptions& o) {
      Span s = gather_then_matmul(o, n, kl, false, true);
      s += compute(weight_grad(n, kl, o));
      return s;
    });
  }

  /// Flash attention over this rank's heads (TransformerLayer::local_attention_forward), or the
  /// CP attention's forward over the cp group.
  Span attention_forward() const {
    const std::int64_t b = tokens_ / (m_.seq / l_.cp), heads = m_.heads / ws_, d = head_dim();
    if (l_.cp == 1)
      return compute(m_.flash_attention
                         ? attention_ns(p_, b * heads, m_.seq, m_.seq, d, l_.dtype, 0.5, false)
                         : unfused_attention_ns(p_, b * heads, m_.seq, m_.seq, d, l_.dtype, false,
                                                m_.masked_softmax_fusion));
    return cp_attention(false);
  }
  Span attention_backward() const {
    const std::int64_t b = tokens_ / (m_.seq / l_.cp), heads = m_.heads / ws_, d = head_dim();
    if (l_.cp == 1)
      return compute(m_.flash_attention
                         ? attention_ns(p_, b * heads, m_.seq, m_.seq, d, l_.dtype, 0.5, true)
                         : unfused_attention_ns(p_, b * heads, m_.seq, m_.seq, d, l_.dtype, true,
                                                m_.masked_softmax_fusion));
    return cp_attention(true);
  }

  std::int64_t head_dim() const { return m_.hidden / m_.heads; }

  double p2p(double bytes, int a, int b) const {
    return p_.topology.path_latency_ns(a, b) + bytes / p_.topology.path_bandwidth(a, b) * 1e9;
  }

  /// A CP attention kernel over `pairs` visible (query, key) pairs of `heads` query heads (KV
  /// heads in proportion), `s_q` queries and `s_k` keys, priced as context_parallel.cpp prices it
  /// (flash_attention_ns).
  double cp_kernel_ns(double pairs, bool backward, std::int64_t heads, std::int64_t s_q,
                      std::int64_t s_k, bool kv_repeated = false) const {
    const std::int64_t kv = kv_repeated ? heads : heads * m_.kv() / m_.heads;
    const double flops = (backward ? 10.0 : 4.0) * double(head_dim()) * pairs;
    const double bytes = double(e_) * double(heads * s_q + kv * s_k) * double(2 * head_dim());
    return flash_attention_ns(p_, flops, head_dim(), l_.dtype, bytes, pairs / double(heads * s_q),
                              backward);
  }

  /// Context-parallel attention as context_parallel.cpp runs it. Ulysses (over u ranks: all of
  /// cp for ulysses_cp_algo, ulysses_degree_in_cp for hybrid_cp_algo, none for the ring):
  /// all_to_all of Q, K, V to head shards and of the output back (backward: dout, then dQ, dK,
  /// dV); when this TP rank's KV heads do not divide over u, K and V are first repeated to the
  /// query heads (MindSpeed's repeat_interleave, context_parallel.cpp's repeat_kv) and travel at
  /// their width, and the backward folds the repeated heads' gradients back. Then the ring over
  /// the R = cp / u ranks that hold the same heads (megatron_cp_algo, causal, load-balanced
  /// chunks): R steps, each over half of an s × s block's pairs (s = seq / R; step 0: the two
  /// own chunks, causal), priced as on the slowest rank, the last, whose blocks are its s queries
  /// over half of each block's keys. Each step's KV block (and in the backward its dK|dV
  /// accumulator) travels behind the current step's kernel, send and receive serialised on one
  /// stream unless use_cp_send_recv_overlap. The double ring (cp_window_size w): windows of w
  /// ring ranks; inside a window the block goes to the inner neighbour beside each step; the
  /// outer transfer (to the same position in the next window) is posted at the start of a
  /// window's round and waited after its w steps; the dK|dV accumulator goes inner, or
  /// diagonally to the next window at a window's end. Kernels: 4 FLOPs per visible pair and head
  /// dimension forward, 10 backward; layout conversions to and from BNSD around them.
  Span cp_attention(bool backward) const {
    const int cp = l_.cp;
    const bool ulysses = l_.cp_algo == "ulysses_cp_algo", hybrid = l_.cp_algo == "hybrid_cp_algo";
    COCEMU_CHECK_ARG(ulysses || hybrid || l_.cp_algo == "megatron_cp_algo",
                     "the step's part model prices megatron_cp_algo, ulysses_cp_algo and "
                     "hybrid_cp_algo; got {}",
                     l_.cp_algo);
    const int u = ulysses ? cp : hybrid ? std::max(1, l_.ulysses_degree_in_cp) : 1;
    const int R = cp / u, w = ulysses ? 1 : std::max(1, l_.cp_window_size), nw = R / w;
    const std::int64_t s_l = m_.seq / cp, b = tokens_ / s_l, heads = m_.heads / ws_,
                       kvl = m_.kv() / ws_ * head_dim(), hl = heads * head_dim();
    const bool repeated = u > 1 && (m_.kv() / ws_) % u != 0;
    const std::int64_t kvw = repeated ? hl : kvl;  // K and V as they travel
    const double layout = mem(2.0 * double(tokens_ * (hl + 2 * kvw) * e_)) +
                          mem(2.0 * double(tokens_ * hl * e_)) * (backward ? 3 : 1);
    Span s;
    if (u > 1) {
      const std::vector<int> members(cp_members_.begin(), cp_members_.begin() + u);
      auto a2a = [&](std::int64_t width) {
        const std::int64_t n = tokens_ * width;
        return model_collective(p_, CollOp::all_to_all, members, n / u, l_.dtype,
                                std::uint64_t(n * e_), Algorithm::automatic, s_.deterministic)
            .cost.total_ns;
      };
      s += comm(2 * a2a(hl) + 2 * a2a(kvw));
      // repeat_kv reads K (V) and writes it at the query heads' width; fold_kv reads and writes
      // the repeated gradient.
      if (repeated)
        s += compute(backward ? 2 * mem(2.0 * double(tokens_ * hl * e_))
                              : 2 * mem(double(tokens_ * (kvl + hl) * e_)));
    }
    s += compute(layout);
    const std::int64_t hq = heads / u;
    if (R == 1) {
      const double pairs = double(b * hq) * double(m_.seq) * double(m_.seq + 1) / 2;
      s += compute(cp_kernel_ns(pairs, backward, b * hq, m_.seq, m_.seq, repeated));
      return s;
    }
    const std::int64_t s_r = m_.seq / R;
    const double pairs = double(b * hq) * double(s_r) * double(s_r) / 2;
    const double kernel = cp_kernel_ns(pairs, backward, b * hq, s_r, s_r / 2, repeated);
    const double block = double(tokens_ * kvw * e_) * 2;
    // Ring rank j is cp rank j·u (the ranks that hold the same heads); window W = j / w holds
    // positions j % w. A transfer's send to (W + dw, pos + dp) and receive from (W − dw,
    // pos − dp), serialised on one stream unless use_cp_send_recv_overlap; the ring moves in
    // lockstep (each step's kernel waits for its block), so every step takes as long as its
    // slowest rank's pair (a rank at a node's edge sends or receives across nodes).
    auto member = [&](int win, int at) {
      const int j = ((win % nw + nw) % nw) * w + (at % w + w) % w;
      return cp_members_[std::size_t(j * u)];
    };
    auto pair = [&](int dw, int dp) {
      double link = 0;
      for (int j = 0; j < R; ++j) {
        const int W = j / w, pos = j % w, me = member(W, pos);
        const double send = p2p(block, me, member(W + dw, pos + dp)),
                     recv = p2p(block, member(W - dw, pos - dp), me);
        link = std::max(link, l_.use_cp_send_recv_overlap ? std::max(send, recv) : send + recv);
      }
      return link;
    };
    const double inner = w > 1 ? pair(0, 1) : 0, outer = nw > 1 ? pair(1, 0) : 0,
                 diagonal = pair(1, 1);
    // Whether the inner and the outer transfers cross the same ports (both inside a node, or
    // both across): then they split them while both run, and the outer block's bytes go out
    // with the round's first inner transfers.
    auto crosses = [&](int dw, int dp) {
      for (int j = 0; j < R; ++j) {
        const int me = member(j / w, j % w);
        if (p_.topology.node_of(me) != p_.topology.node_of(member(j / w + dw, j % w + dp)))
          return true;
      }
      return false;
    };
    const bool outer_shares = w > 1 && nw > 1 && crosses(0, 1) == crosses(1, 0);
    const double b_slow = p_.contention.comm_slowdown;
    for (int o = 0, t = 0; o < nw; ++o) {
      const bool has_outer = o + 1 < nw;
      Span round;
      for (int i = 0; i < w; ++i, ++t) {
        // Beside this step's kernel: the next block inside the window; with a single ring, the
        // round's outer transfer; in the backward, the accumulator of the step before.
        double beside = i + 1 < w ? inner : 0;
        if (has_outer && (w == 1 || (outer_shares && i == 0))) beside += outer;
        if (backward && t > 0) beside += (i > 0 ? inner : diagonal);
        round += beside > 0 ? together(kernel, beside) : compute(kernel);
      }
      if (w > 1 && has_outer && !outer_shares) {  // the outer transfer beside the whole round
        const double busy = outer * b_slow;
        round.hidden_ns += std::min(busy, round.ns);
        if (busy > round.ns) round += comm(busy - round.ns);
      }
      s += round;
    }
    if (backward) s += comm(diagonal);  // the last accumulator reaches its owner
    return s;
  }

 private:
  const TrainSetup& s_;
  std::map<std::string, int>* tuned_;
  const std::vector<int>& values_;
  const DeviceProfile& p_;
  const layers::train::DecoderShape& m_;
  const layers::train::TrainLayout& l_;
  std::size_t e_;
  int ws_;
  std::int64_t tokens_;
  std::vector<int> tp_members_, cp_members_;
};

PartCost cost_of(const Span& s, double exposed_cp = 0) {
  return {s.ns,
          std::max(0.0, s.exposed() - exposed_cp),
          exposed_cp,
          s.hidden_ns,
          std::min(s.fused_ns, s.ns),
          s.split_extra_ns};
}

/// One micro-batch (or one copy's half of it) through each part.
StepParts price_copy(const TrainSetup& setup, std::int64_t batch, std::map<std::string, int>* tuned,
                     const std::vector<int>& values) {
  const Pricer pr(setup, batch, tuned, values);
  const auto& md = setup.options.model;
  const auto& l = setup.options.layout;
  const std::size_t e = size_of(l.dtype);
  const int ws = l.tp;
  const std::int64_t m = pr.tokens(), ml = pr.local_rows(), h = md.hidden, d = md.hidden / md.heads,
                     hl = h / ws, kvl = md.kv() / ws * d, fl = md.ffn / ws,
                     up_w = md.swiglu ? 2 * fl : fl, qkv_w = hl + 2 * kvl;
  const double act = double(ml * h * e);  // one [ml, h] activation
  StepParts parts;

  // TransformerLayer::forward.
  Span attn_fwd = pr.attention_forward();
  const double cp_fwd = l.cp > 1 ? attn_fwd.exposed() : 0;
  Span f;
  f += compute(pr.mem(2 * act));                                       // rmsnorm
  f += pr.column_forward(h, qkv_w);                                    // attn.qkv
  f += compute(pr.mem(2.0 * double(m * qkv_w * e)));                   // q, k, v column copies
  f += attn_fwd;                                                       // core attention
  f += pr.row_forward(hl, h);                                          // attn.out
  f += compute(pr.mem(3 * act) + pr.mem(2 * act));                     // residual, rmsnorm
  f += pr.column_forward(h, up_w);                                     // mlp.up
  f += compute(pr.mem((md.swiglu ? 3.0 : 2.0) * double(m * fl * e)));  // activation
  f += pr.row_forward(fl, h);                                          // mlp.down
  f += compute(pr.mem(3 * act));                                       // residual
  parts.layer_fwd = cost_of(f, cp_fwd);

  // TransformerLayer::backward.
  Span attn_bwd = pr.attention_backward();
  double cp_bwd = l.cp > 1 ? attn_bwd.exposed() : 0;
  Span b;
  b += pr.row_backward(fl, h);                               // mlp.down
  b += compute(pr.mem(3.0 * double(m * up_w * e)));          // activation backward
  b += pr.column_backward(h, up_w);                          // mlp.up
  b += compute(pr.mem(2 * act) + pr.mem(3 * act));           // residual grad, rmsnorm backward
  b += pr.row_backward(hl, h);                               // attn.out
  if (l.recompute == layers::train::Recompute::selective) {  // core attention again
    b += attn_fwd;
    cp_bwd += cp_fwd;
  }
  b += attn_bwd;
  b += compute(pr.mem(2.0 * double(m * qkv_w * e)));    // dq, dk, dv into dqkv
  b += pr.column_backward(h, qkv_w);                    // attn.qkv
  b += compute(pr.mem(2 * act) + pr.mem(3 * act));      // residual grad, rmsnorm backward
  if (l.recompute == layers::train::Recompute::full) {  // the whole forward again
    b += f;
    cp_bwd += cp_fwd;
  }
  parts.layer_bwd = cost_of(b, cp_bwd);

  // VocabEmbedding (parts.cpp): lookup, then all_reduce (or reduce_scatter under SP) over TP;
  // the backward gathers the gradient under SP and scatters it into the table.
  const bool sp = l.sequence_parallel && ws > 1;
  const double full = double(m * h * e);
  Span ef = compute(pr.mem(2 * full));
  ef += comm(sp ? pr.coll(CollOp::reduce_scatter, ml * h, full) : pr.tp_reduce(m * h, full));
  parts.embedding_fwd = cost_of(ef);
  Span eb = comm(sp ? pr.coll(CollOp::all_gather, ml * h, full) : 0);
  eb += compute(pr.mem(3 * full));
  parts.embedding_bwd = cost_of(eb);

  // VocabLoss: final rmsnorm, the LM head (column parallel), Megatron's unfused vocab-parallel
  // cross-entropy (its kernels' traffic; three all_reduces of m values).
  const std::int64_t vl = layers::train::padded_vocab(md.vocab, ws) / ws;
  const DType acc_t = l.dtype == DType::f64 ? DType::f64 : DType::f32;
  const double acc = double(size_of(acc_t));
  const layers::train::CrossEntropyTraffic ce(std::uint64_t(m * vl), l.dtype, acc_t,
                                              l.cross_entropy_fusion);
  Span lf = compute(pr.mem(2 * act));
  lf += pr.column_forward(h, vl);
  lf += compute(pr.mem(double(ce.max)) + (ce.target > 0 ? pr.mem(double(ce.target)) : 0) +
                pr.mem(double(ce.exp_sum)) + pr.mem(double(ce.loss) + 3 * double(m) * acc));
  lf += comm(pr.coll(CollOp::all_reduce, m, double(m) * acc, acc_t));  // the row max
  lf += comm(l.cross_entropy_fusion ? pr.coll(CollOp::all_reduce, 2 * m, 2 * double(m) * acc, acc_t)
                                    : 2 * pr.coll(CollOp::all_reduce, m, double(m) * acc, acc_t));
  parts.loss_fwd = cost_of(lf);
  Span lb = compute(pr.mem(double(ce.grad)));
  lb += pr.column_backward(h, vl);
  lb += compute(pr.mem(3 * act));
  parts.loss_bwd = cost_of(lb);
  return parts;
}

/// Two copies of half a micro-batch on their own streams: a third of one copy's exposed TP
/// communication hides behind the other copy's compute (fitted to the emulated step of a
/// LLaMA-7B-shaped layer at tp 8; the emulated step stays the reference).
PartCost paired(const PartCost& half) {
  const double hidden = half.exposed_tp_ns / 3;
  return {2 * half.ns - hidden,   2 * half.exposed_tp_ns - hidden,
          2 * half.exposed_cp_ns, 2 * half.hidden_comm_ns + hidden,
          2 * half.fused_ns,      2 * half.split_extra_ns};
}

}  // namespace

StepParts price_parts(const TrainSetup& setup, std::map<std::string, int>* tuned,
                      const std::vector<int>& values) {
  const auto& l = setup.options.layout;
  if (l.micro_batch_interleave == 1) return price_copy(setup, l.micro_batch_size, tuned, values);
  const StepParts h = price_copy(setup, l.micro_batch_size / 2, tuned, values);
  return {paired(h.layer_fwd),     paired(h.layer_bwd), paired(h.embedding_fwd),
          paired(h.embedding_bwd), paired(h.loss_fwd),  paired(h.loss_bwd)};
}

// The parts emulated on one TP (× CP) group, for the step model on emulated parts.

namespace {

/// A part's time beside a DP reduction (Beside below): compute alone slows by compute_slowdown;
/// on a link the reduction also crosses, exposed transfers and fused kernels take twice as long
/// and hidden transfers add their split extra.
double slowed_ns(const PartCost& c, const ContentionModel& m, bool shares_link) {
  const double n = shares_link ? 2 : 1;
  const double e = c.exposed_tp_ns + c.exposed_cp_ns, h = c.hidden_comm_ns, f = c.fused_ns;
  const double alone = std::max(0.0, c.ns - e - h - f);
  return m.compute_slowdown * alone + h + (shares_link ? c.split_extra_ns : 0) + n * e + n * f;
}

}  // namespace

StepParts emulate_parts(const TrainSetup& setup) {
  layers::train::TrainOptions o = setup.options;
  layers::train::TrainLayout& l = o.layout;
  l.dp = 1;
  l.pp = 1;
  l.vpp = 1;
  l.schedule = layers::train::PipelineSchedule::one_f_one_b;
  l.stage_layers.clear();
  l.global_batch_size = l.micro_batch_size;
  l.distributed_optimizer = false;
  // The probe measures the parts, not the gradient reduction (priced below): with cp > 1 its
  // gradients would be reduced over the cp group during the layer's backward and slow it.
  l.overlap_grad_reduce = false;
  l.overlap_param_gather = false;
  l.grad_reduce_in_fp32 = true;  // the reduction's dtype is priced below
  o.model.num_layers = 1;
  o.iterations = 1;
  o.record_pieces = true;
  WorldOptions w;
  w.profile = setup.profile;
  w.numerics = false;
  w.deterministic = setup.deterministic;
  const auto r = layers::train::train(o, w);
  // A part costs what it costs on its slowest rank: the ranks of a CP ring do different blocks
  // (a causal ring's first rank sees only later ranks' blocks, cut to half their queries), and
  // the next part's first exchange waits for the last of them.
  std::vector<layers::train::PieceRange> pieces = r.pieces;  // in rank order: ties go to the first
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const auto& a, const auto& b) { return a.rank < b.rank; });
  std::map<std::string, PartCost> parts;
  // Per part, each rank's merged compute (fused kernels included), fused and TP|CP intervals:
  // the group's states (PartCost::group) when the ranks form a CP group.
  struct RankStates {
    std::vector<detail::Interval> compute, fused, comm;
    PartCost cost;
  };
  std::map<std::string, std::vector<RankStates>> states;
  for (const auto& p : pieces) {
    const auto& ops = r.run.graph.ranks[std::size_t(p.rank)].ops;
    const auto& times = r.run.timeline.rank(p.rank);
    const auto& lanes = r.run.graph.ranks[std::size_t(p.rank)].lane_names;
    std::int64_t lo = INT64_MAX, hi = 0;
    std::vector<detail::Interval> compute, tp, cp, fused;
    std::vector<std::int64_t> compute_waits;  // where a compute stream waits for an event
    for (std::uint32_t i = p.first_op; i < p.end_op; ++i) {
      if (ops[i].lane != 0 && ops[i].cls == OpClass::wait &&
          !comm_kind(lanes[std::size_t(ops[i].lane)]))
        compute_waits.push_back(times[i].start_ns);
      if (ops[i].lane == 0 || ops[i].cls == OpClass::host || ops[i].cls == OpClass::wait) continue;
      lo = std::min(lo, times[i].start_ns);
      hi = std::max(hi, times[i].end_ns);
      const char* k = comm_kind(lanes[std::size_t(ops[i].lane)]);
      const std::string_view kind = k ? k : "";
      if (ops[i].cls == OpClass::fused) fused.push_back({times[i].start_ns, times[i].end_ns});
      if (ops[i].cls != OpClass::comm)
        compute.push_back({times[i].start_ns, times[i].end_ns});
      else if (kind == "TP")
        tp.push_back({times[i].start_ns, times[i].end_ns});
      else if (kind == "CP")
        cp.push_back({times[i].start_ns, times[i].end_ns});
    }
    PartCost c;
    if (hi > lo) c.ns = double(hi - lo);
    // Exposed communication: comm time not covered by any compute of the part.
    const auto covered_by = detail::merged(compute);
    auto exposed = [&](const std::vector<detail::Interval>& comm) {
      return detail::uncovered(detail::merged(comm), covered_by);
    };
    c.exposed_tp_ns = exposed(tp);
    c.exposed_cp_ns = exposed(cp);
    std::vector<detail::Interval> comm = tp;
    comm.insert(comm.end(), cp.begin(), cp.end());
    const auto all_comm = detail::merged(comm);
    c.hidden_comm_ns = detail::intersection(all_comm, covered_by);
    c.fused_ns = detail::length(detail::merged(fused));
    std::sort(compute_waits.begin(), compute_waits.end());
    for (const auto& [b0, b1] : comm) {  // op by op: back-to-back chunk transfers stay apart
      // The compute run the transfer starts beside (the one that covers its start), up to where
      // the compute stream next waits (as Megatron's backward waits for its reduce_scatter).
      const auto run =
          std::upper_bound(covered_by.begin(), covered_by.end(), detail::Interval{b0, INT64_MAX});
      if (run == covered_by.begin() || std::prev(run)->second <= b0) continue;
      std::int64_t end = std::prev(run)->second;
      if (const auto w = std::upper_bound(compute_waits.begin(), compute_waits.end(), b0);
          w != compute_waits.end())
        end = std::min(end, std::max(*w, b0));
      c.split_extra_ns += split_extra_ns(double(end - b0), double(b1 - b0));
    }
    if (const auto [it, fresh] = parts.try_emplace(p.what, c); !fresh && c.ns > it->second.ns)
      it->second = c;
    if (o.layout.cp > 1) states[p.what].push_back({covered_by, detail::merged(fused), all_comm, c});
  }
  // The group's state at each instant: the member's that slows a DP collective most (its rate
  // is its slowest member's: schedule.cpp, a rendezvous job).
  for (auto& [what, ranks] : states) {
    std::vector<std::int64_t> cuts;
    for (const auto& r : ranks)
      for (const auto* v : {&r.compute, &r.fused, &r.comm})
        for (const auto& [a, b] : *v) {
          cuts.push_back(a);
          cuts.push_back(b);
        }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    auto inside = [](const std::vector<detail::Interval>& v, std::int64_t t) {
      const auto it = std::upper_bound(v.begin(), v.end(), detail::Interval{t, INT64_MAX});
      return it != v.begin() && std::prev(it)->second > t;
    };
    PartCost::Group g;
    for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
      const std::int64_t t = cuts[i];
      const double len = double(cuts[i + 1] - t);
      int worst = 4;  // 0 hidden, 1 fused, 2 exposed, 3 alone, 4 idle
      for (const auto& r : ranks) {
        const bool f = inside(r.fused, t), c = inside(r.compute, t), x = inside(r.comm, t);
        worst = std::min(worst, f ? 1 : x && c ? 0 : x ? 2 : c ? 3 : 4);
      }
      (worst == 0   ? g.hidden_ns
       : worst == 1 ? g.fused_ns
       : worst == 2 ? g.exposed_ns
       : worst == 3 ? g.alone_ns
                    : g.idle_ns) += len;
    }
    auto& c = parts.at(what);
    if (const double total = g.total(); total > 0) {
      const double k = c.ns / total;
      double shared = 0, apart = 0;
      for (const auto& r : ranks) {
        shared = std::max(shared, slowed_ns(r.cost, setup.profile->contention, true));
        apart = std::max(apart, slowed_ns(r.cost, setup.profile->contention, false));
      }
      c.group = {g.hidden_ns * k, g.fused_ns * k, g.exposed_ns * k, g.alone_ns * k, g.idle_ns * k,
                 shared,          apart};
    }
  }
  auto part = [&](const char* what) {
    const auto it = parts.find(what);
    return it == parts.end() ? PartCost{} : it->second;
  };
  return {part("layer fwd"),     part("layer bwd"), part("embedding fwd"),
          part("embedding bwd"), part("loss fwd"),  part("loss bwd")};
}

}  // namespace cocemu::bench
