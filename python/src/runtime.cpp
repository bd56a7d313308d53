// Bindings of the runtime library: run and its result, ranks, streams, events, device profiles
// and the cost model (tensors: tensors.cpp; symmetric memory: symmetric.cpp).
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include <pybind11/numpy.h>

#include "cocemu/runtime/cost_model.h"
#include "cocemu/runtime/profile.h"
#include "cocemu/runtime/trace.h"
#include "common.h"

namespace cocemu::python {

namespace {

using namespace pybind11::literals;

// ---------------------------------------------------------------------------------------------
// run

/// What the rank threads of one `cocemu.run` use: owned by the C++ run's function, so a rank
/// left running after an interrupt (world.h, run) keeps it alive after `run` has returned.
struct PyRunState {
  std::shared_ptr<void> fn;  ///< the rank function (dropped with the GIL, see hold)
  SessionPtr session;
  std::vector<PyObject*> returns;         ///< by rank, owned; touched with the GIL held
  std::vector<unsigned long> py_threads;  ///< by rank: its thread while it runs Python, else 0
  py::object interrupt;                   ///< the exception a signal handler raised (GIL held)
};

/// A rank thread: runs fn(rank) with the GIL held; a Python exception unwinds the world.
void rank_main(Rank& rank, PyRunState& state) {
  py::gil_scoped_acquire gil;
  release_pending();
  const std::size_t r = std::size_t(rank.id());
  state.py_threads[r] = PyThread_get_thread_ident();
  struct Leave {
    PyRunState& state;
    std::size_t r;
    ~Leave() { state.py_threads[r] = 0; }
  } leave{state, r};
  // A launch on a full stream blocks (world.h, max_queued_ops): without the GIL, which the ops
  // it waits for (other ranks' launches, Python callables on streams) need.
  ScopedHostBlockingHook unlock_gil(
      {.release = []() -> void* { return PyGILState_Check() ? PyEval_SaveThread() : nullptr; },
       .reacquire =
           [](void* t) {
             if (t) PyEval_RestoreThread(static_cast<PyThreadState*>(t));
           }});
  try {
    py::object handle = py::cast(RankHandle{&rank, state.session, {}, {}});
    CurrentRank current(handle.ptr());
    py::object result = py::handle(static_cast<PyObject*>(state.fn.get()))(handle);
    // A rank that returns after its run was interrupted and ended keeps nothing.
    if (state.session->alive.load(std::memory_order_acquire))
      state.returns[r] = result.release().ptr();
  } catch (py::error_already_set& e) {
    rethrow_python(e, *state.session, rank.id());
  }
}

/// WorldOptions::interrupt_check for a Python run: lets the interpreter run its signal handlers
/// (only the main thread does; from another thread this finds nothing). When one raises
/// (KeyboardInterrupt), keeps the exception for `run` to re-raise, and raises
/// KeyboardInterrupt in the ranks still running Python code, so a busy loop stops too.
std::string check_python_signals(PyRunState& state) {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() == 0) return {};
  py::error_already_set e;  // takes the exception the handler raised
  state.interrupt = e.value();
  for (unsigned long t : state.py_threads)
    if (t != 0) PyThreadState_SetAsyncExc(t, PyExc_KeyboardInterrupt);
  return std::string("Python's ") + Py_TYPE(state.interrupt.ptr())->tp_name;
}

/// Re-raises `exception` (a rank's own Python exception) in the caller, the rank attached.
[[noreturn]] void reraise_rank_exception(py::object exception, int rank) {
  if (PyObject_SetAttrString(exception.ptr(), "rank", py::int_(rank).ptr()) < 0) PyErr_Clear();
  if (py::hasattr(exception, "add_note"))
    exception.attr("add_note")(fmt::format("(raised on cocemu rank {})", rank));
  PyObject* tb = PyException_GetTraceback(exception.ptr());  // new reference or null
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(exception.ptr()));
  Py_INCREF(type);
  PyErr_Restore(type, exception.release().ptr(), tb);
  throw py::error_already_set();
}

