"""A chunked-overlap unit test of one's own torch code on cocemu (docs/pytorch.md).
    PYTHONPATH=build/python .venv/bin/python -m pytest -s examples/python/test_torch_overlap.py"""
import torch
import torch.distributed as dist
import cocemu.torch as ct


def matmul_all_reduce(x, w, chunks):  # the code under test: chunk i's all_reduce overlaps i+1
    y = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device="npu")
    rows, works = x.shape[0] // chunks, []
    for i in range(chunks):
        torch.matmul(x[i * rows:(i + 1) * rows], w, out=y[i * rows:(i + 1) * rows])
        works.append(dist.all_reduce(y[i * rows:(i + 1) * rows], async_op=True))
    for work in works:
        work.wait()  # the compute stream waits; the host does not
    return y


def run(chunks, numerics, m=4096, k=1024, n=8192):
    def fn():
        dev = "npu"  # this rank's NPU: cpu tensors; meta (shapes only) when numerics=False
        with ct.unmodeled():  # inputs: small integers, so every sum is exact
            x = (torch.arange(m * k, device=dev) % 5 - 2).reshape(m, k).to(torch.bfloat16)
            w = (torch.arange(k * n, device=dev) % 3 - 1 + dist.get_rank()).reshape(k, n)
            w = w.to(torch.bfloat16)
        return matmul_all_reduce(x, w, chunks)
    return ct.run(fn, world_size=8, numerics=numerics)


def test_same_bits_as_serial():
    assert torch.equal(run(4, True, 64, 32, 16).returns[0], run(1, True, 64, 32, 16).returns[0])


def test_four_chunks_hide_communication():
    serial, chunked = run(1, False).makespan_ns, run(4, False).makespan_ns
    print(f"modeled: serial {serial / 1e3:.1f} us, 4 chunks {chunked / 1e3:.1f} us")
    assert chunked < serial
