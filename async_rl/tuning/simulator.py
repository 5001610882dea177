"""A discrete-event simulator of the asynchronous pipeline, driven by measured rates (pure Python, no torch).

What it models, event by event (a ``heapq`` of timed events; same seed, same result):

* **Actors.** Each has a throughput curve: aggregate generated tokens/s as a function of the sequences in flight
  (piecewise-linear through measurements, through the origin below the first point, flat past the last). The
  sequences in flight share it equally (processor sharing), so a sequence of ``L`` tokens finishes once every
  running sequence has received ``L`` tokens of service. An actor keeps up to ``max_concurrent_groups`` groups of
  ``n`` completions running; a group is delivered when its longest completion finishes, and its version is the
  policy the actor had loaded when it started (``update_mode=inflight`` keeps running requests across updates).
* **Coordinator.** Grants use :class:`async_rl.transport.admission.Admission` itself (the look-ahead to the
  train-time version, the flat cap, the per-actor loaded version), round-robin over actors with free slots, as
  ``Coordinator._serve_credits_locked`` does. A delivered group over the bound is dropped (or re-granted: either way
  its work is lost); buffered groups over the bound are purged when the version advances.
* **Learner.** Waits for ``B`` groups, takes them oldest version first, trains for
  ``fixed_s + tokens / tokens_per_s``, marks them trained, then publishes: the version advances and, every
  ``sync_every`` steps, a weight broadcast of ``sync_s`` seconds runs during which the learner and every actor are
  busy with it (actors pause generation; the learner pays it on its path), as in ``learner_main``.
* **Shared compute (optional).** When actors and learner share the same cores (the CPU validation machine), each
  slows the other while both compute: ``SharedCompute`` multiplies actor rates while the learner trains and the
  learner's progress while any actor generates.

Outputs (:class:`SimResult`) are measured after ``warmup_steps``: steps/s, trained tokens/s, learner and actor idle
fractions, mean staleness and drop rate.
"""

from __future__ import annotations

import bisect
import heapq
import random
from dataclasses import dataclass, field
from typing import Literal

from async_rl.transport.admission import Admission, inflight_cap, within_bound

EPS = 1e-12


