"""Rollout groups in, padded training tensors out (pure: no torch.distributed, no model).

Actors deliver *groups* (:class:`~async_rl.transport.protocol.RolloutGroup`): one prompt's ``n`` sampled
completions, each with the behaviour-policy log-probs vLLM reported, a scalar reward and the policy versions that
generated it. The learner needs verl's tensor layout: prompts left-padded to ``P`` and responses right-padded to ``T``
so ``input_ids = [prompt | response]`` (``[B, P+T]``) and the logits at positions ``P-1 .. P+T-2`` predict the
response tokens. ``response_mask`` marks the tokens that exist (it shapes the forward passes and never changes);
``loss_mask`` starts as the tokens the model sampled (all of them, except the observation tokens of a multi-turn
episode: tool responses, template glue) and is what the losses, the advantages and every token or sequence count
read: rows or tokens leave the update by being zeroed there (an out-of-vocabulary group, rejection sampling, masked
truncated responses). The reward sits on the last valid response token of ``token_level_scores``. Rows keep the
order of the groups (group-major), and ``index`` holds the dense group id every group-based advantage estimator needs.

:class:`RolloutBatch` holds those tensors as named fields, and the ones the learner's step computes from them
(old/reference log-probs, values, advantages, ...) as optional fields it fills in.

:func:`mask_out_of_vocab` is the last line of defence before the embedding: a group holding a token id outside the
vocabulary (the coordinator validates groups, but the learner must not crash if one slips through) is dropped from
the update, not from the batch, so the mini-batch split still holds.

Every path into a batch goes through :func:`collate_rows` (rows of numpy views or sequences): :func:`collate_groups`
reads the groups' wire arrays directly, on learner rank 0 in a training run (the batch is then broadcast to the ranks
as tensors, :func:`async_rl.learner.dist.share_batch`) and in process for tests, probes and benchmarks, which build
their groups with :func:`local_group`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import numpy as np
import torch

from async_rl.transport.protocol import Completion, RolloutGroup, unpack_array

__all__ = [
    "LOCAL_ACTOR",
    "RolloutBatch",
    "Row",
    "collate_groups",
    "collate_rows",
    "local_group",
    "mask_out_of_vocab",
    "mask_truncated",
]

LOCAL_ACTOR = "in-process"  # the actor id of groups built in process (:func:`local_group`)


@dataclass(eq=False)
class RolloutBatch:
    """One step's rows, ``B`` responses group-major, padded to ``P`` prompt and ``T`` response positions.

    Collation fills the fields up to ``response_lengths`` (see :func:`collate_rows`); the learner's step fills the
    optional ones, each ``[B, T]``, and replaces ``loss_mask`` as rows or tokens leave the update."""

    input_ids: torch.Tensor  # [B, P+T] int64: left-padded prompt | right-padded response
    attention_mask: torch.Tensor  # [B, P+T] int64
    position_ids: torch.Tensor  # [B, P+T] int64: real tokens counted from 0
    responses: torch.Tensor  # [B, T] int64
    response_mask: torch.Tensor  # [B, T] int64: the response tokens that exist
    loss_mask: torch.Tensor  # [B, T] int64: the tokens the update trains on
    rollout_log_probs: torch.Tensor  # [B, T] float32: the behaviour policy's (the actor's)
    token_level_scores: torch.Tensor  # [B, T] float32: the reward, on the last response token
    index: torch.Tensor  # [B] int64: dense group id
    versions: torch.Tensor  # [B] int64: the oldest policy version that sampled the row
    truncated: torch.Tensor  # [B] bool: generation stopped at the length limit
    prompt_lengths: torch.Tensor  # [B] int64
    response_lengths: torch.Tensor  # [B] int64
    teacher_log_probs: torch.Tensor | None = None  # float32: the teacher's (on-policy distillation; 0 on padding)
    sampled_mask: torch.Tensor | None = None  # bool: the tokens the model sampled, before any left the update
    old_log_probs: torch.Tensor | None = None  # the proximal policy's (None: the pass was skipped)
    ref_log_probs: torch.Tensor | None = None  # the reference policy's (a KL term only)
    values: torch.Tensor | None = None  # the critic's (GAE only)
    token_level_rewards: torch.Tensor | None = None  # the scores minus the KL penalty in the reward, if any
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None  # the step's importance weights (decoupled rollout correction)

    def __post_init__(self) -> None:
        sizes = {k: v.shape[0] for k, v in self.tensors().items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"batch tensors disagree on B: {sizes}")

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def tensors(self) -> dict[str, torch.Tensor]:
        """The fields that are set, by name, in field order."""
        named = ((f.name, getattr(self, f.name)) for f in fields(self))
        return {name: value for name, value in named if value is not None}

    def select(self, index: torch.Tensor | Sequence[int]) -> RolloutBatch:
        """The rows ``index``, in that order."""
        idx = torch.as_tensor(index, dtype=torch.long)
        return RolloutBatch(**{k: v.index_select(0, idx.to(v.device)) for k, v in self.tensors().items()})

    @property
    def prompt_width(self) -> int:
        return int(self.input_ids.shape[1] - self.responses.shape[1])


class Row(NamedTuple):
    """One response row of a batch, as collation reads it: arrays are numpy views or plain sequences."""

    group: int  # dense group index (``index``)
    prompt_ids: Sequence[int] | np.ndarray
    token_ids: Sequence[int] | np.ndarray
    logprobs: Sequence[float] | np.ndarray
    reward: float
    version: int
    truncated: bool
    loss_mask: Sequence[int] | np.ndarray | None = None  # 1: sampled, 0: observation token; None: all sampled
    teacher_logprobs: Sequence[float] | np.ndarray | None = None  # on-policy distillation: the teacher's, per token


def local_group(prompt_id: int, completions: Sequence[Completion]) -> RolloutGroup:
    """A group built in process (tests, probes, benchmarks; completions from
    :func:`~async_rl.transport.protocol.make_completion`), as an actor delivers it: under lease 1 of actor
    :data:`LOCAL_ACTOR`. Its prompt's tokens go to :func:`collate_groups` beside it, keyed by ``prompt_id``."""
    return RolloutGroup(prompt_id=prompt_id, lease_id=1, actor_id=LOCAL_ACTOR, completions=list(completions))


