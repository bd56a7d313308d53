#pragma once
/// Local (single-rank) blockwise attention, flash style: the keys are visited tile by tile with an
/// online softmax, so the [S, S] score matrix never exists in full. Returns the output and the
/// log-sum-exp (LSE) of every query row; the backward recomputes the probabilities from the LSE.
///
/// Masks are defined on global token positions, so the same kernel serves every context-parallel
/// algorithm: a query at position p sees a key at position q if q <= p (causal), if mask[p][q]
/// (general), or always (none). Tiles in which nothing is visible are skipped. Rows that see no
/// key get output 0 and LSE = -inf (never NaN).
///
/// GQA/MQA: query head h uses key/value head h / (Hq / Hk). Layouts: BNSD [B, N, S, D] and SBH
/// [S, B, N·D] (MindSpeed's storage order), read and written in place through strides. f32 and f64.
#include <cstdint>
#include <memory>
#include <vector>

#include "cocemu/runtime/tensor.h"

namespace cocemu::attn {

enum class Layout : std::uint8_t { bnsd, sbh };
enum class MaskKind : std::uint8_t { none, causal, general };

/// A boolean [S, S] mask over global positions (true = visible), shared by all ranks.
struct GeneralMask {
  std::int64_t seq = 0;
  std::vector<std::uint8_t> visible;  // row-major [seq, seq]
  bool at(std::int64_t q, std::int64_t k) const { return visible[std::size_t(q * seq + k)] != 0; }
};

struct MaskSpec {
  MaskKind kind = MaskKind::none;
  std::shared_ptr<const GeneralMask> general;  ///< for MaskKind::general
  bool visible(std::int64_t q, std::int64_t k) const {
    switch (kind) {
      case MaskKind::none:
        return true;
      case MaskKind::causal:
        return k <= q;
      case MaskKind::general:
        return general->at(q, k);
    }
    return true;
  }
};

/// Shape of one attention call. Q has Sq rows per (batch, head), K/V have Sk.
struct AttentionShape {
  std::int64_t batch = 1, q_heads = 1, kv_heads = 1, q_len = 0, kv_len = 0, head_dim = 0;
};

/// Inputs of one call; `q_pos`/`k_pos` give the global position of every local row.
struct AttentionArgs {
  AttentionShape shape;
  Layout layout = Layout::bnsd;
  MaskSpec mask;
  double scale = 0;  ///< 0 = 1/sqrt(head_dim)
  const std::vector<std::int64_t>* q_pos = nullptr;
  const std::vector<std::int64_t>* k_pos = nullptr;
};

/// Makes a tensor of `layout` for the given heads and length: [B, N, S, D] or [S, B, N·D].
Tensor make_attention_tensor(Layout layout, std::int64_t batch, std::int64_t heads,
                             std::int64_t len, std::int64_t head_dim, DType dtype);
/// Converts between layouts (a copy).
Tensor convert_layout(const Tensor& t, Layout from, Layout to, std::int64_t heads,
                      std::int64_t head_dim);

/// out: like q; lse: [B, Hq, Sq] in q's dtype.
void attention_forward(const AttentionArgs& args, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& out, const Tensor& lse);

/// Gradients of one (Q, K/V block) pair given the *final* LSE and delta = rowsum(dO ∘ O) of every
/// query row. dq is accumulated (+=); dk and dv are accumulated (+=) as well, so a caller can sum
/// blocks in a fixed order.
void attention_backward(const AttentionArgs& args, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& dout, const Tensor& lse, const Tensor& delta,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv);

/// delta[b, h, s] = Σ_d dout ∘ out (the softmax-backward row term), [B, Hq, Sq].
Tensor attention_delta(const AttentionArgs& args, const Tensor& out, const Tensor& dout);

/// Merges a partial result (out_b, lse_b) into the running (out, lse) with log-sum-exp weights:
/// lse' = log(e^lse + e^lse_b), out' = out·e^(lse-lse') + out_b·e^(lse_b-lse'). Rows where both
/// are -inf stay (0, -inf).
void merge_partial(const AttentionArgs& args, const Tensor& out, const Tensor& lse,
                   const Tensor& out_b, const Tensor& lse_b);

/// Visible (query, key) pairs of a call, for the cost model and the accounting.
std::int64_t visible_pairs(const AttentionArgs& args);

/// What of a call's block a kernel has to touch: the visible pairs (× batch × query heads), the
/// query rows that see at least one key (× batch × query heads) and the key positions seen by
/// at least one query. MindSpeed's causal ring launches its kernel on exactly these: a block
/// from an earlier rank with the first half of the keys, one from a later rank with the second
/// half of the queries (ring_context_parallel.py), so they are what a block is priced by.
struct Visibility {
  std::int64_t pairs = 0, rows = 0, keys = 0;
};
Visibility visibility(const AttentionArgs& args);

/// Dense reference: materialises scores in f64, for tests.
void reference_attention(const AttentionArgs& args, const Tensor& q, const Tensor& k,
                         const Tensor& v, const Tensor& out, const Tensor& lse);

/// Dense reference backward in f64 (materialises P), for tests: writes dq, dk, dv.
void reference_attention_backward(const AttentionArgs& args, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& dout, const Tensor& dq,
                                  const Tensor& dk, const Tensor& dv);

}  // namespace cocemu::attn
