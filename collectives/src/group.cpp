#include "cocemu/collectives/group.h"

#include <algorithm>
#include <atomic>
#include <numeric>
#include <set>

#include "cocemu/collectives/ops.h"
#include "cocemu/runtime/error.h"
#include "group_state.h"
#include "hosts/cross_host.h"

namespace cocemu {

namespace detail {

GroupState::GroupState(int id_, std::string name_, std::vector<int> ranks_)
    : id(id_), name(std::move(name_)), ranks(std::move(ranks_)), members(ranks.size()) {
  const std::size_t n = ranks.size();
  for (auto& m : members) {
    m.sends_to.assign(n, 0);
    m.recvs_from.assign(n, 0);
    m.received_from.assign(n, 0);
  }
  for (std::size_t i = 0; i < n * n; ++i)
    mailboxes.push_back(std::make_unique<Mailbox>());
}

void GroupState::barrier(int me, const std::function<std::string()>& what) {
  const std::uint64_t k = ++members[std::size_t(me)].barriers;
  arrivals.add(1);
  arrivals.wait_geq(std::uint32_t(k * std::uint64_t(size())), what);
}

std::uint32_t GroupState::join(int me, std::uint64_t seq, bool* last) {
  const std::uint64_t k = ++members[std::size_t(me)].joined[slot_of(seq)];
  const std::uint32_t all = std::uint32_t(k * std::uint64_t(size()));
  const bool completed = joins[slot_of(seq)].add(1) == all;
  if (last) *last = completed;
  return all;
}

}  // namespace detail

namespace {
std::string ranks_str(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks)
    s += fmt::format("{}{}", s.empty() ? "" : ",", r);
  return "[" + s + "]";
}

/// The group under `key`, shared by every rank of the world; the first rank to ask makes it with
/// `make`, sets its key and numbers it (GroupState::rendezvous_id). The numbering counter is
/// fetched first: World::shared runs makers under its lock, so a maker cannot ask for it.
template <class Make>
std::shared_ptr<detail::GroupState> shared_group(Rank& rank, const std::string& key, Make&& make) {
  const auto ids = rank.world().shared<std::atomic<std::uint32_t>>(
      "group/rendezvous ids", [] { return std::make_shared<std::atomic<std::uint32_t>>(0); });
  return rank.world().shared<detail::GroupState>(key, [&] {
    std::shared_ptr<detail::GroupState> s = make();
    s->key = key;
    s->spans_hosts = detail::spans_hosts(rank.world(), s->ranks);
    s->rendezvous_id = ids->fetch_add(1);
    return s;
  });
}
}  // namespace

Group Group::world(Rank& rank) {
  auto state = shared_group(rank, "group/world", [&] {
    std::vector<int> all(std::size_t(rank.world_size()));
    std::iota(all.begin(), all.end(), 0);
    return std::make_shared<detail::GroupState>(0, "world", all);
  });
  Group g;
  g.state_ = state;
  g.owner_ = &rank;
  g.local_rank_ = rank.id();
  return g;
}

int Group::size() const {
  return state_ ? state_->size() : 0;
}
const std::vector<int>& Group::ranks() const {
  return state_->ranks;
}
const std::string& Group::name() const {
  return state_->name;
}

const std::string& Group::key() const {
  return state_->key;
}

Stream& Group::stream() const {
  Stream* s = is_member() ? state_->members[std::size_t(local_rank_)].stream : nullptr;
  return s ? *s : owner_->comm_stream();
}

void Group::set_stream(Stream& s) {
  COCEMU_CHECK_ARG(is_member(), "Group::set_stream on rank {}: not a member of group {}",
                   owner_->id(), name());
  COCEMU_CHECK_ARG(&s.rank() == owner_,
                   "Group::set_stream on rank {}: stream '{}' belongs to rank {}", owner_->id(),
                   s.name(), s.rank().id());
  state_->members[std::size_t(local_rank_)].stream = &s;
}

int Group::world_rank_of(int group_rank) const {
  COCEMU_CHECK_ARG(group_rank >= 0 && group_rank < size(),
                   "group rank {} out of range for group {} of size {}", group_rank, name(),
                   size());
  return state_->ranks[std::size_t(group_rank)];
}

