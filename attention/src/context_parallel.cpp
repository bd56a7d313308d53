#include "cocemu/attention/context_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "cocemu/collectives/ops.h"
#include "cocemu/runtime/checked.h"
#include "cocemu/runtime/cost_model.h"
#include "cocemu/runtime/error.h"

namespace cocemu::attn {

namespace {

int mod(int a, int n) {
  return ((a % n) + n) % n;
}

bool is_causal(const CpConfig& c) {
  return c.attention_mask_type == "causal";
}

/// Tokens of part `part` of `parts` (the ring-level split): load-balanced for causal masks (chunks
/// part and 2·parts−1−part of 2·parts), contiguous otherwise.
std::vector<std::int64_t> part_tokens(bool causal, std::int64_t seq, int parts, int part) {
  std::vector<std::int64_t> t;
  if (causal) {
    const std::int64_t c = seq / (2 * parts);
    for (int chunk : {part, 2 * parts - 1 - part})
      for (std::int64_t i = 0; i < c; ++i)
        t.push_back(chunk * c + i);
  } else {
    const std::int64_t c = seq / parts;
    for (std::int64_t i = 0; i < c; ++i)
      t.push_back(part * c + i);
  }
  return t;
}

int ulysses_degree_of(const CpConfig& c) {
  if (c.context_parallel_algo == "ulysses_cp_algo") return c.context_parallel_size;
  if (c.context_parallel_algo == "hybrid_cp_algo") return c.ulysses_degree_in_cp;
  return 1;
}

/// K (i = 0) or V (i = 1) of a packed KV message of 2·n elements.
Tensor kv_part(const Tensor& packed, int i, std::int64_t n, const Shape& shape) {
  return packed.flat(i * n, (i + 1) * n).reshape(shape);
}

Tensor alloc(Rank& rank, const Shape& shape, DType t) {
  return rank.numerics() ? Tensor::zeros(shape, t) : Tensor::shape_only(shape, t);
}

/// dst += src, elementwise (f32 or f64).
void add_into(const Tensor& dst, const Tensor& src) {
  visit_dtype(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      T* d = dst.data<T>();
      const T* s = src.data<T>();
      for (std::int64_t i = 0; i < dst.numel(); ++i)
        d[i] += s[i];
    }
  });
}

/// Launches host-side data movement or math on the compute stream, priced as memory traffic.
void on_compute(Rank& rank, std::string name, std::uint64_t bytes, std::function<void()> fn) {
  rank.compute_stream().launch({.name = std::move(name),
                                .cls = OpClass::compute,
                                .work_ns = memory_ns(rank.profile(), bytes),
                                .bytes = bytes,
                                .hbm_bytes = bytes},
                               std::move(fn));
}

/// Data movement that only hands results back in the caller's layout (the LSE, which MindSpeed
/// keeps inside its flash-attention kernels): numerics only, free and launch-free in the model.
void emulator_only(Rank& rank, const std::string& name, std::function<void()> fn) {
  rank.compute_stream().launch({.name = name + " (emulator only, unpriced)",
                                .cls = OpClass::compute,
                                .work_ns = 0,
                                .launch = LaunchKind::none},
                               std::move(fn));
}

}  // namespace

