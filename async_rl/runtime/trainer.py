"""The :class:`Trainer`: one learner rank's run, built from the config, stepped until the run length or the data ends.

Every torchrun rank builds one (see :mod:`async_rl.runtime.learner_main`); rank 0's also owns the coordinator, the
metric sinks and the audit log. The state a step changes lives on the object: the learner (weights, version), the
newest published version, the newest checkpointed step. One step reads top to bottom in :meth:`Trainer.train_step`:
the batch from the :class:`RolloutSource`, the update, the ledger, the weight publish, the checkpoint, validation,
the metrics line.
"""

from __future__ import annotations

import json
import logging
import resource
import time
from pathlib import Path
from typing import Any

import torch

from async_rl import metric_catalog as mc
from async_rl.config import Config
from async_rl.config.distillation import teacher_at
from async_rl.config.names import needs_critic
from async_rl.config.precision import precision_line
from async_rl.config.resolve import learner_start, resolved, served_check_tolerance
from async_rl.runtime import resources
from async_rl.runtime.graceful_stop import GracefulStop, StopRequested, step_outlasts_deadline
from async_rl.runtime.metrics import ActorActivity
from async_rl.runtime.rollout_metrics import rollout_metrics
from async_rl.runtime.rollout_source import RolloutSource, StepRollouts
from async_rl.runtime.run_state import append_audit, maybe_resume, save_checkpoint

__all__ = ["Trainer", "load_prompts"]

logger = logging.getLogger(__name__)


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


def learner_teacher(cfg: Config) -> str | None:
    """The teacher model the learner computes (``distillation.teacher_model.model_path`` with ``placement: learner``),
    None otherwise."""
    if not teacher_at(cfg.distillation, "learner"):
        return None
    return resolved(cfg.distillation.teacher_model.model_path, "distillation.teacher_model.model_path")


