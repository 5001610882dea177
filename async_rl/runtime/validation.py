"""Validation during training: rounds of generation on the actors, each pinned to one published policy version,
scored by the actors' reward function and logged as ``val/...`` metrics at the step of the version evaluated.

When (only with ``data.val_files`` set; verl's schedule, ``verl/trainer/ppo/ray_trainer.py::fit``):

* ``trainer.val_before_train``: a round on the starting policy (version 0, or the resumed version) before step 1;
* ``trainer.test_freq`` = f > 0: a round on every version v with v % f == 0, and one on the final version;
  f <= 0: no round during or after training. verl does the same: its final validation is part of the test_freq
  schedule (``test_freq > 0 and (is_last_step or step % test_freq == 0)``), so with f = -1 only the round before
  training runs.

The order around a round on version v (learner rank 0 drives; the other ranks follow its broadcasts):

1. v is published to the actors (also when ``sync_every_n_steps`` would have skipped it);
2. ``Validator.start(v)``: ``Coordinator.start_eval`` grants the prompts, before any training work, to actors whose
   loaded version is exactly v (``transport.evaluation``); training goes on meanwhile;
3. the round's results are logged as soon as rank 0 sees it complete (``poll``, once per step), at step v;
4. full weights: later versions are published while the round runs; each actor receives them at once and holds them
   unloaded until its part of the round is done (``actor.loop``), so no actor's weights change under a running round
   and the learner never waits for one to publish. LoRA adapters are not held back, and actors that run on the
   learner's cores (``lend_learner_cores``) are better served by the learner out of their way (:func:`actors_hold`):
   then before the next publish of any other version every rank waits in ``before_publish`` until the round is
   complete;
5. the next round's ``start`` (and the final one) waits until the open round is complete or
   ``async_training.timeouts.validation_s`` passed (then the partial results are logged with a warning and the round
   is closed). So every round finishes or times out.

Differences from verl: rounds run on the actors concurrently with training instead of pausing it; greedy decoding
(``val_kwargs.do_sample=false``) generates one sample per prompt (verl repeats the prompt ``n`` times and decodes
each greedily, to the same result); ``val-core/<source>/reward/best@N/mean`` is the exact mean of the per-prompt best
of the N samples, where verl reports a bootstrap estimate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from async_rl import metric_catalog as mc
from async_rl.config import Config
from async_rl.config.data_reward import DataConfig
from async_rl.config.trainer import TrainerConfig
from async_rl.transport.evaluation import EvalResult
from async_rl.transport.protocol import GroupSampling

logger = logging.getLogger(__name__)

_WAIT, _DONE = b"W", b"D"
LogFn = Callable[[int, dict[str, float]], None]


class _Ctx(Protocol):
    rank: int

    def broadcast_bytes(self, data: bytes | None, src: int = 0) -> bytes: ...


class _Coordinator(Protocol):
    def start_eval(self, version: int, records: Sequence[Any], sampling: GroupSampling) -> int: ...

    def wait_eval(self, round_id: int, timeout_s: float | None) -> bool: ...

    def finish_eval(self, round_id: int) -> EvalResult: ...


def any_round(data: DataConfig, trainer: TrainerConfig) -> bool:
    """Whether the schedule (see the module docstring) runs any round at all; only then are the validation prompts
    loaded and the Validator enabled."""
    return data.val_files is not None and (trainer.val_before_train or trainer.test_freq > 0)


def validation_metrics(result: EvalResult, sources: Sequence[str]) -> dict[str, float]:
    """The ``val/...`` metrics of a round (``sources[i]``: the data source of prompt i), plus verl's core names.

    ``val/reward_mean`` averages every sample; ``val/<source>/reward_mean`` those of one data source, and
    ``val/<source>/<component>_mean`` each reward component (a component must not be named ``reward``). With n > 1
    samples per prompt: ``val/mean@n`` (mean over prompts of the per-prompt mean) and ``val/best@n`` (of the per-prompt
    best). verl aliases: ``val-core/<source>/reward/mean@n`` and, for n > 1, ``val-core/<source>/reward/best@n/mean``.
    """
    rewards: list[float] = []
    lengths: list[int] = []
    per_prompt: dict[str, list[list[float]]] = {}
    for index in sorted(result.completions):
        group = [float(c.reward) for c in result.completions[index]]
        rewards.extend(group)
        lengths.extend(c.token_ids.length for c in result.completions[index])
        per_prompt.setdefault(sources[index], []).append(group)
    n = max((len(g) for groups in per_prompt.values() for g in groups), default=1)
    out: dict[str, float] = {
        mc.VAL_VERSION: float(result.version),
        mc.VAL_WALL_S: result.wall_s,
        mc.VAL_NUM_SAMPLES: float(len(rewards)),
        mc.VAL_NUM_PROMPTS: float(sum(len(groups) for groups in per_prompt.values())),
        mc.VAL_PROMPTS_MISSING: float(result.num_prompts - len(result.completions)),
        mc.VAL_REWARD_MEAN: _mean(rewards),
        mc.VAL_RESPONSE_LENGTH_MEAN: _mean([float(x) for x in lengths]),
    }
    all_groups = [g for groups in per_prompt.values() for g in groups]
    if n > 1:
        out[mc.val_mean_n_key(n)] = _mean([_mean(g) for g in all_groups])
        out[mc.val_best_n_key(n)] = _mean([max(g) for g in all_groups])
    components: dict[tuple[str, str], list[float]] = {}
    for index in sorted(result.completions):
        for c in result.completions[index]:
            for name, value in (c.reward_components or {}).items():
                components.setdefault((sources[index], name), []).append(float(value))
    for (source, name), values in sorted(components.items()):
        out[mc.val_source_component_mean_key(source, name)] = _mean(
            values
        )  # e.g. acc, the unshaped score under overlong shaping
    for source, groups in sorted(per_prompt.items()):
        out[mc.val_source_reward_mean_key(source)] = _mean([r for g in groups for r in g])
        out[mc.val_core_source_reward_mean_n_key(source, n)] = _mean([_mean(g) for g in groups])
        if n > 1:
            out[mc.val_core_source_reward_best_n_mean_key(source, n)] = _mean([max(g) for g in groups])
    return out


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


class Validator:
    """Runs the validation rounds of one learner; construct on every rank (records and coordinator on rank 0 only).

    Every rank tracks which version's round is open (the schedule is the same everywhere), so ranks enter the
    collective wait together; only rank 0 talks to the coordinator and logs.
    """

    def __init__(
        self,
        ctx: _Ctx,
        coordinator: _Coordinator | None,
        trainer: TrainerConfig,
        *,
        enabled: bool,
        records: Sequence[Any],
        sources: Sequence[str],
        sampling: GroupSampling | None,
        timeout_s: float,
        actors_hold: bool,
        log: LogFn | None,
        poll_s: float = 2.0,
    ) -> None:
        if ctx.rank == 0 and enabled and (coordinator is None or not records or sampling is None):
            raise ValueError(
                "learner rank 0 needs the coordinator, the validation records and their sampling when validation is on"
            )
        if len(sources) != len(records):
            raise ValueError(f"{len(sources)} data sources for {len(records)} validation records")
        self.ctx = ctx
        self.coordinator = coordinator
        self.trainer = trainer  # its val_before_train and test_freq are the schedule
        self.enabled = enabled  # rounds run at all (:func:`any_round`, the same on every rank)
        self.records = list(records)
        self.sources = list(sources)
        self.sampling = sampling
        self.timeout_s = timeout_s
        self.actors_hold = actors_hold  # the actors hold newer versions back until a round is done (full weights)
        self.log = log
        self.poll_s = poll_s
        self.open_version: int | None = None  # every rank: the version of the round not yet waited for
        self.last_version: int | None = None  # every rank: the version the last round evaluated
        self._round: int | None = None  # rank 0: the coordinator's id of the open round (None once closed)
        self.results: list[EvalResult] = []  # rank 0: every closed round's results

    def at_start(self) -> bool:
        """Whether a round on the starting policy runs before step 1 (``trainer.val_before_train``)."""
        return self.enabled and self.trainer.val_before_train

    def due(self, version: int) -> bool:
        """Whether ``version`` is validated during training (``trainer.test_freq`` divides it)."""
        return self.enabled and self.trainer.test_freq > 0 and version % self.trainer.test_freq == 0

    def at_end(self) -> bool:
        """Whether the final version is validated (``trainer.test_freq`` > 0, as verl)."""
        return self.enabled and self.trainer.test_freq > 0

    def start(self, version: int) -> None:
        """Start a round on ``version``, which the actors must already have (called on every rank)."""
        if self.open_version is not None:
            self.wait()
        self.open_version = self.last_version = version
        if self.ctx.rank == 0:
            assert self.coordinator is not None and self.sampling is not None
            self._round = self.coordinator.start_eval(version, self.records, self.sampling)

    def before_publish(self, version: int) -> float:
        """Called on every rank right before weights of ``version`` go to the actors. Unless the actors hold newer
        versions back during a round (``actors_hold``), an open round on another version must finish (or time out)
        first, so that its actors keep its weights until then. Returns the seconds waited for it (0.0 when none)."""
        if self.actors_hold or self.open_version is None or self.open_version == version:
            return 0.0
        started = time.monotonic()
        self.wait()
        return time.monotonic() - started

    def poll(self) -> None:
        """Rank 0, no collective: close and log the open round if it is complete."""
        if self._round is not None and self.coordinator is not None and self.coordinator.wait_eval(self._round, 0.0):
            self._close()

    def wait(self) -> None:
        """Collective: wait until the open round is complete or ``timeout_s`` passed; rank 0 logs its results."""
        if self.open_version is None:
            return
        deadline = time.monotonic() + self.timeout_s
        while True:
            decision = None
            if self.ctx.rank == 0:
                decision = self._rank0_step(deadline)
            if self.ctx.broadcast_bytes(decision) == _DONE:
                self.open_version = None
                return

    def _rank0_step(self, deadline: float) -> bytes:
        if self._round is None:
            return _DONE
        assert self.coordinator is not None
        remaining = deadline - time.monotonic()
        if self.coordinator.wait_eval(self._round, max(0.0, min(self.poll_s, remaining))):
            self._close()
            return _DONE
        if time.monotonic() >= deadline:
            logger.warning(
                "validation of policy version %s did not finish within %.0f s (async_training.timeouts.validation_s):"
                " logging partial results",
                self.open_version,
                self.timeout_s,
            )
            self._close()
            return _DONE
        return _WAIT

    def _close(self) -> None:
        assert self.coordinator is not None and self._round is not None
        result = self.coordinator.finish_eval(self._round)
        self._round = None
        self.results.append(result)
        metrics = validation_metrics(result, self.sources)
        logger.info(
            "validation of policy version %d: reward %.4f over %d samples of %d/%d prompts in %.1f s",
            result.version,
            metrics[mc.VAL_REWARD_MEAN],
            int(metrics[mc.VAL_NUM_SAMPLES]),
            len(result.completions),
            result.num_prompts,
            result.wall_s,
        )
        if self.log is not None:
            self.log(result.version, metrics)  # a version's round is logged at that version's step


def actors_hold(cfg: Config) -> bool:
    """Whether the actors hold versions published during a round back until it ends, so that the learner publishes
    without waiting for it: full weights (adapters are loaded as they come, ``actor.loop``), and the actors not running
    on the learner's cores (``async_training.actor.lend_learner_cores``: the learner's wait lends them to the round;
    going on beside it measured slower on a 2-core host)."""
    return cfg.actor_rollout_ref.model.lora_rank == 0 and not cfg.async_training.actor.lend_learner_cores


def build_validator(
    cfg: Config, ctx: _Ctx, coordinator: _Coordinator | None, tokenizer: Any, log: LogFn | None
) -> Validator:
    """The run's Validator: loads and tokenizes the validation prompts on rank 0 when any round will run. Bad data
    raises ``ValueError`` on every rank (rank 0 tells the others), so no rank waits for a collective that never comes.
    """
    from async_rl.runtime import resources

    enabled = any_round(cfg.data, cfg.trainer)
    records: list[Any] = []
    sources: list[str] = []
    if enabled:
        error = b""
        if ctx.rank == 0:
            try:
                records, sources = resources.val_records(cfg, tokenizer)
                logger.info("validation: %d prompts from data.val_files=%r", len(records), cfg.data.val_files)
            except ValueError as exc:
                error = str(exc).encode() or b"?"
        error = ctx.broadcast_bytes(error if ctx.rank == 0 else None)
        if error:
            raise ValueError(error.decode())
    return Validator(
        ctx,
        coordinator,
        cfg.trainer,
        enabled=enabled,
        records=records,
        sources=sources,
        sampling=GroupSampling.for_validation(cfg, seed=cfg.trainer.seed),
        timeout_s=cfg.async_training.timeouts.validation_s,
        actors_hold=actors_hold(cfg),
        log=log,
    )


__all__ = ["Validator", "actors_hold", "any_round", "build_validator", "validation_metrics"]