void validate(const CpConfig& c, const AttentionProblem& p) {
  const int cp = c.context_parallel_size;
  const std::string& algo = c.context_parallel_algo;
  COCEMU_CHECK_ARG(cp >= 1, "context_parallel_size = {} must be >= 1", cp);
  COCEMU_CHECK_ARG(
      algo == "ulysses_cp_algo" || algo == "megatron_cp_algo" || algo == "hybrid_cp_algo",
      "context_parallel_algo = '{}' is unknown; allowed: ulysses_cp_algo, "
      "megatron_cp_algo, hybrid_cp_algo",
      algo);
  COCEMU_CHECK_ARG(c.attention_mask_type == "causal" || c.attention_mask_type == "general",
                   "attention_mask_type = '{}' is unknown; allowed: causal, general",
                   c.attention_mask_type);
  COCEMU_CHECK_ARG(c.attention_mask_type != "general" || p.general_mask,
                   "attention_mask_type = general needs a [seq, seq] mask");
  COCEMU_CHECK_ARG(!p.general_mask || p.general_mask->seq == p.seq,
                   "the general mask is [{0}, {0}] but the sequence length is {1}",
                   p.general_mask ? p.general_mask->seq : 0, p.seq);
  COCEMU_CHECK_ARG(p.batch >= 1 && p.heads >= 1 && p.kv_heads >= 1 && p.head_dim >= 1 && p.seq >= 1,
                   "attention shape batch {} heads {} kv_heads {} seq {} head_dim {}: all must be "
                   ">= 1",
                   p.batch, p.heads, p.kv_heads, p.seq, p.head_dim);
  {  // sizes are multiplied later: refuse products that would not fit
    const std::string what =
        fmt::format("attention shape batch {} x seq {} x heads {} x head_dim {}", p.batch, p.seq,
                    std::max(p.heads, p.kv_heads), p.head_dim);
    const std::int64_t limit = std::int64_t(1) << 48;
    checked_mul(checked_mul(checked_mul(p.batch, p.seq, what, limit), std::max(p.heads, p.kv_heads),
                            what, limit),
                p.head_dim, what, limit);
    checked_mul(p.seq, p.seq, "attention seq x seq (visible pairs)", limit);
  }
  COCEMU_CHECK_ARG(p.heads % p.kv_heads == 0,
                   "num_attention_heads = {} must be divisible by num_query_groups (kv heads) = {}",
                   p.heads, p.kv_heads);
  const int tp = c.tensor_model_parallel_size;
  COCEMU_CHECK_ARG(tp >= 1, "tensor_model_parallel_size = {} must be >= 1", tp);
  COCEMU_CHECK_ARG(c.cp_window_size >= 1, "cp_window_size = {} must be >= 1", c.cp_window_size);
  if (algo == "ulysses_cp_algo") {
    COCEMU_CHECK_ARG(c.cp_window_size == 1,
                     "cp_window_size = {} applies to megatron_cp_algo and hybrid_cp_algo only",
                     c.cp_window_size);
    COCEMU_CHECK_ARG(p.seq % cp == 0,
                     "ulysses_cp_algo: sequence length {} must be divisible by "
                     "context_parallel_size {}",
                     p.seq, cp);
    COCEMU_CHECK_ARG(p.heads % (std::int64_t(tp) * cp) == 0,
                     "ulysses_cp_algo: num_attention_heads {} must be divisible by "
                     "tensor_model_parallel_size × context_parallel_size = {} × {}",
                     p.heads, tp, cp);
  } else if (algo == "megatron_cp_algo") {
    COCEMU_CHECK_ARG(p.seq % (2 * cp) == 0,
                     "megatron_cp_algo: sequence length {} must be divisible by 2 × "
                     "context_parallel_size = {}",
                     p.seq, 2 * cp);
    if (c.cp_window_size > 1)
      COCEMU_CHECK_ARG(c.cp_window_size < cp && cp % c.cp_window_size == 0,
                       "megatron_cp_algo: cp_window_size = {} must be < context_parallel_size {} "
                       "and divide it",
                       c.cp_window_size, cp);
  } else {
    const int u = c.ulysses_degree_in_cp;
    COCEMU_CHECK_ARG(u >= 1, "hybrid_cp_algo needs ulysses_degree_in_cp >= 1, got {}", u);
    COCEMU_CHECK_ARG(cp % u == 0 && cp / u > 1,
                     "hybrid_cp_algo: ulysses_degree_in_cp = {} must divide "
                     "context_parallel_size = {} and leave a ring degree > 1",
                     u, cp);
    COCEMU_CHECK_ARG(p.heads % (std::int64_t(u) * tp) == 0,
                     "hybrid_cp_algo: num_attention_heads {} must be divisible by "
                     "ulysses_degree_in_cp × tensor_model_parallel_size = {} × {}",
                     p.heads, u, tp);
    COCEMU_CHECK_ARG(p.seq % (2 * cp) == 0,
                     "hybrid_cp_algo: sequence length {} must be divisible by 2 × "
                     "context_parallel_size = {}",
                     p.seq, 2 * cp);
    const int ring = cp / u;
    if (c.cp_window_size > 1)
      COCEMU_CHECK_ARG(c.cp_window_size < ring && ring % c.cp_window_size == 0,
                       "hybrid_cp_algo: cp_window_size = {} must be < the ring degree {} and "
                       "divide it",
                       c.cp_window_size, ring);
  }
  if (c.use_cp_send_recv_overlap && algo != "ulysses_cp_algo") {
    // RingP2P pairs a sender and its receiver by parity over two communicators: in a ring of odd
    // size the last rank and rank 0 are both even, so the one sends where the other does not
    // receive, and MindSpeed hangs.
    const int ring = algo == "hybrid_cp_algo" ? cp / c.ulysses_degree_in_cp : cp;
    const int w = c.cp_window_size;
    for (auto [size, what] :
         {std::pair{w > 1 ? w : 0, "inner (intra-window) ring"},
          std::pair{ring / w > 1 ? ring / w : 0, w > 1 ? "outer ring (across windows)" : "ring"}})
      COCEMU_CHECK_ARG(size % 2 == 0,
                       "use_cp_send_recv_overlap with a {} of {} ranks: MindSpeed's RingP2P pairs "
                       "sends and receives by rank parity over two communicators, so in an odd "
                       "ring its last rank and rank 0 (both even) use different ones and hang; "
                       "allowed: even ring sizes, or the overlap off",
                       what, size);
  }
}

