#include "parts.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cocemu/collectives/ops.h"
#include "cocemu/layers/detail/kernels.h"
#include "cocemu/layers/detail/mappings.h"
#include "cocemu/runtime/cost_model.h"
#include "cocemu/runtime/error.h"

namespace cocemu::layers::train::detail {

using layers::detail::alloc;
using layers::detail::at;
using layers::detail::elementwise;
using layers::detail::set;

// ---------------------------------------------------------------------------------------------
// VocabEmbedding

VocabEmbedding::VocabEmbedding(Group& tp, const Tensor& full, bool sp) : tp_(tp), sp_(sp) {
  const Rank& rank = tp.owner();
  const std::int64_t vl = full.size(0) / tp.size();
  first_row_ = vl * tp.rank();
  weight_ = alloc(rank, {vl, full.size(1)}, full.dtype());
  grad_ = alloc(rank, weight_.shape(), layers::detail::grad_dtype(full.dtype()));
  if (rank.numerics()) weight_.copy_from(full.rows(first_row_, first_row_ + vl));
}

Tensor VocabEmbedding::forward(const std::shared_ptr<const Batch>& batch, std::int64_t rows) {
  Rank& rank = tp_.owner();
  const std::int64_t h = weight_.size(1), ws = tp_.size();
  Tensor local = alloc(rank, {rows, h}, weight_.dtype());
  elementwise(rank, "embedding lookup", 2 * local.nbytes(), [=, w = weight_, first = first_row_] {
    const std::int64_t vl = w.size(0);
    const std::size_t row_bytes = std::size_t(h) * size_of(w.dtype());
    for (std::int64_t i = 0; i < rows; ++i) {
      const std::int64_t id = batch->tokens[std::size_t(i)] - first;
      if (id < 0 || id >= vl) continue;  // another rank's rows: zeros
      std::memcpy(static_cast<char*>(local.raw()) + std::size_t(i) * row_bytes,
                  static_cast<const char*>(w.raw()) + std::size_t(id) * row_bytes, row_bytes);
    }
  });
  if (!sp_) {
    layers::detail::reduce_over_tp(tp_, local, {.label = "embedding"});
    return local;
  }
  Tensor out = alloc(rank, {rows / ws, h}, weight_.dtype());
  reduce_scatter(tp_, out, local, {.label = "embedding"});
  return out;
}

void VocabEmbedding::backward(const std::shared_ptr<const Batch>& batch, const Tensor& dy) {
  Rank& rank = tp_.owner();
  Tensor full = dy;
  if (sp_) {
    full = alloc(rank, {dy.size(0) * tp_.size(), dy.size(1)}, dy.dtype());
    all_gather(tp_, full, dy, {.label = "embedding grad"});
  }
  elementwise(rank, "embedding grad", 3 * full.nbytes(), [=, g = grad_, first = first_row_] {
    const std::int64_t vl = g.size(0), h = g.size(1);
    for (std::int64_t i = 0; i < full.size(0); ++i) {
      const std::int64_t id = batch->tokens[std::size_t(i)] - first;
      if (id < 0 || id >= vl) continue;
      for (std::int64_t j = 0; j < h; ++j)
        set(g, id * h + j, at(g, id * h + j) + at(full, i * h + j));
    }
  });
}

// ---------------------------------------------------------------------------------------------
// VocabLoss

struct VocabLoss::Saved {
  Tensor x, normed, rms, logits, row_max, target, sum_exp;
  ColumnParallelLinear::Saved head;
  std::shared_ptr<const Batch> batch;
};

VocabLoss::VocabLoss(Group& tp, const Tensor& head_shard, std::int64_t vocab_first, bool sp,
                     DType dtype, bool fused_cross_entropy)
    : tp_(tp),
      head_(std::make_unique<ColumnParallelLinear>(tp, head_shard, Tensor(), sp)),
      vocab_first_(vocab_first),
      sp_(sp),
      fused_(fused_cross_entropy),
      dtype_(dtype) {}

std::shared_ptr<VocabLoss::Saved> VocabLoss::forward(const Tensor& x,
                                                     const std::shared_ptr<const Batch>& batch,
                                                     const LinearOptions& o,
                                                     std::shared_ptr<double> loss) {
  Rank& rank = tp_.owner();
  auto s = std::make_shared<Saved>();
  s->x = x;
  s->batch = batch;
  s->normed = alloc(rank, x.shape(), dtype_);
  s->rms = alloc(rank, {x.size(0)}, DType::f64);
  layers::detail::rmsnorm(rank, x, s->normed, s->rms);
  LinearOptions lo = o;
  lo.label = "lm head";
  s->logits = head_->forward(s->normed, lo);  // [m, V/tp]
  s->head = head_->take_saved();
  const std::int64_t m = s->logits.size(0), vl = s->logits.size(1);
  // Megatron's vocab_parallel_cross_entropy, in f32 (f64 for f64 models), in its order: row max
  // and its all_reduce, then the target logit and the exp-sums, then their all_reduces (one
  // over both when fused). The numerics run in double, the same with or without fusion; the
  // price is the traffic of Megatron's kernels (CrossEntropyTraffic).
  const DType acc = dtype_ == DType::f64 ? DType::f64 : DType::f32;
  const CrossEntropyTraffic traffic(std::uint64_t(m) * std::uint64_t(vl), dtype_, acc, fused_);
  s->row_max = alloc(rank, {m}, acc);
  const Tensor target_and_sum = alloc(rank, {2 * m}, acc);
  s->target = target_and_sum.flat(0, m);
  s->sum_exp = target_and_sum.flat(m, 2 * m);
  elementwise(rank, "cross-entropy max", traffic.max, [s, m, vl] {
    for (std::int64_t i = 0; i < m; ++i) {
      double mx = -std::numeric_limits<double>::infinity();
      for (std::int64_t j = 0; j < vl; ++j)
        mx = std::max(mx, at(s->logits, i * vl + j));
      set(s->row_max, i, mx);
    }
  });
  all_reduce(tp_, s->row_max, {.op = ReduceOp::max, .label = "cross-entropy max"});
  const auto target = [s, m, vl, first = vocab_first_] {
    for (std::int64_t i = 0; i < m; ++i) {
      const std::int64_t id = s->batch->labels[std::size_t(i)] - first;
      set(s->target, i, id >= 0 && id < vl ? at(s->logits, i * vl + id) - at(s->row_max, i) : 0.0);
    }
  };
  const auto exp_sum = [s, m, vl] {
    for (std::int64_t i = 0; i < m; ++i) {
      const double mx = at(s->row_max, i);
      double sum = 0;
      for (std::int64_t j = 0; j < vl; ++j)
        sum += std::exp(at(s->logits, i * vl + j) - mx);
      set(s->sum_exp, i, sum);
    }
  };
  if (fused_) {
    elementwise(rank, "cross-entropy target exp-sum", traffic.exp_sum, [target, exp_sum] {
      target();
      exp_sum();
    });
    all_reduce(tp_, target_and_sum, {.label = "cross-entropy target exp-sum"});
  } else {
    elementwise(rank, "cross-entropy target", traffic.target, target);
    elementwise(rank, "cross-entropy exp-sum", traffic.exp_sum, exp_sum);
    all_reduce(tp_, s->target, {.label = "cross-entropy target"});
    all_reduce(tp_, s->sum_exp, {.label = "cross-entropy exp-sum"});
  }
  elementwise(rank, "cross-entropy loss", traffic.loss + 3 * std::uint64_t(m) * size_of(acc),
              [s, m, loss] {
                double total = 0;
                for (std::int64_t i = 0; i < m; ++i)
                  total += std::log(at(s->sum_exp, i)) - at(s->target, i);
                *loss = total / double(m);
              });
  return s;
}

Tensor VocabLoss::backward(const std::shared_ptr<Saved>& s, double scale, const LinearOptions& o) {
  Rank& rank = tp_.owner();
  Tensor dlogits = alloc(rank, s->logits.shape(), dtype_);
  const DType acc = dtype_ == DType::f64 ? DType::f64 : DType::f32;
  const CrossEntropyTraffic traffic(std::uint64_t(s->logits.numel()), dtype_, acc, fused_);
  elementwise(rank, "cross-entropy grad", traffic.grad, [s, dlogits, scale, first = vocab_first_] {
    const std::int64_t rows = dlogits.size(0), vl = dlogits.size(1);
    const double per_token = scale / double(rows);
    for (std::int64_t i = 0; i < rows; ++i) {
      const double mx = at(s->row_max, i), z = at(s->sum_exp, i);
      const std::int64_t id = s->batch->labels[std::size_t(i)] - first;
      for (std::int64_t j = 0; j < vl; ++j) {
        const double p = std::exp(at(s->logits, i * vl + j) - mx) / z;
        set(dlogits, i * vl + j, (p - (j == id ? 1.0 : 0.0)) * per_token);
      }
    }
  });
  head_->restore_saved(s->head);
  LinearOptions lo = o;
  lo.label = "lm head";
  Tensor dnormed = head_->backward(dlogits, lo);
  Tensor dx = alloc(rank, s->x.shape(), dtype_);
  layers::detail::rmsnorm_backward(rank, s->x, s->rms, dnormed, dx);
  return dx;
}

// ---------------------------------------------------------------------------------------------
// ParamBuffers

ParamBuffers::ParamBuffers(Rank& rank, std::vector<ParamSlot> slots,
                           const std::vector<int>& bucket_of, DType dtype, DType reduce, int dp,
                           int dp_rank, bool sharded, bool overlap, ParamGather gather)
    : rank_(rank),
      slots_(std::move(slots)),
      bucket_of_(bucket_of),
      dtype_(dtype),
      grad_dtype_(layers::detail::grad_dtype(dtype)),
      reduce_dtype_(reduce),
      dp_(dp),
      dp_rank_(dp_rank),
      sharded_(sharded),
      overlap_(overlap),
      gather_(sharded ? gather : ParamGather::after_update) {
  COCEMU_CHECK(bucket_of_.size() == slots_.size(), Errc::internal,
               "ParamBuffers: {} bucket indices for {} parameters", bucket_of_.size(),
               slots_.size());
  // Bucket by bucket, each bucket's parameters in slot order (the order the backward finalizes
  // them); padded to a multiple of dp when the optimizer is sharded (Megatron pads its buckets
  // the same way).
  const int n_buckets =
      bucket_of_.empty() ? 0 : *std::max_element(bucket_of_.begin(), bucket_of_.end()) + 1;
  buckets_.resize(std::size_t(n_buckets));
  std::int64_t offset = 0, state = 0;
  for (int b = 0; b < n_buckets; ++b) {
    Bucket& bk = buckets_[std::size_t(b)];
    bk.offset = offset;
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (bucket_of_[i] != b) continue;
      slots_[i].offset = offset + bk.numel;
      bk.numel += slots_[i].numel;
      bk.chunk = slots_[i].chunk;
      ++bk.params;
    }
    COCEMU_CHECK(bk.params > 0, Errc::internal, "ParamBuffers: bucket {} is empty", b);
    if (sharded_) bk.numel = (bk.numel + dp_ - 1) / dp_ * dp_;
    bk.state_offset = state;
    state += sharded_ ? bk.numel / dp_ : bk.numel;
    offset += bk.numel;
  }
  params_ = alloc(rank, {offset}, dtype_);
  grads_ = alloc(rank, {offset}, grad_dtype_);
  if (sharded_) {
    grad_shard_ = alloc(rank, {state}, grad_dtype_);
    param_shard_ = alloc(rank, {state}, dtype_);
  }
  master_ = alloc(rank, {state}, grad_dtype_);
  exp_avg_ = alloc(rank, {state}, grad_dtype_);
  exp_avg_sq_ = alloc(rank, {state}, grad_dtype_);
}