/// Every argument is checked strictly here (cocemu.run passes them through unconverted): a bool
/// is not a world size, a string is not a flag, a seed or timeout out of range is refused.
py::object run(py::handle n_ranks_arg, py::handle fn, py::handle profile, py::handle deterministic,
               py::handle schedule_seed, py::handle dry_run, py::handle timeout_s,
               py::handle record_wall_times) {
  constexpr const char* call = "cocemu.run";
  WorldOptions o;
  o.n_ranks = int(int_arg(n_ranks_arg, call, "n_ranks", 1, 256));
  COCEMU_CHECK_ARG(PyCallable_Check(fn.ptr()),
                   "{}: fn = {} ({}) is not callable; allowed a function taking the rank", call,
                   py::repr(fn).cast<std::string>(), Py_TYPE(fn.ptr())->tp_name);
  o.profile = profile_arg(profile);
  o.numerics = !bool_arg(dry_run, call, "dry_run");
  o.deterministic = bool_arg(deterministic, call, "deterministic");
  if (!schedule_seed.is_none())
    o.schedule_seed = std::uint64_t(
        int_arg(schedule_seed, call, "schedule_seed", 0, std::numeric_limits<std::int64_t>::max()));
  if (!timeout_s.is_none()) {
    const double max_s = double(kMaxTimeout.count()) / 1e3;
    const double t = seconds_arg(timeout_s, call, "timeout_s", max_s);
    o.timeout = std::chrono::milliseconds(
        std::clamp<std::int64_t>(std::llround(t * 1e3), 1, kMaxTimeout.count()));
  }
  o.record_wall_times = bool_arg(record_wall_times, call, "record_wall_times");
  const std::size_t n = std::size_t(o.n_ranks);
  auto state = std::make_shared<PyRunState>();
  state->fn = hold(fn);
  state->session = std::make_shared<Session>();
  state->session->failures.assign(n, nullptr);
  state->returns.assign(n, nullptr);
  state->py_threads.assign(n, 0);
  o.interrupt_check = [state] { return check_python_signals(*state); };
  std::optional<RunResult> result;
  std::exception_ptr error;
  {
    py::gil_scoped_release nogil;
    try {
      result = cocemu::run(o, [state](Rank& rank) { rank_main(rank, *state); });
    } catch (...) {
      error = std::current_exception();
    }
  }
  // Taken here, with the GIL: the state may outlive this call in a rank left running.
  py::object interrupt = std::move(state->interrupt);
  Session& session = *state->session;
  session.alive.store(false, std::memory_order_release);
  release_pending();
  py::list values;
  for (PyObject*& r : state->returns)
    values.append(r ? py::reinterpret_steal<py::object>(std::exchange(r, nullptr)) : py::none());
  int failed_rank = -1;
  std::string cancelled;
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      if (e.code() == Errc::rank_exception) failed_rank = e.rank();
      if (e.code() == Errc::cancelled) cancelled = e.message();
    } catch (...) {
    }
  }
  py::object exception;
  {
    std::lock_guard lock(session.mu);
    for (std::size_t r = 0; r < session.failures.size(); ++r) {
      PyObject* f = std::exchange(session.failures[r], nullptr);
      if (f && int(r) == failed_rank)
        exception = py::reinterpret_steal<py::object>(f);
      else
        Py_XDECREF(f);
    }
  }
  if (!cancelled.empty() && interrupt) {
    // The signal handler's exception (KeyboardInterrupt), with where every rank was.
    if (py::hasattr(interrupt, "add_note")) interrupt.attr("add_note")("cocemu: " + cancelled);
    PyObject* tb = PyException_GetTraceback(interrupt.ptr());
    PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(interrupt.ptr()));
    Py_INCREF(type);
    PyErr_Restore(type, interrupt.release().ptr(), tb);
    throw py::error_already_set();
  }
  if (exception) reraise_rank_exception(std::move(exception), failed_rank);
  if (error) std::rethrow_exception(error);
  PyRunResult out{std::make_shared<const RunResult>(std::move(*result)), std::move(values)};
  return py::cast(std::move(out));
}

// ---------------------------------------------------------------------------------------------
// Ops and the result

/// One op of a finished run, with its modeled times.
struct OpInfo {
  int rank = 0, lane = 0;
  std::uint32_t index = 0;
  std::string lane_name, name, kind, segment, detail;
  std::int64_t start_ns = 0, end_ns = 0;
  double work_ns = 0;
  std::uint64_t bytes = 0, flops = 0;
  std::int64_t seq = -1, wall_start_ns = -1, wall_end_ns = -1;
};

const RunResult& result_of(const PyRunResult& r) {
  return *r.result;
}

OpInfo op_info(const RunResult& r, OpRef ref) {
  COCEMU_CHECK_ARG(ref.rank >= 0 && ref.rank < int(r.graph.ranks.size()),
                   "op ({}, {}): rank out of range 0..{}", ref.rank, ref.index,
                   int(r.graph.ranks.size()) - 1);
  const RankGraph& g = r.graph.ranks[std::size_t(ref.rank)];
  COCEMU_CHECK_ARG(ref.index < g.ops.size(), "op ({}, {}): rank {} recorded {} ops", ref.rank,
                   ref.index, ref.rank, g.ops.size());
  const OpRecord& op = g.ops[ref.index];
  const ScheduledOp& t = r.timeline.at(ref);
  OpInfo i;
  i.rank = op.rank;
  i.lane = op.lane;
  i.index = op.index;
  i.lane_name = std::size_t(op.lane) < g.lane_names.size() ? g.lane_names[std::size_t(op.lane)]
                                                           : std::string();
  i.name = op.name;
  i.kind = to_string(op.cls);
  i.segment = op.segment;
  i.detail = op_detail(op);
  i.start_ns = t.start_ns;
  i.end_ns = t.end_ns;
  i.work_ns = op.work_ns;
  i.bytes = op.bytes;
  i.flops = op.flops;
  i.seq = op.seq;
  i.wall_start_ns = op.wall_start_ns;
  i.wall_end_ns = op.wall_end_ns;
  return i;
}

