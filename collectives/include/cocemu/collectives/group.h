#pragma once
/// Process groups, as in torch.distributed: the world group, `new_group(ranks)` (called by every
/// rank, members or not, in the same order), `split(color, key)`, and a mesh helper that builds
/// Megatron-ordered tensor/context/data/pipeline-parallel groups (tp fastest, then cp, dp, pp).
#include <memory>
#include <string>
#include <vector>

#include "cocemu/runtime/world.h"

namespace cocemu {

namespace detail {
struct GroupState;
}

class Group {
 public:
  Group() = default;
  /// The group of all ranks.
  static Group world(Rank& rank);

  bool is_member() const { return local_rank_ >= 0; }
  /// This rank's rank within the group (-1 if not a member).
  int rank() const { return local_rank_; }
  int size() const;
  /// World ranks of the members, in group-rank order.
  const std::vector<int>& ranks() const;
  int world_rank_of(int group_rank) const;
  /// Short display name ("world", "g3", "tp0" …) used in traces and errors.
  const std::string& name() const;
  /// Unique across the run (names need not be): the key collectives and fused kernels use to
  /// match the ops of one call on every member.
  const std::string& key() const;
  Rank& owner() const { return *owner_; }
  detail::GroupState& state() const { return *state_; }
  /// Next collective sequence number on this group (host side, per rank).
  std::uint64_t next_sequence();
  /// The stream this rank's collectives and p2p ops on the group run on: the rank's comm stream
  /// unless `set_stream` gave the group one of its own. (PyTorch gives every process group its
  /// own communication stream; here groups share the comm stream unless told otherwise, so two
  /// groups' transfers overlap only where a program asks for it, as MindSpeed's separate
  /// send/recv communicators do.)
  Stream& stream() const;
  /// Runs this rank's ops on the group on `s` from now on (a stream of this rank).
  void set_stream(Stream& s);

 private:
  friend Group new_group(Rank&, const std::vector<int>&, const std::string&);
  friend Group split(Group&, int, int);
  std::shared_ptr<detail::GroupState> state_;
  Rank* owner_ = nullptr;
  int local_rank_ = -1;
};

/// Creates a group of `ranks` (distinct world ranks). Every world rank must call it, in the same
/// order and with the same list, as in PyTorch; non-members get a handle with `is_member()` false.
Group new_group(Rank& rank, const std::vector<int>& ranks, const std::string& name = "");

/// Splits `parent` (collective over it): members with the same color form a group, ordered by
/// (key, parent rank). A negative color leaves the rank out (non-member handle).
Group split(Group& parent, int color, int key);

struct MeshDims {
  int tp = 1, cp = 1, dp = 1, pp = 1;
};

/// Megatron's parallel groups for world = tp·cp·dp·pp, with rank = tp_rank + tp·(cp_rank +
/// cp·(dp_rank + dp·pp_rank)) (Megatron's default order "tp-cp-ep-dp-pp" without experts).
struct Mesh {
  MeshDims dims;
  Group tp, cp, dp, pp;
  int tp_rank = 0, cp_rank = 0, dp_rank = 0, pp_rank = 0;
};
Mesh make_mesh(Rank& rank, const MeshDims& dims);

}  // namespace cocemu
