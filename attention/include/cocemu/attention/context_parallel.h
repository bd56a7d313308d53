#pragma once
/// Context-parallel attention with MindSpeed's algorithms and options:
///  - `ulysses_cp_algo`: all_to_all from sequence shards to head shards, local attention over the
///    whole sequence, all_to_all back (KV heads repeated to the query heads when they cannot be
///    sharded, as MindSpeed does);
///  - `megatron_cp_algo`: ring attention — KV blocks travel the ring, partial results merge by
///    LSE; causal masks use the load-balanced split (2·cp chunks, rank r holds r and 2cp−1−r);
///    the backward sends dK/dV around the ring with the blocks; with `cp_window_size` w > 1 it is
///    the double ring (an inner ring of w ranks, an outer ring across windows whose transfer is
///    posted at the start of each window and overlaps its w inner steps);
///  - `hybrid_cp_algo`: Ulysses of degree `ulysses_degree_in_cp` inside, (double) ring outside.
/// Every transfer is posted before the compute it hides behind, as MindSpeed does: KV blocks
/// before the current block's kernel, dK/dV of block t after it (hidden behind block t+1).
/// Sends and receives are ordered by ring parity on one communicator (stream);
/// `use_cp_send_recv_overlap` gives them two, so they no longer serialise (MindSpeed's RingP2P;
/// it needs even ring sizes, as MindSpeed's parity pairing does). The inner and outer rings of a
/// double ring have communicators (streams) of their own. Results are bitwise identical either
/// way.
///
/// Tensors are stored SBH ([S_local, B, H·D], MindSpeed's storage order); the kernel runs in BNSD
/// when `megatron_cp_in_bnsd` (the default) and directly on SBH otherwise. LSE is [B, H, S_local].
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cocemu/attention/local_attention.h"
#include "cocemu/collectives/group.h"

namespace cocemu::attn {

struct CpConfig {
  int context_parallel_size = 1;
  std::string context_parallel_algo = "megatron_cp_algo";
  int cp_window_size = 1;
  int ulysses_degree_in_cp = 0;                ///< hybrid_cp_algo only
  std::string attention_mask_type = "causal";  ///< causal | general
  bool use_cp_send_recv_overlap = false;
  bool megatron_cp_in_bnsd = true;
  int tensor_model_parallel_size = 1;  ///< only for MindSpeed's head-divisibility rules
};

struct AttentionProblem {
  std::int64_t batch = 1, heads = 1, kv_heads = 1, seq = 0, head_dim = 0;
  DType dtype = DType::f64;
  std::shared_ptr<const GeneralMask> general_mask;  ///< for attention_mask_type = general
  double scale = 0;                                 ///< 0 = 1/sqrt(head_dim)
};

/// MindSpeed's validation rules; violations are `Errc::invalid_argument` naming the option, the
/// value seen and what is allowed.
void validate(const CpConfig& config, const AttentionProblem& problem);

/// Global positions of the tokens context-parallel rank `cp_rank` holds, in storage order.
std::vector<std::int64_t> token_positions(const CpConfig& config, std::int64_t seq, int cp_rank);

/// Bytes and messages this rank sent in one step of an algorithm.
struct TransferRecord {
  std::string phase;  ///< "a2a q", "kv ring", "dkv ring", "kv outer", …
  int step = 0;
  std::uint64_t bytes = 0;
  int messages = 0;
};

class CpAttention {
 public:
  /// Collective over `cp_group` (validates, builds the Ulysses/ring sub-groups).
  CpAttention(Group& cp_group, const CpConfig& config, const AttentionProblem& problem);

  struct Outputs {
    Tensor out;  ///< SBH [S_local, B, H·D]
    Tensor lse;  ///< [B, H, S_local]
  };
  struct Grads {
    Tensor dq, dk, dv;  ///< SBH, like q, k, v
  };
  /// q: [S_local, B, H·D], k and v: [S_local, B, Hkv·D], this rank's tokens (token_positions).
  Outputs forward(const Tensor& q, const Tensor& k, const Tensor& v);
  Grads backward(const Tensor& dout);

  const std::vector<std::int64_t>& positions() const { return positions_; }
  /// What `backward` needs from one `forward`. A pipeline keeps one per micro-batch in flight:
  /// take it after the forward, restore it before that micro-batch's backward.
  struct Saved {
    Tensor q, k, v, out, lse;
  };
  Saved take_saved() {
    return {std::exchange(q_, {}), std::exchange(k_, {}), std::exchange(v_, {}),
            std::exchange(out_, {}), std::exchange(lse_, {})};
  }
  void restore_saved(Saved s) {
    q_ = std::move(s.q);
    k_ = std::move(s.k);
    v_ = std::move(s.v);
    out_ = std::move(s.out);
    lse_ = std::move(s.lse);
  }
  const std::vector<TransferRecord>& transfers() const { return transfers_; }
  int ulysses_degree() const { return u_; }
  int ring_degree() const { return ring_size_; }

 private:
  struct Impl;
  Group cp_, ulysses_, ring_;
  Group outer_[2], inner_[2];  // send/recv communicators of the outer and inner rings
  CpConfig config_;
  AttentionProblem problem_;
  MaskSpec mask_;
  int cp_size_ = 1, u_ = 1, ring_size_ = 1, window_ = 1;
  std::vector<std::int64_t> positions_;              // my tokens
  std::vector<std::vector<std::int64_t>> ring_pos_;  // tokens of each ring member after Ulysses
  std::int64_t kv_heads_local_ = 0;
  bool kv_repeated_ = false;
  std::vector<TransferRecord> transfers_;
  // Saved by forward for backward (head-sharded, kernel layout).
  Tensor q_, k_, v_, out_, lse_;
};

}  // namespace cocemu::attn
