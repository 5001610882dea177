"""How many training steps a run takes: ``trainer.total_training_steps``, or derived from the data as verl does.

verl runs ``len(train_dataloader) * trainer.total_epochs`` steps, its dataloader dropping the last incomplete batch
(``drop_last=True``), unless ``trainer.total_training_steps`` is set, which then wins. Here the train set's length is
the number of prompt records after ``data.filter_overlong_prompts``, known only once rank 0 has tokenized them; the
learner derives the count there, shares it with every rank, and hands it to the optimizer schedule (warm-up ratio,
cosine horizon) and the training loop.

One difference from verl's dataloader: the coordinator's prompt ids run on across epoch boundaries (a batch may hold
the end of one epoch's permutation and the start of the next), so ``trainer.total_epochs`` passes hold
``len * epochs // train_batch_size`` full batches, at least as many as the derived count; the leftover prompts are
never trained, as verl never trains its dropped batches.
"""

from __future__ import annotations

from dataclasses import dataclass

from async_rl.config import Config

__all__ = ["RunLength", "derive_run_length"]


@dataclass(frozen=True)
class RunLength:
    """The step count, how it was reached (logged at start-up) and, when the data cannot fill it, why not."""

    steps: int
    how: str
    warning: str | None = None


def derive_run_length(cfg: Config, num_prompts: int) -> RunLength:
    """Steps for a run over ``num_prompts`` training prompts; ValueError when the data cannot fill one batch."""
    tr, batch = cfg.trainer, cfg.data.train_batch_size
    if num_prompts < 1:
        raise ValueError(f"no training prompts in data.train_files={cfg.data.train_files!r}")
    if tr.total_training_steps is not None:
        steps = tr.total_training_steps
        how = f"total_training_steps = {steps} (trainer.total_training_steps)"
        if tr.total_epochs is None:
            return RunLength(steps, how)
        full = num_prompts * tr.total_epochs // batch
        warning = None
        if steps > full:
            warning = (
                f"trainer.total_training_steps={steps} needs more data than trainer.total_epochs={tr.total_epochs}"
                f" passes over {num_prompts} prompts hold ({full} full batches of data.train_batch_size={batch}):"
                " the run will stop when the data runs out"
            )
        return RunLength(steps, how, warning)
    assert tr.total_epochs is not None, "validated config bounds the run by epochs or steps"
    per_epoch = num_prompts // batch
    if per_epoch == 0:
        raise ValueError(
            f"data.train_batch_size={batch} is larger than the {num_prompts} training prompts (after"
            " data.filter_overlong_prompts), so trainer.total_epochs gives 0 steps; lower data.train_batch_size or"
            " set trainer.total_training_steps"
        )
    steps = per_epoch * tr.total_epochs
    how = f"total_training_steps = {num_prompts} // {batch} * {tr.total_epochs} = {steps}"
    return RunLength(steps, how + " (len(train set) // data.train_batch_size * trainer.total_epochs)")
