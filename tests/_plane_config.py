"""The rollout plane's config for tests: the config's defaults with a few keys changed.

``plane_config(heartbeat_interval_s=0.1, max_staleness=0, groups_per_step=4)`` sets ``async_training.max_staleness``
and ``async_training.stale_policy`` by name, ``groups_per_step`` as ``data.train_batch_size``, and any other name as
``async_training.transport.<name>``; an unknown name raises. The values are not validated, so a test can hand the plane
one that config validation refuses and see the plane refuse it too. :func:`coordinator` passes the config's sections
as a run does; a client takes ``cfg.async_training.transport``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from async_rl.config import Config, default_config
from async_rl.transport import Coordinator, PromptRecord

_ASYNC_KEYS = ("max_staleness", "stale_policy")


def plane_config(*, groups_per_step: int | None = None, **changes: Any) -> Config:
    cfg = default_config()
    if groups_per_step is not None:
        cfg.data.train_batch_size = groups_per_step
    at = cfg.async_training
    for name, value in changes.items():
        section: Any = at if name in _ASYNC_KEYS else at.transport
        if name not in section.__struct_fields__:
            raise TypeError(f"no rollout-plane key {name!r}")
        setattr(section, name, value)
    return cfg


def coordinator(records: Sequence[PromptRecord], cfg: Config, **kwargs: Any) -> Coordinator:
    return Coordinator(records, cfg.async_training, groups_per_step=cfg.data.train_batch_size, **kwargs)
