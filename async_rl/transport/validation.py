"""Checks a delivered rollout group against the grant it answers, and quarantines actors that keep failing them.

The codec (codec.py) guarantees a group is well-formed msgpack of the right shape; it cannot know what the group must
hold to be trainable. `check_group` does, before the coordinator accepts a group: exactly the grant's ``n``
completions; each response non-empty (the learner cannot train an empty one) and at most ``max_tokens`` long; every
token id in ``[0, vocab_size)`` (the learner's embedding rows: one id past them crashes the embedding); one finite
behaviour log-prob ``<= 0`` per token (``LOGPROB_EPS`` allows float error); versions ordered, no older than the
grant's ``min_version`` and no newer than the policy the learner has published; with group filtering on a reward
component (transport.filtering), every completion carries that component. It returns None or one short reason
(`INVALID_REASONS`, a metrics key: ``transport/drops/invalid_<reason>``) and never raises on what a peer sent.

A multi-turn completion (it carries ``loss_mask`` or ``turns``, see ``protocol.Completion``) is one episode of
sampled and observation tokens: its total length is bounded by ``max_response_length`` (the learner's padded
response width) instead, and each turn by ``max_tokens``. Its ``loss_mask`` has one 0/1 entry per token, at least
one 1, and a 1 on the last token (the reward sits there: it must be a token the model sampled); else
``bad_loss_mask``. Its ``turns``, when given, are non-empty, in range, in order without overlap, cover exactly the
mask's 1s (every token when there is no mask), and the completion's versions are the min/max of theirs; else
``bad_turns``.

`Quarantine` counts invalid groups per sender; the ``max_invalid``-th one quarantines it for the coordinator's
lifetime (it gets no more grants and its groups are refused). Pure logic: no sockets, threads or clocks.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

from async_rl.transport.protocol import (
    FLOAT_DTYPES,
    MASK_DTYPES,
    TOKEN_DTYPES,
    Completion,
    GroupSampling,
    RolloutGroup,
    WireArray,
)

InvalidReason = Literal[
    "malformed",
    "wrong_completion_count",
    "bad_version",
    "empty_response",
    "response_too_long",
    "token_out_of_vocab",
    "bad_logprobs",
    "bad_loss_mask",
    "bad_turns",
    "missing_filter_metric",
    "bad_teacher_logprobs",
]
INVALID_REASONS: tuple[InvalidReason, ...] = get_args(InvalidReason)
LOGPROB_EPS = 1e-4  # a log-prob may exceed 0 by this much (float rounding of a probability of 1)


def check_group(
    group: RolloutGroup,
    sampling: GroupSampling,
    *,
    policy_version: int | None,
    max_response_length: int,
    min_version: int | None = None,
    vocab_size: int | None = None,
    required_component: str | None = None,
    teacher_required: bool = False,
) -> InvalidReason | None:
    """Why ``group`` cannot be trained (None: it can), judged against the grant's ``sampling`` (``n``, ``max_tokens``)
    and ``min_version``, the newest published ``policy_version``, the learner's ``vocab_size`` and the reward
    component group filtering reads (``required_component``); each of the last four is not checked when None.
    ``max_response_length`` bounds a multi-turn completion's total length (the learner's
    ``data.max_response_length``). ``teacher_required`` (a distillation run's training groups): every completion
    carries one finite teacher log-prob ``<= 0`` per token; teacher log-probs are checked the same way wherever they
    are sent."""
    if len(group.completions) != sampling.n:
        return "wrong_completion_count"
    for c in group.completions:
        if c.version_min > c.version_max or (policy_version is not None and c.version_max > policy_version):
            return "bad_version"
        if min_version is not None and c.version_min < min_version:
            return "bad_version"
        tokens = _as_array(c.token_ids, TOKEN_DTYPES)
        logprobs = _as_array(c.logprobs, FLOAT_DTYPES)
        mask = None if c.loss_mask is None else _as_array(c.loss_mask, MASK_DTYPES)
        if tokens is None or logprobs is None or (c.loss_mask is not None and mask is None):
            return "malformed"
        if tokens.shape[0] == 0:
            return "empty_response"
        multi_turn = c.loss_mask is not None or c.turns is not None
        if tokens.shape[0] > (max_response_length if multi_turn else sampling.max_tokens):
            return "response_too_long"
        if c.turns is not None and any(t.length > sampling.max_tokens for t in c.turns):
            return "response_too_long"
        if int(tokens.min()) < 0 or (vocab_size is not None and int(tokens.max()) >= vocab_size):
            return "token_out_of_vocab"
        if logprobs.shape[0] != tokens.shape[0] or not _logprobs_ok(logprobs):
            return "bad_logprobs"
        if mask is not None and not _loss_mask_ok(mask, tokens.shape[0]):
            return "bad_loss_mask"
        if c.turns is not None and not _turns_ok(c, mask, tokens.shape[0]):
            return "bad_turns"
        if c.teacher_logprobs is None:
            if teacher_required:
                return "bad_teacher_logprobs"
        else:
            teacher = _as_array(c.teacher_logprobs, FLOAT_DTYPES)
            if teacher is None or teacher.shape[0] != tokens.shape[0] or not _logprobs_ok(teacher):
                return "bad_teacher_logprobs"
    if required_component is not None and any(
        required_component not in (c.reward_components or {}) for c in group.completions
    ):
        return "missing_filter_metric"
    return None


def _as_array(wire: WireArray, dtypes: frozenset[str]) -> np.ndarray | None:
    """The wire array as numpy, or None when its dtype is not allowed or its bytes do not match its length."""
    if wire.dtype not in dtypes or wire.length < 0:
        return None
    dtype = np.dtype(wire.dtype)
    try:
        if len(wire.data) != wire.length * dtype.itemsize:
            return None
        return np.frombuffer(wire.data, dtype=dtype, count=wire.length)
    except (TypeError, ValueError):  # data that is not a buffer (a group built in Python, not decoded)
        return None


def _logprobs_ok(logprobs: np.ndarray) -> bool:
    # NaN fails both comparisons, +inf the second; -inf (a token sampled with probability 0) the isfinite check.
    return bool(np.isfinite(logprobs).all() and (logprobs <= LOGPROB_EPS).all())


def _loss_mask_ok(mask: np.ndarray, num_tokens: int) -> bool:
    # one 0/1 entry per token, and the last token (which holds the reward) sampled, so at least one 1
    return mask.shape[0] == num_tokens and bool((mask <= 1).all()) and int(mask[-1]) == 1


def _turns_ok(c: Completion, mask: np.ndarray | None, num_tokens: int) -> bool:
    """The turns are non-empty, in range, ordered without overlap, exactly the mask's 1s (every token without a
    mask), and span the completion's versions."""
    turns = c.turns
    if not turns:
        return False
    end = 0
    for t in turns:
        if t.length == 0 or t.start < end or t.start + t.length > num_tokens or t.version_min > t.version_max:
            return False
        if mask is not None and not bool(mask[t.start : t.start + t.length].all()):
            return False
        end = t.start + t.length
    covered = sum(t.length for t in turns)  # disjoint spans inside the 1s: equal counts mean equal sets
    if covered != (num_tokens if mask is None else int(np.count_nonzero(mask))):
        return False
    return c.version_min == min(t.version_min for t in turns) and c.version_max == max(t.version_max for t in turns)


class Quarantine:
    """Invalid groups per sender; a sender reaching ``max_invalid`` of them is quarantined for good."""

    def __init__(self, max_invalid: int) -> None:
        if isinstance(max_invalid, bool) or not isinstance(max_invalid, int) or max_invalid < 1:
            raise ValueError(f"max_invalid must be an int >= 1, got {max_invalid!r}")
        self.max_invalid = max_invalid
        self.invalid: dict[str, int] = {}
        self.quarantined: set[str] = set()

    def __contains__(self, actor_id: object) -> bool:
        return actor_id in self.quarantined

    def __len__(self) -> int:
        return len(self.quarantined)

    def record(self, actor_id: str) -> bool:
        """Count one invalid group from ``actor_id``; True exactly when this one quarantines it."""
        if actor_id in self.quarantined:
            return False
        count = self.invalid.get(actor_id, 0) + 1
        self.invalid[actor_id] = count
        if count < self.max_invalid:
            return False
        self.quarantined.add(actor_id)
        return True


__all__ = ["INVALID_REASONS", "LOGPROB_EPS", "InvalidReason", "Quarantine", "check_group"]
