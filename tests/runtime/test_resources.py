"""The rollout plane reads its config sections: a coordinator and a client built from a loaded config use its keys."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from async_rl.config import default_config, load_config
from async_rl.transport import Coordinator, GroupSampling, PromptRecord, RolloutClient

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "smoke_grpo.yaml")
TS = "async_training.transport"


def test_max_invalid_groups_must_be_positive() -> None:
    assert load_config([SMOKE], []).async_training.transport.max_invalid_groups == 3
    with pytest.raises(ValueError, match="max_invalid_groups"):
        load_config([SMOKE], [f"{TS}.max_invalid_groups=0"])


def test_a_plane_built_from_a_config_uses_its_keys() -> None:
    cfg = load_config(
        [SMOKE],
        [
            "async_training.max_staleness=2",
            f"{TS}.max_inflight_groups=99",
            f"{TS}.max_message_bytes={2**21}",
            f"{TS}.heartbeat_interval_s=0.5",
            f"{TS}.peer_timeout_s=7.0",
            f"{TS}.lease_timeout_s=11.0",
        ],
    )
    records = [PromptRecord(np.arange(i, i + 3, dtype=np.int32)) for i in range(4)]
    coord = Coordinator(records, cfg.async_training, groups_per_step=cfg.data.train_batch_size, seed=0)
    client = RolloutClient(coord.address, "actor-0", cfg.async_training.transport)
    try:
        welcome = client.hello(timeout_s=10.0)
    finally:
        client.close(linger_s=0.0)
        coord.close()
    assert (welcome.max_staleness, welcome.max_message_bytes) == (2, 2**21)
    assert (welcome.heartbeat_interval_s, welcome.peer_timeout_s, welcome.lease_timeout_s) == (0.5, 7.0, 11.0)
    assert coord.inflight_cap == 99 and coord.metrics()["transport/inflight_cap"] == 99


def test_the_inflight_cap_follows_the_staleness_bound_when_the_config_leaves_it_null() -> None:
    cfg = load_config([SMOKE], ["async_training.max_staleness=2"])
    records = [PromptRecord(np.arange(3, dtype=np.int32))]
    coord = Coordinator(records, cfg.async_training, groups_per_step=cfg.data.train_batch_size, seed=0, autostart=False)
    try:
        assert coord.inflight_cap == 3 * cfg.data.train_batch_size
    finally:
        coord.close()


def test_sampling_takes_the_configs_defaults() -> None:
    assert GroupSampling.defaults().max_tokens == default_config().data.max_response_length
