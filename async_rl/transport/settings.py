"""The rollout plane's view of the configuration: `PlaneSettings`, a frozen dataclass built from the typed config.

`PlaneSettings` is ``async_training.{max_staleness, stale_policy}``, ``async_training.transport.*`` and
``data.train_batch_size`` (groups per step), built by ``from_config``, with no defaults of its own: the config is the
one place defaults live, and tests or tools that want "the defaults with a few changes" call
``defaults(**overrides)``. Every field is checked in ``__post_init__`` and a bad value raises ``ValueError`` naming
the field. (DAPO's group filtering reads its config section, ``algorithm.filter_groups``, directly:
transport.filtering.)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, get_args

from async_rl.config import Config, default_config
from async_rl.config.names import StalePolicy

STALE_POLICIES: tuple[str, ...] = get_args(StalePolicy)


@dataclass(frozen=True)
class PlaneSettings:
    """Everything the coordinator and the actor client need to agree on.

    max_staleness: K, the largest allowed (learner version - generation version) of a trained group.
    stale_policy: what happens to a group over the bound: "drop" it for good or "regrant" its prompt.
    groups_per_step: prompt groups the learner consumes per optimizer step (sizes admission control).
    max_inflight_groups: admission cap on leased + buffered groups; None means (K + 1) x groups_per_step. Admission
        also never grants a prompt expected to be trained more than K versions after its start (admission.py).
    host/port: the coordinator's bind address; port 0 picks a free port. Non-loopback hosts need CURVE keys.
    max_message_bytes: the largest message either side accepts (zmq MAXMSGSIZE on receive, checked before send).
    heartbeat_interval_s / peer_timeout_s: liveness; a peer silent for peer_timeout_s is presumed dead.
    lease_timeout_s: a granted prompt not delivered within this time goes back to the re-grant queue.
    socket_hwm: zmq send/receive high-water marks, in messages, on every socket of the plane.
    max_actors: the most actor identities the coordinator tracks at once.
    max_invalid_groups: an actor that delivers this many groups failing validation (transport.validation) is
        quarantined: no more grants, no weight updates, its groups refused.
    curve_*: key files made by ``python -m async_rl.transport.keys DIR`` (see keys.py for the layout);
        curve_client_public_file, when set, must be the public half of curve_client_secret_file (checked at connect).
    """

    max_staleness: int
    stale_policy: StalePolicy
    groups_per_step: int
    max_inflight_groups: int | None
    host: str
    port: int
    max_message_bytes: int
    heartbeat_interval_s: float
    peer_timeout_s: float
    lease_timeout_s: float
    socket_hwm: int
    max_actors: int
    max_invalid_groups: int
    curve_server_secret_file: str | None
    curve_authorized_keys_dir: str | None
    curve_server_public_file: str | None
    curve_client_secret_file: str | None
    curve_client_public_file: str | None

    def __post_init__(self) -> None:
        _check_int("max_staleness", self.max_staleness, 0)
        if self.stale_policy not in STALE_POLICIES:
            raise ValueError(f"stale_policy must be one of {STALE_POLICIES}, got {self.stale_policy!r}")
        _check_int("groups_per_step", self.groups_per_step, 1)
        if self.max_inflight_groups is not None:
            _check_int("max_inflight_groups", self.max_inflight_groups, 1)
            if self.max_inflight_groups < self.groups_per_step:
                raise ValueError(
                    f"max_inflight_groups ({self.max_inflight_groups}) must be >= groups_per_step "
                    f"({self.groups_per_step}), otherwise a training step can never be filled"
                )
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host must be a non-empty string, got {self.host!r}")
        _check_int("port", self.port, 0)
        if self.port > 65535:
            raise ValueError(f"port must be <= 65535, got {self.port}")
        _check_int("max_message_bytes", self.max_message_bytes, 1024)
        _check_positive_float("heartbeat_interval_s", self.heartbeat_interval_s)
        _check_positive_float("peer_timeout_s", self.peer_timeout_s)
        _check_positive_float("lease_timeout_s", self.lease_timeout_s)
        if self.peer_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(
                f"peer_timeout_s ({self.peer_timeout_s}) must be > heartbeat_interval_s ({self.heartbeat_interval_s})"
            )
        _check_int("socket_hwm", self.socket_hwm, 1)
        _check_int("max_actors", self.max_actors, 1)
        _check_int("max_invalid_groups", self.max_invalid_groups, 1)
        for name in (
            "curve_server_secret_file",
            "curve_authorized_keys_dir",
            "curve_server_public_file",
            "curve_client_secret_file",
            "curve_client_public_file",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty path string or None, got {value!r}")

    @property
    def inflight_cap(self) -> int:
        """The admission cap actually used: leased + buffered groups never exceed it."""
        if self.max_inflight_groups is not None:
            return self.max_inflight_groups
        return (self.max_staleness + 1) * self.groups_per_step

    @property
    def curve_server_enabled(self) -> bool:
        return self.curve_server_secret_file is not None or self.curve_authorized_keys_dir is not None

    @property
    def curve_client_enabled(self) -> bool:
        return self.curve_server_public_file is not None or self.curve_client_secret_file is not None

    @classmethod
    def from_config(cls, cfg: Config, **overrides: Any) -> PlaneSettings:
        """From ``async_training.*`` and ``data.train_batch_size``, then ``overrides`` (field names) replaced."""
        a, t = cfg.async_training, cfg.async_training.transport
        settings = cls(
            max_staleness=a.max_staleness,
            stale_policy=a.stale_policy,
            groups_per_step=cfg.data.train_batch_size,
            max_inflight_groups=t.max_inflight_groups,
            host=t.host,
            port=t.port,
            max_message_bytes=t.max_message_bytes,
            heartbeat_interval_s=t.heartbeat_interval_s,
            peer_timeout_s=t.peer_timeout_s,
            lease_timeout_s=t.lease_timeout_s,
            socket_hwm=t.socket_hwm,
            max_actors=t.max_actors,
            max_invalid_groups=t.max_invalid_groups,
            curve_server_secret_file=t.curve_server_secret_key,
            curve_authorized_keys_dir=t.curve_client_keys_dir,
            curve_server_public_file=t.curve_server_public_key,
            curve_client_secret_file=t.curve_client_secret_key,
            curve_client_public_file=t.curve_client_public_key,
        )
        return settings.replace(**overrides) if overrides else settings

    @classmethod
    def defaults(cls, **overrides: Any) -> PlaneSettings:
        """The config's defaults with ``overrides`` (field names) replaced; for tests, tools and bare components."""
        return _default_plane().replace(**overrides)

    def replace(self, **changes: Any) -> PlaneSettings:
        """A copy with ``changes``; an unknown field name raises ``ValueError`` naming it (a typo must not pass)."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown transport setting(s) {unknown}; known: {sorted(known)}")
        return dataclasses.replace(self, **changes)


@functools.cache
def _default_plane() -> PlaneSettings:
    return PlaneSettings.from_config(default_config())


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_positive_float(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
