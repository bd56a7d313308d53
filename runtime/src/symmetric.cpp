#include "cocemu/runtime/symmetric.h"

#include "cocemu/runtime/error.h"
#include "cocemu/runtime/tensor.h"

#include <cstring>
#include <new>

namespace cocemu {

namespace detail {
struct SymmetricState {
  std::vector<int> team;
  std::size_t bytes = 0;
  int n_flags = 0;
  std::vector<Tensor> memory;  // from the caching allocator: repeated runs reuse warm pages
  std::vector<std::unique_ptr<Counter[]>> flags;
};
}  // namespace detail

namespace {
std::string team_str(const std::vector<int>& team) {
  std::string s;
  for (int r : team)
    s += fmt::format("{}{}", s.empty() ? "" : ",", r);
  return s;
}
}  // namespace

SymmetricBuffer SymmetricBuffer::allocate(Rank& rank, const std::vector<int>& team,
                                          std::size_t bytes, int n_flags) {
  int me = -1;
  for (std::size_t i = 0; i < team.size(); ++i) {
    COCEMU_CHECK_ARG(team[i] >= 0 && team[i] < rank.world_size(),
                     "symmetric allocation on rank {}: team member {} is not a rank of the world "
                     "(size {})",
                     rank.id(), team[i], rank.world_size());
    if (team[i] == rank.id()) me = int(i);
  }
  COCEMU_CHECK_ARG(me >= 0, "symmetric allocation: rank {} is not in the team [{}]", rank.id(),
                   team_str(team));
  COCEMU_CHECK_ARG(n_flags >= 0, "symmetric allocation: n_flags = {} must be >= 0", n_flags);
  // Peers' memory is read in place (a fused kernel's tiles, remote flags): one address space.
  for (const int r : team)
    COCEMU_CHECK_ARG(
        rank.world().host_of(r) == rank.world().host_of(rank.id()),
        "symmetric allocation on rank {}: team [{}] spans hosts (rank {} on host {}, "
        "rank {} on host {}); symmetric memory and the fused kernels that use it "
        "need their team on one host: keep tensor and context parallel groups "
        "within a host's {} ranks",
        rank.id(), team_str(team), rank.id(), rank.world().host_of(rank.id()), r,
        rank.world().host_of(r),
        rank.world().size() / (rank.world().hosts() ? rank.world().hosts()->n_hosts() : 1));
  const std::string base = "sym/" + team_str(team);
  const std::uint64_t seq = rank.next_sequence(base);
  auto state = rank.world().shared<detail::SymmetricState>(fmt::format("{}/{}", base, seq), [&] {
    auto s = std::make_shared<detail::SymmetricState>();
    s->team = team;
    s->bytes = bytes;
    s->n_flags = n_flags;
    for (std::size_t i = 0; i < team.size(); ++i) {
      // A dry run runs no kernel body, so nothing reads or writes the memory: no storage
      // (zeroing a fused kernel's tile slots at full size dominated dry runs' time).
      s->memory.push_back(rank.numerics() ? Tensor::zeros({std::int64_t(bytes)}, DType::i8)
                                          : Tensor::shape_only({std::int64_t(bytes)}, DType::i8));
      s->flags.emplace_back(new Counter[std::size_t(n_flags ? n_flags : 1)]);
    }
    return s;
  });
  COCEMU_CHECK(state->bytes == bytes && state->n_flags == n_flags, Errc::mismatch,
               "symmetric allocation #{} on team [{}]: rank {} asked for {} bytes and {} flags, "
               "but another member allocated {} bytes and {} flags",
               seq, team_str(team), rank.id(), bytes, n_flags, state->bytes, state->n_flags);
  SymmetricBuffer b;
  b.state_ = state;
  b.me_ = me;
  b.rank_ = rank.id();
  return b;
}

int SymmetricBuffer::team_size() const {
  return int(state_->team.size());
}
std::size_t SymmetricBuffer::bytes() const {
  return state_->bytes;
}
int SymmetricBuffer::n_flags() const {
  return state_->n_flags;
}

std::byte* SymmetricBuffer::peer(int p) const {
  COCEMU_CHECK_ARG(p >= 0 && p < team_size(),
                   "symmetric buffer on rank {}: peer {} out of range "
                   "0..{}",
                   rank_, p, team_size() - 1);
  return static_cast<std::byte*>(state_->memory[std::size_t(p)].raw());
}

void SymmetricBuffer::check_range(const char* call, int p, std::size_t offset,
                                  std::size_t n) const {
  COCEMU_CHECK_ARG(p >= 0 && p < team_size(), "{} on rank {}: peer {} out of range 0..{}", call,
                   rank_, p, team_size() - 1);
  COCEMU_CHECK_ARG(offset <= bytes() && n <= bytes() - offset,
                   "{} on rank {} to peer {}: range [{}, {}) exceeds the buffer of {} bytes", call,
                   rank_, p, offset, offset + n, bytes());
}

void SymmetricBuffer::put(int p, std::size_t offset, const void* src, std::size_t n) const {
  check_range("put", p, offset, n);
  if (n) std::memcpy(peer(p) + offset, src, n);
}

void SymmetricBuffer::get(int p, std::size_t offset, void* dst, std::size_t n) const {
  check_range("get", p, offset, n);
  if (n) std::memcpy(dst, peer(p) + offset, n);
}

void SymmetricBuffer::signal(int p, int slot, std::uint32_t n) const {
  COCEMU_CHECK_ARG(p >= 0 && p < team_size() && slot >= 0 && slot < n_flags(),
                   "signal on rank {}: peer {} / slot {} out of range (peers 0..{}, slots 0..{})",
                   rank_, p, slot, team_size() - 1, n_flags() - 1);
  state_->flags[std::size_t(p)][slot].add(n);
}

void SymmetricBuffer::wait(int slot, std::uint32_t value, const std::string& what) const {
  COCEMU_CHECK_ARG(slot >= 0 && slot < n_flags(), "wait on rank {}: slot {} out of range 0..{}",
                   rank_, slot, n_flags() - 1);
  state_->flags[std::size_t(me_)][slot].wait_geq(
      value, [&] { return fmt::format("symmetric flag slot {} >= {} ({})", slot, value, what); });
}

std::uint32_t SymmetricBuffer::flag(int p, int slot) const {
  COCEMU_CHECK_ARG(p >= 0 && p < team_size() && slot >= 0 && slot < n_flags(),
                   "flag on rank {}: peer {} / slot {} out of range", rank_, p, slot);
  return state_->flags[std::size_t(p)][slot].load();
}

}  // namespace cocemu
