"""The rollout plane's settings are built from the typed config: each transport key reaches PlaneSettings."""

from __future__ import annotations

from pathlib import Path

import pytest

from async_rl.config import load_config
from async_rl.runtime.resources import plane_settings
from async_rl.transport import PlaneSettings

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "smoke_grpo.yaml")


def test_max_invalid_groups_flows_from_the_config_to_the_plane() -> None:
    assert plane_settings(load_config([SMOKE], [])).max_invalid_groups == 3 == PlaneSettings().max_invalid_groups
    cfg = load_config([SMOKE], ["async_training.transport.max_invalid_groups=5"])
    assert plane_settings(cfg).max_invalid_groups == 5


def test_max_invalid_groups_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_invalid_groups"):
        load_config([SMOKE], ["async_training.transport.max_invalid_groups=0"])
    with pytest.raises(ValueError, match="max_invalid_groups"):
        PlaneSettings(max_invalid_groups=0)
