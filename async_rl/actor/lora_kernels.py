"""Grouped LoRA kernels for vLLM's CPU backend: the same results as vLLM 0.32's torch ops, far less memory traffic.

vLLM's CPU LoRA path (``vllm/lora/ops/torch_ops/lora_ops.py``, used by ``punica_cpu.py``) computes each token's
low-rank product by first gathering that token's adapter weights, ``lora_weights[indices]``: a copy of an
``[out, rank]`` matrix per token and per projection. On SmolLM2-135M with rank 16 that is hundreds of MB of copies
per layer for one prefill of 128 prompts, and a validation round of 200 prompts that takes ~80 s without LoRA took
8 minutes with it (measured here, 2026-12-02). A batch holds tokens of at most ``max_loras`` adapters, so these
versions group the tokens by adapter index and run one matmul per group: identical results (the same index rules,
including vLLM's ``-1`` for "no adapter", which selects the last slot as the original does), no per-token copies.
One difference: a prompt-log-probs request batched with others makes vLLM's own ops fail in the logits layer (rows
per prompt token, indices per request); here that layer, which carries no adapter weights, computes (zero) anyway.

:func:`install` replaces the six functions in vLLM's modules; the weight-sync worker extension calls it in vLLM's
worker process on CPU (``actor/vllm_ext.py``). On GPUs vLLM uses its Triton kernels and nothing is replaced.
"""

from __future__ import annotations

import torch

__all__ = [
    "bgmv_expand",
    "bgmv_expand_slice",
    "bgmv_shrink",
    "install",
    "sgmv_expand",
    "sgmv_expand_slice",
    "sgmv_shrink",
]


def _grouped(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``out[t] = weights[indices[t]] @ inputs[t]`` for every token ``t``, one matmul per distinct index.

    ``weights`` is ``[slots, out, in]`` (or ``[slots, 1, out, in]``); the result is ``[tokens, out]`` in ``dtype``."""
    if weights.dim() == 4:
        weights = weights.squeeze(1)
    inputs = inputs.to(dtype)
    tokens = indices.shape[0]
    unique = torch.unique(indices)
    if unique.numel() == 1:  # the common case: one adapter for the whole batch
        return inputs @ weights[int(unique)].to(dtype).T
    if tokens != inputs.shape[0]:
        # vLLM's prompt log-probs pass the logits layer every prompt token's hidden state with indices per request
        # (its own ops then fail on a mixed batch). That layer has no adapter weights here (LoRA never targets the
        # output layer): zero weights give zero whatever the mapping, so the product is known.
        if not bool(weights[unique].any()):
            return inputs.new_zeros((inputs.shape[0], weights.shape[1]))
        raise RuntimeError(
            f"LoRA kernel: {inputs.shape[0]} rows but {tokens} adapter indices over {unique.numel()} adapters"
        )
    out = inputs.new_empty((tokens, weights.shape[1]))
    for idx in unique.tolist():
        rows = (indices == idx).nonzero(as_tuple=True)[0]
        out[rows] = inputs[rows] @ weights[idx].to(dtype).T
    return out


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    outputs = _grouped(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common = min(outputs.shape[1], output_tensor.shape[1])  # adapter and model may pad their outputs differently
    if add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    outputs = _grouped(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    outputs = _grouped(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


def sgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    add_inputs: bool = False,
) -> None:
    indices = torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)
    bgmv_expand(inputs, lora_b_weights, output_tensor, indices, add_inputs)


def sgmv_shrink(
    inputs: torch.Tensor,
    lora_a_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    scaling: float,
) -> None:
    indices = torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)
    bgmv_shrink(inputs, lora_a_weights, output_tensor, indices, scaling)


def sgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = False,
) -> None:
    indices = torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)
    bgmv_expand_slice(inputs, lora_b_weights, output_tensor, indices, slice_offset, slice_size, add_inputs)


_NAMES = ("bgmv_expand", "bgmv_expand_slice", "bgmv_shrink", "sgmv_expand", "sgmv_expand_slice", "sgmv_shrink")


def install() -> bool:
    """Put these kernels in place of vLLM's CPU LoRA torch ops (idempotent). False when vLLM's modules are absent."""
    try:
        from vllm.lora.ops.torch_ops import lora_ops
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError:
        return False
    for name in _NAMES:
        fn = globals()[name]
        setattr(lora_ops, name, fn)
        setattr(punica_cpu, name, fn)
    return True