Tensor ParamBuffers::param(int i) const {
  const auto& s = slots_[std::size_t(i)];
  return params_.flat(s.offset, s.offset + s.numel).reshape(s.shape);
}

Tensor ParamBuffers::grad(int i) const {
  const auto& s = slots_[std::size_t(i)];
  return grads_.flat(s.offset, s.offset + s.numel).reshape(s.shape);
}

std::int64_t ParamBuffers::owned_offset(const Bucket& b) const {
  return sharded_ ? b.offset + dp_rank_ * (b.numel / dp_) : b.offset;
}

std::int64_t ParamBuffers::owned_numel(const Bucket& b) const {
  return sharded_ ? b.numel / dp_ : b.numel;
}

void ParamBuffers::init_master() {
  if (!rank_.numerics()) return;
  for (const auto& b : buckets_) {
    const std::int64_t first = owned_offset(b), n = owned_numel(b);
    master_.flat(b.state_offset, b.state_offset + n)
        .copy_from(params_.flat(first, first + n).to(master_.dtype()));
  }
}

void ParamBuffers::zero_grad() {
  elementwise(rank_, "zero grad buffer", grads_.nbytes(), [g = grads_] { g.fill_zero(); });
  for (auto& b : buckets_)
    b.pending = b.params;
  reductions_.clear();
}

