"""Loss aggregation, the clipped value (critic) loss and the entropy of token distributions.

``agg_loss`` is where per-token losses become the scalar the learner backpropagates, and it decides how tokens and
sequences are weighted (token-mean, per-sequence means, Dr. GRPO's constant-normaliser sum). Because the learner splits
a mini-batch into micro-batches across ranks and accumulates gradients, ``agg_loss`` optionally normalises by counts of
the *whole* mini-batch so the accumulated gradient does not depend on how it was split. Numerics follow verl.
"""

from __future__ import annotations

import torch

from async_rl.algorithms._checks import check_2d, check_choice, check_positive_count, check_same_shape, float_mask
from async_rl.algorithms.masking import masked_mean, masked_sum, safe_count

__all__ = ["LOSS_AGG_MODES", "agg_loss", "entropy_from_logits", "value_loss"]

LOSS_AGG_MODES: frozenset[str] = frozenset(
    {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"}
)
"""Accepted ``loss_agg_mode`` names (verl's)."""

Count = float | torch.Tensor


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    global_num_tokens: Count | None = None,
    global_num_seqs: Count | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss ``loss_mat [B, T]`` over the valid positions of ``loss_mask [B, T]`` to a scalar.

    Without global counts (verl's numbers), with ``s_i = sum_t loss_it * m_it`` and ``n_i = sum_t m_it``:

    - ``token-mean``: ``sum_i s_i / sum_i n_i`` (0 if no token is valid)
    - ``seq-mean-token-sum``: ``mean_i s_i`` (over all B rows, including fully padded ones)
    - ``seq-mean-token-mean``: ``mean_i (s_i / n_i)`` (a row with ``n_i = 0`` contributes 0 instead of NaN)
    - ``seq-mean-token-sum-norm`` (Dr. GRPO): ``sum_i s_i / T`` with ``T = loss_mask.shape[-1]`` -- a *sum* over rows
      divided by the padded length, not a mean.

    Global counts (for micro-batching): ``global_num_tokens`` = valid tokens in the whole mini-batch over all ranks,
    ``global_num_seqs`` = its number of rows. When given they replace the local denominators:
    ``token-mean`` -> ``sum_i s_i / global_num_tokens``; ``seq-mean-token-sum`` -> ``sum_i s_i / global_num_seqs``;
    ``seq-mean-token-mean`` -> ``sum_i (s_i / n_i) / global_num_seqs``. ``seq-mean-token-sum-norm`` is already additive
    over rows and ignores both counts; it is split-invariant only if every micro-batch is padded to the same T (pad
    to the maximum response length). Each mode only reads its own count; the other may be ``None``. Summing the
    micro-batch losses then equals the full mini-batch loss. Under data parallelism, gradients are *averaged* across
    ranks, so the learner must multiply by the world size to get the sum (or pre-divide the counts accordingly).
    """
    check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    check_2d("loss_mat", loss_mat)
    check_same_shape("loss_mask", loss_mask, "loss_mat", loss_mat)
    check_positive_count("global_num_tokens", global_num_tokens)
    check_positive_count("global_num_seqs", global_num_seqs)
    mask = float_mask(loss_mask, loss_mat)
    if loss_agg_mode == "token-mean":
        if global_num_tokens is None:
            return masked_mean(loss_mat, mask)
        return masked_sum(loss_mat, mask) / global_num_tokens
    seq_sums = masked_sum(loss_mat, mask, dim=-1)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return seq_sums.sum() / loss_mask.shape[-1]
    if loss_agg_mode == "seq-mean-token-mean":
        per_seq = seq_sums / safe_count(mask.sum(dim=-1))
    else:
        per_seq = seq_sums
    if global_num_seqs is None:
        return per_seq.mean()
    return per_seq.sum() / global_num_seqs


def value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    *,
    global_num_tokens: Count | None = None,
    global_num_seqs: Count | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped value loss; all inputs ``[B, T]``. Returns ``(loss, clipfrac)`` (both 0-d; clipfrac detached).

    ``vclip = clamp(vpreds, values - c, values + c)``; ``l1 = (vpreds - returns)^2``; ``l2 = (vclip - returns)^2``;
    ``loss = 0.5 * agg_loss(max(l1, l2))``; ``clipfrac = masked_mean(l2 > l1)``. ``values`` are the old predictions
    recorded at rollout time, ``c = cliprange_value``.
    """
    check_2d("vpreds", vpreds)
    check_same_shape("returns", returns, "vpreds", vpreds)
    check_same_shape("values", values, "vpreds", vpreds)
    check_same_shape("response_mask", response_mask, "vpreds", vpreds)
    if isinstance(cliprange_value, bool) or not isinstance(cliprange_value, (int, float)) or not cliprange_value >= 0:
        raise ValueError(f"cliprange_value must be a number >= 0, got {cliprange_value!r}")
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    losses1 = (vpreds - returns) ** 2
    losses2 = (vpred_clipped - returns) ** 2
    clipped = torch.max(losses1, losses2)
    loss = 0.5 * agg_loss(
        clipped,
        response_mask,
        loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
    )
    clipfrac = masked_mean(torch.gt(losses2, losses1).to(vpreds.dtype), response_mask).detach()
    return loss, clipfrac


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` over the last (vocabulary) dim: ``[B, T, V] -> [B, T]``.

    Computed as ``logsumexp(z) - sum(softmax(z) * z)`` with ``z = logits - max(logits)`` (entropy is shift-invariant):
    the shift keeps both terms in ``[.., log V]`` so large logits (e.g. 5e4 in float32) do not cancel catastrophically,
    at the cost of one extra ``[B, T, V]`` temporary (chunk over T for huge vocabularies). Logits must be finite.
    Any leading shape is accepted (e.g. packed ``[N, V] -> [N]``); ndim must be >= 2.
    """
    if not isinstance(logits, torch.Tensor) or logits.ndim < 2:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must have shape [B, T, V] (at least 2-D), got {shape}")
    shifted = logits - logits.amax(dim=-1, keepdim=True).detach()
    probs = torch.softmax(shifted, dim=-1)
    return torch.logsumexp(shifted, dim=-1) - torch.sum(probs * shifted, dim=-1)
