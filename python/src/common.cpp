// The shared pieces of the bindings (common.h): sessions, thread checks, Python references held by
// C++, NumPy arrays as tensors, errors. The only file that uses NumPy's C API directly.
#include "common.h"

#define PY_ARRAY_UNIQUE_SYMBOL cocemu_python_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "cocemu/runtime/sync.h"

namespace cocemu::python {

// ---------------------------------------------------------------------------------------------
// Sessions and threads

void Session::check(const char* call) const {
  COCEMU_CHECK_ARG(alive.load(std::memory_order_acquire),
                   "{}: this handle belongs to a cocemu.run that has ended; ranks, streams, "
                   "events, works, groups and layers are valid only inside their run",
                   call);
}

void Session::record_failure(int rank, PyObject* exception) {
  // A rank left running after an interrupted run ended (see run) keeps nothing: `run` has
  // already taken the table.
  if (!alive.load(std::memory_order_acquire)) return;
  std::lock_guard lock(mu);
  PyObject*& slot = failures.at(std::size_t(rank));
  if (slot) return;
  Py_INCREF(exception);
  slot = exception;
}

void check_host_thread(const Rank& r, const char* call) {
  const WaitScope& s = current_wait_scope();
  if (s.world == &r.world() && s.rank == r.id() && s.lane_index == 0) return;
  if (s.world == &r.world() && s.rank >= 0)
    COCEMU_FAIL(Errc::invalid_argument,
                "{}: rank {}'s host-side call made from rank {}'s {} ('{}'); launches, events, "
                "groups and collectives must be called by the rank's own function, not by "
                "another rank or an op running on a stream",
                call, r.id(), s.rank, s.lane_index == 0 ? "function" : "stream op", s.lane);
  COCEMU_FAIL(Errc::invalid_argument,
              "{}: rank {}'s handle used from a thread outside the rank's function (host-side "
              "calls must come from the function cocemu.run runs for that rank)",
              call, r.id());
}

namespace {
thread_local PyObject* current_rank = nullptr;
}  // namespace

PyObject* current_rank_object() {
  return current_rank;
}

CurrentRank::CurrentRank(PyObject* rank) : previous_(current_rank) {
  current_rank = rank;
}
CurrentRank::~CurrentRank() {
  current_rank = previous_;
}

// ---------------------------------------------------------------------------------------------
// References held by C++

namespace {
std::mutex pending_mu;
std::vector<PyObject*> pending;
std::atomic<std::size_t> n_pending{0};

void drop(void* object) {
  auto* o = static_cast<PyObject*>(object);
  if (PyGILState_Check()) {
    Py_DECREF(o);
    return;
  }
  std::lock_guard lock(pending_mu);
  pending.push_back(o);
  n_pending.store(pending.size(), std::memory_order_release);
}
}  // namespace

std::shared_ptr<void> hold(py::handle object) {
  Py_INCREF(object.ptr());
  return std::shared_ptr<void>(object.ptr(), drop);
}

void release_pending() {
  if (n_pending.load(std::memory_order_acquire) == 0) return;
  std::vector<PyObject*> batch;
  {
    std::lock_guard lock(pending_mu);
    batch.swap(pending);
    n_pending.store(0, std::memory_order_release);
  }
  for (PyObject* o : batch)
    Py_DECREF(o);
}

// ---------------------------------------------------------------------------------------------
// Errors

namespace {
PyObject* error_type = nullptr;

const char* code_name(Errc c) {
  switch (c) {
    case Errc::invalid_argument:
      return "invalid_argument";
    case Errc::mismatch:
      return "mismatch";
    case Errc::timeout:
      return "timeout";
    case Errc::remote_failure:
      return "remote_failure";
    case Errc::parse_error:
      return "parse_error";
    case Errc::rank_exception:
      return "rank_exception";
    case Errc::too_large:
      return "too_large";
    case Errc::internal:
      return "internal";
    case Errc::resource_exhausted:
      return "resource_exhausted";
    case Errc::cancelled:
      return "cancelled";
  }
  return "unknown";
}

constexpr const char* kErrorCapsule = "cocemu.error";

void raise_error(const Error& e, std::exception_ptr p) {
  py::object inst = py::reinterpret_steal<py::object>(
      PyObject_CallOneArg(error_type, py::str(user_message(e)).ptr()));
  if (!inst) return;  // the Python error set by the call stands
  inst.attr("code") = code_name(e.code());
  inst.attr("origin") = e.origin();
  inst.attr("rank") = e.rank() >= 0 ? py::object(py::int_(e.rank())) : py::object(py::none());
  inst.attr("_cpp") =
      py::capsule(new std::exception_ptr(std::move(p)), kErrorCapsule, [](PyObject* c) {
        delete static_cast<std::exception_ptr*>(PyCapsule_GetPointer(c, kErrorCapsule));
      });
  PyErr_SetObject(error_type, inst.ptr());
}
}  // namespace

void register_errors(py::module_& m) {
  error_type = PyErr_NewExceptionWithDoc(
      "cocemu.Error",
      "A cocemu error (a RuntimeError): `code` names its kind (invalid_argument, mismatch, "
      "timeout, remote_failure, parse_error, rank_exception, too_large, internal) and `rank` the "
      "rank that failed first when `run` reports a rank's failure (else None).",
      PyExc_RuntimeError, nullptr);
  m.add_object("Error", py::handle(error_type));
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      raise_error(e, p);
    }
  });
}