std::uint64_t Group::next_sequence() {
  COCEMU_CHECK_ARG(is_member(), "rank {} is not a member of group {} {}", owner_->id(), name(),
                   ranks_str(ranks()));
  return state_->members[std::size_t(local_rank_)].host_seq++;
}

Group new_group(Rank& rank, const std::vector<int>& ranks, const std::string& name) {
  COCEMU_CHECK_ARG(!ranks.empty(), "new_group on rank {}: the rank list is empty", rank.id());
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  COCEMU_CHECK_ARG(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
                   "new_group on rank {}: ranks {} contain duplicates", rank.id(),
                   ranks_str(ranks));
  COCEMU_CHECK_ARG(sorted.front() >= 0 && sorted.back() < rank.world_size(),
                   "new_group on rank {}: ranks {} must lie in 0..{}", rank.id(), ranks_str(ranks),
                   rank.world_size() - 1);
  const std::uint64_t k = rank.next_sequence("new_group");
  const std::string key = fmt::format("group/new/{}", k);
  auto state = shared_group(rank, key, [&] {
    return std::make_shared<detail::GroupState>(
        int(k) + 1, name.empty() ? fmt::format("g{}", k + 1) : name, ranks);
  });
  COCEMU_CHECK(state->ranks == ranks, Errc::mismatch,
               "new_group call #{} disagrees across ranks: rank {} passed {}, another rank passed "
               "{} (every rank must create the same groups in the same order)",
               k, rank.id(), ranks_str(ranks), ranks_str(state->ranks));
  Group g;
  g.state_ = state;
  g.owner_ = &rank;
  const auto it = std::find(ranks.begin(), ranks.end(), rank.id());
  g.local_rank_ = it == ranks.end() ? -1 : int(it - ranks.begin());
  return g;
}

namespace {
/// (color, key) of every member of one split call, exchanged through shared host memory (like
/// NCCL's commSplit bootstrap), so splits also work in dry-run mode.
struct SplitExchange {
  explicit SplitExchange(int n) : entries(std::size_t(n)) {}
  std::vector<std::pair<int, int>> entries;
  Counter arrived;
};
/// A split of a group whose members live on several hosts: each member sends its (color, key) to
/// the group's other hosts; the member that arrives last on its host collects the remote ones.
void exchange_across_hosts(Group& parent, std::uint64_t k, SplitExchange& ex) {
  World& world = parent.owner().world();
  HostLink& link = *world.hosts();
  const detail::GroupState& gs = parent.state();
  const auto key_of = [&](int member) {
    return world.host_key(fmt::format("split/{}/{}/{}", gs.key, k, member));
  };
  std::set<int> others;
  int local = 0;
  for (const int r : gs.ranks)
    if (world.is_local(r))
      ++local;
    else
      others.insert(world.host_of(r));
  detail::ByteWriter w;
  const auto [color, key] = ex.entries[std::size_t(parent.rank())];
  w.put(color).put(key);
  const Bytes mine = w.take();
  for (const int h : others)
    link.send(h, key_of(parent.rank()), mine);
  if (ex.arrived.add(1) != std::uint32_t(local)) return;
  for (int j = 0; j < gs.size(); ++j) {
    if (world.is_local(gs.ranks[std::size_t(j)])) continue;
    const Bytes theirs = link.receive(key_of(j), [&] {
      return fmt::format("group rank {} (world rank {} on host {}) to call split #{} of group {}",
                         j, gs.ranks[std::size_t(j)], world.host_of(gs.ranks[std::size_t(j)]), k,
                         gs.name);
    });
    detail::ByteReader r(theirs, fmt::format("split #{} of group {}", k, gs.name));
    const int color = r.get<int>();
    ex.entries[std::size_t(j)] = {color, r.get<int>()};
  }
  ex.arrived.add(std::uint32_t(gs.size() - local));
}
}  // namespace

