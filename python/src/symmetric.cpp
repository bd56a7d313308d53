// Bindings of symmetric memory: the same allocation on every rank of a team, a peer's copy
// readable and writable, flags in peer memory.
#include <fmt/format.h>

#include <limits>

#include "cocemu/runtime/symmetric.h"
#include "common.h"

namespace cocemu::python {

namespace {

using namespace pybind11::literals;

// ---------------------------------------------------------------------------------------------
// Symmetric memory

struct SymmetricHandle {
  SymmetricBuffer buffer;
  SessionPtr session;
  const SymmetricBuffer& get(const char* call) const {
    session->check(call);
    return buffer;
  }
};

std::pair<const std::byte*, std::size_t> byte_span(py::handle array, const char* what,
                                                   Access access) {
  const Tensor t = tensor_arg(array, what, access);
  return {static_cast<const std::byte*>(t.raw()), t.nbytes()};
}

py::object symmetric_view(const SymmetricHandle& h, int team_rank, const char* call) {
  const SymmetricBuffer& b = h.get(call);
  COCEMU_CHECK_ARG(team_rank >= 0 && team_rank < b.team_size(),
                   "{}: team rank {} out of range 0..{}", call, team_rank, b.team_size() - 1);
  std::byte* p = b.peer(team_rank);
  COCEMU_CHECK_ARG(p != nullptr,
                   "{}: a dry run's symmetric memory has no storage (only op bodies, which dry "
                   "runs skip, may touch it)",
                   call);
  return byte_view(p, b.bytes(), std::make_shared<SymmetricBuffer>(b));
}

}  // namespace

void bind_symmetric(py::module_& m) {
  // Symmetric memory --------------------------------------------------------------------------
  py::class_<SymmetricHandle>(m, "SymmetricBuffer",
                              "The same allocation on every rank of a team, readable and "
                              "writable in a peer's copy, with flags in peer memory.")
      .def_static(
          "allocate",
          [](RankHandle& h, py::handle team_, py::handle bytes_, py::handle n_flags_) {
            Rank& r = h.host("SymmetricBuffer.allocate");
            const char* call = "SymmetricBuffer.allocate";
            COCEMU_CHECK_ARG(py::isinstance<py::sequence>(team_) && !py::isinstance<py::str>(team_),
                             "{}: team = {} ({}) is not a list of world ranks", call,
                             repr_of(team_), Py_TYPE(team_.ptr())->tp_name);
            std::vector<int> team;
            for (py::handle x : team_)
              team.push_back(int(int_arg(x, call, "a team rank", 0, r.world_size() - 1)));
            const auto bytes = std::size_t(
                int_arg(bytes_, call, "bytes", 0, std::numeric_limits<std::int64_t>::max()));
            const int n_flags =
                int(int_arg(n_flags_, call, "n_flags", 0, 1 << 20));  // 4 MiB of flags
            return SymmetricHandle{SymmetricBuffer::allocate(r, team, bytes, n_flags), h.session};
          },
          "rank"_a, "team"_a, "bytes"_a, "n_flags"_a = 0,
          "Called by every member of `team` (world ranks, same list, same order of calls).")
      .def_property_readonly(
          "team_rank", [](const SymmetricHandle& h) { return h.get("team_rank").team_rank(); })
      .def_property_readonly(
          "team_size", [](const SymmetricHandle& h) { return h.get("team_size").team_size(); })
      .def_property_readonly("bytes",
                             [](const SymmetricHandle& h) { return h.get("bytes").bytes(); })
      .def_property_readonly("n_flags",
                             [](const SymmetricHandle& h) { return h.get("n_flags").n_flags(); })
      .def(
          "local",
          [](const SymmetricHandle& h) {
            return symmetric_view(h, h.get("SymmetricBuffer.local").team_rank(),
                                  "SymmetricBuffer.local");
          },
          "This rank's copy as a uint8 NumPy view (x.view(np.float32) reinterprets it).")
      .def(
          "peer",
          [](const SymmetricHandle& h, int team_rank) {
            return symmetric_view(h, team_rank, "SymmetricBuffer.peer");
          },
          "team_rank"_a, "A peer's copy as a uint8 NumPy view.")
      .def(
          "put",
          [](const SymmetricHandle& h, py::handle peer_, py::handle offset_, py::handle src) {
            const SymmetricBuffer& b = h.get("SymmetricBuffer.put");
            const int peer =
                int(int_arg(peer_, "SymmetricBuffer.put", "peer", 0, b.team_size() - 1));
            const auto offset = std::size_t(int_arg(offset_, "SymmetricBuffer.put", "offset", 0,
                                                    std::numeric_limits<std::int64_t>::max()));
            auto [p, n] = byte_span(src, "SymmetricBuffer.put src", Access::read);
            py::gil_scoped_release nogil;
            b.put(peer, offset, p, n);
          },
          "peer"_a, "offset"_a, "src"_a, "Copies `src`'s bytes into peer's copy at `offset`.")
      .def(
          "get",
          [](const SymmetricHandle& h, py::handle peer_, py::handle offset_, py::handle dst) {
            const SymmetricBuffer& b = h.get("SymmetricBuffer.get");
            const int peer =
                int(int_arg(peer_, "SymmetricBuffer.get", "peer", 0, b.team_size() - 1));
            const auto offset = std::size_t(int_arg(offset_, "SymmetricBuffer.get", "offset", 0,
                                                    std::numeric_limits<std::int64_t>::max()));
            auto [p, n] = byte_span(dst, "SymmetricBuffer.get dst", Access::write);
            py::gil_scoped_release nogil;
            b.get(peer, offset, const_cast<std::byte*>(p), n);
          },
          "peer"_a, "offset"_a, "dst"_a, "Fills `dst` from peer's copy at `offset`.")
      .def(
          "signal",
          [](const SymmetricHandle& h, int peer, int slot, std::uint32_t n) {
            h.get("SymmetricBuffer.signal").signal(peer, slot, n);
          },
          "peer"_a, "slot"_a, "n"_a = 1, "Adds `n` to flag `slot` in peer's memory (release).")
      .def(
          "wait",
          [](const SymmetricHandle& h, int slot, std::uint32_t value, const std::string& what) {
            const SymmetricBuffer& b = h.get("SymmetricBuffer.wait");
            py::gil_scoped_release nogil;
            b.wait(slot, value, what);
          },
          "slot"_a, "value"_a, "what"_a = "",
          "Waits until this rank's flag `slot` is >= value (acquire), bounded by the timeout.")
      .def(
          "flag",
          [](const SymmetricHandle& h, int peer, int slot) {
            return h.get("SymmetricBuffer.flag").flag(peer, slot);
          },
          "peer"_a, "slot"_a);
}

}  // namespace cocemu::python
