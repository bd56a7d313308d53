#include "cocemu/train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "cocemu/collectives/ops.h"
#include "cocemu/layers/detail/kernels.h"
#include "cocemu/layers/transformer.h"
#include "cocemu/runtime/error.h"
#include "cocemu/train/buckets.h"
#include "parts.h"

namespace cocemu::layers::train {

using layers::detail::alloc;

CrossEntropyTraffic::CrossEntropyTraffic(std::uint64_t elements, DType dtype, DType acc,
                                         bool fused) {
  const std::uint64_t a = elements * size_of(acc), e = elements * size_of(dtype);
  const bool cast = dtype != acc;
  if (fused) {
    max = cast ? e + a : a;  // read the logits, write the f32 copy (the max on the way)
    target = 0;
    exp_sum = 2 * a;  // -= max, exp and sum in one pass, in place
    loss = 2 * a;
    grad = cast ? a + e : 2 * a;  // mul_ and the cast in one pass
    return;
  }
  const std::uint64_t copy = cast ? e + a : 0;  // read dtype, write acc (and back)
  max = copy + a;
  target = 2 * a;
  exp_sum = 2 * a + a;
  loss = 2 * a;
  grad = 2 * a + copy;
}

std::int64_t padded_vocab(std::int64_t vocab, int tp) {
  const std::int64_t multiple = 128 * std::int64_t(tp);
  return (vocab + multiple - 1) / multiple * multiple;
}

namespace {

/// SplitMix64: a token id per (seed, sample, position), independent of how ranks split the batch.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

TokenBatch synthetic_batch(std::uint64_t seed, std::int64_t vocab, std::int64_t seq,
                           std::int64_t batch, std::int64_t first_sample) {
  TokenBatch b;
  b.tokens.resize(std::size_t(seq * batch));
  b.labels.resize(b.tokens.size());
  for (std::int64_t bi = 0; bi < batch; ++bi) {
    const std::uint64_t sample = std::uint64_t(first_sample + bi);
    // A learnable sequence: an arithmetic progression mod vocab with a start and a stride (1..4)
    // drawn per sample, so next-token loss can fall within a few iterations.
    const std::uint64_t r = mix(seed ^ mix(sample * 1000003ULL));
    const std::int64_t start = std::int64_t(r % std::uint64_t(vocab)),
                       stride = 1 + std::int64_t((r >> 32) % 4);
    auto token = [&](std::int64_t pos) { return std::int32_t((start + pos * stride) % vocab); };
    for (std::int64_t s = 0; s < seq; ++s) {
      b.tokens[std::size_t(s * batch + bi)] = token(s);
      b.labels[std::size_t(s * batch + bi)] = token(s + 1);
    }
  }
  return b;
}

Tensor initial_embedding(const TrainOptions& o, std::int64_t vocab) {
  return layers::detail::random_normal({vocab, o.model.hidden}, o.layout.dtype, o.seed * 7919 + 1,
                                       1.0 / std::sqrt(double(o.model.hidden)));
}

Tensor initial_head(const TrainOptions& o, std::int64_t vocab) {
  return layers::detail::random_normal({vocab, o.model.hidden}, o.layout.dtype, o.seed * 7919 + 2,
                                       1.0 / std::sqrt(double(o.model.hidden)));
}

std::uint64_t layer_seed(const TrainOptions& o, std::int64_t layer) {
  return o.seed * 1000 + 16 * std::uint64_t(layer);
}

namespace {

/// What the ranks leave behind for `train` to assemble.
struct Collected {
  std::mutex mu;
  // [iteration][dp rank][micro-batch]: each written by its last-stage, tp-0, cp-0 rank's kernel.
  std::vector<std::vector<std::vector<std::shared_ptr<double>>>> loss;
  std::vector<std::shared_ptr<double>> grad_norm;  // [iteration], rank 0's
  std::map<std::string, Tensor> weights;
  std::vector<PipelineBlock> blocks;
  std::vector<PieceRange> pieces;
  std::vector<std::vector<std::uint32_t>> iteration_first_op;
  std::vector<std::uint32_t> end_op;
};

/// The p2p groups of this rank's pipeline links, each with its own stream (one per link and
/// direction, so a receive waiting for its sender never holds up a transfer queued behind it).
struct Links {
  Group fwd_in, fwd_out, bwd_in, bwd_out;  // fwd_out: activations to the next stage, etc.
  int fwd_in_peer = 0, fwd_out_peer = 0, bwd_in_peer = 0, bwd_out_peer = 0;
};

attn::CpConfig cp_config(const TrainLayout& l) {
  attn::CpConfig c;
  c.context_parallel_size = l.cp;
  c.context_parallel_algo = l.cp_algo;
  c.cp_window_size = l.cp_window_size;
  c.ulysses_degree_in_cp = l.ulysses_degree_in_cp;
  c.use_cp_send_recv_overlap = l.use_cp_send_recv_overlap;
  c.tensor_model_parallel_size = l.tp;
  return c;
}

Links make_links(Rank& rank, const TrainLayout& l, int stage) {
  Links links;
  if (l.pp == 1) return links;
  const int per_stage = l.world() / l.pp, q = rank.id() % per_stage;
  const bool ring = l.vpp > 1;  // the last stage's chunk c feeds the first stage's chunk c + 1
  const int n_links = ring ? l.pp : l.pp - 1;
  for (int p = 0; p < per_stage; ++p)
    for (int a = 0; a < n_links; ++a) {
      const int b = (a + 1) % l.pp;
      const std::vector<int> members{p + per_stage * a, p + per_stage * b};
      Group fwd = new_group(rank, members, fmt::format("pp{}>{}", a, b));
      Group bwd = new_group(rank, members, fmt::format("pp{}<{}", a, b));
      if (p != q) continue;
      if (stage == a) {
        links.fwd_out = fwd;
        links.fwd_out_peer = 1;
        links.bwd_in = bwd;
        links.bwd_in_peer = 1;
      }
      if (stage == b) {
        links.fwd_in = fwd;
        links.fwd_in_peer = 0;
        links.bwd_out = bwd;
        links.bwd_out_peer = 0;
      }
    }
  for (auto [g, name] : {std::pair{&links.fwd_in, "pp fwd in"},
                         {&links.fwd_out, "pp fwd out"},
                         {&links.bwd_in, "pp bwd in"},
                         {&links.bwd_out, "pp bwd out"}})
    if (g->is_member()) g->set_stream(rank.new_stream(name));
  return links;
}

/// One rank's part of the model and its training loop.
class StageRunner {
 public:
  StageRunner(Rank& rank, const TrainOptions& o, Collected& out)
      : rank_(rank), o_(o), l_(o.layout), out_(out) {}

