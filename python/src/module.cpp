// The `cocemu._cocemu` extension module; the `cocemu` package (python/cocemu/) re-exports it.
#include "common.h"

PYBIND11_MODULE(_cocemu, m) {
  using namespace cocemu::python;
  m.doc() = "cocemu: emulated accelerator nodes with a modeled device timeline (C++ bindings).";
  m.attr("__version__") = COCEMU_VERSION;
  init_numpy();
  register_errors(m);
  Classes classes;
  bind_tensors(m);
  bind_runtime(m, classes);
  bind_symmetric(m);
  bind_collectives(m, classes);
  bind_layers(m, classes);
  bind_bench(m, classes);
  // References queued by threads without the GIL are dropped at exit too.
  py::module_::import("atexit").attr("register")(py::cpp_function([] { release_pending(); }));
}
