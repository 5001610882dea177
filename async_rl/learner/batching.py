"""Rollout groups in, padded training tensors out (pure: no torch.distributed, no model).

Actors deliver *groups*: one prompt with its ``n`` sampled responses, each with the behaviour-policy log-probs vLLM
reported, a scalar reward and the policy version that generated it. The learner needs verl's tensor layout:
prompts left-padded to ``P`` and responses right-padded to ``T`` so ``input_ids = [prompt | response]`` (``[B, P+T]``)
and the logits at positions ``P-1 .. P+T-2`` predict the response tokens. ``response_mask`` marks the tokens that
exist (it shapes the forward passes and never changes); ``loss_mask`` starts equal to it and is what the losses, the
advantages and every token or sequence count read: rows or tokens leave the update by being zeroed there (an
out-of-vocabulary group, rejection sampling, masked truncated responses). The reward sits on the last valid response
token of ``token_level_scores``. Rows keep the order of the groups (group-major), and ``index`` holds the dense group
id every group-based advantage estimator needs.

:func:`mask_out_of_vocab` is the last line of defence before the embedding: a group holding a token id outside the
vocabulary (the coordinator validates groups, but the learner must not crash if one slips through) is dropped from
the update, not from the batch, so the mini-batch split still holds.

Groups also travel between learner ranks (rank 0 pulls, every rank trains); :func:`encode_groups` /
:func:`decode_groups` turn them into msgpack bytes for :meth:`DistContext.broadcast_bytes` (never pickle).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
import torch

__all__ = [
    "GroupLike",
    "Response",
    "RolloutBatch",
    "RolloutGroup",
    "collate_groups",
    "decode_groups",
    "encode_groups",
    "mask_out_of_vocab",
    "mask_truncated",
    "to_rollout_groups",
]


class Response(msgspec.Struct, frozen=True):
    """One sampled response: its token ids, behaviour log-probs (one per token), scalar reward, policy version, and
    whether generation stopped at the length limit (``truncated``: the actor's finish reason was ``"length"``)."""

    token_ids: list[int]
    logprobs: list[float]
    reward: float
    version: int = 0
    truncated: bool = False


class RolloutGroup(msgspec.Struct, frozen=True):
    """One prompt and its ``n`` responses (the unit group-relative advantages are computed over)."""

    group_id: int | str
    prompt_ids: list[int]
    responses: list[Response]


class ResponseLike(Protocol):
    @property
    def token_ids(self) -> Sequence[int]: ...
    @property
    def logprobs(self) -> Sequence[float]: ...
    @property
    def reward(self) -> float: ...


class GroupLike(Protocol):
    """Anything shaped like :class:`RolloutGroup` (e.g. the transport's own message type); ``version`` is optional."""

    @property
    def group_id(self) -> Any: ...
    @property
    def prompt_ids(self) -> Sequence[int]: ...
    @property
    def responses(self) -> Sequence[Any]: ...


def to_rollout_groups(groups: Iterable[GroupLike]) -> list[RolloutGroup]:
    """Copy duck-typed groups into :class:`RolloutGroup` (plain lists; safe to encode and keep)."""
    out: list[RolloutGroup] = []
    for g in groups:
        if isinstance(g, RolloutGroup):
            out.append(g)
            continue
        responses = [
            Response(
                token_ids=[int(t) for t in r.token_ids],
                logprobs=[float(x) for x in r.logprobs],
                reward=float(r.reward),
                version=int(getattr(r, "version", 0)),
                truncated=bool(getattr(r, "truncated", False)),
            )
            for r in g.responses
        ]
        out.append(RolloutGroup(group_id=g.group_id, prompt_ids=[int(t) for t in g.prompt_ids], responses=responses))
    return out


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(list[RolloutGroup])


def encode_groups(groups: Sequence[RolloutGroup]) -> bytes:
    return _ENCODER.encode(list(groups))


def decode_groups(data: bytes) -> list[RolloutGroup]:
    return _DECODER.decode(data)


@dataclass
class RolloutBatch:
    """Named tensors sharing the leading batch dimension ``B`` (the learner's unit of work)."""

    tensors: dict[str, torch.Tensor]

    def __post_init__(self) -> None:
        sizes = {k: v.shape[0] for k, v in self.tensors.items()}
        assert len(set(sizes.values())) <= 1, f"batch tensors disagree on B: {sizes}"

    def __len__(self) -> int:
        return next(iter(self.tensors.values())).shape[0] if self.tensors else 0

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        if self.tensors and value.shape[0] != len(self):
            raise ValueError(f"tensor {key!r} has leading dim {value.shape[0]}, batch has {len(self)}")
        self.tensors[key] = value

    def __contains__(self, key: object) -> bool:
        return key in self.tensors

    def select(self, index: torch.Tensor | Sequence[int]) -> RolloutBatch:
        idx = torch.as_tensor(index, dtype=torch.long)
        return RolloutBatch({k: v.index_select(0, idx.to(v.device)) for k, v in self.tensors.items()})

    def to(self, device: torch.device) -> RolloutBatch:
        return RolloutBatch({k: v.to(device) for k, v in self.tensors.items()})

    @property
    def prompt_width(self) -> int:
        return int(self.tensors["input_ids"].shape[1] - self.tensors["responses"].shape[1])


def collate_groups(
    groups: Sequence[GroupLike],
    *,
    pad_token_id: int = 0,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
) -> RolloutBatch:
    """Pad a list of groups into the learner's tensor layout (see module docstring).

    Tensors: ``input_ids``/``attention_mask``/``position_ids`` ``[B, P+T]``; ``responses``/``response_mask``/
    ``loss_mask``/``rollout_log_probs``/``token_level_scores`` ``[B, T]``; ``index``/``prompt_lengths``/
    ``response_lengths``/``versions`` ``[B]``; ``truncated`` ``[B]`` bool (a response's optional ``truncated``,
    default False). ``P``/``T`` default to the longest prompt/response; a longer one raises ``ValueError``.
    """
    if not groups:
        raise ValueError("groups must not be empty")
    rows: list[tuple[int, Sequence[int], Any]] = []
    for gi, g in enumerate(groups):
        if not g.prompt_ids:
            raise ValueError(f"group {g.group_id!r} has an empty prompt_ids")
        if not g.responses:
            raise ValueError(f"group {g.group_id!r} has no responses")
        for r in g.responses:
            if len(r.token_ids) == 0:
                raise ValueError(f"group {g.group_id!r} has an empty response (token_ids=[])")
            if len(r.logprobs) != len(r.token_ids):
                raise ValueError(
                    f"group {g.group_id!r}: logprobs has {len(r.logprobs)} entries for {len(r.token_ids)} tokens"
                )
            rows.append((gi, g.prompt_ids, r))
    longest_p = max(len(p) for _, p, _ in rows)
    longest_t = max(len(r.token_ids) for _, _, r in rows)
    p_width = longest_p if max_prompt_length is None else max_prompt_length
    t_width = longest_t if max_response_length is None else max_response_length
    if longest_p > p_width:
        raise ValueError(f"a prompt has {longest_p} tokens > max_prompt_length={p_width}")
    if longest_t > t_width:
        raise ValueError(f"a response has {longest_t} tokens > max_response_length={t_width}")
    b = len(rows)
    prompts = torch.full((b, p_width), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((b, p_width), dtype=torch.long)
    responses = torch.full((b, t_width), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((b, t_width), dtype=torch.long)
    logprobs = torch.zeros((b, t_width), dtype=torch.float32)
    scores = torch.zeros((b, t_width), dtype=torch.float32)
    index = torch.empty(b, dtype=torch.long)
    versions = torch.empty(b, dtype=torch.long)
    truncated = torch.zeros(b, dtype=torch.bool)
    p_lens = torch.empty(b, dtype=torch.long)
    t_lens = torch.empty(b, dtype=torch.long)
    for i, (gi, prompt, r) in enumerate(rows):
        pl, tl = len(prompt), len(r.token_ids)
        prompts[i, p_width - pl :] = torch.as_tensor(list(prompt), dtype=torch.long)
        prompt_mask[i, p_width - pl :] = 1
        responses[i, :tl] = torch.as_tensor(list(r.token_ids), dtype=torch.long)
        response_mask[i, :tl] = 1
        logprobs[i, :tl] = torch.as_tensor(list(r.logprobs), dtype=torch.float32)
        scores[i, tl - 1] = float(r.reward)
        index[i], versions[i], p_lens[i], t_lens[i] = gi, int(getattr(r, "version", 0)), pl, tl
        truncated[i] = bool(getattr(r, "truncated", False))
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return RolloutBatch(
        {
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "responses": responses,
            "response_mask": response_mask,
            "loss_mask": response_mask.clone(),
            "rollout_log_probs": logprobs,
            "token_level_scores": scores,
            "index": index,
            "versions": versions,
            "truncated": truncated,
            "prompt_lengths": p_lens,
            "response_lengths": t_lens,
        }
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
    ids = batch["input_ids"]
    bad_ids = (ids < 0) | (ids >= vocab_size)
    bad_rows = bad_ids.any(dim=1)
    if not bool(bad_rows.any()):
        return []
    groups = torch.unique(batch["index"][bad_rows])
    rows = torch.isin(batch["index"], groups)
    ids.masked_fill_(bad_ids, pad_token_id)
    responses = batch["responses"]
    responses.masked_fill_((responses < 0) | (responses >= vocab_size), pad_token_id)
    batch["loss_mask"][rows] = 0
    batch["token_level_scores"][rows] = 0.0
    return [int(g) for g in groups.tolist()]


def mask_truncated(batch: RolloutBatch) -> int:
    """Take every truncated response (``truncated``: it hit the length limit) out of the update, in place: its row of
    ``loss_mask`` is zeroed, so it adds no policy/entropy/KL/value loss, no gradient and no token or sequence to any
    loss denominator. Run it after the advantages: the row still counts in its group's statistics. Returns the number
    of rows this took out (truncated rows that still had loss tokens)."""
    rows = batch["truncated"].bool()
    loss_mask = batch["loss_mask"]
    masked = int((rows & (loss_mask.sum(dim=-1) > 0)).sum())
    loss_mask[rows] = 0
    return masked
