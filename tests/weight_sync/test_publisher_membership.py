"""The publisher's weight-sync membership over a real TCPStore and gloo group (actors are threads here).

What is checked: a client that said hello but never announced itself costs nothing; an actor that announced itself
but never got ready costs one ``join_timeout_s`` once, is left out, and is invited again only after a fresh
announcement; the coordinator is told which actors received each version (grants follow weights actually sent); the
``sync/bytes`` metric is the bytes the actors received.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import msgspec
import pytest
import torch

from async_rl.config.async_training import WeightSyncConfig
from async_rl.transport.protocol import WeightSyncPlan
from async_rl.weight_sync import ReceiveReport, WeightReceiver
from async_rl.weight_sync.membership import JoinInfo, announce_at, join_epoch
from async_rl.weight_sync.protocol import TensorSpec, dtype_name
from async_rl.weight_sync.publisher import WeightPublisher, wire_dtype

JOIN_S = 0.5


class _Ctx:
    """Learner rank 0 of a world of one; ``said`` records what it broadcast to the other ranks."""

    rank = 0

    def __init__(self) -> None:
        self.said: list[bytes] = []

    def broadcast_bytes(self, data: bytes | None, src: int = 0) -> bytes:
        assert data is not None
        self.said.append(data)
        return data


class _OtherRank:
    """A learner rank other than 0: it only hears what rank 0 broadcasts (``said``)."""

    rank = 1

    def __init__(self, said: bytes) -> None:
        self.said = said

    def broadcast_bytes(self, data: bytes | None, src: int = 0) -> bytes:
        assert data is None and src == 0
        return self.said


class _Coordinator:
    def __init__(self, live: list[str]) -> None:
        self.live = live
        self.plan: WeightSyncPlan | None = None
        self.versions: list[int] = []
        self.confirmed: list[tuple[int, list[str]]] = []
        self.waits: list[float] = []  # seconds of each learner_waits block (the actors are told the learner waits)

    @property
    def policy_version(self) -> int:
        return self.versions[-1] if self.versions else 0

    def live_actor_ids(self) -> list[str]:
        return sorted(self.live)

    def set_policy_version(self, version: int, weight_sync: WeightSyncPlan | None = None) -> None:
        assert weight_sync is None or isinstance(weight_sync, WeightSyncPlan)
        self.versions.append(version)
        if weight_sync is not None:
            self.plan = weight_sync

    def current(self) -> WeightSyncPlan:
        assert self.plan is not None, "the publisher announces a plan when it is built"
        return self.plan

    def confirm_weights(self, version: int, actor_ids: list[str]) -> None:
        self.confirmed.append((version, list(actor_ids)))

    @contextlib.contextmanager
    def learner_waits(self) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.waits.append(time.monotonic() - t0)


def _publisher(coord: _Coordinator, *, timeout_s: float, join_timeout_s: float = JOIN_S) -> WeightPublisher:
    """A gloo publisher built as a run builds it, from ``async_training.weight_sync`` (the config's defaults else)."""
    ws = WeightSyncConfig(backend="gloo", timeout_s=timeout_s, join_timeout_s=join_timeout_s)
    return WeightPublisher.from_config(ws, _Ctx(), coord, adapter=None, served_check_tolerance=1e-3)


def _weights(version: int) -> Iterator[tuple[str, torch.Tensor]]:
    yield "w", torch.full((64,), float(version))


def _receiving_actor(
    coord: _Coordinator,
    member: str,
    versions: list[int],
    got: list[float],
    reports: list[ReceiveReport] | None = None,
    *,
    served: torch.dtype | None = None,
    received: list[torch.Tensor] | None = None,
) -> threading.Thread:
    """Announce, wait to be invited, join through the roster (saying it serves ``served``), then receive
    ``versions`` in order (the first element of each tensor into ``got``, the tensors into ``received``)."""

    def load(batch: list[tuple[str, torch.Tensor]]) -> None:
        got.extend(float(t[0]) for _, t in batch)
        if received is not None:
            received.extend(t.clone() for _, t in batch)

    def run() -> None:
        plan = coord.current()
        announce_at(plan.host, plan.port, member, "token-1", timeout_s=30.0)
        while member not in coord.current().candidates:
            time.sleep(0.01)
        group = join_epoch(JoinInfo(plan=coord.current(), member=member), served=served)
        for v in versions:
            report = WeightReceiver(group).receive(load, expect_version=v)
            if reports is not None:
                reports.append(report)
        group.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_the_plan_is_announced_before_any_epoch_and_carries_every_setting() -> None:
    coord = _Coordinator([])
    pub = _publisher(coord, timeout_s=7.0)
    try:
        assert coord.versions == [0]  # announced at the coordinator's current version: actors learn where to announce
        expected = WeightSyncPlan(
            host="127.0.0.1", port=pub.port, backend="gloo", timeout_s=7.0, join_timeout_s=JOIN_S, version=-1,
            epoch=-1, candidates=(),
        )  # fmt: skip
        assert coord.current() == expected
    finally:
        pub.close()


def test_sync_metrics_are_the_bytes_the_actor_received() -> None:
    coord = _Coordinator(["a"])
    pub = _publisher(coord, timeout_s=10.0)
    weights = {"w": torch.arange(1024, dtype=torch.float32), "b": torch.ones(15, dtype=torch.float64)}
    try:
        reports: list[ReceiveReport] = []
        actor = _receiving_actor(coord, "a", [1], [], reports)
        time.sleep(0.2)
        metrics = pub.publish(1, lambda _dtype: iter(weights.items()))
        actor.join(10.0)
    finally:
        pub.close()
    assert metrics["sync/actors"] == 1.0 and len(reports) == 1
    tensor_bytes = sum(t.numel() * t.element_size() for t in weights.values())  # 4096 + 120
    assert metrics["sync/bytes"] == float(reports[0].nbytes) >= tensor_bytes  # buckets may pad to alignment
    assert metrics["sync/bytes"] < tensor_bytes + 64 * len(weights)  # at most one alignment pad per tensor
    # MiB/s over the broadcast alone, which is part of sync/seconds: never below the rate over the whole publish
    assert metrics["sync/bandwidth_MBps"] >= metrics["sync/bytes"] / 2**20 / metrics["sync/seconds"] > 0.0


def _spec(dtype: str) -> TensorSpec:
    return TensorSpec("w", dtype, (4,))


def test_weights_travel_in_the_dtype_every_member_serves_when_it_is_narrower() -> None:
    fp32, bf16 = [_spec("float32"), _spec("int64")], [_spec("bfloat16")]
    assert wire_dtype(["bfloat16", "bfloat16"], fp32) is torch.bfloat16  # integer tensors are never cast
    assert wire_dtype(["float16"], fp32) is torch.float16
    assert wire_dtype(["bfloat16", "float32"], fp32) is None  # members differ: as stored
    assert wire_dtype(["bfloat16", ""], fp32) is None  # one member did not say (no model)
    assert wire_dtype([], fp32) is None
    assert wire_dtype(["float32"], bf16) is None  # never widened
    assert wire_dtype(["bfloat16"], bf16) is None  # already so
    assert wire_dtype(["bfloat16"], [_spec("float32"), _spec("bfloat16")]) is None  # one tensor is not wider
    assert wire_dtype(["bfloat16"], [_spec("int64")]) is None  # nothing floating to narrow


def test_a_bf16_actor_receives_bf16_weights_from_an_fp32_master_and_half_the_bytes() -> None:
    """The publisher asks for the cast (``weights(dtype)``) and sends what the engine would have rounded to anyway;
    an actor that does not say what it serves gets the master dtype."""
    master = {"w": torch.randn(2048) / 3, "steps": torch.arange(8)}

    def weights(dtype: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in master.items():
            yield name, t.to(dtype) if dtype is not None and t.is_floating_point() else t

    def manifest(dtype: torch.dtype | None) -> list[TensorSpec]:
        return [TensorSpec(name, dtype_name(t.dtype), tuple(t.shape)) for name, t in weights(dtype)]

    out: dict[str, tuple[dict[str, float], list[torch.Tensor]]] = {}
    said: dict[str, list[bytes]] = {}
    for served in (torch.bfloat16, None):
        coord = _Coordinator(["a"])
        pub = _publisher(coord, timeout_s=10.0)
        assert isinstance(pub.ctx, _Ctx)
        said[str(served)] = pub.ctx.said
        received: list[torch.Tensor] = []
        try:
            actor = _receiving_actor(coord, "a", [1], [], served=served, received=received)
            time.sleep(0.2)
            metrics = pub.publish(1, weights, manifest)
            actor.join(10.0)
        finally:
            pub.close()
        out[str(served)] = (metrics, received)
    (m16, (w16, steps16)), (m32, (w32, steps32)) = out["torch.bfloat16"], out["None"]
    assert w16.dtype is torch.bfloat16 and torch.equal(w16, master["w"].to(torch.bfloat16))
    assert w32.dtype is torch.float32 and torch.equal(w32, master["w"])
    assert steps16.dtype is steps32.dtype is torch.int64 and torch.equal(steps16, master["steps"])
    assert (m16["sync/wire_bits"], m32["sync/wire_bits"]) == (16.0, 32.0)
    assert m32["sync/bytes"] - m16["sync/bytes"] >= 2048 * 2  # the floating tensor's bytes, halved
    # the other learner ranks are told the dtype: their gathers are collectives with rank 0's, in that dtype
    assert said == {"torch.bfloat16": [b"bfloat16"], "None": [b"="]}


@pytest.mark.parametrize(
    ("said", "gathered"), [(b"bfloat16", [torch.bfloat16]), (b"float16", [torch.float16]), (b"=", [None]), (b"-", [])]
)
def test_the_other_ranks_gather_in_the_dtype_rank_0_sends_or_not_at_all(
    said: bytes, gathered: list[torch.dtype | None]
) -> None:
    """A rank other than 0 walks the whole gather in the dtype rank 0 announced ("=": as stored; "-": no one to send
    to, no gather), and reports nothing (rank 0 owns the metrics)."""
    ws = WeightSyncConfig(backend="gloo", timeout_s=5.0, join_timeout_s=JOIN_S)
    pub = WeightPublisher.from_config(ws, _OtherRank(said), None, adapter=None, served_check_tolerance=1e-3)
    asked: list[torch.dtype | None] = []
    walked: list[str] = []

    def weights(dtype: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor]]:
        asked.append(dtype)
        for name in ("a", "b"):
            walked.append(name)
            yield name, torch.zeros(2)

    assert pub.publish(3, weights) == {}
    assert asked == gathered
    assert walked == (["a", "b"] if gathered else [])


def test_silent_and_unready_actors_cost_at_most_one_join_deadline() -> None:
    coord = _Coordinator(["good", "silent", "stuck"])
    pub = _publisher(coord, timeout_s=10.0)
    try:
        announce_at(
            "127.0.0.1", pub.port, "stuck", "stuck-1", timeout_s=30.0
        )  # announces itself, then never gets ready
        got: list[float] = []
        actor = _receiving_actor(coord, "good", [1, 2], got)
        time.sleep(0.2)  # let "good" announce itself
        t0 = time.monotonic()
        first = pub.publish(1, lambda _dtype: _weights(1))
        first_s = time.monotonic() - t0
        assert coord.current().candidates == ("good", "stuck")  # "silent" never announced: never invited
        assert first["sync/actors"] == 1.0 and first["sync/left_out"] == 1.0
        assert JOIN_S <= first["sync/join_seconds"] < JOIN_S + 2.0 and first_s < JOIN_S + 5.0
        assert len(coord.waits) == 1 and JOIN_S <= coord.waits[0] < JOIN_S + 2.0  # told it waits for the roster
        assert not pub.needs_refresh()  # "stuck" is not invited again on its old announcement
        t0 = time.monotonic()
        second = pub.publish(2, lambda _dtype: _weights(2))
        assert time.monotonic() - t0 < JOIN_S  # the same members: no new epoch, no waiting
        assert "sync/join_seconds" not in second and second["sync/epoch"] == first["sync/epoch"] == 0.0
        assert len(coord.waits) == 1  # no roster, no wait
        actor.join(timeout=10.0)
        assert got == [1.0, 2.0]
        assert coord.confirmed == [(1, ["good"]), (2, ["good"])]
        announce_at(
            "127.0.0.1", pub.port, "stuck", "stuck-2", timeout_s=30.0
        )  # a fresh announcement: worth another invitation
        assert pub.needs_refresh()
    finally:
        pub.close()


def test_an_invited_actor_presumed_dead_before_it_is_ready_is_not_waited_for(caplog) -> None:
    """An actor invited to an epoch dies before it is ready (killed mid-episode, in the multi-turn e2e run): once the
    coordinator presumes it dead the epoch forms without it, instead of after the whole join timeout."""
    coord = _Coordinator(["dying", "good"])
    pub = _publisher(coord, timeout_s=10.0, join_timeout_s=30.0)
    try:
        announce_at("127.0.0.1", pub.port, "dying", "dying-1", timeout_s=30.0)  # announces itself, then dies
        got: list[float] = []
        actor = _receiving_actor(coord, "good", [1], got)
        time.sleep(0.2)  # let "good" announce itself
        presumed_dead = threading.Timer(1.0, lambda: setattr(coord, "live", ["good"]))
        presumed_dead.start()
        t0 = time.monotonic()
        metrics = pub.publish(1, lambda _dtype: _weights(1))
        elapsed = time.monotonic() - t0
        presumed_dead.join()
        assert coord.current().candidates == ("dying", "good")  # it was invited
        assert metrics["sync/actors"] == 1.0 and metrics["sync/left_out"] == 1.0
        assert 1.0 <= metrics["sync/join_seconds"] < 10.0 and elapsed < 10.0  # not the 30 s join timeout
        assert "actor dying was not ready for weight-sync epoch 0 before it was presumed dead" in caplog.text
        actor.join(timeout=10.0)
        assert got == [1.0] and coord.confirmed == [(1, ["good"])]
    finally:
        pub.close()


def test_a_member_that_disappears_is_dropped_at_the_next_epoch() -> None:
    coord = _Coordinator(["a", "b"])
    pub = _publisher(coord, timeout_s=10.0)
    try:
        got_a: list[float] = []
        got_b: list[float] = []
        ta = _receiving_actor(coord, "a", [1], got_a)
        tb = _receiving_actor(coord, "b", [1], got_b)
        time.sleep(0.2)
        assert pub.publish(1, lambda _dtype: _weights(1))["sync/actors"] == 2.0
        ta.join(10.0)
        tb.join(10.0)
        assert got_a == got_b == [1.0]
        coord.live = ["a"]  # "b" presumed dead by the coordinator; "a" left its group too (thread ended)
        got_a2: list[float] = []
        announce_at("127.0.0.1", pub.port, "a", "token-2", timeout_s=30.0)
        coord.plan = msgspec.structs.replace(coord.current(), candidates=())
        ta2 = _receiving_actor(coord, "a", [2], got_a2)
        metrics = pub.publish(2, lambda _dtype: _weights(2))
        ta2.join(10.0)
        assert coord.current().candidates == ("a",) and metrics["sync/epoch"] == 1.0 and metrics["sync/actors"] == 1.0
        assert got_a2 == [2.0] and coord.confirmed[-1] == (2, ["a"])
    finally:
        pub.close()


def test_a_transfer_to_a_member_presumed_dead_is_abandoned_without_waiting_for_the_timeout() -> None:
    coord = _Coordinator(["frozen"])
    pub = _publisher(coord, timeout_s=30.0)
    joined = threading.Event()

    def frozen() -> None:  # joins, then never reads the broadcast (a SIGSTOPped actor)
        plan = coord.current()
        announce_at(plan.host, plan.port, "frozen", "token-1", timeout_s=30.0)
        while "frozen" not in coord.current().candidates:
            time.sleep(0.01)
        group = join_epoch(JoinInfo(plan=coord.current(), member="frozen"))
        joined.set()
        time.sleep(8.0)
        group.close()

    threading.Thread(target=frozen, daemon=True).start()
    time.sleep(0.2)
    big = torch.zeros(16 * 2**20)  # 64 MiB: more than the sockets buffer, so the sender blocks on the frozen reader

    def presume_dead() -> None:
        joined.wait(10.0)
        time.sleep(1.0)
        coord.live = []

    threading.Thread(target=presume_dead, daemon=True).start()
    try:
        t0 = time.monotonic()
        metrics = pub.publish(1, lambda _dtype: iter([("w", big)]))
        elapsed = time.monotonic() - t0
        assert metrics["sync/failures"] == 1.0 and coord.confirmed == []  # nothing confirmed: it was not received
        assert 1.0 <= elapsed < 6.0  # abandoned once the member was presumed dead, not after the 30 s timeout
        assert pub.group is not None and pub.group.broken
        metrics = pub.publish(2, lambda _dtype: _weights(2))
        assert metrics["sync/actors"] == 0.0  # re-formed without it: nobody to wait on
    finally:
        pub.close()


def test_an_epoch_formed_before_this_process_was_ready_is_refused_at_once() -> None:
    """A restarted actor (same id) that sees the plan of an epoch its killed process was a member of: the roster names
    its id, but the group is the old process's. Waiting on it would hold the new process past the next epoch's
    roster; it is refused at once instead (and announces itself again)."""
    import pytest

    from async_rl.weight_sync.errors import WeightSyncError
    from async_rl.weight_sync.group import create_store
    from async_rl.weight_sync.membership import LeftOut, await_roster, collect_roster

    store = create_store("127.0.0.1", 0, is_master=True, timeout_s=10)
    first: list[object] = []  # what the first process's wait returned (or raised)

    def first_process() -> None:
        try:
            # its own client, as an actor process has (one TCPStore client is not safe to share between threads)
            client = create_store("127.0.0.1", store.port, is_master=False, timeout_s=10)
            first.append(await_roster(client, 0, "actor-1", 30.0))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            first.append(exc)

    ready = threading.Thread(target=first_process)
    ready.start()  # the first process: ready for epoch 0, then a member
    roster = collect_roster(store, 0, ["actor-1"], 30.0)
    ready.join(timeout=30)
    assert roster.members == ["actor-1"] and roster.served == {"actor-1": ""}  # it said no dtype
    assert len(first) == 1 and not isinstance(first[0], Exception), first  # the first process got the roster
    started = time.monotonic()
    with pytest.raises(LeftOut, match="epoch 0 was formed before actor actor-1 was ready"):
        await_roster(store, 0, "actor-1", 5.0)  # the restarted process, late for epoch 0
    assert time.monotonic() - started < 1.0
    assert issubclass(LeftOut, WeightSyncError)
