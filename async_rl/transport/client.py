"""The actor side of the rollout plane: `RolloutClient`, one DEALER socket driven by the actor's own loop.

Typical loop (see tests/transport/fake_actor.py)::

    client = RolloutClient("tcp://127.0.0.1:5555", "actor-0", cfg.async_training.transport)
    welcome = client.hello(loaded_version=0)
    while not client.shutdown_requested:
        for grant in client.request_work(max_groups=free_slots, loaded_version=v, timeout_s=0.1):
            ... generate grant.sampling.n completions, calling client.poll() now and then ...
            client.send_group(group)          # never blocks; tracked until acked; re-sent after ack_timeout_s
        client.poll()                         # also hands queued groups to the socket as backpressure allows

Before starting a grant the actor must have loaded a policy of version >= ``grant.min_version`` (learner version - K
at grant time); ``client.policy_version`` / ``client.min_version`` track the latest announced versions.

Not thread-safe: use it from one thread, and call `poll()` (or any other method) at least every
heartbeat_interval_s, or the coordinator presumes the actor dead and re-grants its prompts. If generation blocks
longer, run it in a worker thread and keep polling here. No call blocks for longer than its ``timeout_s``; in
particular `send_group` never waits on backpressure (a slow coordinator): it queues the group, hands the queue to the
socket as far as the socket takes it, and later `poll()` calls send the rest, in order, while heartbeats, acks and
version updates keep flowing (`flush` waits for the queue, for callers that want to). That matters in an asyncio
actor, where a blocking send would stall the engine's output handling too. Finished groups are kept until acked and
re-sent after ack_timeout_s or a reconnect (the coordinator dedups), so nothing is lost in flight; when the
coordinator is silent for peer_timeout_s the client reconnects, says Hello again and re-sends.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass

import zmq

from async_rl import metric_catalog as mc
from async_rl.config.async_training import TransportConfig
from async_rl.transport import sockets
from async_rl.transport.codec import MessageTooLarge, ProtocolError, WireCodec, WireLimits
from async_rl.transport.metrics import BadMessageLog
from async_rl.transport.protocol import (
    Bye,
    GroupAck,
    Heartbeat,
    Hello,
    Message,
    PromptGrant,
    RolloutGroup,
    Shutdown,
    VersionUpdate,
    WeightSyncPlan,
    Welcome,
    WorkGrant,
    WorkRequest,
)

logger = logging.getLogger(__name__)

ZERO_COPY_MIN_BYTES = 1 << 20  # below this, a memcpy is cheaper than pyzmq's zero-copy bookkeeping
_ACTOR_ID = re.compile(r"^[!-~]{1,128}$")


GroupKey = tuple[int, int, int]  # (eval round, prompt id, lease id): eval rounds number their leases on their own


@dataclass
class _Unacked:
    group: RolloutGroup  # kept as the object, re-encoded on the rare re-send (saves a copy per group)
    sent_at: float | None  # None: queued, not handed to the socket since it was queued or since the last reconnect
    buf: bytes | None = None  # the encoding for its first send, dropped once the socket took it
    blocked: bool = False  # backpressure held it back at least once (counted once in send_blocked)


class RolloutClient:
    """One actor's connection to the coordinator (see the module docstring for the loop and the guarantees)."""

    def __init__(
        self,
        address: str,
        actor_id: str,
        transport: TransportConfig,
        *,
        ack_timeout_s: float = 5.0,
        max_unacked: int = 4096,
        limits: WireLimits | None = None,
    ) -> None:
        if not isinstance(actor_id, str) or not _ACTOR_ID.match(actor_id) or actor_id == "coordinator":
            raise ValueError(f"actor_id must be 1-128 printable ASCII chars without spaces, got {actor_id!r}")
        if not isinstance(address, str) or not address.startswith("tcp://"):
            raise ValueError(f"address must look like tcp://host:port, got {address!r}")
        if ack_timeout_s <= 0:
            raise ValueError(f"ack_timeout_s must be > 0, got {ack_timeout_s}")
        _check_version("max_unacked", max_unacked)
        if max_unacked < 1:
            raise ValueError(f"max_unacked must be >= 1, got {max_unacked}")
        self.address = address
        self.actor_id = actor_id
        self.transport = transport
        self.ack_timeout_s = ack_timeout_s
        self.max_unacked = max_unacked
        self.codec = WireCodec(limits)
        self._keys = sockets.client_keys(transport)
        self.max_message_bytes = transport.max_message_bytes
        self.heartbeat_interval_s = transport.heartbeat_interval_s
        self.peer_timeout_s = transport.peer_timeout_s
        self.welcome: Welcome | None = None
        self.policy_version = 0
        self.min_version = 0
        self.loaded_version = 0
        self.weight_sync: WeightSyncPlan | None = None  # the learner's latest plan (Welcome, VersionUpdate)
        # the learner blocked waiting for the actors (the coordinator's heartbeats; None until the first one)
        self.learner_waiting: bool | None = None
        self.eval_version = -1  # the open round's version while it has prompts to grant (the coordinator's heartbeats)
        self.shutdown_requested = False
        self.version_updates = 0
        self.counters: Counter[str] = Counter()  # transport/client/{counter}
        self.acks: Counter[str] = Counter()  # acks received, by status
        self.bad = BadMessageLog("message from the coordinator")
        self._grants_seen = 0
        self._pending: deque[PromptGrant] = deque()
        self._sends_since_receive = 0
        self._unacked: OrderedDict[GroupKey, _Unacked] = OrderedDict()
        self._queue: deque[GroupKey] = deque()  # groups waiting for the socket, in the order they were queued
        self._last_request: tuple[int, int, int] | None = None
        self._last_request_t = 0.0
        now = time.monotonic()
        self._last_recv = now
        self._last_sent = now
        self._welcomes = 0
        # Cumulative counters the owner keeps up to date (transport.metrics.ACTOR_REPORT_KEYS); sent on a Heartbeat
        # every report_interval_s even while other traffic keeps plain heartbeats unnecessary.
        self.report: dict[str, float] = {}
        self.report_interval_s = min(1.0, self.heartbeat_interval_s)
        self._last_report = now
        self.ctx = zmq.Context()
        self._sock = sockets.connect_dealer(self.ctx, address, actor_id, transport, self._keys)

    # ---- public API ----------------------------------------------------------------------------------------------
    def hello(self, loaded_version: int = 0, timeout_s: float = 10.0) -> Welcome:
        """Join the plane; returns the Welcome (policy version, weight-sync info). Raises TimeoutError."""
        _check_version("loaded_version", loaded_version)
        self.loaded_version = loaded_version
        before = self._welcomes
        self._send(Hello(actor_id=self.actor_id, loaded_version=loaded_version))
        deadline = time.monotonic() + timeout_s
        while self._welcomes == before:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no Welcome from {self.address} within {timeout_s} s")
            self.poll(min(remaining, 0.05))
        assert self.welcome is not None
        return self.welcome

    @property
    def queued_grants(self) -> tuple[PromptGrant, ...]:
        """Grants received and not yet handed out by :meth:`request_work`."""
        return tuple(self._pending)

    def request_work(self, max_groups: int, loaded_version: int, timeout_s: float = 0.0) -> list[PromptGrant]:
        """Offer credit for ``max_groups`` more groups; return the grants received within ``timeout_s`` (maybe [])."""
        if isinstance(max_groups, bool) or not isinstance(max_groups, int) or max_groups < 0:
            raise ValueError(f"max_groups must be an int >= 0, got {max_groups!r}")
        _check_version("loaded_version", loaded_version)
        self.loaded_version = loaded_version
        key = (max_groups, loaded_version, self._grants_seen)
        now = time.monotonic()
        if key != self._last_request or now - self._last_request_t >= self.heartbeat_interval_s:
            req = WorkRequest(
                actor_id=self.actor_id,
                max_groups=max_groups,
                loaded_version=loaded_version,
                grants_seen=self._grants_seen,
            )
            if self._send(req):
                self._last_request, self._last_request_t = key, now
        deadline = now + timeout_s
        self.poll(0.0)
        while not self._pending and max_groups > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.poll(min(remaining, 0.05))
        out = list(self._pending)
        self._pending.clear()
        return out

    def send_group(self, group: RolloutGroup) -> None:
        """Queue a finished group, tracked until acked, and hand the queue to the socket as far as it takes it now.

        Never blocks: under backpressure (the coordinator is not keeping up) the rest goes out from later `poll()`
        calls, in the order the groups were queued. Raises MessageTooLarge (nothing tracked) when the group cannot
        fit, and RuntimeError when ``max_unacked`` groups already await acks.
        """
        buf = self._encode_group(group)
        if len(self._unacked) >= self.max_unacked:
            raise RuntimeError(f"{len(self._unacked)} groups await acks (max_unacked); is the coordinator alive?")
        self._sends_since_receive += 1
        if self._sends_since_receive >= 16:  # take in acks now and then, so a fast sender never lets them pile up
            self._receive(0.0)
        key = (group.eval_round, group.prompt_id, group.lease_id)
        self._unacked[key] = _Unacked(group, None, buf)
        self._queue.append(key)
        self.counters["groups_sent"] += 1
        self._send_queued()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Poll until the socket took every queued group (they may still await acks); False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.backlog:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            self.poll(0.05 if remaining is None else min(remaining, 0.05))
        return True

    def _encode_group(self, group: RolloutGroup) -> bytes:
        try:
            return self.codec.encode_checked(group, self.max_message_bytes)
        except MessageTooLarge:
            self.counters["oversize"] += 1
            raise

    def poll(self, timeout_s: float = 0.0) -> None:
        """Process incoming messages, send a heartbeat when due, send queued groups and re-send unacked ones, detect a
        lost coordinator. Waits at most ``timeout_s`` for a message (less when queued groups can go out)."""
        self._receive(timeout_s, want_out=bool(self._queue))
        now = time.monotonic()
        if self.welcome is not None and now - self._last_recv > self.peer_timeout_s:
            self._receive(0.1)  # grace: after a long stall of this process, zmq's I/O thread may lag a moment
            now = time.monotonic()
            if now - self._last_recv > self.peer_timeout_s:
                self._reconnect(now)
        report_due = bool(self.report) and now - self._last_report >= self.report_interval_s
        if report_due or now - self._last_sent >= self.heartbeat_interval_s:
            # Before the queued groups: under backpressure the heartbeat takes the next free slot. Until it gets one
            # it stays due, and is tried again at every poll.
            if self._send(Heartbeat(sender=self.actor_id, policy_version=self.loaded_version, stats=dict(self.report))):
                self._last_report = now
        if self._send_queued():
            self._resend_due(now)

    def wait_acked(self, timeout_s: float) -> bool:
        """Poll until every sent group is acked; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._unacked:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.poll(min(remaining, 0.05))
        return True

    @property
    def unacked(self) -> int:
        return len(self._unacked)

    @property
    def backlog(self) -> int:
        """Groups queued but not yet taken by the socket (backpressure); they go out from `poll()`."""
        return sum(1 for entry in self._unacked.values() if entry.sent_at is None)

    def metrics(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {mc.transport_client_counter_key(k): v for k, v in self.counters.items()}
        for status, value in self.acks.items():
            out[mc.transport_client_acks_status_key(status)] = value
        for reason, value in self.bad.counts.items():
            out[mc.transport_client_decode_errors_reason_key(reason)] = value
        out[mc.TRANSPORT_CLIENT_UNACKED] = len(self._unacked)
        out[mc.TRANSPORT_CLIENT_BACKLOG] = self.backlog
        out[mc.TRANSPORT_CLIENT_PENDING_GRANTS] = len(self._pending)
        return out

    def close(self, linger_s: float = 0.5) -> None:
        """Say Bye (best effort), close the socket and the context. Unacked groups are abandoned (their leases
        expire and the prompts are re-granted)."""
        if self._sock.closed:
            return
        try:
            self._sock.send(self.codec.encode(Bye(actor_id=self.actor_id)), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        self._sock.close(linger=int(linger_s * 1000))
        self.ctx.term()

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals -----------------------------------------------------------------------------------------------
    def _try_send(self, buf: bytes) -> bool:
        try:
            self._sock.send(buf, zmq.NOBLOCK, copy=len(buf) < ZERO_COPY_MIN_BYTES)
        except zmq.Again:
            return False
        self._last_sent = time.monotonic()
        return True

    def _send(self, msg: Message) -> bool:
        """Send a small control message without blocking; False when backpressure defers it (it is re-sent later)."""
        ok = self._try_send(self.codec.encode_checked(msg, self.max_message_bytes))
        if not ok:
            self.counters["control_deferred"] += 1
        return ok

    def _send_queued(self) -> bool:
        """Hand queued groups to the socket, oldest first, until it refuses one; True when the queue is empty."""
        while self._queue:
            entry = self._unacked.get(self._queue[0])
            if entry is not None and entry.sent_at is None:
                buf = entry.buf if entry.buf is not None else self._encode_group(entry.group)
                if not self._try_send(buf):
                    if not entry.blocked:
                        entry.blocked = True
                        self.counters["send_blocked"] += 1  # backpressure: the coordinator is not keeping up
                    return False
                entry.sent_at, entry.buf = time.monotonic(), None
            self._queue.popleft()  # sent now, or acked meanwhile
        return True

    def _resend_due(self, now: float) -> None:
        """Re-send the groups whose ack is overdue (the queue is empty: every tracked group was sent once)."""
        for key, entry in self._unacked.items():
            if entry.sent_at is None or now - entry.sent_at < self.ack_timeout_s:
                continue
            if not self._try_send(self._encode_group(entry.group)):
                self.counters["send_blocked"] += 1
                return
            self.counters["groups_resent"] += 1
            entry.sent_at = now
            logger.debug("re-sent group %s", key)

    def _receive(self, timeout_s: float, want_out: bool = False) -> None:
        self._sends_since_receive = 0
        if timeout_s <= 0:  # cheap check without building a poller (send_group calls this for every group)
            events = self._sock.getsockopt(zmq.EVENTS)
            assert isinstance(events, int)
            if not events & zmq.POLLIN:
                return
        else:
            flags = zmq.POLLIN | (zmq.POLLOUT if want_out else 0)
            if self._sock.poll(int(timeout_s * 1000), flags) & zmq.POLLIN == 0:
                return
        for _ in range(1024):
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(frames) != 1:
                self.bad.record("coordinator", "frames", f"{len(frames)} frames")
                continue
            try:
                msg = self.codec.decode(frames[0].buffer)
            except ProtocolError as exc:
                self.bad.record("coordinator", exc.reason, exc.detail)
                continue
            self._last_recv = time.monotonic()
            self._handle(msg)

    def _handle(self, msg: Message) -> None:
        if isinstance(msg, WorkGrant):
            self._grants_seen += len(msg.prompts)
            self._pending.extend(msg.prompts)
            self.policy_version = max(self.policy_version, msg.policy_version)
        elif isinstance(msg, GroupAck):
            for ack in msg.acks:
                if self._unacked.pop((ack.eval_round, ack.prompt_id, ack.lease_id), None) is None:
                    self.counters["stray_acks"] += 1
                else:
                    self.acks[ack.status] += 1
        elif isinstance(msg, Heartbeat):
            self.policy_version = max(self.policy_version, msg.policy_version)
            self.learner_waiting = msg.learner_waiting
            self.eval_version = msg.eval_version
        elif isinstance(msg, VersionUpdate):
            self.policy_version = max(self.policy_version, msg.policy_version)
            self.min_version = max(self.min_version, msg.min_version)
            if msg.weight_sync is not None:
                self.weight_sync = msg.weight_sync
            self.version_updates += 1
        elif isinstance(msg, Welcome):
            self._on_welcome(msg)
        elif isinstance(msg, Shutdown):
            logger.info("coordinator asked %s to shut down: %s", self.actor_id, msg.reason)
            self.shutdown_requested = True
        else:
            self.bad.record("coordinator", "direction", f"{type(msg).__name__} is not sent by the coordinator")

    def _on_welcome(self, msg: Welcome) -> None:
        self.welcome = msg
        self._welcomes += 1
        self._grants_seen = 0  # the coordinator restarted its count for us
        self._last_request = None
        self.policy_version = max(self.policy_version, msg.policy_version)
        self.min_version = max(self.min_version, msg.min_version)
        self.heartbeat_interval_s = msg.heartbeat_interval_s
        self.peer_timeout_s = msg.peer_timeout_s
        self.max_message_bytes = min(self.transport.max_message_bytes, msg.max_message_bytes)
        self.weight_sync = msg.weight_sync
        self._requeue_unacked()  # (re)joined: re-send what is still unacked right away
        if self._welcomes > 1:
            self.counters["rejoins"] += 1

    def _reconnect(self, now: float) -> None:
        logger.warning(
            "%s: coordinator silent for %.1f s; reconnecting to %s", self.actor_id, now - self._last_recv, self.address
        )
        self.counters["reconnects"] += 1
        self._sock.close(linger=0)
        self._sock = sockets.connect_dealer(self.ctx, self.address, self.actor_id, self.transport, self._keys)
        self._last_recv = now
        self._last_request = None
        self._requeue_unacked()
        self._send(Hello(actor_id=self.actor_id, loaded_version=self.loaded_version))

    def _requeue_unacked(self) -> None:
        """A new connection: every unacked group goes out again, in its original order."""
        for entry in self._unacked.values():
            entry.sent_at = None
        self._queue = deque(self._unacked)


def _check_version(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
