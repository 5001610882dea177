"""The grouped CPU LoRA kernels give vLLM's own torch ops' results (loaded from vLLM's file, whatever is installed)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from async_rl.actor import lora_kernels

lora_ops_module = pytest.importorskip("vllm.lora.ops.torch_ops.lora_ops")


def _vllm_original():
    spec = importlib.util.spec_from_file_location("vllm_original_lora_ops", lora_ops_module.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ORIG = _vllm_original()
G = torch.Generator().manual_seed(0)


def _case(tokens: int, slots: int, rank: int, width: int, indices: list[int], four_d: bool):
    a = torch.randn(slots, rank, width, generator=G)  # shrink weights [slots, rank, in]
    b = torch.randn(slots, width, rank, generator=G)  # expand weights [slots, out, rank]
    if four_d:
        a, b = a[:, None], b[:, None]
    return torch.randn(tokens, width, generator=G), torch.randn(tokens, rank, generator=G), a, b, torch.tensor(indices)


@pytest.mark.parametrize(
    "indices",
    [[0, 0, 0, 0, 0], [1, 0, 2, 1, -1], [-1, -1, -1, -1, -1], [2, 2, 0, 0, 1]],
    ids=["one-adapter", "mixed-with-none", "none", "grouped"],
)
@pytest.mark.parametrize("four_d", [False, True])
def test_bgmv_kernels_match_vllms(indices: list[int], four_d: bool) -> None:
    x, h, a, b, idx = _case(5, 3, 4, 12, indices, four_d)
    for add in (False, True):
        got, want = torch.randn(5, 4, generator=G), None
        want = got.clone()
        lora_kernels.bgmv_shrink(x, a, got, idx, 0.5)
        ORIG.bgmv_shrink(x, a, want, idx, 0.5)
        torch.testing.assert_close(got, want)
        got = torch.randn(5, 14, generator=G)  # the output is wider than the adapter's (padding)
        want = got.clone()
        lora_kernels.bgmv_expand(h, b, got, idx, add)
        ORIG.bgmv_expand(h, b, want, idx, add)
        torch.testing.assert_close(got, want)
        got = torch.randn(5, 30, generator=G)
        want = got.clone()
        lora_kernels.bgmv_expand_slice(h, b, got, idx, 6, 12, add)
        ORIG.bgmv_expand_slice(h, b, want, idx, 6, 12, add)
        torch.testing.assert_close(got, want)


def test_sgmv_kernels_expand_per_sequence_indices_as_vllm_does() -> None:
    x, h, a, b, _ = _case(7, 3, 4, 12, [0] * 7, False)
    seq_idx, seq_len = torch.tensor([1, -1, 2]), torch.tensor([3, 1, 3])
    start = torch.tensor([0, 3, 4])
    got, want = torch.zeros(7, 4), torch.zeros(7, 4)
    lora_kernels.sgmv_shrink(x, a, got, start, seq_len, seq_idx, 3, 3, 7, 2.0)
    ORIG.sgmv_shrink(x, a, want, start, seq_len, seq_idx, 3, 3, 7, 2.0)
    torch.testing.assert_close(got, want)
    got, want = torch.ones(7, 12), torch.ones(7, 12)
    lora_kernels.sgmv_expand(h, b, got, start, seq_len, seq_idx, 3, 3, 7, True)
    ORIG.sgmv_expand(h, b, want, start, seq_len, seq_idx, 3, 3, 7, True)
    torch.testing.assert_close(got, want)
    got, want = torch.ones(7, 20), torch.ones(7, 20)
    lora_kernels.sgmv_expand_slice(h, b, got, start, seq_len, seq_idx, 3, 3, 7, 4, 12, False)
    ORIG.sgmv_expand_slice(h, b, want, start, seq_len, seq_idx, 3, 3, 7, 4, 12, False)
    torch.testing.assert_close(got, want)


def test_install_replaces_vllms_cpu_ops() -> None:
    from vllm.lora.punica_wrapper import punica_cpu

    assert lora_kernels.install() is True
    assert punica_cpu.bgmv_shrink is lora_kernels.bgmv_shrink
    assert lora_ops_module.sgmv_expand is lora_kernels.sgmv_expand


def test_prompt_logprob_rows_in_a_mixed_batch_pass_a_layer_without_adapter_weights() -> None:
    # vLLM's logits layer in a batch of 3 requests, one asking for the log-probs of its 5 prompt tokens: 7 rows, 3
    # per-request indices. Its adapter weights are zero (LoRA never targets the output layer).
    x = torch.randn(7, 12, generator=G)
    zero_a = torch.zeros(3, 1, 4, 12)
    out = torch.full((7, 4), 9.0)
    lora_kernels.bgmv_shrink(x, zero_a, out, torch.tensor([0, 1, 0]), 1.0)
    assert torch.equal(out, torch.zeros(7, 4))
    with pytest.raises(RuntimeError):  # vLLM's own ops fail here
        ORIG.bgmv_shrink(x, zero_a, torch.zeros(7, 4), torch.tensor([0, 1, 0]), 1.0)
    with pytest.raises(RuntimeError, match="7 rows but 3 adapter indices"):  # real weights: no guessing
        lora_kernels.bgmv_shrink(x, torch.randn(3, 1, 4, 12, generator=G), out, torch.tensor([0, 1, 0]), 1.0)
    # one adapter for the whole batch: every row is that adapter's, as vLLM's ops broadcast it
    a = torch.randn(3, 4, 12, generator=G)
    got, want = torch.zeros(7, 4), torch.zeros(7, 4)
    lora_kernels.bgmv_shrink(x, a, got, torch.tensor([2]), 1.0)
    ORIG.bgmv_shrink(x, a, want, torch.tensor([2]), 1.0)
    torch.testing.assert_close(got, want)
