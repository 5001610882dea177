"""The reward server's two messages (msgspec over msgpack, never pickle) and their decoder.

An actor sends one :class:`ScoreRequest` per rollout group: the prompt's token ids once and each completion's token
ids. The server answers with a :class:`ScoreReply` carrying the same ``request_id`` and one score per completion, or
an ``error`` naming what it could not score. Decoding refuses anything else (unknown fields, wrong types, frames over
the size limit).
"""

from __future__ import annotations

import msgspec


class ScoreRequest(msgspec.Struct, tag="score_request", forbid_unknown_fields=True, kw_only=True):
    request_id: str
    prompt_ids: list[int]
    response_ids: list[list[int]]


class ScoreReply(msgspec.Struct, tag="score_reply", forbid_unknown_fields=True, kw_only=True):
    request_id: str
    scores: list[float] = []
    error: str | None = None


RewardMessage = ScoreRequest | ScoreReply

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(RewardMessage)


def encode(msg: RewardMessage) -> bytes:
    return _ENCODER.encode(msg)


def decode(buf: bytes, max_bytes: int) -> RewardMessage:
    """One message; ``ValueError`` for an oversized or malformed frame."""
    if len(buf) > max_bytes:
        raise ValueError(f"reward message of {len(buf)} bytes is over the limit of {max_bytes}")
    try:
        return _DECODER.decode(buf)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"malformed reward message: {exc}") from None


__all__ = ["RewardMessage", "ScoreReply", "ScoreRequest", "decode", "encode"]