void rethrow_python(py::error_already_set& e, Session& session, int rank) {
  PyObject* value = e.value().ptr();
  if (PyObject_IsInstance(value, error_type) == 1) {
    py::object cap = py::getattr(e.value(), "_cpp", py::none());
    if (PyCapsule_IsValid(cap.ptr(), kErrorCapsule)) {
      std::exception_ptr original =
          *static_cast<std::exception_ptr*>(PyCapsule_GetPointer(cap.ptr(), kErrorCapsule));
      std::rethrow_exception(original);
    }
  }
  if (e.trace() && !e.trace().is_none()) PyException_SetTraceback(value, e.trace().ptr());
  session.record_failure(rank, value);
  std::string text = Py_TYPE(value)->tp_name;
  try {
    text += ": " + py::str(e.value()).cast<std::string>();
  } catch (...) {
  }
  throw Error(Errc::rank_exception, "Python " + text);
}

// ---------------------------------------------------------------------------------------------
// Scalar arguments

std::string repr_of(py::handle value) {
  try {
    std::string r = py::repr(value).cast<std::string>();
    if (r.size() > 80) r = r.substr(0, 77) + "...";
    return r;
  } catch (...) {
    return "<unprintable>";
  }
}

namespace {
bool is_bool(py::handle value) {
  return PyBool_Check(value.ptr()) || PyArray_IsScalar(value.ptr(), Bool);
}
}  // namespace

bool bool_arg(py::handle value, const char* call, const char* name) {
  COCEMU_CHECK_ARG(is_bool(value), "{}: {} = {} ({}) is not a bool; allowed True or False", call,
                   name, repr_of(value), Py_TYPE(value.ptr())->tp_name);
  return PyObject_IsTrue(value.ptr()) == 1;
}

std::int64_t int_arg(py::handle value, const char* call, const char* name, std::int64_t lo,
                     std::int64_t hi) {
  COCEMU_CHECK_ARG(!is_bool(value) && PyIndex_Check(value.ptr()),
                   "{}: {} = {} ({}) is not an integer; allowed {}..{}", call, name, repr_of(value),
                   Py_TYPE(value.ptr())->tp_name, lo, hi);
  py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  COCEMU_CHECK_ARG(overflow == 0 && v >= lo && v <= hi,
                   "{}: {} = {} is out of range; allowed {}..{}", call, name, repr_of(value), lo,
                   hi);
  return v;
}

std::string str_arg(py::handle value, const char* call, const char* name) {
  COCEMU_CHECK_ARG(py::isinstance<py::str>(value), "{}: {} = {} ({}) is not a str", call, name,
                   repr_of(value), Py_TYPE(value.ptr())->tp_name);
  return value.cast<std::string>();
}