OpRef event_ref(const EventHandle& e, const char* call) {
  COCEMU_CHECK_ARG(e.event.op().valid(),
                   "{}: the event completes with no op (its stream was "
                   "empty when it was recorded)",
                   call);
  return e.event.op();
}

// ---------------------------------------------------------------------------------------------
// Stream launches

/// The modeled duration of a launched op: `work_ns` as given, else the roofline of `flops` at the
/// profile's large-GEMM rate and `bytes` at its memory bandwidth, at least the shortest kernel.
double launch_cost(const DeviceProfile& p, std::optional<double> work_ns,
                   std::optional<double> flops, std::optional<double> bytes, DType dtype) {
  // Bounded so that the modeled clock (int64 ns) and the op's uint64 counters cannot overflow:
  // work_ns at most 1e15 ns (about 11.6 days of device time), flops and bytes below 2**63.
  const auto check = [](const char* what, std::optional<double> v, double max) {
    COCEMU_CHECK_ARG(!v || (std::isfinite(*v) && *v >= 0 && *v <= max),
                     "Stream.launch: {} = {} is out of range; allowed a finite number in [0, {:g}]",
                     what, *v, max);
  };
  check("work_ns", work_ns, 1e15);
  check("flops", flops, 9.2e18);
  check("bytes", bytes, 9.2e18);
  if (work_ns) return *work_ns;
  if (!flops && !bytes) return 0;
  double ns = p.kernel_min_ns;
  if (flops) ns = std::max(ns, *flops / (p.peak(dtype) * p.gemm.max_efficiency) * 1e9);
  if (bytes) ns = std::max(ns, memory_ns(p, std::uint64_t(*bytes)));
  return ns;
}

OpClass op_class(const std::string& kind) {
  if (kind == "compute") return OpClass::compute;
  if (kind == "comm") return OpClass::comm;
  COCEMU_FAIL(Errc::invalid_argument, "Stream.launch: kind '{}' is unknown; allowed: compute, comm",
              kind);
}

LaunchKind launch_kind(const std::string& launch) {
  if (launch == "kernel") return LaunchKind::kernel;
  if (launch == "fused") return LaunchKind::fused;
  if (launch == "none") return LaunchKind::none;
  COCEMU_FAIL(Errc::invalid_argument, "launch '{}' is unknown; allowed: kernel, fused, none",
              launch);
}

OpRef launch(StreamHandle& h, py::handle name_, py::handle fn, py::handle work_ns_,
             py::handle flops_, py::handle bytes_, py::handle dtype, py::handle kind_,
             py::handle launch_, py::handle segment_) {
  Stream& s = h.host("Stream.launch");
  const char* call = "Stream.launch";
  const std::string name = str_arg(name_, call, "name");
  const auto number = [&](py::handle v, const char* what) -> std::optional<double> {
    if (v.is_none()) return std::nullopt;
    // The range is launch_cost's, which names it.
    return real_arg(v, call, what, -std::numeric_limits<double>::infinity(),
                    std::numeric_limits<double>::infinity());
  };
  const std::optional<double> work_ns = number(work_ns_, "work_ns"),
                              flops = number(flops_, "flops"), bytes = number(bytes_, "bytes");
  const std::string kind = str_arg(kind_, call, "kind"), launch = str_arg(launch_, call, "launch");
  std::optional<std::string> segment;
  if (!segment_.is_none()) segment = str_arg(segment_, call, "segment");
  Rank& rank = s.rank();
  OpSpec spec;
  spec.name = name;
  spec.cls = op_class(kind);
  spec.launch = launch_kind(launch);
  spec.work_ns = launch_cost(rank.profile(), work_ns, flops, bytes, dtype_arg(dtype));
  spec.flops = flops ? std::uint64_t(*flops) : 0;
  spec.bytes = bytes ? std::uint64_t(*bytes) : 0;
  std::function<void()> body;
  if (!fn.is_none()) {
    COCEMU_CHECK_ARG(PyCallable_Check(fn.ptr()), "Stream.launch('{}'): fn must be callable, got {}",
                     name, Py_TYPE(fn.ptr())->tp_name);
    body = [callable = hold(fn), session = h.session, r = rank.id()] {
      py::gil_scoped_acquire gil;
      try {
        py::handle(static_cast<PyObject*>(callable.get()))();
      } catch (py::error_already_set& e) {
        rethrow_python(e, *session, r);
      }
    };
  }
  if (!segment) return s.launch(std::move(spec), std::move(body));
  const std::string previous = rank.segment();
  rank.set_segment(*segment);
  const OpRef ref = s.launch(std::move(spec), std::move(body));
  rank.set_segment(previous);
  return ref;
}

/// A cocemu.Stream argument (rank.compute_stream, rank.comm_stream, rank.new_stream()).
StreamHandle& stream_arg(py::handle stream, const char* call) {
  COCEMU_CHECK_ARG(py::isinstance<StreamHandle>(stream),
                   "{}: stream = {} ({}) is not a cocemu.Stream", call, repr_of(stream),
                   Py_TYPE(stream.ptr())->tp_name);
  return stream.cast<StreamHandle&>();
}