std::vector<std::int64_t> token_positions(const CpConfig& c, std::int64_t seq, int cp_rank) {
  const int cp = c.context_parallel_size;
  COCEMU_CHECK_ARG(cp_rank >= 0 && cp_rank < cp, "cp rank {} out of range 0..{}", cp_rank, cp - 1);
  if (c.context_parallel_algo == "ulysses_cp_algo") return part_tokens(false, seq, cp, cp_rank);
  const int u = ulysses_degree_of(c), ring = cp / u;
  const std::vector<std::int64_t> part = part_tokens(is_causal(c), seq, ring, cp_rank / u);
  const std::size_t slice = part.size() / std::size_t(u), i = std::size_t(cp_rank % u);
  return {part.begin() + std::ptrdiff_t(i * slice), part.begin() + std::ptrdiff_t((i + 1) * slice)};
}

// ---------------------------------------------------------------------------------------------

/// The algorithm's steps, shared by forward and backward.
struct CpAttention::Impl {
  CpAttention& self;
  Rank& rank;
  const AttentionProblem& p;
  Layout layout;
  std::int64_t B, D;

  void record(const std::string& phase, int step, std::uint64_t bytes, int messages) {
    self.transfers_.push_back({phase, step, bytes, messages});
  }

  /// Sequence shards -> head shards over the Ulysses group: x is [S_l, B, H·d] with H heads; the
  /// result is [u·S_l, B, (H/u)·d], rows ordered by source rank.
  Tensor seq_to_head(const Tensor& x, std::int64_t heads, std::int64_t d, const std::string& what) {
    const int u = self.u_;
    const std::int64_t S = x.size(0), Bb = B, hu = heads / u, blk = S * Bb * hu * d;
    Tensor packed = alloc(rank, {u * blk}, x.dtype());
    on_compute(rank, "pack " + what, 2 * x.nbytes(), [x, packed, u, S, Bb, hu, d, heads, blk] {
      const std::size_t e = size_of(x.dtype()), row = std::size_t(hu * d) * e;
      const auto* src = static_cast<const std::byte*>(x.raw());
      auto* dst = static_cast<std::byte*>(packed.raw());
      for (int r = 0; r < u; ++r)
        for (std::int64_t sb = 0; sb < S * Bb; ++sb)
          std::memcpy(dst + (std::size_t(r) * std::size_t(blk) + std::size_t(sb * hu * d)) * e,
                      src + std::size_t(sb * heads * d) * e + std::size_t(r) * row, row);
    });
    Tensor out = alloc(rank, {u * S, B, hu * d}, x.dtype());
    all_to_all(self.ulysses_, out.reshape({u * blk}), packed, {.label = " " + what});
    record("a2a " + what, 0, std::uint64_t(blk) * (u - 1) * size_of(x.dtype()), u - 1);
    return out;
  }

  /// Head shards -> sequence shards: x is [u·S_l, B, (H/u)·d]; the result is [S_l, B, H·d].
  /// `unpriced`: an emulator-only transfer (not run, priced or counted as the real system's).
  Tensor head_to_seq(const Tensor& x, std::int64_t heads, std::int64_t d, const std::string& what,
                     bool unpriced = false) {
    const int u = self.u_;
    const std::int64_t S = x.size(0) / u, Bb = B, hu = heads / u, blk = S * Bb * hu * d;
    Tensor gathered = alloc(rank, {u * blk}, x.dtype());
    all_to_all(self.ulysses_, gathered, x.reshape({u * blk}),
               {.label = " " + what, .emulator_only = unpriced});
    if (!unpriced)
      record("a2a " + what, 0, std::uint64_t(blk) * (u - 1) * size_of(x.dtype()), u - 1);
    Tensor out = alloc(rank, {S, B, heads * d}, x.dtype());
    auto unpack = [x, gathered, out, u, S, Bb, hu, d, heads, blk] {
      const std::size_t e = size_of(x.dtype()), row = std::size_t(hu * d) * e;
      const auto* src = static_cast<const std::byte*>(gathered.raw());
      auto* dst = static_cast<std::byte*>(out.raw());
      for (int r = 0; r < u; ++r)
        for (std::int64_t sb = 0; sb < S * Bb; ++sb)
          std::memcpy(dst + std::size_t(sb * heads * d) * e + std::size_t(r) * row,
                      src + (std::size_t(r) * std::size_t(blk) + std::size_t(sb * hu * d)) * e,
                      row);
    };
    if (unpriced)
      emulator_only(rank, "unpack " + what, unpack);
    else
      on_compute(rank, "unpack " + what, 2 * x.nbytes(), unpack);
    return out;
  }

  /// KV heads repeated to the query heads (MindSpeed's repeat_interleave when they cannot be
  /// sharded over the Ulysses degree).
  Tensor repeat_kv(const Tensor& x) {
    const std::int64_t S = x.size(0), G = p.kv_heads, H = p.heads, r = H / G, Bb = B, Dd = D;
    Tensor out = alloc(rank, {S, B, H * D}, x.dtype());
    on_compute(rank, "repeat kv", x.nbytes() * std::uint64_t(1 + r), [x, out, S, G, H, r, Bb, Dd] {
      const std::int64_t D = Dd;
      const std::size_t e = size_of(x.dtype()), row = std::size_t(D) * e;
      for (std::int64_t sb = 0; sb < S * Bb; ++sb)
        for (std::int64_t h = 0; h < H; ++h)
          std::memcpy(
              static_cast<std::byte*>(out.raw()) + std::size_t(sb * H * D + h * D) * e,
              static_cast<const std::byte*>(x.raw()) + std::size_t(sb * G * D + (h / r) * D) * e,
              row);
    });
    return out;
  }

