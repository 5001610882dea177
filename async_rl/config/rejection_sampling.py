"""The ``rejection_sampling`` section: run the actors as a generation job that writes an SFT dataset.

With ``rejection_sampling.enable`` the learner process trains nothing: the rollout plane grants every training prompt
exactly once (one pass over ``data.train_files``), the actors sample ``actor_rollout_ref.rollout.n`` completions of
each under the configured reward, and the kept ones (score at or above ``threshold``, at most ``best_k`` per prompt)
are written with their scores as rows that ``async_rl.entrypoints.sft`` reads as they are (``prompt``, ``response``).
This is the rejection-sampling stage of the DeepSeek-R1 recipe (RL, then rejection sampling and SFT, then RL again);
``launchers/pipeline.py`` chains it (stage kind ``generate``). See :mod:`async_rl.runtime.rejection_sampling`.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from async_rl.config.fields import PosInt, doc


class RejectionSamplingConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A generation job that keeps the best samples as an SFT dataset instead of training."""

    enable: Annotated[
        bool,
        doc(
            "Run a generation job instead of training: every training prompt is granted exactly once, its"
            " rollout.n samples are scored by the reward, the kept ones are written to output; no update, no weight"
            " sync. Needs one learner process (trainer.n_gpus_per_node=1, trainer.nnodes=1)."
        ),
    ] = False
    output: Annotated[
        str | None,
        doc(
            "The dataset written, one row per kept sample: .jsonl (appended batch by batch) or .parquet (written at"
            " the end, from the jsonl journal <run dir>/rejection_sampling.jsonl); null = that jsonl."
        ),
    ] = None
    threshold: Annotated[float, doc("Keep samples whose score (the reward) is at or above this.")] = 1.0
    best_k: Annotated[
        PosInt | None,
        doc("At most this many kept samples per prompt, the highest scores first (null = every one at the threshold)."),
    ] = None


__all__ = ["RejectionSamplingConfig"]