void ParamBuffers::grad_ready(int i, Group& dp) {
  Bucket& b = buckets_[std::size_t(bucket_of_[std::size_t(i)])];
  COCEMU_CHECK_ARG(b.pending > 0, "ParamBuffers on rank {}: gradient of {} finalized twice",
                   rank_.id(), slots_[std::size_t(i)].name);
  if (--b.pending > 0 || dp_ == 1) return;  // dp 1: nothing to reduce
  const int index = int(&b - buckets_.data());
  if (!overlap_) {
    deferred_.push_back({index, &dp});
    return;
  }
  launch_reduction(index, dp);
}

namespace {

/// Emulator-only work: numerics the emulated system has no kernel for (free, no launch).
template <class Fn>
void unpriced(Rank& rank, const std::string& name, Fn fn) {
  rank.current_stream().launch({.name = name + " (emulator only, unpriced)",
                                .cls = OpClass::compute,
                                .work_ns = 0,
                                .launch = LaunchKind::none},
                               std::move(fn));
}

}  // namespace

void ParamBuffers::launch_reduction(int index, Group& dp) {
  const Bucket& b = buckets_[std::size_t(index)];
  Tensor bucket = grads_.flat(b.offset, b.offset + b.numel);
  Tensor out = sharded_ ? grad_shard_.flat(b.state_offset, b.state_offset + b.numel / dp_) : bucket;
  const std::string label = fmt::format("grad bucket {}", index);
  if (reduce_dtype_ != grad_dtype_) {
    // 16-bit gradients: the bucket rounded to the reduced dtype, reduced there, and the result
    // widened into the f32 buffer once the reduction is done (finish_reductions).
    const Tensor wide = bucket;
    bucket = alloc(rank_, {b.numel}, reduce_dtype_);
    const Tensor narrow = sharded_ ? alloc(rank_, {b.numel / dp_}, reduce_dtype_) : bucket;
    unpriced(rank_, fmt::format("round grad bucket {} to {}", index, name_of(reduce_dtype_)),
             [wide, bucket] { bucket.copy_from(wide.to(bucket.dtype())); });
    narrowed_.emplace_back(narrow, out);
    out = narrow;
  }
  if (sharded_)
    reductions_.push_back(reduce_scatter(dp, out, bucket, {.async_op = true, .label = label}));
  else
    reductions_.push_back(all_reduce(dp, bucket, {.async_op = true, .label = label}));
}