@dataclass(frozen=True)
class Curve:
    """y(x) piecewise-linear through measured points; through (0, 0) below the first point, flat past the last."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.xs or len(self.xs) != len(self.ys):
            raise ValueError(f"curve needs matching, non-empty xs and ys, got {len(self.xs)} and {len(self.ys)}")
        if any(b <= a for a, b in zip(self.xs, self.xs[1:], strict=False)) or self.xs[0] <= 0:
            raise ValueError(f"curve xs must be positive and strictly increasing, got {self.xs}")
        if any(y <= 0 for y in self.ys):
            raise ValueError(f"curve ys must be positive, got {self.ys}")

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= 0:
            return 0.0
        if x <= xs[0]:
            return ys[0] * x / xs[0]
        if x >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, x)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    def scaled(self, factor: float) -> Curve:
        return Curve(self.xs, tuple(y * factor for y in self.ys))


@dataclass(frozen=True)
class Workload:
    """One prompt group: ``group_size`` completions whose lengths are drawn from ``response_lengths``."""

    group_size: int
    response_lengths: tuple[int, ...]
    prompt_len: float = 0.0  # mean prompt tokens per sequence; counted in the tokens the learner trains on

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if not self.response_lengths or min(self.response_lengths) < 1:
            raise ValueError("response_lengths must be a non-empty sample of lengths >= 1")


@dataclass(frozen=True)
class LearnerModel:
    """Step time ``fixed_s + tokens / tokens_per_s`` (prompt + response tokens of the step's sequences)."""

    fixed_s: float
    tokens_per_s: float

    def __post_init__(self) -> None:
        if self.fixed_s < 0 or self.tokens_per_s <= 0:
            raise ValueError(f"need fixed_s >= 0 and tokens_per_s > 0, got {self.fixed_s}, {self.tokens_per_s}")

    def step_s(self, tokens: float) -> float:
        return self.fixed_s + tokens / self.tokens_per_s


@dataclass(frozen=True)
class SharedCompute:
    """Mutual slow-down when actors and the learner compute on the same cores at the same time."""

    generation_factor: float = 1.0  # actor tokens/s multiplier while the learner trains
    train_factor: float = 1.0  # learner progress multiplier while any actor generates


@dataclass(frozen=True)
class SimConfig:
    """A deployment to simulate."""

    workload: Workload
    actor_curve: Curve  # tokens/s of one actor vs sequences in flight
    learner: LearnerModel
    num_actors: int
    max_concurrent_groups: int  # per actor
    groups_per_step: int  # B = data.train_batch_size
    max_staleness: int  # K
    inflight_cap: int | None = None  # None: (K + 1) x B, as the coordinator (admission.inflight_cap)
    stale_policy: Literal["drop", "regrant"] = "drop"
    sync_s: float = 0.0  # one weight broadcast, learner and actors both blocked
    sync_every: int = 1
    steps: int = 40
    warmup_steps: int = 5
    seed: int = 0
    shared: SharedCompute | None = None

    def __post_init__(self) -> None:
        for name in ("num_actors", "max_concurrent_groups", "groups_per_step", "sync_every", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_staleness < 0 or self.sync_s < 0 or not 0 <= self.warmup_steps < self.steps:
            raise ValueError("need max_staleness >= 0, sync_s >= 0 and 0 <= warmup_steps < steps")

    @property
    def cap(self) -> int:
        return inflight_cap(self.inflight_cap, max_staleness=self.max_staleness, groups_per_step=self.groups_per_step)


@dataclass(frozen=True)
class SimResult:
    steps_per_s: float
    trained_tokens_per_s: float
    generated_tokens_per_s: float
    learner_idle_fraction: float  # waiting for groups
    learner_sync_fraction: float  # broadcasting weights
    actor_idle_fraction: float  # nothing in flight or paused for an update, averaged over actors
    mean_staleness: float
    drop_rate: float  # dropped / (dropped + trained) groups
    sim_seconds: float

    @property
    def step_s(self) -> float:
        return 1.0 / self.steps_per_s if self.steps_per_s > 0 else float("inf")


@dataclass
class _Group:
    version: int
    remaining: int
    tokens: int = 0  # prompt + response tokens (what the learner trains on)
    generated: int = 0


@dataclass
class _Actor:
    index: int
    loaded: int = 0
    paused: bool = False
    service: float = 0.0  # tokens each running sequence has received so far (processor sharing)
    updated_at: float = 0.0
    rate: float = 0.0  # current tokens/s per running sequence
    finishes: list[tuple[float, int, int]] = field(default_factory=list)  # (service at finish, seq id, group id)
    groups: int = 0  # groups running
    token: int = 0  # invalidates scheduled completion events
    idle_since: float | None = 0.0
    idle_s: float = 0.0


class Simulator:
    """Runs one :class:`SimConfig` to ``steps`` learner steps; see the module docstring for the model."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.now = 0.0
        self._events: list[tuple[float, int, str, int, int]] = []
        self._seq = 0
        self.actors = [_Actor(i) for i in range(cfg.num_actors)]
        self._rr = 0
        self.admission = Admission(cfg.max_staleness, cfg.cap, cfg.groups_per_step)
        self.version = 0
        self.leased = 0
        self.received: list[tuple[int, int, _Group]] = []  # (version, arrival, group)
        self._arrivals = 0
        self.groups: dict[int, _Group] = {}
        self._next_group = 0
        # learner
        self.taken: list[_Group] = []
        self.state = "wait"  # wait | train | sync
        self.train_left = 0.0  # seconds of full-speed training left
        self.train_updated = 0.0
        self.train_token = 0
        self.steps_done = 0
        self.wait_s = self.sync_time_s = 0.0
        self._wait_since: float | None = 0.0
        # window accounting (after warm-up)
        self.window_start = 0.0
        self._marks: dict[str, float] = {}
        self.trained_groups = self.dropped = 0
        self.trained_tokens = self.generated_tokens = 0
        self.staleness_sum = 0

    # ---- event queue -------------------------------------------------------------------------------------------
    def _push(self, at: float, kind: str, who: int, token: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at, self._seq, kind, who, token))

    # ---- shared-compute factors --------------------------------------------------------------------------------
    def _learner_training(self) -> bool:
        return self.state == "train"

    def _any_generating(self) -> bool:
        return any(a.finishes and not a.paused for a in self.actors)

    def _gen_factor(self) -> float:
        s = self.cfg.shared
        return s.generation_factor if s is not None and self._learner_training() else 1.0

    def _train_factor(self) -> float:
        s = self.cfg.shared
        return s.train_factor if s is not None and self._any_generating() else 1.0

    # ---- actors ------------------------------------------------------------------------------------------------
    def _advance(self, a: _Actor) -> None:
        a.service += a.rate * (self.now - a.updated_at)
        a.updated_at = self.now

    def _reschedule(self, a: _Actor) -> None:
        """Recompute the per-sequence rate and schedule the next completion (after ``_advance``)."""
        m = len(a.finishes)
        a.token += 1
        a.rate = 0.0 if a.paused or m == 0 else self.cfg.actor_curve(m) * self._gen_factor() / m
        if a.rate > 0:
            self._push(self.now + max(0.0, a.finishes[0][0] - a.service) / a.rate, "seq", a.index, a.token)
        idle = a.paused or m == 0
        if idle and a.idle_since is None:
            a.idle_since = self.now
        elif not idle and a.idle_since is not None:
            a.idle_s += self.now - max(a.idle_since, self.window_start)
            a.idle_since = None

    def _rates_changed(self) -> None:
        """Something that scales rates changed (learner state, an actor's activity): re-time everything."""
        if self.cfg.shared is None:
            return
        for a in self.actors:
            self._advance(a)
            self._reschedule(a)
        self._retime_learner()

    def _start_group(self, a: _Actor) -> None:
        w = self.cfg.workload
        gid = self._next_group
        self._next_group += 1
        group = _Group(version=a.loaded, remaining=w.group_size)
        for _ in range(w.group_size):
            length = self.rng.choice(w.response_lengths)
            group.tokens += length + round(w.prompt_len)
            group.generated += length
            self._seq += 1
            heapq.heappush(a.finishes, (a.service + length, self._seq, gid))
        self.groups[gid] = group
        a.groups += 1

    def _on_sequence(self, a: _Actor) -> None:
        self._advance(a)
        shared = self.cfg.shared is not None
        was_active = shared and self._any_generating()
        if a.finishes:  # this event was timed for the head sequence: it is done, whatever rounding says
            a.service = max(a.service, a.finishes[0][0])
        tolerance = EPS * max(1.0, a.service)
        while a.finishes and a.finishes[0][0] <= a.service + tolerance:
            _, _, gid = heapq.heappop(a.finishes)
            group = self.groups[gid]
            group.remaining -= 1
            if group.remaining == 0:
                del self.groups[gid]
                a.groups -= 1
                self._deliver(group)
        self._reschedule(a)
        if shared and was_active != self._any_generating():
            self._rates_changed()
        self._serve()
        self._try_take()

    # ---- coordinator -------------------------------------------------------------------------------------------
    def _in_flight(self) -> int:
        return self.leased + len(self.received) + len(self.taken)

    def _deliver(self, group: _Group) -> None:
        self.leased -= 1
        if self.steps_done >= self.cfg.warmup_steps:
            self.generated_tokens += group.generated
        if not within_bound(self.version, group.version, self.cfg.max_staleness):
            self._count_drop(1)
            return
        self._arrivals += 1
        self.received.append((group.version, self._arrivals, group))

    def _count_drop(self, count: int) -> None:
        if self.steps_done >= self.cfg.warmup_steps:
            self.dropped += count

    def _allowance(self, loaded: int | None = None) -> int:
        return self.admission.allowance(
            self._in_flight(),
            self.version,
            queued=self.leased + len(self.received),
            busy=bool(self.taken),
            loaded=loaded,
        )

    def _serve(self) -> None:
        if self._allowance() <= 0:
            return
        n = len(self.actors)
        shared = self.cfg.shared is not None
        started_any = False
        for k in range(n):
            a = self.actors[(self._rr + k) % n]
            credit = self.cfg.max_concurrent_groups - a.groups
            if a.paused or credit <= 0:
                continue
            count = min(credit, self._allowance(a.loaded))
            if count <= 0:
                continue
            was_active = shared and self._any_generating()
            self._advance(a)
            for _ in range(count):
                self._start_group(a)
            self.leased += count
            self._reschedule(a)
            started_any = started_any or (shared and was_active != self._any_generating())
        self._rr = (self._rr + 1) % n
        if started_any:
            self._rates_changed()

    # ---- learner -----------------------------------------------------------------------------------------------
    def _retime_learner(self) -> None:
        if self.state != "train":
            return
        self.train_left -= (self.now - self.train_updated) * self._train_rate
        self.train_updated = self.now
        self._train_rate = self._train_factor()
        self.train_token += 1
        self._push(self.now + max(0.0, self.train_left) / self._train_rate, "train", 0, self.train_token)

    _train_rate = 1.0

    def _try_take(self) -> None:
        b = self.cfg.groups_per_step
        if self.state != "wait" or len(self.received) < b or self.steps_done >= self.cfg.steps:
            return
        self.received.sort(key=lambda x: (x[0], x[1]))
        chosen, self.received = self.received[:b], self.received[b:]
        self.taken = [g for _, _, g in chosen]
        if self._wait_since is not None:
            self.wait_s += self.now - max(self._wait_since, self.window_start)
            self._wait_since = None
        if self.steps_done >= self.cfg.warmup_steps:
            self.staleness_sum += sum(self.version - g.version for g in self.taken)
        self.state = "train"
        self.train_left = self.cfg.learner.step_s(sum(g.tokens for g in self.taken))
        self.train_updated = self.now
        self._train_rate = self._train_factor()
        self.train_token += 1
        self._push(self.now + self.train_left / self._train_rate, "train", 0, self.train_token)
        self._rates_changed()  # actors slow down while the learner trains (shared compute)

    def _on_trained(self) -> None:
        if self.steps_done >= self.cfg.warmup_steps:
            self.trained_groups += len(self.taken)
            self.trained_tokens += sum(g.tokens for g in self.taken)
        self.taken = []
        self.admission.on_trained(self.version)
        self.state = "publish"
        self._rates_changed()
        self._serve()  # the flat cap freed B slots (mark_trained happens before the publish)
        self.version += 1
        self._purge()
        if self.version % self.cfg.sync_every == 0 and self.cfg.sync_s > 0:
            self.state = "sync"
            for a in self.actors:
                self._advance(a)
                a.paused = True
                self._reschedule(a)
            self._sync_started = self.now
            self._push(self.now + self.cfg.sync_s, "sync", 0, 0)
        else:
            if self.version % self.cfg.sync_every == 0:
                for a in self.actors:
                    a.loaded = self.version
            self._end_step()

    def _on_synced(self) -> None:
        self.sync_time_s += self.now - max(self._sync_started, self.window_start)
        for a in self.actors:
            self._advance(a)
            a.paused = False
            a.loaded = self.version
            self._reschedule(a)
        self._end_step()

    _sync_started = 0.0

    def _purge(self) -> None:
        kept = [x for x in self.received if within_bound(self.version, x[0], self.cfg.max_staleness)]
        self._count_drop(len(self.received) - len(kept))
        self.received = kept

    def _end_step(self) -> None:
        self.steps_done += 1
        self.state = "wait"
        self._wait_since = self.now
        if self.steps_done == self.cfg.warmup_steps:
            self._open_window()
        self._rates_changed()
        self._serve()
        self._try_take()

    def _open_window(self) -> None:
        self.window_start = self.now
        self.wait_s = self.sync_time_s = 0.0
        for a in self.actors:
            a.idle_s = 0.0

    # ---- main loop ---------------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        if self.cfg.warmup_steps == 0:
            self._open_window()
        self._serve()
        while self.steps_done < self.cfg.steps:
            if not self._events:
                raise RuntimeError(
                    f"simulation stalled at step {self.steps_done}: no work can be granted "
                    f"(B={self.cfg.groups_per_step}, cap={self.cfg.cap}, K={self.cfg.max_staleness})"
                )
            at, _, kind, who, token = heapq.heappop(self._events)
            if kind == "seq":
                a = self.actors[who]
                if token != a.token:
                    continue
                self.now = at
                self._on_sequence(a)
            elif kind == "train":
                if token != self.train_token or self.state != "train":
                    continue
                self.now = at
                self._on_trained()
            else:
                self.now = at
                self._on_synced()
        return self._result()

    def _result(self) -> SimResult:
        span = max(self.now - self.window_start, EPS)
        steps = self.cfg.steps - self.cfg.warmup_steps
        for a in self.actors:  # close open idle intervals at the end of the window
            if a.idle_since is not None:
                a.idle_s += self.now - max(a.idle_since, self.window_start)
        idle = sum(a.idle_s for a in self.actors) / (len(self.actors) * span)
        trained = self.trained_groups
        return SimResult(
            steps_per_s=steps / span,
            trained_tokens_per_s=self.trained_tokens / span,
            generated_tokens_per_s=self.generated_tokens / span,
            learner_idle_fraction=self.wait_s / span,
            learner_sync_fraction=self.sync_time_s / span,
            actor_idle_fraction=min(1.0, idle),
            mean_staleness=self.staleness_sum / max(trained, 1),
            drop_rate=self.dropped / max(self.dropped + trained, 1),
            sim_seconds=self.now,
        )


def simulate(cfg: SimConfig) -> SimResult:
    """Run the pipeline model of ``cfg`` (deterministic for a given ``cfg.seed``)."""
    return Simulator(cfg).run()
