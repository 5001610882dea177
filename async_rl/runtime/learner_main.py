"""The learner process: every torchrun rank runs :func:`run_learner`; rank 0 also runs the coordinator.

One training step, in order (rank 0 drives, the other ranks follow through collectives):

1. rank 0 takes ``data.train_batch_size`` prompt groups from the coordinator (blocking; only groups within the
   staleness bound are handed out) and shares them with every rank (msgpack bytes over the learner group);
2. every rank runs :meth:`Learner.train_step` (proximal log-probs, advantages over the whole batch, the update);
3. rank 0 marks the groups trained in the ledger; the policy version is now ``step + 1``;
4. every ``sync_every_n_steps`` the :class:`WeightPublisher` announces the version and streams the new weights to the
   live actors (all ranks take part in the gather); otherwise the coordinator only learns the new version. A version
   due for validation is always published, then a validation round on it starts on the actors while training goes
   on, and the next publish of another version waits for that round (:mod:`async_rl.runtime.validation`);
5. every ``save_every_n_steps`` a checkpoint holds the model, optimizer, scheduler, RNG states and the coordinator's
   ledger, so a resumed run neither repeats nor skips prompt groups;
6. rank 0 logs the step's metrics (learner, transport, sync, rewards) to the configured sinks.

SIGTERM (from the launcher through torchrun, or on torchrun's death, see :mod:`async_rl.runtime.parent_watch`) is
checked before each step and while waiting for rollouts: every rank stops at the same step, writes a checkpoint if
checkpointing is configured, tells the actors to shut down and returns ``{"stopped": True}``; a rank that cannot get
there within ``async_training.timeouts.stop_s`` exits without one (:mod:`async_rl.runtime.graceful_stop`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

from async_rl.config import Config
from async_rl.runtime import resources
from async_rl.runtime.graceful_stop import GracefulStop, StopRequested
from async_rl.runtime.metrics import ActorActivity
from async_rl.runtime.rollout_metrics import rollout_metrics

logger = logging.getLogger(__name__)


def _learner_groups(groups: list[Any], coordinator: Any) -> list[Any]:
    """Transport groups -> the learner's groups (prompt ids from the ledger's records; version = oldest; ``truncated``
    when the completion's finish reason is ``"length"``, for ``actor.mask_truncated_responses``)."""
    from async_rl.learner.batching import Response, RolloutGroup
    from async_rl.transport import unpack_array

    out = []
    for g in groups:
        prompt = coordinator.source.record(g.prompt_id).token_ids
        responses = [
            Response(
                token_ids=unpack_array(c.token_ids).tolist(),
                logprobs=unpack_array(c.logprobs).tolist(),
                reward=float(c.reward),
                version=int(c.version_min),
                truncated=c.finish_reason == "length",
            )
            for c in g.completions
        ]
        out.append(RolloutGroup(group_id=int(g.prompt_id), prompt_ids=[int(t) for t in prompt], responses=responses))
    return out


_WAIT, _GROUPS, _REPUBLISH, _GIVE_UP = b"W", b"G", b"R", b"X"