Group split(Group& parent, int color, int key) {
  Rank& rank = parent.owner();
  COCEMU_CHECK_ARG(parent.is_member(), "split on rank {}: not a member of group {}", rank.id(),
                   parent.name());
  const int n = parent.size();
  const std::uint64_t k = rank.next_sequence("split/" + parent.state().key);
  auto ex =
      rank.world().shared<SplitExchange>(fmt::format("split-exchange/{}/{}", parent.state().key, k),
                                         [&] { return std::make_shared<SplitExchange>(n); });
  ex->entries[std::size_t(parent.rank())] = {color, key};
  if (parent.state().spans_hosts)
    exchange_across_hosts(parent, k, *ex);
  else
    ex->arrived.add(1);
  ex->arrived.wait_geq(std::uint32_t(n), [&] {
    return fmt::format("every member of group {} to call split #{}", parent.name(), k);
  });
  Group g;
  g.owner_ = &rank;
  if (color < 0) return g;
  std::vector<std::pair<int, int>> order;  // (key, parent rank) with my color
  for (int r = 0; r < n; ++r)
    if (ex->entries[std::size_t(r)].first == color)
      order.push_back({ex->entries[std::size_t(r)].second, r});
  std::sort(order.begin(), order.end());
  std::vector<int> members;
  for (const auto& [kk, r] : order)
    members.push_back(parent.world_rank_of(r));
  const std::string skey = fmt::format("group/split/{}/{}/{}", parent.state().key, k, color);
  g.state_ = shared_group(rank, skey, [&] {
    return std::make_shared<detail::GroupState>(
        1000 + int(k), fmt::format("{}.split{}.c{}", parent.name(), k, color), members);
  });
  const auto it = std::find(members.begin(), members.end(), rank.id());
  g.local_rank_ = int(it - members.begin());
  return g;
}

Mesh make_mesh(Rank& rank, const MeshDims& d) {
  COCEMU_CHECK_ARG(d.tp >= 1 && d.cp >= 1 && d.dp >= 1 && d.pp >= 1 &&
                       d.tp * d.cp * d.dp * d.pp == rank.world_size(),
                   "make_mesh on rank {}: tp·cp·dp·pp = {}·{}·{}·{} = {} must equal the world size "
                   "{} (each factor >= 1)",
                   rank.id(), d.tp, d.cp, d.dp, d.pp, d.tp * d.cp * d.dp * d.pp, rank.world_size());
  Mesh m;
  m.dims = d;
  const int r = rank.id();
  m.tp_rank = r % d.tp;
  m.cp_rank = (r / d.tp) % d.cp;
  m.dp_rank = (r / (d.tp * d.cp)) % d.dp;
  m.pp_rank = r / (d.tp * d.cp * d.dp);
  auto rank_of = [&](int t, int c, int dd, int p) {
    return t + d.tp * (c + d.cp * (dd + d.dp * p));
  };
  // Every rank creates every group in the same order; it keeps the ones it belongs to.
  auto build = [&](const char* kind, int count_outer, auto members_of, Group& out) {
    for (int i = 0; i < count_outer; ++i) {
      std::vector<int> ranks = members_of(i);
      Group g = new_group(rank, ranks, fmt::format("{}{}", kind, i));
      if (g.is_member()) out = g;
    }
  };
  build(
      "tp", d.cp * d.dp * d.pp,
      [&](int i) {
        std::vector<int> v;
        for (int t = 0; t < d.tp; ++t)
          v.push_back(i * d.tp + t);
        return v;
      },
      m.tp);
  build(
      "cp", d.tp * d.dp * d.pp,
      [&](int i) {
        const int t = i % d.tp, dd = (i / d.tp) % d.dp, p = i / (d.tp * d.dp);
        std::vector<int> v;
        for (int c = 0; c < d.cp; ++c)
          v.push_back(rank_of(t, c, dd, p));
        return v;
      },
      m.cp);
  build(
      "dp", d.tp * d.cp * d.pp,
      [&](int i) {
        const int t = i % d.tp, c = (i / d.tp) % d.cp, p = i / (d.tp * d.cp);
        std::vector<int> v;
        for (int dd = 0; dd < d.dp; ++dd)
          v.push_back(rank_of(t, c, dd, p));
        return v;
      },
      m.dp);
  build(
      "pp", d.tp * d.cp * d.dp,
      [&](int i) {
        const int t = i % d.tp, c = (i / d.tp) % d.cp, dd = i / (d.tp * d.cp);
        std::vector<int> v;
        for (int p = 0; p < d.pp; ++p)
          v.push_back(rank_of(t, c, dd, p));
        return v;
      },
      m.pp);
  return m;
}

}  // namespace cocemu
