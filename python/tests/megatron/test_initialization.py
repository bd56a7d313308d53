"""Megatron-LM core_v0.16.1 tests/unit_tests/tensor_parallel/test_initialization.py, the same checks
on megatron.core.tensor_parallel.layers with CPU initialization: a layer made on 4 tensor-parallel
ranks holds exactly its slice of the weight the same layer gets on 1 rank (same torch seed, a
different model-parallel seed on purpose). test_te_col_init and test_te_row_init (Transformer
Engine layers) are not written: TE does not install without CUDA."""
import pytest
import torch

pytest.importorskip("megatron.core")

import megatron.core.parallel_state as ps  # noqa: E402
from megatron.core.tensor_parallel.layers import (  # noqa: E402
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402
from mcore_harness import Utils  # noqa: E402


@pytest.mark.needs_device
class Test:

    transformer_config = TransformerConfig(
        num_layers=1, hidden_size=12, num_attention_heads=4, use_cpu_initialization=True)

    def teardown_method(self, method):
        Utils.destroy_model_parallel()

    def _weights(self, make):
        """The weight `make()` builds on tensor parallel 1, then on tensor parallel 4."""
        Utils.initialize_model_parallel(1, 1)
        torch.manual_seed(42)
        model_parallel_cuda_manual_seed(42)
        whole = make().weight
        Utils.destroy_model_parallel()

        Utils.initialize_model_parallel(4, 1)
        torch.manual_seed(42)
        model_parallel_cuda_manual_seed(41)  # a different seed: CPU initialization ignores it
        part = make().weight
        return whole, part, ps.get_tensor_model_parallel_rank()

    def test_embedding_init(self):
        whole, part, rank = self._weights(lambda: VocabParallelEmbedding(
            num_embeddings=16, embedding_dim=4, init_method=self.transformer_config.init_method,
            config=self.transformer_config))
        assert part.shape[0] * 4 == whole.shape[0]
        assert torch.equal(whole[rank * 4:(rank + 1) * 4], part)

    def test_row_init(self):
        whole, part, rank = self._weights(lambda: RowParallelLinear(
            input_size=16, output_size=16, init_method=self.transformer_config.init_method,
            bias=True, input_is_parallel=False, config=self.transformer_config,
            skip_bias_add=False))
        assert part.shape[1] * 4 == whole.shape[1]
        assert torch.equal(whole[:, rank * 4:(rank + 1) * 4], part)

    def test_col_init(self):
        whole, part, rank = self._weights(lambda: ColumnParallelLinear(
            input_size=16, output_size=16, init_method=self.transformer_config.init_method,
            bias=True, config=self.transformer_config, skip_bias_add=False))
        assert part.shape[0] * 4 == whole.shape[0]
        assert torch.equal(whole[rank * 4:(rank + 1) * 4], part)
