// Bindings of the collectives library: groups (world, new_group, split, make_mesh), every
// collective and point-to-point op with PyTorch's async_op/Work semantics.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "cocemu/collectives/group.h"
#include "cocemu/collectives/ops.h"
#include "cocemu/collectives/plan.h"
#include "collectives.h"

namespace cocemu::python {

namespace {

using namespace pybind11::literals;

struct WorkHandle {
  Work work;
  SessionPtr session;
  Rank* rank = nullptr;
};

struct MeshHandle {
  MeshDims dims;
  py::object tp, cp, dp, pp;
  int tp_rank = 0, cp_rank = 0, dp_rank = 0, pp_rank = 0;
};

ReduceOp reduce_op_arg(py::handle op) {
  if (op.is_none()) return ReduceOp::sum;
  if (py::isinstance<ReduceOp>(op)) return op.cast<ReduceOp>();
  COCEMU_CHECK_ARG(py::isinstance<py::str>(op),
                   "op must be a cocemu.ReduceOp or one of 'sum', 'avg', 'max', 'min', 'prod', "
                   "got {}",
                   Py_TYPE(op.ptr())->tp_name);
  std::string s = op.cast<std::string>();
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "sum") return ReduceOp::sum;
  if (s == "avg") return ReduceOp::avg;
  if (s == "max") return ReduceOp::max;
  if (s == "min") return ReduceOp::min;
  if (s == "prod" || s == "product") return ReduceOp::prod;
  COCEMU_FAIL(Errc::invalid_argument,
              "reduce op '{}' is unknown; allowed: sum, avg, max, min, prod", s);
}

CollectiveOptions options(py::handle op, bool async_op, py::handle algo,
                          std::optional<bool> deterministic, const std::string& label) {
  CollectiveOptions o;
  o.op = reduce_op_arg(op);
  o.async_op = async_op;
  if (!algo.is_none()) o.algo = parse_algorithm(algo.cast<std::string>());
  o.deterministic = deterministic;
  o.label = label;
  return o;
}

/// The Python result of a collective: a Work with async_op, else None (as torch.distributed).
py::object result(const GroupHandle& g, const Work& w, bool async_op) {
  if (!async_op) return py::none();
  return py::cast(WorkHandle{w, g.session, &g.group.owner()});
}

Tensor read(py::handle t, const char* what) {
  return tensor_arg(t, what, Access::read);
}
Tensor write(py::handle t, const char* what) {
  return tensor_arg(t, what, Access::write);
}

#define COCEMU_COLLECTIVE_KWARGS                                                   \
  py::kw_only(), "op"_a = py::none(), "async_op"_a = false, "algo"_a = py::none(), \
                 "deterministic"_a = py::none(), "label"_a = ""

P2POp p2p_op(py::handle item) {
  py::object kind, tensor, peer, tag;
  if (py::isinstance<py::tuple>(item) || py::isinstance<py::list>(item)) {
    auto seq = py::reinterpret_borrow<py::sequence>(item);
    COCEMU_CHECK_ARG(seq.size() == 3 || seq.size() == 4,
                     "batch_isend_irecv: an op is (kind, tensor, peer[, tag]), got {} items",
                     seq.size());
    kind = seq[0];
    tensor = seq[1];
    peer = seq[2];
    tag = seq.size() == 4 ? py::object(seq[3]) : py::object(py::int_(0));
  } else {
    kind = item.attr("kind");
    tensor = item.attr("tensor");
    peer = item.attr("peer");
    tag = item.attr("tag");
  }
  const std::string k = kind.cast<std::string>();
  COCEMU_CHECK_ARG(k == "send" || k == "recv",
                   "batch_isend_irecv: op kind '{}' is unknown; allowed: send, recv", k);
  P2POp op;
  op.kind = k == "send" ? P2POp::send : P2POp::recv;
  op.tensor = k == "send" ? read(tensor, "batch_isend_irecv send tensor")
                          : write(tensor, "batch_isend_irecv recv tensor");
  op.peer = peer.cast<int>();
  op.tag = tag.cast<int>();
  return op;
}

CollOp coll_op_arg(const std::string& s) {
  static const std::pair<const char*, CollOp> ops[] = {
      {"all_reduce", CollOp::all_reduce}, {"reduce_scatter", CollOp::reduce_scatter},
      {"all_gather", CollOp::all_gather}, {"broadcast", CollOp::broadcast},
      {"reduce", CollOp::reduce},         {"gather", CollOp::gather},
      {"scatter", CollOp::scatter},       {"all_to_all", CollOp::all_to_all},
      {"barrier", CollOp::barrier}};
  for (const auto& [name, op] : ops)
    if (s == name) return op;
  COCEMU_FAIL(Errc::invalid_argument,
              "collective '{}' is unknown; allowed: all_reduce, reduce_scatter, all_gather, "
              "broadcast, reduce, gather, scatter, all_to_all, barrier",
              s);
}

/// What enqueue charges a call (ops.cpp's count and size per op), without running it. `numel`
/// is the element count of the tensor torch.distributed takes: the tensor of all_reduce,
/// broadcast and reduce, the output of reduce_scatter and scatter, the input of all_gather and
/// gather, the whole input of all_to_all.
ModeledCollective price_collective(py::handle profile, const std::string& op, py::handle ranks,
                                   std::int64_t numel, py::handle dtype, py::handle algo,
                                   bool deterministic, int root) {
  std::vector<int> world;
  if (py::isinstance<py::int_>(ranks)) {
    const int n = ranks.cast<int>();
    COCEMU_CHECK_ARG(n >= 1, "collective_ns: ranks = {} must be >= 1", n);
    for (int r = 0; r < n; ++r)
      world.push_back(r);
  } else {
    world = ranks.cast<std::vector<int>>();
    COCEMU_CHECK_ARG(!world.empty(), "collective_ns: the group has no ranks");
  }
  COCEMU_CHECK_ARG(numel >= 0, "collective_ns: numel = {} must be >= 0", numel);
  const CollOp c = coll_op_arg(op);
  const DType t = dtype_arg(dtype);
  const auto n = std::int64_t(world.size());
  const std::uint64_t e = size_of(t);
  std::int64_t count = numel;
  std::uint64_t bytes = std::uint64_t(numel) * e;
  switch (c) {
    case CollOp::reduce_scatter:
    case CollOp::all_gather:
    case CollOp::gather:
    case CollOp::scatter:
      bytes *= std::uint64_t(n);
      break;
    case CollOp::all_to_all:
      COCEMU_CHECK_ARG(numel % n == 0,
                       "collective_ns: all_to_all of {} elements over {} ranks is not an equal "
                       "split",
                       numel, n);
      count = numel / n;
      break;
    default:
      break;
  }
  const Algorithm a =
      algo.is_none() ? Algorithm::automatic : parse_algorithm(algo.cast<std::string>());
  return model_collective(*profile_arg(profile), c, world, count, t, bytes, a, deterministic, root);
}

}  // namespace