  void run() {
    mesh_ = make_mesh(rank_, {l_.tp, l_.cp, l_.dp, l_.pp});
    world_ = Group::world(rank_);
    // Gradients are reduced over dp × cp (every cp rank saw other tokens), as Megatron's
    // data-parallel group with context parallelism.
    dp_cp_ =
        split(world_, mesh_.tp_rank + l_.tp * mesh_.pp_rank, mesh_.cp_rank + l_.cp * mesh_.dp_rank);
    dp_cp_.set_stream(rank_.new_stream("dp comm"));
    world_.set_stream(dp_cp_.stream());  // the grad-norm all-reduce, with the DP traffic
    if (l_.cp > 1) {
      mesh_.cp.set_stream(rank_.new_stream("cp comm"));
      cp_ = ContextParallel{mesh_.cp, cp_config(l_)};
      positions_ = attn::token_positions(cp_.config, o_.model.seq, mesh_.cp_rank);
    }
    stage_ = mesh_.pp_rank;
    links_ = make_links(rank_, l_, stage_);
    build_model();
    const int m = int(l_.micro_batches());
    const auto steps = pipeline_steps(l_.schedule, p2p_mode(l_), l_.pp, l_.vpp, m, stage_);
    std::vector<std::uint32_t> firsts;
    for (int it = 0; it < o_.iterations; ++it) {
      iteration_ = it;
      firsts.push_back(std::uint32_t(rank_.graph().ops.size()));
      buffers_->zero_grad();
      for (int c = 1; c < copies(); ++c)
        on_copy(c, [&] {
          // The other copies read the weights the last optimizer step wrote.
          copies_[std::size_t(c)].compute->wait(rank_.compute_stream().record());
          for (const Tensor& g : copies_[std::size_t(c)].grads)
            layers::detail::elementwise(rank_, "zero copy grad", g.nbytes(),
                                        [g] { g.fill_zero(); });
        });
      // Megatron's interleaved schedule with aligned parameter all-gathers: the first two
      // chunks' go out before the first forward, chunk c's at the forward whose unit + stage is
      // the first micro-batch of chunk c − 1 (forward_step_helper's param_sync_func).
      for (int c = 0; c < std::min(l_.vpp, 2) && l_.vpp > 1; ++c)
        buffers_->start_gathers(c);
      int forward_unit = 0;
      for (const auto& step : steps) {
        if (step.kind == PipelineStep::exchange) {
          exchange(step);
          continue;
        }
        const PipelineAction& a = step.action;
        const auto first = std::uint32_t(rank_.graph().ops.size());
        if (a.forward) {
          for (int c = 2; c < l_.vpp; ++c)
            if (forward_unit + stage_ == (c - 1) * l_.pp) buffers_->start_gathers(c);
          ++forward_unit;
          forward(it, a);
        } else {
          backward(a);
        }
        if (it == o_.iterations - 1)
          blocks_.push_back(
              {rank_.id(), stage_, a, first, std::uint32_t(rank_.graph().ops.size())});
      }
      optimizer_step(it);
    }
    const auto end = std::uint32_t(rank_.graph().ops.size());
    buffers_->finish_gathers();  // parameters current for the report (after the last iteration)
    rank_.synchronize();
    collect(std::move(firsts), end);
  }