double real_arg(py::handle value, const char* call, const char* name, double lo, double hi) {
  const bool number =
      !is_bool(value) && (PyFloat_Check(value.ptr()) || PyIndex_Check(value.ptr()) ||
                          PyArray_IsScalar(value.ptr(), Floating));
  COCEMU_CHECK_ARG(number,
                   "{}: {} = {} ({}) is not a number; allowed a finite number in [{:g}, {:g}]",
                   call, name, repr_of(value), Py_TYPE(value.ptr())->tp_name, lo, hi);
  const double v = PyFloat_AsDouble(value.ptr());  // an int beyond a double's range: inf
  if (v == -1.0 && PyErr_Occurred()) PyErr_Clear();
  COCEMU_CHECK_ARG(std::isfinite(v) && v >= lo && v <= hi,
                   "{}: {} = {} is out of range; allowed a finite number in [{:g}, {:g}]", call,
                   name, repr_of(value), lo, hi);
  return v;
}

double seconds_arg(py::handle value, const char* call, const char* name, double max_s) {
  const bool number =
      !is_bool(value) && (PyFloat_Check(value.ptr()) || PyIndex_Check(value.ptr()) ||
                          PyArray_IsScalar(value.ptr(), Floating));
  COCEMU_CHECK_ARG(number,
                   "{}: {} = {} ({}) is not a number of seconds; allowed a number in (0, {:g}]",
                   call, name, repr_of(value), Py_TYPE(value.ptr())->tp_name, max_s);
  const double v = PyFloat_AsDouble(value.ptr());  // an int beyond a double's range: inf
  if (v == -1.0 && PyErr_Occurred()) PyErr_Clear();
  COCEMU_CHECK_ARG(std::isfinite(v) && v > 0 && v <= max_s,
                   "{}: {} = {} is out of range; allowed a number of seconds in (0, {:g}]", call,
                   name, repr_of(value), max_s);
  return v;
}

// ---------------------------------------------------------------------------------------------
// Dtypes and shapes

void init_numpy() {
  if (_import_array() < 0) throw py::error_already_set();
}

DType dtype_arg(py::handle dtype) {
  if (py::isinstance<py::str>(dtype)) {
    const std::string s = dtype.cast<std::string>();
    if (s == "uint16") return DType::bf16;
    return parse_dtype(s);
  }
  // NumPy reads None as float64: a dtype is named, never guessed.
  COCEMU_CHECK_ARG(!dtype.is_none(), "dtype None is not a dtype; name one: 'f32', 'bf16', ...");
  py::dtype d;
  try {
    d = py::dtype::from_args(py::reinterpret_borrow<py::object>(dtype));
  } catch (py::error_already_set& e) {
    COCEMU_FAIL(Errc::invalid_argument,
                "dtype {} is not a dtype ({}); name one: 'f32', 'bf16', ...", repr_of(dtype),
                e.what());
  }
  const char kind = d.kind();
  const auto size = d.itemsize();
  if (kind == 'f' && size == 4) return DType::f32;
  if (kind == 'f' && size == 8) return DType::f64;
  if (kind == 'f' && size == 2) return DType::f16;
  if (kind == 'u' && size == 2) return DType::bf16;
  if (kind == 'i' && size == 1) return DType::i8;
  if (kind == 'i' && size == 4) return DType::i32;
  if (kind == 'i' && size == 8) return DType::i64;
  if (kind == 'u' && size == 1) return DType::u8;
  if (kind == 'b' && size == 1) return DType::boolean;
  COCEMU_FAIL(Errc::invalid_argument,
              "dtype {} is not one cocemu has; allowed: float32, float64, float16, int8, int32, "
              "int64, uint8, bool, and uint16 for bf16 (NumPy has no bfloat16)",
              py::str(d).cast<std::string>());
}