def collate_groups(
    groups: Sequence[RolloutGroup],
    prompts: Mapping[int, Sequence[int] | np.ndarray],
    *,
    pad_token_id: int,
    max_prompt_length: int | None,
    max_response_length: int | None,
) -> RolloutBatch:
    """Groups -> the learner's padded batch (see :func:`collate_rows`), read from the wire arrays directly.

    ``prompts[prompt_id]``: a group's prompt tokens (the coordinator's records: the wire does not carry them back).
    Each row's version is its completion's oldest (``version_min``), it counts as truncated when its finish reason is
    ``"length"`` (for ``actor.mask_truncated_responses``), and a multi-turn completion's ``loss_mask`` (its sampled
    tokens) becomes the row's, so observation tokens stay out of the loss. A group without completions raises
    ``ValueError``."""
    if not groups:
        raise ValueError("groups must not be empty")
    rows = []
    for gi, g in enumerate(groups):
        if not g.completions:
            raise ValueError(f"group {g.prompt_id!r} has no completions")
        prompt = np.asarray(prompts[g.prompt_id], dtype=np.int64)
        for c in g.completions:
            tokens, logprobs = unpack_array(c.token_ids), unpack_array(c.logprobs)
            mask = None if c.loss_mask is None else unpack_array(c.loss_mask)
            teacher = None if c.teacher_logprobs is None else unpack_array(c.teacher_logprobs)
            truncated = c.finish_reason == "length"
            rows.append(Row(gi, prompt, tokens, logprobs, float(c.reward), c.version_min, truncated, mask, teacher))
    return collate_rows(
        rows,
        group_ids=[g.prompt_id for g in groups],
        pad_token_id=pad_token_id,
        max_prompt_length=max_prompt_length,
        max_response_length=max_response_length,
    )


