"""Wire protocol: round trips, zero-copy arrays, timestamps, and every decode rejection reason."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from async_rl.transport.codec import MessageTooLarge, ProtocolError, WireCodec, WireLimits
from async_rl.transport.protocol import (
    PROTOCOL_VERSION,
    AckEntry,
    Bye,
    GroupAck,
    GroupSampling,
    Heartbeat,
    Hello,
    PromptGrant,
    RolloutGroup,
    Shutdown,
    TurnSpan,
    VersionUpdate,
    WeightSyncPlan,
    Welcome,
    WireArray,
    WorkGrant,
    WorkRequest,
    checked,
    make_completion,
    pack_array,
    unpack_array,
)

CODEC = WireCodec()
ENC = msgspec.msgpack.Encoder()


def _group(n: int = 2, length: int = 3, vmin: int = 4, vmax: int = 5) -> RolloutGroup:
    comps = [
        make_completion(np.arange(length) + i, np.full(length, -1.0), version_min=vmin + i, version_max=vmax + i)
        for i in range(n)
    ]
    return RolloutGroup(prompt_id=7, lease_id=3, actor_id="a0", completions=comps, timings={"gen": 0.5})


def _reason(buf: bytes, codec: WireCodec = CODEC) -> str:
    with pytest.raises(ProtocolError) as info:
        codec.decode(buf)
    return info.value.reason


def test_every_message_kind_round_trips() -> None:
    grant = PromptGrant(
        prompt_id=1,
        lease_id=2,
        min_version=0,
        prompt_token_ids=pack_array([5, 6], "<i4"),
        sampling=GroupSampling(n=4, temperature=0.7, top_p=0.9, top_k=20, max_tokens=64, seed=11),
        extras={"ground_truth": "42", "nested": [1, {"a": b"x"}]},
    )
    messages = [
        Hello(actor_id="a0", loaded_version=3),
        Welcome(
            policy_version=5,
            min_version=4,
            max_staleness=1,
            heartbeat_interval_s=1.0,
            peer_timeout_s=10.0,
            lease_timeout_s=60.0,
            max_message_bytes=1 << 20,
            weight_sync=_plan(),
        ),
        WorkRequest(actor_id="a0", max_groups=8, loaded_version=5, grants_seen=2),
        WorkGrant(prompts=[grant], policy_version=5),
        _group(),
        GroupAck(acks=[AckEntry(7, 3, "duplicate"), AckEntry(8, 4, "accepted")]),
        Heartbeat(sender="a0", policy_version=5),
        VersionUpdate(policy_version=6, min_version=5),
        VersionUpdate(policy_version=6, min_version=5, weight_sync=_plan(version=6, epoch=2, candidates=("a0",))),
        Shutdown(reason="done"),
        Bye(actor_id="a0"),
    ]
    for msg in messages:
        decoded = CODEC.decode(CODEC.encode(msg))
        assert type(decoded) is type(msg)
        assert decoded == msg
        assert decoded.protocol == PROTOCOL_VERSION


def test_kind_tag_is_on_the_wire() -> None:
    raw = msgspec.msgpack.decode(CODEC.encode(Bye(actor_id="a0")))
    assert raw["kind"] == "bye"
    assert raw["protocol"] == PROTOCOL_VERSION


def test_timestamps_are_stamped_per_message_not_at_import() -> None:
    before = time.time()
    first = Heartbeat(sender="a0")
    time.sleep(0.01)
    second = Heartbeat(sender="a0")
    assert before <= first.ts < second.ts  # 10 ms apart, so strictly increasing


def test_group_version_is_the_oldest_completion_version() -> None:
    group = _group(n=3, vmin=4, vmax=5)  # completions span [4,5], [5,6], [6,7]
    assert group.version == 4
    assert group.newest_version == 7
    assert group.version_span == 3  # 7 - 4


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**31 - 1), max_size=200),
    dtype=st.sampled_from(["<i4", "<i8", "<u4"]),
)
def test_token_arrays_round_trip_exactly(tokens: list[int], dtype: str) -> None:
    lps = np.linspace(-5.0, 0.0, num=len(tokens), dtype=np.float32)
    comp = make_completion(tokens, lps, version_min=0, token_dtype=dtype)
    group = RolloutGroup(prompt_id=0, lease_id=1, actor_id="a", completions=[comp])
    decoded = CODEC.decode(CODEC.encode(group))
    assert isinstance(decoded, RolloutGroup)
    out_tokens = unpack_array(decoded.completions[0].token_ids)
    assert out_tokens.dtype == np.dtype(dtype)
    assert out_tokens.tolist() == tokens
    np.testing.assert_array_equal(unpack_array(decoded.completions[0].logprobs), lps)


def test_arrays_are_raw_little_endian_bytes_not_lists() -> None:
    wire = pack_array([1, 258], "<i4")
    # 1 -> 01 00 00 00, 258 = 0x0102 -> 02 01 00 00 (little-endian)
    assert bytes(wire.data) == b"\x01\x00\x00\x00\x02\x01\x00\x00"
    assert wire.length == 2
    big_endian_input = np.array([1, 258], dtype=">i4")
    assert bytes(pack_array(big_endian_input, "<i4").data) == bytes(wire.data)


def test_decoded_arrays_share_memory_with_the_received_buffer() -> None:
    buf = bytearray(CODEC.encode(_group(n=1, length=1000)))
    decoded = CODEC.decode(memoryview(buf))
    assert isinstance(decoded, RolloutGroup)
    tokens = unpack_array(decoded.completions[0].token_ids)
    assert not tokens.flags.owndata
    assert np.shares_memory(tokens, np.frombuffer(buf, dtype=np.uint8))


def test_pack_array_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="dtype"):
        pack_array([1], ">i4")
    with pytest.raises(ValueError, match="1-D"):
        pack_array(np.zeros((2, 2)), "<f4")
    with pytest.raises(ValueError, match="logprobs length"):
        make_completion([1, 2], [0.0], version_min=0)


def _raw_group(completion: dict[str, Any] | None = None, **overrides: Any) -> bytes:
    comp: dict[str, Any] = {
        "token_ids": [b"\x01\x00\x00\x00", "<i4", 1],
        "logprobs": [b"\x00\x00\x00\x00", "<f4", 1],
        "version_min": 0,
        "version_max": 0,
        "finish_reason": "stop",
        "reward": 1.0,
    }
    comp.update(completion or {})
    msg: dict[str, Any] = {
        "kind": "rollout_group",
        "protocol": PROTOCOL_VERSION,
        "ts": 1.0,
        "prompt_id": 0,
        "lease_id": 1,
    }
    msg.update({"actor_id": "a0", "completions": [comp]})
    msg.update(overrides)
    return ENC.encode(msg)


def test_the_raw_group_helper_is_itself_valid() -> None:
    assert isinstance(CODEC.decode(_raw_group()), RolloutGroup)


def test_rejection_reasons() -> None:
    assert _reason(b"\xc1") == "malformed"  # 0xc1 is never valid msgpack
    assert _reason(b"\xc6\xff\xff\xff\xff") == "malformed"  # bin32 claiming 4 GiB, then nothing
    assert _reason(b"\x91" * 100_000 + b"\x00") == "schema"  # nested arrays where an object must be
    assert _reason(ENC.encode([1, 2, 3])) == "schema"  # right encoding, wrong shape
    assert _reason(ENC.encode({"protocol": 1})) == "kind"  # no kind
    assert _reason(ENC.encode({"kind": "nope", "protocol": 1})) == "kind"
    assert _reason(ENC.encode({"kind": "bye", "actor_id": "a", "extra": 1})) == "schema"  # unknown field
    assert _reason(ENC.encode({"kind": "bye", "actor_id": 5})) == "schema"  # wrong type (strict)
    assert _reason(ENC.encode({"kind": "work_request", "actor_id": "a", "max_groups": 1, "loaded_version": -1})) == (
        "schema"
    )  # negative version
    assert _reason(ENC.encode({"kind": "bye", "actor_id": "a", "protocol": 99})) == "version"
    assert _reason(ENC.encode({"kind": "bye", "actor_id": "a", "protocol": 2, "new_field": 1})) == "version"
    assert _reason(_raw_group(completion={"token_ids": [b"\x01\x00\x00\x00", "<i4", 2]})) == "array_length"  # lies
    assert _reason(_raw_group(completion={"token_ids": [b"\x01\x00\x00\x00", ">i4", 1]})) == "dtype"
    assert _reason(_raw_group(completion={"token_ids": [b"\x00" * 8, "<f8", 1]})) == "dtype"  # floats as tokens
    assert _reason(_raw_group(completion={"version_min": 3, "version_max": 2})) == "value"
    assert _reason(_raw_group(completion={"reward": float("nan")})) == "value"
    assert _reason(_raw_group(completions=[])) == "value"
    huge_claim = {"token_ids": [b"\x01\x00\x00\x00", "<i4", 10**12]}
    assert _reason(_raw_group(completion=huge_claim)) == "cap"


def test_extension_types_are_rejected() -> None:
    ext = msgspec.msgpack.Ext(1, b"payload")
    assert _reason(ENC.encode(ext)) == "ext"
    assert _reason(_raw_group(completion={"token_ids": ext})) == "ext"  # ext where a typed field is expected
    # An ext hidden in a free-form (Any) field, a grant's extras, must be rejected too, not decoded as an Ext object.
    prompt = {
        "prompt_id": 0,
        "lease_id": 1,
        "min_version": 0,
        "prompt_token_ids": [b"\x01\x00\x00\x00", "<i4", 1],
        "sampling": msgspec.to_builtins(GroupSampling.defaults()),
        "extras": {"x": ext},
    }
    grant = {"kind": "work_grant", "policy_version": 0, "prompts": [prompt]}
    assert _reason(ENC.encode(grant)) == "ext"
    # Absurd nesting inside a free-form field hits msgspec's recursion guard: still only a bad message.
    prompt["extras"] = {}
    prefix = ENC.encode(grant)[:-1]  # drop the empty map (0x80) at the very end
    assert _reason(prefix + b"\x81\xa1x" + b"\x91" * 100_000 + b"\x00") == "malformed"


def _plan(**overrides: Any) -> WeightSyncPlan:
    fields: dict[str, Any] = {
        "host": "10.0.0.1",
        "port": 29500,
        "backend": "gloo",
        "timeout_s": 60.0,
        "join_timeout_s": 10.0,
        "version": -1,
        "epoch": -1,
        "candidates": (),
    }
    return WeightSyncPlan(**{**fields, **overrides})


def test_the_weight_sync_plan_is_typed_and_checked_on_both_ends() -> None:
    """One struct from the publisher to the actor: every field required, its constraints checked where it is built
    (``checked``) and again where it is decoded; a bad plan never turns into defaults."""
    assert checked(_plan()) == _plan()
    for bad, field in [
        ({"port": 0}, "port"),
        ({"backend": "auto"}, "backend"),  # the learner resolves "auto"; only gloo or nccl travel
        ({"timeout_s": 0.0}, "timeout_s"),
        ({"epoch": -2}, "epoch"),
        ({"candidates": ("has space",)}, "candidates"),
        ({"host": ""}, "host"),
    ]:
        with pytest.raises(ValueError, match=field):
            checked(_plan(**bad))
        update = msgspec.to_builtins(VersionUpdate(policy_version=1, min_version=0, weight_sync=_plan(**bad)))
        assert _reason(ENC.encode(update)) == "schema"
    update = msgspec.to_builtins(VersionUpdate(policy_version=1, min_version=0, weight_sync=_plan()))
    del update["weight_sync"]["join_timeout_s"]
    assert _reason(ENC.encode(update)) == "schema"  # a missing field is an error, not a default
    update["weight_sync"] = {**msgspec.to_builtins(_plan()), "rank_offset": 1}
    assert _reason(ENC.encode(update)) == "schema"  # so is an unknown one


def test_caps_are_configurable() -> None:
    small = WireCodec(WireLimits(max_array_length=2, max_completions=1))
    assert _reason(CODEC.encode(_group(n=1, length=3)), small) == "cap"  # 3 tokens > 2
    assert _reason(CODEC.encode(_group(n=2, length=1)), small) == "cap"  # 2 completions > 1
    with pytest.raises(ValueError, match="max_completions"):
        WireLimits(max_completions=0)


def test_encode_checked_refuses_oversize_messages() -> None:
    group = _group(n=1, length=1000)  # 1000 int32 + 1000 float32 = 8000 bytes of arrays
    with pytest.raises(MessageTooLarge, match="max_message_bytes=4096"):
        CODEC.encode_checked(group, 4096)
    assert len(CODEC.encode_checked(group, 16_384)) > 8000


def test_wire_array_from_bytes_compares_equal_after_round_trip() -> None:
    arr = WireArray(data=memoryview(b"\x00\x00\x80\x3f"), dtype="<f4", length=1)  # 0x3f800000 == 1.0f
    assert unpack_array(arr).tolist() == [1.0]


def _two_turn_group() -> RolloutGroup:
    # [a1 a2 | o1 o2 o3 | a3 a4]: two model turns around a tool response the model did not sample
    comp = make_completion(
        [11, 12, 21, 22, 23, 13, 14],
        [-0.5, -0.25, 0.0, 0.0, 0.0, -1.0, -0.125],
        version_min=3,
        version_max=4,
        reward=1.0,
        loss_mask=[1, 1, 0, 0, 0, 1, 1],
        turns=[TurnSpan(0, 2, 3, 3, "tool_call"), TurnSpan(5, 2, 3, 4, "stop", reward=0.5)],
    )
    return RolloutGroup(prompt_id=7, lease_id=3, actor_id="a0", completions=[comp])


def test_a_multi_turn_completion_round_trips_with_its_mask_and_turns() -> None:
    group = _two_turn_group()
    decoded = CODEC.decode(CODEC.encode(group))
    assert isinstance(decoded, RolloutGroup)
    assert decoded == group
    c = decoded.completions[0]
    assert c.loss_mask is not None and c.loss_mask.dtype == "|u1" and c.loss_mask.length == 7
    assert bytes(c.loss_mask.data) == b"\x01\x01\x00\x00\x00\x01\x01"  # one raw byte per token
    assert unpack_array(c.loss_mask).tolist() == [1, 1, 0, 0, 0, 1, 1]
    assert c.turns == [TurnSpan(0, 2, 3, 3, "tool_call", 0.0), TurnSpan(5, 2, 3, 4, "stop", 0.5)]
    assert unpack_array(c.logprobs).tolist() == [-0.5, -0.25, 0.0, 0.0, 0.0, -1.0, -0.125]
    # a turn travels as a compact array, not a map
    raw = msgspec.msgpack.decode(CODEC.encode(group))
    assert raw["completions"][0]["turns"] == [[0, 2, 3, 3, "tool_call", 0.0], [5, 2, 3, 4, "stop", 0.5]]


def test_a_completion_without_mask_or_turns_still_decodes() -> None:
    raw = msgspec.msgpack.decode(_raw_group())
    assert "loss_mask" not in raw["completions"][0] and "turns" not in raw["completions"][0]
    decoded = CODEC.decode(_raw_group())
    assert isinstance(decoded, RolloutGroup)
    assert decoded.completions[0].loss_mask is None and decoded.completions[0].turns is None
    assert make_completion([1, 2], [-1.0, -1.0], version_min=0).loss_mask is None


def test_a_bad_mask_or_turn_is_a_decode_error() -> None:
    mask = [b"\x01", "|u1", 1]
    assert isinstance(CODEC.decode(_raw_group(completion={"loss_mask": mask})), RolloutGroup)
    assert _reason(_raw_group(completion={"loss_mask": [b"\x01\x00\x00\x00", "<i4", 1]})) == "dtype"
    assert _reason(_raw_group(completion={"loss_mask": [b"\x01\x01", "|u1", 2]})) == "array_length"  # 2 for 1 token
    assert _reason(_raw_group(completion={"loss_mask": [b"\x01\x01", "|u1", 1]})) == "array_length"  # bytes lie
    turn = [0, 1, 0, 0, "stop", 0.0]
    assert isinstance(CODEC.decode(_raw_group(completion={"turns": [turn]})), RolloutGroup)
    assert _reason(_raw_group(completion={"turns": [[0, 1, 0, 0, "stop", float("nan")]]})) == "value"
    assert _reason(_raw_group(completion={"turns": [[-1, 1, 0, 0, "stop", 0.0]]})) == "schema"  # negative start
    assert _reason(_raw_group(completion={"turns": [[*turn, 1]]})) == "schema"  # an unknown trailing field
    assert _reason(_raw_group(completion={"turns": [[0, 1, 0, 0, "x" * 65, 0.0]]})) == "schema"  # finish reason cap
    small = WireCodec(WireLimits(max_array_length=1))
    assert _reason(_raw_group(completion={"turns": [turn, turn]}), small) == "cap"
    with pytest.raises(ValueError, match="loss_mask length 1 != token_ids length 2"):
        make_completion([1, 2], [-1.0, -1.0], version_min=0, loss_mask=[1])
