"""Socket-side half of the coordinator: context, ZAP authenticator, ROUTER, wake-up pair, receive/decode/send.

Used only from the coordinator thread, except `wake()` (any thread) and `stats()` (any thread; counters are guarded
by their own lock). Nothing here raises on peer input: bad frames are counted by reason in a `BadMessageLog` that
warns once per sender per minute; failed sends are counted by reason and reported to the caller.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections import Counter, OrderedDict, deque

import zmq

from async_rl.config.async_training import TransportConfig
from async_rl.transport import sockets
from async_rl.transport.codec import MessageTooLarge, ProtocolError, WireCodec
from async_rl.transport.metrics import BadMessageLog
from async_rl.transport.protocol import (
    AnyMessage,
    Bye,
    Heartbeat,
    Hello,
    Message,
    PromptGrant,
    RolloutGroup,
    Shutdown,
    WorkGrant,
    WorkRequest,
)

logger = logging.getLogger(__name__)

MAX_BATCH = 256  # messages drained per loop iteration before housekeeping runs
_FROM_ACTORS = (Hello, WorkRequest, RolloutGroup, Heartbeat, Bye)


def _claimed_identity(msg: AnyMessage) -> str:
    if isinstance(msg, Heartbeat):
        return msg.sender
    assert isinstance(msg, Hello | WorkRequest | RolloutGroup | Bye)
    return msg.actor_id


class RouterIO:
    def __init__(self, transport: TransportConfig, codec: WireCodec) -> None:
        self.codec = codec
        self.max_bytes = transport.max_message_bytes
        keys = sockets.server_keys(transport)  # raises ValueError for a non-loopback bind without keys
        self.ctx = zmq.Context()
        self.auth = None
        self._stats_lock = threading.Lock()
        self.bad = BadMessageLog("message")
        self.send_failures: Counter[str] = Counter()
        try:
            if keys is not None:
                self.auth = sockets.start_authenticator(self.ctx, keys)
            self.router, self.port = sockets.bind_router(self.ctx, transport, keys)
        except Exception:
            if self.auth is not None:
                self.auth.stop()
            self.ctx.term()
            raise
        self.address = sockets.tcp_endpoint(transport.host, self.port)
        wake_addr = f"inproc://rollout-coordinator-wake-{id(self)}"
        self._wake_rx = self.ctx.socket(zmq.PAIR)
        self._wake_rx.bind(wake_addr)
        self._wake_tx = self.ctx.socket(zmq.PAIR)
        self._wake_tx.setsockopt(zmq.SNDHWM, 1)
        self._wake_tx.connect(wake_addr)
        self._wake_lock = threading.Lock()
        self._poller = zmq.Poller()
        self._poller.register(self.router, zmq.POLLIN)
        self._poller.register(self._wake_rx, zmq.POLLIN)
        self._router_closed = False
        # Control messages (acks, welcomes, version updates) that met a full peer pipe wait here, bounded in total,
        # and are retried each loop iteration; beyond the bound they are dropped and counted ("hwm").
        self._retry: OrderedDict[bytes, deque[bytes]] = OrderedDict()
        self._retry_count = 0
        self.max_retry = max(1024, 16 * transport.socket_hwm)

    # ---- any thread ----------------------------------------------------------------------------------------------
    def wake(self) -> None:
        with self._wake_lock:
            if self._wake_tx.closed:
                return
            try:
                self._wake_tx.send(b"", zmq.NOBLOCK)
            except zmq.Again:
                pass  # a wake-up is already pending

    def stats(self) -> tuple[dict[str, int], dict[str, int]]:
        """(decode errors by reason, send failures by reason), copied under the stats lock."""
        with self._stats_lock:
            return dict(self.bad.counts), dict(self.send_failures)

    # ---- coordinator thread --------------------------------------------------------------------------------------
    def poll(self, timeout_ms: int) -> list[list[zmq.Frame]]:
        events = dict(self._poller.poll(timeout_ms))
        if self._wake_rx in events:
            while True:
                try:
                    self._wake_rx.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
        batch: list[list[zmq.Frame]] = []
        if self.router in events:
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self.router.recv_multipart(zmq.NOBLOCK, copy=False))
                except zmq.Again:
                    break
        return batch

    def _bad(self, sender: bytes, reason: str, detail: str) -> None:
        with self._stats_lock:
            self.bad.record(sender.hex() if not sender.isascii() else sender.decode("ascii"), reason, detail)

    def decode_frames(self, frames: list[zmq.Frame]) -> tuple[bytes, AnyMessage, int] | None:
        """(routing id, message, payload bytes) for a valid actor message, else None (counted)."""
        rid = frames[0].bytes
        if len(frames) != 2:
            self._bad(rid, "frames", f"{len(frames) - 1} payload frames, expected 1")
            return None
        payload = frames[1].buffer
        try:
            msg = self.codec.decode(payload)
        except ProtocolError as exc:
            self._bad(rid, exc.reason, exc.detail)
            return None
        if not isinstance(msg, _FROM_ACTORS):
            self._bad(rid, "direction", f"{type(msg).__name__} is not sent by actors")
            return None
        claimed = _claimed_identity(msg)
        if not rid.isascii() or rid.decode("ascii") != claimed:
            self._bad(rid, "identity", f"message claims actor {claimed!r} but the connection's routing id differs")
            return None
        return rid, msg, len(payload)

    def _fail(self, reason: str) -> None:
        with self._stats_lock:
            self.send_failures[reason] += 1

    def _send_raw(self, rid: bytes, buf: bytes) -> bool:
        try:
            self.router.send_multipart([rid, buf], zmq.NOBLOCK, copy=len(buf) < (1 << 20))
            return True
        except zmq.Again:
            self._fail("hwm")
        except zmq.ZMQError as exc:
            self._fail("unroutable" if exc.errno == errno.EHOSTUNREACH else f"zmq_{exc.errno}")
        return False

    def send(self, rid: bytes, msg: Message, retry: bool = True) -> bool:
        """Send without blocking. With ``retry``, a message that meets a full pipe is queued (bounded) and retried
        by `flush_retries`, after earlier queued ones for that peer; otherwise it is dropped and counted."""
        try:
            buf = self.codec.encode_checked(msg, self.max_bytes)
        except MessageTooLarge as exc:
            logger.error("not sending to %r: %s", rid, exc)
            self._fail("oversize")
            return False
        queue = self._retry.get(rid)
        if queue is None:
            try:
                self.router.send_multipart([rid, buf], zmq.NOBLOCK)
                return True
            except zmq.Again:
                pass
            except zmq.ZMQError as exc:
                self._fail("unroutable" if exc.errno == errno.EHOSTUNREACH else f"zmq_{exc.errno}")
                return False
        if not retry or self._retry_count >= self.max_retry:
            self._fail("hwm")
            return False
        self._retry.setdefault(rid, deque()).append(buf)
        self._retry_count += 1
        return True

    def flush_retries(self) -> None:
        for rid in list(self._retry):
            queue = self._retry[rid]
            while queue:
                try:
                    self.router.send_multipart([rid, queue[0]], zmq.NOBLOCK)
                except zmq.Again:
                    break
                except zmq.ZMQError as exc:
                    self._fail("unroutable" if exc.errno == errno.EHOSTUNREACH else f"zmq_{exc.errno}")
                    self._fail_queued(len(queue))
                    queue.clear()
                    break
                queue.popleft()
                self._retry_count -= 1
            if not queue:
                del self._retry[rid]

    def forget_peer(self, rid: bytes) -> None:
        """Drop queued retries for a peer presumed dead (they are counted as failed sends)."""
        queue = self._retry.pop(rid, None)
        if queue:
            self._fail_queued(len(queue))

    def _fail_queued(self, n: int) -> None:
        self._retry_count -= n
        with self._stats_lock:
            self.send_failures["dropped_queued"] += n

    def send_grant(self, rid: bytes, prompts: list[PromptGrant], version: int) -> tuple[list[int], list[int]]:
        """Send prompts in as few WorkGrants as fit; returns (prompt ids not sent, prompt ids that can never fit)."""
        unsent: list[int] = []
        too_big: list[int] = []
        stack = [prompts]
        while stack:
            chunk = stack.pop()
            ids = [p.prompt_id for p in chunk]
            if unsent:  # keep order: after one failure, do not send later prompts either
                unsent.extend(ids)
                continue
            buf = self.codec.encode(WorkGrant(prompts=chunk, policy_version=version))
            if len(buf) > self.max_bytes:
                if len(chunk) == 1:
                    self._fail("oversize")
                    too_big.extend(ids)
                else:
                    half = len(chunk) // 2
                    stack.extend([chunk[half:], chunk[:half]])
                continue
            if not self._send_raw(rid, buf):
                unsent.extend(ids)
        return unsent, too_big

    def send_shutdown(self, rid: bytes, reason: str) -> None:
        self.send(rid, Shutdown(reason=reason), retry=False)

    def close_router(self) -> None:
        """Close the sockets the coordinator thread uses (called by that thread on exit, or if never started)."""
        if not self._router_closed:
            self._router_closed = True
            self.router.close(linger=200)
            self._wake_rx.close(linger=0)

    def close(self) -> None:
        with self._wake_lock:
            self._wake_tx.close(linger=0)
        if self.auth is not None:
            self.auth.stop()
        if self._router_closed:
            self.ctx.term()
        else:
            logger.error("coordinator sockets still open at close; leaving the zmq context to the garbage collector")