def _wait_for_groups(
    ctx: Any,
    coordinator: Any,
    publisher: Any,
    learner: Any,
    num_groups: int,
    timeout_s: float,
    poll_s: float = 2.0,
    validator: Any = None,
    stop: GracefulStop | None = None,
) -> list[Any]:
    """Rank 0 waits for ``num_groups`` groups; every rank follows its decisions, broadcast every ``poll_s``.

    While waiting, rank 0 re-publishes the current weights when an actor joined (or the last transfer broke), so a
    new or restarted actor can start work the staleness bound allows; the other ranks join that publish (the weight
    gather is collective). Returns the groups on rank 0 and ``[]`` elsewhere; raises TimeoutError on every rank.
    A re-publish of a newer version than an open validation round's first waits for that round (``validator``).
    Every poll also checks ``stop`` (a collective): once any rank got SIGTERM, every rank raises StopRequested.

    When the data runs out the coordinator hands over what is left, fewer than ``num_groups``: like verl's
    ``drop_last=True`` that final incomplete batch is not trained (it would not split into the configured mini-batches)
    but dropped with a warning, and rank 0 returns ``[]``, which ends the run.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if stop is not None and stop.agreed(ctx):
            raise StopRequested("stop requested while waiting for rollouts")
        raw: list[Any] = []
        decision = None
        if ctx.rank == 0:
            try:
                raw = coordinator.get_groups(num_groups, timeout_s=max(0.0, min(poll_s, deadline - time.monotonic())))
                decision = _GROUPS
                if 0 < len(raw) < num_groups:
                    logger.warning(
                        "data exhausted: dropping the final %d prompt groups, fewer than data.train_batch_size=%d",
                        len(raw),
                        num_groups,
                    )
                    raw = []
            except TimeoutError:
                if time.monotonic() >= deadline:
                    decision = _GIVE_UP
                elif publisher.needs_refresh():
                    decision = _REPUBLISH
                else:
                    decision = _WAIT
        decision = ctx.broadcast_bytes(decision)
        if decision == _GROUPS:
            return raw
        if decision == _GIVE_UP:
            raise TimeoutError(f"no {num_groups} rollout groups within {timeout_s:.0f} s: are the actors running?")
        if decision == _REPUBLISH:
            if validator is not None:
                validator.before_publish(learner.version)
            publisher.publish(learner.version, learner.iter_weights)


def load_prompts(cfg: Config, ctx: Any, tokenizer: Any) -> tuple[list[Any] | None, int]:
    """Rank 0 loads the training prompts and derives the run length from them; every rank learns the step count.

    Returns ``(records, total_steps)`` on rank 0 and ``(None, total_steps)`` elsewhere. Bad data (no prompts, fewer
    than one batch) raises ``ValueError`` on every rank, so no rank waits for a broadcast that never comes.
    """
    from async_rl.runtime.run_length import derive_run_length

    records = None
    message = None
    failure: ValueError | None = None
    if ctx.rank == 0:
        try:
            records = resources.prompt_records(cfg, tokenizer)
            length = derive_run_length(cfg, len(records))
        except ValueError as exc:
            failure = exc
            message = json.dumps({"error": str(exc)}).encode()
        else:
            logger.info("%s", length.how)
            if length.warning:
                logger.warning("%s", length.warning)
            message = json.dumps({"steps": length.steps}).encode()
    shared = json.loads(ctx.broadcast_bytes(message))
    if failure is not None:
        raise failure
    if "error" in shared:
        raise ValueError(shared["error"])
    return records, int(shared["steps"])


def run_learner(cfg: Config) -> dict[str, Any]:
    """Train for the run length (``trainer.total_training_steps``, else derived from ``trainer.total_epochs``, see
    :mod:`async_rl.runtime.run_length`) or until the data runs out; returns a summary on rank 0 (empty dict elsewhere).
    """
    from async_rl.learner.dist import init_distributed, teardown

    stop = GracefulStop(cfg.async_training.timeouts.stop_s).install()  # SIGTERM: see runtime/graceful_stop.py
    try:
        ctx = init_distributed(backend="auto")
        try:
            result = _train(cfg, ctx, stop)
        except BaseException:
            logger.exception("learner rank %d failed", ctx.rank)
            teardown(ctx, failed=True)
            raise
        teardown(ctx)
        return result
    finally:
        stop.close()


def _train(cfg: Config, ctx: Any, stop: GracefulStop) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from async_rl.learner.export import export_hf
    from async_rl.learner.settings import LearnerSettings
    from async_rl.learner.step import Learner, share_groups
    from async_rl.runtime.validation import build_validator
    from async_rl.transport import Coordinator, FilterSettings
    from async_rl.weight_sync.publisher import WeightPublisher

    out_dir = resources.run_dir(cfg)
    if ctx.rank == 0:  # rank 0 builds builtin models once; the others then find them on disk
        out_dir.mkdir(parents=True, exist_ok=True)
        resources.resolve_model_path(cfg.actor_rollout_ref.model.path, out_dir)
    ctx.barrier()
    policy_path = resources.resolve_model_path(cfg.actor_rollout_ref.model.path, out_dir)
    tokenizer = AutoTokenizer.from_pretrained(policy_path)
    records, total_steps = load_prompts(cfg, ctx, tokenizer)
    settings = LearnerSettings.from_config(cfg, total_training_steps=total_steps)
    settings = settings.replace(pad_token_id=int(tokenizer.pad_token_id or 0))
    if settings.critic is not None:
        critic_path = resources.resolve_model_path(cfg.critic.model.path or policy_path, out_dir)
        settings = settings.replace(critic=dataclasses.replace(settings.critic, model_path=critic_path))

    learner = Learner(settings, ctx, policy_path)
    coordinator = None
    if records is not None:
        fg = cfg.algorithm.filter_groups  # DAPO dynamic sampling, done by the coordinator (transport/filtering.py)
        coordinator = Coordinator(
            records,
            resources.plane_settings(cfg),
            sampling=resources.sampling_params(cfg, seed=cfg.trainer.seed),
            seed=cfg.trainer.seed,
            shuffle_seed=cfg.data.seed if cfg.data.shuffle else None,
            max_epochs=cfg.trainer.total_epochs,
            autostart=False,
            vocab_size=learner.vocab_size,  # the embedding's rows: delivered token ids are checked against them
            filter_groups=FilterSettings(
                enable=fg.enable, metric=fg.metric, max_num_gen_batches=fg.max_num_gen_batches
            ),
        )
        logger.info("coordinator at %s with %d prompts", coordinator.address, len(records))
    ws = cfg.async_training.weight_sync
    publisher = WeightPublisher(
        ctx,
        coordinator,
        host=ws.master_addr,
        port=ws.master_port,
        backend=ws.backend,
        bucket_size_mb=ws.bucket_size_mb,
        timeout_s=ws.timeout_s,
        join_timeout_s=ws.join_timeout_s,
    )
    ckpt = cfg.async_training.checkpoint
    ckpt_dir = out_dir / "checkpoints"
    start_step = _maybe_resume(cfg, learner, coordinator, ckpt_dir)
    if coordinator is not None:
        if start_step:
            coordinator.set_policy_version(learner.version)
        coordinator.start()
    sink = _open_sink(cfg, out_dir, total_steps) if ctx.rank == 0 else None
    sync_every = cfg.async_training.sync_every_n_steps
    started = time.monotonic()

    def log_validation(step: int, values: dict[str, float]) -> None:
        if sink is not None:
            sink.log(step, {**values, "time/wall_s": time.monotonic() - started})

    validator = build_validator(cfg, ctx, coordinator, tokenizer, log_validation)
    published = learner.version  # the newest version the actors were sent (or start with)
    if validator.schedule.at_start():
        validator.start(learner.version)
    actor_activity = ActorActivity()
    summary: dict[str, Any] = {}
    saved_step = start_step  # the newest step a checkpoint holds (or the run started from)
    for step in range(start_step, total_steps):
        step_started = time.monotonic()
        t = cfg.async_training.timeouts
        # The first step also waits for the actors to start (engine start-up, model load).
        timeout_s = t.step_s + (t.actor_start_s if step == start_step else 0.0)
        try:
            if stop.agreed(ctx):
                raise StopRequested("stop requested between steps")
            batch = cfg.data.train_batch_size
            raw = _wait_for_groups(
                ctx, coordinator, publisher, learner, batch, timeout_s, validator=validator, stop=stop
            )
        except StopRequested:
            due = bool(ckpt.save_every_n_steps) and step > saved_step
            checkpoint = _save(learner, coordinator, ckpt_dir, step, ckpt.keep_last) if due else None
            if ctx.rank == 0:
                logger.warning("stopped by signal after step %d; checkpoint: %s", step, checkpoint or "none written")
            _close_run(coordinator, publisher, sink)
            return {"stopped": True, "steps": step, "checkpoint": str(checkpoint) if checkpoint else None}
        groups = _learner_groups(raw, coordinator) if coordinator is not None else None
        wait_s = time.monotonic() - step_started
        shared = share_groups(ctx, groups)
        if not shared:
            if ctx.rank == 0:
                logger.warning("data exhausted after %d of %d steps: stopping the run", step, total_steps)
            break
        metrics = learner.train_step(shared)
        version = learner.version
        if coordinator is not None:
            metrics.update(rollout_metrics(raw, version - 1, tokenizer.eos_token_id))
            coordinator.mark_trained([g.prompt_id for g in raw])
            _audit(out_dir, step + 1, raw)
        validate = validator.schedule.due(version)
        if version % sync_every == 0 or validate:  # a version to validate must reach the actors
            validator.before_publish(version)
            metrics.update(publisher.publish(version, learner.iter_weights))
            published = version
            if validate:
                validator.start(version)
        elif coordinator is not None:
            coordinator.set_policy_version(version)
        save_every = ckpt.save_every_n_steps
        if save_every and (version % save_every == 0 or step + 1 == total_steps):
            _save(learner, coordinator, ckpt_dir, step + 1, ckpt.keep_last)
            saved_step = step + 1
        validator.poll()  # a finished round is logged at its own (earlier) step before this step's line
        if sink is not None and coordinator is not None:
            metrics.update(coordinator.metrics())
            metrics.update(actor_activity(metrics))
            metrics["learner/idle_fraction"] = wait_s / max(time.monotonic() - step_started, 1e-9)
            metrics["time/wall_s"] = time.monotonic() - started
            sink.log(step + 1, metrics)
        summary = metrics
    if validator.schedule.at_end() and validator.last_version != learner.version:
        if published != learner.version:  # the final weights reach the actors even if sync_every_n_steps skipped them
            validator.before_publish(learner.version)
            publisher.publish(learner.version, learner.iter_weights)
        validator.start(learner.version)
    validator.wait()
    _close_run(coordinator, publisher, sink)
    final_dir = out_dir / "final_hf"
    export_hf(learner.model, ctx, final_dir)  # collective; rank 0 writes
    if ctx.rank == 0:
        tokenizer.save_pretrained(final_dir)
        return {"steps": learner.version, "last": summary, "run_dir": str(out_dir), "final_model": str(final_dir)}
    return {}


def _save(learner: Any, coordinator: Any, ckpt_dir: Path, step: int, keep_last: int | None) -> Path:
    """Checkpoint after ``step`` steps (every rank): model, optimizer and RNG states plus the coordinator's ledger."""
    extra = {"coordinator": coordinator.state_dict() if coordinator is not None else None, "step": step}
    return Path(learner.save_checkpoint(ckpt_dir, extra=extra, keep_last=keep_last or 1_000_000))


