"""10,000 malformed messages at a live coordinator: every one is counted by reason and dropped, the coordinator does
not crash, no bogus actor is registered, and a real actor is served normally afterwards."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec
import zmq
from _plane_config import plane_config

from async_rl.config import Config
from async_rl.transport import Coordinator, RolloutClient
from async_rl.transport.protocol import PROTOCOL_VERSION, RolloutGroup


def fast(**overrides: Any) -> Config:
    """A test config with quick liveness: heartbeats every 0.1 s, a peer is dead after 1 s of silence."""
    return plane_config(heartbeat_interval_s=0.1, peer_timeout_s=1.0, **overrides)


ENC = msgspec.msgpack.Encoder()
TOTAL = 10_000


CATEGORIES = "random shape lying_length huge_length ext version kind unknown_field negative dtype cap frames direction"
CATEGORIES += " identity nan"


def _group_dict(rng: random.Random, actor_id: str) -> dict[str, Any]:
    comp = {
        "token_ids": [b"\x01\x00\x00\x00", "<i4", 1],
        "logprobs": [b"\x00\x00\x00\x00", "<f4", 1],
        "version_min": 0,
        "version_max": 0,
        "finish_reason": "stop",
        "reward": 0.0,
    }
    group: dict[str, Any] = {"kind": "rollout_group", "protocol": PROTOCOL_VERSION, "prompt_id": rng.randrange(100)}
    group.update({"lease_id": 1, "actor_id": actor_id, "completions": [comp]})
    return group


def _bad_message(rng: random.Random, actor_id: str) -> tuple[str, list[bytes]]:
    """(category, payload frames) — every category is invalid by construction."""
    category = rng.choice(CATEGORIES.split())
    group = _group_dict(rng, actor_id)
    comp = group["completions"][0]
    if category == "random":
        payload = b"\xc1" + rng.randbytes(rng.randrange(0, 200))  # 0xc1 first: never valid msgpack
    elif category == "shape":
        payload = ENC.encode(rng.choice([rng.randrange(10**6), [1, 2, 3], "hello", {"no": "kind"}, None, 1.5]))
    elif category == "lying_length":
        comp["token_ids"] = [rng.randbytes(rng.randrange(0, 16)), "<i4", rng.randrange(5, 1000)]
        payload = ENC.encode(group)
    elif category == "huge_length":
        payload = rng.choice([b"\xc6\xff\xff\xff\xf0", b"\xdd\xff\xff\xff\xff", b"\xdf\x7f\xff\xff\xff"]) + b"\x00" * 8
    elif category == "ext":
        payload = ENC.encode(msgspec.msgpack.Ext(rng.randrange(0, 127), rng.randbytes(8)))
    elif category == "version":
        group["protocol"] = PROTOCOL_VERSION + rng.randrange(1, 100)
        payload = ENC.encode(group)
    elif category == "kind":
        group["kind"] = rng.choice(["evil", "", "rollout", "ROLLOUT_GROUP"])
        payload = ENC.encode(group)
    elif category == "unknown_field":
        group["__proto__"] = 1
        payload = ENC.encode(group)
    elif category == "negative":
        group["prompt_id"] = -rng.randrange(1, 10**9)
        payload = ENC.encode(group)
    elif category == "dtype":
        comp["token_ids"] = [b"\x00" * 8, rng.choice(["<f8", "object", "|O", ">i4", "<U2"]), 1]
        payload = ENC.encode(group)
    elif category == "cap":
        comp["token_ids"] = [b"", "<i4", 2**40]
        payload = ENC.encode(group)
    elif category == "frames":
        return category, [ENC.encode(group), b"extra"]
    elif category == "direction":
        payload = ENC.encode({"kind": "shutdown", "protocol": PROTOCOL_VERSION, "reason": "x"})
    elif category == "identity":
        group["actor_id"] = "someone-else"
        payload = ENC.encode(group)
    else:  # nan
        comp["reward"] = float("nan")
        payload = ENC.encode(group)
    return category, [payload]


def test_ten_thousand_bad_messages_are_counted_and_dropped(
    coordinator_factory: Callable[..., Coordinator],
    client_factory: Callable[..., RolloutClient],
    make_group: Callable[..., RolloutGroup],
) -> None:
    s = fast(max_message_bytes=1 << 20)
    coord = coordinator_factory(8, s)
    rng = random.Random(1234)
    ctx = zmq.Context()
    senders = []
    try:
        for i in range(3):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            if i < 2:  # two fuzzers with printable identities, one with a zmq-generated binary identity
                sock.setsockopt(zmq.ROUTING_ID, f"fuzz-{i}".encode())
            sock.connect(coord.address)
            senders.append((sock, f"fuzz-{i}"))
        categories: Counter[str] = Counter()
        for n in range(TOTAL):
            sock, name = senders[n % len(senders)]
            category, frames = _bad_message(rng, name)
            categories[category] += 1
            sock.send_multipart(frames)  # blocking send: nothing is dropped on our side
        deadline = time.monotonic() + 30
        while coord.metrics()["transport/decode_errors_total"] < TOTAL and time.monotonic() < deadline:
            time.sleep(0.05)
        m = coord.metrics()
    finally:
        for sock, _ in senders:
            sock.close()
        ctx.term()
    assert m["transport/decode_errors_total"] == TOTAL  # every one counted, none slipped through as valid
    assert m["transport/groups_received_total"] == 0 and m["transport/actors_alive"] == 0
    assert m["transport/decode_errors/frames"] == categories["frames"]
    assert m["transport/decode_errors/version"] == categories["version"]
    assert m["transport/decode_errors/direction"] == categories["direction"]
    assert m["transport/decode_errors/value"] == categories["nan"]
    assert m["transport/decode_errors/dtype"] == categories["dtype"]
    assert m["transport/decode_errors/identity"] == categories["identity"]
    assert m["transport/decode_errors/ext"] == categories["ext"]
    # The plane still serves a real actor.
    client = client_factory(coord.address, "real-actor", cfg=s)
    client.hello()
    grants: list = []
    deadline = time.monotonic() + 3
    while not grants and time.monotonic() < deadline:
        grants = client.request_work(1, 0, timeout_s=0.1)
    client.send_group(make_group(grants[0], "real-actor", version=0))
    assert client.wait_acked(2.0)
    (group,) = coord.get_groups(1, timeout_s=2.0)
    assert group.prompt_id == grants[0].prompt_id
