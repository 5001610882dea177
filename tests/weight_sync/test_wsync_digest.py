"""Digests of raw weight bytes and the wire protocol's codecs (pure)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from async_rl.weight_sync.digest import (
    ALGO_WSUM16,
    ALGO_XXH3,
    ByteDigest,
    TensorDigest,
    compare_digests,
    digest_tensor,
    fingerprint,
)
from async_rl.weight_sync.errors import WeightSyncError
from async_rl.weight_sync.protocol import (
    FRAME_END,
    BucketSpec,
    ChunkMeta,
    TensorSpec,
    UpdatePlan,
    decode_frame,
    decode_struct,
    dtype_from_name,
    dtype_name,
    encode_frame,
    encode_struct,
)

MASK = (1 << 64) - 1


def test_xxh3_matches_the_reference_values() -> None:
    # XXH3-64 (seed 0) of the empty input is 0x2D06800538D394C2, the value the reference implementation documents.
    assert digest_tensor("x", torch.zeros(0, dtype=torch.uint8), "uint8", ALGO_XXH3).a == 0x2D06800538D394C2
    # Streamed in two chunks, "123456789" digests as in one piece.
    data = torch.tensor(list(b"123456789"), dtype=torch.uint8)
    state = ByteDigest(ALGO_XXH3, 9)
    state.update(data[:4])
    state.update(data[4:])
    assert state.finish("x", "uint8", (9,)).a == digest_tensor("x", data, "uint8", ALGO_XXH3).a == 0x72DCB18B67A17DFF


def test_wsum16_hand_computed() -> None:
    # 6 bytes -> three int16 elements [1, 2, 3] with position weights [1, 2, 3]: a = 6, b = 1 + 4 + 9 = 14.
    d = digest_tensor("x", torch.tensor([1, 2, 3], dtype=torch.int16), "int16", ALGO_WSUM16)
    assert (d.a, d.b, d.nbytes) == (6, 14, 6)
    # 3 bytes (odd) -> uint8 elements [5, 7, 9]: a = 21, b = 5*1 + 7*2 + 9*3 = 46.
    d = digest_tensor("x", torch.tensor([5, 7, 9], dtype=torch.uint8), "uint8", ALGO_WSUM16)
    assert (d.a, d.b) == (21, 46)
    # A negative element wraps modulo 2**64: int16 [-1] -> a = b = 2**64 - 1.
    d = digest_tensor("x", torch.tensor([-1], dtype=torch.int16), "int16", ALGO_WSUM16)
    assert (d.a, d.b) == (MASK, MASK)


@settings(max_examples=40, deadline=None)
@given(
    data=st.binary(min_size=0, max_size=600),
    cuts=st.lists(st.integers(0, 300), max_size=5),
    algo=st.sampled_from([ALGO_XXH3, ALGO_WSUM16]),
)
def test_chunking_does_not_change_the_digest(data: bytes, cuts: list[int], algo: str) -> None:
    raw = torch.tensor(list(data), dtype=torch.uint8)
    width = 2 if len(data) % 2 == 0 else 1  # wsum16 chunks must not split an element
    points = sorted({min(c * width, len(data)) for c in cuts} | {0, len(data)})
    state = ByteDigest(algo, len(data))
    for lo, hi in zip(points, points[1:], strict=False):
        state.update(raw[lo:hi])
    assert state.finish("x", "uint8", (len(data),)) == digest_tensor("x", raw, "uint8", algo)


@pytest.mark.parametrize("algo", [ALGO_XXH3, ALGO_WSUM16])
def test_single_bit_flip_and_swap_are_detected(algo: str) -> None:
    base = torch.randn(257, generator=torch.Generator().manual_seed(0))
    ref = digest_tensor("w", base, "float32", algo)
    flipped = base.clone()
    flipped.view(torch.int32)[100] ^= 1  # lowest mantissa bit of one element
    assert digest_tensor("w", flipped, "float32", algo) != ref
    swapped = base.clone()
    swapped[[3, 200]] = swapped[[200, 3]]
    assert digest_tensor("w", swapped, "float32", algo) != ref


def _d(name: str, a: int) -> TensorDigest:
    return TensorDigest(name, "float32", (1,), 4, a, 0)


def test_compare_names_the_first_bad_tensor() -> None:
    sent = [_d("b", 2), _d("a", 1), _d("c", 3)]
    compare_digests(sent, {d.name: d for d in sent})
    with pytest.raises(WeightSyncError, match="digest mismatch") as info:
        compare_digests(sent, {"a": _d("a", 1), "b": _d("b", 9), "c": _d("c", 8)})
    assert info.value.tensor == "b"  # b and c differ; b comes first in name order
    with pytest.raises(WeightSyncError, match="not received") as info:
        compare_digests(sent, {"b": _d("b", 2), "c": _d("c", 3)})
    assert info.value.tensor == "a"
    with pytest.raises(WeightSyncError, match="not in the sender") as info:
        compare_digests(sent, {d.name: d for d in [*sent, _d("z", 0)]})
    assert info.value.tensor == "z"


def test_fingerprint_ignores_order_but_not_content() -> None:
    one = [_d("a", 1), _d("b", 2)]
    assert fingerprint(one) == fingerprint(one[::-1])
    assert fingerprint(one) != fingerprint([_d("a", 1), _d("b", 3)])


def test_frames_and_headers_round_trip() -> None:
    assert decode_frame(encode_frame(FRAME_END, 17, 0, 5)) == (FRAME_END, 17, 0, 5)
    with pytest.raises(WeightSyncError, match="out of step"):
        decode_frame(torch.tensor([1, 17, 0, 5]))  # no magic
    plan = UpdatePlan(3, ALGO_XXH3, [BucketSpec(False, 76, [ChunkMeta("w", "bfloat16", (2, 3), 64, 12, 0, 12)])])
    assert decode_struct(encode_struct(plan), UpdatePlan) == plan
    with pytest.raises(WeightSyncError, match="malformed UpdatePlan"):
        decode_struct(torch.tensor([1, 2, 3], dtype=torch.uint8), UpdatePlan)


def test_tensor_spec_sizes() -> None:
    assert TensorSpec("w", "bfloat16", (3, 5)).nbytes == 30
    assert TensorSpec("s", "int64", ()).nbytes == 8 and TensorSpec("e", "float32", (0, 4)).nbytes == 0


def test_dtype_names() -> None:
    assert dtype_name(torch.bfloat16) == "bfloat16" and dtype_from_name("bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="complex64"):
        dtype_name(torch.complex64)
    with pytest.raises(WeightSyncError, match="unknown dtype"):
        dtype_from_name("float128")
