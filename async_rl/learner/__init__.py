"""The FSDP2 learner group: batching, sharded models, the PPO/GRPO step, weight export and checkpoints.

Launched with ``torchrun`` (gloo on CPU, NCCL on GPU, same code); every rank builds a :class:`Learner`, receives the
same collated batch each step (:func:`share_batch`: rank 0 collates, the tensors are broadcast), and calls
:meth:`Learner.train_batch`. Full weights leave
through :func:`iter_full_state` (weight sync) and :func:`export_hf`; state is saved with :func:`save_learner`.
"""

from async_rl.learner.batching import RolloutBatch, collate_groups, collate_rows, local_group
from async_rl.learner.checkpoint import latest, list_checkpoints, load_learner, save_learner
from async_rl.learner.dist import DistContext, init_distributed, local_context, log_rank0, share_batch, teardown
from async_rl.learner.export import export_hf, iter_full_state
from async_rl.learner.step import Learner

__all__ = [
    "DistContext",
    "Learner",
    "RolloutBatch",
    "collate_groups",
    "collate_rows",
    "export_hf",
    "init_distributed",
    "iter_full_state",
    "latest",
    "list_checkpoints",
    "load_learner",
    "local_context",
    "local_group",
    "log_rank0",
    "save_learner",
    "share_batch",
    "teardown",
]
