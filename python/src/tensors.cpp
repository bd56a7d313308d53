// Bindings of cocemu's tensors: cocemu.Tensor (shape-only in dry runs, a NumPy view of its
// storage otherwise) and bf16 held in uint16 arrays.
#include <fmt/format.h>

#include <pybind11/numpy.h>

#include "common.h"

namespace cocemu::python {

namespace {

using namespace pybind11::literals;

// ---------------------------------------------------------------------------------------------
// bf16 conversions

py::array_t<std::uint16_t> to_bf16_array(py::handle values) {
  // Real numbers only: NumPy would turn None into NaN and drop a complex number's imaginary part.
  const py::array a = py::array::ensure(values);
  COCEMU_CHECK_ARG(a && std::string("fiub").find(a.dtype().kind()) != std::string::npos,
                   "to_bf16: x = {} ({}) is not an array of real numbers", repr_of(values),
                   a ? py::str(a.dtype()).cast<std::string>() : Py_TYPE(values.ptr())->tp_name);
  const auto x = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);
  py::array_t<std::uint16_t> out(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  const float* in = x.data();
  std::uint16_t* o = out.mutable_data();
  for (py::ssize_t i = 0; i < x.size(); ++i)
    o[i] = to_bf16(in[i]).bits;
  return out;
}

py::array_t<float> from_bf16_array(py::handle values) {
  COCEMU_CHECK_ARG(
      py::isinstance<py::array>(values) &&
          py::reinterpret_borrow<py::array>(values).dtype().is(py::dtype::of<std::uint16_t>()),
      "from_bf16: x must be a uint16 array holding bf16 (cocemu.to_bf16 makes one), "
      "got {}",
      py::isinstance<py::array>(values)
          ? "an array of dtype " +
                py::str(py::reinterpret_borrow<py::array>(values).dtype()).cast<std::string>()
          : repr_of(values) + " (" + Py_TYPE(values.ptr())->tp_name + ")");
  const auto x = py::array_t<std::uint16_t, py::array::c_style>::ensure(values);
  py::array_t<float> out(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  const std::uint16_t* in = x.data();
  float* o = out.mutable_data();
  for (py::ssize_t i = 0; i < x.size(); ++i)
    o[i] = to_float(bf16{in[i]});
  return out;
}

}  // namespace

void bind_tensors(py::module_& m) {
  // Tensors ----------------------------------------------------------------------------------
  py::class_<Tensor>(m, "Tensor",
                     "A cocemu tensor: shape-only in dry runs (no storage); a NumPy view of "
                     "its storage otherwise (Tensor.numpy()).")
      .def_static(
          "zeros",
          [](py::handle shape, py::handle dtype) {
            return Tensor::zeros(shape_arg(shape), dtype_arg(dtype));
          },
          "shape"_a, "dtype"_a = "f32")
      .def_static(
          "shape_only",
          [](py::handle shape, py::handle dtype) {
            return Tensor::shape_only(shape_arg(shape), dtype_arg(dtype));
          },
          "shape"_a, "dtype"_a = "f32")
      .def_static(
          "from_numpy",
          [](py::handle array) { return tensor_arg(array, "Tensor.from_numpy", Access::write); },
          "array"_a, "The array as a tensor, sharing its memory (no copy).")
      .def_property_readonly("shape",
                             [](const Tensor& t) {
                               py::tuple s(t.ndim());
                               for (int d = 0; d < t.ndim(); ++d)
                                 s[std::size_t(d)] = t.size(d);
                               return s;
                             })
      .def_property_readonly("dtype",
                             [](const Tensor& t) { return std::string(name_of(t.dtype())); })
      .def_property_readonly("ndim", &Tensor::ndim)
      .def_property_readonly("numel", &Tensor::numel)
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def_property_readonly("has_data", &Tensor::has_data)
      .def("numpy",
           [](const Tensor& t) {
             COCEMU_CHECK_ARG(t.has_data(), "Tensor.numpy: {} has no storage (dry run)",
                              t.describe());
             return to_python(t);
           })
      .def(
          "rows",
          [](const Tensor& t, py::handle begin, py::handle end) {
            constexpr std::int64_t big = std::numeric_limits<std::int64_t>::max();
            return t.rows(int_arg(begin, "Tensor.rows", "begin", 0, big),
                          int_arg(end, "Tensor.rows", "end", 0, big));
          },
          "begin"_a, "end"_a)
      .def(
          "__getitem__",
          [](const Tensor& t, const py::slice& rows) {
            COCEMU_CHECK_ARG(t.ndim() >= 1, "Tensor[...]: {} has no rows", t.describe());
            std::size_t start = 0, stop = 0, step = 0, length = 0;
            if (!rows.compute(std::size_t(t.size(0)), &start, &stop, &step, &length))
              throw py::error_already_set();
            COCEMU_CHECK_ARG(step == 1 || length <= 1,
                             "Tensor[...]: a slice of rows with step {}; views are contiguous "
                             "row ranges",
                             step);
            return t.rows(std::int64_t(start), std::int64_t(start + length));
          },
          "rows"_a, "Rows of dimension 0 as a view: t[a:b] (as a NumPy array's).")
      .def("__len__", [](const Tensor& t) { return t.ndim() >= 1 ? t.size(0) : 0; })
      .def(
          "flat",
          [](const Tensor& t, py::handle begin, py::handle end) {
            constexpr std::int64_t big = std::numeric_limits<std::int64_t>::max();
            return t.flat(int_arg(begin, "Tensor.flat", "begin", 0, big),
                          int_arg(end, "Tensor.flat", "end", 0, big));
          },
          "begin"_a, "end"_a)
      .def("reshape", [](const Tensor& t, py::handle shape) { return t.reshape(shape_arg(shape)); })
      .def("__repr__", [](const Tensor& t) { return "cocemu.Tensor(" + t.describe() + ")"; });

  m.def("to_bf16", &to_bf16_array, "x"_a,
        "bf16 values of `x` (converted to float32 first), rounded to nearest even, as the uint16 "
        "array cocemu uses for bf16 (NumPy has no bfloat16).");
  m.def("from_bf16", &from_bf16_array, "x"_a,
        "The float32 values of a uint16 array holding bf16 (exact).");
  m.def(
      "numpy_dtype", [](py::handle dtype) { return numpy_dtype(dtype_arg(dtype)); }, "dtype"_a,
      "The NumPy dtype that holds cocemu's `dtype` (uint16 for bf16).");
}

}  // namespace cocemu::python
