"""Exceptions raised by the learner -> actor weight-sync path.

Kept in their own module so the pure pieces (packing, digests, verification) and the vLLM-side pieces can raise and
catch the same types without importing each other. ``WeightSyncError.tensor`` names the first offending tensor
(checkpoint-format name) when one is known, so callers and tests can act on it without parsing messages.
"""

from __future__ import annotations

__all__ = ["WeightMismatchError", "WeightSyncError", "WeightSyncTimeout"]


class WeightSyncError(RuntimeError):
    """A weight update failed or could not be verified; the receiving model must not be trusted until a later sync.

    ``tensor`` is the checkpoint-format name of the first mismatching, missing or malformed tensor, if any.
    """

    def __init__(self, message: str, *, tensor: str | None = None) -> None:
        super().__init__(message)
        self.tensor = tensor


class WeightSyncTimeout(WeightSyncError):
    """A collective of the weight-sync group did not complete within its timeout.

    The group is unusable afterwards (peers may be mid-operation): every member must rejoin under a new epoch.
    """


class WeightMismatchError(WeightSyncError):
    """The update does not fit the receiving model: a tensor missing, unknown, mis-shaped, or loaded without effect.

    Unlike a broken transfer this is deterministic (the learner's and the actor's models disagree), so retrying
    cannot help: the actor fails at once with this message instead of pausing and waiting for a good update.
    """