py::dtype numpy_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return py::dtype("float32");
    case DType::f64:
      return py::dtype("float64");
    case DType::f16:
      return py::dtype("float16");
    case DType::bf16:
      return py::dtype("uint16");
    case DType::i8:
      return py::dtype("int8");
    case DType::i32:
      return py::dtype("int32");
    case DType::i64:
      return py::dtype("int64");
    case DType::u8:
      return py::dtype("uint8");
    case DType::boolean:
      return py::dtype("bool");
  }
  COCEMU_FAIL(Errc::internal, "no NumPy dtype for {}", name_of(t));
}

namespace {
int numpy_type(DType t) {
  switch (t) {
    case DType::f32:
      return NPY_FLOAT32;
    case DType::f64:
      return NPY_FLOAT64;
    case DType::f16:
      return NPY_FLOAT16;
    case DType::bf16:
      return NPY_UINT16;
    case DType::i8:
      return NPY_INT8;
    case DType::i32:
      return NPY_INT32;
    case DType::i64:
      return NPY_INT64;
    case DType::u8:
      return NPY_UINT8;
    case DType::boolean:
      return NPY_BOOL;
  }
  COCEMU_FAIL(Errc::internal, "no NumPy dtype for {}", name_of(t));
}

/// The dtype an array holds, by kind and size (int32 may be NumPy's int or long, …).
DType array_dtype(PyArrayObject* a, const char* what) {
  PyArray_Descr* d = PyArray_DESCR(a);
  const char kind = d->kind;
  const int size = int(PyArray_ITEMSIZE(a));  // NumPy 1.x and 2.x alike
  COCEMU_CHECK_ARG(PyArray_ISNOTSWAPPED(a),
                   "{}: array of dtype {} is not in native byte order; cocemu does not copy: "
                   "pass x.astype(x.dtype.newbyteorder('='))",
                   what, py::str(py::handle(reinterpret_cast<PyObject*>(d))).cast<std::string>());
  if (kind == 'f' && size == 4) return DType::f32;
  if (kind == 'f' && size == 8) return DType::f64;
  if (kind == 'f' && size == 2) return DType::f16;
  if (kind == 'u' && size == 2) return DType::bf16;
  if (kind == 'i' && size == 1) return DType::i8;
  if (kind == 'i' && size == 4) return DType::i32;
  if (kind == 'i' && size == 8) return DType::i64;
  if (kind == 'u' && size == 1) return DType::u8;
  if (kind == 'b' && size == 1) return DType::boolean;
  COCEMU_FAIL(Errc::invalid_argument,
              "{}: array of dtype {} is not one cocemu has; allowed: float32, float64, float16, "
              "int8, int32, int64, uint8, bool, and uint16 for bf16 (cocemu.to_bf16 converts; "
              "NumPy has no bfloat16)",
              what, py::str(py::handle(reinterpret_cast<PyObject*>(d))).cast<std::string>());
}

/// The base object of arrays that view a cocemu tensor's storage.
struct StorageRef {
  std::shared_ptr<std::byte[]> storage;
  std::size_t lo = 0, hi = 0;  ///< the byte range of the storage the array was made on
};
constexpr const char* kStorageCapsule = "cocemu.storage";
constexpr const char* kOwnerCapsule = "cocemu.owner";

std::string shape_text(PyArrayObject* a) {
  std::vector<npy_intp> dims(PyArray_DIMS(a), PyArray_DIMS(a) + PyArray_NDIM(a));
  return fmt::format("({})", fmt::join(dims, ", "));
}
}  // namespace

namespace {
constexpr std::int64_t kMaxElements = std::int64_t(1) << 62;

/// One dimension: an integer (not a bool) >= 0; the element count is checked after.
std::int64_t dim_arg(py::handle d, const char* call, const char* name) {
  const std::int64_t v = int_arg(d, call, name, std::numeric_limits<std::int64_t>::min(),
                                 std::numeric_limits<std::int64_t>::max());
  COCEMU_CHECK_ARG(v >= 0, "{}: {} = {} must be >= 0", call, name, v);
  return v;
}
}  // namespace