def _close_run(coordinator: Any, publisher: Any, sink: Any) -> None:
    """The run is over (finished or stopped): tell the actors to shut down, close the weight sync and the sinks."""
    if coordinator is not None:
        coordinator.close(notify_actors=True)
    publisher.close()
    if sink is not None:
        sink.close()


def _audit(out_dir: Path, step: int, groups: list[Any]) -> None:
    """Append the prompt ids trained at ``step`` (and the version each group started under) to an audit log.

    ``trained_groups.jsonl`` lets anyone check exactly-once training across actor deaths and resumes.
    """
    record = {
        "step": step,
        "prompt_ids": [int(g.prompt_id) for g in groups],
        "start_versions": [int(min(c.version_min for c in g.completions)) for g in groups],
    }
    with open(out_dir / "trained_groups.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def _maybe_resume(cfg: Config, learner: Any, coordinator: Any, ckpt_dir: Path) -> int:
    """Load the checkpoint that ``trainer.resume_mode`` asks for; returns the step to continue from."""
    from async_rl.learner.checkpoint import latest

    mode = cfg.trainer.resume_mode
    if mode == "disable":
        return 0
    path = Path(cfg.trainer.resume_from_path) if mode == "resume_path" and cfg.trainer.resume_from_path else None
    if path is None:
        path = latest(ckpt_dir)
    if path is None:
        return 0
    extra = learner.load_checkpoint(path)
    state = extra if isinstance(extra, dict) else {}
    if coordinator is not None and state.get("coordinator") is not None:
        coordinator.load_state_dict(state["coordinator"])
    step = int(state.get("step", learner.version))
    logger.info("resumed from %s at policy version %d", path, learner.version)
    if learner.ctx.rank == 0:
        _truncate_audit(ckpt_dir.parent, step)
    return step


def _truncate_audit(out_dir: Path, step: int) -> None:
    """Steps trained after the checkpoint were lost with the crash and will be trained again: drop their records."""
    path = out_dir / "trained_groups.jsonl"
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(path)


def _open_sink(cfg: Config, out_dir: Path, total_steps: int) -> Any:
    from async_rl.config import config_to_dict
    from async_rl.runtime.metrics import MetricsLogger

    return MetricsLogger(
        out_dir,
        list(cfg.trainer.logger),
        project=cfg.trainer.project_name,
        experiment=cfg.trainer.experiment_name,
        total_steps=total_steps,
        config=config_to_dict(cfg),
    )