 private:
  /// Records the ops `fn` enqueues as one model part (with record_pieces).
  template <class Fn>
  auto piece(const char* what, Fn&& fn) {
    const auto first = std::uint32_t(rank_.graph().ops.size());
    auto finish = [&] {
      if (o_.record_pieces)
        pieces_.push_back({what, first, std::uint32_t(rank_.graph().ops.size()), rank_.id()});
    };
    if constexpr (std::is_void_v<decltype(fn())>) {
      fn();
      finish();
    } else {
      auto r = fn();
      finish();
      return r;
    }
  }

  bool first_stage_chunk(int chunk) const { return stage_ == 0 && chunk == 0; }
  bool last_stage_chunk(int chunk) const { return stage_ == l_.pp - 1 && chunk == l_.vpp - 1; }
  int copies() const { return l_.micro_batch_interleave; }
  /// Rows of one copy of a micro-batch on this rank (seq/cp tokens × its samples).
  std::int64_t rows() const { return o_.model.seq / l_.cp * (l_.micro_batch_size / copies()); }
  std::int64_t local_rows() const { return l_.sequence_parallel ? rows() / l_.tp : rows(); }

  struct LayerEntry {
    std::int64_t index;
    std::unique_ptr<TransformerLayer> layer;
    int first_slot = 0;
  };

  /// Multi-copy (MindSpore's micro_batch_interleave_num = 2): every micro-batch is split in two
  /// along the batch; each copy runs on its own compute stream and TP group (with its own comm
  /// stream), so one copy's communication overlaps the other's compute. Copies share the weights;
  /// copy 0 accumulates into the model's gradient buffer, the others into their own gradients,
  /// added in when a parameter's gradient is final.
  struct Copy {
    Group tp;
    Stream* compute = nullptr;
    std::vector<std::vector<LayerEntry>> chunks;
    std::unique_ptr<detail::VocabEmbedding> embedding;
    std::unique_ptr<detail::VocabLoss> loss;
    std::vector<Tensor> grads;  // copies > 0: per parameter slot
  };

  void make_copies() {
    copies_.resize(std::size_t(copies()));
    copies_[0].tp = mesh_.tp;
    copies_[0].compute = &rank_.compute_stream();
    for (int c = 1; c < copies(); ++c) {
      Copy& copy = copies_[std::size_t(c)];
      copy.tp = split(mesh_.tp, 0, mesh_.tp_rank);  // same members, a communicator of its own
      copy.tp.set_stream(rank_.new_stream(fmt::format("comm copy {}", c)));
      copy.compute = &rank_.new_stream(fmt::format("compute copy {}", c));
    }
  }

  /// Runs `fn` with copy c's compute stream current.
  template <class Fn>
  void on_copy(int c, Fn&& fn) {
    Stream& before = rank_.current_stream();
    rank_.set_current_stream(*copies_[std::size_t(c)].compute);
    struct Restore {
      Rank& r;
      Stream& s;
      ~Restore() { r.set_current_stream(s); }
    } restore{rank_, before};
    fn();
  }

