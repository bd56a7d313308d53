"""A MindSpeed-style script CoC written in plain torch, run on cocemu.torch (R-PY-9): the
ColumnParallel+SP forward (all_gather chunks -> matmul, communication first), the RowParallel+SP
forward (matmul -> reduce_scatter chunks, compute first) and the all_reduce variant, written the
way mindspeed/core/tensor_parallel/lcal_coc/ is (torch.npu.current_device(), _all_gather_base,
Work.wait()). P = 1, 2, 4, 8 give bitwise equal outputs, and modeled times within 1% of
cocemu's own `script` strategy on the same shapes and profile."""
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import cocemu  # noqa: E402
import cocemu.torch as ct  # noqa: E402


class CommConfig:  # what MindSpeed's min_comm_config holds
    def __init__(self, parallel_num):
        self.tp_group = None  # the world group
        self.tp_world_size = dist.get_world_size()
        self.parallel_num = parallel_num


def shuffle(x, first, second):
    """Rows [first, second, per] -> [second, first, per] (MindSpeed's shuffle_as_coc_*)."""
    per = x.shape[0] // first // second
    return torch.reshape(x.reshape([first, second, per] + list(x.shape[1:])).transpose(0, 1),
                         tuple(x.shape))


class ChunkedOverlap:
    """P chunks of a matmul and a collective over the comm stream, as COCParallel runs them."""

    def __init__(self, cfg, data, comm, compute, n_out, compute_first):
        self.cfg, self.data, self.comm, self.compute = cfg, data, comm, compute
        self.P, ws = cfg.parallel_num, cfg.tp_world_size
        rows = data.shape[0]
        out_rows = {"all_gather": rows * ws, "reduce_scatter": rows // ws,
                    "all_reduce": rows}[comm]
        dev = torch.npu.current_device()
        self.output = torch.empty(out_rows, n_out, dtype=data.dtype, device=dev)
        if compute_first:
            self.comm_output = self.output
        else:
            self.comm_output = torch.empty(rows * ws, data.shape[1], dtype=data.dtype, device=dev)
        self.compute_first = compute_first

    def issue(self, i, tensor):
        c = self.comm_output.shape[0] // self.P
        if self.comm == "all_gather":
            out = self.comm_output[i * c:(i + 1) * c]
            return torch.distributed._all_gather_base(out, tensor.contiguous(),
                                                      group=self.cfg.tp_group, async_op=True), out
        if self.comm == "reduce_scatter":
            out = self.comm_output[i * c:(i + 1) * c]
            return torch.distributed._reduce_scatter_base(out, tensor.contiguous(),
                                                          group=self.cfg.tp_group,
                                                          async_op=True), out
        return torch.distributed.all_reduce(tensor, group=self.cfg.tp_group, async_op=True), tensor

    def run(self):
        step = self.data.shape[0] // self.P
        o = self.output.shape[0] // self.P
        if self.compute_first:
            works = []
            for i in range(self.P):
                piece = self.data[i * step:(i + 1) * step]
                if self.comm == "all_reduce":
                    result = self.output[i * o:(i + 1) * o]
                    self.compute(piece, result)
                else:
                    result = self.compute(piece, None)
                works.append(self.issue(i, result)[0])
            for w in works:
                w.wait()
            return self.output
        previous = None
        for i in range(self.P):
            work, out = self.issue(i, self.data[i * step:(i + 1) * step])
            if previous is not None:
                previous[0].wait()
                self.compute(previous[1], self.output[(i - 1) * o:i * o])
            previous = (work, out)
        previous[0].wait()
        self.compute(previous[1], self.output[(self.P - 1) * o:])
        return self.output


def column_sp_forward(cfg, x, weight, bias):
    """y [m, n/tp] = all_gather(x [m/tp, k]) @ weight.T + bias, communication first."""
    trans_weight = weight.t()
    ws = cfg.tp_world_size
    if cfg.parallel_num == 1:  # MindSpeed's rewrite path: one gather, one matmul
        total = torch.empty(x.shape[0] * ws, x.shape[1], dtype=x.dtype,
                            device=torch.npu.current_device())
        torch.distributed._all_gather_base(total, x, group=cfg.tp_group)
        return torch.matmul(total, trans_weight) + bias

    def compute(inp, out):
        return torch.matmul(inp, trans_weight, out=out)
    run = ChunkedOverlap(cfg, x, "all_gather", compute, trans_weight.shape[1], False)
    y = shuffle(run.run(), cfg.parallel_num, ws)  # [P, ws, per] -> [ws, P, per]
    return y + bias


def row_sp_forward(cfg, x, weight, bias):
    """y [m/tp, n] = reduce_scatter(x [m, k/tp] @ weight.T) + bias, compute first."""
    trans_weight = weight.t()
    ws = cfg.tp_world_size
    if cfg.parallel_num == 1:
        partial = torch.matmul(x, trans_weight)
        y = torch.empty(x.shape[0] // ws, partial.shape[1], dtype=x.dtype,
                        device=torch.npu.current_device())
        torch.distributed._reduce_scatter_base(y, partial, group=cfg.tp_group)
        return y + bias
    x = shuffle(x, ws, cfg.parallel_num)  # [ws, P, per] -> [P, ws, per]

    def compute(inp, out):
        return torch.matmul(inp, trans_weight)
    return ChunkedOverlap(cfg, x, "reduce_scatter", compute, trans_weight.shape[1],
                          True).run() + bias


