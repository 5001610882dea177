"""Encoding and strict, total decoding of wire messages.

`WireCodec.decode` either returns a fully validated message or raises `ProtocolError` whose ``reason`` is one short
word (used as a metrics key): nothing a peer sends can make it raise anything else. Checks, in order: msgpack
well-formedness, no extension types, the tagged kind, field types (msgspec strict mode, unknown fields forbidden),
the protocol version, then semantics msgspec cannot express (array byte lengths, dtype allowlists, size caps,
version ranges, finite numbers).

`WireCodec.encode_checked` refuses to produce a message larger than the receiver's cap. This matters because zmq
enforces MAXMSGSIZE by silently dropping the connection: the sender is the only side that can report it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NoReturn

import msgspec
import numpy as np

from async_rl.transport.protocol import (
    ALLOWED_DTYPES,
    FLOAT_DTYPES,
    MASK_DTYPES,
    PROTOCOL_VERSION,
    TOKEN_DTYPES,
    AnyMessage,
    GroupAck,
    PromptGrant,
    RolloutGroup,
    Welcome,
    WireArray,
    WorkGrant,
)

DECODE_ERROR_REASONS: tuple[str, ...] = (
    "malformed",
    "ext",
    "kind",
    "schema",
    "version",
    "dtype",
    "array_length",
    "cap",
    "value",
)


_ITEMSIZE: dict[str, int] = {d: np.dtype(d).itemsize for d in ALLOWED_DTYPES}


class ProtocolError(ValueError):
    """A received message failed validation; ``reason`` is one of DECODE_ERROR_REASONS (or a transport-level one)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class MessageTooLarge(ValueError):
    """An outgoing message exceeds the receiver's max_message_bytes; zmq would drop the connection silently."""

    def __init__(self, size: int, limit: int, kind: str) -> None:
        super().__init__(
            f"{kind} message is {size} bytes, over max_message_bytes={limit}; the receiver's zmq MAXMSGSIZE "
            "would silently disconnect (raise max_message_bytes or send smaller groups)"
        )
        self.size = size
        self.limit = limit


