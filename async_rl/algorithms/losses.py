"""Loss aggregation, the clipped value (critic) loss and the entropy of token distributions.

``agg_loss`` is where per-token losses become the scalar the learner backpropagates, and it decides how tokens and
sequences are weighted (token-mean, token-sum, per-sequence means, Dr. GRPO's constant-normaliser sum). Because the
learner splits a mini-batch into micro-batches across ranks and accumulates gradients, ``agg_loss`` optionally
normalises by counts of the *whole* mini-batch so the accumulated gradient does not depend on how it was split.
Numerics follow verl 0.9.1.
"""

from __future__ import annotations

import torch

from async_rl.algorithms._checks import check_2d, check_choice, check_positive_count, check_same_shape, float_mask
from async_rl.algorithms.masking import masked_mean, masked_sum, safe_count

__all__ = ["LOSS_AGG_MODES", "agg_loss", "entropy_from_logits", "label_smoothed_nll", "sft_loss", "value_loss"]

LOSS_AGG_MODES: frozenset[str] = frozenset(
    {"token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"}
)
"""Accepted ``loss_agg_mode`` names (verl's)."""

Count = float | torch.Tensor


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    loss_scale_factor: float | None,
    global_num_tokens: Count | None = None,
    global_num_seqs: Count | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss ``loss_mat [B, T]`` over the valid positions of ``loss_mask [B, T]`` to a scalar.

    Notation: ``s_i = sum_t loss_it * m_it`` (row sum), ``n_i = sum_t m_it`` (row length), ``N = sum_i n_i`` and
    ``S = #{i : n_i > 0}`` (rows with at least one valid token; fully padded rows are not sequences). Without global
    counts (verl 0.9.1's numbers with ``dp_size=1``):

    - ``token-mean``: ``sum_i s_i / N`` (0 if no token is valid)
    - ``token-sum``: ``sum_i s_i``
    - ``seq-mean-token-sum``: ``sum_i s_i / S``
    - ``seq-mean-token-mean``: ``sum_{i: n_i > 0} (s_i / n_i) / S``
    - ``seq-mean-token-sum-norm`` (Dr. GRPO): ``sum_i s_i / S / loss_scale_factor``; ``loss_scale_factor`` None
      stands for the padded length ``T = loss_mask.shape[-1]`` (verl's default). Pass a constant (e.g. the maximum
      response length) so the normaliser does not change with the padding of each micro-batch.

    The three ``seq-mean`` modes return 0 when ``S = 0``. ``loss_scale_factor`` is read by
    ``seq-mean-token-sum-norm`` only.

    Global counts (for micro-batching): ``global_num_tokens`` = valid tokens of the whole mini-batch over all ranks,
    ``global_num_seqs`` = its number of non-empty sequences (the learner's ``mini_batch_counts``). When given they
    replace ``N`` and ``S`` above; ``token-sum`` is a plain sum and reads neither. Each mode only reads its own
    count; the other may be ``None``. Summing the micro-batch losses then equals the loss of the mini-batch taken as
    one batch (for ``seq-mean-token-sum-norm`` provided ``loss_scale_factor`` is given or every micro-batch is padded
    to the same T). Unlike verl's ``agg_loss`` this function never multiplies by the data-parallel size: gradients
    are *averaged* across ranks, and the learner multiplies each micro-batch loss by the world size itself.
    """
    check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    check_2d("loss_mat", loss_mat)
    check_same_shape("loss_mask", loss_mask, "loss_mat", loss_mat)
    check_positive_count("global_num_tokens", global_num_tokens)
    check_positive_count("global_num_seqs", global_num_seqs)
    check_positive_count("loss_scale_factor", loss_scale_factor)
    mask = float_mask(loss_mask, loss_mat)
    if loss_agg_mode == "token-mean":
        if global_num_tokens is None:
            return masked_mean(loss_mat, mask)
        return masked_sum(loss_mat, mask) / global_num_tokens
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, mask)
    seq_sums = masked_sum(loss_mat, mask, dim=-1)
    lengths = mask.sum(dim=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_sums = seq_sums / safe_count(lengths)  # an empty row contributes 0
    total = seq_sums.sum()
    if global_num_seqs is None:
        total = total / safe_count((lengths > 0).sum().to(total.dtype))
    else:
        total = total / global_num_seqs
    if loss_agg_mode == "seq-mean-token-sum-norm":
        total = total / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    return total


def sft_loss(token_nll: torch.Tensor, loss_mask: torch.Tensor, *, global_num_tokens: Count) -> torch.Tensor:
    """Supervised fine-tuning's loss: each demonstrated token's negative log-likelihood ``token_nll`` (``-log_probs``,
    or :func:`label_smoothed_nll`) where ``loss_mask`` is 1, summed and divided by ``global_num_tokens`` (the step's
    demonstrated tokens over every micro-batch and rank), i.e. ``token-mean`` under :func:`agg_loss`. Summed over
    micro-batches it is the batch's token mean."""
    return agg_loss(token_nll, loss_mask, "token-mean", loss_scale_factor=None, global_num_tokens=global_num_tokens)


def label_smoothed_nll(
    log_probs: torch.Tensor, label_logits: torch.Tensor, smooth_logit_mean: torch.Tensor, *, label_smoothing: float
) -> torch.Tensor:
    """Per-token cross-entropy against ``(1 - eps) * one_hot(label) + eps * uniform(S)`` with ``eps =
    label_smoothing``: ``(1 - eps) * (-log p_label) + eps * mean_{c in S}(-log p_c)``.

    All inputs are per token and in fp32: the label's log-prob, the label's logit ``z_label`` and the mean logit over
    the smoothing ids ``S`` (:func:`~async_rl.algorithms.masked_logit_mean`). Since ``log p_c = z_c - logsumexp(z)``
    and ``logsumexp(z) = z_label - log p_label``, the uniform term is ``z_label - log p_label - mean_S z``: no second
    softmax. Its gradient w.r.t. the logits is ``p - 1[S] / |S|``.
    """
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    nll = -log_probs
    if label_smoothing == 0.0:
        return nll
    uniform = (label_logits - log_probs) - smooth_logit_mean
    return (1.0 - label_smoothing) * nll + label_smoothing * uniform


def value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    cliprange_value: float,
    loss_agg_mode: str,
    loss_scale_factor: float | None,
    global_num_tokens: Count | None = None,
    global_num_seqs: Count | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped value loss; all inputs ``[B, T]``. Returns ``(loss, clipfrac)`` (both 0-d; clipfrac detached).

    ``vclip = clamp(vpreds, values - c, values + c)``; ``l1 = (vpreds - returns)^2``; ``l2 = (vclip - returns)^2``;
    ``loss = 0.5 * agg_loss(max(l1, l2))``; ``clipfrac = masked_mean(l2 > l1)``. ``values`` are the old predictions
    recorded at rollout time, ``c = cliprange_value``. ``global_num_tokens``, ``global_num_seqs`` and
    ``loss_scale_factor`` are passed to ``agg_loss`` unchanged (verl ``compute_value_loss`` with ``dp_size=1``).
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
        loss_scale_factor=loss_scale_factor,
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
