"""The reward-model training loop: :class:`RewardModelTrainer`, one rank's run, and :func:`run_reward_model_training`.

Every torchrun rank (or the one plain process) builds the same trainer: it resolves the model (rank 0 builds or
converts a builtin one first), loads and tokenizes the pairs (every rank the same, deterministically), builds the
:class:`~async_rl.learner.reward_model.RewardModel` and steps. One step reads top to bottom in
:meth:`RewardModelTrainer.train_step`: the step's pairs, the update, the evaluation when due, the metrics line. At the
end the model is exported as a Hugging Face sequence-classification directory (``<run dir>/hf``, with the tokenizer)
and ``<run dir>/hf/reward_stats.json`` holds the mean and standard deviation of its scores on the held-out pairs
(the training pairs without ``data.val_files``), for normalising rewards, and how a training sequence ended after
its response (``turn_end_ids``: the chat template's end of turn, ``[]`` for plain text), so that a scorer finishes a
sampled response the same way before reading its score.

Checkpoints (``trainer.save_freq``) go to ``<run dir>/checkpoints/step_<N>`` through the learner's checkpoint code
(:mod:`async_rl.learner.checkpoint`): model, optimizer, schedule, RNG states and the data cursor (the epoch and the
index in that epoch's shuffled order of the next pair), so a resumed run (``trainer.resume_mode``) trains exactly
the pairs, in the order, an uninterrupted run would. SIGTERM (:mod:`async_rl.runtime.graceful_stop`) is checked
before each step, on every rank together: the run writes a checkpoint of the steps it trained since the last one
(when ``trainer.save_freq`` > 0) and stops without exporting.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from async_rl import metric_catalog as mc
from async_rl.config.cli import config_to_dict
from async_rl.config.reward_model_train import RewardModelTrainConfig
from async_rl.rewards.model_score import REWARD_STATS_FILE, TURN_END_KEY
from async_rl.runtime import resources
from async_rl.runtime.graceful_stop import GracefulStop
from async_rl.runtime.rank_run import run_rank

if TYPE_CHECKING:
    from async_rl.learner.reward_model import PairScores

__all__ = ["REWARD_STATS_FILE", "RewardModelTrainer", "format_rm_line", "run_reward_model_training"]

logger = logging.getLogger(__name__)

EXPORT_DIR = "hf"
CHECKPOINT_DIR = "checkpoints"

# (label, key, format) of the console line of a step
_CONSOLE: tuple[tuple[str, str, str], ...] = (
    ("loss", mc.RM_TRAIN_LOSS, "{:.4f}"),
    ("acc", mc.RM_TRAIN_ACCURACY, "{:.3f}"),
    ("margin", mc.RM_TRAIN_MARGIN_MEAN, "{:.3f}"),
    ("grad", mc.RM_TRAIN_GRAD_NORM, "{:.3g}"),
    ("lr", mc.RM_TRAIN_LR, "{:.3g}"),
    ("step", mc.RM_PERF_STEP_S, "{:.2f}s"),
    ("eval acc", mc.RM_EVAL_ACCURACY, "{:.3f}"),
    ("eval margin", mc.RM_EVAL_MARGIN_MEAN, "{:.3f}"),
)


def format_rm_line(step: int, total: int, metrics: dict[str, float]) -> str:
    """``step 3/20 | loss 0.6931 | acc 0.500 | ...`` (keys a step does not have are left out)."""
    parts = [f"step {step}/{total}"]
    parts += [f"{label} {fmt.format(metrics[key])}" for label, key, fmt in _CONSOLE if key in metrics]
    return " | ".join(parts)


def run_dir(cfg: RewardModelTrainConfig) -> Path:
    t = cfg.trainer
    return Path(os.path.expanduser(t.default_local_dir or os.path.join("outputs", t.project_name, t.experiment_name)))


class RewardModelTrainer:
    """One rank's reward-model run (see the module docstring); :meth:`train` runs it and returns the summary.
    ``stop``: the SIGTERM flag to check before each step (None: not checked)."""

    def __init__(self, cfg: RewardModelTrainConfig, ctx: Any, stop: GracefulStop | None = None) -> None:
        from async_rl.data.preferences import load_pairs, tokenize_pairs
        from async_rl.learner.reward_model import RewardModel

        self.cfg, self.ctx, self.stop = cfg, ctx, stop
        self.out_dir = run_dir(cfg)
        if ctx.rank == 0:  # rank 0 builds or converts a builtin model once; the others then find it on disk
            self.out_dir.mkdir(parents=True, exist_ok=True)
            resources.resolve_model_path(cfg.model.path, self.out_dir)
        ctx.barrier()
        model_path = resources.resolve_model_path(cfg.model.path, self.out_dir)
        self.tokenizer = load_tokenizer(model_path, cfg.model.custom_chat_template)
        pad = int(self.tokenizer.pad_token_id)
        d = cfg.data
        self.train_pairs = tokenize_pairs(
            self.tokenizer, load_pairs(d.train_files, d, split="train"), d, pad_token_id=pad
        )
        self.val_pairs = None
        if d.val_files is not None:
            self.val_pairs = tokenize_pairs(
                self.tokenizer, load_pairs(d.val_files, d, split="eval"), d, pad_token_id=pad
            )
        for name, pairs in (("train", self.train_pairs), ("eval", self.val_pairs)):
            if pairs is not None and (pairs.truncated or pairs.dropped) and ctx.rank == 0:
                logger.warning(
                    "%s pairs: %d sequences cut to data.max_length=%d, %d pairs dropped",
                    name,
                    pairs.truncated,
                    d.max_length,
                    pairs.dropped,
                )
        if d.train_batch_size % ctx.world_size:
            raise ValueError(
                f"data.train_batch_size={d.train_batch_size} must be divisible by the {ctx.world_size} ranks"
            )
        self.steps_per_epoch = len(self.train_pairs) // d.train_batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"{len(self.train_pairs)} training pairs are fewer than data.train_batch_size={d.train_batch_size}"
            )
        t = cfg.trainer
        self.total_steps = t.total_training_steps or t.total_epochs * self.steps_per_epoch
        self.model = RewardModel(cfg, ctx, model_path, run_steps=self.total_steps, pad_token_id=pad)
        self.ckpt_dir = self.out_dir / CHECKPOINT_DIR
        self.start_step = self._resume()
        self.saved_step = self.start_step  # the newest step a checkpoint holds (or the run started from)
        self.sink = self._open_sink() if ctx.rank == 0 else None
        self.last_eval: PairScores | None = None  # the newest evaluation's scores
        if ctx.rank == 0:
            logger.info(
                "reward model: %d training pairs, %s held-out, %d steps of %d pairs over %d rank(s), compute %s",
                len(self.train_pairs),
                "no" if self.val_pairs is None else len(self.val_pairs),
                self.total_steps,
                d.train_batch_size,
                ctx.world_size,
                str(self.model.compute_dtype).removeprefix("torch."),
            )

    def _open_sink(self) -> Any:
        from async_rl.runtime.metrics import MetricsLogger

        t = self.cfg.trainer
        return MetricsLogger(
            self.out_dir,
            [b for b in t.logger if b != "console"],  # the console gets this loop's own line per step
            project=t.project_name,
            experiment=t.experiment_name,
            total_steps=self.total_steps,
            config=config_to_dict(self.cfg),
        )

    # ------------------------------------------------------------------ checkpoints
    def _cursor(self, step: int) -> dict[str, Any]:
        """Where the data stands after ``step`` steps: the epoch and the index (in that epoch's order) of the next
        pair, and what that order depends on (checked on resume)."""
        d = self.cfg.data
        return {
            "step": step,
            "epoch": step // self.steps_per_epoch,
            "index": (step % self.steps_per_epoch) * d.train_batch_size,
            "pairs": len(self.train_pairs),
            "train_batch_size": d.train_batch_size,
            "shuffle": d.shuffle,
            "seed": d.seed,
        }

    def _resume(self) -> int:
        """Load the checkpoint ``trainer.resume_mode`` asks for (every rank); the step to continue from."""
        from async_rl.learner.checkpoint import resume_path

        t = self.cfg.trainer
        path = resume_path(t.resume_mode, t.resume_from_path, self.ckpt_dir)
        if path is None:
            return 0
        step, cursor = self.model.load_checkpoint(path)
        now = self._cursor(step)
        changed = [
            f"{'training pairs' if key == 'pairs' else 'data.' + key}: {cursor.get(key)!r} then, {now[key]!r} now"
            for key in ("pairs", "train_batch_size", "shuffle", "seed")
            if cursor.get(key) != now[key]
        ]
        if changed:
            raise ValueError(
                f"checkpoint {path} was written over other training data ({'; '.join(changed)}): resuming would"
                " repeat or skip pairs; set trainer.resume_mode=disable to start fresh"
            )
        assert (cursor["epoch"], cursor["index"]) == (now["epoch"], now["index"]), (cursor, now)
        if self.ctx.rank == 0:
            logger.info(
                "resumed from %s after step %d (epoch %d, pair %d of its order)", path, step, now["epoch"], now["index"]
            )
        return step

    def _save(self, step: int) -> Path:
        t = self.cfg.trainer
        path = self.model.save_checkpoint(
            self.ckpt_dir, step=step, extra=self._cursor(step), keep_last=t.max_ckpt_to_keep
        )
        self.saved_step = step
        return path

    def _stopped(self, step: int) -> dict[str, Any]:
        """A signal stopped the run before step ``step``: checkpoint what is new (when checkpointing is on), close."""
        due = self.cfg.trainer.save_freq > 0 and step > self.saved_step
        checkpoint = self._save(step) if due else None
        if self.ctx.rank == 0:
            logger.warning("stopped by signal after step %d; checkpoint: %s", step, checkpoint or "none written")
        if self.sink is not None:
            self.sink.close()
        return {"stopped": True, "steps": step, "checkpoint": str(checkpoint) if checkpoint else None}

    # ------------------------------------------------------------------ the run
    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.train_pairs)))
        if self.cfg.data.shuffle:
            random.Random(self.cfg.data.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def evaluate(self) -> dict[str, float]:
        """Held-out metrics (every rank takes part); empty without data.val_files."""
        if self.val_pairs is None:
            return {}
        started = time.monotonic()
        scores = self.model.score_pairs(self.val_pairs.chosen, self.val_pairs.rejected)
        self.last_eval = scores
        margins = torch.tensor(self.val_pairs.margins, dtype=torch.float64)
        out = scores.summary(margins, self.cfg.loss.center_rewards_coefficient)
        out[mc.RM_EVAL_WALL_S] = time.monotonic() - started
        return out

    def train_step(self, step: int, order: list[int]) -> dict[str, float]:
        """Optimizer step ``step`` (0-based) on its pairs of the epoch's ``order``; evaluates when due."""
        from async_rl.runtime.trainer import peak_memory_mib

        b = self.cfg.data.train_batch_size
        start = (step % self.steps_per_epoch) * b
        rows = order[start : start + b]
        p = self.train_pairs
        metrics = self.model.train_step(
            [p.chosen[i] for i in rows], [p.rejected[i] for i in rows], [p.margins[i] for i in rows]
        )
        metrics[mc.RM_EPOCH] = float(step // self.steps_per_epoch)
        freq = self.cfg.trainer.test_freq
        if (freq > 0 and (step + 1) % freq == 0) or step + 1 == self.total_steps:
            metrics.update(self.evaluate())
        peak = torch.tensor([peak_memory_mib(self.ctx.device)], dtype=torch.float64)
        metrics[mc.RM_PERF_PEAK_MEMORY_MIB] = float(self.ctx.all_reduce(peak, "max")[0])
        return metrics

    def train(self) -> dict[str, Any]:
        """Run every step from the start (or the resumed) step, checkpointing when due, export, and return the summary
        (the last step's metrics, paths, reward statistics); ``{"stopped": True, ...}`` after a signal."""
        started = time.monotonic()
        metrics: dict[str, float] = {}
        order: list[int] = []
        t = self.cfg.trainer
        console = "console" in t.logger and self.ctx.rank == 0
        for step in range(self.start_step, self.total_steps):
            if self.stop is not None and self.stop.agreed(self.ctx):  # collective
                return self._stopped(step)
            if step == self.start_step or step % self.steps_per_epoch == 0:
                order = self._order(step // self.steps_per_epoch)
            metrics = self.train_step(step, order)
            metrics[mc.TIME_WALL_S] = time.monotonic() - started
            if self.sink is not None:
                self.sink.log(step + 1, metrics)
            if console:
                logger.info("%s", format_rm_line(step + 1, self.total_steps, metrics))
            if t.save_freq > 0 and ((step + 1) % t.save_freq == 0 or step + 1 == self.total_steps):
                self._save(step + 1)
        stats = self.reward_stats()
        export = self.export(stats)
        if self.sink is not None:
            self.sink.close()
        return {"steps": self.total_steps, "export": str(export), "reward_stats": stats, "last": metrics}

    def reward_stats(self) -> dict[str, Any]:
        """Mean and standard deviation of the final model's scores on the held-out pairs (else the training pairs)."""
        pairs = self.val_pairs if self.val_pairs is not None else self.train_pairs
        # the last step always evaluates when there are held-out pairs: its scores are the final model's
        scores = self.last_eval if self.last_eval is not None else self.model.score_pairs(pairs.chosen, pairs.rejected)
        both = torch.cat([scores.chosen, scores.rejected])
        return {
            "mean": float(both.mean()),
            "std": float(both.std(unbiased=False)),
            "num_pairs": len(pairs),
            "split": "eval" if self.val_pairs is not None else "train",
            TURN_END_KEY: self.turn_end(),
        }

    def turn_end(self) -> list[int] | None:
        """How the training sequences ended after a response: the chat template's end of turn, [] for plain text,
        None (with a warning) when that cannot be told (a template that is not prefix-consistent, or both kinds)."""
        from async_rl.data.preferences import turn_end_ids

        chat = self.train_pairs.chat
        if chat == 0:
            return []
        ids = turn_end_ids(self.tokenizer)
        if ids is None or chat < len(self.train_pairs):
            if self.ctx.rank == 0:
                logger.warning(
                    "the scorer cannot finish sampled responses as these pairs end (%d of %d chat-rendered, template"
                    " end of turn %s): it will score them as sampled",
                    chat,
                    len(self.train_pairs),
                    "unknown" if ids is None else ids,
                )
            return None
        return ids

    def export(self, stats: dict[str, Any]) -> Path:
        out = self.model.export(self.out_dir / EXPORT_DIR)
        if self.ctx.rank == 0:
            self.tokenizer.save_pretrained(str(out))
            (out / REWARD_STATS_FILE).write_text(json.dumps(stats, indent=2) + "\n")
            logger.info("reward model exported to %s (reward mean %.4f, std %.4f)", out, stats["mean"], stats["std"])
        self.ctx.barrier()
        return out


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


def run_reward_model_training(cfg: RewardModelTrainConfig) -> dict[str, Any]:
    """Join the torchrun group (or run as one process), train, export; rank 0's summary (an empty dict elsewhere;
    ``{"stopped": True, ...}`` on every rank after SIGTERM)."""
    ctx, summary = run_rank(
        "reward-model",
        stop_s=cfg.trainer.stop_s,
        collective_s=cfg.trainer.collective_timeout_s,
        body=lambda ctx, stop: RewardModelTrainer(cfg, ctx, stop).train(),
    )
    return summary if ctx.rank == 0 or summary.get("stopped") else {}
