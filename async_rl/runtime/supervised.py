"""The loop shared by the supervised jobs (reward-model training, SFT): :class:`SupervisedLoop`.

A job has a fixed list of training examples and steps over it epoch by epoch, each epoch in its own seeded shuffle
(``data.shuffle``, ``data.seed``), ``data.train_batch_size`` examples per optimizer step. One step reads top to bottom
in :meth:`SupervisedLoop.step`: the step's examples, the job's update, the evaluation when due (every
``trainer.test_freq`` steps and after the last), the largest rank's peak memory, the metrics line.

Checkpoints (``trainer.save_freq``) go to ``<run dir>/checkpoints/step_<N>`` through the learner's checkpoint code,
with the data cursor (the epoch and the index in that epoch's order of the next example) and what the order depends
on, so a resumed run (``trainer.resume_mode``) trains exactly the examples, in the order, an uninterrupted run would;
a checkpoint written over other data is refused with the keys that changed. SIGTERM
(:mod:`async_rl.runtime.graceful_stop`) is checked before each step, on every rank together: the run writes a
checkpoint of the steps it trained since the last one (when ``trainer.save_freq`` > 0) and stops without exporting.

A job subclasses it with its model, its update of a list of example indices (:meth:`SupervisedLoop.train_rows`),
its evaluation and its export (:meth:`SupervisedLoop.finish`).
"""

from __future__ import annotations

import logging
import os
import random
import time
from pathlib import Path
from typing import Any, Protocol

import torch

from async_rl import metric_catalog as mc
from async_rl.config.reward_model_train import RewardDataConfig
from async_rl.config.sft import SFTDataConfig
from async_rl.config.supervised import SupervisedTrainerConfig
from async_rl.runtime.graceful_stop import GracefulStop

__all__ = ["CHECKPOINT_DIR", "EXPORT_DIR", "SupervisedLoop", "console_line", "load_tokenizer", "supervised_run_dir"]

logger = logging.getLogger(__name__)

EXPORT_DIR = "hf"
CHECKPOINT_DIR = "checkpoints"


class _Checkpointed(Protocol):
    def save_checkpoint(self, root: str | Path, *, step: int, extra: dict[str, Any], keep_last: int | None) -> Path: ...

    def load_checkpoint(self, path: str | Path) -> tuple[int, dict[str, Any]]: ...


Column = tuple[str, str, str]  # (label, metric key, format) of one column of a step's console line


def console_line(step: int, total: int, metrics: dict[str, float], columns: tuple[Column, ...]) -> str:
    """``step 3/20 | loss 0.6931 | ...``: the ``columns`` the step's metrics have (the others are left out)."""
    parts = [f"step {step}/{total}"]
    parts += [f"{label} {fmt.format(metrics[key])}" for label, key, fmt in columns if key in metrics]
    return " | ".join(parts)


def supervised_run_dir(trainer: SupervisedTrainerConfig) -> Path:
    """``trainer.default_local_dir``, else ``outputs/<project>/<experiment>``."""
    t = trainer
    return Path(os.path.expanduser(t.default_local_dir or os.path.join("outputs", t.project_name, t.experiment_name)))