  /// Sums gradients of repeated heads back onto the KV heads, in head order.
  Tensor fold_kv(const Tensor& x) {
    const std::int64_t S = x.size(0), G = p.kv_heads, H = p.heads, r = H / G, Bb = B, D = this->D;
    Tensor out = alloc(rank, {S, B, G * D}, x.dtype());
    on_compute(rank, "fold repeated kv grads", x.nbytes() * 2, [x, out, S, G, H, r, Bb, D] {
      visit_dtype(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
          const T* src = x.data<T>();
          T* dst = out.data<T>();
          for (std::int64_t sb = 0; sb < S * Bb; ++sb)
            for (std::int64_t h = 0; h < H; ++h)
              for (std::int64_t d = 0; d < D; ++d)
                dst[sb * G * D + (h / r) * D + d] += src[sb * H * D + h * D + d];
        }
      });
    });
    return out;
  }

  AttentionArgs args(std::int64_t q_heads, std::int64_t kv_heads,
                     const std::vector<std::int64_t>& qp,
                     const std::vector<std::int64_t>& kp) const {
    AttentionArgs a;
    a.shape = {B, q_heads, kv_heads, std::int64_t(qp.size()), std::int64_t(kp.size()), D};
    a.layout = layout;
    a.mask = self.mask_;
    a.scale = p.scale;
    a.q_pos = &qp;
    a.k_pos = &kp;
    return a;
  }

  /// A block's kernel over its visible part (cost_model.h's flash_attention_ns: the same ruler
  /// as local attention): the query rows that see a key and the keys some query sees, as
  /// MindSpeed slices a causal block before it launches the kernel. Counting the masked rows
  /// too would halve a later rank's blocks' keys per row and price them below the kernel's
  /// efficiency on the launched shape.
  double attention_ns(const AttentionArgs& a, double flops, const Visibility& vis,
                      bool backward) const {
    const double q_rows = double(vis.rows);  // × batch × query heads
    return cocemu::flash_attention_ns(rank.profile(), flops, D, p.dtype,
                                      attention_bytes(a, vis, false), double(vis.pairs) / q_rows,
                                      backward);
  }
  /// The block kernel's device-memory traffic: its Q, K, V and O forward, twice that backward
  /// (what flash_attention_ns's memory time counts; the schedule's memory contention).
  double attention_bytes(const AttentionArgs& a, const Visibility& vis, bool backward) const {
    const double q_rows = double(vis.rows);
    const double kv_rows = double(a.shape.batch * a.shape.kv_heads * vis.keys);
    const double bytes = double(size_of(p.dtype)) * (q_rows + kv_rows) * double(2 * D);
    return backward ? 2 * bytes : bytes;
  }

  /// One ring transfer: a send of `out` to ring member `to` and a receive of `in` from `from`,
  /// posted as MindSpeed's RingP2P.async_send_recv posts them — by the parity of this rank's
  /// position in that ring, even ranks send on the first communicator and receive on the second,
  /// odd ranks the reverse. Without use_cp_send_recv_overlap both are one communicator, so a
  /// rank's send and receive serialise on its stream; with it they run on two.
  struct Transfer {
    Work send, recv;
    void wait() const {
      send.wait();
      recv.wait();
    }
  };
  Transfer exchange(bool inner, int ring_pos, const Tensor& out, int to, const Tensor& in,
                    int from) {
    Group* g = inner ? self.inner_ : self.outer_;
    Transfer t;
    if (ring_pos % 2 == 0) {
      t.send = isend(g[0], out, to);
      t.recv = irecv(g[1], in, from);
    } else {
      t.recv = irecv(g[0], in, from);
      t.send = isend(g[1], out, to);
    }
    return t;
  }

  // Ring coordinates of this rank: windows of w members; nw windows.
  int R() const { return self.ring_size_; }
  int w() const { return self.window_; }
  int nw() const { return R() / w(); }
  int me() const { return self.ring_.rank(); }
  /// The ring member at inner position `at` of window `win` (both taken modulo).
  int member(int win, int at) const { return mod(win, nw()) * w() + mod(at, w()); }

  /// Walks the (double) ring, calling visit(src, step, i, kv) for every KV block in visiting
  /// order, with each transfer posted before the compute it hides behind and waited after it, as
  /// MindSpeed's AttentionWithCp does (ring_context_parallel.py, forward and backward): the outer
  /// transfer (to the same position in the next window) at the start of a window, waited after
  /// its w inner steps; each inner transfer before its step's block.
  void walk_ring(const Tensor& own_kv,
                 const std::function<void(int src, int step, int i, const Tensor& kv)>& visit) {
    const int W = me() / w(), pos = me() % w();
    const std::uint64_t kv_bytes = own_kv.nbytes();
    Tensor blk = own_kv;
    int step = 0;
    for (int o = 0; o < nw(); ++o) {
      Tensor round_start = blk, next_round;
      Transfer outer;
      const bool has_outer = o + 1 < nw();
      if (has_outer) {
        next_round = alloc(rank, own_kv.shape(), p.dtype);
        outer = exchange(false, W, round_start, member(W + 1, pos), next_round, member(W - 1, pos));
        self.transfers_.push_back({w() > 1 ? "kv outer" : "kv ring", o, kv_bytes, 1});
      }
      Tensor cur = round_start;
      for (int i = 0; i < w(); ++i, ++step) {
        Tensor nxt;
        Transfer inner;
        const bool has_inner = i + 1 < w();
        if (has_inner) {
          nxt = alloc(rank, own_kv.shape(), p.dtype);
          inner = exchange(true, pos, cur, member(W, pos + 1), nxt, member(W, pos - 1));
          self.transfers_.push_back({"kv inner", step, kv_bytes, 1});
        }
        visit(member(W - o, pos - i), step, i, cur);
        if (has_inner) {
          inner.wait();
          cur = nxt;
        }
      }
      if (has_outer) {
        outer.wait();
        blk = next_round;
      }
    }
  }

  /// Kernel layout -> SBH storage ([B, heads, S, D] -> [S, B, heads·D]; a no-op for SBH).
  Tensor to_storage(const Tensor& x, std::int64_t heads) {
    if (layout == Layout::sbh) return x;
    Tensor y = alloc(rank, {x.size(2), p.batch, heads * p.head_dim}, p.dtype);
    const std::int64_t d = p.head_dim;
    on_compute(rank, "to SBH", 2 * x.nbytes(),
               [=] { y.copy_from(convert_layout(x, Layout::bnsd, Layout::sbh, heads, d)); });
    return y;
  }

  /// Launches the attention work on one KV block (a packed K|V message) on the compute stream,
  /// priced by its visible part (4 FLOPs per pair and head dimension forward, 10 backward);
  /// `fn(args, k, v)` runs with the positions bound.
  template <class Fn>
  void launch_block(bool backward, int step, const AttentionArgs& a, const Visibility& vis,
                    const std::vector<std::int64_t>& q_pos, const std::vector<std::int64_t>& k_pos,
                    const Tensor& kv, Fn fn) {
    const char* pass = backward ? "bwd" : "fwd";
    const double flops = (backward ? 10.0 : 4.0) * double(vis.pairs) * double(D);
    auto qp = std::make_shared<std::vector<std::int64_t>>(q_pos);
    auto kp = std::make_shared<std::vector<std::int64_t>>(k_pos);
    rank.compute_stream().launch({.name = fmt::format("attn {}[{}/{}] {}x{}", pass, step + 1, R(),
                                                      a.shape.q_len, a.shape.kv_len),
                                  .cls = OpClass::compute,
                                  .work_ns = attention_ns(a, flops, vis, backward),
                                  .flops = std::uint64_t(flops),
                                  .hbm_bytes = std::uint64_t(attention_bytes(a, vis, backward))},
                                 [=, n = kv_elems(), shape = kv_shape()] {
                                   AttentionArgs aa = a;
                                   aa.q_pos = qp.get();
                                   aa.k_pos = kp.get();
                                   fn(aa, kv_part(kv, 0, n, shape), kv_part(kv, 1, n, shape));
                                 });
  }

  std::int64_t kv_elems() const {
    return B * self.kv_heads_local_ * std::int64_t(self.ring_pos_[0].size()) * D;
  }
  Shape kv_shape() const {
    const std::int64_t S = std::int64_t(self.ring_pos_[0].size());
    return layout == Layout::bnsd ? Shape{B, self.kv_heads_local_, S, D}
                                  : Shape{S, B, self.kv_heads_local_ * D};
  }
  Tensor part(const Tensor& packed, int i) const {
    return kv_part(packed, i, kv_elems(), kv_shape());
  }
};