  void build_model() {
    const auto& md = o_.model;
    const bool sp = l_.sequence_parallel && l_.tp > 1;
    make_copies();
    layer_config_ = {.seq = md.seq,
                     .batch = l_.micro_batch_size / copies(),
                     .hidden = md.hidden,
                     .heads = md.heads,
                     .ffn = md.ffn,
                     .kv_heads = md.kv_heads,
                     .activation = md.swiglu ? Activation::swiglu : Activation::gelu,
                     .sequence_parallel = sp,
                     .dtype = l_.dtype,
                     .recompute_core_attention = l_.recompute == Recompute::selective,
                     .flash_attention = md.flash_attention,
                     .masked_softmax_fusion = md.masked_softmax_fusion};
    const std::int64_t vocab = padded_vocab(md.vocab, l_.tp);
    auto table = [&](bool head) {
      if (!rank_.numerics()) return Tensor::shape_only({vocab, md.hidden}, l_.dtype);
      return head ? initial_head(o_, vocab) : initial_embedding(o_, vocab);
    };
    std::vector<detail::ParamSlot> slots;
    // Slots in the order the backward finalizes them: LM head, the chunks' layers from the last
    // (each layer's linears in backward order), the embedding. A binding per copy.
    using Bind = std::function<void(const Tensor&, const Tensor&)>;
    std::vector<std::vector<Bind>> binds;
    std::vector<GradParam> grad_params;  // the same, as buckets.h sees them
    auto add = [&](std::string name, const Shape& shape, auto bind_copy, int chunk = 0,
                   std::int64_t layer = -1) {
      slots.push_back({std::move(name), 0, shape.numel(), shape, chunk});
      grad_params.push_back({chunk, layer, shape.numel()});
      std::vector<Bind> per_copy;
      for (int c = 0; c < copies(); ++c)
        per_copy.push_back(
            [bind_copy, c](const Tensor& w, const Tensor& g) { bind_copy(c, w, g); });
      binds.push_back(std::move(per_copy));
    };
    if (stage_ == l_.pp - 1) {
      const std::int64_t vl = vocab / l_.tp;
      Tensor full = table(true);
      for (auto& copy : copies_) {
        Tensor shard = alloc(rank_, {vl, md.hidden}, l_.dtype);
        if (rank_.numerics())
          shard.copy_from(full.rows(vl * mesh_.tp_rank, vl * (mesh_.tp_rank + 1)));
        copy.loss = std::make_unique<detail::VocabLoss>(copy.tp, shard, vl * mesh_.tp_rank, sp,
                                                        l_.dtype, l_.cross_entropy_fusion);
      }
      lm_head_slot_ = int(slots.size());
      add(
          "lm_head", Shape{vl, md.hidden},
          [this](int c, const Tensor& w, const Tensor& g) {
            copies_[std::size_t(c)].loss->head().bind(w, g);
          },
          l_.vpp - 1);
    }
    for (auto& copy : copies_) {
      copy.chunks.resize(std::size_t(l_.vpp));
      for (int c = 0; c < l_.vpp; ++c) {
        const LayerRange range = layers_of(md, l_, stage_, c);
        for (std::int64_t i = 0; i < range.count; ++i) {
          const std::int64_t index = range.first + i;
          const auto w = rank_.numerics()
                             ? TransformerWeights::random(layer_config_, layer_seed(o_, index))
                             : TransformerWeights::shapes(layer_config_);
          copy.chunks[std::size_t(c)].push_back(
              {index, std::make_unique<TransformerLayer>(copy.tp, layer_config_, w,
                                                         l_.cp > 1 ? &cp_ : nullptr)});
        }
      }
    }
    for (int c = l_.vpp - 1; c >= 0; --c)
      for (int li = int(copies_[0].chunks[std::size_t(c)].size()) - 1; li >= 0; --li) {
        auto& entry = copies_[0].chunks[std::size_t(c)][std::size_t(li)];
        const std::string p = fmt::format("layer{}.", entry.index);
        entry.first_slot = int(slots.size());
        auto layer = [this, c, li](int copy) {
          return copies_[std::size_t(copy)].chunks[std::size_t(c)][std::size_t(li)].layer.get();
        };
        const TransformerLayer& l0 = *entry.layer;
        add(
            p + "mlp.down", l0.mlp_down().weight().shape(),
            [layer](int k, const Tensor& w, const Tensor& g) { layer(k)->mlp_down().bind(w, g); },
            c, entry.index);
        add(
            p + "mlp.up", l0.mlp_up().weight().shape(),
            [layer](int k, const Tensor& w, const Tensor& g) { layer(k)->mlp_up().bind(w, g); }, c,
            entry.index);
        add(
            p + "attn.out", l0.attn_out().weight().shape(),
            [layer](int k, const Tensor& w, const Tensor& g) { layer(k)->attn_out().bind(w, g); },
            c, entry.index);
        add(
            p + "attn.qkv", l0.qkv().weight().shape(),
            [layer](int k, const Tensor& w, const Tensor& g) { layer(k)->qkv().bind(w, g); }, c,
            entry.index);
      }
    if (stage_ == 0) {
      const Tensor full = table(false);
      for (auto& copy : copies_)
        copy.embedding = std::make_unique<detail::VocabEmbedding>(copy.tp, full, sp);
      add("embedding", copies_[0].embedding->weight().shape(),
          [this](int c, const Tensor& w, const Tensor& g) {
            auto& e = *copies_[std::size_t(c)].embedding;
            if (rank_.numerics() && c == 0) w.copy_from(e.weight());
            e.weight() = w;
            e.grad() = g;
          });
      embedding_slot_ = int(slots.size()) - 1;
    }
    const detail::ParamGather gather = !l_.overlap_param_gather ? detail::ParamGather::after_update
                                       : l_.vpp > 1             ? detail::ParamGather::aligned
                                                                : detail::ParamGather::chained;
    buffers_ = std::make_unique<detail::ParamBuffers>(
        rank_, std::move(slots), assign_buckets(md, l_, stage_, grad_params), l_.dtype,
        reduce_dtype(l_), dp_cp_.size(), dp_cp_.rank(), l_.distributed_optimizer,
        l_.overlap_grad_reduce, gather);
    for (int i = 0; i < int(binds.size()); ++i) {
      binds[std::size_t(i)][0](buffers_->param(i), buffers_->grad(i));
      for (int c = 1; c < copies(); ++c) {
        const Tensor g = buffers_->grad(i);
        Tensor own = alloc(rank_, g.shape(), g.dtype());
        copies_[std::size_t(c)].grads.push_back(own);
        binds[std::size_t(i)][std::size_t(c)](buffers_->param(i), own);
      }
    }
    buffers_->init_master();
  }

  /// Copy c of a micro-batch: its samples, and with cp this rank's tokens of them.
  std::shared_ptr<const detail::Batch> batch(int micro_batch, int c) {
    if (!rank_.numerics()) return nullptr;
    const std::int64_t b = l_.micro_batch_size / copies();
    const std::int64_t first =
        std::int64_t(iteration_) * l_.global_batch_size +
        (std::int64_t(mesh_.dp_rank) * l_.micro_batches() + micro_batch) * l_.micro_batch_size +
        c * b;
    auto full = synthetic_batch(o_.seed, o_.model.vocab, o_.model.seq, b, first);
    if (l_.cp == 1) return std::make_shared<const detail::Batch>(std::move(full));
    // This cp rank's tokens: rows (position, sample) for its positions, in storage order.
    detail::Batch mine;
    for (const std::int64_t pos : positions_)
      for (std::int64_t i = 0; i < b; ++i) {
        mine.tokens.push_back(full.tokens[std::size_t(pos * b + i)]);
        mine.labels.push_back(full.labels[std::size_t(pos * b + i)]);
      }
    return std::make_shared<const detail::Batch>(std::move(mine));
  }