class Trainer:
    """One learner rank's run (see the module docstring); :meth:`train` runs it and returns rank 0's summary."""

    def __init__(self, cfg: Config, ctx: Any, stop: GracefulStop) -> None:
        from async_rl.learner.step import Learner
        from async_rl.runtime.validation import build_validator
        from async_rl.weight_sync.publisher import WeightPublisher

        self.cfg, self.ctx, self.stop = cfg, ctx, stop
        self.out_dir = resources.run_dir(cfg)
        teacher_spec = learner_teacher(cfg)
        if ctx.rank == 0:  # rank 0 builds builtin models once; the others then find them on disk
            self.out_dir.mkdir(parents=True, exist_ok=True)
            resources.resolve_model_path(cfg.actor_rollout_ref.model.path, self.out_dir)
            if teacher_spec is not None:
                resources.resolve_model_path(teacher_spec, self.out_dir)
        ctx.barrier()
        policy_path = resources.resolve_model_path(cfg.actor_rollout_ref.model.path, self.out_dir)
        self.tokenizer = resources.load_tokenizer(cfg, policy_path)
        records, self.total_steps = load_prompts(cfg, ctx, self.tokenizer)
        if ctx.rank == 0:
            arr = cfg.actor_rollout_ref
            logger.info(
                "policy %s; %s; shared prompts %s",
                policy_path,
                precision_line(
                    arr.actor.fsdp_config.mixed_precision.param_dtype,
                    arr.rollout.dtype,
                    learner_device=ctx.device.type,
                    actor_device="cuda" if torch.cuda.is_available() else "cpu",
                ),
                "on" if arr.model.use_shared_prompt else "off",
            )
        start = learner_start(
            cfg, pad_token_id=int(self.tokenizer.pad_token_id or 0), total_training_steps=self.total_steps
        )
        critic_path = None
        if needs_critic(cfg.algorithm.adv_estimator):
            critic_path = resources.resolve_model_path(cfg.critic.model.path or policy_path, self.out_dir)
        teacher_path = None
        if teacher_spec is not None:  # on-policy distillation with the teacher on the learner
            teacher_path = resources.resolve_model_path(teacher_spec, self.out_dir)
            teacher_tokenizer = resources.load_tokenizer(cfg, teacher_path)
            resources.check_same_vocabulary(self.tokenizer, teacher_tokenizer, teacher_path=teacher_spec)
        self.learner = Learner(cfg, start, ctx, policy_path, critic=critic_path, teacher=teacher_path)
        self.coordinator = self._coordinator(records) if records is not None else None
        ws = cfg.async_training.weight_sync
        self.publisher = WeightPublisher.from_config(
            ws,
            ctx,
            self.coordinator,
            adapter=self.learner.adapter_plan(),
            served_check_tolerance=served_check_tolerance(
                ws.served_check_tolerance,
                rollout_dtype=cfg.actor_rollout_ref.rollout.dtype,
                device_type="cuda" if torch.cuda.is_available() else "cpu",  # the actors' as this host would resolve it
                param_dtype=cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype,
                learner_device_type=ctx.device.type,
            ),
        )
        self.ckpt_dir = self.out_dir / "checkpoints"
        self.start_step = maybe_resume(cfg, self.learner, self.coordinator, self.ckpt_dir)
        self.saved_step = self.start_step  # the newest step a checkpoint holds (or the run started from)
        self.published = self.learner.version  # the newest version the actors were sent (or start with)
        self.warned_stop_deadline = False
        self.sink = self._open_sink() if ctx.rank == 0 else None
        self.started = time.monotonic()
        self.validator = build_validator(cfg, ctx, self.coordinator, self.tokenizer, self._log_validation)
        self.source = RolloutSource(
            ctx,
            self.coordinator,
            self.publisher,
            self.learner,
            batch_size=cfg.data.train_batch_size,
            republish=lambda: self._publish(self.learner.version),  # one publish path, probe included
            stop=stop,
        )
        self.actor_activity = ActorActivity()

    # ------------------------------------------------------------------ set-up
    def _coordinator(self, records: list[Any]) -> Any:
        from async_rl.transport import Coordinator, GroupSampling

        cfg = self.cfg
        coordinator = Coordinator(
            records,
            cfg.async_training,
            groups_per_step=cfg.data.train_batch_size,
            sampling=GroupSampling.from_config(cfg, seed=cfg.trainer.seed),
            seed=cfg.trainer.seed,
            shuffle_seed=cfg.data.seed if cfg.data.shuffle else None,
            max_epochs=cfg.trainer.total_epochs,
            autostart=False,
            vocab_size=self.learner.vocab_size,  # the embedding's rows: delivered token ids are checked against them
            filter_groups=cfg.algorithm.filter_groups,  # DAPO dynamic sampling (transport/filtering.py)
            # on-policy distillation with the teacher on the actors: groups carry its scores
            teacher_required=teacher_at(cfg.distillation, "actor"),
        )
        logger.info("coordinator at %s with %d prompts", coordinator.address, len(records))
        return coordinator

    def _open_sink(self) -> Any:
        from async_rl.config import config_to_dict
        from async_rl.runtime.metrics import MetricsLogger

        t = self.cfg.trainer
        return MetricsLogger(
            self.out_dir,
            list(t.logger),
            project=t.project_name,
            experiment=t.experiment_name,
            total_steps=self.total_steps,
            config=config_to_dict(self.cfg),
        )

    def _log_validation(self, step: int, values: dict[str, float]) -> None:
        if self.sink is not None:
            self.sink.log(step, {**values, mc.TIME_WALL_S: time.monotonic() - self.started})

    # ------------------------------------------------------------------ the run
    def train(self) -> dict[str, Any]:
        """Step until the run length or the end of the data; ``{"stopped": True, ...}`` after a signal."""
        if self.coordinator is not None:
            if self.start_step:
                self.coordinator.set_policy_version(self.learner.version)
            self.coordinator.start()
        if self.validator.at_start():
            self.validator.start(self.learner.version)
        summary: dict[str, float] = {}
        for step in range(self.start_step, self.total_steps):
            step_started = time.monotonic()
            try:
                rollouts = self._next_rollouts(step)
            except StopRequested:
                return self._stopped(step)
            if rollouts is None:
                if self.ctx.rank == 0:
                    logger.warning("data exhausted after %d of %d steps: stopping the run", step, self.total_steps)
                break
            summary = self.train_step(step, rollouts, step_started)
            self._check_stop_deadline(time.monotonic() - step_started - rollouts.wait_s)
        return self._finish(summary)

    def _check_stop_deadline(self, busy_s: float) -> None:
        """Warn once (rank 0) when a step's work outlasts the stop deadline (see ``step_outlasts_deadline``)."""
        warning = step_outlasts_deadline(busy_s, self.cfg.async_training.timeouts.stop_s)
        if warning is not None and not self.warned_stop_deadline and self.ctx.rank == 0:
            self.warned_stop_deadline = True
            logger.warning("%s", warning)

    def _next_rollouts(self, step: int) -> StepRollouts | None:
        """The step's batch; the source checks the stop signal (collectively) before it waits, and while it waits."""
        t = self.cfg.async_training.timeouts
        # The first step also waits for the actors to start (engine start-up, model load).
        return self.source.next(t.step_s + (t.actor_start_s if step == self.start_step else 0.0))

    def train_step(self, step: int, rollouts: StepRollouts, step_started: float) -> dict[str, float]:
        """Step ``step`` -> policy version ``step + 1``: update, ledger, publish, checkpoint, validation, metrics."""
        metrics = self.learner.train_batch(rollouts.batch, rollouts.group_ids)
        version = self.learner.version
        if self.coordinator is not None:
            metrics.update(rollout_metrics(rollouts.groups, version - 1, self.tokenizer.eos_token_id))
            self.coordinator.mark_trained([g.prompt_id for g in rollouts.groups])
            append_audit(self.out_dir, step + 1, rollouts.groups)
        metrics.update(self._sync(version))
        every = self.cfg.async_training.checkpoint.save_every_n_steps
        if every and (version % every == 0 or step + 1 == self.total_steps):
            self._save(step + 1)
        self.validator.poll()  # a finished round is logged at its own (earlier) step before this step's line
        # the largest rank's peak (every rank joins this one-number reduction)
        peak = float(self.ctx.all_reduce(torch.tensor([peak_memory_mib(self.ctx.device)]), op="max")[0])
        if self.sink is not None and self.coordinator is not None:
            metrics.update(self.coordinator.metrics())
            metrics.update(self.actor_activity(metrics))
            waited = rollouts.wait_s + metrics.get(mc.LEARNER_VALIDATION_WAIT_S, 0.0)
            metrics[mc.LEARNER_IDLE_FRACTION] = waited / max(time.monotonic() - step_started, 1e-9)
            metrics[mc.TIME_WALL_S] = time.monotonic() - self.started
            metrics[mc.LEARNER_PEAK_MEMORY_MIB] = peak
            self.sink.log(step + 1, metrics)
        return metrics

    def _sync(self, version: int) -> dict[str, float]:
        """Publish ``version`` every ``sync_every_n_steps`` and whenever it is due for validation (its round needs it
        on the actors); otherwise the coordinator only learns the new version."""
        validate = self.validator.due(version)
        if self.stop.agreed(self.ctx):  # collective; the actors are being stopped too: checkpoint, do not publish
            return {}
        if version % self.cfg.async_training.sync_every_n_steps == 0 or validate:
            report = self._publish(version)
            if validate:
                self.validator.start(version)
            return report
        if self.coordinator is not None:
            self.coordinator.set_policy_version(version)
        return {}

    def _publish(self, version: int) -> dict[str, float]:
        """The one way weights reach the actors (a step's publish, the re-publish to an actor that joined while the
        learner waited, the final version's): the validation wait, then, in a LoRA run, the served-weights probe of
        ``version`` on the plan, so every actor that loads an adapter checks that it serves it."""
        waited_s = self.validator.before_publish(version)
        probe = None
        if self.learner.lora is not None:  # the actors check that they serve this version's adapter
            max_len = self.cfg.actor_rollout_ref.rollout.max_model_len or PROBE_LENGTH + 1
            # vLLM needs room for one generated token after the probe
            ids = probe_token_ids(self.learner.vocab_size or len(self.tokenizer), min(PROBE_LENGTH, max_len - 1))
            probe = (ids, self.learner.probe_log_probs(ids))
        # the master weights, cast by the publisher to the dtype the actors serve when every one of them says it
        report = self.publisher.publish(
            version,
            lambda dtype: self.learner.iter_weights(dtype=dtype),
            lambda dtype: self.learner.weight_manifest(dtype=dtype),
            probe=probe,
        )
        self.published = version
        return {**report, mc.LEARNER_VALIDATION_WAIT_S: waited_s}

    def _save(self, step: int) -> Path:
        path = save_checkpoint(
            self.learner, self.coordinator, self.ckpt_dir, step, self.cfg.async_training.checkpoint.keep_last
        )
        self.saved_step = step
        return path

    def _stopped(self, step: int) -> dict[str, Any]:
        """A signal stopped the run before step ``step``: checkpoint what is new (if checkpointing is on), close."""
        due = bool(self.cfg.async_training.checkpoint.save_every_n_steps) and step > self.saved_step
        checkpoint = self._save(step) if due else None
        if self.ctx.rank == 0:
            logger.warning("stopped by signal after step %d; checkpoint: %s", step, checkpoint or "none written")
        self._close()
        return {"stopped": True, "steps": step, "checkpoint": str(checkpoint) if checkpoint else None}

    def _finish(self, summary: dict[str, float]) -> dict[str, Any]:
        """The final validation round (its version published first if sync skipped it), close, export the model."""
        from async_rl.learner.export import export_adapter, export_hf

        version = self.learner.version
        if self.validator.at_end() and self.validator.last_version != version:
            if self.published != version:
                self._publish(version)
            self.validator.start(version)
        self.validator.wait()
        self._close()
        final_dir = self.out_dir / "final_hf"
        export_hf(self.learner.model, self.ctx, final_dir, dtype=None)  # collective; rank 0 writes (LoRA: merged)
        adapter = self.learner.adapter_config(self.cfg.actor_rollout_ref.model.path)
        adapter_dir = self.out_dir / "final_adapter"
        if adapter is not None:
            export_adapter(self.learner.model, self.ctx, adapter_dir, adapter)
        if self.ctx.rank != 0:
            return {}
        self.tokenizer.save_pretrained(final_dir)
        result = {"steps": version, "last": summary, "run_dir": str(self.out_dir), "final_model": str(final_dir)}
        if adapter is not None:
            result["final_adapter"] = str(adapter_dir)
        return result

    def _close(self) -> None:
        """The run is over (finished or stopped): tell the actors to shut down, close the weight sync and the sinks."""
        if self.coordinator is not None:
            self.coordinator.close(notify_actors=True)
        self.publisher.close()
        if self.sink is not None:
            self.sink.close()


def peak_memory_mib(device: torch.device) -> float:
    """This learner rank's peak memory so far, in MiB: CUDA's peak allocation on a GPU, the process's peak resident
    set (``ru_maxrss``) on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


PROBE_LENGTH = 32


def probe_token_ids(vocab_size: int, length: int = PROBE_LENGTH) -> list[int]:
    """The served-weights probe: a fixed sequence of token ids spread over the vocabulary (any model, no tokenizer);
    ``length`` below the engine's ``max_model_len`` (vLLM refuses a prompt with no room for one token)."""
    return [(i * 7919 + 13) % vocab_size for i in range(max(2, length))]