Shape shape_arg(py::handle shape) {
  std::vector<std::int64_t> dims;
  if (py::isinstance<py::int_>(shape)) {
    dims.push_back(dim_arg(shape, "shape", "the size"));
  } else {
    COCEMU_CHECK_ARG(py::isinstance<py::sequence>(shape) && !py::isinstance<py::str>(shape),
                     "shape must be an int or a sequence of ints, got {}",
                     py::repr(shape).cast<std::string>());
    const std::string call = "shape " + repr_of(shape);
    for (py::handle d : shape) {
      const std::string name = fmt::format("dimension {}", dims.size());
      dims.push_back(dim_arg(d, call.c_str(), name.c_str()));
    }
  }
  COCEMU_CHECK_ARG(dims.size() <= std::size_t(Shape::max_dims),
                   "shape {} has {} dimensions; cocemu tensors have at most {}", repr_of(shape),
                   dims.size(), Shape::max_dims);
  // A product past 2**62 elements would wrap the element count (and every byte count after it).
  // (An empty tensor, with a dimension 0, is valid whatever its other dimensions.)
  std::int64_t numel = 1;
  if (std::find(dims.begin(), dims.end(), 0) == dims.end())
    for (std::int64_t d : dims)
      COCEMU_CHECK_ARG(!__builtin_mul_overflow(numel, d, &numel) && numel <= kMaxElements,
                       "shape {} has more than 2**62 elements", repr_of(shape));
  return Shape(std::span<const std::int64_t>(dims));
}

Tensor tensor_arg(py::handle object, const char* what, Access access) {
  if (py::isinstance<Tensor>(object)) return object.cast<Tensor>();
  COCEMU_CHECK_ARG(PyArray_Check(object.ptr()),
                   "{}: expected a NumPy array or a cocemu.Tensor, got {}", what,
                   Py_TYPE(object.ptr())->tp_name);
  auto* a = reinterpret_cast<PyArrayObject*>(object.ptr());
  const int nd = PyArray_NDIM(a);
  COCEMU_CHECK_ARG(nd <= Shape::max_dims,
                   "{}: array of shape {} has {} dimensions; cocemu tensors have at most {}", what,
                   shape_text(a), nd, Shape::max_dims);
  const DType dtype = array_dtype(a, what);
  const int flags = PyArray_FLAGS(a);
  COCEMU_CHECK_ARG(
      flags & NPY_ARRAY_C_CONTIGUOUS,
      "{}: array of shape {} is not C-contiguous (strides {}); cocemu works on the "
      "array's own memory and does not copy: pass a contiguous array "
      "(np.ascontiguousarray makes one)",
      what, shape_text(a),
      fmt::format(
          "({})",
          fmt::join(std::vector<npy_intp>(PyArray_STRIDES(a), PyArray_STRIDES(a) + nd), ", ")));
  COCEMU_CHECK_ARG(flags & NPY_ARRAY_ALIGNED,
                   "{}: array data is not aligned to its {}-byte elements; cocemu does not copy",
                   what, size_of(dtype));
  COCEMU_CHECK_ARG(access == Access::read || (flags & NPY_ARRAY_WRITEABLE),
                   "{}: array is read-only, but this call writes into it", what);
  std::int64_t dims[Shape::max_dims];
  for (int d = 0; d < nd; ++d)
    dims[d] = std::int64_t(PyArray_DIMS(a)[d]);
  const Shape shape(std::span<const std::int64_t>(dims, std::size_t(nd)));
  auto* data = static_cast<std::byte*>(PyArray_DATA(a));
  PyObject* base = PyArray_BASE(a);
  if (base && PyCapsule_IsValid(base, kStorageCapsule)) {
    // A view of a cocemu tensor: share its storage, hold no Python reference.
    auto* ref = static_cast<StorageRef*>(PyCapsule_GetPointer(base, kStorageCapsule));
    const auto offset = std::size_t(data - ref->storage.get());
    COCEMU_CHECK(
        data >= ref->storage.get() + ref->lo && offset + shape.numel() * size_of(dtype) <= ref->hi,
        Errc::internal, "{}: array outside the cocemu storage it views", what);
    return Tensor::wrap(ref->storage, offset, shape, dtype);
  }
  std::shared_ptr<void> owner = hold(object);
  return Tensor::wrap(std::shared_ptr<std::byte[]>(owner, data), 0, shape, dtype);
}