CpAttention::CpAttention(Group& cp_group, const CpConfig& config, const AttentionProblem& problem)
    : cp_(cp_group), config_(config), problem_(problem) {
  COCEMU_CHECK_ARG(cp_group.is_member(), "CpAttention on rank {}: not a member of the cp group {}",
                   cp_group.owner().id(), cp_group.name());
  COCEMU_CHECK_ARG(config.context_parallel_size == cp_group.size(),
                   "context_parallel_size = {} but the cp group {} has {} ranks",
                   config.context_parallel_size, cp_group.name(), cp_group.size());
  validate(config, problem);
  Rank& rank = cp_group.owner();
  COCEMU_CHECK_ARG(!rank.numerics() || problem.dtype == DType::f32 || problem.dtype == DType::f64,
                   "attention numerics run in f32 or f64, got {} (bf16/f16 are for --dry-run)",
                   name_of(problem.dtype));
  cp_size_ = cp_group.size();
  u_ = ulysses_degree_of(config);
  ring_size_ = cp_size_ / u_;
  window_ = config.cp_window_size;
  mask_.kind = is_causal(config) ? MaskKind::causal : MaskKind::general;
  mask_.general = problem.general_mask;
  const int me = cp_group.rank();
  positions_ = token_positions(config, problem.seq, me);
  // Sub-groups: Ulysses over consecutive cp ranks, the ring over ranks with the same Ulysses index.
  if (u_ == cp_size_) {
    ulysses_ = cp_group;
    ring_ = split(cp_group, me, 0);
  } else if (u_ == 1) {
    ulysses_ = split(cp_group, me, 0);
    ring_ = cp_group;
  } else {
    ulysses_ = split(cp_group, me / u_, me);
    ring_ = split(cp_group, me % u_, me);
  }
  // The ring's communicators, as MindSpeed's AttentionWithCp builds its RingP2P objects: the
  // outer ring on cp_group plus, with use_cp_send_recv_overlap, cp_group_for_send_recv_overlap;
  // the inner ring of a double ring on cp_group_for_intra_window (and its overlap twin). Each
  // communicator beyond the first has its stream, as a PyTorch process group does, so its
  // transfers overlap the others'.
  // They are made once per rank and CP configuration, as MindSpeed builds its groups once: an
  // attention layer called every step reuses them (and their streams).
  if (ring_size_ > 1) {
    const bool two = config.use_cp_send_recv_overlap;
    struct Communicators {
      bool made = false;
      Group overlap, inner, inner_overlap;
    };
    const auto comms =
        rank.world().shared<Communicators>(fmt::format("cp-communicators/{}/{}/u{}/w{}/{}",
                                                       rank.id(), cp_group.key(), u_, window_, two),
                                           [] { return std::make_shared<Communicators>(); });
    if (!comms->made) {  // every ring member takes this branch at the same call (split is
                         // collective)
      auto communicator = [&](const char* stream) {
        Group g = split(ring_, 0, ring_.rank());
        g.set_stream(rank.new_stream(stream));
        return g;
      };
      if (two) comms->overlap = communicator("cp send/recv overlap");
      if (window_ > 1) {
        comms->inner = communicator("cp intra-window");
        if (two) comms->inner_overlap = communicator("cp intra-window overlap");
      }
      comms->made = true;
    }
    outer_[0] = ring_;
    outer_[1] = two ? comms->overlap : ring_;
    if (window_ > 1) {
      inner_[0] = comms->inner;
      inner_[1] = two ? comms->inner_overlap : inner_[0];
    }
  }
  for (int j = 0; j < ring_size_; ++j) {  // tokens of ring member j after the Ulysses all_to_all
    std::vector<std::int64_t> t;
    for (int i = 0; i < u_; ++i) {
      const auto s = token_positions(config, problem.seq, j * u_ + i);
      t.insert(t.end(), s.begin(), s.end());
    }
    ring_pos_.push_back(std::move(t));
  }
  kv_repeated_ = u_ > 1 && problem.kv_heads % u_ != 0;
  kv_heads_local_ = kv_repeated_ ? problem.heads / u_ : problem.kv_heads / u_;
}

