// The recorded graph of a world on several hosts, assembled on every host (exchange.h).
#include <fmt/format.h>

#include "exchange.h"

namespace cocemu::detail {

namespace {

void put_record(ByteWriter& w, const OpRecord& op) {
  w.put(op.rank).put(op.lane).put(op.index).put(op.cls).put_string(op.name).put(op.work_ns);
  w.put_vector(op.deps);
  w.put<std::uint64_t>(op.rendezvous.size());
  for (const Rendezvous& r : op.rendezvous)
    w.put_string(r.key).put(r.members);
  w.put(op.bytes).put(op.flops).put(op.hbm_bytes).put(op.link_use);
  w.put<std::uint8_t>(op.detail != nullptr);
  if (op.detail) w.put_string(*op.detail);
  w.put(op.seq);
  w.put<std::uint64_t>(op.phases ? op.phases->size() : ~std::uint64_t(0));
  if (op.phases)
    for (const auto& [name, ns] : *op.phases)
      w.put_string(name).put(ns);
  w.put(op.inner_compute_ns).put(op.inner_comm_ns).put_string(op.segment);
  w.put(op.wall_start_ns).put(op.wall_end_ns);
}

OpRecord get_record(ByteReader& r) {
  OpRecord op;
  op.rank = r.get<int>();
  op.lane = r.get<int>();
  op.index = r.get<std::uint32_t>();
  op.cls = r.get<OpClass>();
  op.name = r.get_string();
  op.work_ns = r.get<double>();
  op.deps = r.get_vector<OpRef>();
  const auto n_rendezvous = r.get<std::uint64_t>();
  for (std::uint64_t i = 0; i < n_rendezvous; ++i) {
    Rendezvous z;
    z.key = r.get_string();
    z.members = r.get<int>();
    op.rendezvous.push_back(std::move(z));
  }
  op.bytes = r.get<std::uint64_t>();
  op.flops = r.get<std::uint64_t>();
  op.hbm_bytes = r.get<std::uint64_t>();
  op.link_use = r.get<std::uint8_t>();
  if (r.get<std::uint8_t>()) op.detail = std::make_shared<const std::string>(r.get_string());
  op.seq = r.get<std::int64_t>();
  if (const auto n_phases = r.get<std::uint64_t>(); n_phases != ~std::uint64_t(0)) {
    auto phases = std::make_shared<Phases>();
    for (std::uint64_t i = 0; i < n_phases; ++i) {
      std::string name = r.get_string();
      phases->emplace_back(std::move(name), r.get<double>());
    }
    op.phases = std::move(phases);
  }
  op.inner_compute_ns = r.get<double>();
  op.inner_comm_ns = r.get<double>();
  op.segment = r.get_string();
  op.wall_start_ns = r.get<std::int64_t>();
  op.wall_end_ns = r.get<std::int64_t>();
  return op;
}

}  // namespace

void exchange_graphs(World& world) {
  HostLink& link = *world.hosts();
  ModelGraph& graph = world.graph();
  ByteWriter w;
  const std::vector<int> mine = world.local_ranks();
  for (const int r : mine) {
    const RankGraph& g = graph.ranks[std::size_t(r)];
    w.put<std::uint64_t>(g.lane_names.size());
    for (const std::string& name : g.lane_names)
      w.put_string(name);
    w.put<std::uint64_t>(g.ops.size());
    for (const OpRecord& op : g.ops)
      put_record(w, op);
  }
  const int per_host = world.size() / link.n_hosts();
  link.exchange(
      world.host_key("graph"), w.take(),
      [&](int h) {
        return fmt::format("the recorded ops of host {} (ranks {}..{}) at the end of the run", h,
                           h * per_host, (h + 1) * per_host - 1);
      },
      [&](int h, const Bytes& theirs) {
        ByteReader r(theirs, fmt::format("graph of host {}", h));
        for (int rank = h * per_host; rank < (h + 1) * per_host; ++rank) {
          RankGraph& g = graph.ranks[std::size_t(rank)];
          g.lane_names.clear();
          const auto n_lanes = r.get<std::uint64_t>();
          for (std::uint64_t i = 0; i < n_lanes; ++i)
            g.lane_names.push_back(r.get_string());
          const auto n_ops = r.get<std::uint64_t>();
          for (std::uint64_t i = 0; i < n_ops; ++i)
            g.ops.emplace_back(get_record(r));
        }
      });
}

}  // namespace cocemu::detail