@dataclass(frozen=True)
class WireLimits:
    """Caps applied on decode, beyond the overall message size (which zmq MAXMSGSIZE bounds)."""

    max_array_length: int = 1 << 20
    max_completions: int = 1024
    max_prompts_per_grant: int = 4096

    def __post_init__(self) -> None:
        for name in ("max_array_length", "max_completions", "max_prompts_per_grant"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")


class _VersionPeek(msgspec.Struct):
    """Lenient view used only to tell 'wrong protocol version' apart from other schema errors."""

    protocol: int = PROTOCOL_VERSION


def _reject_ext(code: int, data: memoryview) -> NoReturn:
    raise ProtocolError("ext", f"msgpack extension type {code} is not allowed")


class WireCodec:
    """Encoder/decoder pair for AnyMessage with validation. Not thread-safe only in the trivial sense: msgspec
    encoders/decoders are reentrant, so one instance may be shared."""

    def __init__(self, limits: WireLimits | None = None) -> None:
        self.limits = limits or WireLimits()
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(AnyMessage, strict=True, ext_hook=_reject_ext)  # type: ignore[arg-type]
        self._peek = msgspec.msgpack.Decoder(_VersionPeek, ext_hook=_reject_ext)

    def encode(self, msg: msgspec.Struct) -> bytes:
        return self._encoder.encode(msg)

    def encode_checked(self, msg: msgspec.Struct, max_bytes: int) -> bytes:
        """Encode and raise MessageTooLarge if the result would exceed ``max_bytes``."""
        buf = self._encoder.encode(msg)
        if len(buf) > max_bytes:
            raise MessageTooLarge(len(buf), max_bytes, type(msg).__name__)
        return buf

    def decode(self, buf: bytes | memoryview) -> AnyMessage:
        """Decode and validate one message; raises only ProtocolError."""
        try:
            msg = self._decoder.decode(buf)
        except ProtocolError:
            raise
        except msgspec.ValidationError as exc:
            raise ProtocolError(self._classify(buf, str(exc)), str(exc)) from None
        except msgspec.DecodeError as exc:
            raise ProtocolError("malformed", str(exc)) from None
        except Exception as exc:  # RecursionError on absurd nesting, MemoryError, ...: still just a bad message
            raise ProtocolError("malformed", f"{type(exc).__name__}: {exc}") from None
        if msg.protocol != PROTOCOL_VERSION:
            raise ProtocolError("version", f"protocol {msg.protocol} != {PROTOCOL_VERSION}")
        self._validate(msg)
        return msg

    def _classify(self, buf: bytes | memoryview, detail: str) -> str:
        try:
            peek = self._peek.decode(buf)
        except Exception:
            peek = None
        if peek is not None and peek.protocol != PROTOCOL_VERSION:
            return "version"
        if "got `ext`" in detail:
            return "ext"
        if "`$.kind`" in detail or "missing required field `kind`" in detail:
            return "kind"
        return "schema"

    def _validate(self, msg: AnyMessage) -> None:
        if isinstance(msg, RolloutGroup):
            self._validate_group(msg)
        elif isinstance(msg, WorkGrant):
            if len(msg.prompts) > self.limits.max_prompts_per_grant:
                raise ProtocolError("cap", f"{len(msg.prompts)} prompts > {self.limits.max_prompts_per_grant}")
            for prompt in msg.prompts:
                self._validate_prompt(prompt)
        elif isinstance(msg, GroupAck):
            if len(msg.acks) > self.limits.max_prompts_per_grant:
                raise ProtocolError("cap", f"{len(msg.acks)} acks > {self.limits.max_prompts_per_grant}")
        elif isinstance(msg, Welcome):
            for name in ("heartbeat_interval_s", "peer_timeout_s", "lease_timeout_s"):
                value = getattr(msg, name)
                if not math.isfinite(value) or value <= 0:
                    raise ProtocolError("value", f"{name}={value!r} must be finite and > 0")
        _check_finite(msg.ts, "ts")

    def _validate_prompt(self, prompt: PromptGrant) -> None:
        self._check_array(prompt.prompt_token_ids, TOKEN_DTYPES, "prompt_token_ids")
        _check_finite(prompt.sampling.temperature, "sampling.temperature")
        _check_finite(prompt.sampling.top_p, "sampling.top_p")

    def _validate_group(self, group: RolloutGroup) -> None:
        # Hot path (every rollout group): no string formatting unless something is wrong.
        count = len(group.completions)
        if count == 0:
            raise ProtocolError("value", "a rollout group needs at least one completion")
        if count > self.limits.max_completions:
            raise ProtocolError("cap", f"{count} completions > {self.limits.max_completions}")
        for i, c in enumerate(group.completions):
            self._check_array(c.token_ids, TOKEN_DTYPES, "completions[%d].token_ids", i)
            self._check_array(c.logprobs, FLOAT_DTYPES, "completions[%d].logprobs", i)
            if c.token_ids.length != c.logprobs.length:
                raise ProtocolError(
                    "array_length", f"completions[{i}]: {c.logprobs.length} logprobs for {c.token_ids.length} tokens"
                )
            if c.version_min > c.version_max:
                raise ProtocolError("value", f"completions[{i}]: version_min {c.version_min} > {c.version_max}")
            _check_finite(c.reward, "completions[%d].reward", i)
            if c.loss_mask is not None:
                self._check_array(c.loss_mask, MASK_DTYPES, "completions[%d].loss_mask", i)
                if c.loss_mask.length != c.token_ids.length:
                    raise ProtocolError(
                        "array_length",
                        f"completions[{i}]: {c.loss_mask.length} loss_mask entries for {c.token_ids.length} tokens",
                    )
            if c.turns is not None:
                if len(c.turns) > self.limits.max_array_length:
                    raise ProtocolError(
                        "cap", f"completions[{i}]: {len(c.turns)} turns > {self.limits.max_array_length}"
                    )
                for j, turn in enumerate(c.turns):
                    _check_finite(turn.reward, "completions[%d].turns[%d].reward", i, j)
            if c.reward_components:
                for key, value in c.reward_components.items():
                    _check_finite(value, "completions[%d].reward_components[%r]", i, key)
        for key, value in group.timings.items():
            _check_finite(value, "timings[%r]", key)

    def _check_array(self, arr: WireArray, dtypes: frozenset[str], name: str, *name_args: object) -> None:
        """``name % name_args`` names the array in errors (formatted only on failure)."""
        if arr.dtype not in dtypes:
            raise ProtocolError("dtype", f"{name % name_args}: dtype {arr.dtype!r} not in {sorted(dtypes)}")
        if arr.length > self.limits.max_array_length:
            raise ProtocolError("cap", f"{name % name_args}: length {arr.length} > {self.limits.max_array_length}")
        expected = arr.length * _ITEMSIZE[arr.dtype]
        if len(arr.data) != expected:
            raise ProtocolError(
                "array_length", f"{name % name_args}: {len(arr.data)} bytes, declared {arr.length} -> {expected}"
            )


def _check_finite(value: float, name: str, *name_args: object) -> None:
    if not math.isfinite(value):
        raise ProtocolError("value", f"{name % name_args}={value!r} is not finite")


def encode_plain(obj: Any) -> bytes:
    """msgpack-encode plain data (dicts, lists, numbers, str, bytes) — used for ledger state."""
    return msgspec.msgpack.encode(obj)


def decode_plain(buf: bytes) -> Any:
    """Decode plain msgpack data; extension types are rejected (ValueError)."""
    try:
        return msgspec.msgpack.decode(buf, ext_hook=_reject_ext)
    except ProtocolError as exc:
        raise ValueError(f"state bytes contain a msgpack extension type: {exc.detail}") from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"state bytes are not valid msgpack: {exc}") from None
