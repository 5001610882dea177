"""The rollout plane's settings are built from the typed config: each transport key reaches PlaneSettings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from async_rl.config import default_config, load_config
from async_rl.runtime.resources import plane_settings
from async_rl.transport import GroupSampling, PlaneSettings

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "smoke_grpo.yaml")
TS = "async_training.transport"


def test_max_invalid_groups_flows_from_the_config_to_the_plane() -> None:
    assert (
        plane_settings(load_config([SMOKE], [])).max_invalid_groups == 3 == PlaneSettings.defaults().max_invalid_groups
    )
    cfg = load_config([SMOKE], [f"{TS}.max_invalid_groups=5"])
    assert plane_settings(cfg).max_invalid_groups == 5


def test_max_invalid_groups_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_invalid_groups"):
        load_config([SMOKE], [f"{TS}.max_invalid_groups=0"])
    with pytest.raises(ValueError, match="max_invalid_groups"):
        PlaneSettings.defaults(max_invalid_groups=0)


def test_every_plane_field_comes_from_its_config_key() -> None:
    """Each PlaneSettings field changes with its key (no default of its own can shadow the config)."""
    keys = {
        "max_staleness": ("async_training.max_staleness", 3),
        "stale_policy": ("async_training.stale_policy", "regrant"),
        "groups_per_step": ("data.train_batch_size", 32),
        "max_inflight_groups": (f"{TS}.max_inflight_groups", 99),
        "port": (f"{TS}.port", 4321),
        "max_message_bytes": (f"{TS}.max_message_bytes", 2**21),
        "heartbeat_interval_s": (f"{TS}.heartbeat_interval_s", 0.5),
        "peer_timeout_s": (f"{TS}.peer_timeout_s", 7.0),
        "lease_timeout_s": (f"{TS}.lease_timeout_s", 11.0),
        "socket_hwm": (f"{TS}.socket_hwm", 17),
        "max_actors": (f"{TS}.max_actors", 9),
        "max_invalid_groups": (f"{TS}.max_invalid_groups", 4),
    }
    default = PlaneSettings.defaults()
    for name, (key, value) in keys.items():
        assert getattr(default, name) != value, name
        overrides = [f"{key}={value}"] + (["actor_rollout_ref.actor.ppo_mini_batch_size=8"] if "batch" in key else [])
        assert getattr(plane_settings(load_config(None, overrides)), name) == value, key
    covered = set(keys) | {"host"} | {f.name for f in dataclasses.fields(PlaneSettings) if f.name.startswith("curve_")}
    assert covered == {f.name for f in dataclasses.fields(PlaneSettings)}


def test_views_take_the_configs_defaults() -> None:
    cfg = default_config()
    t = cfg.async_training.transport
    plane = PlaneSettings.defaults()
    assert plane.stale_policy == cfg.async_training.stale_policy == "drop"
    assert (plane.max_message_bytes, plane.heartbeat_interval_s, plane.lease_timeout_s) == (
        t.max_message_bytes,
        t.heartbeat_interval_s,
        t.lease_timeout_s,
    )
    assert GroupSampling.defaults().max_tokens == cfg.data.max_response_length