EventHandle record(StreamHandle& h) {
  Stream& s = h.host("Stream.record");
  return EventHandle{s.record(), h.session, &s.rank()};
}

void wait_event(StreamHandle& h, const EventHandle& e) {
  Stream& s = h.host("Stream.wait");
  if (!e.session) return;
  COCEMU_CHECK_ARG(e.session == h.session,
                   "Stream.wait: the event belongs to another cocemu.run than the stream");
  s.wait(e.event);
}

}  // namespace

void bind_runtime(py::module_& m, Classes& classes) {
  // Profiles and the cost model ---------------------------------------------------------------
  py::class_<ProfileHandle>(m, "Profile", "A device profile (configs/devices/<name>.yaml).")
      .def_property_readonly("name", [](const ProfileHandle& p) { return p.profile->name; })
      .def_property_readonly("source", [](const ProfileHandle& p) { return p.profile->source; })
      .def(
          "peak_flops",
          [](const ProfileHandle& p, py::handle dtype) {
            return p.profile->peak(dtype_arg(dtype));
          },
          "dtype"_a = "bf16")
      .def_property_readonly("memory_bandwidth",
                             [](const ProfileHandle& p) { return p.profile->memory_bandwidth; })
      .def_property_readonly("memory_capacity",
                             [](const ProfileHandle& p) { return p.profile->memory_capacity; })
      .def_property_readonly("kernel_min_ns",
                             [](const ProfileHandle& p) { return p.profile->kernel_min_ns; })
      .def_property_readonly("kernel_overhead_ns",
                             [](const ProfileHandle& p) { return p.profile->kernel_overhead_ns; })
      .def_property_readonly(
          "memory_in_training_efficiency",
          [](const ProfileHandle& p) { return p.profile->memory_in_training_efficiency; })
      .def_property_readonly("launch_overhead_ns",
                             [](const ProfileHandle& p) { return p.profile->launch_overhead_ns; })
      .def_property_readonly(
          "fused_launch_overhead_ns",
          [](const ProfileHandle& p) { return p.profile->fused_launch_overhead_ns; })
      .def_property_readonly(
          "devices_per_node",
          [](const ProfileHandle& p) { return p.profile->topology.devices_per_node; })
      .def_property_readonly("contention",
                             [](const ProfileHandle& p) {
                               return py::dict(
                                   "compute_slowdown"_a = p.profile->contention.compute_slowdown,
                                   "comm_slowdown"_a = p.profile->contention.comm_slowdown);
                             })
      .def_property_readonly("assumptions",
                             [](const ProfileHandle& p) { return p.profile->assumptions; })
      .def("scalable_keys", [](const ProfileHandle& p) { return p.profile->scalable_keys(); })
      .def(
          "scaled",
          [](const ProfileHandle& p, py::handle key, py::handle factor) {
            const char* call = "Profile.scaled";
            return ProfileHandle{std::make_shared<const DeviceProfile>(p.profile->scaled(
                str_arg(key, call, "key"),
                real_arg(factor, call, "factor", std::numeric_limits<double>::min(),
                         std::numeric_limits<double>::max())))};
          },
          "key"_a, "factor"_a)
      .def("__repr__", [](const ProfileHandle& p) {
        return fmt::format("cocemu.Profile('{}')", p.profile->name);
      });
  m.def(
      "load_profile", [](py::handle p) { return ProfileHandle{profile_arg(p)}; },
      "name_or_path"_a = "ascend-910b",
      "A device profile by name (configs/devices/<name>.yaml) or YAML path.");
  m.def("config_dir", &config_dir,
        "The folder of the shipped configs (COCEMU_CONFIG_DIR, else found from where cocemu is "
        "installed or built).");

  const auto prof = [](py::handle p) { return profile_arg(p); };
  // Sizes are integers >= 0 (not bools), real figures finite numbers >= 0: a negative or NaN
  // size priced as if it were valid would be a silent wrong answer.
  constexpr std::int64_t kMaxSize = std::numeric_limits<std::int64_t>::max();
  const auto size = [](py::handle v, const char* call, const char* name) {
    return int_arg(v, call, name, 0, kMaxSize);
  };
  m.def(
      "gemm_ns",
      [prof, size](py::handle p, py::handle m_, py::handle n, py::handle k, py::handle dtype,
                   bool trans_a, bool trans_b) {
        return gemm_ns(*prof(p), size(m_, "gemm_ns", "m"), size(n, "gemm_ns", "n"),
                       size(k, "gemm_ns", "k"), dtype_arg(dtype), {trans_a, trans_b});
      },
      "profile"_a, "m"_a, "n"_a, "k"_a, "dtype"_a = "bf16", "trans_a"_a = false,
      "trans_b"_a = false, "Modeled ns of an [m, k]·[k, n] GEMM (cost_model.h).");
  m.def(
      "gemm_efficiency",
      [prof, size](py::handle p, py::handle m_, py::handle n, py::handle k, py::handle dtype,
                   bool trans_a, bool trans_b) {
        return gemm_efficiency(*prof(p), size(m_, "gemm_efficiency", "m"),
                               size(n, "gemm_efficiency", "n"), size(k, "gemm_efficiency", "k"),
                               dtype_arg(dtype), {trans_a, trans_b});
      },
      "profile"_a, "m"_a, "n"_a, "k"_a, "dtype"_a = "bf16", "trans_a"_a = false,
      "trans_b"_a = false);
  m.def(
      "memory_ns",
      [prof, size](py::handle p, py::handle bytes) {
        return memory_ns(*prof(p), std::uint64_t(size(bytes, "memory_ns", "bytes")));
      },
      "profile"_a, "bytes"_a, "Modeled ns of a memory-bound kernel moving `bytes`.");
  m.def(
      "launch_ns",
      [prof](py::handle p, py::handle kind) {
        return launch_ns(*prof(p), launch_kind(str_arg(kind, "launch_ns", "kind")));
      },
      "profile"_a, "kind"_a = "kernel", "Host cost of one launch: kernel, fused or none.");
  m.def(
      "attention_ns",
      [prof, size](py::handle p, py::handle heads, py::handle s_q, py::handle s_k, py::handle d,
                   py::handle dtype, py::handle visible, bool backward) {
        const char* call = "attention_ns";
        return attention_ns(*prof(p), size(heads, call, "heads"), size(s_q, call, "s_q"),
                            size(s_k, call, "s_k"), size(d, call, "d"), dtype_arg(dtype),
                            real_arg(visible, call, "visible", 0, 1), backward);
      },
      "profile"_a, "heads"_a, "s_q"_a, "s_k"_a, "d"_a, "dtype"_a = "bf16", "visible"_a = 1.0,
      "backward"_a = false);
  m.def(
      "flash_attention_ns",
      [prof, size](py::handle p, py::handle flops, py::handle head_dim, py::handle dtype,
                   py::handle bytes, py::handle keys_per_row, bool backward) {
        const char* call = "flash_attention_ns";
        constexpr double inf = std::numeric_limits<double>::infinity();
        return flash_attention_ns(*prof(p), real_arg(flops, call, "flops", 0, inf),
                                  size(head_dim, call, "head_dim"), dtype_arg(dtype),
                                  real_arg(bytes, call, "bytes", 0, inf),
                                  real_arg(keys_per_row, call, "keys_per_row", 0, inf), backward);
      },
      "profile"_a, "flops"_a, "head_dim"_a, "dtype"_a, "bytes"_a, "keys_per_row"_a,
      "backward"_a = false);
  m.def(
      "unfused_attention_ns",
      [prof, size](py::handle p, py::handle heads, py::handle s_q, py::handle s_k, py::handle d,
                   py::handle dtype, bool backward) {
        const char* call = "unfused_attention_ns";
        return unfused_attention_ns(*prof(p), size(heads, call, "heads"), size(s_q, call, "s_q"),
                                    size(s_k, call, "s_k"), size(d, call, "d"), dtype_arg(dtype),
                                    backward);
      },
      "profile"_a, "heads"_a, "s_q"_a, "s_k"_a, "d"_a, "dtype"_a = "bf16", "backward"_a = false);
  m.def(
      "overlapped_ns",
      [prof](py::handle p, py::handle compute_ns, py::handle comm_ns) {
        constexpr double inf = std::numeric_limits<double>::infinity();
        return overlapped_ns(real_arg(compute_ns, "overlapped_ns", "compute_ns", 0, inf),
                             real_arg(comm_ns, "overlapped_ns", "comm_ns", 0, inf),
                             prof(p)->contention);
      },
      "profile"_a, "compute_ns"_a, "comm_ns"_a,
      "Time of a compute and a comm task started together on one rank, slowed by contention.");

  // Streams and events ------------------------------------------------------------------------
  py::class_<OpRef>(m, "OpRef", "One recorded op: its rank and index (RunResult.op looks it up).")
      .def_readonly("rank", &OpRef::rank)
      .def_readonly("index", &OpRef::index)
      .def("__eq__", [](const OpRef& a, const OpRef& b) { return a == b; })
      .def("__hash__", [](const OpRef& a) { return py::hash(py::make_tuple(a.rank, a.index)); })
      .def("__repr__", [](const OpRef& a) {
        return fmt::format("cocemu.OpRef(rank={}, index={})", a.rank, a.index);
      });

  py::class_<EventHandle>(m, "Event", "A point in a stream's sequence of ops (Stream.record).")
      .def(py::init<>())
      .def_property_readonly("valid", [](const EventHandle& e) { return e.event.valid(); })
      .def_property_readonly("op",
                             [](const EventHandle& e) -> py::object {
                               if (!e.event.op().valid()) return py::none();
                               return py::cast(e.event.op());
                             })
      .def("query",
           [](const EventHandle& e) {
             if (e.session) e.session->check("Event.query");
             return e.event.query();
           })
      .def("synchronize",
           [](const EventHandle& e) {
             if (!e.session) return;
             e.session->check("Event.synchronize");
             check_host_thread(*e.owner, "Event.synchronize");
             {
               py::gil_scoped_release nogil;
               e.event.synchronize();
             }
             release_pending();
           })
      .def(
          "wait_unmodeled",
          [](const EventHandle& e) {
            if (!e.session) return;
            e.session->check("Event.wait_unmodeled");
            {
              py::gil_scoped_release nogil;
              e.event.wait_unmodeled();
            }
            release_pending();  // what the ops held, dropped by stream workers without the GIL
          },
          "Blocks until the event's ops have run, recording nothing (the modeled host clock "
          "does not move): for a host about to read data the timeline already orders after "
          "them.");

  py::class_<StreamHandle>(m, "Stream",
                           "An in-order queue of ops, asynchronous to the rank's host thread.")
      .def_property_readonly("name",
                             [](const StreamHandle& h) { return h.get("Stream.name").name(); })
      .def_property_readonly("lane",
                             [](const StreamHandle& h) { return h.get("Stream.lane").lane(); })
      .def_property_readonly(
          "rank_id", [](const StreamHandle& h) { return h.get("Stream.rank_id").rank().id(); })
      .def("launch", &launch, "name"_a, "fn"_a = py::none(), py::kw_only(),
           "work_ns"_a = py::none(), "flops"_a = py::none(), "bytes"_a = py::none(),
           "dtype"_a = "bf16", "kind"_a = "compute", "launch"_a = "kernel",
           "segment"_a = py::none(),
           "Enqueues an op: `fn()` (if given) runs on the stream's thread after everything "
           "enqueued before it (not at all in dry runs); it is modeled as `work_ns`, else as "
           "`flops` at the profile's large-GEMM rate for `dtype` and `bytes` at its memory "
           "bandwidth (the larger, at least the shortest kernel), else 0. Returns its OpRef.")
      .def("record", &record, "Records an event after every op enqueued so far.")
      .def(
          "wait",
          [](StreamHandle& h, py::handle event) {
            COCEMU_CHECK_ARG(py::isinstance<EventHandle>(event),
                             "Stream.wait: event = {} ({}) is not a cocemu.Event (a Work's "
                             "event, or Stream.record())",
                             repr_of(event), Py_TYPE(event.ptr())->tp_name);
            wait_event(h, event.cast<const EventHandle&>());
          },
          "event"_a, "Ops enqueued later start after `event` (the host does not block).")
      .def(
          "wait_stream",
          [](StreamHandle& h, py::handle other) {
            wait_event(h, record(stream_arg(other, "Stream.wait_stream")));
          },
          "stream"_a, "Ops enqueued later start after everything enqueued on `stream` so far.")
      .def("synchronize",
           [](StreamHandle& h) {
             Stream& s = h.host("Stream.synchronize");
             {
               py::gil_scoped_release nogil;
               s.synchronize();
             }
             release_pending();
           })
      .def("query", [](const StreamHandle& h) { return h.get("Stream.query").query(); })
      .def_property_readonly(
          "queued", [](const StreamHandle& h) { return h.host("Stream.queued").queued(); },
          "Ops enqueued and not finished: at most 1024 (a launch on a full stream blocks the "
          "host until the oldest finishes, as CUDA's launch queue does).")
      .def("__eq__",
           [](const StreamHandle& a, const StreamHandle& b) { return a.stream == b.stream; })
      .def("__hash__", [](const StreamHandle& a) { return std::hash<const void*>()(a.stream); })
      .def("__repr__", [](const StreamHandle& h) {
        if (!h.session->alive) return std::string("cocemu.Stream(<ended run>)");
        return fmt::format("cocemu.Stream('{}', rank={})", h.stream->name(), h.stream->rank().id());
      });

  // Ranks -------------------------------------------------------------------------------------
  const auto make = [](RankHandle& h, py::handle shape, py::handle dtype, bool zero) {
    Rank& r = h.get("Rank.zeros");
    const Shape s = shape_arg(shape);
    const DType t = dtype_arg(dtype);
    if (!r.numerics()) return py::cast(Tensor::shape_only(s, t));
    return to_python(zero ? Tensor::zeros(s, t) : Tensor::empty(s, t));
  };
  classes.rank = std::make_unique<py::class_<RankHandle>>(
      m, "Rank", "One rank of a run: its host thread, streams and world.");
  (*classes.rank)
      .def_property_readonly("id", [](const RankHandle& h) { return h.get("Rank.id").id(); })
      .def_property_readonly(
          "world_size", [](const RankHandle& h) { return h.get("Rank.world_size").world_size(); })
      .def_property_readonly("numerics",
                             [](const RankHandle& h) { return h.get("Rank.numerics").numerics(); })
      .def_property_readonly(
          "deterministic",
          [](const RankHandle& h) { return h.get("Rank.deterministic").deterministic(); })
      .def_property_readonly(
          "profile",
          [](const RankHandle& h) {
            return ProfileHandle{h.get("Rank.profile").world().options().profile};
          })
      .def_property_readonly("compute_stream",
                             [](RankHandle& h) {
                               return stream_object(h,
                                                    h.get("Rank.compute_stream").compute_stream());
                             })
      .def_property_readonly(
          "comm_stream",
          [](RankHandle& h) { return stream_object(h, h.get("Rank.comm_stream").comm_stream()); })
      .def_property_readonly("current_stream",
                             [](RankHandle& h) {
                               return stream_object(h,
                                                    h.get("Rank.current_stream").current_stream());
                             })
      .def(
          "set_current_stream",
          [](RankHandle& h, py::handle stream) {
            Rank& r = h.host("Rank.set_current_stream");
            StreamHandle& s = stream_arg(stream, "Rank.set_current_stream");
            COCEMU_CHECK_ARG(s.session == h.session && &s.stream->rank() == &r,
                             "Rank.set_current_stream: the stream is not one of rank {}'s", r.id());
            r.set_current_stream(*s.stream);
          },
          "stream"_a)
      .def(
          "new_stream",
          [](RankHandle& h, const std::string& name) {
            return stream_object(h, h.host("Rank.new_stream").new_stream(name));
          },
          "name"_a)
      .def("synchronize",
           [](RankHandle& h) {
             Rank& r = h.host("Rank.synchronize");
             {
               py::gil_scoped_release nogil;
               r.synchronize();
             }
             release_pending();
           })
      .def(
          "zeros",
          [make](RankHandle& h, py::handle shape, py::handle dtype) {
            return make(h, shape, dtype, true);
          },
          "shape"_a, "dtype"_a = "f32",
          "A zeroed tensor: a NumPy array (uint16 for bf16), or a shape-only cocemu.Tensor in a "
          "dry run.")
      .def(
          "empty",
          [make](RankHandle& h, py::handle shape, py::handle dtype) {
            return make(h, shape, dtype, false);
          },
          "shape"_a, "dtype"_a = "f32", "As zeros, contents unspecified.")
      .def(
          "set_segment",
          [](RankHandle& h, py::handle name) {
            h.host("Rank.set_segment").set_segment(str_arg(name, "Rank.set_segment", "name"));
          },
          "name"_a, "Names the program region that ops recorded from now on belong to.")
      .def_property_readonly(
          "current_segment",
          [](const RankHandle& h) { return h.get("Rank.current_segment").segment(); })
      .def("__repr__", [](const RankHandle& h) {
        if (!h.session->alive) return std::string("cocemu.Rank(<ended run>)");
        return fmt::format("cocemu.Rank({} of {})", h.rank->id(), h.rank->world_size());
      });

  m.def(
      "current_rank",
      []() -> py::object {
        PyObject* r = current_rank_object();
        COCEMU_CHECK_ARG(r != nullptr,
                         "current_rank: not called from a rank's function (cocemu.run runs one "
                         "per rank thread)");
        return py::reinterpret_borrow<py::object>(r);
      },
      "The Rank whose function is running on the calling thread.");

  // Running ----------------------------------------------------------------------------------
  m.def(
      "_check_bool",
      [](py::handle value, const std::string& call, const std::string& name) {
        return bool_arg(value, call.c_str(), name.c_str());
      },
      "value"_a, "call"_a, "name"_a,
      "`value` as a bool, or a cocemu.Error naming `call` and `name` when it is not a bool (for "
      "wrappers of cocemu.run such as cocemu.torch.run).");
  m.def(
      "_check_timeout_s",
      [](py::handle value, const std::string& call, const std::string& name) {
        return seconds_arg(value, call.c_str(), name.c_str(), double(kMaxTimeout.count()) / 1e3);
      },
      "value"_a, "call"_a, "name"_a,
      "A timeout in seconds checked as cocemu.run checks timeout_s: a number in (0, 86400].");
  m.def(
      "_default_timeout_s", [] { return double(default_timeout().count()) / 1e3; },
      "The default timeout in seconds: COCEMU_TIMEOUT_MS (1..86400000, an error naming it "
      "otherwise), else 60.");
  m.def("_run", &run, "n_ranks"_a, "fn"_a, "profile"_a = py::none(), "deterministic"_a = true,
        "schedule_seed"_a = py::none(), "dry_run"_a = false, "timeout_s"_a = py::none(),
        "record_wall_times"_a = true);

  py::class_<OpInfo>(m, "Op", "One op of a finished run with its modeled start and end.")
      .def_readonly("rank", &OpInfo::rank)
      .def_readonly("lane", &OpInfo::lane)
      .def_readonly("index", &OpInfo::index)
      .def_readonly("lane_name", &OpInfo::lane_name)
      .def_readonly("name", &OpInfo::name)
      .def_readonly("kind", &OpInfo::kind)
      .def_readonly("segment", &OpInfo::segment)
      .def_readonly("detail", &OpInfo::detail)
      .def_readonly("start_ns", &OpInfo::start_ns)
      .def_readonly("end_ns", &OpInfo::end_ns)
      .def_readonly("work_ns", &OpInfo::work_ns)
      .def_readonly("bytes", &OpInfo::bytes)
      .def_readonly("flops", &OpInfo::flops)
      .def_readonly("seq", &OpInfo::seq)
      .def_readonly("wall_start_ns", &OpInfo::wall_start_ns)
      .def_readonly("wall_end_ns", &OpInfo::wall_end_ns)
      .def("__repr__", [](const OpInfo& o) {
        return fmt::format("cocemu.Op(rank={}, lane='{}', name='{}', {}..{} ns)", o.rank,
                           o.lane_name, o.name, o.start_ns, o.end_ns);
      });

  classes.run_result = std::make_unique<py::class_<PyRunResult>>(
      m, "RunResult", "What a run leaves: return values, the modeled timeline, host wall time.");
  (*classes.run_result)
      .def_readonly("returns", &PyRunResult::returns)
      .def_property_readonly(
          "makespan_ns", [](const PyRunResult& r) { return result_of(r).timeline.makespan_ns(); })
      .def_property_readonly("wall_ns", [](const PyRunResult& r) { return result_of(r).wall_ns; })
      .def_property_readonly(
          "n_ranks", [](const PyRunResult& r) { return int(result_of(r).graph.ranks.size()); })
      .def_property_readonly("numerics", [](const PyRunResult& r) { return result_of(r).numerics; })
      .def_property_readonly(
          "profile", [](const PyRunResult& r) { return ProfileHandle{result_of(r).profile}; })
      .def(
          "lanes",
          [](const PyRunResult& r, int rank) {
            const RunResult& res = result_of(r);
            COCEMU_CHECK_ARG(rank >= 0 && rank < int(res.graph.ranks.size()),
                             "RunResult.lanes: rank {} out of range 0..{}", rank,
                             int(res.graph.ranks.size()) - 1);
            return res.graph.ranks[std::size_t(rank)].lane_names;
          },
          "rank"_a = 0)
      .def(
          "ops",
          [](const PyRunResult& r, std::optional<int> rank) {
            const RunResult& res = result_of(r);
            std::vector<OpInfo> out;
            for (int q = 0; q < int(res.graph.ranks.size()); ++q) {
              if (rank && *rank != q) continue;
              const auto& ops = res.graph.ranks[std::size_t(q)].ops;
              for (std::uint32_t i = 0; i < ops.size(); ++i)
                out.push_back(op_info(res, {q, i}));
            }
            COCEMU_CHECK_ARG(!rank || (*rank >= 0 && *rank < int(res.graph.ranks.size())),
                             "RunResult.ops: rank {} out of range 0..{}", *rank,
                             int(res.graph.ranks.size()) - 1);
            return out;
          },
          "rank"_a = py::none(), "Every op (of one rank, if given), in record order.")
      .def(
          "op", [](const PyRunResult& r, const OpRef& ref) { return op_info(result_of(r), ref); },
          "ref"_a)
      .def(
          "event_time_ns",
          [](const PyRunResult& r, const EventHandle& e) {
            return result_of(r).timeline.at(event_ref(e, "RunResult.event_time_ns")).end_ns;
          },
          "event"_a, "Modeled time at which the event completes (its op's end).")
      .def(
          "elapsed_ns",
          [](const PyRunResult& r, const EventHandle& start, const EventHandle& end) {
            const Timeline& t = result_of(r).timeline;
            return t.at(event_ref(end, "RunResult.elapsed_ns")).end_ns -
                   t.at(event_ref(start, "RunResult.elapsed_ns")).end_ns;
          },
          "start"_a, "end"_a, "Modeled ns from one event to another (torch's elapsed_time).")
      .def(
          "chrome_trace",
          [](const PyRunResult& r, bool include_wall, bool include_host) {
            return chrome_trace_json(result_of(r), {include_wall, include_host});
          },
          "include_wall"_a = false, "include_host"_a = true,
          "The modeled timeline as Chrome trace-event JSON (Perfetto, chrome://tracing).")
      .def(
          "write_chrome_trace",
          [](const PyRunResult& r, const std::string& path, bool include_wall, bool include_host) {
            write_chrome_trace(result_of(r), path, {include_wall, include_host});
          },
          "path"_a, "include_wall"_a = false, "include_host"_a = true)
      .def(
          "svg",
          [](const PyRunResult& r, const std::string& title, std::int64_t span_ns,
             bool collapse_identical_ranks, double width) {
            return svg_timeline(result_of(r), title, {span_ns, collapse_identical_ranks, width});
          },
          "title"_a = "cocemu", py::kw_only(), "span_ns"_a = 0, "collapse_identical_ranks"_a = true,
          "width"_a = 1600.0,
          "The modeled timeline as SVG (span_ns: the x axis's span, to compare several runs).")
      .def(
          "write_svg",
          [](const PyRunResult& r, const std::string& path, const std::string& title,
             std::int64_t span_ns, bool collapse_identical_ranks, double width) {
            write_svg_timeline(result_of(r), path, title,
                               {span_ns, collapse_identical_ranks, width});
          },
          "path"_a, "title"_a = "cocemu", py::kw_only(), "span_ns"_a = 0,
          "collapse_identical_ranks"_a = true, "width"_a = 1600.0);
}

}  // namespace cocemu::python
