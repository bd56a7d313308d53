"""The TP linears with their CoC strategies and the fused kernels, from Python: a user's scheme
can be compared with the built-in serial, script and fused ones on the same shapes."""
import numpy as np
import pytest

import cocemu

TP, M, K, N = 4, 64, 32, 48


def ints(shape, seed):
    return (((np.arange(np.prod(shape)) * 7 + seed * 13) % 9) - 4).astype(np.float32).reshape(shape)


STRATEGIES = [dict(strategy="serial"), dict(strategy="script", parallel_num=2),
              dict(strategy="script", parallel_num=4), dict(strategy="fused", tile_rows=8)]


def column_sp(options):
    def body(rank):
        r = rank.id
        layer = cocemu.ColumnParallelLinear(rank.world, ints((N // TP, K), r), ints((N // TP,), 9 + r),
                                            sequence_parallel=True)
        x = ints((M // TP, K), 20 + r)
        with rank.segment("fwd"):
            y = layer.forward(x, **options)
        with rank.segment("bwd"):
            dx = layer.backward(np.ones_like(y), **options)
        rank.synchronize()
        return y.copy(), dx.copy(), layer.main_grad.copy()
    return cocemu.run(TP, body)


def test_column_parallel_strategies_agree_and_match_numpy():
    results = [column_sp(o) for o in STRATEGIES]
    x_full = np.concatenate([ints((M // TP, K), 20 + r) for r in range(TP)])
    for r in range(TP):
        expect = x_full @ ints((N // TP, K), r).T + ints((N // TP,), 9 + r)
        assert np.array_equal(results[0].returns[r][0], expect)
        for res in results[1:]:
            for a, b in zip(res.returns[r], results[0].returns[r]):
                assert np.array_equal(a, b)
    times = [res.makespan_ns for res in results]
    assert len(set(times)) > 1  # the strategies schedule differently
    assert [s.name for s in results[1].segments()] == ["fwd", "bwd"]


def test_row_parallel_sequence_parallel_forward():
    def body(rank, options):
        r = rank.id
        layer = cocemu.RowParallelLinear(rank.world, ints((N, K // TP), r), None,
                                         sequence_parallel=True)
        y = layer.forward(ints((M, K // TP), 30 + r), **options)
        rank.synchronize()
        return y.copy()
    outs = [cocemu.run(TP, lambda rank, o=o: body(rank, o)).returns for o in STRATEGIES]
    full = sum(ints((M, K // TP), 30 + r) @ ints((N, K // TP), r).T for r in range(TP))
    for r in range(TP):
        assert np.array_equal(outs[0][r], full[r * M // TP:(r + 1) * M // TP])
        for o in outs[1:]:
            assert np.array_equal(o[r], outs[0][r])


def test_fused_kernels_equal_serial_collectives():
    def body(rank):
        r = rank.id
        x, w = ints((M, K), 40 + r), ints((N, K), 50 + r)
        out = np.zeros((M, N), np.float32)
        cocemu.matmul_all_reduce(rank.world, x, w, out, tile_rows=8)
        rs = np.zeros((M // TP, N), np.float32)
        cocemu.matmul_reduce_scatter(rank.world, x, w, rs, tile_rows=8)
        ag = np.zeros((M, N), np.float32)
        gathered = np.zeros((M, K), np.float32)
        cocemu.all_gather_matmul(rank.world, x[:M // TP], w, ag, gathered=gathered, tile_rows=8)
        rank.synchronize()
        return out, rs, ag, gathered
    res = cocemu.run(TP, body).returns
    total = sum(ints((M, K), 40 + r) @ ints((N, K), 50 + r).T for r in range(TP))
    x_parts = np.concatenate([ints((M, K), 40 + r)[:M // TP] for r in range(TP)])
    for r in range(TP):
        out, rs, ag, gathered = res[r]
        assert np.array_equal(out, total)
        assert np.array_equal(rs, total[r * M // TP:(r + 1) * M // TP])
        assert np.array_equal(gathered, x_parts)
        assert np.array_equal(ag, x_parts @ ints((N, K), 50 + r).T)


def test_fused_kernel_price_is_the_launched_price():
    def body(rank):
        x = rank.zeros((4096, 1024), "bf16")
        w = rank.zeros((2048, 1024), "bf16")
        out = rank.zeros((4096, 2048), "bf16")
        cocemu.matmul_all_reduce(rank.world, x, w, out)
        rank.synchronize()
    r = cocemu.run(8, body, dry_run=True)
    fused = [o for o in r.ops(0) if o.kind == "fused"][0]
    assert fused.work_ns == pytest.approx(
        cocemu.fused_kernel_ns("ascend-910b", "matmul_all_reduce", 4096, 1024, 2048, 8, "bf16"))


def test_linear_options_are_checked():
    def body(rank):
        layer = cocemu.ColumnParallelLinear(rank.world, ints((N // 2, K), 0), None)
        layer.forward(ints((M, K), 1), strategy="sideways")
    with pytest.raises(cocemu.Error, match="strategy 'sideways' is unknown"):
        cocemu.run(2, body)

    def body2(rank):
        layer = cocemu.ColumnParallelLinear(rank.world, ints((N // 2, K), 0), None)
        layer.forward(ints((M, K), 1), parallel_nums=2)
    with pytest.raises(cocemu.Error, match="parallel_nums"):
        cocemu.run(2, body2)
