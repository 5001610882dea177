"""Plain settings for the rollout plane, kept free of the config tree so the transport stays importable on its own.

`PlaneSettings` mirrors the config keys ``async_training.{max_staleness, stale_policy}`` and
``async_training.transport.*`` one to one; wiring the config in later is ``PlaneSettings(**section)``.
`FilterSettings` mirrors ``algorithm.filter_groups.{enable, metric, max_num_gen_batches}`` (DAPO dynamic sampling,
see transport.filtering). Every field is checked in ``__post_init__`` and a bad value raises ``ValueError`` naming
the field.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

StalePolicy = Literal["drop", "regrant"]
STALE_POLICIES: tuple[str, ...] = ("drop", "regrant")

LOOPBACK_HOST = "127.0.0.1"
REWARD_METRIC = "reward"  # filter metric naming a completion's scalar reward; any other name is a reward component
MAX_METRIC_NAME = 128  # the longest reward-component name the wire carries (protocol.Completion.reward_components)


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
    curve_*: key files made by ``python -m async_rl.transport.keys DIR`` (see keys.py for the layout).
    """

    max_staleness: int = 1
    stale_policy: StalePolicy = "regrant"
    groups_per_step: int = 8
    max_inflight_groups: int | None = None
    host: str = LOOPBACK_HOST
    port: int = 0
    max_message_bytes: int = 64 * 1024 * 1024
    heartbeat_interval_s: float = 1.0
    peer_timeout_s: float = 10.0
    lease_timeout_s: float = 900.0
    socket_hwm: int = 256
    max_actors: int = 4096
    max_invalid_groups: int = 3
    curve_server_secret_file: str | None = None
    curve_authorized_keys_dir: str | None = None
    curve_server_public_file: str | None = None
    curve_client_secret_file: str | None = None

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
    def from_mapping(cls, values: dict[str, Any]) -> PlaneSettings:
        """Build from a flat dict, rejecting unknown keys by name (a typo must not pass silently)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown transport setting(s) {unknown}; known: {sorted(known)}")
        return cls(**values)


@dataclass(frozen=True)
class FilterSettings:
    """DAPO dynamic sampling ("filter groups") on the rollout plane; the fields are verl's keys of the same names.

    enable: drop training groups whose ``metric`` is the same for all n completions (no GRPO signal) instead of
        training them, and grant other prompts in their place (transport.filtering).
    metric: ``"reward"`` (each completion's scalar reward) or the name of a reward component
        (``Completion.reward_components[metric]``); required when ``enable``.
    max_num_gen_batches: <= 0 means no limit; otherwise a training step that has used
        ``max_num_gen_batches x groups_per_step`` prompts without collecting ``groups_per_step`` informative groups
        stops the run with `FilterBudgetExceeded` (verl's "too many generated batches").
    """

    enable: bool = False
    metric: str | None = None
    max_num_gen_batches: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.enable, bool):
            raise ValueError(f"enable must be a bool, got {self.enable!r}")
        if self.metric is not None and (
            not isinstance(self.metric, str) or not self.metric or len(self.metric) > MAX_METRIC_NAME
        ):
            raise ValueError(
                f"metric must be a non-empty string of at most {MAX_METRIC_NAME} chars, got {self.metric!r}"
            )
        if self.enable and self.metric is None:
            raise ValueError(f"metric must be set when enable is true ({REWARD_METRIC!r} or a reward component name)")
        _check_int("max_num_gen_batches", self.max_num_gen_batches, -(2**63))

    @property
    def limit_batches(self) -> int:
        """The generation budget in batches of one step's groups; 0 means unlimited."""
        return max(0, self.max_num_gen_batches) if self.enable else 0


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