void ParamBuffers::finish_reductions() {
  for (const auto& b : buckets_)
    COCEMU_CHECK_ARG(b.pending == 0,
                     "ParamBuffers on rank {}: optimizer step with {} of a bucket's {} "
                     "gradients not finalized",
                     rank_.id(), b.pending, b.params);
  for (const auto& [index, dp] : deferred_)
    launch_reduction(index, *dp);
  deferred_.clear();
  for (const auto& w : reductions_)
    w.wait();
  reductions_.clear();
  for (const auto& [narrow, wide] : narrowed_)
    unpriced(rank_, "widen reduced grad bucket",
             [n = narrow, w = wide] { w.copy_from(n.to(w.dtype())); });
  narrowed_.clear();
  if (sharded_ && dp_ == 1)  // nothing to reduce: the shard is the whole bucket
    elementwise(rank_, "grad shard copy", 2 * grads_.nbytes(),
                [g = grads_, s = grad_shard_] { s.copy_from(g); });
}

void ParamBuffers::update(Group& dp, int step, const Adam& a, double grad_scale) {
  const double scale = grad_scale;
  const double c1 = 1 - std::pow(a.beta1, step), c2 = 1 - std::pow(a.beta2, step);
  for (const auto& b : buckets_) {
    const std::int64_t first = owned_offset(b), n = owned_numel(b), s0 = b.state_offset;
    const Tensor g = sharded_ ? grad_shard_.flat(s0, s0 + n) : grads_.flat(first, first + n);
    const Tensor p = sharded_ ? param_shard_.flat(s0, s0 + n) : params_.flat(first, first + n);
    const std::uint64_t bytes =
        std::uint64_t(n) * (7 * size_of(grad_dtype_) + size_of(dtype_));  // 4 reads, 3+1 writes
    elementwise(rank_, "adam", bytes,
                [=, master = master_.flat(s0, s0 + n), m = exp_avg_.flat(s0, s0 + n),
                 v = exp_avg_sq_.flat(s0, s0 + n)] {
                  for (std::int64_t i = 0; i < n; ++i) {
                    const double gi = at(g, i) * scale;
                    const double mi = a.beta1 * at(m, i) + (1 - a.beta1) * gi;
                    const double vi = a.beta2 * at(v, i) + (1 - a.beta2) * gi * gi;
                    set(m, i, mi);
                    set(v, i, vi);
                    const double w =
                        at(master, i) - a.lr * (at(m, i) / c1) / (std::sqrt(at(v, i) / c2) + a.eps);
                    set(master, i, w);
                    set(p, i, at(master, i));
                  }
                });
    if (sharded_ && gather_ == ParamGather::after_update)
      all_gather(dp, params_.flat(b.offset, b.offset + b.numel), p,
                 {.label = fmt::format("param bucket {}", int(&b - buckets_.data()))});
  }
  if (gather_ == ParamGather::after_update) return;
  // --overlap-param-gather: nothing goes out now; the next forward's pre-hooks (and, aligned,
  // the schedule) dispatch the all-gathers.
  gather_group_ = &dp;
  gathers_.assign(buckets_.size(), Work{});
  dispatched_.assign(buckets_.size(), 0);
  chained_.assign(buckets_.size(), 0);
}