Tensor optional_tensor_arg(py::handle object, const char* what, Access access) {
  if (object.is_none()) return Tensor();
  return tensor_arg(object, what, access);
}

py::object to_python(const Tensor& t) {
  if (!t.defined()) return py::none();
  if (!t.has_data()) return py::cast(t);
  npy_intp dims[Shape::max_dims];
  for (int d = 0; d < t.ndim(); ++d)
    dims[d] = npy_intp(t.size(d));
  auto* ref = new StorageRef{t.storage(), t.offset_bytes(), t.offset_bytes() + t.nbytes()};
  py::object base =
      py::reinterpret_steal<py::object>(PyCapsule_New(ref, kStorageCapsule, [](PyObject* c) {
        delete static_cast<StorageRef*>(PyCapsule_GetPointer(c, kStorageCapsule));
      }));
  if (!base) {
    delete ref;
    throw py::error_already_set();
  }
  PyObject* arr = PyArray_New(&PyArray_Type, t.ndim(), dims, numpy_type(t.dtype()), nullptr,
                              t.raw(), 0, NPY_ARRAY_CARRAY, nullptr);
  if (!arr) throw py::error_already_set();
  if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(arr), base.release().ptr()) < 0) {
    Py_DECREF(arr);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(arr);
}

py::object byte_view(void* data, std::size_t bytes, std::shared_ptr<const void> owner) {
  auto* keep = new std::shared_ptr<const void>(std::move(owner));
  py::object base =
      py::reinterpret_steal<py::object>(PyCapsule_New(keep, kOwnerCapsule, [](PyObject* c) {
        delete static_cast<std::shared_ptr<const void>*>(PyCapsule_GetPointer(c, kOwnerCapsule));
      }));
  if (!base) {
    delete keep;
    throw py::error_already_set();
  }
  npy_intp dims[1] = {npy_intp(bytes)};
  PyObject* arr =
      PyArray_New(&PyArray_Type, 1, dims, NPY_UINT8, nullptr, data, 0, NPY_ARRAY_CARRAY, nullptr);
  if (!arr) throw py::error_already_set();
  if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(arr), base.release().ptr()) < 0) {
    Py_DECREF(arr);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(arr);
}

// ---------------------------------------------------------------------------------------------
// Handles and profiles

py::object stream_object(RankHandle& rank, Stream& stream) {
  const std::size_t i = std::size_t(stream.lane() - 1);
  if (rank.streams.size() <= i) rank.streams.resize(i + 1);
  if (!rank.streams[i]) rank.streams[i] = py::cast(StreamHandle{&stream, rank.session});
  return rank.streams[i];
}

std::shared_ptr<const DeviceProfile> profile_arg(py::handle profile) {
  if (profile.is_none()) return default_profile();
  if (py::isinstance<ProfileHandle>(profile)) return profile.cast<const ProfileHandle&>().profile;
  COCEMU_CHECK_ARG(py::isinstance<py::str>(profile),
                   "profile must be a name (\"ascend-910b\"), a YAML path or a cocemu.Profile, "
                   "got {} ({})",
                   repr_of(profile), Py_TYPE(profile.ptr())->tp_name);
  const std::string name = profile.cast<std::string>();
  // Loading parses YAML: shipped profiles by name are loaded once per process.
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const DeviceProfile>> cache;
  const bool by_name = name.find('/') == std::string::npos && !name.ends_with(".yaml");
  std::lock_guard lock(mu);
  if (by_name)
    if (auto it = cache.find(name); it != cache.end()) return it->second;
  auto p = std::make_shared<const DeviceProfile>(load_named_profile(name));
  if (by_name) cache.emplace(name, p);
  return p;
}

}  // namespace cocemu::python
