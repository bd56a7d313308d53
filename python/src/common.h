#pragma once
/// What the binding files share: a run's liveness (handles must not outlive their run), the
/// handles Python holds on ranks and streams, NumPy arrays as tensors without copies, Python
/// references held by C++ (released only with the GIL held), and the error translation.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cocemu/runtime/error.h"
#include "cocemu/runtime/tensor.h"
#include "cocemu/runtime/world.h"

namespace py = pybind11;

namespace cocemu::python {

/// One `cocemu.run`: handles check it before touching the C++ objects of the run, which die with
/// it. The failures table keeps each rank's first Python exception (owned references, touched
/// with the GIL held) so that `run` re-raises it with its own type.
struct Session {
  std::atomic<bool> alive{true};
  std::mutex mu;
  std::vector<PyObject*> failures;  ///< per rank: the first Python exception, or null
  /// Throws a clear error if the run has ended.
  void check(const char* call) const;
  /// Keeps the first Python exception of `rank` (GIL held).
  void record_failure(int rank, PyObject* exception);
};
using SessionPtr = std::shared_ptr<Session>;

/// Host-side calls (launches, events, collectives) keep per-rank bookkeeping that only the rank's
/// own thread may touch: throws unless the caller is rank `r`'s host thread.
void check_host_thread(const Rank& r, const char* call);

/// A Python reference owned by C++ (a callable, an array kept alive by a tensor). Dropped
/// directly when the dropping thread holds the GIL, else queued until a thread that holds it
/// calls release_pending(): stream workers never wait for the GIL just to drop a reference.
std::shared_ptr<void> hold(py::handle object);
/// Drops the queued references (GIL held).
void release_pending();

/// Runs `call` under the GIL on a thread that may not hold it (a stream worker); a Python
/// exception becomes the C++ exception `run` reports: a cocemu.Error is rethrown as the C++ error
/// it came from, anything else is recorded in the session and thrown as a rank_exception.
void rethrow_python(py::error_already_set& e, Session& session, int rank);

// ---------------------------------------------------------------------------------------------
// Scalar arguments, checked strictly: a bool is not a number, a string is not a bool. Each error
// names the call, the argument, the value seen and what is allowed.

/// repr(value) for an error message, cut to 80 characters.
std::string repr_of(py::handle value);
/// A Python bool (or NumPy bool).
bool bool_arg(py::handle value, const char* call, const char* name);
/// An integer (not a bool) in lo..hi.
std::int64_t int_arg(py::handle value, const char* call, const char* name, std::int64_t lo,
                     std::int64_t hi);
/// A finite real number (int or float, not a bool) in [lo, hi].
double real_arg(py::handle value, const char* call, const char* name, double lo, double hi);
/// A str (not bytes, not None).
std::string str_arg(py::handle value, const char* call, const char* name);
/// A real number of seconds (int or float, not a bool) in (0, max_s]: NaN, inf and the rest are
/// refused.
double seconds_arg(py::handle value, const char* call, const char* name, double max_s);

// ---------------------------------------------------------------------------------------------
// Tensors

DType dtype_arg(py::handle dtype);
Shape shape_arg(py::handle shape);
/// The NumPy dtype that holds `t` (bf16 is held as uint16).
py::dtype numpy_dtype(DType t);

enum class Access { read, write };
/// A NumPy array or cocemu.Tensor as a tensor, without copying: the array must be C-contiguous,
/// aligned, in native byte order, of at most 4 dimensions, of a supported dtype (uint16 holds
/// bf16) and, when `access` is write, writeable. Anything else is an error naming `what`.
Tensor tensor_arg(py::handle object, const char* what, Access access);
/// Like tensor_arg, but None gives an undefined tensor.
Tensor optional_tensor_arg(py::handle object, const char* what, Access access);
/// A tensor as Python sees it: a NumPy view of its storage (no copy), or a cocemu.Tensor when it
/// is shape-only (dry runs).
py::object to_python(const Tensor& t);
/// A NumPy view of `bytes` bytes at `data` owned by `owner`, as uint8.
py::object byte_view(void* data, std::size_t bytes, std::shared_ptr<const void> owner);

// ---------------------------------------------------------------------------------------------
// Handles

struct RankHandle {
  Rank* rank = nullptr;
  SessionPtr session;
  py::object world;                 ///< the world group, made on first use
  std::vector<py::object> streams;  ///< Stream handles by lane - 1, made on first use
  Rank& get(const char* call) const {
    session->check(call);
    return *rank;
  }
  /// As get, and the caller must be the rank's host thread.
  Rank& host(const char* call) const {
    session->check(call);
    check_host_thread(*rank, call);
    return *rank;
  }
};

struct StreamHandle {
  Stream* stream = nullptr;
  SessionPtr session;
  Stream& get(const char* call) const {
    session->check(call);
    return *stream;
  }
  Stream& host(const char* call) const {
    session->check(call);
    check_host_thread(stream->rank(), call);
    return *stream;
  }
};

struct EventHandle {
  Event event;
  SessionPtr session;     ///< null for a default-constructed event
  Rank* owner = nullptr;  ///< the rank of the recording stream
};

/// A finished run: the C++ result and the rank functions' return values.
struct PyRunResult {
  std::shared_ptr<const RunResult> result;
  py::list returns;
};

/// The Python object of one of a rank's streams (the same object each time).
py::object stream_object(RankHandle& rank, Stream& stream);
/// The Python Rank whose host thread is calling, or null.
PyObject* current_rank_object();

/// Installs the Python Rank of the calling rank thread (cocemu.current_rank) for a scope.
class CurrentRank {
 public:
  explicit CurrentRank(PyObject* rank);
  ~CurrentRank();
  CurrentRank(const CurrentRank&) = delete;
  CurrentRank& operator=(const CurrentRank&) = delete;

 private:
  PyObject* previous_;
};

/// A device profile as Python holds it.
struct ProfileHandle {
  std::shared_ptr<const DeviceProfile> profile;
};
/// None (the default profile), a name, a YAML path or a cocemu.Profile.
std::shared_ptr<const DeviceProfile> profile_arg(py::handle profile);

// ---------------------------------------------------------------------------------------------
// Module set-up (module.cpp calls these in order)

/// NumPy's C API, initialised at import: its lazy initialisation on first use would import numpy
/// from whichever thread gets there first, a rank thread that holds the GIL while another waits.
void init_numpy();
void register_errors(py::module_& m);

/// The classes later binding files add methods to.
struct PyRunResult;
struct Classes {
  std::unique_ptr<py::class_<RankHandle>> rank;
  std::unique_ptr<py::class_<PyRunResult>> run_result;
};
void bind_tensors(py::module_& m);
void bind_runtime(py::module_& m, Classes& classes);
void bind_symmetric(py::module_& m);
void bind_collectives(py::module_& m, Classes& classes);
void bind_layers(py::module_& m, Classes& classes);
void bind_bench(py::module_& m, Classes& classes);

}  // namespace cocemu::python