def row_all_reduce_forward(cfg, x, weight, bias):
    """y [m, n] = all_reduce(x [m, k/tp] @ weight.T) + bias, compute first."""
    trans_weight = weight.t()
    if cfg.parallel_num == 1:
        y = torch.matmul(x, trans_weight)
        torch.distributed.all_reduce(y, group=cfg.tp_group)
        return y + bias

    def compute(inp, out):
        return torch.matmul(inp, trans_weight, out=out)
    return ChunkedOverlap(cfg, x, "all_reduce", compute, trans_weight.shape[1], True).run() + bias


FORWARDS = {"column_sp": column_sp_forward, "row_sp": row_sp_forward,
            "row_all_reduce": row_all_reduce_forward}


def shapes(kind, m, k, n, ws):
    """(x, weight, bias) shapes per rank for an [m, k] x [k, n] layer over ws ranks."""
    if kind == "column_sp":
        return (m // ws, k), (n // ws, k), (n // ws,)
    return (m, k // ws), (n, k // ws), (n,)


def small_ints(shape, seed, dtype):
    n = 1
    for s in shape:
        n *= s
    v = (torch.arange(n, dtype=torch.int64) * 7 + seed * 13) % 5 - 2
    return v.reshape(shape).to(dtype)


def run_torch(kind, P, m, k, n, ws=8, dtype=torch.float32, numerics=True):
    def fn():
        xs, wsh, bs = shapes(kind, m, k, n, ws)
        dev = torch.npu.current_device()
        with ct.unmodeled():
            if numerics:
                r = dist.get_rank()
                x, w, b = (small_ints(s, r * 3 + j, dtype) for j, s in enumerate((xs, wsh, bs)))
            else:
                x, w, b = (torch.empty(s, dtype=dtype, device=dev) for s in (xs, wsh, bs))
        y = FORWARDS[kind](CommConfig(P), x, w, b)
        torch.npu.synchronize()
        return y
    return ct.run(fn, world_size=ws, numerics=numerics)


def run_cocemu(kind, P, m, k, n, ws=8, dtype="bf16"):
    """cocemu's own layer with the `script` strategy (serial for P = 1: MindSpeed's rewrite)."""
    def body(rank):
        xs, wsh, bs = shapes(kind, m, k, n, ws)
        x, w, b = (rank.zeros(s, dtype) for s in (xs, wsh, bs))
        if kind == "column_sp":
            layer = cocemu.ColumnParallelLinear(rank.world, w, b, sequence_parallel=True)
        else:
            layer = cocemu.RowParallelLinear(rank.world, w, b,
                                             sequence_parallel=kind == "row_sp")
        layer.forward(x, strategy="script" if P > 1 else "serial", parallel_num=P,
                      matmul_soc_friendly=False)
        rank.synchronize()
    return cocemu.run(ws, body, dry_run=True).makespan_ns


@pytest.mark.parametrize("kind", sorted(FORWARDS))
def test_chunked_outputs_bitwise_equal_to_p1(kind):
    m, k, n = 64, 32, 48
    ref = run_torch(kind, 1, m, k, n).returns
    for P in (2, 4, 8):
        if kind == "column_sp" and (m // 8) % P:
            continue
        out = run_torch(kind, P, m, k, n).returns
        for r in range(8):
            assert torch.equal(out[r], ref[r]), (kind, P, r)
    # and the numbers are the layer's: all_gather(x) @ w.T summed over ranks, + bias
    assert ref[0].abs().sum() > 0


def test_bf16_chunked_equal():
    ref = run_torch("row_sp", 1, 64, 32, 48, dtype=torch.bfloat16).returns
    out = run_torch("row_sp", 4, 64, 32, 48, dtype=torch.bfloat16).returns
    assert all(torch.equal(a, b) for a, b in zip(ref, out))


# Production shapes (a Llama-like MLP's up and down projections, TP 8, 4096 tokens), bf16.
SHAPES = {"column_sp": (4096, 4096, 14336), "row_sp": (4096, 14336, 4096),
          "row_all_reduce": (4096, 14336, 4096)}


@pytest.mark.parametrize("kind", sorted(FORWARDS))
@pytest.mark.parametrize("P", [1, 2, 4, 8])
def test_modeled_time_within_1_percent_of_script_strategy(kind, P):
    m, k, n = SHAPES[kind]
    torch_ns = run_torch(kind, P, m, k, n, dtype=torch.bfloat16, numerics=False).makespan_ns
    script_ns = run_cocemu(kind, P, m, k, n)
    print(f"{kind} P={P}: torch {torch_ns / 1e3:.1f} us, cocemu script {script_ns / 1e3:.1f} us")
    assert abs(torch_ns - script_ns) <= 0.01 * script_ns