def collate_rows(
    rows: Sequence[Row],
    *,
    group_ids: Sequence[Any] | None = None,
    max_prompt_length: int | None,
    max_response_length: int | None,
    pad_token_id: int = 0,
) -> RolloutBatch:
    """Pad response rows into the learner's tensor layout (see module docstring): the one collation every path uses.

    The batch's collated fields: ``input_ids``/``attention_mask``/``position_ids`` ``[B, P+T]``; ``responses``/
    ``response_mask``/``loss_mask``/``rollout_log_probs``/``token_level_scores`` ``[B, T]``; ``index``/
    ``prompt_lengths``/``response_lengths``/``versions`` ``[B]``; ``truncated`` ``[B]`` bool. ``loss_mask`` is a
    row's own mask where it has one (a multi-turn episode's sampled tokens), else its ``response_mask``.
    ``teacher_log_probs`` ``[B, T]`` when the rows carry the teacher's log-probs (all of them or none). ``P``/``T``
    are ``max_prompt_length``/``max_response_length`` (None: the longest prompt/response); a longer one raises
    ``ValueError``, as do empty prompts or responses, log-probs, a loss mask or teacher log-probs that do not match
    the tokens, and teacher log-probs on some rows only (``group_ids`` names the group in those errors).
    """
    if not rows:
        raise ValueError("rows must not be empty")

    def name(gi: int) -> Any:
        return group_ids[gi] if group_ids is not None else gi

    for row in rows:
        if len(row.prompt_ids) == 0:
            raise ValueError(f"group {name(row.group)!r} has an empty prompt_ids")
        if len(row.token_ids) == 0:
            raise ValueError(f"group {name(row.group)!r} has an empty response (token_ids=[])")
        if len(row.logprobs) != len(row.token_ids):
            raise ValueError(
                f"group {name(row.group)!r}: logprobs has {len(row.logprobs)} entries for {len(row.token_ids)} tokens"
            )
        if row.loss_mask is not None and len(row.loss_mask) != len(row.token_ids):
            raise ValueError(
                f"group {name(row.group)!r}: loss_mask has {len(row.loss_mask)} entries for {len(row.token_ids)} tokens"
            )
        if (row.teacher_logprobs is None) != (rows[0].teacher_logprobs is None):
            raise ValueError(f"group {name(row.group)!r}: teacher log-probs on some rows of the batch only")
        if row.teacher_logprobs is not None and len(row.teacher_logprobs) != len(row.token_ids):
            raise ValueError(
                f"group {name(row.group)!r}: teacher_logprobs has {len(row.teacher_logprobs)} entries for"
                f" {len(row.token_ids)} tokens"
            )
    longest_p = max(len(r.prompt_ids) for r in rows)
    longest_t = max(len(r.token_ids) for r in rows)
    p_width = longest_p if max_prompt_length is None else max_prompt_length
    t_width = longest_t if max_response_length is None else max_response_length
    if longest_p > p_width:
        raise ValueError(f"a prompt has {longest_p} tokens > max_prompt_length={p_width}")
    if longest_t > t_width:
        raise ValueError(f"a response has {longest_t} tokens > max_response_length={t_width}")
    b = len(rows)
    prompts = np.full((b, p_width), pad_token_id, dtype=np.int64)
    prompt_mask = np.zeros((b, p_width), dtype=np.int64)
    responses = np.full((b, t_width), pad_token_id, dtype=np.int64)
    response_mask = np.zeros((b, t_width), dtype=np.int64)
    loss_mask = np.zeros((b, t_width), dtype=np.int64)
    logprobs = np.zeros((b, t_width), dtype=np.float32)
    scores = np.zeros((b, t_width), dtype=np.float32)
    teacher = np.zeros((b, t_width), dtype=np.float32) if rows[0].teacher_logprobs is not None else None
    p_lens = np.fromiter((len(r.prompt_ids) for r in rows), dtype=np.int64, count=b)
    t_lens = np.fromiter((len(r.token_ids) for r in rows), dtype=np.int64, count=b)
    for i, r in enumerate(rows):
        pl, tl = int(p_lens[i]), int(t_lens[i])
        prompts[i, p_width - pl :] = r.prompt_ids
        prompt_mask[i, p_width - pl :] = 1
        responses[i, :tl] = r.token_ids
        response_mask[i, :tl] = 1
        loss_mask[i, :tl] = 1 if r.loss_mask is None else r.loss_mask
        logprobs[i, :tl] = r.logprobs
        if teacher is not None:
            teacher[i, :tl] = r.teacher_logprobs
        scores[i, tl - 1] = r.reward
    attention_mask = torch.from_numpy(np.concatenate([prompt_mask, response_mask], axis=1))
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return RolloutBatch(
        input_ids=torch.from_numpy(np.concatenate([prompts, responses], axis=1)),
        attention_mask=attention_mask,
        position_ids=position_ids,
        responses=torch.from_numpy(responses),
        response_mask=torch.from_numpy(response_mask),
        loss_mask=torch.from_numpy(loss_mask),
        rollout_log_probs=torch.from_numpy(logprobs),
        token_level_scores=torch.from_numpy(scores),
        index=torch.tensor([r.group for r in rows], dtype=torch.long),
        versions=torch.tensor([r.version for r in rows], dtype=torch.long),
        truncated=torch.tensor([r.truncated for r in rows], dtype=torch.bool),
        prompt_lengths=torch.from_numpy(p_lens),
        response_lengths=torch.from_numpy(t_lens),
        teacher_log_probs=None if teacher is None else torch.from_numpy(teacher),
    )


