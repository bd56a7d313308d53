"""torch CPU tensors reach cocemu through .numpy() without a copy (the path the torch backend of
the next issue takes): each dtype torch.distributed code sends, bf16 through an int16 view."""
import numpy as np
import pytest

import cocemu

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.int8,
                                   torch.int32, torch.int64, torch.uint8, torch.bool])
def test_all_reduce_in_place_on_a_torch_tensor(dtype):
    def body(rank):
        t = torch.full((3, 4), rank.id + 1).to(dtype)
        a = t.numpy()  # shares t's memory
        cocemu.all_reduce(rank.world, a, op="max")
        rank.synchronize()
        return t.clone()
    out = cocemu.run(4, body).returns
    expected = torch.full((3, 4), 4).to(dtype)
    assert all(torch.equal(t, expected) for t in out)


def test_bf16_torch_tensor_through_an_int16_view():
    def body(rank):
        t = torch.full((8,), rank.id + 0.5, dtype=torch.bfloat16)
        a = t.view(torch.int16).numpy().view(np.uint16)  # no copy: bf16 bits as uint16
        cocemu.all_reduce(rank.world, a)
        rank.synchronize()
        return t.float().tolist()
    assert cocemu.run(4, body).returns == [[8.0] * 8] * 4
