"""The actor process's main loop: ask for work, generate continuously, score, stream groups, take weight updates.

One asyncio loop drives everything, so the rollout client (not thread-safe) is only touched from one thread:

    hello -> (join the weight-sync group, receive weights when the learner publishes) -> loop:
        poll the coordinator (acks, heartbeats, version updates; queued groups go out as backpressure allows)
        if the learner's plan (``client.weight_sync``) invites this actor to a new version: join its epoch, then
        pause -> receive + verify -> resume   (engine.update_weights, the one pause/resume path);
        while a validation round on the loaded version may still run here: receive now, load after (below)
        keep up to ``max_concurrent_groups`` training groups and ``max_concurrent_eval`` validation prompts
        generating; ask for more before the engine runs dry
        multi-turn (``episodes``): each grant's episodes talk with the environment (actor.episodes), which scores them
        each finished group: score its completions in the reward worker and, with a learned reward model
        (``reward_model``), by the reward server or in-process (the two combined by ``reward_weights``), then the
        optional length shaping (``reward_shaping``: DAPO's overlong penalty, so the reward on the wire is the shaped
        one); with on-policy distillation (``teacher``) the teacher engine scores each training completion's tokens;
        send it (tracked until acked; the send never blocks the loop)

A reward model that does not answer in time (``RewardModelUnavailable``: a stopped, dead or restarting server) costs
the group a wait: it is scored again after a back-off (1 s, doubling to 30 s) until ``give_up_s`` after its start,
then given up (its lease expires and the coordinator grants the prompt again). An answer that cannot be trusted
(``UntrustedScore``: an error, a non-finite score, the answer to another request) refuses the group at once; nothing
is ever sent with a guessed score.

A grant is started only on weights at least as new as its ``min_version`` (the staleness bound); otherwise it waits
for the next update. An eval grant (a validation round, ``grant.is_eval``) starts only on EXACTLY its ``min_version``:
it waits while the engine is older and is dropped once the engine is newer (the coordinator grants it again to an
actor on that version). Its group goes back tagged with the round.

The learner publishes newer versions while a round runs (full weights; runtime.validation), so the actor keeps the
round's weights itself: while its part of a round on the loaded version is not done (an eval grant for it running or
waiting here, or the coordinator still holding prompts of it to grant: ``client.eval_version``), a new version is
received at once (the learner's broadcast never waits for the round) but held in host memory (``WeightSync.stage``,
generation goes on), and loaded with the usual pause once that part is done (``load_staged``); a newer version
replaces a held one. A failed receive leaves the loaded weights valid. LoRA adapters are never held back: the learner
waits for the round before it publishes one (as it does when it lends its cores to the actors). If a weight update
still lands under an eval request, the completions' version span shows it and the coordinator grants the prompt
again.

A failed weight update leaves the engine's weights unusable: the engine aborts every running request (their leases
expire and the coordinator grants the prompts again) and stays paused until an update succeeds.

Two failures end the actor at once instead (``run`` raises :class:`ActorFailed` naming the cause, the process exits
non-zero, and the launcher reports it): a dead vLLM engine (``EngineDead``: nothing can be generated again), and a
weight update that does not fit the model (``WeightMismatchError``: a tensor missing, unknown or mis-shaped; a
retry would fail the same way). Waiting silently would only stall the learner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
import numpy as np

from async_rl import metric_catalog as mc
from async_rl.actor.engine import EngineDead, EngineOutput, EngineStats, UpdateMode
from async_rl.actor.episodes import EpisodeRunner
from async_rl.peft_format import LoRASpec, adapter_config
from async_rl.rewards import OverlongShaping, RewardResult
from async_rl.rewards.model_client import GroupScorer, RewardModelUnavailable, RewardWeights, combine
from async_rl.rewards.model_score import UntrustedScore
from async_rl.transport.protocol import (
    Completion,
    GroupSampling,
    PromptGrant,
    RolloutGroup,
    ServedCheck,
    WeightSyncPlan,
    make_completion,
    pack_array,
    unpack_array,
)
from async_rl.weight_sync.errors import WeightMismatchError
from async_rl.weight_sync.membership import JoinInfo

logger = logging.getLogger(__name__)


class Scorer(Protocol):
    def score(self, prompt: str, completion: str, ground_truth: str, extra: dict[str, Any] | None = None) -> Any: ...


class PlaneClient(Protocol):
    """What the loop needs from its rollout client (``transport.RolloutClient``); none of it blocks for long."""

    shutdown_requested: bool
    weight_sync: WeightSyncPlan | None  # the learner's latest plan
    report: dict[str, float]  # cumulative counters sent on heartbeats
    learner_waiting: bool | None  # the learner is blocked waiting for the actors (heartbeats say; None: none yet)
    eval_version: int  # the open round's version while the coordinator still has prompts of it to grant, else -1

    @property
    def queued_grants(self) -> tuple[PromptGrant, ...]:
        """Grants received and not yet handed out by ``request_work``."""
        ...

    def hello(self, loaded_version: int = 0) -> object: ...

    def poll(self, timeout_s: float = 0.0) -> None: ...

    def request_work(self, max_groups: int, loaded_version: int, timeout_s: float = 0.0) -> list[PromptGrant]: ...

    def send_group(self, group: RolloutGroup) -> None: ...  # queues it; backpressure never blocks the caller

    def wait_acked(self, timeout_s: float) -> bool: ...


class Engine(Protocol):
    """What the loop needs from a generation engine: ``GenerationEngine`` (vLLM) or the emulated one (benchmarks)."""

    version: int
    stats: EngineStats

    @property
    def lora(self) -> bool:
        """Whether versions are served as LoRA adapters (each update writes one to :meth:`adapter_dir`)."""
        ...

    @property
    def halted(self) -> bool:
        """True after a failed update left generation paused and the weights unusable (until one succeeds)."""
        ...

    def adapter_dir(self, version: int) -> str: ...

    async def probe(self, token_ids: list[int]) -> list[float]:
        """Log-probs of each next token of ``token_ids`` with what the engine serves now (temperature 1)."""
        ...

    @property
    def dead(self) -> bool:
        """True once the engine can never generate again (vLLM's engine core died)."""
        ...

    async def generate(self, prompt_token_ids: list[int], sampling: GroupSampling) -> list[EngineOutput]: ...

    async def set_cpu_threads(self, n: int) -> None:
        """Run on ``n`` CPU threads from the next step on (only called when the actor lends the learner's cores)."""
        ...

    async def update_weights(self, new_version: int, load: Callable[[], Awaitable[None]], mode: UpdateMode) -> None:
        """Pause -> ``load()`` -> set version -> resume; when ``load`` raises: abort every running request, stay
        paused (until an update succeeds) and re-raise."""
        ...


class Teacher(Protocol):
    """What the loop needs from on-policy distillation's teacher (``actor.teacher.TeacherEngine``)."""

    stats: Any  # TeacherStats

    @property
    def dead(self) -> bool: ...

    async def score(self, prompt_ids: list[int], completions: list[list[int]]) -> list[np.ndarray]:
        """The teacher's log-prob of each token of each completion, aligned to its tokens."""
        ...


class WeightSync(Protocol):
    """What the loop needs from the weight-sync driver (``AsyncEngineWeightSync``, ``ReceiveOnlyWeightSync``)."""

    async def announce(self, host: str, port: int, *, member: str, token: str, timeout_s: float) -> None: ...

    async def join(self, info: JoinInfo) -> None: ...

    async def update(self, version: int) -> dict[str, Any]: ...  # receive and load (the engine pauses around it)

    async def stage(self, version: int) -> dict[str, Any]: ...  # receive and hold, not loaded (no pause)

    async def load_staged(self, version: int) -> dict[str, Any]: ...  # load the held version (the engine pauses)

    async def update_adapter(self, version: int, adapter_dir: str, adapter_config: dict[str, Any]) -> dict[str, Any]:
        """LoRA: receive the adapter of ``version`` and write it to ``adapter_dir`` (the engine adds it)."""
        ...


class ActorFailed(RuntimeError):
    """The actor cannot go on (dead engine, or weights that do not fit its model); the message names the cause."""


@dataclass
class ActorLoopStats:
    groups_sent: int = 0
    groups_aborted: int = 0
    eval_groups_sent: int = 0
    eval_grants_dropped: int = 0  # eval grants pinned to a version older than the engine's (never started)
    grants_received: int = 0
    groups_started: int = 0
    update_failures: int = 0
    updates_held: int = 0  # versions received during a validation round on the loaded one and loaded after it
    served_checks: int = 0  # updates whose served weights were checked against the learner's probe
    served_check_failures: int = 0  # ... and did not compute what the learner's weights do
    served_check_diff: float = 0.0  # the last check's mean |difference| of log-probs
    joins_left_out: int = 0  # invited to a weight-sync epoch but not in its roster (too late, or the join failed)
    idle_seconds: float = 0.0
    lend_switches: int = 0  # thread-count changes made to lend the engine the learner's cores (lend_learner_cores)
    reward_model_deferred: int = 0  # groups whose reward-model scoring waited for the server (then tried again)
    reward_model_given_up: int = 0  # ... given up after give_up_s (the prompt is granted again)
    reward_model_refused: int = 0  # groups refused for an untrusted reward-model answer


class ActorLoop:
    """Runs one actor until the coordinator says shutdown (or ``max_groups`` groups were sent, for tests)."""

    def __init__(
        self,
        *,
        actor_id: str,
        client: PlaneClient,
        engine: Engine,
        scorer: Scorer,
        weight_sync: WeightSync | None,
        reward_shaping: OverlongShaping | None = None,
        reward_model: GroupScorer | None = None,
        reward_weights: RewardWeights | None = None,
        give_up_s: float | None = None,
        episodes: EpisodeRunner | None = None,
        teacher: Teacher | None = None,
        max_concurrent_groups: int,
        max_concurrent_eval: int,
        update_mode: UpdateMode,
        lend_threads: tuple[int, int] | None = None,
        poll_interval_s: float = 0.01,
        max_groups: int | None = None,
    ) -> None:
        if max_concurrent_groups < 1:
            raise ValueError(f"max_concurrent_groups must be >= 1, got {max_concurrent_groups}")
        if max_concurrent_eval < 1:
            raise ValueError(f"max_concurrent_eval must be >= 1, got {max_concurrent_eval}")
        if reward_model is not None and (reward_weights is None or give_up_s is None):
            raise ValueError("a reward model needs reward_weights and give_up_s")
        self.actor_id = actor_id
        self.client = client
        self.engine = engine
        self.scorer = scorer
        self.reward_shaping = reward_shaping
        self.reward_model = reward_model
        self.reward_weights = reward_weights
        self.give_up_s = give_up_s
        self.episodes = episodes
        self.teacher = teacher
        self.weight_sync = weight_sync
        self.max_concurrent = max_concurrent_groups
        self.max_concurrent_eval = max_concurrent_eval
        self.update_mode = update_mode
        # (threads normally, threads while the learner waits): the engine runs on the learner's idle cores then. It
        # starts wide (the actor's start-up sets it so): a learner waits for its first batch
        self.lend_threads = lend_threads
        self._lending = lend_threads is not None
        self.poll_interval_s = poll_interval_s
        self.max_groups = max_groups
        self.stats = ActorLoopStats()
        self._pending: deque[PromptGrant] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._finished: asyncio.Queue[RolloutGroup] = asyncio.Queue()
        self._epoch: int | None = None
        self._held: tuple[int, int] | None = None  # (version, epoch) received and held until a round is done here
        self._eval_tasks = 0  # eval groups generating now
        self._failed_epoch: int | None = None  # a group that broke under us is never rejoined; wait for a new epoch
        self._announced: tuple[str, int, int] | None = None  # (host, port, epoch) of the last candidacy announced
        self._token = uuid.uuid4().hex  # with a counter: each announcement is fresh evidence of life
        self._announcements = 0
        self._weights_valid = True
        self._stop = False
        self._fatal: ActorFailed | None = None
        self._score_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward")
        self._model_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-model")
        # groups waiting for the reward model (prompt ids, response ids, the future of their scores), and the task
        # that sends them in batches (started with the first group)
        self._model_queue: deque[tuple[list[int], list[list[int]], asyncio.Future[list[float]]]] = deque()
        self._model_ready = asyncio.Event()
        self._model_task: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ weights
    async def _maybe_update_weights(self) -> None:
        plan: WeightSyncPlan | None = self.client.weight_sync
        sync = self.weight_sync
        if sync is None or plan is None:
            return
        if self.actor_id not in plan.candidates or plan.epoch == self._failed_epoch:
            await self._announce(plan)
            return
        # A newer version, or the same version re-sent to a re-formed group (a member joined or left): receive it.
        received = (plan.version, plan.epoch) in ((self.engine.version, self._epoch), self._held)
        if plan.version < self.engine.version or received:
            await self._load_held(sync)
            return
        if self._epoch != plan.epoch:
            try:
                async with self._keepalive():
                    await sync.join(JoinInfo(plan=plan, member=self.actor_id))
            except Exception as exc:  # not in the roster (too late) or the store was unreachable: weights stay valid
                self.stats.joins_left_out += 1
                self._epoch = None
                self._failed_epoch = plan.epoch
                logger.warning(
                    "actor %s: not in weight-sync epoch %d (%s); announcing again", self.actor_id, plan.epoch, exc
                )
                return
            self._epoch = plan.epoch
        version = plan.version
        adapter = plan.adapter
        if (adapter is not None) != self.engine.lora:
            self._fatal = ActorFailed(
                f"actor {self.actor_id}: the learner sends {'LoRA adapters' if adapter else 'full weights'} but this"
                f" actor's engine {'serves adapters' if self.engine.lora else 'has no LoRA'}: both must run with the"
                " same actor_rollout_ref.model.lora_rank"
            )
            return
        if adapter is None and self._round_runs_here():
            await self._hold(sync, version, plan.epoch)
            return
        self._held = None  # the worker drops a held version when it receives another

        async def load() -> None:
            if adapter is None:
                await sync.update(version)
                return
            config = adapter_config(
                LoRASpec(rank=adapter.rank, alpha=adapter.alpha, target_modules=adapter.target_modules),
                adapter.target_modules,
            )
            await sync.update_adapter(version, self.engine.adapter_dir(version), config)

        if await self._load(version, plan.epoch, load) and plan.served_check is not None and self._fatal is None:
            try:
                await self._check_served(version, plan.served_check)
            except Exception as exc:  # noqa: BLE001 - the update itself succeeded; a check that cannot run is reported
                logger.error(
                    "actor %s: the served-weights check of version %d could not run: %r", self.actor_id, version, exc
                )

    def _round_runs_here(self) -> bool:
        """Whether this actor's part of a validation round on its loaded version may not be done: an eval grant for
        that version is running, waiting here or queued in the client, or the coordinator still has prompts of it to
        grant (grants are sent before the heartbeat that says none are left, so they are queued by then)."""
        version = self.engine.version
        if self._eval_tasks > 0 or self.client.eval_version == version:
            return True
        return any(g.is_eval and g.min_version == version for g in (*self._pending, *self.client.queued_grants))

    async def _hold(self, sync: WeightSync, version: int, epoch: int) -> None:
        """Receive ``version`` now (the learner's broadcast waits for every member) and hold it unloaded, so that the
        round on the loaded version finishes on its own weights. A failed receive leaves those weights valid."""
        try:
            async with self._keepalive():
                await sync.stage(version)
        except Exception as exc:  # the group is out of step: rejoin under the next epoch, generation goes on
            self.stats.update_failures += 1
            self._held = None
            self._epoch = None
            self._failed_epoch = epoch
            logger.error("actor %s: receiving version %d to hold failed: %s", self.actor_id, version, exc)
            return
        self._held = (version, epoch)
        logger.info(
            "actor %s: holding policy version %d until its validation round on version %d is done",
            self.actor_id,
            version,
            self.engine.version,
        )

    async def _load_held(self, sync: WeightSync) -> None:
        """Load the held version once this actor's part of the round is done."""
        if self._held is None or self._round_runs_here():
            return
        (version, epoch), self._held = self._held, None

        async def load() -> None:
            await sync.load_staged(version)

        if await self._load(version, epoch, load):
            self.stats.updates_held += 1

    async def _load(self, version: int, epoch: int, load: Callable[[], Awaitable[None]]) -> bool:
        """Swap in ``version`` through the engine's one pause/resume path; False (logged) if it failed."""
        try:
            async with self._keepalive():
                await self.engine.update_weights(version, load, self.update_mode)
            self._weights_valid = True
            logger.info("actor %s now on policy version %d", self.actor_id, version)
            return True
        except WeightMismatchError as exc:
            self.stats.update_failures += 1
            self._fatal = ActorFailed(
                f"actor {self.actor_id}: the weight update to version {version} does not fit this actor's model: {exc}"
            )
        except Exception as exc:  # a broken transfer must not kill the actor: wait for the next (re-formed) update
            self.stats.update_failures += 1
            self._epoch = None
            self._failed_epoch = epoch
            # full weights: the engine aborted its requests and stays paused until an update succeeds; a failed LoRA
            # update leaves the current adapter serving
            self._weights_valid = not self.engine.halted
            logger.error("actor %s: weight update to version %d failed: %s", self.actor_id, version, exc)
        return False

    async def _check_served(self, version: int, check: ServedCheck) -> None:
        """Compare what the engine now serves with the learner's log-probs of ``version`` on the probe. A mismatch
        means the update did not take effect (say, vLLM kept serving an older adapter): the actor then stops
        generating, loudly, until a later update passes, so no sample is ever labelled with a version it was not
        drawn from."""
        served = await self.engine.probe(list(check.token_ids))
        diff = sum(abs(a - b) for a, b in zip(served, check.logprobs, strict=True)) / len(served)
        self.stats.served_checks += 1
        self.stats.served_check_diff = diff
        if diff <= check.tolerance:
            return
        self.stats.served_check_failures += 1
        self._weights_valid = False
        logger.error(
            "actor %s: what it serves after loading version %d does not compute what the learner's weights do: mean"
            " |log-prob difference| %.3g on the probe > tolerance %.3g (async_training.weight_sync."
            "served_check_tolerance). The update did not take effect; no generation until an update passes",
            self.actor_id,
            version,
            diff,
            check.tolerance,
        )

    @contextlib.asynccontextmanager
    async def _keepalive(self) -> AsyncIterator[None]:
        """Keep heartbeats and acks flowing while a weight-sync step holds the main loop (a join may wait up to
        ``join_timeout_s`` for its roster, a transfer for its buckets): the coordinator must not presume us dead."""

        async def beat() -> None:
            while True:
                self.client.poll()
                await asyncio.sleep(0.05)

        task = asyncio.ensure_future(beat())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _announce(self, plan: WeightSyncPlan) -> None:
        """Tell the learner (once per epoch) that this actor can receive weights; it then invites us to an epoch."""
        where = (plan.host, plan.port, plan.epoch)
        if self._announced == where:
            return
        assert self.weight_sync is not None
        self._announcements += 1
        token = f"{self._token}-{self._announcements}"
        try:
            async with self._keepalive():  # a store that does not answer holds us for the announcement's timeout
                await self.weight_sync.announce(
                    plan.host, plan.port, member=self.actor_id, token=token, timeout_s=plan.timeout_s
                )
        except Exception as exc:  # the learner's store is unreachable now: try again with the next epoch's plan
            logger.warning("actor %s: could not announce itself for weight sync: %s", self.actor_id, exc)
        self._announced = where

    # ------------------------------------------------------------------ generation
    def _can_start(self, grant: PromptGrant) -> bool:
        if grant.is_eval:
            return self._weights_valid and self.engine.version == grant.min_version
        return self._weights_valid and self.engine.version >= grant.min_version

    def _obsolete(self, grant: PromptGrant) -> bool:
        """An eval grant pinned to a version this engine has moved past: it can never start here."""
        if grant.is_eval and self.engine.version > grant.min_version:
            self.stats.eval_grants_dropped += 1
            return True
        return False

    async def _run_group(self, grant: PromptGrant) -> None:
        if self.episodes is not None:
            await self._run_episodes(grant, self.episodes)
            return
        started = time.time()
        prompt_ids = unpack_array(grant.prompt_token_ids)
        completions = await self.engine.generate(prompt_ids.tolist(), grant.sampling)
        if any(c.finish_reason == "abort" for c in completions):
            self.stats.groups_aborted += 1
            return
        generated = time.time()
        extras = dict(grant.extras)
        prompt_text = str(extras.get("prompt", ""))
        ground_truth = str(extras.get("ground_truth", ""))
        texts = [c.text for c in completions]
        model_scores: list[float] | None = None
        if self.reward_model is not None:
            model_scores = await self._model_scores(grant, prompt_ids.tolist(), completions, started)
            if model_scores is None:
                return

        shaping, weights = self.reward_shaping, self.reward_weights

        def score_group() -> list[RewardResult]:
            results = [self.scorer.score(prompt_text, t, ground_truth, extras.get("extra")) for t in texts]
            if model_scores is not None:
                assert weights is not None
                results = [combine(r, m, weights) for r, m in zip(results, model_scores, strict=True)]
            if shaping is None:
                return results
            return [shaping.apply(r, len(c.token_ids)) for r, c in zip(results, completions, strict=True)]

        # One scoring thread: the reward worker is a single child process and is not thread-safe.
        rewards = await asyncio.get_running_loop().run_in_executor(self._score_pool, score_group)
        wire = [_wire_completion(c, r) for c, r in zip(completions, rewards, strict=True)]
        group = RolloutGroup(
            prompt_id=grant.prompt_id,
            lease_id=grant.lease_id,
            actor_id=self.actor_id,
            completions=await self._teacher_scored(grant, wire),
            timings={"generate_s": generated - started, "reward_s": time.time() - generated},
            eval_round=grant.eval_round,
        )
        await self._finished.put(group)

    async def _model_scores(
        self, grant: PromptGrant, prompt_ids: list[int], completions: list[EngineOutput], started: float
    ) -> list[float] | None:
        """The reward model's scores of the group's completions, or None when the group is refused or given up."""
        assert self.reward_model is not None and self.give_up_s is not None
        model = self.reward_model
        responses = [list(c.token_ids) for c in completions]
        delay = 1.0
        while True:
            try:
                return await self._batched_model_score(model, prompt_ids, responses)
            except UntrustedScore as exc:
                self.stats.reward_model_refused += 1
                logger.error("actor %s: group of prompt %d refused: %s", self.actor_id, grant.prompt_id, exc)
                return None
            except RewardModelUnavailable as exc:
                if self._stop or time.time() - started + delay > self.give_up_s:
                    self.stats.reward_model_given_up += 1
                    logger.error(
                        "actor %s: gave up scoring prompt %d (%s); it is granted again when its lease expires",
                        self.actor_id,
                        grant.prompt_id,
                        exc,
                    )
                    return None
                self.stats.reward_model_deferred += 1
                await asyncio.sleep(delay)
                delay = min(2 * delay, 30.0)

    async def _batched_model_score(
        self, model: GroupScorer, prompt_ids: list[int], responses: list[list[int]]
    ) -> list[float]:
        """One group's scores, sent together with every other group waiting for the model (see _score_batches)."""
        if self._model_task is None:
            self._model_task = asyncio.ensure_future(self._score_batches(model))
        future: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
        self._model_queue.append((prompt_ids, responses, future))
        self._model_ready.set()
        return await future

    async def _score_batches(self, model: GroupScorer) -> None:
        """Send the groups waiting for the reward model in batches of at most ``model.max_batch_sequences``
        completions (at least one group), one batch at a time: the groups that finish while a batch is scored go in
        the next, so a validation round's many one-completion groups are scored together, not one by one."""
        loop = asyncio.get_running_loop()
        while True:
            await self._model_ready.wait()
            batch = [self._model_queue.popleft()]
            size = len(batch[0][1])
            while self._model_queue and size + len(self._model_queue[0][1]) <= model.max_batch_sequences:
                size += len(self._model_queue[0][1])
                batch.append(self._model_queue.popleft())
            if not self._model_queue:
                self._model_ready.clear()
            items = [(prompt, responses) for prompt, responses, _ in batch]
            try:
                results: list[Any] = await loop.run_in_executor(self._model_pool, model.score_groups, items)
            except Exception as exc:  # noqa: BLE001 - anything unexpected fails the batch's groups, not this task
                results = [exc] * len(batch)
            for (_, _, future), result in zip(batch, results, strict=True):
                if future.done():  # its group was cancelled meanwhile
                    continue
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    async def _run_episodes(self, grant: PromptGrant, episodes: EpisodeRunner) -> None:
        """Multi-turn: the environment scores the episodes (the reward worker is not used)."""
        started = time.time()
        completions = await episodes.run_group(grant, unpack_array(grant.prompt_token_ids).tolist())
        if completions is None:
            self.stats.groups_aborted += 1
            return
        group = RolloutGroup(
            prompt_id=grant.prompt_id,
            lease_id=grant.lease_id,
            actor_id=self.actor_id,
            completions=await self._teacher_scored(grant, completions),
            timings={"generate_s": time.time() - started},
            eval_round=grant.eval_round,
        )
        await self._finished.put(group)

    async def _teacher_scored(self, grant: PromptGrant, completions: list[Completion]) -> list[Completion]:
        """On-policy distillation: the completions with the teacher's log-prob of each token (0 on a multi-turn
        episode's observation tokens, as their behaviour log-probs). Validation groups are not scored."""
        if self.teacher is None or grant.is_eval:
            return completions
        prompt = unpack_array(grant.prompt_token_ids).tolist()
        scores = await self.teacher.score(prompt, [unpack_array(c.token_ids).tolist() for c in completions])
        scored = []
        for c, teacher in zip(completions, scores, strict=True):
            if c.loss_mask is not None:
                teacher = np.where(unpack_array(c.loss_mask) != 0, teacher, 0.0)
            scored.append(msgspec.structs.replace(c, teacher_logprobs=pack_array(teacher, "<f4")))
        return scored

    def _launch(self, grant: PromptGrant) -> None:
        if self.stats.groups_started == 0:
            logger.info("actor %s started its first group (prompt %d)", self.actor_id, grant.prompt_id)
        self.stats.groups_started += 1
        task = asyncio.ensure_future(self._run_group(grant))
        self._tasks.add(task)
        self._eval_tasks += grant.is_eval
        task.add_done_callback(lambda done: self._task_done(done, grant.is_eval))

    def _task_done(self, task: asyncio.Task[None], is_eval: bool) -> None:
        self._tasks.discard(task)
        self._eval_tasks -= is_eval
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            logger.error("actor %s: a group failed: %r", self.actor_id, exc)
            if isinstance(exc, EngineDead) and self._fatal is None:
                self._fatal = ActorFailed(f"actor {self.actor_id}: {exc}")

    def _has_room(self, grant: PromptGrant) -> bool:
        """Whether a grant of its kind may start now: training groups and validation prompts have caps of their own."""
        running_eval = self._eval_tasks
        if grant.is_eval:
            return running_eval < self.max_concurrent_eval
        return len(self._tasks) - running_eval < self.max_concurrent

    def _free_credit(self) -> int:
        """Grants to ask for. Training groups fill ``max_concurrent_groups``; while a validation round on the loaded
        weights still has prompts to grant (the coordinator serves them before training), the credit also covers
        the room left under ``max_concurrent_eval``, so the round's prompts fill the engine. Grants waiting here
        count against their kind; a training grant beyond its cap waits here until a group finishes."""
        pending_eval = sum(g.is_eval for g in self._pending)
        train = len(self._tasks) - self._eval_tasks + len(self._pending) - pending_eval
        train_free = self.max_concurrent - train
        if self.client.eval_version >= 0 and self.client.eval_version == self.engine.version:
            return max(train_free, self.max_concurrent_eval - self._eval_tasks - pending_eval)
        return train_free

    # ------------------------------------------------------------------ main loop
    async def run(self) -> ActorLoopStats:
        self.client.hello(loaded_version=self.engine.version)
        started = time.monotonic()
        idle_since: float | None = None
        while not self._stop and not self.client.shutdown_requested:
            self.client.poll()
            await self._lend_learner_cores()
            await self._maybe_update_weights()
            if self._fatal is not None or self.engine.dead or (self.teacher is not None and self.teacher.dead):
                await self._fail()
            while not self._finished.empty():
                finished = self._finished.get_nowait()
                self.client.send_group(finished)
                self.stats.groups_sent += 1
                self.stats.eval_groups_sent += finished.eval_round >= 0
                if self.max_groups is not None and self.stats.groups_sent >= self.max_groups:
                    self._stop = True
            # Start what may start now; keep the rest (staleness bound: weights must be at least min_version).
            for _ in range(len(self._pending)):
                grant = self._pending.popleft()
                if self._obsolete(grant):
                    continue
                if self._can_start(grant) and self._has_room(grant):
                    self._launch(grant)
                else:
                    self._pending.append(grant)
            free = self._free_credit()
            if free > 0 and self._weights_valid:
                grants = self.client.request_work(max_groups=free, loaded_version=self.engine.version)
                self.stats.grants_received += len(grants)
                for grant in grants:
                    if self._obsolete(grant):
                        continue
                    if self._can_start(grant) and self._has_room(grant):
                        self._launch(grant)
                    else:
                        self._pending.append(grant)
            now = time.monotonic()
            if self._tasks:
                if idle_since is not None:
                    self.stats.idle_seconds += now - idle_since
                    idle_since = None
            elif idle_since is None:
                idle_since = now
            self.client.report = {
                "generated_tokens": float(self.engine.stats.generated_tokens),
                "idle_s": self.stats.idle_seconds + (now - idle_since if idle_since is not None else 0.0),
                "uptime_s": now - started,
                "served_checks": float(self.stats.served_checks),  # LoRA: adapters checked against the learner's probe
                "served_check_failures": float(self.stats.served_check_failures),
                "lend_switches": float(self.stats.lend_switches),
                **self._reward_model_report(),
            }
            await asyncio.sleep(self.poll_interval_s)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._stop_model_batches()
        self._score_pool.shutdown(wait=True)
        self._model_pool.shutdown(wait=True)
        self.client.wait_acked(timeout_s=5.0)
        return self.stats

    async def _lend_learner_cores(self) -> None:
        """With ``lend_threads``: the engine's thread count follows whether the learner waits for the actors. A call
        that fails (a dying engine) stops the lending, logged; the loop's own checks deal with the engine.

        Until the coordinator's first heartbeat the engine keeps the width it started with (every core): a switch
        reaches the engine only between its steps, and the first step (the prefill of every prompt granted at once,
        up to tens of seconds in fp32 on 2 cores) would otherwise run on one thread beside a learner waiting for it."""
        if self.lend_threads is None:
            return
        waiting = self.client.learner_waiting
        if waiting is None or waiting == self._lending:
            return
        self._lending = waiting
        try:
            await self.engine.set_cpu_threads(self.lend_threads[1] if waiting else self.lend_threads[0])
        except Exception as exc:  # noqa: BLE001 - lending is an optimisation; generation goes on without it
            logger.warning("actor %s: stopped lending the learner's cores: %r", self.actor_id, exc)
            self.lend_threads = None
            return
        self.stats.lend_switches += 1

    async def _fail(self) -> None:
        """Stop everything and raise the fatal error; leases of unfinished work expire and are granted again."""
        which = "the teacher's vLLM engine" if self.teacher is not None and self.teacher.dead else "the vLLM engine"
        fatal = self._fatal or ActorFailed(f"actor {self.actor_id}: {which} died")
        logger.error("%s", fatal)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._stop_model_batches()
        self._score_pool.shutdown(wait=False)
        self._model_pool.shutdown(wait=False)
        self.client.wait_acked(timeout_s=2.0)  # finished groups still count
        raise fatal

    async def _stop_model_batches(self) -> None:
        if self._model_task is not None:
            self._model_task.cancel()
            await asyncio.gather(self._model_task, return_exceptions=True)

    def _reward_model_report(self) -> dict[str, float]:
        """The reward model's cumulative counters for the heartbeat (none without a reward model)."""
        if self.reward_model is None:
            return {}
        rm, s = self.reward_model.stats, self.stats
        return {
            "reward_model_requests": float(rm.requests),
            "reward_model_timeouts": float(rm.timeouts),
            "reward_model_deferred": float(s.reward_model_deferred),
            "reward_model_given_up": float(s.reward_model_given_up),
            "reward_model_refused": float(s.reward_model_refused),
            "reward_model_seconds": rm.seconds,
        }

    def metrics(self) -> dict[str, float]:
        s = self.stats
        out = {
            mc.ACTOR_GROUPS_SENT: float(s.groups_sent),
            mc.ACTOR_GROUPS_ABORTED: float(s.groups_aborted),
            mc.ACTOR_EVAL_GROUPS_SENT: float(s.eval_groups_sent),
            mc.ACTOR_EVAL_GRANTS_DROPPED: float(s.eval_grants_dropped),
            mc.ACTOR_UPDATE_FAILURES: float(s.update_failures),
            mc.ACTOR_UPDATES_HELD: float(s.updates_held),
            mc.ACTOR_SERVED_CHECKS: float(s.served_checks),
            mc.ACTOR_SERVED_CHECK_FAILURES: float(s.served_check_failures),
            mc.ACTOR_SERVED_CHECK_DIFF: s.served_check_diff,
            mc.ACTOR_IDLE_SECONDS: s.idle_seconds,
            mc.ACTOR_GENERATED_TOKENS: float(self.engine.stats.generated_tokens),
            mc.ACTOR_POLICY_VERSION: float(self.engine.version),
        }
        if self.episodes is not None:
            out.update(self.episodes.metrics())
        if self.teacher is not None:
            ts = self.teacher.stats
            out[mc.ACTOR_TEACHER_REQUESTS] = float(ts.requests)
            out[mc.ACTOR_TEACHER_TOKENS] = float(ts.tokens)
            out[mc.ACTOR_TEACHER_SECONDS] = ts.seconds
        if self.reward_model is not None:
            rm = self.reward_model.stats
            out.update(
                {
                    mc.ACTOR_REWARD_MODEL_REQUESTS: float(rm.requests),
                    mc.ACTOR_REWARD_MODEL_TIMEOUTS: float(rm.timeouts),
                    mc.ACTOR_REWARD_MODEL_DEFERRED: float(s.reward_model_deferred),
                    mc.ACTOR_REWARD_MODEL_GIVEN_UP: float(s.reward_model_given_up),
                    mc.ACTOR_REWARD_MODEL_REFUSED: float(s.reward_model_refused),
                    mc.ACTOR_REWARD_MODEL_SECONDS: rm.seconds,
                }
            )
        scorer_metrics = getattr(self.scorer, "metrics", None)
        if callable(scorer_metrics):
            out.update(scorer_metrics())
        return out


def _wire_completion(out: EngineOutput, reward: RewardResult) -> Completion:
    return make_completion(
        token_ids=out.token_ids,
        logprobs=out.logprobs,  # float32 already; pack_array converts anything else
        version_min=out.min_version,
        version_max=out.max_version,
        finish_reason=out.finish_reason,
        reward=reward.score,
        reward_components=reward.components or None,
    )