  struct Key {
    int micro_batch, chunk, copy;
    std::int64_t layer;
    auto operator<=>(const Key&) const = default;
  };

  /// A pipeline tensor in flight: an activation (forward) or its gradient, of a micro-batch's
  /// chunk and copy; `incoming_` holds what an exchange received for a pass to come, `outgoing_`
  /// what a pass produced for an exchange to send.
  using Transfer = std::tuple<bool, int, int, int>;  // forward, micro-batch, chunk, copy
  static Transfer transfer(const PipelineAction& a, int copy) {
    return {a.forward, a.micro_batch, a.chunk, copy};
  }

  /// One p2p call of the schedule (pipeline_steps): every send and receive of each copy posted,
  /// then the copy's compute stream waits for all of them (blocking) or for the receives only.
  /// A tensor travels whole or, with Megatron 2021-2022's scatter/gather, as this TP rank's 1/tp
  /// slice, all-gathered over the stage's TP group once received (gather_split_1d_tensor).
  void exchange(const PipelineStep& step) {
    const bool sliced = l_.pipeline_scatter_gather();
    for (int c = 0; c < copies(); ++c)
      on_copy(c, [&] {
        Group& tp = copies_[std::size_t(c)].tp;
        std::vector<Work> sends, recvs;
        for (const PipelineAction& a : step.sends) {
          auto node = outgoing_.extract(transfer(a, c));
          COCEMU_CHECK(!node.empty(), Errc::internal,
                       "rank {}: stage {} sends the output of {} before computing it", rank_.id(),
                       stage_, action_label(a, l_.vpp));
          const Tensor& t = node.mapped();
          Group& link = a.forward ? links_.fwd_out : links_.bwd_out;
          const int peer = a.forward ? links_.fwd_out_peer : links_.bwd_out_peer;
          const std::int64_t k = t.numel() / tp.size();
          sends.push_back(sliced ? isend(link, t.flat(k * tp.rank(), k * (tp.rank() + 1)), peer)
                                 : isend(link, t, peer));
        }
        std::vector<std::pair<Tensor, Tensor>> received;  // (tensor, slice) per receive
        for (const PipelineAction& a : step.recvs) {
          Tensor t = alloc(rank_, {local_rows(), o_.model.hidden}, l_.dtype);
          Tensor slice = sliced ? alloc(rank_, {t.numel() / tp.size()}, l_.dtype) : t;
          Group& link = a.forward ? links_.fwd_in : links_.bwd_in;
          const int peer = a.forward ? links_.fwd_in_peer : links_.bwd_in_peer;
          recvs.push_back(irecv(link, slice, peer));
          received.emplace_back(t, slice);
          incoming_[transfer(a, c)] = t;
        }
        for (const Work& w : recvs)
          w.wait();
        if (step.blocking)
          for (const Work& w : sends)
            w.wait();
        if (sliced)
          for (const auto& [t, slice] : received)
            all_gather(tp, t, slice).wait();
      });
  }

  /// What an exchange received for pass `a` of copy c.
  Tensor take_input(const PipelineAction& a, int c) {
    auto node = incoming_.extract(transfer(a, c));
    COCEMU_CHECK(!node.empty(), Errc::internal,
                 "rank {}: stage {} runs {} before receiving its input", rank_.id(), stage_,
                 action_label(a, l_.vpp));
    return node.mapped();
  }

