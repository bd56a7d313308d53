// Bindings of the collectives library: groups (world, new_group, split, make_mesh), every
// collective and point-to-point op with PyTorch's async_op/Work semantics.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <utility>

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

/// A group rank (root, src, dst): an integer, not a bool, in 0..size-1.
int group_rank(py::handle value, const Group& group, const char* call, const char* name) {
  return int(int_arg(value, call, name, 0, group.size() - 1));
}

/// A point-to-point tag: an integer, not a bool, in int's range.
int tag_arg(py::handle value, const char* call) {
  return int(int_arg(value, call, "tag", std::numeric_limits<int>::min(),
                     std::numeric_limits<int>::max()));
}

/// A collective algorithm by name ('auto', 'ring', ...).
Algorithm algorithm_arg(py::handle algo) {
  COCEMU_CHECK_ARG(py::isinstance<py::str>(algo),
                   "algo = {} ({}) is not an algorithm name; allowed 'auto', 'ring', 'direct', "
                   "'hierarchical', 'tree'",
                   repr_of(algo), Py_TYPE(algo.ptr())->tp_name);
  return parse_algorithm(algo.cast<std::string>());
}

/// all_to_all's split sizes: None, or a list of integers (their sums and signs are all_to_all's
/// to check, with the group's context).
std::optional<std::vector<std::int64_t>> splits_arg(py::handle splits, const char* name) {
  if (splits.is_none()) return std::nullopt;
  COCEMU_CHECK_ARG(py::isinstance<py::sequence>(splits) && !py::isinstance<py::str>(splits),
                   "all_to_all: {} = {} ({}) is not a list of row counts", name, repr_of(splits),
                   Py_TYPE(splits.ptr())->tp_name);
  std::vector<std::int64_t> out;
  for (py::handle x : splits)
    out.push_back(int_arg(x, "all_to_all", name, std::numeric_limits<std::int64_t>::min(),
                          std::numeric_limits<std::int64_t>::max()));
  return out;
}

ReduceOp reduce_op_arg(py::handle op) {
  if (op.is_none()) return ReduceOp::sum;
  if (py::isinstance<ReduceOp>(op)) return op.cast<ReduceOp>();
  COCEMU_CHECK_ARG(py::isinstance<py::str>(op),
                   "op = {} ({}) is not a reduce op; allowed a cocemu.ReduceOp or one of 'sum', "
                   "'avg', 'max', 'min', 'prod'",
                   repr_of(op), Py_TYPE(op.ptr())->tp_name);
  const std::string given = op.cast<std::string>();
  std::string s = given;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "sum") return ReduceOp::sum;
  if (s == "avg") return ReduceOp::avg;
  if (s == "max") return ReduceOp::max;
  if (s == "min") return ReduceOp::min;
  if (s == "prod" || s == "product") return ReduceOp::prod;
  COCEMU_FAIL(Errc::invalid_argument,
              "reduce op '{}' is unknown; allowed: sum, avg, max, min, prod", given);
}

CollectiveOptions options(py::handle op, bool async_op, py::handle algo,
                          std::optional<bool> deterministic, const std::string& label) {
  CollectiveOptions o;
  o.op = reduce_op_arg(op);
  o.async_op = async_op;
  if (!algo.is_none()) o.algo = algorithm_arg(algo);
  o.deterministic = deterministic;
  o.label = label;
  return o;
}

/// async_op and deterministic: bools (or None for deterministic), not 0, 1 or a string.
std::pair<bool, std::optional<bool>> collective_flags(py::handle async_op, py::handle det,
                                                      const char* call) {
  const bool a = bool_arg(async_op, call, "async_op");
  if (det.is_none()) return {a, std::nullopt};
  return {a, bool_arg(det, call, "deterministic")};
}

