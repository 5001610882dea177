"""Flow control: a flood of 10x the high-water mark loses nothing and keeps its order; the sender queues what the
socket cannot take (visible in its counters) without blocking, so an asyncio actor's loop and its heartbeats keep
running meanwhile; unroutable sends are reported instead of vanishing (ROUTER_MANDATORY)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq
from _plane_config import plane_config

from async_rl.config import Config
from async_rl.transport import Coordinator, GroupSampling, RolloutClient, make_completion, unpack_array
from async_rl.transport.codec import WireCodec
from async_rl.transport.protocol import Heartbeat, Hello, RolloutGroup
from async_rl.transport.sockets import bind_router


def fast(**overrides: Any) -> Config:
    """A test config with quick liveness: heartbeats every 0.1 s, a peer is dead after 1 s of silence."""
    return plane_config(heartbeat_interval_s=0.1, peer_timeout_s=1.0, **overrides)


HWM = 4
FLOOD = 10 * HWM


def _big_group(prompt_id: int, tokens: int) -> RolloutGroup:
    ids = np.full(tokens, prompt_id, dtype=np.int32)
    comp = make_completion(ids, np.zeros(tokens, dtype=np.float32), version_min=0)
    return RolloutGroup(prompt_id=prompt_id, lease_id=1 + prompt_id, actor_id="flooder", completions=[comp])


def test_flood_of_ten_times_the_hwm_blocks_the_sender_and_loses_nothing() -> None:
    s = fast(socket_hwm=HWM)
    ctx = zmq.Context()
    router, port = bind_router(ctx, s.async_training.transport, None)  # the coordinator's own socket configuration
    client = RolloutClient(f"tcp://127.0.0.1:{port}", "flooder", s.async_training.transport)
    received: list[RolloutGroup] = []
    codec = WireCodec()

    def reader() -> None:
        time.sleep(0.5)  # a stalled receiver: the sender must hit the high-water mark meanwhile
        while len(received) < FLOOD and router.poll(5000):
            _rid, payload = router.recv_multipart()
            msg = codec.decode(payload)
            if isinstance(msg, RolloutGroup):
                received.append(msg)
            else:
                assert isinstance(msg, Heartbeat)  # flush() polls: the client's heartbeats go on meanwhile

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        # 40 groups x 1 MiB (131072 tokens x (4 + 4) bytes) = 40 MiB: far beyond 2 x HWM messages plus socket buffers.
        for pid in range(FLOOD):
            client.send_group(_big_group(pid, 131_072))  # never waits: what the socket refuses is queued
        assert client.backlog > 0  # the receiver is stalled: the queue holds the rest
        assert client.flush(20.0) and client.backlog == 0
        thread.join(timeout=30)
    finally:
        client.close(linger_s=0.0)
        router.close(linger=0)
        ctx.term()
    assert not thread.is_alive()
    assert [g.prompt_id for g in received] == list(range(FLOOD))  # all 40 arrived, once each, in order, in full
    assert all((unpack_array(g.completions[0].token_ids) == g.prompt_id).all() for g in received)
    assert client.metrics()["transport/client/send_blocked"] >= 1  # backpressure was felt, not hidden


def test_heartbeats_and_the_event_loop_keep_going_while_groups_wait_for_the_socket() -> None:
    """An asyncio actor sends groups while the coordinator reads nothing for a second: no send blocks the loop (a
    coroutine ticking every 10 ms never stalls), and once the coordinator reads again the actor's heartbeat is among
    the first messages, ahead of the groups still queued, which then arrive in order, once each."""
    s = fast(socket_hwm=HWM)
    ctx = zmq.Context()
    router, port = bind_router(ctx, s.async_training.transport, None)
    client = RolloutClient(
        f"tcp://127.0.0.1:{port}", "flooder", s.async_training.transport, ack_timeout_s=60.0
    )  # no acks: no re-sends
    kinds: list[tuple[str, int]] = []  # what the coordinator's socket received, in order: (kind, prompt id or -1)
    codec = WireCodec()
    stall_s = 1.5

    def reader() -> None:
        time.sleep(stall_s)
        groups = 0
        while groups < FLOOD and router.poll(5000):
            _rid, payload = router.recv_multipart()
            msg = codec.decode(payload)
            if isinstance(msg, RolloutGroup):
                groups += 1
                kinds.append(("group", msg.prompt_id))
            elif isinstance(msg, Heartbeat):
                kinds.append(("heartbeat", -1))

    async def actor() -> tuple[float, float]:
        ticks: list[float] = []
        stop = asyncio.Event()

        async def loop_tick() -> None:  # the actor loop's own beat: poll, then yield to the other coroutines
            while not stop.is_set():
                ticks.append(time.monotonic())
                client.poll()
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(loop_tick())
        t0 = time.monotonic()
        for pid in range(FLOOD):
            client.send_group(_big_group(pid, 131_072))
            await asyncio.sleep(0)
        send_s = time.monotonic() - t0
        while client.backlog and time.monotonic() - t0 < 20.0:
            await asyncio.sleep(0.01)
        stop.set()
        await ticker
        gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
        return send_s, max(gaps)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        send_s, max_gap = asyncio.run(actor())
        thread.join(timeout=30)
    finally:
        client.close(linger_s=0.0)
        router.close(linger=0)
        ctx.term()
    assert not thread.is_alive()
    assert send_s < stall_s / 2  # forty 1 MiB groups queued while nothing was read: no send waited for the socket
    assert max_gap < stall_s / 3, max_gap  # the loop never stalled (a blocking send would hold it for the stall)
    assert client.metrics()["transport/client/send_blocked"] >= 1 and client.backlog == 0
    assert [pid for kind, pid in kinds if kind == "group"] == list(range(FLOOD))  # in order, once each
    first_heartbeat = next(i for i, (kind, _) in enumerate(kinds) if kind == "heartbeat")
    assert first_heartbeat < len(kinds) - 1 and kinds[-1][0] == "group"  # ahead of groups still queued


def test_flood_through_the_coordinator_is_fully_accepted(
    coordinator_factory: Callable[..., Coordinator], client_factory: Callable[..., RolloutClient]
) -> None:
    s = fast(socket_hwm=HWM, groups_per_step=FLOOD // 2, max_inflight_groups=FLOOD)  # K = 1: 2 steps may queue
    coord = coordinator_factory(FLOOD, s, max_epochs=1, sampling=GroupSampling.defaults(max_tokens=16_384))
    client = client_factory(coord.address, "flooder", cfg=s)
    client.hello()
    grants: list = []
    deadline = time.monotonic() + 5
    while len(grants) < FLOOD and time.monotonic() < deadline:
        grants += client.request_work(FLOOD - len(grants), 0, timeout_s=0.05)
    assert len(grants) == FLOOD
    for g in grants:
        group = _big_group(g.prompt_id, 16_384)  # 128 KiB each
        group.lease_id = g.lease_id
        client.send_group(group)
    assert client.wait_acked(20.0)
    assert client.metrics()["transport/client/acks/accepted"] == FLOOD  # none duplicate: no ack was lost
    groups = coord.get_groups(FLOOD, timeout_s=5.0)
    assert sorted(g.prompt_id for g in groups) == list(range(FLOOD))
    assert coord.metrics()["transport/bytes_received_total"] > FLOOD * 16_384 * 8  # payload bytes counted


def test_sends_to_a_vanished_peer_are_reported(coordinator_factory: Callable[..., Coordinator]) -> None:
    coord = coordinator_factory(4)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.ROUTING_ID, b"ghost")
    sock.connect(coord.address)
    sock.send(WireCodec().encode(Hello(actor_id="ghost")))
    assert sock.poll(2000)  # the Welcome
    sock.close(linger=0)  # gone without a Bye; the coordinator still believes it alive for peer_timeout_s
    ctx.term()
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and not coord.metrics().get("transport/send_failures/unroutable"):
        time.sleep(0.02)
    assert coord.metrics()["transport/send_failures/unroutable"] >= 1  # a heartbeat raised instead of vanishing
