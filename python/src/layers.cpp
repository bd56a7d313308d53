// Bindings of the layers library: Megatron's tensor-parallel linears with MindSpeed's CoC
// strategies (serial, script, fused), the fused compute-communication kernels and their pricing.
#include <fmt/format.h>

#include <limits>

#include "cocemu/layers/coc_config.h"
#include "cocemu/layers/fused_kernels.h"
#include "cocemu/layers/linear.h"
#include "collectives.h"

namespace cocemu::python {

namespace {

using namespace pybind11::literals;
using layers::LinearOptions;

struct CocConfigHandle {
  std::shared_ptr<const layers::CocConfig> config;
};

layers::Strategy strategy_arg(const std::string& s) {
  if (s == "serial") return layers::Strategy::serial;
  if (s == "script") return layers::Strategy::script;
  if (s == "fused") return layers::Strategy::fused;
  COCEMU_FAIL(Errc::invalid_argument, "strategy '{}' is unknown; allowed: serial, script, fused",
              s);
}

/// LinearOptions from keyword arguments named as its fields.
LinearOptions linear_options(const py::kwargs& kw) {
  LinearOptions o;
  for (auto [key, value] : kw) {
    const std::string k = key.cast<std::string>();
    if (k == "strategy")
      o.strategy = strategy_arg(value.cast<std::string>());
    else if (k == "parallel_num")
      o.parallel_num = value.cast<int>();
    else if (k == "tile_rows")
      o.tile_rows = value.cast<std::int64_t>();
    else if (k == "tiles_per_step")
      o.tiles_per_step = value.cast<int>();
    else if (k == "recompute_all_gather")
      o.recompute_all_gather = value.cast<bool>();
    else if (k == "enable_coc_in_column_backward")
      o.enable_coc_in_column_backward = value.cast<bool>();
    else if (k == "gradient_accumulation_fusion")
      o.gradient_accumulation_fusion = value.cast<bool>();
    else if (k == "matmul_soc_friendly")
      o.matmul_soc_friendly = value.cast<bool>();
    else if (k == "k_min")
      o.k_min = value.cast<std::int64_t>();
    else if (k == "k_max")
      o.k_max = value.cast<std::int64_t>();
    else if (k == "label")
      o.label = value.cast<std::string>();
    else if (k == "coc_config")
      o.per_shape = value.is_none() ? nullptr : value.cast<const CocConfigHandle&>().config;
    else
      COCEMU_FAIL(Errc::invalid_argument,
                  "linear option '{}' is unknown; allowed: strategy, parallel_num, tile_rows, "
                  "tiles_per_step, recompute_all_gather, enable_coc_in_column_backward, "
                  "gradient_accumulation_fusion, matmul_soc_friendly, k_min, k_max, label, "
                  "coc_config",
                  k);
  }
  return o;
}

/// The fused kernels' options, checked strictly (integers and bools, not 1.5, 2**63 or 'no'):
/// the ranges are fused_kernels.cpp's.
layers::FusedOptions fused_options(const char* call, py::handle tile_rows,
                                   py::handle tiles_per_step, py::handle deterministic,
                                   const std::string& label, py::handle checked) {
  layers::FusedOptions o;
  o.tile_rows = int_arg(tile_rows, call, "tile_rows", 1, std::numeric_limits<std::int64_t>::max());
  o.tiles_per_step = int(int_arg(tiles_per_step, call, "tiles_per_step", 1, 15));
  o.deterministic = bool_arg(deterministic, call, "deterministic");
  o.label = label;
  o.checked = bool_arg(checked, call, "checked");
  return o;
}

/// A fused kernel's bias: None, or one value per output column in out's dtype.
void check_bias(const Tensor& bias, const Tensor& out, const char* call) {
  if (!bias.defined() || out.ndim() < 1) return;
  const std::int64_t n = out.size(out.ndim() - 1);
  COCEMU_CHECK_ARG(bias.ndim() == 1 && bias.size(0) == n && bias.dtype() == out.dtype(),
                   "{}: bias {} must be [{}] of out's dtype (out is {})", call, bias.describe(), n,
                   out.describe());
}

template <class Layer>
struct LayerHandle {
  std::unique_ptr<Layer> layer;
  SessionPtr session;
  Rank* rank = nullptr;
  Layer& host(const char* call) const {
    session->check(call);
    check_host_thread(*rank, call);
    return *layer;
  }
  Layer& get(const char* call) const {
    session->check(call);
    return *layer;
  }
};
using ColumnHandle = LayerHandle<layers::ColumnParallelLinear>;
using RowHandle = LayerHandle<layers::RowParallelLinear>;

template <class Layer>
py::class_<LayerHandle<Layer>> bind_linear(py::module_& m, const char* name, const char* doc) {
  using Handle = LayerHandle<Layer>;
  return py::class_<Handle>(m, name, doc)
      .def(
          "forward",
          [](Handle& h, py::handle x, const py::kwargs& kw) {
            Layer& l = h.host("forward");
            const Tensor in = tensor_arg(x, "forward x", Access::read);
            const LinearOptions o = linear_options(kw);
            Tensor y;
            {
              py::gil_scoped_release nogil;
              y = l.forward(in, o);
            }
            return to_python(y);
          },
          "x"_a,
          "Enqueues the forward with the options given as keywords (strategy='serial' | "
          "'script' | 'fused', parallel_num, tile_rows, tiles_per_step, …, coc_config); returns "
          "its output.")
      .def(
          "backward",
          [](Handle& h, py::handle dy, const py::kwargs& kw) {
            Layer& l = h.host("backward");
            const Tensor in = tensor_arg(dy, "backward dy", Access::read);
            const LinearOptions o = linear_options(kw);
            Tensor dx;
            {
              py::gil_scoped_release nogil;
              dx = l.backward(in, o);
            }
            return to_python(dx);
          },
          "dy"_a, "Enqueues the backward; returns dX and accumulates main_grad and bias_grad.")
      .def_property_readonly("weight",
                             [](const Handle& h) { return to_python(h.get("weight").weight()); })
      .def_property_readonly(
          "main_grad", [](const Handle& h) { return to_python(h.get("main_grad").main_grad()); })
      .def_property_readonly(
          "bias_grad", [](const Handle& h) { return to_python(h.get("bias_grad").bias_grad()); });
}

}  // namespace

void bind_layers(py::module_& m, Classes&) {
  py::class_<CocConfigHandle>(m, "CocConfig",
                              "A MindSpeed CoC config (configs/coc.yaml and its environment).")
      .def_property_readonly("parallel_num",
                             [](const CocConfigHandle& c) { return c.config->parallel_num; })
      .def_property_readonly("fused", [](const CocConfigHandle& c) { return c.config->fused; })
      .def_property_readonly("tile_rows",
                             [](const CocConfigHandle& c) { return c.config->tile_rows; })
      .def_property_readonly("tiles_per_step",
                             [](const CocConfigHandle& c) { return c.config->tiles_per_step; })
      .def_property_readonly("customized_coc",
                             [](const CocConfigHandle& c) { return c.config->customized_coc; });
  m.def(
      "load_coc_config",
      [](py::handle path_) {
        const std::string path = str_arg(path_, "load_coc_config", "path");
        return CocConfigHandle{
            std::make_shared<const layers::CocConfig>(layers::load_coc_config(path))};
      },
      "path"_a, "Loads a CoC config YAML (MindSpeed's format) and applies the environment.");

  bind_linear<layers::ColumnParallelLinear>(
      m, "ColumnParallelLinear",
      "Y = X·Wᵀ + b with W [n/tp, k] (output features sharded); with sequence parallelism the "
      "forward all-gathers X first.")
      .def(py::init([](GroupHandle& g, py::handle weight, py::handle bias, bool sequence_parallel,
                       bool gather_output) {
             Group& tp = g.host("ColumnParallelLinear");
             return ColumnHandle{std::make_unique<layers::ColumnParallelLinear>(
                                     tp, tensor_arg(weight, "weight", Access::read),
                                     optional_tensor_arg(bias, "bias", Access::read),
                                     sequence_parallel, gather_output),
                                 g.session, &tp.owner()};
           }),
           "group"_a, "weight"_a, "bias"_a = py::none(), "sequence_parallel"_a = false,
           "gather_output"_a = false, "weight: this rank's shard [n/tp, k]; bias: [n/tp] or None.");
  bind_linear<layers::RowParallelLinear>(
      m, "RowParallelLinear",
      "Y = X·Wᵀ + b with W [n, k/tp] (input features sharded); the forward all-reduces Y (or "
      "reduce-scatters it with sequence parallelism).")
      .def(py::init([](GroupHandle& g, py::handle weight, py::handle bias, bool sequence_parallel,
                       bool input_is_parallel) {
             Group& tp = g.host("RowParallelLinear");
             return RowHandle{std::make_unique<layers::RowParallelLinear>(
                                  tp, tensor_arg(weight, "weight", Access::read),
                                  optional_tensor_arg(bias, "bias", Access::read),
                                  sequence_parallel, input_is_parallel),
                              g.session, &tp.owner()};
           }),
           "group"_a, "weight"_a, "bias"_a = py::none(), "sequence_parallel"_a = false,
           "input_is_parallel"_a = true, "weight: this rank's shard [n, k/tp]; bias: [n] or None.");

  // Fused kernels ------------------------------------------------------------------------------
  m.def(
      "matmul_all_reduce",
      [](GroupHandle& g, py::handle x, py::handle w, py::handle out, py::handle bias,
         py::handle tile_rows, py::handle tiles_per_step, py::handle deterministic,
         py::handle label, py::handle checked) {
        Group& group = g.host("matmul_all_reduce");
        const Tensor tx = tensor_arg(x, "matmul_all_reduce x", Access::read),
                     tw = tensor_arg(w, "matmul_all_reduce w", Access::read),
                     tb = optional_tensor_arg(bias, "matmul_all_reduce bias", Access::read),
                     to = tensor_arg(out, "matmul_all_reduce out", Access::write);
        check_bias(tb, to, "matmul_all_reduce");
        const auto o = fused_options("matmul_all_reduce", tile_rows, tiles_per_step, deterministic,
                                     str_arg(label, "matmul_all_reduce", "label"), checked);
        py::gil_scoped_release nogil;
        layers::matmul_all_reduce(group, tx, tw, tb, to, o);
      },
      "group"_a, "x"_a, "w"_a, "out"_a, py::kw_only(), "bias"_a = py::none(), "tile_rows"_a = 128,
      "tiles_per_step"_a = 2, "deterministic"_a = true, "label"_a = "", "checked"_a = false,
      "out[m, n] = all_reduce(x[m, k]·wᵀ) (+ bias once); w is [n, k].");
  m.def(
      "matmul_reduce_scatter",
      [](GroupHandle& g, py::handle x, py::handle w, py::handle out, bool trans_w, py::handle bias,
         py::handle tile_rows, py::handle tiles_per_step, py::handle deterministic,
         py::handle label, py::handle checked) {
        Group& group = g.host("matmul_reduce_scatter");
        const Tensor tx = tensor_arg(x, "matmul_reduce_scatter x", Access::read),
                     tw = tensor_arg(w, "matmul_reduce_scatter w", Access::read),
                     tb = optional_tensor_arg(bias, "matmul_reduce_scatter bias", Access::read),
                     to = tensor_arg(out, "matmul_reduce_scatter out", Access::write);
        check_bias(tb, to, "matmul_reduce_scatter");
        const auto o =
            fused_options("matmul_reduce_scatter", tile_rows, tiles_per_step, deterministic,
                          str_arg(label, "matmul_reduce_scatter", "label"), checked);
        py::gil_scoped_release nogil;
        layers::matmul_reduce_scatter(group, tx, tw, trans_w, tb, to, o);
      },
      "group"_a, "x"_a, "w"_a, "out"_a, py::kw_only(), "trans_w"_a = true, "bias"_a = py::none(),
      "tile_rows"_a = 128, "tiles_per_step"_a = 2, "deterministic"_a = true, "label"_a = "",
      "checked"_a = false,
      "out[m/ws, n] = reduce_scatter(x[m, k]·op(w)) (+ bias once); w is [n, k] with trans_w "
      "(Megatron's layout), else [k, n].");
  m.def(
      "all_gather_matmul",
      [](GroupHandle& g, py::handle x, py::handle w, py::handle out, bool trans_w, py::handle bias,
         py::handle gathered, py::handle tile_rows, py::handle tiles_per_step,
         py::handle deterministic, py::handle label, py::handle checked) {
        Group& group = g.host("all_gather_matmul");
        const Tensor tx = tensor_arg(x, "all_gather_matmul x", Access::read),
                     tw = tensor_arg(w, "all_gather_matmul w", Access::read),
                     tb = optional_tensor_arg(bias, "all_gather_matmul bias", Access::read),
                     to = tensor_arg(out, "all_gather_matmul out", Access::write),
                     tg =
                         optional_tensor_arg(gathered, "all_gather_matmul gathered", Access::write);
        check_bias(tb, to, "all_gather_matmul");
        const auto o = fused_options("all_gather_matmul", tile_rows, tiles_per_step, deterministic,
                                     str_arg(label, "all_gather_matmul", "label"), checked);
        py::gil_scoped_release nogil;
        layers::all_gather_matmul(group, tx, tw, trans_w, tb, to, tg, o);
      },
      "group"_a, "x"_a, "w"_a, "out"_a, py::kw_only(), "trans_w"_a = true, "bias"_a = py::none(),
      "gathered"_a = py::none(), "tile_rows"_a = 128, "tiles_per_step"_a = 2,
      "deterministic"_a = true, "label"_a = "", "checked"_a = false,
      "out[m, n] = all_gather(x[m/ws, k])·op(w) (+ bias); `gathered` [m, k] receives the "
      "gathered input if given.");
  m.def(
      "fused_kernel_ns",
      [](py::handle profile, py::handle kind_, py::handle m_, py::handle k, py::handle n,
         py::handle ranks, py::handle dtype, bool trans_w, py::handle tile_rows,
         py::handle tiles_per_step, py::handle deterministic) {
        const char* call = "fused_kernel_ns";
        const std::string kind = str_arg(kind_, call, "kind");
        constexpr std::int64_t big = std::numeric_limits<std::int64_t>::max();
        layers::FusedKind fk;
        if (kind == "matmul_all_reduce")
          fk = layers::FusedKind::matmul_all_reduce;
        else if (kind == "matmul_reduce_scatter")
          fk = layers::FusedKind::matmul_reduce_scatter;
        else if (kind == "all_gather_matmul")
          fk = layers::FusedKind::all_gather_matmul;
        else
          COCEMU_FAIL(Errc::invalid_argument,
                      "fused kernel '{}' is unknown; allowed: matmul_all_reduce, "
                      "matmul_reduce_scatter, all_gather_matmul",
                      kind);
        return layers::fused_kernel_ns(
            *profile_arg(profile), fk, int_arg(m_, call, "m", 0, big),
            int_arg(k, call, "k", 0, big), int_arg(n, call, "n", 0, big),
            int(int_arg(ranks, call, "ranks", 1, 1024)), dtype_arg(dtype),
            fused_options(call, tile_rows, tiles_per_step, deterministic, "", py::bool_(false)),
            trans_w);
      },
      "profile"_a, "kind"_a, "m"_a, "k"_a, "n"_a, "ranks"_a, "dtype"_a = "bf16", py::kw_only(),
      "trans_w"_a = true, "tile_rows"_a = 128, "tiles_per_step"_a = 2, "deterministic"_a = true,
      "Modeled ns of a fused kernel of an [m, k]·[k, n] product over `ranks` ranks, as it is "
      "priced when it launches (m: gathered rows for all_gather_matmul, unscattered rows for "
      "matmul_reduce_scatter).");
}

}  // namespace cocemu::python