  void forward(int iteration, const PipelineAction& a) {
    const int n = copies();
    std::vector<Tensor> x(static_cast<std::size_t>(n));
    for (int c = 0; c < n; ++c)
      on_copy(c, [&] {
        if (first_stage_chunk(a.chunk)) {
          if (a.micro_batch == 0) buffers_->wait_params(embedding_slot_);
          x[std::size_t(c)] = piece("embedding fwd", [&] {
            return copies_[std::size_t(c)].embedding->forward(batch(a.micro_batch, c), rows());
          });
        } else {
          x[std::size_t(c)] = take_input(a, c);
        }
      });
    const std::size_t layers = copies_[0].chunks[std::size_t(a.chunk)].size();
    for (std::size_t li = 0; li < layers; ++li)
      piece("layer fwd", [&] {
        for (int c = 0; c < n; ++c)
          on_copy(c, [&] {
            auto& entry = copies_[std::size_t(c)].chunks[std::size_t(a.chunk)][li];
            const Key key{a.micro_batch, a.chunk, c, entry.index};
            // The chunk's first forward: its parameters' all-gathers, waited in the order the
            // layer's modules run forward (qkv, out, up, down: Megatron's forward pre-hooks,
            // distributed_data_parallel.py _make_forward_pre_hook, fire per module as the forward
            // reaches it; the slots are laid out in backward order, down first).
            if (a.micro_batch == 0)
              for (int p = 3; p >= 0; --p)
                buffers_->wait_params(copies_[0].chunks[std::size_t(a.chunk)][li].first_slot + p);
            Tensor y = entry.layer->forward(x[std::size_t(c)], o_.linear);
            if (l_.recompute == Recompute::full) {
              inputs_[key] = x[std::size_t(c)];  // the layer's input is all it keeps
              entry.layer->take_context();
            } else {
              contexts_[key] = entry.layer->take_context();
            }
            x[std::size_t(c)] = y;
          });
      });
    for (int c = 0; c < n; ++c)
      on_copy(c, [&] {
        if (last_stage_chunk(a.chunk)) {
          auto slot = std::make_shared<double>(std::nan(""));
          if (rank_.numerics() && mesh_.tp_rank == 0) {
            std::lock_guard lock(out_.mu);
            out_.loss[std::size_t(iteration)][std::size_t(dp_cp_.rank() * n + c)]
                     [std::size_t(a.micro_batch)] = slot;
          }
          if (a.micro_batch == 0) buffers_->wait_params(lm_head_slot_);
          loss_saved_[{a.micro_batch, c}] = piece("loss fwd", [&] {
            return copies_[std::size_t(c)].loss->forward(x[std::size_t(c)], batch(a.micro_batch, c),
                                                         o_.linear, slot);
          });
        } else {
          outgoing_[transfer(a, c)] = x[std::size_t(c)];
        }
      });
  }

  /// Parameter slot i's gradient is final: the other copies' gradients are added in (after
  /// their streams), then its bucket may launch.
  void grad_final(int i) {
    for (int c = 1; c < copies(); ++c) {
      rank_.compute_stream().wait(copies_[std::size_t(c)].compute->record());
      layers::detail::accumulate(rank_, buffers_->grad(i),
                                 copies_[std::size_t(c)].grads[std::size_t(i)]);
    }
    buffers_->grad_ready(i, dp_cp_);
  }

  void backward(const PipelineAction& a) {
    const int n = copies();
    const bool last_micro_batch = a.micro_batch == int(l_.micro_batches()) - 1;
    std::vector<Tensor> dy(static_cast<std::size_t>(n));
    for (int c = 0; c < n; ++c)
      on_copy(c, [&] {
        if (last_stage_chunk(a.chunk)) {
          auto node = loss_saved_.extract({a.micro_batch, c});
          // Megatron scales each micro-batch's loss by 1/micro-batches (and by 1/cp: every cp
          // rank averages over its seq/cp tokens). Copies add up: MindSpore's
          // MicroBatchInterleaved sums the copies' losses (only the logged loss is divided).
          dy[std::size_t(c)] = piece("loss bwd", [&] {
            return copies_[std::size_t(c)].loss->backward(
                node.mapped(), 1.0 / double(l_.micro_batches() * l_.cp), o_.linear);
          });
        } else {
          dy[std::size_t(c)] = take_input(a, c);
        }
      });
    if (last_stage_chunk(a.chunk) && last_micro_batch) grad_final(0);
    const int layers = int(copies_[0].chunks[std::size_t(a.chunk)].size());
    for (int li = layers - 1; li >= 0; --li) {
      piece("layer bwd", [&] {
        for (int c = 0; c < n; ++c)
          on_copy(c, [&] {
            auto& entry = copies_[std::size_t(c)].chunks[std::size_t(a.chunk)][std::size_t(li)];
            const Key key{a.micro_batch, a.chunk, c, entry.index};
            if (l_.recompute == Recompute::full) {
              auto node = inputs_.extract(key);
              entry.layer->forward(node.mapped(), o_.linear);  // recompute: same bits and comm
            } else {
              auto node = contexts_.extract(key);
              entry.layer->restore_context(std::move(node.mapped()));
            }
            dy[std::size_t(c)] = entry.layer->backward(dy[std::size_t(c)], o_.linear);
          });
      });
      if (last_micro_batch) {
        const int first = copies_[0].chunks[std::size_t(a.chunk)][std::size_t(li)].first_slot;
        for (int p = 0; p < 4; ++p)
          grad_final(first + p);
      }
    }
    for (int c = 0; c < n; ++c)
      on_copy(c, [&] {
        if (first_stage_chunk(a.chunk))
          piece("embedding bwd", [&] {
            copies_[std::size_t(c)].embedding->backward(batch(a.micro_batch, c),
                                                        dy[std::size_t(c)]);
          });
        else
          outgoing_[transfer(a, c)] = dy[std::size_t(c)];
      });
    if (first_stage_chunk(a.chunk) && last_micro_batch) grad_final(embedding_slot_);
  }

