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

The loop, checkpoints with the data cursor, resume and SIGTERM are the supervised jobs' shared
:class:`~async_rl.runtime.supervised.SupervisedLoop`.
"""

from __future__ import annotations

import json
import logging
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
from async_rl.runtime.supervised import EXPORT_DIR, SupervisedLoop, console_line, load_tokenizer, supervised_run_dir

if TYPE_CHECKING:
    from async_rl.learner.reward_model import PairScores

__all__ = ["REWARD_STATS_FILE", "RewardModelTrainer", "format_rm_line", "run_reward_model_training"]

logger = logging.getLogger(__name__)

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
    return console_line(step, total, metrics, _CONSOLE)


def run_dir(cfg: RewardModelTrainConfig) -> Path:
    return supervised_run_dir(cfg.trainer)


class RewardModelTrainer(SupervisedLoop):
    """One rank's reward-model run (see the module docstring); :meth:`train` runs it and returns the summary.
    ``stop``: the SIGTERM flag to check before each step (None: not checked)."""

    epoch_key = mc.RM_EPOCH
    peak_key = mc.RM_PERF_PEAK_MEMORY_MIB

    def __init__(self, cfg: RewardModelTrainConfig, ctx: Any, stop: GracefulStop | None = None) -> None:
        from async_rl.data.preferences import load_pairs, tokenize_pairs
        from async_rl.learner.reward_model import RewardModel

        self.cfg = cfg
        out_dir = run_dir(cfg)
        if ctx.rank == 0:  # rank 0 builds or converts a builtin model once; the others then find it on disk
            out_dir.mkdir(parents=True, exist_ok=True)
            resources.resolve_model_path(cfg.model.path, out_dir)
        ctx.barrier()
        model_path = resources.resolve_model_path(cfg.model.path, out_dir)
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
        super().__init__(ctx, stop, data=d, trainer=cfg.trainer, examples=len(self.train_pairs), unit="pairs")
        self.model = RewardModel(cfg, ctx, model_path, run_steps=self.total_steps, pad_token_id=pad)
        self.last_eval: PairScores | None = None  # the newest evaluation's scores
        self.start(self.model, config_to_dict(cfg))
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

    def format_line(self, step: int, metrics: dict[str, float]) -> str:
        return format_rm_line(step, self.total_steps, metrics)

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

    def train_rows(self, rows: list[int]) -> dict[str, float]:
        p = self.train_pairs
        return self.model.train_step(
            [p.chosen[i] for i in rows], [p.rejected[i] for i in rows], [p.margins[i] for i in rows]
        )

    def finish(self, last: dict[str, float]) -> dict[str, Any]:
        stats = self.reward_stats()
        return {"export": str(self.export(stats)), "reward_stats": stats}

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