def load_tokenizer(path: str, chat_template: str | None) -> Any:
    """The model's tokenizer, with ``chat_template`` when given; a tokenizer without a pad token pads with EOS."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"the tokenizer of {path} has neither a pad nor an EOS token to pad with")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


class SupervisedLoop:
    """One rank's supervised run over ``examples`` training examples (see the module docstring).

    ``unit`` names an example in logs and errors ("pairs", "rows"); ``epoch_key`` and ``peak_key`` are the job's
    metric keys of the epoch and the peak memory. A subclass builds its model and calls :meth:`start` with it."""

    epoch_key: str
    peak_key: str

    def __init__(
        self,
        ctx: Any,
        stop: GracefulStop | None,
        *,
        data: RewardDataConfig | SFTDataConfig,
        trainer: SupervisedTrainerConfig,
        examples: int,
        unit: str,
    ) -> None:
        self.ctx, self.stop = ctx, stop
        self.loop_data, self.loop_trainer = data, trainer
        self.examples, self.unit = examples, unit
        self.out_dir = supervised_run_dir(trainer)
        b = data.train_batch_size
        if b % ctx.world_size:
            raise ValueError(f"data.train_batch_size={b} must be divisible by the {ctx.world_size} ranks")
        self.steps_per_epoch = examples // b
        if self.steps_per_epoch == 0:
            raise ValueError(f"{examples} training {unit} are fewer than data.train_batch_size={b}")
        self.total_steps = trainer.total_training_steps or trainer.total_epochs * self.steps_per_epoch
        self.ckpt_dir = self.out_dir / CHECKPOINT_DIR
        self.start_step = 0
        self.saved_step = 0  # the newest step a checkpoint holds (or the run started from)
        self.sink: Any = None
        self.checkpointed: _Checkpointed | None = None

    def start(self, checkpointed: _Checkpointed, config: dict[str, Any]) -> None:
        """Resume what ``trainer.resume_mode`` asks for into ``checkpointed`` and open the metric sinks (rank 0)."""
        self.checkpointed = checkpointed
        self.start_step = self._resume()
        self.saved_step = self.start_step
        if self.ctx.rank == 0:
            from async_rl.runtime.metrics import MetricsLogger

            t = self.loop_trainer
            self.sink = MetricsLogger(
                self.out_dir,
                [b for b in t.logger if b != "console"],  # the console gets the job's own line per step
                project=t.project_name,
                experiment=t.experiment_name,
                total_steps=self.total_steps,
                config=config,
            )

    # ------------------------------------------------------------------ the job's part
    def train_rows(self, rows: list[int]) -> dict[str, float]:
        """One optimizer step on the training examples ``rows`` (the same list on every rank)."""
        raise NotImplementedError

    def evaluate(self) -> dict[str, float]:
        """Held-out metrics (every rank takes part); empty without held-out data."""
        raise NotImplementedError

    def format_line(self, step: int, metrics: dict[str, float]) -> str:
        """The console line of step ``step`` (1-based)."""
        raise NotImplementedError

    def finish(self, last: dict[str, float]) -> dict[str, Any]:
        """After the last step: export; returns the summary's job-specific fields."""
        raise NotImplementedError

    # ------------------------------------------------------------------ checkpoints
    def _cursor(self, step: int) -> dict[str, Any]:
        """Where the data stands after ``step`` steps: the epoch and the index (in that epoch's order) of the next
        example, and what that order depends on (checked on resume)."""
        d = self.loop_data
        return {
            "step": step,
            "epoch": step // self.steps_per_epoch,
            "index": (step % self.steps_per_epoch) * d.train_batch_size,
            self.unit: self.examples,
            "train_batch_size": d.train_batch_size,
            "shuffle": d.shuffle,
            "seed": d.seed,
        }

    def _resume(self) -> int:
        """Load the checkpoint ``trainer.resume_mode`` asks for (every rank); the step to continue from."""
        from async_rl.learner.checkpoint import resume_path

        t = self.loop_trainer
        path = resume_path(t.resume_mode, t.resume_from_path, self.ckpt_dir)
        if path is None:
            return 0
        assert self.checkpointed is not None
        step, cursor = self.checkpointed.load_checkpoint(path)
        now = self._cursor(step)
        changed = [
            f"{'training ' + key if key == self.unit else 'data.' + key}: {cursor.get(key)!r} then, {now[key]!r} now"
            for key in (self.unit, "train_batch_size", "shuffle", "seed")
            if cursor.get(key) != now[key]
        ]
        if changed:
            raise ValueError(
                f"checkpoint {path} was written over other training data ({'; '.join(changed)}): resuming would"
                f" repeat or skip {self.unit}; set trainer.resume_mode=disable to start fresh"
            )
        assert (cursor["epoch"], cursor["index"]) == (now["epoch"], now["index"]), (cursor, now)
        if self.ctx.rank == 0:
            logger.info(
                "resumed from %s after step %d (epoch %d, %s %d of its order)",
                path,
                step,
                now["epoch"],
                self.unit,
                now["index"],
            )
        return step

    def _save(self, step: int) -> Path:
        assert self.checkpointed is not None
        path = self.checkpointed.save_checkpoint(
            self.ckpt_dir, step=step, extra=self._cursor(step), keep_last=self.loop_trainer.max_ckpt_to_keep
        )
        self.saved_step = step
        return path

    def _stopped(self, step: int) -> dict[str, Any]:
        """A signal stopped the run before step ``step``: checkpoint what is new (when checkpointing is on), close."""
        due = self.loop_trainer.save_freq > 0 and step > self.saved_step
        checkpoint = self._save(step) if due else None
        if self.ctx.rank == 0:
            logger.warning("stopped by signal after step %d; checkpoint: %s", step, checkpoint or "none written")
        if self.sink is not None:
            self.sink.close()
        return {"stopped": True, "steps": step, "checkpoint": str(checkpoint) if checkpoint else None}

    # ------------------------------------------------------------------ the run
    def order(self, epoch: int) -> list[int]:
        """Epoch ``epoch``'s order of the training examples (seeded; the same on every rank)."""
        order = list(range(self.examples))
        if self.loop_data.shuffle:
            random.Random(self.loop_data.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def step(self, step: int, order: list[int]) -> dict[str, float]:
        """Optimizer step ``step`` (0-based) on its examples of the epoch's ``order``; evaluates when due."""
        from async_rl.runtime.trainer import peak_memory_mib

        b = self.loop_data.train_batch_size
        start = (step % self.steps_per_epoch) * b
        metrics = self.train_rows(order[start : start + b])
        metrics[self.epoch_key] = float(step // self.steps_per_epoch)
        freq = self.loop_trainer.test_freq
        if (freq > 0 and (step + 1) % freq == 0) or step + 1 == self.total_steps:
            metrics.update(self.evaluate())
        peak = torch.tensor([peak_memory_mib(self.ctx.device)], dtype=torch.float64)
        metrics[self.peak_key] = float(self.ctx.all_reduce(peak, "max")[0])
        return metrics

    def train(self) -> dict[str, Any]:
        """Run every step from the start (or the resumed) step, checkpointing when due, finish, and return the summary
        (the steps, the last step's metrics and the job's fields); ``{"stopped": True, ...}`` after a signal."""
        started = time.monotonic()
        metrics: dict[str, float] = {}
        order: list[int] = []
        t = self.loop_trainer
        console = "console" in t.logger and self.ctx.rank == 0
        for step in range(self.start_step, self.total_steps):
            if self.stop is not None and self.stop.agreed(self.ctx):  # collective
                return self._stopped(step)
            if step == self.start_step or step % self.steps_per_epoch == 0:
                order = self.order(step // self.steps_per_epoch)
            metrics = self.step(step, order)
            metrics[mc.TIME_WALL_S] = time.monotonic() - started
            if self.sink is not None:
                self.sink.log(step + 1, metrics)
            if console:
                logger.info("%s", self.format_line(step + 1, metrics))
            if t.save_freq > 0 and ((step + 1) % t.save_freq == 0 or step + 1 == self.total_steps):
                self._save(step + 1)
        summary = {"steps": self.total_steps, **self.finish(metrics), "last": metrics}
        if self.sink is not None:
            self.sink.close()
        return summary