  /// Megatron's optimizer step: wait for the gradient reductions, the global gradient norm
  /// (all-reduced over every rank: it joins the stages at the end of each iteration, as
  /// Megatron's does), then Adam and, sharded, the parameter all-gather.
  void optimizer_step(int iteration) {
    buffers_->finish_reductions();
    const Tensor g = buffers_->owned_grads();
    const DType acc = g.dtype();
    Tensor norm2 = alloc(rank_, {1}, acc);
    // Replicated gradients (no sharding) are counted by every dp × cp rank: divide by that.
    const double share = l_.distributed_optimizer ? 1.0 : 1.0 / double(l_.dp * l_.cp);
    const double mean = l_.gradients_mean ? 1.0 / double(l_.dp) : 1.0;
    layers::detail::elementwise(rank_, "grad norm", g.nbytes(), [g, norm2, share, mean] {
      double s = 0;
      for (std::int64_t i = 0; i < g.numel(); ++i) {
        const double v = g.item(i) * mean;
        s += v * v;
      }
      layers::detail::set(norm2, 0, s * share);
    });
    all_reduce(world_, norm2, {.label = "grad norm"});
    if (rank_.id() == 0 && rank_.numerics()) {
      auto slot = std::make_shared<double>(0);
      layers::detail::elementwise(rank_, "grad norm sqrt", 8,
                                  [norm2, slot] { *slot = std::sqrt(norm2.item(0)); });
      std::lock_guard lock(out_.mu);
      out_.grad_norm[std::size_t(iteration)] = slot;
    }
    buffers_->update(dp_cp_, iteration + 1, o_.adam, mean);
  }

  void collect(std::vector<std::uint32_t> firsts, std::uint32_t end) {
    std::lock_guard lock(out_.mu);
    out_.iteration_first_op[std::size_t(rank_.id())] = std::move(firsts);
    out_.end_op[std::size_t(rank_.id())] = end;
    out_.blocks.insert(out_.blocks.end(), blocks_.begin(), blocks_.end());
    out_.pieces.insert(out_.pieces.end(), pieces_.begin(), pieces_.end());
    if (!rank_.numerics() || mesh_.dp_rank != 0 || mesh_.cp_rank != 0) return;
    for (int i = 0; i < int(buffers_->slots().size()); ++i)
      out_.weights[fmt::format("{} tp{}", buffers_->slots()[std::size_t(i)].name, mesh_.tp_rank)] =
          buffers_->param(i).clone();
  }