CpAttention::Outputs CpAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v) {
  Rank& rank = cp_.owner();
  const AttentionProblem& p = problem_;
  const std::int64_t S = std::int64_t(positions_.size());
  const std::int64_t kvh = kv_repeated_ ? p.heads : p.kv_heads;
  for (auto [t, heads, name] :
       {std::tuple{&q, p.heads, "q"}, {&k, p.kv_heads, "k"}, {&v, p.kv_heads, "v"}})
    COCEMU_CHECK_ARG(t->ndim() == 3 && t->size(0) == S && t->size(1) == p.batch &&
                         t->size(2) == heads * p.head_dim && t->dtype() == p.dtype,
                     "CpAttention::forward on rank {}: {} is {}, expected {}[{}, {}, {}] (SBH: "
                     "local tokens, batch, heads·head_dim)",
                     rank.id(), name, t->describe(), name_of(p.dtype), S, p.batch,
                     heads * p.head_dim);
  transfers_.clear();
  Impl im{*this,   rank,      p, config_.megatron_cp_in_bnsd ? Layout::bnsd : Layout::sbh,
          p.batch, p.head_dim};
  // 1. Ulysses: sequence shards -> head shards (KV repeated first when it cannot be sharded).
  Tensor qh = q, kh = k, vh = v;
  if (u_ > 1) {
    qh = im.seq_to_head(q, p.heads, p.head_dim, "q");
    kh = im.seq_to_head(kv_repeated_ ? im.repeat_kv(k) : k, kvh, p.head_dim, "k");
    vh = im.seq_to_head(kv_repeated_ ? im.repeat_kv(v) : v, kvh, p.head_dim, "v");
  }
  const std::int64_t hq = p.heads / u_, hk = kv_heads_local_;
  // 2. Kernel layout.
  const Layout layout = im.layout;
  auto to_kernel = [&](const Tensor& x, std::int64_t heads) {
    if (layout == Layout::sbh) return x;
    Tensor y = alloc(rank, {p.batch, heads, x.size(0), p.head_dim}, p.dtype);
    on_compute(rank, "to BNSD", 2 * x.nbytes(), [=] {
      y.copy_from(convert_layout(x, Layout::sbh, Layout::bnsd, heads, p.head_dim));
    });
    return y;
  };
  q_ = to_kernel(qh, hq);
  const int me = ring_.rank();
  Tensor kv = alloc(rank, {2 * im.kv_elems()}, p.dtype);
  {
    Tensor kk = to_kernel(kh, hk), vk = to_kernel(vh, hk);
    const std::int64_t n = im.kv_elems();
    const Shape shape = im.kv_shape();
    on_compute(rank, "pack kv", 2 * kv.nbytes(), [=] {
      kv_part(kv, 0, n, shape).copy_from(kk);
      kv_part(kv, 1, n, shape).copy_from(vk);
    });
    k_ = kk;
    v_ = vk;
  }
  const std::int64_t Sp = std::int64_t(ring_pos_[std::size_t(me)].size());
  out_ = layout == Layout::bnsd ? alloc(rank, {p.batch, hq, Sp, p.head_dim}, p.dtype)
                                : alloc(rank, {Sp, p.batch, hq * p.head_dim}, p.dtype);
  lse_ = alloc(rank, {p.batch, hq, Sp}, p.dtype);
  {
    Tensor lse = lse_;
    on_compute(rank, "init lse", lse.nbytes(), [=] {
      visit_dtype(lse.dtype(), [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_floating_point_v<T>)
          std::fill(lse.data<T>(), lse.data<T>() + lse.numel(),
                    -std::numeric_limits<T>::infinity());
      });
    });
  }
  // 3. (Double) ring over the ring group: partial attention per KV block, merged by LSE.
  im.walk_ring(kv, [&](int src, int step, int, const Tensor& cur) {
    const auto a = im.args(hq, hk, ring_pos_[std::size_t(me)], ring_pos_[std::size_t(src)]);
    const Visibility vis = visibility(a);
    if (vis.pairs == 0) return;  // fully masked block: skipped
    Tensor out = out_, lse = lse_;
    im.launch_block(false, step, a, vis, ring_pos_[std::size_t(me)], ring_pos_[std::size_t(src)],
                    cur,
                    [q = q_, out, lse](const AttentionArgs& aa, const Tensor& k, const Tensor& v) {
                      Tensor ob = Tensor::zeros(out.shape(), out.dtype()),
                             lb = Tensor::zeros(lse.shape(), lse.dtype());
                      attention_forward(aa, q, k, v, ob, lb);
                      merge_partial(aa, out, lse, ob, lb);
                    });
  });
  // 4. Back to storage layout and sequence shards.
  Outputs result;
  Tensor out_s = im.to_storage(out_, hq);
  // LSE [B, hq, Sp] -> [Sp, B, hq] so it can travel like a tensor with head_dim 1.
  Tensor lse_s = alloc(rank, {Sp, p.batch, hq}, p.dtype);
  {
    Tensor src = lse_;
    emulator_only(rank, "lse to SBH", [=] {
      lse_s.copy_from(
          convert_layout(src.reshape({p.batch, hq, Sp, 1}), Layout::bnsd, Layout::sbh, hq, 1)
              .reshape(lse_s.shape()));
    });
  }
  if (u_ > 1) {
    out_s = im.head_to_seq(out_s, p.heads, p.head_dim, "out");
    lse_s = im.head_to_seq(lse_s, p.heads, 1, "lse", true);
  }
  result.out = out_s;
  result.lse = alloc(rank, {p.batch, p.heads, S}, p.dtype);
  {
    Tensor dst = result.lse, src = lse_s;
    emulator_only(rank, "lse to BNS", [=] {
      dst.copy_from(
          convert_layout(src.reshape({S, p.batch, p.heads}), Layout::sbh, Layout::bnsd, p.heads, 1)
              .reshape(dst.shape()));
    });
  }
  rank.compute_stream().synchronize();
  return result;
}