def mask_out_of_vocab(batch: RolloutBatch, vocab_size: int, pad_token_id: int = 0) -> list[int]:
    """Drop every group holding a token id outside ``[0, vocab_size)`` from the update, in place; returns their dense
    group ids (``index``), ``[]`` in the normal case (one vectorized check over ``input_ids`` ``[B, P+T]``).

    Such ids would crash the embedding lookup. The groups' rows stay in the batch (it must still split into whole
    mini-batches) but become inert: bad ids are replaced by ``pad_token_id``, ``loss_mask`` and
    ``token_level_scores`` are zeroed, so they add no loss, no gradient and no token or sequence to any count.
    """
    if not 0 <= pad_token_id < vocab_size:
        raise ValueError(f"pad_token_id={pad_token_id} is outside the vocabulary [0, {vocab_size})")
    ids = batch.input_ids
    bad_ids = (ids < 0) | (ids >= vocab_size)
    bad_rows = bad_ids.any(dim=1)
    if not bool(bad_rows.any()):
        return []
    groups = torch.unique(batch.index[bad_rows])
    rows = torch.isin(batch.index, groups)
    ids.masked_fill_(bad_ids, pad_token_id)
    responses = batch.responses
    responses.masked_fill_((responses < 0) | (responses >= vocab_size), pad_token_id)
    batch.loss_mask[rows] = 0
    batch.token_level_scores[rows] = 0.0
    return [int(g) for g in groups.tolist()]


def mask_truncated(batch: RolloutBatch) -> int:
    """Take every truncated response (``truncated``: it hit the length limit) out of the update, in place: its row of
    ``loss_mask`` is zeroed, so it adds no policy/entropy/KL/value loss, no gradient and no token or sequence to any
    loss denominator. Run it after the advantages: the row still counts in its group's statistics. Returns the number
    of rows this took out (truncated rows that still had loss tokens)."""
    rows = batch.truncated.bool()
    loss_mask = batch.loss_mask
    masked = int((rows & (loss_mask.sum(dim=-1) > 0)).sum())
    loss_mask[rows] = 0
    return masked