void bind_collectives(py::module_& m, Classes& classes) {
  py::enum_<ReduceOp>(m, "ReduceOp")
      .value("SUM", ReduceOp::sum)
      .value("AVG", ReduceOp::avg)
      .value("MAX", ReduceOp::max)
      .value("MIN", ReduceOp::min)
      .value("PRODUCT", ReduceOp::prod);

  py::class_<GroupHandle>(m, "Group", "A process group (torch.distributed's ProcessGroup).")
      .def_property_readonly("rank",
                             [](const GroupHandle& g) { return g.get("Group.rank").rank(); })
      .def_property_readonly("size",
                             [](const GroupHandle& g) { return g.get("Group.size").size(); })
      .def_property_readonly("ranks",
                             [](const GroupHandle& g) { return g.get("Group.ranks").ranks(); })
      .def_property_readonly("name",
                             [](const GroupHandle& g) { return g.get("Group.name").name(); })
      .def_property_readonly(
          "is_member", [](const GroupHandle& g) { return g.get("Group.is_member").is_member(); })
      .def("world_rank_of", [](const GroupHandle& g,
                               int r) { return g.get("Group.world_rank_of").world_rank_of(r); })
      .def_property_readonly("stream",
                             [](GroupHandle& g) {
                               Group& group = g.get("Group.stream");
                               return StreamHandle{&group.stream(), g.session};
                             })
      .def(
          "set_stream",
          [](GroupHandle& g, const StreamHandle& s) {
            Group& group = g.host("Group.set_stream");
            COCEMU_CHECK_ARG(s.session == g.session,
                             "Group.set_stream: the stream belongs to another cocemu.run");
            group.set_stream(*s.stream);
          },
          "stream"_a)
      .def("__repr__", [](const GroupHandle& g) {
        if (!g.session->alive) return std::string("cocemu.Group(<ended run>)");
        return fmt::format("cocemu.Group('{}', rank={}, size={})", g.group.name(), g.group.rank(),
                           g.group.size());
      });

  (*classes.rank).def_property_readonly("world", [](RankHandle& h) {
    Rank& r = h.get("Rank.world");
    if (!h.world) h.world = py::cast(GroupHandle{Group::world(r), h.session});
    return h.world;
  });

  py::class_<WorkHandle>(m, "Work", "An enqueued collective (torch.distributed's Work).")
      .def(
          "wait",
          [](const WorkHandle& w) {
            w.session->check("Work.wait");
            check_host_thread(*w.rank, "Work.wait");
            w.work.wait();
            return true;
          },
          "The rank's current stream waits for the op; the host does not block (NCCL/HCCL).")
      .def(
          "synchronize",
          [](const WorkHandle& w) {
            w.session->check("Work.synchronize");
            check_host_thread(*w.rank, "Work.synchronize");
            py::gil_scoped_release nogil;
            w.work.synchronize();
          },
          "Blocks the host until the op has finished; raises its error.")
      .def("is_completed",
           [](const WorkHandle& w) {
             w.session->check("Work.is_completed");
             return w.work.is_completed();
           })
      .def_property_readonly("event", [](const WorkHandle& w) {
        return EventHandle{w.work.event(), w.session, w.rank};
      });

  m.def(
      "collective_ns",
      [](py::handle profile, const std::string& op, py::handle ranks, std::int64_t numel,
         py::handle dtype, py::handle algo, bool deterministic, int root) {
        return price_collective(profile, op, ranks, numel, dtype, algo, deterministic, root)
            .cost.total_ns;
      },
      "profile"_a, "op"_a, "ranks"_a, "numel"_a, "dtype"_a = "bf16", py::kw_only(),
      "algo"_a = py::none(), "deterministic"_a = true, "root"_a = 0,
      "Modeled ns of one collective call as cocemu charges it, without running it. ranks: the "
      "group size (world ranks 0..n-1) or its world ranks; numel: the element count of the "
      "tensor torch.distributed takes (all_reduce's tensor, all_gather's input, "
      "reduce_scatter's output, all_to_all's whole input).");

  // Groups -----------------------------------------------------------------------------------
  m.def(
      "new_group",
      [](RankHandle& h, const std::vector<int>& ranks, const std::string& name) {
        Rank& r = h.host("new_group");
        Group g;
        {
          py::gil_scoped_release nogil;
          g = new_group(r, ranks, name);
        }
        return GroupHandle{std::move(g), h.session};
      },
      "rank"_a, "ranks"_a, "name"_a = "",
      "A group of `ranks` (world ranks). Every rank calls it, in the same order, with the same "
      "list; non-members get a handle with is_member False.");
  m.def(
      "split",
      [](GroupHandle& parent, int color, int key) {
        Group& p = parent.host("split");
        Group g;
        {
          py::gil_scoped_release nogil;
          g = split(p, color, key);
        }
        return GroupHandle{std::move(g), parent.session};
      },
      "group"_a, "color"_a, "key"_a = 0,
      "Splits `group` (collective over it): members with one color form a group, ordered by "
      "(key, rank); a negative color leaves the rank out.");
  py::class_<MeshHandle>(m, "Mesh", "Megatron's parallel groups (tp fastest, then cp, dp, pp).")
      .def_readonly("tp", &MeshHandle::tp)
      .def_readonly("cp", &MeshHandle::cp)
      .def_readonly("dp", &MeshHandle::dp)
      .def_readonly("pp", &MeshHandle::pp)
      .def_readonly("tp_rank", &MeshHandle::tp_rank)
      .def_readonly("cp_rank", &MeshHandle::cp_rank)
      .def_readonly("dp_rank", &MeshHandle::dp_rank)
      .def_readonly("pp_rank", &MeshHandle::pp_rank);
  m.def(
      "make_mesh",
      [](RankHandle& h, int tp, int cp, int dp, int pp) {
        Rank& r = h.host("make_mesh");
        Mesh mesh;
        {
          py::gil_scoped_release nogil;
          mesh = make_mesh(r, MeshDims{tp, cp, dp, pp});
        }
        const auto group = [&](Group& g) { return py::cast(GroupHandle{g, h.session}); };
        return MeshHandle{mesh.dims,      group(mesh.tp), group(mesh.cp),
                          group(mesh.dp), group(mesh.pp), mesh.tp_rank,
                          mesh.cp_rank,   mesh.dp_rank,   mesh.pp_rank};
      },
      "rank"_a, py::kw_only(), "tp"_a = 1, "cp"_a = 1, "dp"_a = 1, "pp"_a = 1,
      "world = tp·cp·dp·pp; rank = tp_rank + tp·(cp_rank + cp·(dp_rank + dp·pp_rank)).");

  // Collectives ------------------------------------------------------------------------------
  m.def(
      "all_reduce",
      [](GroupHandle& g, py::handle tensor, py::handle output, py::handle op, bool async_op,
         py::handle algo, std::optional<bool> det, const std::string& label) {
        Group& group = g.host("all_reduce");
        const CollectiveOptions o = options(op, async_op, algo, det, label);
        if (output.is_none())
          return result(g, all_reduce(group, write(tensor, "all_reduce tensor"), o), async_op);
        return result(g,
                      all_reduce(group, read(tensor, "all_reduce input"),
                                 write(output, "all_reduce output"), o),
                      async_op);
      },
      "group"_a, "tensor"_a, "output"_a = py::none(), COCEMU_COLLECTIVE_KWARGS,
      "In place (or into `output`): every rank's tensor becomes the reduction over the group.");
  m.def(
      "reduce_scatter",
      [](GroupHandle& g, py::handle output, py::handle input, py::handle op, bool async_op,
         py::handle algo, std::optional<bool> det, const std::string& label) {
        Group& group = g.host("reduce_scatter");
        return result(g,
                      reduce_scatter(group, write(output, "reduce_scatter output"),
                                     read(input, "reduce_scatter input"),
                                     options(op, async_op, algo, det, label)),
                      async_op);
      },
      "group"_a, "output"_a, "input"_a, COCEMU_COLLECTIVE_KWARGS,
      "input has n·k elements, output k: rank r gets the reduction of block r of every input.");
  m.def(
      "all_gather",
      [](GroupHandle& g, py::handle output, py::handle input, py::handle op, bool async_op,
         py::handle algo, std::optional<bool> det, const std::string& label) {
        Group& group = g.host("all_gather");
        return result(
            g,
            all_gather(group, write(output, "all_gather output"), read(input, "all_gather input"),
                       options(op, async_op, algo, det, label)),
            async_op);
      },
      "group"_a, "output"_a, "input"_a, COCEMU_COLLECTIVE_KWARGS,
      "input has k elements, output n·k: block r of every output is rank r's input.");
  m.def(
      "broadcast",
      [](GroupHandle& g, py::handle tensor, int root, py::handle op, bool async_op, py::handle algo,
         std::optional<bool> det, const std::string& label) {
        Group& group = g.host("broadcast");
        return result(g,
                      broadcast(group, write(tensor, "broadcast tensor"), root,
                                options(op, async_op, algo, det, label)),
                      async_op);
      },
      "group"_a, "tensor"_a, "root"_a, COCEMU_COLLECTIVE_KWARGS,
      "In place: every rank's tensor becomes the root's (root is a group rank).");
  m.def(
      "reduce",
      [](GroupHandle& g, py::handle tensor, int root, py::handle op, bool async_op, py::handle algo,
         std::optional<bool> det, const std::string& label) {
        Group& group = g.host("reduce");
        return result(g,
                      reduce(group, write(tensor, "reduce tensor"), root,
                             options(op, async_op, algo, det, label)),
                      async_op);
      },
      "group"_a, "tensor"_a, "root"_a, COCEMU_COLLECTIVE_KWARGS,
      "The root's tensor becomes the reduction; other ranks' are left unchanged.");
  m.def(
      "gather",
      [](GroupHandle& g, py::handle output, py::handle input, int root, py::handle op,
         bool async_op, py::handle algo, std::optional<bool> det, const std::string& label) {
        Group& group = g.host("gather");
        return result(
            g,
            gather(group, optional_tensor_arg(output, "gather output", Access::write),
                   read(input, "gather input"), root, options(op, async_op, algo, det, label)),
            async_op);
      },
      "group"_a, "output"_a, "input"_a, "root"_a, COCEMU_COLLECTIVE_KWARGS,
      "The root's output (n·k elements; None elsewhere) gets every rank's input (k).");
  m.def(
      "scatter",
      [](GroupHandle& g, py::handle output, py::handle input, int root, py::handle op,
         bool async_op, py::handle algo, std::optional<bool> det, const std::string& label) {
        Group& group = g.host("scatter");
        return result(g,
                      scatter(group, write(output, "scatter output"),
                              optional_tensor_arg(input, "scatter input", Access::read), root,
                              options(op, async_op, algo, det, label)),
                      async_op);
      },
      "group"_a, "output"_a, "input"_a, "root"_a, COCEMU_COLLECTIVE_KWARGS,
      "Rank r's output (k elements) gets block r of the root's input (n·k; None elsewhere).");
  m.def(
      "all_to_all",
      [](GroupHandle& g, py::handle output, py::handle input,
         std::optional<std::vector<std::int64_t>> output_splits,
         std::optional<std::vector<std::int64_t>> input_splits, py::handle op, bool async_op,
         py::handle algo, std::optional<bool> det, const std::string& label) {
        Group& group = g.host("all_to_all");
        const CollectiveOptions o = options(op, async_op, algo, det, label);
        const Tensor out = write(output, "all_to_all output"), in = read(input, "all_to_all input");
        COCEMU_CHECK_ARG(output_splits.has_value() == input_splits.has_value(),
                         "all_to_all: give both output_splits and input_splits, or neither");
        if (!output_splits) return result(g, all_to_all(group, out, in, o), async_op);
        return result(g, all_to_all(group, out, in, *output_splits, *input_splits, o), async_op);
      },
      "group"_a, "output"_a, "input"_a, "output_splits"_a = py::none(),
      "input_splits"_a = py::none(), COCEMU_COLLECTIVE_KWARGS,
      "Equal splits, or explicit ones in rows of dimension 0 (torch's all_to_all_single).");
  m.def(
      "barrier",
      [](GroupHandle& g, bool async_op) -> py::object {
        Group& group = g.host("barrier");
        CollectiveOptions o;
        o.async_op = async_op;
        Work w;
        {
          py::gil_scoped_release nogil;  // without async_op the host blocks until all entered
          w = barrier(group, o);
        }
        return result(g, w, async_op);
      },
      "group"_a, py::kw_only(), "async_op"_a = false);

  // Point to point ---------------------------------------------------------------------------
  m.def(
      "isend",
      [](GroupHandle& g, py::handle tensor, int dst, int tag) {
        Group& group = g.host("isend");
        return WorkHandle{isend(group, read(tensor, "isend tensor"), dst, tag), g.session,
                          &group.owner()};
      },
      "group"_a, "tensor"_a, "dst"_a, "tag"_a = 0, "dst is a group rank.");
  m.def(
      "irecv",
      [](GroupHandle& g, py::handle tensor, int src, int tag) {
        Group& group = g.host("irecv");
        return WorkHandle{irecv(group, write(tensor, "irecv tensor"), src, tag), g.session,
                          &group.owner()};
      },
      "group"_a, "tensor"_a, "src"_a, "tag"_a = 0, "src is a group rank.");
  m.def(
      "send",
      [](GroupHandle& g, py::handle tensor, int dst, int tag) {
        send(g.host("send"), read(tensor, "send tensor"), dst, tag);
      },
      "group"_a, "tensor"_a, "dst"_a, "tag"_a = 0);
  m.def(
      "recv",
      [](GroupHandle& g, py::handle tensor, int src, int tag) {
        recv(g.host("recv"), write(tensor, "recv tensor"), src, tag);
      },
      "group"_a, "tensor"_a, "src"_a, "tag"_a = 0);
  m.def(
      "batch_isend_irecv",
      [](GroupHandle& g, const py::sequence& ops) {
        Group& group = g.host("batch_isend_irecv");
        std::vector<P2POp> batch;
        for (py::handle item : ops)
          batch.push_back(p2p_op(item));
        return WorkHandle{batch_isend_irecv(group, batch), g.session, &group.owner()};
      },
      "group"_a, "ops"_a,
      "All ops (cocemu.P2POp or (kind, tensor, peer[, tag]) tuples) as one comm-stream op.");
}

}  // namespace cocemu::python
