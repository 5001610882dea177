"""What the supervised jobs' models share (the reward model, the SFT model): one trained model (``self.trained``, a
:class:`~async_rl.learner.update.TrainedModel`) saved and restored through the learner's checkpoint code under one
name, with the job's data cursor as ``extra``, and exported as a Hugging Face directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from async_rl.config.supervised import SupervisedOptimConfig, SupervisedTrainerConfig
from async_rl.learner.checkpoint import load_trained, save_trained
from async_rl.learner.dist import DistContext
from async_rl.learner.export import export_hf
from async_rl.learner.optim import NonFiniteGuard, build_optimizer, guarded_step
from async_rl.learner.update import TrainedModel

__all__ = ["SupervisedModel"]


class SupervisedModel:
    """Base of a supervised job's model: a subclass sets ``ctx`` and builds its model, then calls :meth:`_train`
    (``name`` names it in the checkpoint)."""

    ctx: DistContext
    trained: TrainedModel

    def _train(
        self,
        model: torch.nn.Module,
        optim: SupervisedOptimConfig,
        trainer: SupervisedTrainerConfig,
        *,
        run_steps: int,
        name: str,
    ) -> None:
        """Make ``model`` the trained one: the learner's AdamW and schedule from ``optim`` over ``run_steps``, its
        gradient clip (``optim.clip_grad``) and non-finite guard (``trainer.max_consecutive_nonfinite``)."""
        optimizer, scheduler = build_optimizer(model, optim, run_steps=run_steps, section="optim")
        self.trained = TrainedModel(
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            guard=NonFiniteGuard(trainer.max_consecutive_nonfinite),
            max_norm=optim.clip_grad,
            name=name,
        )

    def _step(self, loss: torch.Tensor) -> tuple[float, bool, float]:
        """The optimizer step after the step's backward passes: (the learning rate it used, whether it stepped, the
        gradient norm); a non-finite ``loss`` or gradient skips it (the guard counts it)."""
        tr = self.trained
        lr = tr.lr
        stepped, norm = guarded_step(
            tr.model, tr.optimizer, tr.scheduler, max_norm=tr.max_norm, loss=loss, guard=tr.guard, what=tr.name
        )
        return lr, stepped, norm

    @property
    def model(self) -> torch.nn.Module:
        return self.trained.model

    def save_checkpoint(self, root: str | Path, *, step: int, extra: dict[str, Any], keep_last: int | None) -> Path:
        """Model, optimizer, schedule, guard and RNG states after ``step`` steps, with the caller's ``extra`` (the data
        cursor), as ``<root>/step_<step>`` (:func:`~async_rl.learner.checkpoint.save_trained`); every rank calls it."""
        trained = {self.trained.name: self.trained}
        return save_trained(self.ctx, trained, root, step=step, fields={"extra": extra}, keep_last=keep_last)

    def load_checkpoint(self, path: str | Path) -> tuple[int, dict[str, Any]]:
        """Restore from a committed checkpoint (every rank); returns its step and the saved ``extra``."""
        meta = load_trained(self.ctx, {self.trained.name: self.trained}, path)
        return int(meta["version"]), dict(meta["extra"])

    def export(self, out_dir: str | Path) -> Path:
        """The full model as a Hugging Face directory (fp32; LoRA adapters merged); every rank calls it."""
        return export_hf(self.model, self.ctx, out_dir, dtype=None)
