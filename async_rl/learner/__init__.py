"""The FSDP2 learner group: batching, sharded models, the PPO/GRPO step, weight export and checkpoints.

Launched with ``torchrun`` (gloo on CPU, NCCL on GPU, same code); every rank builds a :class:`Learner`, receives the
same rollout groups each step (:func:`share_groups`), and calls :meth:`Learner.train_step`. Full weights leave
through :func:`iter_full_state` (weight sync) and :func:`export_hf`; state is saved with :func:`save_learner`.
"""

from async_rl.learner.batching import Response, RolloutBatch, RolloutGroup, collate_groups
from async_rl.learner.checkpoint import latest, list_checkpoints, load_learner, save_learner
from async_rl.learner.dist import DistContext, init_distributed, local_context, log_rank0, teardown
from async_rl.learner.export import export_hf, iter_full_state
from async_rl.learner.settings import CriticSettings, LearnerSettings, OptimSettings
from async_rl.learner.step import Learner, share_groups

__all__ = [
    "CriticSettings",
    "DistContext",
    "Learner",
    "LearnerSettings",
    "OptimSettings",
    "Response",
    "RolloutBatch",
    "RolloutGroup",
    "collate_groups",
    "export_hf",
    "init_distributed",
    "iter_full_state",
    "latest",
    "list_checkpoints",
    "load_learner",
    "local_context",
    "log_rank0",
    "save_learner",
    "share_groups",
    "teardown",
]
