"""The supervised fine-tuning run: :class:`SFTTrainer`, one rank's run, and :func:`run_sft`.

Every torchrun rank (or the one plain process) builds the same trainer: it resolves the model (rank 0 builds or
converts a builtin one first), loads and renders the records (every rank the same, deterministically:
:mod:`async_rl.data.sft`), builds the :class:`~async_rl.learner.sft.SFTModel` and steps through the supervised jobs'
shared loop (:class:`~async_rl.runtime.supervised.SupervisedLoop`: epochs in seeded order, checkpoints with the data
cursor, exact resume, SIGTERM). Validation is the loss per demonstrated token on ``data.val_files``. At the end the
model is exported as a Hugging Face causal-LM directory (``<run dir>/hf``, with the tokenizer; LoRA adapters merged),
which is what an RL config's ``actor_rollout_ref.model.path`` takes next.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from async_rl import metric_catalog as mc
from async_rl.config.cli import config_to_dict
from async_rl.config.sft import SFTConfig
from async_rl.runtime import resources
from async_rl.runtime.graceful_stop import GracefulStop
from async_rl.runtime.rank_run import run_rank
from async_rl.runtime.supervised import EXPORT_DIR, SupervisedLoop, console_line, load_tokenizer, supervised_run_dir

__all__ = ["SFTTrainer", "format_sft_line", "run_sft"]

logger = logging.getLogger(__name__)

# (label, key, format) of the console line of a step
_CONSOLE: tuple[tuple[str, str, str], ...] = (
    ("loss", mc.SFT_TRAIN_LOSS, "{:.4f}"),
    ("grad", mc.SFT_TRAIN_GRAD_NORM, "{:.3g}"),
    ("lr", mc.SFT_TRAIN_LR, "{:.3g}"),
    ("tok/s", mc.SFT_PERF_TOKENS_PER_S, "{:.0f}"),
    ("step", mc.SFT_PERF_STEP_S, "{:.2f}s"),
    ("val loss", mc.SFT_VAL_LOSS, "{:.4f}"),
)


def format_sft_line(step: int, total: int, metrics: dict[str, float]) -> str:
    """``step 3/20 | loss 1.2345 | ...`` (keys a step does not have are left out)."""
    return console_line(step, total, metrics, _CONSOLE)


class SFTTrainer(SupervisedLoop):
    """One rank's SFT run (see the module docstring); :meth:`train` runs it and returns the summary.
    ``stop``: the SIGTERM flag to check before each step (None: not checked)."""

    epoch_key = mc.SFT_EPOCH
    peak_key = mc.SFT_PERF_PEAK_MEMORY_MIB

    def __init__(self, cfg: SFTConfig, ctx: Any, stop: GracefulStop | None = None) -> None:
        from async_rl.data.sft import load_sft_records, smoothing_token_ids, tokenize_sft
        from async_rl.learner.sft import SFTModel

        self.cfg = cfg
        out_dir = supervised_run_dir(cfg.trainer)
        if ctx.rank == 0:  # rank 0 builds or converts a builtin model once; the others then find it on disk
            out_dir.mkdir(parents=True, exist_ok=True)
            resources.resolve_model_path(cfg.model.partial_pretrain, out_dir)
        ctx.barrier()
        model_path = resources.resolve_model_path(cfg.model.partial_pretrain, out_dir)
        self.tokenizer = load_tokenizer(model_path, cfg.model.custom_chat_template)
        self.pad_token_id = int(self.tokenizer.pad_token_id)
        d = cfg.data
        self.train_data = tokenize_sft(self.tokenizer, load_sft_records(d.train_files, d, split="train"), d)
        self.val_data = None
        if d.val_files is not None:
            self.val_data = tokenize_sft(self.tokenizer, load_sft_records(d.val_files, d, split="eval"), d)
        for name, rows in (("train", self.train_data), ("validation", self.val_data)):
            if rows is not None and rows.truncated and ctx.rank == 0:
                logger.warning(
                    "%s rows: %d cut to data.max_length=%d (data.truncation=%s)",
                    name,
                    rows.truncated,
                    d.max_length,
                    d.truncation,
                )
        super().__init__(ctx, stop, data=d, trainer=cfg.trainer, examples=len(self.train_data), unit="rows")
        self.model = SFTModel(
            cfg, ctx, model_path, run_steps=self.total_steps, smooth_ids=smoothing_token_ids(self.tokenizer)
        )
        self.start(self.model, config_to_dict(cfg))
        if ctx.rank == 0:
            trained = sum(ex.trained_tokens for ex in self.train_data.examples)
            logger.info(
                "sft: %d training rows (%d chat-rendered, %d demonstrated tokens), %s held-out, %d steps of %d rows"
                " over %d rank(s), compute %s",
                len(self.train_data),
                self.train_data.chat,
                trained,
                "no" if self.val_data is None else len(self.val_data),
                self.total_steps,
                d.train_batch_size,
                ctx.world_size,
                str(self.model.compute_dtype).removeprefix("torch."),
            )

    def batch(self, rows: Any, indices: list[int]) -> Any:
        """The rows ``indices`` of ``rows`` (a :class:`~async_rl.data.sft.TokenizedSFT`) as the learner's batch."""
        from async_rl.learner.batching import Row, collate_rows

        picked = [rows.examples[i] for i in indices]
        return collate_rows(
            [
                Row(i, ex.prompt_ids, ex.response_ids, [0.0] * len(ex.response_ids), 0.0, 0, False, ex.loss_mask)
                for i, ex in enumerate(picked)
            ],
            max_prompt_length=None,
            max_response_length=None,
            pad_token_id=self.pad_token_id,
        )

    def train_rows(self, rows: list[int]) -> dict[str, float]:
        return self.model.train_step(self.batch(self.train_data, rows))

    def evaluate(self) -> dict[str, float]:
        if self.val_data is None:
            return {}
        started = time.monotonic()
        nll, tokens = self.model.nll(self.batch(self.val_data, list(range(len(self.val_data)))))
        loss = nll / max(tokens, 1.0)
        return {
            mc.SFT_VAL_LOSS: loss,
            mc.SFT_VAL_PERPLEXITY: math.exp(min(loss, 50.0)),
            mc.SFT_VAL_TOKENS: tokens,
            mc.SFT_VAL_WALL_S: time.monotonic() - started,
        }

    def format_line(self, step: int, metrics: dict[str, float]) -> str:
        return format_sft_line(step, self.total_steps, metrics)

    def finish(self, last: dict[str, float]) -> dict[str, Any]:
        out = self.model.export(self.out_dir / EXPORT_DIR)
        if self.ctx.rank == 0:
            self.tokenizer.save_pretrained(str(out))
            logger.info("fine-tuned model exported to %s", out)
        self.ctx.barrier()
        return {"export": str(out)}


def run_sft(cfg: SFTConfig) -> dict[str, Any]:
    """Join the torchrun group (or run as one process), train, export; rank 0's summary (an empty dict elsewhere;
    ``{"stopped": True, ...}`` on every rank after SIGTERM)."""
    ctx, summary = run_rank(
        "sft",
        stop_s=cfg.trainer.stop_s,
        collective_s=cfg.trainer.collective_timeout_s,
        body=lambda ctx, stop: SFTTrainer(cfg, ctx, stop).train(),
    )
    return summary if ctx.rank == 0 or summary.get("stopped") else {}
