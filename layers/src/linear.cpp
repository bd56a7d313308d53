#include "cocemu/layers/linear.h"

#include <iostream>

#include "cocemu/runtime/cost_model.h"

#include "cocemu/collectives/ops.h"
#include "cocemu/layers/detail/kernels.h"
#include "cocemu/layers/detail/mappings.h"
#include "cocemu/layers/fused_kernels.h"
#include "cocemu/runtime/error.h"

namespace cocemu::layers {

using detail::alloc;
using detail::alloc_out;
using detail::matmul;

LinearOptions options_for(const CocConfig& c, std::int64_t m, std::int64_t k, std::int64_t n) {
  const CocChoice ch = choose(c, m, k, n);
  return options_for(c, ch.strategy, ch.parallel_num);
}

LinearOptions options_for(const CocConfig& c, Strategy strategy, int parallel_num) {
  LinearOptions o;
  o.strategy = strategy;
  o.parallel_num = parallel_num;
  o.tile_rows = c.tile_rows;
  o.tiles_per_step = c.tiles_per_step;
  o.recompute_all_gather = c.recompute_all_gather;
  o.enable_coc_in_column_backward = c.enable_coc_in_column_backward;
  o.matmul_soc_friendly = c.matmul_soc_friendly;
  o.k_min = c.k_min;
  o.k_max = c.k_max;
  return o;
}

CocConfig switches_of(const LinearOptions& o) {
  CocConfig c;
  c.tile_rows = o.tile_rows;
  c.tiles_per_step = o.tiles_per_step;
  c.recompute_all_gather = o.recompute_all_gather;
  c.enable_coc_in_column_backward = o.enable_coc_in_column_backward;
  c.matmul_soc_friendly = o.matmul_soc_friendly;
  c.k_min = o.k_min;
  c.k_max = o.k_max;
  return c;
}

namespace {

/// `o`, or with a per-shape config what it picks for this op's [m, k, n] (the label is kept).
LinearOptions resolve(const LinearOptions& o, std::int64_t m, std::int64_t k, std::int64_t n) {
  if (!o.per_shape) return o;
  LinearOptions r = options_for(*o.per_shape, m, k, n);
  r.label = o.label;
  r.gradient_accumulation_fusion = o.gradient_accumulation_fusion;  // Megatron's, not CoC's
  return r;
}

/// The chunk count a script strategy really uses: the largest of {8, 4, 2, 1} not above the
/// requested P that divides `rows`.
int effective_chunks(int requested, std::int64_t rows) {
  COCEMU_CHECK_ARG(requested == 1 || requested == 2 || requested == 4 || requested == 8,
                   "parallel_num = {}; allowed 1, 2, 4, 8", requested);
  for (int p = requested; p > 1; p /= 2)
    if (rows % p == 0) return p;
  return 1;
}

FusedOptions fused_options(const LinearOptions& o, const Rank& rank) {
  return {o.tile_rows, o.tiles_per_step, rank.deterministic(),
          o.label.empty() ? "" : o.label + " "};
}

std::string name(const LinearOptions& o, const std::string& what) {
  return o.label.empty() ? what : o.label + " " + what;
}

/// A collective's label suffix for the op `what` (" label what").
std::string comm_label(const LinearOptions& o, const std::string& what) {
  return fmt::format(" {}", name(o, what));
}

/// MindSpeed's matmul_soc_friendly (get_aligned_mm_inputs, called by the coc_parallel_linears_*
/// functions before they split) for a script op of P > 1 chunks over an [m, k]·[k, n] product,
/// m as MindSpeed computes it. Launches the operand copies it makes on every call — the weight
/// to column-major (`right.t().contiguous().t()`), or both operands zero-padded along k — and
/// returns how the chunks' GEMMs are priced. The numerics keep the original operands: the
/// products are the same. `local_rows`: rows of the left operand this rank pads.
detail::SocPricing soc_prepare(Rank& rank, const LinearOptions& o, int P, std::int64_t m,
                               std::int64_t local_rows, std::int64_t k, std::int64_t n, DType t,
                               bool weight_col_major) {
  const std::size_t e = size_of(t);
  const SocFriendly s = soc_friendly(switches_of(o), m, k, n, P, e, weight_col_major);
  const DeviceProfile& p = rank.profile();
  if (s.transpose_weight) {
    rank.current_stream().launch({.name = name(o, fmt::format("soc-friendly weight {}x{} to "
                                                              "column-major",
                                                              k, n)),
                                  .cls = OpClass::compute,
                                  .work_ns = memory_ns(p, 2 * std::uint64_t(k * n) * e),
                                  .hbm_bytes = 2 * std::uint64_t(k * n) * e},
                                 [] {});
    return {true, 0};
  }
  if (s.padded_k != k) {
    const std::uint64_t elems = std::uint64_t((local_rows + n) * (k + s.padded_k));
    rank.current_stream().launch(
        {.name = name(o, fmt::format("soc-friendly pad k {} -> {}", k, s.padded_k)),
         .cls = OpClass::compute,
         .work_ns = memory_ns(p, elems * e),
         .hbm_bytes = elems * e},
        [] {});
    return {false, s.padded_k};
  }
  return {};
}

/// all_gather of row blocks: [m/ws, k] on every rank -> [m, k] rank-major. Script: P chunks,
/// comm first, each chunk's matmul overlapping the next chunk's gather; the gathered chunks
/// arrive as [P, ws, per] and are reordered back to [ws, P, per] (MindSpeed's
/// shuffle_as_coc_reduce_scatter). Fills `out` = gathered · op(w). Returns the gathered input in
/// rank-major order if `keep_gathered`; otherwise an undefined tensor, and the script path skips
/// the gathered input's reorder, as MindSpeed reorders it only when it is kept.
Tensor gather_then_matmul(Group& g, const Tensor& x, const Tensor& w, bool trans_w,
                          const Tensor& out, const LinearOptions& o, const std::string& what,
                          bool keep_gathered) {
  Rank& rank = g.owner();
  const int ws = g.size();
  const std::int64_t ml = x.size(0), k = x.size(1), m = ml * ws;
  Tensor full = alloc_out(rank, {m, k}, x.dtype());
  if (o.strategy == Strategy::fused) {
    all_gather_matmul(g, x, w, trans_w, Tensor(), out, full, fused_options(o, rank));
    return full;
  }
  const int P = o.strategy == Strategy::script ? effective_chunks(o.parallel_num, ml) : 1;
  if (P == 1 && o.strategy == Strategy::serial) {
    all_gather(g, full, x, {.label = fmt::format(" {}", name(o, what))});
    matmul(rank, name(o, what + " matmul"), full, false, w, trans_w, out);
    return full;
  }
  const std::int64_t per = ml / P, n = out.size(1);
  const detail::SocPricing soc = soc_prepare(rank, o, P, m, ml, k, n, x.dtype(), trans_w);
  Tensor gathered = alloc_out(rank, {m, k}, x.dtype());  // [P, ws, per] rows
  Tensor shuffled = alloc_out(rank, {m, n}, out.dtype());
  const auto wop = std::make_shared<const detail::WeightOperand>(w, trans_w, rank.deterministic());
  std::vector<Work> works;
  for (int i = 0; i <= P; ++i) {
    if (i < P)
      works.push_back(all_gather(
          g, gathered.rows(i * ws * per, (i + 1) * ws * per), x.rows(i * per, (i + 1) * per),
          {.async_op = true, .label = fmt::format("[{}/{}] {}", i + 1, P, name(o, what))}));
    if (i > 0) {
      works[std::size_t(i - 1)].wait();
      matmul(rank, fmt::format("{}[{}/{}]", name(o, what + " matmul"), i, P),
             gathered.rows((i - 1) * ws * per, i * ws * per), wop,
             shuffled.rows((i - 1) * ws * per, i * ws * per), soc);
    }
  }
  detail::shuffle_rows(rank, shuffled, out, P, ws);
  if (!keep_gathered) return Tensor();
  detail::shuffle_rows(rank, gathered, full, P, ws);
  return full;
}

}  // namespace

namespace {

/// Rebinds a parameter to views of contiguous buffers (see ColumnParallelLinear::bind).
void bind_views(const Rank& rank, const char* what, Tensor& weight, Tensor& main_grad,
                const Tensor& new_weight, const Tensor& new_grad) {
  COCEMU_CHECK_ARG(new_weight.shape() == weight.shape() && new_weight.dtype() == weight.dtype() &&
                       new_grad.shape() == weight.shape() && new_grad.dtype() == main_grad.dtype(),
                   "{}::bind on rank {}: weight {} and grad {} must be {}[{}] and {}[{}]", what,
                   rank.id(), new_weight.describe(), new_grad.describe(), name_of(weight.dtype()),
                   weight.shape().str(), name_of(main_grad.dtype()), weight.shape().str());
  if (rank.numerics()) new_weight.copy_from(weight);
  weight = new_weight;
  main_grad = new_grad;
}

}  // namespace

void ColumnParallelLinear::bind(const Tensor& weight, const Tensor& grad) {
  bind_views(tp_.owner(), "ColumnParallelLinear", weight_, main_grad_, weight, grad);
}

void RowParallelLinear::bind(const Tensor& weight, const Tensor& grad) {
  bind_views(tp_.owner(), "RowParallelLinear", weight_, main_grad_, weight, grad);
}

// ---------------------------------------------------------------------------------------------
// ColumnParallelLinear

ColumnParallelLinear::ColumnParallelLinear(Group& tp, Tensor weight, Tensor bias,
                                           bool sequence_parallel, bool gather_output)
    : tp_(tp),
      weight_(std::move(weight)),
      bias_(std::move(bias)),
      sp_(sequence_parallel),
      gather_output_(gather_output) {
  COCEMU_CHECK_ARG(tp.is_member(), "ColumnParallelLinear on rank {}: not in the TP group {}",
                   tp.owner().id(), tp.name());
  COCEMU_CHECK_ARG(weight_.ndim() == 2, "ColumnParallelLinear: weight {} must be [n/tp, k]",
                   weight_.describe());
  COCEMU_CHECK_ARG(!bias_.defined() || (bias_.ndim() == 1 && bias_.size(0) == weight_.size(0) &&
                                        bias_.dtype() == weight_.dtype()),
                   "ColumnParallelLinear: bias {} must be [{}] of {}", bias_.describe(),
                   weight_.size(0), name_of(weight_.dtype()));
  COCEMU_CHECK_ARG(!(sp_ && gather_output_),
                   "ColumnParallelLinear: gather_output is not allowed "
                   "with sequence_parallel (Megatron asserts the same)");
  const Rank& r = tp.owner();
  main_grad_ = alloc(r, weight_.shape(), detail::grad_dtype(weight_.dtype()));
  if (bias_.defined()) bias_grad_ = alloc(r, bias_.shape(), DType::f32);
}

Tensor ColumnParallelLinear::forward(const Tensor& x, const LinearOptions& o_in) {
  Rank& rank = tp_.owner();
  const int ws = tp_.size();
  const std::int64_t k = weight_.size(1), nl = weight_.size(0);
  COCEMU_CHECK_ARG(x.ndim() == 2 && x.size(1) == k && x.dtype() == weight_.dtype(),
                   "ColumnParallelLinear::forward on rank {}: x {} must be [m, {}] of {}",
                   rank.id(), x.describe(), k, name_of(weight_.dtype()));
  const std::int64_t m = sp_ ? x.size(0) * ws : x.size(0);
  const LinearOptions o = resolve(o_in, m, k, nl);
  Tensor y = alloc_out(rank, {m, nl}, x.dtype());
  if (!sp_) {
    matmul(rank, name(o, "column fwd matmul"), x, false, weight_, true, y);
    saved_input_ = x;
    saved_is_gathered_ = false;
  } else {
    Tensor full = gather_then_matmul(tp_, x, weight_, true, y, o, "column fwd all_gather",
                                     !o.recompute_all_gather);
    saved_input_ = o.recompute_all_gather ? x : full;
    saved_is_gathered_ = !o.recompute_all_gather;
  }
  detail::add_bias(rank, y, bias_);
  if (!gather_output_) return y;
  // gather_output: all_gather the column blocks and place them side by side.
  Tensor blocks = alloc_out(rank, {ws * m, nl}, x.dtype()),
         wide = alloc_out(rank, {m, ws * nl}, x.dtype());
  all_gather(tp_, blocks, y, {.label = comm_label(o, "gather_output")});
  for (int r = 0; r < ws; ++r)
    detail::copy_columns(rank, blocks.rows(r * m, (r + 1) * m), wide, r * nl, true);
  return wide;
}

Tensor ColumnParallelLinear::backward(const Tensor& dy_in, const LinearOptions& o_in) {
  Rank& rank = tp_.owner();
  const int ws = tp_.size();
  COCEMU_CHECK_ARG(saved_input_.defined(),
                   "ColumnParallelLinear::backward on rank {} before forward", rank.id());
  const std::int64_t k = weight_.size(1), nl = weight_.size(0);
  Tensor dy = dy_in;
  if (gather_output_) {  // take this rank's column block of the full gradient
    dy = alloc_out(rank, {dy_in.size(0), nl}, dy_in.dtype());
    detail::copy_columns(rank, dy, dy_in, tp_.rank() * nl, false);
  }
  const std::int64_t m = dy.size(0);
  COCEMU_CHECK_ARG(dy.ndim() == 2 && dy.size(1) == nl,
                   "ColumnParallelLinear::backward on rank {}: dy {} must be [m, {}]", rank.id(),
                   dy.describe(), nl);
  const LinearOptions o = resolve(o_in, m, nl, k);
  Tensor dx_full = alloc_out(rank, {m, k}, dy.dtype());
  Tensor x_full = saved_input_;
  // As Megatron's LinearWithGradAccumulationAndAsyncCommunication.backward and MindSpeed's
  // RewriteColumnSeqParallelFunction.backward, in every strategy: the input re-gather runs async
  // beside the grad-input GEMM and is waited for right after it; the grad-input reduction is then
  // issued async, the weight gradient runs, and only then is the reduction waited for.
  Work gather_work, reduce_work;
  if (sp_ && !saved_is_gathered_) {  // recompute_all_gather: re-gather the input (async)
    x_full = alloc_out(rank, {m, k}, dy.dtype());
    gather_work = all_gather(tp_, x_full, saved_input_,
                             {.async_op = true, .label = comm_label(o, "column bwd re-gather")});
  }
  Tensor dx;
  if (!sp_) {
    matmul(rank, name(o, "column bwd grad-input matmul"), dy, false, weight_, false, dx_full);
    reduce_work = detail::reduce_over_tp(tp_, dx_full,
                                         {.async_op = true, .label = comm_label(o, "column bwd")});
    dx = dx_full;
  } else if (o.strategy == Strategy::fused && o.enable_coc_in_column_backward) {
    dx = alloc_out(rank, {m / ws, k}, dy.dtype());
    matmul_reduce_scatter(tp_, dy, weight_, false, Tensor(), dx,
                          fused_options(o, rank));  // dX = RS(dY · W)
    gather_work.wait();
  } else {
    matmul(rank, name(o, "column bwd grad-input matmul"), dy, false, weight_, false, dx_full);
    gather_work.wait();
    dx = alloc_out(rank, {m / ws, k}, dy.dtype());
    reduce_work =
        reduce_scatter(tp_, dx, dx_full, {.async_op = true, .label = comm_label(o, "column bwd")});
  }
  // Weight gradient (not split), overlapping the grad-input reduction.
  detail::weight_grad(rank, name(o, "column bwd wgrad"), dy, x_full, main_grad_,
                      o.gradient_accumulation_fusion);
  detail::bias_grad(rank, bias_grad_, dy);
  reduce_work.wait();
  return dx;
}

// ---------------------------------------------------------------------------------------------
// RowParallelLinear

RowParallelLinear::RowParallelLinear(Group& tp, Tensor weight, Tensor bias, bool sequence_parallel,
                                     bool input_is_parallel)
    : tp_(tp),
      weight_(std::move(weight)),
      bias_(std::move(bias)),
      sp_(sequence_parallel),
      input_is_parallel_(input_is_parallel) {
  COCEMU_CHECK_ARG(tp.is_member(), "RowParallelLinear on rank {}: not in the TP group {}",
                   tp.owner().id(), tp.name());
  COCEMU_CHECK_ARG(weight_.ndim() == 2, "RowParallelLinear: weight {} must be [n, k/tp]",
                   weight_.describe());
  COCEMU_CHECK_ARG(!bias_.defined() || (bias_.ndim() == 1 && bias_.size(0) == weight_.size(0) &&
                                        bias_.dtype() == weight_.dtype()),
                   "RowParallelLinear: bias {} must be [{}] of {}", bias_.describe(),
                   weight_.size(0), name_of(weight_.dtype()));
  COCEMU_CHECK_ARG(!(sp_ && !input_is_parallel_),
                   "RowParallelLinear: sequence_parallel needs "
                   "input_is_parallel (Megatron asserts the same)");
  const Rank& r = tp.owner();
  main_grad_ = alloc(r, weight_.shape(), detail::grad_dtype(weight_.dtype()));
  if (bias_.defined()) bias_grad_ = alloc(r, bias_.shape(), DType::f32);
}

Tensor RowParallelLinear::forward(const Tensor& x_in, const LinearOptions& o_in) {
  Rank& rank = tp_.owner();
  const int ws = tp_.size();
  const std::int64_t n = weight_.size(0), kl = weight_.size(1);
  Tensor x = x_in;
  if (!input_is_parallel_) {  // scatter the input's columns: take this rank's k/tp block
    COCEMU_CHECK_ARG(x_in.ndim() == 2 && x_in.size(1) == kl * ws,
                     "RowParallelLinear::forward on rank {}: x {} must be [m, {}]", rank.id(),
                     x_in.describe(), kl * ws);
    x = alloc_out(rank, {x_in.size(0), kl}, x_in.dtype());
    detail::copy_columns(rank, x, x_in, tp_.rank() * kl, false);
  }
  COCEMU_CHECK_ARG(x.ndim() == 2 && x.size(1) == kl && x.dtype() == weight_.dtype(),
                   "RowParallelLinear::forward on rank {}: x {} must be [m, {}] of {}", rank.id(),
                   x.describe(), kl, name_of(weight_.dtype()));
  saved_input_ = x;
  const std::int64_t m = x.size(0);
  const LinearOptions o = resolve(o_in, m, kl, n);
  const FusedOptions fo = fused_options(o, rank);
  if (!sp_) {
    Tensor y = alloc_out(rank, {m, n}, x.dtype());
    if (o.strategy == Strategy::fused) {
      matmul_all_reduce(tp_, x, weight_, bias_, y, fo);
      return y;
    }
    const int P = o.strategy == Strategy::script ? effective_chunks(o.parallel_num, m) : 1;
    const std::int64_t per = m / P;
    // MindSpeed's COCRowAllReduceFunction passes sp_coef = tp here too.
    const detail::SocPricing soc = soc_prepare(rank, o, P, m * ws, m, kl, n, x.dtype(), true);
    const auto wop =
        std::make_shared<const detail::WeightOperand>(weight_, true, rank.deterministic());
    std::vector<Work> works;
    for (int i = 0; i < P;
         ++i) {  // compute first: chunk i's all_reduce overlaps chunk i+1's matmul
      const std::string tag =
          P > 1 || o.strategy == Strategy::script ? fmt::format("[{}/{}]", i + 1, P) : "";
      matmul(rank, name(o, "row fwd matmul") + tag, x.rows(i * per, (i + 1) * per), wop,
             y.rows(i * per, (i + 1) * per), soc);
      works.push_back(
          detail::reduce_over_tp(tp_, y.rows(i * per, (i + 1) * per),
                                 {.async_op = true, .label = tag + comm_label(o, "row fwd")}));
    }
    for (auto& w : works)
      w.wait();
    detail::add_bias(rank, y, bias_);
    return y;
  }
  COCEMU_CHECK_ARG(m % ws == 0,
                   "RowParallelLinear::forward on rank {} (sequence parallel): m = {} must be "
                   "divisible by the TP size {}",
                   rank.id(), m, ws);
  Tensor y = alloc_out(rank, {m / ws, n}, x.dtype());
  if (o.strategy == Strategy::fused) {
    matmul_reduce_scatter(tp_, x, weight_, true, bias_, y, fo);
    return y;
  }
  const int P = o.strategy == Strategy::script ? effective_chunks(o.parallel_num, m / ws) : 1;
  const std::int64_t per = m / ws / P;
  // Reorder the input [ws, P, per] -> [P, ws, per] so chunk i holds every rank's i-th sub-block.
  const detail::SocPricing soc = soc_prepare(rank, o, P, m, m, kl, n, x.dtype(), true);
  Tensor xs = x;
  if (P > 1) {
    xs = alloc_out(rank, x.shape(), x.dtype());
    detail::shuffle_rows(rank, x, xs, ws, P);
  }
  Tensor partial = alloc_out(rank, {m, n}, x.dtype());
  const auto wop =
      std::make_shared<const detail::WeightOperand>(weight_, true, rank.deterministic());
  std::vector<Work> works;
  for (int i = 0; i < P; ++i) {
    const std::string tag = o.strategy == Strategy::script ? fmt::format("[{}/{}]", i + 1, P) : "";
    matmul(rank, name(o, "row fwd matmul") + tag, xs.rows(i * ws * per, (i + 1) * ws * per), wop,
           partial.rows(i * ws * per, (i + 1) * ws * per), soc);
    works.push_back(reduce_scatter(tp_, y.rows(i * per, (i + 1) * per),
                                   partial.rows(i * ws * per, (i + 1) * ws * per),
                                   {.async_op = true, .label = tag + comm_label(o, "row fwd")}));
  }
  for (auto& w : works)
    w.wait();
  detail::add_bias(rank, y, bias_);
  return y;
}

Tensor RowParallelLinear::backward(const Tensor& dy, const LinearOptions& o_in) {
  Rank& rank = tp_.owner();
  const int ws = tp_.size();
  COCEMU_CHECK_ARG(saved_input_.defined(), "RowParallelLinear::backward on rank {} before forward",
                   rank.id());
  const std::int64_t n = weight_.size(0), kl = weight_.size(1), m = saved_input_.size(0);
  COCEMU_CHECK_ARG(dy.ndim() == 2 && dy.size(1) == n && dy.size(0) == (sp_ ? m / ws : m),
                   "RowParallelLinear::backward on rank {}: dy {} must be [{}, {}]", rank.id(),
                   dy.describe(), sp_ ? m / ws : m, n);
  const LinearOptions o = resolve(o_in, m, n, kl);
  Tensor dx = alloc_out(rank, {m, kl}, dy.dtype());
  Tensor dy_full = dy;
  if (!sp_) {
    matmul(rank, name(o, "row bwd grad-input matmul"), dy, false, weight_, false, dx);
  } else {
    dy_full = gather_then_matmul(tp_, dy, weight_, false, dx, o, "row bwd all_gather", true);
  }
  detail::weight_grad(rank, name(o, "row bwd wgrad"), dy_full, saved_input_, main_grad_,
                      o.gradient_accumulation_fusion);
  detail::bias_grad(rank, bias_grad_, dy);
  if (input_is_parallel_) return dx;
  // The input was scattered by columns: gather the gradient's column blocks.
  Tensor blocks = alloc_out(rank, {ws * m, kl}, dy.dtype()),
         wide = alloc_out(rank, {m, ws * kl}, dy.dtype());
  all_gather(tp_, blocks, dx, {.label = comm_label(o, "row bwd input gather")});
  for (int r = 0; r < ws; ++r)
    detail::copy_columns(rank, blocks.rows(r * m, (r + 1) * m), wide, r * kl, true);
  return wide;
}

std::string print_tensor_value(const std::string& label, const Tensor& t, int rank, int blocks,
                               int values) {
  COCEMU_CHECK_ARG(blocks >= 1 && t.ndim() >= 1, "print_tensor_value: blocks = {} must be >= 1",
                   blocks);
  std::string out;
  const std::int64_t rows = t.size(0), per = std::max<std::int64_t>(1, rows / blocks);
  for (int b = 0; b < blocks && b * per < rows; ++b) {
    const Tensor blk = t.rows(b * per, std::min(rows, (b + 1) * per));
    std::string vals;
    for (std::int64_t i = 0; i < std::min<std::int64_t>(values, blk.numel()); ++i)
      vals += fmt::format("{}{:.6g}", i ? ", " : "", blk.item(i));
    out += fmt::format("[rank {}] {} block {}/{}: [{}]\n", rank, label, b + 1, blocks, vals);
  }
  std::cout << out << std::flush;
  return out;
}

}  // namespace cocemu::layers