  Rank& rank_;
  const TrainOptions& o_;
  const TrainLayout& l_;
  Collected& out_;
  Mesh mesh_;
  Group world_, dp_cp_;
  ContextParallel cp_;
  std::vector<std::int64_t> positions_;  // this cp rank's token positions
  Links links_;
  int stage_ = 0, iteration_ = 0;
  TransformerConfig layer_config_;
  std::vector<Copy> copies_;
  std::unique_ptr<detail::ParamBuffers> buffers_;
  int embedding_slot_ = -1, lm_head_slot_ = -1;
  std::map<Key, std::shared_ptr<TransformerLayer::Context>> contexts_;
  std::map<Key, Tensor> inputs_;
  std::map<std::pair<int, int>, std::shared_ptr<detail::VocabLoss::Saved>> loss_saved_;
  std::map<Transfer, Tensor> incoming_, outgoing_;
  std::vector<PipelineBlock> blocks_;
  std::vector<PieceRange> pieces_;
};

/// On several hosts (WorldOptions::hosts) each host collected what its own ranks left: every
/// host sends its part to the others, so each one assembles the whole result.
void share_across_hosts(HostLink& link, int world_size, Collected& out) {
  const std::string key = fmt::format("r{}/train-collected", link.next_run());
  cocemu::detail::ByteWriter w;
  for (std::size_t it = 0; it < out.loss.size(); ++it)
    for (std::size_t c = 0; c < out.loss[it].size(); ++c)
      for (std::size_t mb = 0; mb < out.loss[it][c].size(); ++mb)
        if (const auto& v = out.loss[it][c][mb])
          w.put<std::uint8_t>(1).put(it).put(c).put(mb).put(*v);
  for (std::size_t it = 0; it < out.grad_norm.size(); ++it)
    if (out.grad_norm[it]) w.put<std::uint8_t>(2).put(it).put(*out.grad_norm[it]);
  for (int r = 0; r < world_size; ++r)
    if (host_of_rank(r, world_size, link.n_hosts()) == link.host())
      w.put<std::uint8_t>(3)
          .put(r)
          .put_vector(out.iteration_first_op[std::size_t(r)])
          .put(out.end_op[std::size_t(r)]);
  for (const PipelineBlock& b : out.blocks)
    w.put<std::uint8_t>(4).put(b);
  for (const PieceRange& p : out.pieces)
    w.put<std::uint8_t>(5).put_string(p.what).put(p.first_op).put(p.end_op).put(p.rank);
  for (const auto& [name, t] : out.weights) {
    w.put<std::uint8_t>(6).put_string(name).put(t.dtype()).put<int>(t.ndim());
    for (int d = 0; d < t.ndim(); ++d)
      w.put(t.size(d));
    w.put_bytes(t.raw(), t.nbytes());
  }
  w.put<std::uint8_t>(0);
  link.exchange(
      key, w.take(),
      [](int h) {
        return fmt::format("host {}'s losses, norms and weights at the end of train", h);
      },
      [&](int h, const Bytes& theirs) {
        cocemu::detail::ByteReader r(theirs, fmt::format("train's results from host {}", h));
        for (auto tag = r.get<std::uint8_t>(); tag != 0; tag = r.get<std::uint8_t>()) {
          if (tag == 1) {
            const auto it = r.get<std::size_t>(), c = r.get<std::size_t>(),
                       mb = r.get<std::size_t>();
            out.loss.at(it).at(c).at(mb) = std::make_shared<double>(r.get<double>());
          } else if (tag == 2) {
            const auto it = r.get<std::size_t>();
            out.grad_norm.at(it) = std::make_shared<double>(r.get<double>());
          } else if (tag == 3) {
            const auto rank = std::size_t(r.get<int>());
            out.iteration_first_op.at(rank) = r.get_vector<std::uint32_t>();
            out.end_op.at(rank) = r.get<std::uint32_t>();
          } else if (tag == 4) {
            out.blocks.push_back(r.get<PipelineBlock>());
          } else if (tag == 5) {
            PieceRange p;
            p.what = r.get_string();
            p.first_op = r.get<std::uint32_t>();
            p.end_op = r.get<std::uint32_t>();
            p.rank = r.get<int>();
            out.pieces.push_back(std::move(p));
          } else if (tag == 6) {
            std::string name = r.get_string();
            const auto dtype = r.get<DType>();
            std::vector<std::int64_t> dims(std::size_t(r.get<int>()));
            for (auto& d : dims)
              d = r.get<std::int64_t>();
            Tensor t = Tensor::zeros(Shape(std::span<const std::int64_t>(dims)), dtype);
            std::memcpy(t.raw(), r.take(t.nbytes()), t.nbytes());
            out.weights[std::move(name)] = std::move(t);
          } else {
            throw Error(Errc::mismatch,
                        fmt::format("train's results from host {}: unknown entry {}", h, int(tag)));
          }
        }
      });
}

}  // namespace

TrainResult train(const TrainOptions& o, WorldOptions world) {
  const TrainLayout& l = o.layout;
  TrainResult result;
  result.warnings = check_layout(o.model, l, l.world()).warnings;
  COCEMU_CHECK_ARG(l.cp == 1 || o.model.flash_attention,
                   "context parallel {} with unfused core attention: MindSpeed's context-parallel "
                   "attention is flash attention (use flash attention, or context parallel 1)",
                   l.cp);
  COCEMU_CHECK_ARG(l.cp == 1 || !world.numerics || l.dtype == DType::f32 || l.dtype == DType::f64,
                   "context parallel attention runs its numerics in f32 or f64, not {}: use "
                   "--dtype f32 (or --dry-run to model {})",
                   name_of(l.dtype), name_of(l.dtype));
  // MindSpeed's _validate_cp_args on the model's head counts (the rules divide by tp × cp, or by
  // the Ulysses degree × tp, themselves).
  if (l.cp > 1)
    attn::validate(cp_config(l), {.batch = l.micro_batch_size,
                                  .heads = o.model.heads,
                                  .kv_heads = o.model.kv(),
                                  .seq = o.model.seq,
                                  .head_dim = o.model.hidden / o.model.heads,
                                  .dtype = l.dtype});
  COCEMU_CHECK_ARG(l.micro_batch_interleave == 1 || l.cp == 1,
                   "micro_batch_interleave_num {} with context parallel {} is not supported",
                   l.micro_batch_interleave, l.cp);
  COCEMU_CHECK_ARG(o.iterations >= 1 && o.iterations <= 1000, "iterations {} must be in [1, 1000]",
                   o.iterations);
  world.n_ranks = l.world();
  result.padded_vocab = padded_vocab(o.model.vocab, l.tp);
  Collected out;
  const int m = int(l.micro_batches());
  out.loss.assign(std::size_t(o.iterations),
                  std::vector<std::vector<std::shared_ptr<double>>>(
                      std::size_t(l.dp * l.cp * l.micro_batch_interleave),
                      std::vector<std::shared_ptr<double>>(std::size_t(m))));
  out.grad_norm.assign(std::size_t(o.iterations), nullptr);
  out.iteration_first_op.resize(std::size_t(l.world()));
  out.end_op.resize(std::size_t(l.world()));
  result.run = run(world, [&](Rank& rank) { StageRunner(rank, o, out).run(); });
  if (world.hosts) share_across_hosts(*world.hosts, l.world(), out);
  if (result.run.numerics) {
    for (const auto& per_dp : out.loss) {
      double sum = 0;
      for (const auto& per_mb : per_dp)
        for (const auto& v : per_mb)
          sum += *v;
      result.loss.push_back(sum / double(l.dp * l.cp * l.micro_batch_interleave * m));
    }
    for (const auto& g : out.grad_norm)
      result.grad_norm.push_back(*g);
  }
  result.weights = std::move(out.weights);
  result.blocks = std::move(out.blocks);
  result.pieces = std::move(out.pieces);
  result.iteration_first_op = std::move(out.iteration_first_op);
  result.end_op = std::move(out.end_op);
  return result;
}

}  // namespace cocemu::layers::train