CpAttention::Grads CpAttention::backward(const Tensor& dout) {
  Rank& rank = cp_.owner();
  const AttentionProblem& p = problem_;
  COCEMU_CHECK_ARG(out_.defined(), "CpAttention::backward on rank {} before forward", rank.id());
  const std::int64_t S = std::int64_t(positions_.size());
  COCEMU_CHECK_ARG(dout.ndim() == 3 && dout.size(0) == S && dout.size(1) == p.batch &&
                       dout.size(2) == p.heads * p.head_dim && dout.dtype() == p.dtype,
                   "CpAttention::backward on rank {}: dout is {}, expected {}[{}, {}, {}]",
                   rank.id(), dout.describe(), name_of(p.dtype), S, p.batch, p.heads * p.head_dim);
  transfers_.clear();
  Impl im{*this,   rank,      p, config_.megatron_cp_in_bnsd ? Layout::bnsd : Layout::sbh,
          p.batch, p.head_dim};
  const Layout layout = im.layout;
  const std::int64_t hq = p.heads / u_, hk = kv_heads_local_;
  Tensor doh = u_ > 1 ? im.seq_to_head(dout, p.heads, p.head_dim, "dout") : dout;
  Tensor dok = doh;
  if (layout == Layout::bnsd) {
    dok = alloc(rank, {p.batch, hq, doh.size(0), p.head_dim}, p.dtype);
    on_compute(rank, "to BNSD", 2 * doh.nbytes(), [=] {
      dok.copy_from(convert_layout(doh, Layout::sbh, Layout::bnsd, hq, p.head_dim));
    });
  }
  const int me = ring_.rank();
  const auto& mypos = ring_pos_[std::size_t(me)];
  const auto a_self = im.args(hq, hk, mypos, mypos);
  Tensor delta = alloc(rank, {p.batch, hq, std::int64_t(mypos.size())}, p.dtype);
  {
    Tensor out = out_;
    const AttentionArgs a = a_self;
    auto pos = std::make_shared<std::vector<std::int64_t>>(mypos);
    on_compute(rank, "attn delta", 2 * out.nbytes(), [=] {
      AttentionArgs aa = a;
      aa.q_pos = aa.k_pos = pos.get();
      delta.copy_from(attention_delta(aa, out, dok));
    });
  }
  Tensor dq = alloc(rank, q_.shape(), p.dtype);
  Tensor kv = alloc(rank, {2 * im.kv_elems()}, p.dtype);
  {
    Tensor kk = k_, vv = v_;
    const std::int64_t n = im.kv_elems();
    const Shape shape = im.kv_shape();
    on_compute(rank, "pack kv", 2 * kv.nbytes(), [=] {
      kv_part(kv, 0, n, shape).copy_from(kk);
      kv_part(kv, 1, n, shape).copy_from(vv);
    });
  }
  const int R = ring_size_, w = window_, W = me / w, pos = me % w;
  // dK|dV of the block in hand travel with it, as in MindSpeed's backward
  // (ring_context_parallel.py, AttentionWithCp.backward): step t computes its block's contribution,
  // then waits for the block's accumulator from the rank that held it at step t − 1, adds, and
  // posts it on — so each dK/dV transfer hides behind the next block's kernel. It moves to the
  // inner neighbour, or diagonally to the next window at the end of a window (where that block
  // starts the next round), and finally to the block's owner.
  const std::int64_t kv_n = 2 * im.kv_elems();
  Tensor acc, incoming;
  Impl::Transfer pending;
  im.walk_ring(kv, [&](int src, int step, int i, const Tensor& cur) {
    const auto a = im.args(hq, hk, mypos, ring_pos_[std::size_t(src)]);
    const Visibility vis = visibility(a);
    Tensor part = alloc(rank, {kv_n}, p.dtype);
    if (vis.pairs > 0) {
      const Tensor dk_part = im.part(part, 0), dv_part = im.part(part, 1);
      im.launch_block(true, step, a, vis, mypos, ring_pos_[std::size_t(src)], cur,
                      [q = q_, lse = lse_, dok, delta, dq, dk_part, dv_part](
                          const AttentionArgs& aa, const Tensor& k, const Tensor& v) {
                        attention_backward(aa, q, k, v, dok, lse, delta, dq, dk_part, dv_part);
                      });
    }
    if (step == 0) {
      acc = part;
    } else {
      pending.wait();
      acc = incoming;
      on_compute(rank, "dkv add", 3 * part.nbytes(), [acc, part] { add_into(acc, part); });
    }
    if (R == 1) return;
    const bool in_window = i + 1 < w;
    const int to = in_window ? im.member(W, pos + 1) : im.member(W + 1, pos + 1);
    const int from = in_window ? im.member(W, pos - 1) : im.member(W - 1, pos - 1);
    incoming = alloc(rank, {kv_n}, p.dtype);
    pending = im.exchange(in_window, in_window ? pos : W, acc, to, incoming, from);
    transfers_.push_back({"dkv", step, acc.nbytes(), 1});
  });
  if (R > 1) {  // the last block's dK/dV reach their owner: nothing left to hide behind
    pending.wait();
    acc = incoming;
  }
  // acc now holds this rank's own block's dK, dV.
  Tensor dk_k = im.part(acc, 0), dv_k = im.part(acc, 1);
  Tensor dq_s = im.to_storage(dq, hq), dk_s = im.to_storage(dk_k, hk),
         dv_s = im.to_storage(dv_k, hk);
  const std::int64_t kvh = kv_repeated_ ? p.heads : p.kv_heads;
  if (u_ > 1) {
    dq_s = im.head_to_seq(dq_s, p.heads, p.head_dim, "dq");
    dk_s = im.head_to_seq(dk_s, kvh, p.head_dim, "dk");
    dv_s = im.head_to_seq(dv_s, kvh, p.head_dim, "dv");
    if (kv_repeated_) {
      dk_s = im.fold_kv(dk_s);
      dv_s = im.fold_kv(dv_s);
    }
  }
  rank.compute_stream().synchronize();
  return {dq_s, dk_s, dv_s};
}

}  // namespace cocemu::attn