/// The Python result of a collective: a Work with async_op, else None (as torch.distributed).
py::object result(const GroupHandle& g, const Work& w, bool async_op) {
  release_pending();  // what finished ops held: bounded by the ops in flight, not the run's
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
    COCEMU_CHECK_ARG(py::hasattr(item, "kind") && py::hasattr(item, "tensor") &&
                         py::hasattr(item, "peer") && py::hasattr(item, "tag"),
                     "batch_isend_irecv: an op is a cocemu.P2POp or a (kind, tensor, peer[, tag]) "
                     "tuple, got {} ({})",
                     repr_of(item), Py_TYPE(item.ptr())->tp_name);
    kind = item.attr("kind");
    tensor = item.attr("tensor");
    peer = item.attr("peer");
    tag = item.attr("tag");
  }
  COCEMU_CHECK_ARG(py::isinstance<py::str>(kind),
                   "batch_isend_irecv: op kind {} is unknown; allowed: 'send', 'recv'",
                   repr_of(kind));
  const std::string k = kind.cast<std::string>();
  COCEMU_CHECK_ARG(k == "send" || k == "recv",
                   "batch_isend_irecv: op kind '{}' is unknown; allowed: send, recv", k);
  P2POp op;
  op.kind = k == "send" ? P2POp::send : P2POp::recv;
  op.tensor = k == "send" ? read(tensor, "batch_isend_irecv send tensor")
                          : write(tensor, "batch_isend_irecv recv tensor");
  op.peer = int(int_arg(peer, "batch_isend_irecv", "peer", std::numeric_limits<int>::min(),
                        std::numeric_limits<int>::max()));
  op.tag = tag_arg(tag, "batch_isend_irecv");
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

/// The largest group collective_ns prices, as `cocemu collbench --dry-run` (a plan holds every
/// rank's steps: its size grows with the square of the group).
constexpr std::int64_t kMaxModeledRanks = 1024;

