"""The coordinator: a background thread beside learner rank 0 that owns the ROUTER socket and the prompt ledger.

Actors join (Hello -> Welcome), ask for work with credits (WorkRequest), receive leased prompts (WorkGrant), deliver
groups (RolloutGroup -> GroupAck) and exchange heartbeats. The learner, in the same process, calls the thread-safe
API: `get_groups`, `mark_trained`, `set_policy_version`, `state_dict`/`load_state_dict`, `metrics`, `close`, and for
validation rounds (transport.evaluation) `start_eval`, `wait_eval`, `finish_eval`. Eval work is served before training
work (except the groups a learner blocked in `get_groups` still lacks), to actors whose loaded version is the round's,
within their credit, and never enters the ledger or admission.

Only the coordinator thread touches the ROUTER. Learner calls mutate shared state under one lock and wake the
thread through an inproc PAIR socket. Bad input never raises out of the loop: it is counted by reason and dropped.
A delivered group is checked against its grant (transport.validation) before it is accepted; an invalid one is acked
"invalid" and its prompt granted again, and an actor with ``max_invalid_groups`` of them is quarantined. With group
filtering (transport.filtering, DAPO dynamic sampling) a valid training group whose metric is constant is acked
"accepted" but settled in the ledger as filtered instead of buffered, and another prompt is granted in its place.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec

from async_rl import metric_catalog as mc
from async_rl.config.algorithm import FilterGroupsConfig
from async_rl.config.async_training import AsyncTrainingConfig
from async_rl.staleness import staleness
from async_rl.transport import admission as adm
from async_rl.transport.actors import ActorRegistry, ActorState, ActorStatus
from async_rl.transport.codec import WireCodec, WireLimits
from async_rl.transport.coordinator_io import RouterIO
from async_rl.transport.evaluation import EvalLease, EvalResult, EvalRound
from async_rl.transport.filtering import FilterBudgetExceeded, GroupFilter
from async_rl.transport.ledger import Lease, Ledger
from async_rl.transport.metrics import TransportMetrics
from async_rl.transport.prompts import PromptRecord, PromptSource
from async_rl.transport.protocol import (
    AckEntry,
    AckStatus,
    AnyMessage,
    Bye,
    GroupAck,
    GroupSampling,
    Heartbeat,
    Hello,
    Message,
    PromptGrant,
    RolloutGroup,
    VersionUpdate,
    WeightSyncPlan,
    Welcome,
    WorkRequest,
    checked,
    group_seed,
    pack_array,
)
from async_rl.transport.validation import InvalidReason, Quarantine, check_group

logger = logging.getLogger(__name__)

COORDINATOR_ID = "coordinator"
Outbox = list[tuple[bytes, Message]]
Grant = tuple[ActorState, list[Lease], int]  # an actor, its training leases, the oldest version they may start under
EvalGrant = tuple[ActorState, EvalRound, list[EvalLease]]
STATE_FORMAT = 1
SCAN_INTERVAL_S = 0.01  # liveness/lease scans at most this often (they are O(actors + leases))
WAITING_OFF_GRACE_S = 0.2
"""The actors hear that the learner stopped waiting once it has not waited again for this long: it polls get_groups
and wait_eval in slices (every 2 s), and the gap between two slices should not make lending actors give the cores
back and take them again. That it waits is told at once."""


class Coordinator:
    """Serves prompts to actors and rollout groups to the learner, exactly once, within the staleness bound."""

    def __init__(
        self,
        records: Sequence[PromptRecord],
        async_training: AsyncTrainingConfig,
        *,
        groups_per_step: int,
        sampling: GroupSampling | None = None,
        seed: int | None,
        shuffle_seed: int | None = None,
        max_epochs: int | None = None,
        initial_version: int = 0,
        limits: WireLimits | None = None,
        autostart: bool = True,
        vocab_size: int | None = None,
        trust_claimed_versions: bool = False,
        filter_groups: FilterGroupsConfig | None = None,
        teacher_required: bool = False,
    ) -> None:
        """``async_training``: the staleness bound, the stale policy and the rollout plane (``transport``).
        ``groups_per_step``: prompt groups the learner takes per step (``data.train_batch_size``); sizes admission.
        ``trust_claimed_versions``: grant on an actor's claimed loaded version alone, for planes tested or
        benchmarked without a weight sync. By default an actor's version counts only up to what the learner
        confirmed sending it (:meth:`confirm_weights`), starting from ``initial_version``.
        ``sampling``: how every training group is sampled; None: the config's defaults (``GroupSampling.defaults()``).
        ``filter_groups``: DAPO dynamic sampling of training groups (transport.filtering); None: off.
        ``teacher_required``: on-policy distillation; a training group whose completions lack the teacher's log-probs
        is invalid (``bad_teacher_logprobs``)."""
        self.teacher_required = teacher_required
        self.transport = async_training.transport
        self._regrant = async_training.stale_policy == "regrant"
        if vocab_size is not None and (
            isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1
        ):
            raise ValueError(f"vocab_size must be an int >= 1 or None, got {vocab_size!r}")
        self.vocab_size = vocab_size  # the learner's embedding rows; None: token ids are not checked
        if isinstance(initial_version, bool) or not isinstance(initial_version, int) or initial_version < 0:
            raise ValueError(f"initial_version must be an int >= 0, got {initial_version!r}")
        self.source = PromptSource(records, shuffle_seed=shuffle_seed, max_epochs=max_epochs)
        self.sampling = checked(sampling if sampling is not None else GroupSampling.defaults())
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be an int >= 0 or None, got {seed!r}")
        self.seed = seed
        self.codec = WireCodec(limits)
        self.k = async_training.max_staleness
        self.inflight_cap = adm.inflight_cap(
            self.transport.max_inflight_groups, max_staleness=self.k, groups_per_step=groups_per_step
        )
        self._version = initial_version
        self._weight_sync: WeightSyncPlan | None = None  # the publisher's latest plan (set_policy_version)
        self._ledger = Ledger(self.source.total)
        self._admission = adm.Admission(self.k, self.inflight_cap, groups_per_step)
        self._actors = ActorRegistry(
            self.transport.max_actors,
            self.transport.peer_timeout_s,
            None if trust_claimed_versions else initial_version,
        )
        self._metrics = TransportMetrics(self.k)
        self._quarantine = Quarantine(self.transport.max_invalid_groups)
        filter_groups = filter_groups if filter_groups is not None else FilterGroupsConfig()  # the config's: off
        if not isinstance(filter_groups, FilterGroupsConfig):
            raise ValueError(f"filter_groups must be a FilterGroupsConfig or None, got {type(filter_groups).__name__}")
        self._filter = GroupFilter(filter_groups, groups_per_step, self.sampling.n)
        if filter_groups.enable and not self._filter.active:
            logger.warning("group filtering is on but sampling.n == 1: a group of one completion is never filtered")
        self._fatal: FilterBudgetExceeded | None = None  # the run cannot go on: every get_groups raises it
        self._missing_metric_logged = False
        self._taken_staleness: dict[int, int] = {}
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._stopping = False
        self._failed: BaseException | None = None
        self._version_dirty = False
        self._granted_any = False
        self._notify_on_close = True
        self._last_scan = 0.0
        self._learner_wants = 0  # num_groups of a get_groups call currently waiting (0: none)
        self._learner_waiting = False  # blocked in get_groups, wait_eval or learner_waits (actors are told)
        self._waiting_since = 0.0  # when _learner_waiting last changed (monotonic)
        self._waiting_told = False  # ... as the actors were last told (a heartbeat goes out when the two differ)
        self._eval_version_told = -1  # the open round's version while it has prompts to grant, as last told
        self._eval: EvalRound | None = None  # the validation round being served (one at a time)
        self._next_eval_round = 0
        self._io = RouterIO(self.transport, self.codec)  # binds now: bad bind settings raise here
        self.port = self._io.port
        self.address = self._io.address  # tcp://host:port as bound (with host 0.0.0.0, actors use a real address)
        self._thread = threading.Thread(target=self._run, name="rollout-coordinator", daemon=True)
        self._started = False
        if autostart:
            self.start()

    # ---- lifecycle -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._started:
            raise RuntimeError("coordinator already started")
        self._started = True
        self._thread.start()

    def close(self, notify_actors: bool = True) -> None:
        """Stop the thread (telling live actors to shut down when ``notify_actors``), close sockets; idempotent."""
        with self._cv:
            if self._stopping:
                return
            self._stopping = True
            self._notify_on_close = notify_actors
            self._cv.notify_all()
        if self._started:
            self._io.wake()
            self._thread.join(timeout=10.0)
            if self._thread.is_alive():
                logger.error("coordinator thread did not stop within 10 s")
        else:
            self._io.close_router()
        self._io.close()

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- learner API ---------------------------------------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        with self._lock:
            return self._version

    def set_policy_version(self, version: int, weight_sync: WeightSyncPlan | None = None) -> None:
        """The learner finished a step and its weights are ``version``; stale buffered groups are dropped/re-granted.

        ``weight_sync`` (the publisher's plan for this version) rides on the VersionUpdate sent to every live actor
        and on later Welcomes; passing it with the current version re-announces the plan (new actors, new epoch).
        """
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValueError(f"version must be an int, got {version!r}")
        if weight_sync is not None and not isinstance(weight_sync, WeightSyncPlan):
            raise ValueError(f"weight_sync must be a WeightSyncPlan or None, got {type(weight_sync).__name__}")
        with self._cv:
            if version < self._version:
                raise ValueError(f"version must not decrease: {version} < current {self._version}")
            if version == self._version and weight_sync is None:
                return
            if weight_sync is not None:
                self._weight_sync = weight_sync
            self._version = version
            self._version_dirty = True
            self._purge_stale_locked()
            self._cv.notify_all()
        self._io.wake()

    def confirm_weights(self, version: int, actor_ids: list[str]) -> None:
        """The learner sent ``version`` to ``actor_ids``: they may now be granted work that needs it.

        Grants follow weights actually sent: an actor's claimed loaded version counts only up to this.
        """
        with self._lock:
            for actor_id in actor_ids:
                state = self._actors.get(actor_id)
                if state is not None:
                    state.confirmed_version = max(state.confirmed_version, version)
        self._io.wake()  # credit waiting for these weights can be served now

    def get_groups(self, num_groups: int, timeout_s: float | None) -> list[RolloutGroup]:
        """Block until ``num_groups`` groups within the staleness bound are buffered and return them.

        Groups come oldest generation version first. Raises TimeoutError after ``timeout_s`` (None: no limit; the
        buffer is left untouched). When the data is exhausted and nothing is outstanding, returns what is left (maybe
        fewer, or []). Raises `FilterBudgetExceeded` once group filtering used up ``max_num_gen_batches`` for a step.
        """
        if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
            raise ValueError(f"num_groups must be an int >= 1, got {num_groups!r}")
        if num_groups > self.inflight_cap:
            raise ValueError(f"num_groups={num_groups} exceeds the admission cap {self.inflight_cap}")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cv:
            while True:
                if self._failed is not None:
                    raise RuntimeError("coordinator thread failed") from self._failed
                if self._fatal is not None:
                    self._learner_wants = 0
                    raise FilterBudgetExceeded(str(self._fatal))
                if self._stopping:
                    raise RuntimeError("coordinator is closed")
                self._purge_stale_locked()
                led = self._ledger
                if len(led.received) >= num_groups or self._nothing_coming_locked():
                    self._learner_wants = 0
                    taken = led.take(num_groups)
                    self._filter.on_take(len(taken))
                    for buf in taken:
                        lag = staleness(self._version, buf.version)
                        assert 0 <= lag <= self.k, "a group over the staleness bound reached the learner"
                        self._taken_staleness[buf.group.prompt_id] = lag
                    return [buf.group for buf in taken]
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    self._learner_wants = 0
                    raise TimeoutError(
                        f"only {len(led.received)} of {num_groups} groups buffered after {timeout_s} s "
                        f"(leased={len(led.leases)}, actors alive={len(self._actors.alive())})"
                    )
                self._learner_wants = num_groups
                self._wait_locked(remaining)

    def mark_trained(self, prompt_ids: Sequence[int]) -> None:
        """Record that the groups of ``prompt_ids`` (from get_groups) were trained; they are never served again."""
        with self._cv:
            self._ledger.mark_trained(prompt_ids)
            for pid in prompt_ids:
                self._metrics.record_staleness(self._taken_staleness.pop(pid))
            self._metrics.count("trained", len(prompt_ids))
            self._admission.on_trained(self._version)
        self._io.wake()

    def start_eval(self, version: int, records: Sequence[PromptRecord], sampling: GroupSampling) -> int:
        """Start a validation round of ``records`` under exactly policy ``version`` (already published to the actors);
        returns its round id. One round at a time: the previous one must have been finished with `finish_eval`."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"version must be an int >= 0, got {version!r}")
        sampling = checked(sampling)
        for i, rec in enumerate(records):
            if not isinstance(rec, PromptRecord):
                raise ValueError(f"records[{i}] must be a PromptRecord, got {type(rec).__name__}")
        with self._cv:
            if version > self._version:
                raise ValueError(f"cannot evaluate version {version}: the newest published version is {self._version}")
            if self._eval is not None:
                raise RuntimeError(f"eval round {self._eval.round_id} is still open; call finish_eval first")
            round_id = self._next_eval_round
            self._next_eval_round += 1
            self._eval = EvalRound(round_id, version, records, sampling, time.monotonic())
            self._metrics.count("eval/rounds")
        self._io.wake()
        logger.info("eval round %d: %d prompts under policy version %d", round_id, len(records), version)
        return round_id

    def wait_eval(self, round_id: int, timeout_s: float | None) -> bool:
        """Block until round ``round_id`` is complete (True) or ``timeout_s`` passed (False); 0 polls."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cv:
            while True:
                if self._failed is not None:
                    raise RuntimeError("coordinator thread failed") from self._failed
                rnd = self._eval_round_locked(round_id)
                if rnd.complete:
                    return True
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                if self._stopping:
                    raise RuntimeError("coordinator is closed")
                self._wait_locked(remaining)

    @contextlib.contextmanager
    def learner_waits(self) -> Iterator[None]:
        """Around a learner wait for the actors other than get_groups and wait_eval (the weight sync's roster of
        actors joining an epoch): they are told it waits, as there, and may lend it cores."""
        with self._cv:
            self._set_learner_waiting_locked(True)
        try:
            yield
        finally:
            with self._cv:
                self._set_learner_waiting_locked(False)

    def _wait_locked(self, timeout_s: float | None) -> None:
        """The learner's thread blocks on the condition; the actors are told it waits (they may lend it cores)."""
        self._set_learner_waiting_locked(True)
        try:
            self._cv.wait(timeout=timeout_s)
        finally:
            self._set_learner_waiting_locked(False)

    def _set_learner_waiting_locked(self, waiting: bool) -> None:
        if waiting != self._learner_waiting:
            self._learner_waiting = waiting
            self._waiting_since = time.monotonic()
            if waiting:
                self._io.wake()  # told at once; its end waits WAITING_OFF_GRACE_S for the thread's next tick

    def _waiting_to_tell_locked(self, now: float) -> bool:
        """What the actors should hear now: a wait at once, its end after WAITING_OFF_GRACE_S without a new one."""
        if self._learner_waiting or now - self._waiting_since >= WAITING_OFF_GRACE_S:
            return self._learner_waiting
        return self._waiting_told

    def finish_eval(self, round_id: int) -> EvalResult:
        """Close round ``round_id`` (complete or not) and return its results; later deliveries are dropped."""
        with self._cv:
            rnd = self._eval_round_locked(round_id)
            self._eval = None
            return rnd.close(time.monotonic())

    def _eval_round_locked(self, round_id: int) -> EvalRound:
        if self._eval is None or self._eval.round_id != round_id:
            raise ValueError(f"eval round {round_id} is not open")
        return self._eval

    def metrics(self) -> dict[str, float | int]:
        with self._lock:
            led = self._ledger
            epoch, position = self.source.cursor(led.next_prompt_id)
            gauges: dict[str, float | int] = {
                mc.TRANSPORT_QUEUE_DEPTH: len(led.received),
                mc.TRANSPORT_LEASED: len(led.leases),
                mc.TRANSPORT_TAKEN: len(led.taken),
                mc.TRANSPORT_REGRANT_QUEUE: len(led.regrant),
                mc.TRANSPORT_IN_FLIGHT: led.in_flight,
                mc.TRANSPORT_INFLIGHT_CAP: self._admission.cap,
                mc.TRANSPORT_ACTORS_ALIVE: len(self._actors.alive()),
                **_loaded_versions([a.loaded_version for a in self._actors.alive()]),
                mc.TRANSPORT_POLICY_VERSION: self._version,
                mc.TRANSPORT_TRAINED_TOTAL: led.trained_total,
                mc.TRANSPORT_DROPPED_TOTAL: led.dropped_total,
                mc.TRANSPORT_DATA_EPOCH: epoch,
                mc.TRANSPORT_DATA_POSITION: position,
                mc.TRANSPORT_EVAL_OPEN_PROMPTS: 0 if self._eval is None else self._eval.open_count,
                mc.TRANSPORT_ACTORS_QUARANTINED: len(self._quarantine),
                **self._filter.metrics(led.trained_total, led.grants_settled, led.filtered_total),
            }
            decode_errors, send_failures = self._io.stats()
            return self._metrics.snapshot(gauges, decode_errors, send_failures)

    def live_actor_ids(self) -> list[str]:
        """Ids of the actors currently presumed alive, sorted (the weight-sync membership)."""
        with self._lock:
            return sorted(s.actor_id for s in self._actors.alive() if s.actor_id not in self._quarantine)

    def actors(self) -> dict[str, ActorStatus]:
        now = time.monotonic()
        with self._lock:
            return {
                actor_id: ActorStatus(
                    s.alive, s.loaded_version, len(self._ledger.actor_leases(actor_id)), s.credit, now - s.last_seen
                )
                for actor_id, s in self._actors.items()
            }

    def check_invariants(self) -> None:
        with self._lock:
            self._ledger.check_invariants()

    # ---- persistence ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain data (no pickle): ledger, version, admission gate and counters; see Ledger.state_dict."""
        with self._lock:
            return {
                "format": STATE_FORMAT,
                "num_records": len(self.source),
                "shuffle_seed": self.source.shuffle_seed,
                "policy_version": self._version,
                "ledger": self._ledger.state_dict(self.codec),
                "admission": self._admission.state_dict(),
                "filter": self._filter.state_dict(taken_outstanding=bool(self._ledger.taken)),
                "counters": dict(self._metrics.counters),
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore before any work is granted (construct with autostart=False, or before actors ask)."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"coordinator state must be a dict with format={STATE_FORMAT}")
        if state.get("num_records") != len(self.source) or state.get("shuffle_seed") != self.source.shuffle_seed:
            raise ValueError(
                f"state was saved for num_records={state.get('num_records')}, shuffle_seed={state.get('shuffle_seed')}"
                f" but this dataset has {len(self.source)}, {self.source.shuffle_seed}: the data cursor would not match"
            )
        ledger = Ledger.from_state_dict(state["ledger"], self.codec)
        if ledger.total != self.source.total:
            raise ValueError(f"state ledger total {ledger.total} != this dataset's total {self.source.total}")
        version = state.get("policy_version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"state policy_version must be an int >= 0, got {version!r}")
        with self._cv:
            if self._granted_any:
                raise ValueError("load_state_dict must be called before any work is granted (use autostart=False)")
            self._ledger = ledger
            self._version = max(self._version, version)
            self._admission.load_state_dict(state.get("admission", {}))
            if state.get("filter") is not None:  # absent in states saved before group filtering existed
                self._filter.load_state_dict(state["filter"])
            self._metrics.counters.update({str(k): int(v) for k, v in state.get("counters", {}).items()})
            self._purge_stale_locked()
            self._cv.notify_all()

    # ---- shared-state helpers (caller holds the lock) --------------------------------------------------------------
    def _nothing_coming_locked(self) -> bool:
        led = self._ledger
        return led.exhausted and not led.leases and not led.regrant

    def _learner_can_proceed_locked(self) -> bool:
        """Whether waking a learner blocked in get_groups is worth it (avoids a wake-up per received group)."""
        want = self._learner_wants
        return want > 0 and (len(self._ledger.received) >= want or self._nothing_coming_locked())

    def _purge_stale_locked(self) -> None:
        stale = self._ledger.purge_stale(self._version, self.k, self._regrant)
        if stale:
            self._metrics.drops[mc.TRANSPORT_DROPS_STALE] += len(stale)

    # ---- the coordinator thread ----------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # a bug, not bad input: make the learner see it instead of hanging
            logger.exception("coordinator thread crashed")
            with self._cv:
                self._failed = exc
                self._cv.notify_all()
        finally:
            notify = self._notify_on_close and self._failed is None
            try:
                if notify:
                    with self._lock:
                        live = [a.rid for a in self._actors.alive()]
                    for rid in live:
                        self._io.send_shutdown(rid, "coordinator closed")
            finally:
                self._io.close_router()

    def _loop(self) -> None:
        hb = self.transport.heartbeat_interval_s
        tick_ms = max(5, int(min(hb / 4, 0.05) * 1000))
        while True:
            frames_batch = self._io.poll(tick_ms)
            with self._lock:
                if self._stopping:
                    return
            now = time.monotonic()
            decoded = [d for d in (self._io.decode_frames(frames) for frames in frames_batch) if d is not None]
            out: Outbox = []
            with self._cv:
                acks: dict[bytes, list[AckEntry]] = {}
                for rid, msg, nbytes in decoded:
                    self._handle_locked(rid, msg, nbytes, now, out, acks)
                out.extend((rid, GroupAck(acks=entries)) for rid, entries in acks.items())
                dead = self._housekeeping_locked(now, out)
                urgent, eval_grants, grants = self._serve_locked(now)
                if self._learner_can_proceed_locked():
                    self._cv.notify_all()
            self._io.flush_retries()
            for dest, reply in out:
                self._io.send(dest, reply, retry=not isinstance(reply, Heartbeat))
            for rid in dead:
                self._io.forget_peer(rid)
            for actor, leases, min_version in urgent:
                self._send_grants(actor, leases, min_version)
            for actor, rnd, eval_leases in eval_grants:
                self._send_eval_grants(actor, rnd, eval_leases)
            for actor, leases, min_version in grants:
                self._send_grants(actor, leases, min_version)

    def _ensure_actor_locked(self, actor_id: str, loaded_version: int, now: float, out: Outbox) -> ActorState | None:
        state = self._actors.get(actor_id)
        if state is not None and state.alive:
            state.last_seen = now
            return state
        return self._register_locked(actor_id, loaded_version, now, out)

    def _register_locked(self, actor_id: str, loaded_version: int, now: float, out: Outbox) -> ActorState | None:
        existing = self._actors.get(actor_id)
        if existing is not None and existing.alive:
            self._expire_locked(self._ledger.expire_actor(actor_id), "rejoined")
            self._expire_eval_locked(actor_id)
        state = self._actors.register(actor_id, loaded_version, now)
        if state is None:
            self._metrics.count("rejected_actors")
            return None
        out.append((state.rid, self._welcome_locked()))
        logger.info("actor %s joined (loaded version %d)", actor_id, loaded_version)
        return state

    def _welcome_locked(self) -> Welcome:
        t = self.transport
        return Welcome(
            policy_version=self._version,
            min_version=adm.min_start_version(self._version, self.k),
            max_staleness=self.k,
            heartbeat_interval_s=t.heartbeat_interval_s,
            peer_timeout_s=t.peer_timeout_s,
            lease_timeout_s=t.lease_timeout_s,
            max_message_bytes=t.max_message_bytes,
            weight_sync=self._weight_sync,
        )

    def _handle_locked(
        self, rid: bytes, msg: AnyMessage, nbytes: int, now: float, out: Outbox, acks: dict[bytes, list[AckEntry]]
    ) -> None:
        actor_id = rid.decode("ascii")
        if isinstance(msg, Hello):
            self._register_locked(actor_id, msg.loaded_version, now, out)
            return
        if isinstance(msg, Bye):
            state = self._actors.get(actor_id)
            if state is not None and state.alive:
                self._actors.mark_gone(state, now)
                self._expire_locked(self._ledger.expire_actor(actor_id), "left")
                self._expire_eval_locked(actor_id)
                logger.info("actor %s left", actor_id)
            return
        loaded = msg.loaded_version if isinstance(msg, WorkRequest) else self._version
        if isinstance(msg, Heartbeat):
            loaded = msg.policy_version
        state = self._ensure_actor_locked(actor_id, loaded, now, out)
        if state is None:
            return
        if isinstance(msg, WorkRequest):
            state.loaded_version = msg.loaded_version
            state.set_credit(msg.max_groups, msg.grants_seen)
            if actor_id in self._quarantine:
                state.credit = 0
            if state.credit > 0 and self._allowance_locked(state.loaded_version) == 0:
                self._metrics.count("credit_waits")
        elif isinstance(msg, Heartbeat):
            state.loaded_version = msg.policy_version
            if msg.stats:
                self._metrics.record_actor_report(state.reported, msg.stats)
                state.reported = dict(msg.stats)
        elif isinstance(msg, RolloutGroup):
            if actor_id in self._quarantine:
                self._metrics.drops[mc.TRANSPORT_DROPS_QUARANTINED] += 1
                status: AckStatus = "invalid"
            elif msg.eval_round >= 0:
                status = self._deliver_eval_locked(msg, now)
            else:
                status = self._deliver_locked(msg, nbytes)
            if status == "invalid" and actor_id not in self._quarantine:
                self._strike_locked(actor_id)
            acks.setdefault(rid, []).append(AckEntry(msg.prompt_id, msg.lease_id, status, msg.eval_round))

    def _deliver_eval_locked(self, group: RolloutGroup, now: float) -> AckStatus:
        """An eval group goes to its round (never to the ledger); one for a round already closed is counted late."""
        rnd = self._eval
        if rnd is None or rnd.round_id != group.eval_round:
            self._metrics.count("eval/late" if group.eval_round < self._next_eval_round else "eval/unknown")
            return "unknown"
        # versions are the round's to judge: anything but exactly its version is "stale" and granted again
        reason = check_group(
            group,
            rnd.sampling,
            policy_version=None,
            max_response_length=rnd.sampling.max_tokens,
            vocab_size=self.vocab_size,
        )
        if reason is not None and rnd.reject(group.prompt_id, group.lease_id):
            return self._invalid_locked(group, reason)
        verdict = rnd.deliver(group.prompt_id, group.lease_id, group.completions, now)
        if verdict == "stale":
            self._metrics.count("eval/wrong_version")
        elif verdict != "accepted":
            self._metrics.count("eval/duplicates" if verdict == "duplicate" else "eval/unknown")
        elif rnd.complete:
            logger.info("eval round %d complete (%d prompts)", rnd.round_id, len(rnd.records))
            self._cv.notify_all()
        return verdict

    def _deliver_locked(self, group: RolloutGroup, nbytes: int) -> AckStatus:
        verdict = self._ledger.check_delivery(group.prompt_id, group.lease_id)
        if verdict == "unknown":
            self._metrics.count("unknown_groups")
            return "unknown"
        if verdict == "duplicate":
            self._metrics.count("duplicates")
            return "duplicate"
        min_version = self._ledger.leases[group.prompt_id].min_version if verdict == "ok" else None
        reason = check_group(
            group,
            self.sampling,
            policy_version=self._version,
            max_response_length=self.sampling.max_tokens,
            min_version=min_version,
            vocab_size=self.vocab_size,
            required_component=self._filter.required_component,
            teacher_required=self.teacher_required,
        )
        if reason is not None:
            self._ledger.reject_invalid(group.prompt_id)
            return self._invalid_locked(group, reason)
        if verdict == "late":
            self._metrics.count("late_accepted")
        version = group.version
        if not adm.within_bound(self._version, version, self.k):
            self._metrics.drops[mc.TRANSPORT_DROPS_STALE] += 1
            self._ledger.reject_stale(group.prompt_id, regrant=self._regrant)
            return "stale"
        self._metrics.groups.add()
        self._metrics.bytes.add(nbytes)
        self._metrics.record_span(group.newest_version - version)
        if self._filter.should_filter(group):  # received fine, but no signal: settled, a new prompt takes its slot
            self._ledger.filter(group.prompt_id)
            self._filter.on_filtered(len(self._ledger.received))
        else:
            self._ledger.accept(group, nbytes, version)
        self._check_filter_budget_locked()
        return "accepted"

    def _check_filter_budget_locked(self) -> None:
        """Stop the run (every later get_groups raises) once a step cannot fill within max_num_gen_batches."""
        if self._fatal is not None or self._ledger.exhausted:
            return
        why = self._filter.budget_error(len(self._ledger.received))
        if why is None:
            return
        logger.error("%s", why)
        self._fatal = FilterBudgetExceeded(why)
        self._cv.notify_all()

    def _invalid_locked(self, group: RolloutGroup, reason: InvalidReason) -> AckStatus:
        """Count a group that failed validation (its prompt is already back to be granted again)."""
        self._metrics.drops[mc.transport_drops_invalid_reason_key(reason)] += 1
        logger.warning("rejected rollout group of prompt %d from %s: %s", group.prompt_id, group.actor_id, reason)
        if reason == "missing_filter_metric" and not self._missing_metric_logged:
            self._missing_metric_logged = True
            carried = sorted({k for c in group.completions for k in (c.reward_components or {})})
            logger.warning(
                "group filtering reads the reward component %r (algorithm.filter_groups.metric), but a group came "
                "without it; its completions carry %s (use 'reward' for the scalar reward)",
                self._filter.required_component,
                carried or "no reward components",
            )
        return "invalid"

    def _strike_locked(self, actor_id: str) -> None:
        """One more invalid group from ``actor_id``; the last one allowed quarantines it and releases its leases."""
        if not self._quarantine.record(actor_id):
            return
        logger.warning(
            "actor %s quarantined after %d invalid rollout groups: it gets no more work or weights, its groups are "
            "refused",
            actor_id,
            self._quarantine.max_invalid,
        )
        state = self._actors.get(actor_id)
        if state is not None:
            state.credit = 0
        self._expire_locked(self._ledger.expire_actor(actor_id), f"actor {actor_id} quarantined")
        self._expire_eval_locked(actor_id)

    def _expire_locked(self, leases: list[Lease], why: str) -> None:
        if leases:
            self._metrics.count("lease_expiries", len(leases))
            logger.info("%d lease(s) expired (%s): prompts %s", len(leases), why, [x.prompt_id for x in leases][:8])

    def _housekeeping_locked(self, now: float, out: Outbox) -> list[bytes]:
        """Liveness, lease expiry, version broadcast and heartbeats; returns routing ids of actors now dead.

        The scans (dead actors, due leases) run at most once per SCAN_INTERVAL_S, not per received message."""
        dead = []
        if now - self._last_scan >= SCAN_INTERVAL_S:
            self._last_scan = now
            dead = self._actors.newly_dead(now)
            for state in dead:
                logger.warning("actor %s silent > %.1f s: presumed dead", state.actor_id, self.transport.peer_timeout_s)
                self._metrics.count("actors_presumed_dead")
                self._expire_locked(self._ledger.expire_actor(state.actor_id), f"actor {state.actor_id} presumed dead")
                self._expire_eval_locked(state.actor_id)
            self._expire_locked(self._ledger.expire_due(now), "lease timeout")
            if self._eval is not None:
                self._metrics.count("eval/lease_expiries", len(self._eval.expire_due(now)))
                for s in self._actors.alive():
                    if s.loaded_version > self._eval.version:  # can never run its eval grants now
                        self._expire_eval_locked(s.actor_id)
            self._actors.forget_dead(now)
        if self._version_dirty:
            self._version_dirty = False
            update = VersionUpdate(
                policy_version=self._version,
                min_version=adm.min_start_version(self._version, self.k),
                weight_sync=self._weight_sync,
            )
            out.extend((s.rid, update) for s in self._actors.alive())
        eval_version = self._eval.version if self._eval is not None and self._eval.pending else -1
        waiting = self._waiting_to_tell_locked(now)
        told = waiting != self._waiting_told or eval_version != self._eval_version_told
        self._waiting_told, self._eval_version_told = waiting, eval_version
        for s in self._actors.alive():
            if told or now - s.last_heartbeat_sent >= self.transport.heartbeat_interval_s:
                s.last_heartbeat_sent = now
                beat = Heartbeat(
                    sender=COORDINATOR_ID,
                    policy_version=self._version,
                    learner_waiting=waiting,
                    eval_version=eval_version,
                )
                out.append((s.rid, beat))
        return [state.rid for state in dead]

    def _allowance_locked(self, loaded: int | None = None) -> int:
        led = self._ledger
        return self._admission.allowance(
            led.in_flight,
            self._version,
            queued=len(led.leases) + len(led.received),
            busy=bool(led.taken),
            loaded=loaded,
        )

    def _expire_eval_locked(self, actor_id: str) -> None:
        if self._eval is not None:
            self._metrics.count("eval/lease_expiries", len(self._eval.expire_actor(actor_id)))

    def _serve_locked(self, now: float) -> tuple[list[Grant], list[EvalGrant], list[Grant]]:
        """This tick's grants: validation work before training work, so that a round ends before the next publish has
        to wait for it; except the groups a learner blocked in ``get_groups`` still lacks (neither buffered nor
        leased), which go first, so that a round never idles the learner for the step it is waiting on (the round
        before training would otherwise delay step 1 by the whole round). Sent in the order returned."""
        led = self._ledger
        lacking = self._learner_wants - len(led.received) - len(led.leases)
        urgent = self._serve_credits_locked(now, limit=lacking) if lacking > 0 else []
        eval_grants = self._serve_eval_locked(now)
        return urgent, eval_grants, self._serve_credits_locked(now, limit=None)

    def _serve_eval_locked(self, now: float) -> list[EvalGrant]:
        """Lease the open round's pending prompts to actors on exactly its version, within their credit."""
        rnd = self._eval
        if rnd is None or not rnd.pending:
            return []
        deadline = now + self.transport.lease_timeout_s
        served = rnd.serve(self._actors.round_robin(), self.codec.limits.max_prompts_per_grant, deadline)
        self._metrics.count("eval/grants", sum(len(leases) for _, leases in served))
        return [(state, rnd, leases) for state, leases in served]

    def _serve_credits_locked(self, now: float, *, limit: int | None) -> list[Grant]:
        """Lease prompts (at most ``limit``; None: no limit) to actors with credit; each grant carries the oldest
        policy its prompts may start under."""
        led = self._ledger
        busy = bool(led.taken)
        grants: list[Grant] = []
        if self._fatal is not None or self._allowance_locked() <= 0:
            return grants
        left = sys.maxsize if limit is None else limit
        for state in self._actors.round_robin():
            if left <= 0:
                break
            if state.credit <= 0:
                continue
            allowance = self._allowance_locked(state.loaded_version)  # positions this actor's weights may start
            if allowance <= 0:
                continue
            count = min(state.credit, allowance, self.codec.limits.max_prompts_per_grant, left)
            position = len(led.leases) + len(led.received)
            leases = led.grant(state.actor_id, count, now + self.transport.lease_timeout_s)
            if not leases:
                break  # no data left
            state.credit -= len(leases)
            state.granted_total += len(leases)
            left -= len(leases)
            self._metrics.grants.add(len(leases))
            self._granted_any = True
            min_version = self._admission.min_version(self._version, position + len(leases) - 1, busy=busy)
            grants.append((state, leases, min_version))
        return grants

    def _prompt_grant(self, lease: Lease, min_version: int) -> PromptGrant:
        record = self.source.record(lease.prompt_id)
        sampling = self.sampling
        if self.seed is not None:
            sampling = msgspec.structs.replace(sampling, seed=group_seed(self.seed, lease.prompt_id, sampling.n))
        return PromptGrant(
            prompt_id=lease.prompt_id,
            lease_id=lease.lease_id,
            min_version=min_version,
            prompt_token_ids=pack_array(record.token_ids, "<i4"),
            sampling=sampling,
            extras=dict(record.extras),
        )

    def _send_grants(self, actor: ActorState, leases: list[Lease], min_version: int) -> None:
        """Encode and send; whatever cannot be sent goes back to the front of the re-grant queue."""
        with self._lock:
            version = self._version
            for lease in leases:
                lease.min_version = min_version  # deliveries are checked against it (transport.validation)
        prompts = [self._prompt_grant(lease, min_version) for lease in leases]
        unsent, too_big = self._io.send_grant(actor.rid, prompts, version)
        if not unsent and not too_big:
            return
        by_id = {lease.prompt_id: lease for lease in leases}
        with self._cv:
            for pid in too_big:
                logger.error("prompt %d can never fit in max_message_bytes: dropped", pid)
                self._metrics.drops[mc.TRANSPORT_DROPS_OVERSIZE] += 1
                self._ledger.drop_leased(pid)
            self._ledger.revoke([by_id[pid] for pid in unsent])
            actor.granted_total = max(0, actor.granted_total - len(unsent) - len(too_big))
            self._cv.notify_all()

    def _send_eval_grants(self, actor: ActorState, rnd: EvalRound, leases: list[EvalLease]) -> None:
        """Like `_send_grants` for an eval round: unsent prompts go back to the round's pending queue."""
        with self._lock:
            version = self._version
        prompts = [rnd.prompt_grant(lease) for lease in leases]
        unsent, too_big = self._io.send_grant(actor.rid, prompts, version)
        if not unsent and not too_big:
            return
        by_index = {lease.index: lease for lease in leases}
        with self._cv:
            for index in too_big:
                logger.error("eval prompt %d can never fit in max_message_bytes: left out of its round", index)
                rnd.drop(index)
            rnd.revoke([by_index[i] for i in unsent])
            actor.granted_total = max(0, actor.granted_total - len(unsent) - len(too_big))
            if rnd.complete:
                self._cv.notify_all()


def _loaded_versions(versions: list[int]) -> dict[str, float | int]:
    """The oldest and newest policy version (or LoRA adapter version) the live actors have loaded; none without one."""
    if not versions:
        return {}
    return {
        mc.TRANSPORT_ACTORS_LOADED_VERSION_MIN: min(versions),
        mc.TRANSPORT_ACTORS_LOADED_VERSION_MAX: max(versions),
    }
