"""Wire format of one weight update: fixed-size frames, one up-front plan, bare data, and the closing digests.

One update is a sequence of broadcasts from group rank 0, every one of which all ranks take part in:

    first:       FRAME(kind=PLAN, header_len, total_bytes, 0)        ->  plan bytes (every bucket's chunk table)
    per bucket:  data bytes only (its size is in the plan: no per-bucket frame or header, no round trip)
    at the end:  FRAME(kind=END, header_len, 0, buckets)             ->  end message bytes (per-tensor digests)
    on failure:  FRAME(kind=ABORT, header_len, 0, seq)               ->  reason (utf-8), in place of PLAN or END

A frame is a 4-element int64 tensor, so every rank knows how many bytes the next broadcast carries before it posts the
receive. Plans and end messages travel as msgpack bytes inside uint8 tensors (never pickle). The plan is computed from
the tensors' metadata alone (``TensorSpec``: name, dtype, shape), which the learner knows before it gathers anything,
so the FSDP gather stays lazy (one bucket at a time) while the receivers know every buffer in advance and can post
the next receive before they load the previous bucket. A failure in the middle of the data (a gather raised, a member
died) cannot be framed: the sender abandons the epoch through the store and every receiver stops within 0.1 s.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import msgspec
import torch

from async_rl.weight_sync.digest import TensorDigest
from async_rl.weight_sync.errors import WeightSyncError

__all__ = [
    "FRAME_ABORT",
    "FRAME_END",
    "FRAME_PLAN",
    "BucketSpec",
    "ChunkMeta",
    "EndMessage",
    "TensorSpec",
    "UpdatePlan",
    "decode_frame",
    "decode_struct",
    "dtype_from_name",
    "dtype_name",
    "encode_frame",
    "encode_struct",
]

_T = TypeVar("_T", bound=msgspec.Struct)

_MAGIC = 0x5753_0000  # "WS" in the high half of the first frame word: catches a desynchronised stream early
FRAME_PLAN = 1
FRAME_END = 2
FRAME_ABORT = 3
_KINDS = (FRAME_PLAN, FRAME_END, FRAME_ABORT)

# dtypes a weight may have on the wire; anything else is refused rather than reinterpreted.
_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


class UpdateRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One ``update_weights`` call: what an actor asks its vLLM workers to receive, and how to check it. The client
    (``weight_sync.client``) sends it as builtins through vLLM's RPC; the worker (``actor.vllm_ext``) decodes the
    same struct, so neither side has defaults of its own. Checked when built and when decoded.

    ``version`` -1 accepts whatever version the sender sends. ``verify_load`` checks the loaded values against the
    received digests; ``verify_rotation`` N checks the values of 1/N of the parameters per update, in turn
    (``LoadVerifier.begin``). ``require_complete``: every parameter of the model must arrive. A LoRA update names
    ``adapter_dir``, where the adapter is written as a PEFT directory, and its ``adapter_config.json`` (both or
    neither); the served base weights are then untouched.
    """

    version: int
    verify_load: bool
    verify_rotation: int
    require_complete: bool
    adapter_dir: str | None
    adapter_config: dict[str, Any] | None

    def __post_init__(self) -> None:
        if self.version < -1:
            raise ValueError(f"version must be >= 0 (or -1 for any), got {self.version}")
        if self.verify_rotation < 1:
            raise ValueError(f"verify_rotation must be >= 1, got {self.verify_rotation}")
        if (self.adapter_dir is None) != (self.adapter_config is None):
            raise ValueError("a LoRA update needs both adapter_dir and adapter_config")


class TensorSpec(msgspec.Struct, array_like=True, frozen=True):
    """What one tensor of an update will be, known before its bytes exist: the input of the bucket plan."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=dtype_from_name(self.dtype)).element_size()


class ChunkMeta(msgspec.Struct, array_like=True, frozen=True):
    """One contiguous byte range of one tensor, placed inside one bucket.

    ``offset``/``nbytes`` locate the chunk in the bucket; ``start`` is where it goes in the full tensor's bytes, whose
    size is ``total``. A tensor that fits in a bucket is a single chunk with ``start == 0`` and ``nbytes == total``.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    start: int
    total: int


class BucketSpec(msgspec.Struct, array_like=True, frozen=True):
    """One data broadcast of ``nbytes`` bytes. A ``direct`` bucket is one chunk sent from (and into) the tensor's own
    memory; a packed one holds its chunks at 64-byte aligned offsets of one flat buffer."""

    direct: bool
    nbytes: int
    chunks: list[ChunkMeta]


class UpdatePlan(msgspec.Struct, frozen=True):
    """Everything the receivers need before the first data byte: the version, the digest algorithm, the buckets."""

    version: int
    algo: str
    buckets: list[BucketSpec]


class EndMessage(msgspec.Struct, frozen=True):
    """Closes an update: what the sender sent, and the digest of every tensor it sent (sorted by name)."""

    version: int
    buckets: int
    nbytes: int
    algo: str
    tensors: list[TensorDigest]
    fingerprint: str


def dtype_name(dtype: torch.dtype) -> str:
    """Wire name of ``dtype`` (``torch.bfloat16`` -> ``"bfloat16"``); ValueError for dtypes not allowed on the wire."""
    try:
        return _NAMES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} cannot be sent as a weight; allowed: {sorted(_DTYPES)}") from None


def dtype_from_name(name: str) -> torch.dtype:
    """Inverse of :func:`dtype_name`; an unknown name is a protocol error (a corrupt or foreign header)."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise WeightSyncError(f"header names unknown dtype {name!r}") from None


def encode_frame(kind: int, header_len: int, data_len: int, seq: int) -> torch.Tensor:
    """The 4-word int64 frame announcing the next header (and data) sizes."""
    assert kind in _KINDS, kind
    assert header_len >= 0 and data_len >= 0, (header_len, data_len)
    return torch.tensor([_MAGIC | kind, header_len, data_len, seq], dtype=torch.int64)


def decode_frame(frame: torch.Tensor) -> tuple[int, int, int, int]:
    """Return ``(kind, header_len, data_len, seq)``; WeightSyncError if the frame is not one of ours."""
    words = [int(v) for v in frame.tolist()]
    if len(words) != 4 or words[0] & ~0xFFFF != _MAGIC or words[0] & 0xFFFF not in _KINDS:
        raise WeightSyncError(f"malformed weight-sync frame {words!r}: sender and receiver are out of step")
    if words[1] < 0 or words[2] < 0:
        raise WeightSyncError(f"malformed weight-sync frame {words!r}: negative length")
    return words[0] & 0xFFFF, words[1], words[2], words[3]


def encode_struct(obj: msgspec.Struct) -> torch.Tensor:
    """msgpack-encode ``obj`` into a 1-D uint8 tensor ready to broadcast."""
    raw = msgspec.msgpack.encode(obj)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def decode_struct(data: torch.Tensor, kind: type[_T]) -> _T:
    """Decode a uint8 tensor produced by :func:`encode_struct`; WeightSyncError on malformed bytes."""
    try:
        return msgspec.msgpack.decode(data.cpu().numpy().tobytes(), type=kind)
    except msgspec.DecodeError as exc:
        raise WeightSyncError(f"malformed {kind.__name__}: {exc}") from exc