/// What enqueue charges a call (ops.cpp's count and size per op), without running it. `numel`
/// is the element count of the tensor torch.distributed takes: the tensor of all_reduce,
/// broadcast and reduce, the output of reduce_scatter and scatter, the input of all_gather and
/// gather, the whole input of all_to_all.
ModeledCollective price_collective(py::handle profile, py::handle op_, py::handle ranks,
                                   py::handle numel_, py::handle dtype, py::handle algo,
                                   bool deterministic, py::handle root) {
  std::vector<int> world;
  if (PyIndex_Check(ranks.ptr())) {  // a group size (a bool is refused by int_arg)
    const auto n = int(int_arg(ranks, "collective_ns", "ranks", 1, kMaxModeledRanks));
    for (int r = 0; r < n; ++r)
      world.push_back(r);
  } else {
    COCEMU_CHECK_ARG(py::isinstance<py::sequence>(ranks) && !py::isinstance<py::str>(ranks),
                     "collective_ns: ranks = {} ({}) is neither a group size nor a list of world "
                     "ranks",
                     repr_of(ranks), Py_TYPE(ranks.ptr())->tp_name);
    for (py::handle r : ranks)
      world.push_back(int(int_arg(r, "collective_ns", "a world rank", 0, kMaxModeledRanks - 1)));
    COCEMU_CHECK_ARG(!world.empty(), "collective_ns: the group has no ranks");
    COCEMU_CHECK_ARG(std::int64_t(world.size()) <= kMaxModeledRanks,
                     "collective_ns: the group has {} ranks; allowed 1..{}", world.size(),
                     kMaxModeledRanks);
  }
  const std::int64_t numel =
      int_arg(numel_, "collective_ns", "numel", 0, std::numeric_limits<std::int64_t>::max() / 16);
  const CollOp c = coll_op_arg(str_arg(op_, "collective_ns", "op"));
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
  const Algorithm a = algo.is_none() ? Algorithm::automatic : algorithm_arg(algo);
  const auto root_rank = int(int_arg(root, "collective_ns", "root", 0, n - 1));
  return model_collective(*profile_arg(profile), c, world, count, t, bytes, a, deterministic,
                          root_rank);
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
            {
              py::gil_scoped_release nogil;
              w.work.synchronize();
            }
            release_pending();
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
      [](py::handle profile, py::handle op, py::handle ranks, py::handle numel, py::handle dtype,
         py::handle algo, bool deterministic, py::handle root) {
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
      [](RankHandle& h, py::handle ranks_, py::handle name_) {
        Rank& r = h.host("new_group");
        COCEMU_CHECK_ARG(py::isinstance<py::sequence>(ranks_) && !py::isinstance<py::str>(ranks_),
                         "new_group: ranks = {} ({}) is not a list of world ranks", repr_of(ranks_),
                         Py_TYPE(ranks_.ptr())->tp_name);
        std::vector<int> ranks;
        for (py::handle x : ranks_)  // the range (0..world size - 1) is new_group's to name
          ranks.push_back(int(int_arg(x, "new_group", "a rank", std::numeric_limits<int>::min(),
                                      std::numeric_limits<int>::max())));
        const std::string name = str_arg(name_, "new_group", "name");
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
      [](GroupHandle& parent, py::handle color_, py::handle key_) {
        Group& p = parent.host("split");
        constexpr std::int64_t lo = std::numeric_limits<int>::min(),
                               hi = std::numeric_limits<int>::max();
        const auto color = int(int_arg(color_, "split", "color", lo, hi));
        const auto key = int(int_arg(key_, "split", "key", lo, hi));
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
      [](RankHandle& h, py::handle tp_, py::handle cp_, py::handle dp_, py::handle pp_) {
        Rank& r = h.host("make_mesh");
        const auto dim = [&](py::handle v, const char* name) {
          return int(int_arg(v, "make_mesh", name, 1, r.world_size()));
        };
        const int tp = dim(tp_, "tp"), cp = dim(cp_, "cp"), dp = dim(dp_, "dp"),
                  pp = dim(pp_, "pp");
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
      [](GroupHandle& g, py::handle tensor, py::handle output, py::handle op, py::handle async_op_,
         py::handle algo, py::handle det_, py::handle label) {
        Group& group = g.host("all_reduce");
        const auto [async_op, det] = collective_flags(async_op_, det_, "all_reduce");
        const CollectiveOptions o =
            options(op, async_op, algo, det, str_arg(label, "collective", "label"));
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
      [](GroupHandle& g, py::handle output, py::handle input, py::handle op, py::handle async_op_,
         py::handle algo, py::handle det_, py::handle label) {
        Group& group = g.host("reduce_scatter");
        const auto [async_op, det] = collective_flags(async_op_, det_, "reduce_scatter");
        return result(
            g,
            reduce_scatter(group, write(output, "reduce_scatter output"),
                           read(input, "reduce_scatter input"),
                           options(op, async_op, algo, det, str_arg(label, "collective", "label"))),
            async_op);
      },
      "group"_a, "output"_a, "input"_a, COCEMU_COLLECTIVE_KWARGS,
      "input has n·k elements, output k: rank r gets the reduction of block r of every input.");
  m.def(
      "all_gather",
      [](GroupHandle& g, py::handle output, py::handle input, py::handle op, py::handle async_op_,
         py::handle algo, py::handle det_, py::handle label) {
        Group& group = g.host("all_gather");
        const auto [async_op, det] = collective_flags(async_op_, det_, "all_gather");
        return result(
            g,
            all_gather(group, write(output, "all_gather output"), read(input, "all_gather input"),
                       options(op, async_op, algo, det, str_arg(label, "collective", "label"))),
            async_op);
      },
      "group"_a, "output"_a, "input"_a, COCEMU_COLLECTIVE_KWARGS,
      "input has k elements, output n·k: block r of every output is rank r's input.");
  m.def(
      "broadcast",
      [](GroupHandle& g, py::handle tensor, py::handle root, py::handle op, py::handle async_op_,
         py::handle algo, py::handle det_, py::handle label) {
        Group& group = g.host("broadcast");
        const auto [async_op, det] = collective_flags(async_op_, det_, "broadcast");
        return result(
            g,
            broadcast(group, write(tensor, "broadcast tensor"),
                      group_rank(root, group, "broadcast", "root"),
                      options(op, async_op, algo, det, str_arg(label, "collective", "label"))),
            async_op);
      },
      "group"_a, "tensor"_a, "root"_a, COCEMU_COLLECTIVE_KWARGS,
      "In place: every rank's tensor becomes the root's (root is a group rank).");
  m.def(
      "reduce",
      [](GroupHandle& g, py::handle tensor, py::handle root, py::handle op, py::handle async_op_,
         py::handle algo, py::handle det_, py::handle label) {
        Group& group = g.host("reduce");
        const auto [async_op, det] = collective_flags(async_op_, det_, "reduce");
        return result(
            g,
            reduce(group, write(tensor, "reduce tensor"), group_rank(root, group, "reduce", "root"),
                   options(op, async_op, algo, det, str_arg(label, "collective", "label"))),
            async_op);
      },
      "group"_a, "tensor"_a, "root"_a, COCEMU_COLLECTIVE_KWARGS,
      "The root's tensor becomes the reduction; other ranks' are left unchanged.");
  m.def(
      "gather",
      [](GroupHandle& g, py::handle output, py::handle input, py::handle root, py::handle op,
         py::handle async_op_, py::handle algo, py::handle det_, py::handle label) {
        Group& group = g.host("gather");
        const auto [async_op, det] = collective_flags(async_op_, det_, "gather");
        return result(
            g,
            gather(group, optional_tensor_arg(output, "gather output", Access::write),
                   read(input, "gather input"), group_rank(root, group, "gather", "root"),
                   options(op, async_op, algo, det, str_arg(label, "collective", "label"))),
            async_op);
      },
      "group"_a, "output"_a, "input"_a, "root"_a, COCEMU_COLLECTIVE_KWARGS,
      "The root's output (n·k elements; None elsewhere) gets every rank's input (k).");
  m.def(
      "scatter",
      [](GroupHandle& g, py::handle output, py::handle input, py::handle root, py::handle op,
         py::handle async_op_, py::handle algo, py::handle det_, py::handle label) {
        Group& group = g.host("scatter");
        const auto [async_op, det] = collective_flags(async_op_, det_, "scatter");
        return result(
            g,
            scatter(group, write(output, "scatter output"),
                    optional_tensor_arg(input, "scatter input", Access::read),
                    group_rank(root, group, "scatter", "root"),
                    options(op, async_op, algo, det, str_arg(label, "collective", "label"))),
            async_op);
      },
      "group"_a, "output"_a, "input"_a, "root"_a, COCEMU_COLLECTIVE_KWARGS,
      "Rank r's output (k elements) gets block r of the root's input (n·k; None elsewhere).");
  m.def(
      "all_to_all",
      [](GroupHandle& g, py::handle output, py::handle input, py::handle output_splits_,
         py::handle input_splits_, py::handle op, py::handle async_op_, py::handle algo,
         py::handle det_, py::handle label) {
        Group& group = g.host("all_to_all");
        const auto output_splits = splits_arg(output_splits_, "output_splits"),
                   input_splits = splits_arg(input_splits_, "input_splits");
        const auto [async_op, det] = collective_flags(async_op_, det_, "all_to_all");
        const CollectiveOptions o =
            options(op, async_op, algo, det, str_arg(label, "collective", "label"));
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
      [](GroupHandle& g, py::handle async_op_) -> py::object {
        const bool async_op = bool_arg(async_op_, "barrier", "async_op");
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
      [](GroupHandle& g, py::handle tensor, py::handle dst, py::handle tag) {
        Group& group = g.host("isend");
        return WorkHandle{isend(group, read(tensor, "isend tensor"),
                                group_rank(dst, group, "isend", "dst"), tag_arg(tag, "isend")),
                          g.session, &group.owner()};
      },
      "group"_a, "tensor"_a, "dst"_a, "tag"_a = 0, "dst is a group rank.");
  m.def(
      "irecv",
      [](GroupHandle& g, py::handle tensor, py::handle src, py::handle tag) {
        Group& group = g.host("irecv");
        return WorkHandle{irecv(group, write(tensor, "irecv tensor"),
                                group_rank(src, group, "irecv", "src"), tag_arg(tag, "irecv")),
                          g.session, &group.owner()};
      },
      "group"_a, "tensor"_a, "src"_a, "tag"_a = 0, "src is a group rank.");
  m.def(
      "send",
      [](GroupHandle& g, py::handle tensor, py::handle dst, py::handle tag) {
        Group& group = g.host("send");
        send(group, read(tensor, "send tensor"), group_rank(dst, group, "send", "dst"),
             tag_arg(tag, "send"));
      },
      "group"_a, "tensor"_a, "dst"_a, "tag"_a = 0);
  m.def(
      "recv",
      [](GroupHandle& g, py::handle tensor, py::handle src, py::handle tag) {
        Group& group = g.host("recv");
        recv(group, write(tensor, "recv tensor"), group_rank(src, group, "recv", "src"),
             tag_arg(tag, "recv"));
      },
      "group"_a, "tensor"_a, "src"_a, "tag"_a = 0);
  m.def(
      "batch_isend_irecv",
      [](GroupHandle& g, py::handle ops) {
        Group& group = g.host("batch_isend_irecv");
        COCEMU_CHECK_ARG(py::isinstance<py::sequence>(ops) && !py::isinstance<py::str>(ops),
                         "batch_isend_irecv: ops = {} ({}) is not a list of cocemu.P2POp",
                         repr_of(ops), Py_TYPE(ops.ptr())->tp_name);
        std::vector<P2POp> batch;
        for (py::handle item : ops)
          batch.push_back(p2p_op(item));
        return WorkHandle{batch_isend_irecv(group, batch), g.session, &group.owner()};
      },
      "group"_a, "ops"_a,
      "All ops (cocemu.P2POp or (kind, tensor, peer[, tag]) tuples) as one comm-stream op.");
}

}  // namespace cocemu::python