void ParamBuffers::dispatch_gather(int k) {
  const Bucket& b = buckets_[std::size_t(k)];
  const std::int64_t s0 = b.state_offset, n = owned_numel(b);
  gathers_[std::size_t(k)] = all_gather(
      *gather_group_, params_.flat(b.offset, b.offset + b.numel), param_shard_.flat(s0, s0 + n),
      {.async_op = true, .label = fmt::format("param bucket {}", k)});
  dispatched_[std::size_t(k)] = 1;
}

void ParamBuffers::wait_params(int i) {
  if (dispatched_.empty()) return;  // no update yet, or gathers after each update
  const int k = bucket_of_[std::size_t(i)];
  if (!dispatched_[std::size_t(k)]) dispatch_gather(k);
  gathers_[std::size_t(k)].wait();
  if (gather_ != ParamGather::chained || chained_[std::size_t(k)]) return;
  chained_[std::size_t(k)] = 1;
  // The next bucket in forward order (buckets are numbered in backward order), of the same
  // chunk: Megatron's next_param_gather_bucket_group.
  const int next = k - 1;
  if (next >= 0 && buckets_[std::size_t(next)].chunk == buckets_[std::size_t(k)].chunk &&
      !dispatched_[std::size_t(next)])
    dispatch_gather(next);
}

void ParamBuffers::start_gathers(int chunk) {
  if (dispatched_.empty()) return;
  for (int k = 0; k < int(buckets_.size()); ++k)
    if (buckets_[std::size_t(k)].chunk == chunk && !dispatched_[std::size_t(k)]) dispatch_gather(k);
}

void ParamBuffers::finish_gathers() {
  if (dispatched_.empty()) return;
  for (int k = int(buckets_.size()) - 1; k >= 0; --k) {
    if (!dispatched_[std::size_t(k)]) dispatch_gather(k);
    gathers_[std::size_t(k)].wait();
  }
  dispatched_.clear();
}

}  // namespace cocemu::layers::train::detail
