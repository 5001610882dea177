"""reward.reward_kwargs (DAPO overlong shaping, verl 0.9.1 keys), its two older verl spellings, and
actor_rollout_ref.actor.mask_truncated_responses."""

from __future__ import annotations

import pytest

from async_rl.config import load_config, load_config_with_warnings
from async_rl.config.errors import ConfigError
from async_rl.config.introspect import iter_schema
from async_rl.config.validate import validate_config

BUF = "reward.reward_kwargs.overlong_buffer_cfg"
ON = [f"{BUF}.enable=true", f"{BUF}.len=4"]


def test_defaults_and_documented_keys() -> None:
    cfg = load_config(None, [])
    buf = cfg.reward.reward_kwargs.overlong_buffer_cfg
    assert (buf.enable, buf.len, buf.penalty_factor, buf.log) == (False, 0, 1.0, False)
    assert cfg.reward.reward_kwargs.max_resp_len == cfg.data.max_response_length  # null resolved
    assert cfg.actor_rollout_ref.actor.mask_truncated_responses is False
    docs = {d.key: d for d in iter_schema() if not d.is_section}
    keys = [f"{BUF}.{k}" for k in ("enable", "len", "penalty_factor", "log")] + [
        "reward.reward_kwargs.max_resp_len",
        "reward_model.reward_kwargs.overlong_buffer_cfg.len",
        "reward_model.reward_kwargs.max_resp_len",
        "reward_model.overlong_buffer.enable",
        "actor_rollout_ref.actor.mask_truncated_responses",
    ]
    for key in keys:
        assert docs[key].description and not docs[key].noop, key
    assert not docs["reward_model.enable"].noop and docs["reward_model.reward_manager"].noop


def test_null_max_resp_len_is_the_max_response_length() -> None:
    cfg = load_config(None, [*ON, "data.max_response_length=32"])
    assert cfg.reward.reward_kwargs.max_resp_len == 32
    cfg = load_config(None, [*ON, "data.max_response_length=32", "reward.reward_kwargs.max_resp_len=16"])
    assert cfg.reward.reward_kwargs.max_resp_len == 16


@pytest.mark.parametrize("prefix", ["reward_model.reward_kwargs.overlong_buffer_cfg", "reward_model.overlong_buffer"])
def test_older_spellings_map_onto_reward_kwargs_without_a_noop_warning(prefix: str) -> None:
    overrides = [f"{prefix}.enable=true", f"{prefix}.len=2", f"{prefix}.penalty_factor=0.5", f"{prefix}.log=true"]
    cfg, warnings = load_config_with_warnings(None, overrides)
    buf = cfg.reward.reward_kwargs.overlong_buffer_cfg
    assert (buf.enable, buf.len, buf.penalty_factor, buf.log) == (True, 2, 0.5, True)
    assert not any("reward_model" in w for w in warnings), warnings
    # the aliases are cleared once mapped, and resolution is idempotent
    assert cfg.reward_model.overlong_buffer.enable is None
    assert cfg.reward_model.reward_kwargs.overlong_buffer_cfg.len is None
    validate_config(cfg)
    assert cfg.reward.reward_kwargs.overlong_buffer_cfg.len == 2


def test_transitional_max_resp_len_alias() -> None:
    cfg = load_config(None, [*ON, "reward_model.reward_kwargs.max_resp_len=6"])
    assert cfg.reward.reward_kwargs.max_resp_len == 6


def test_the_same_value_under_two_spellings_is_fine() -> None:
    cfg = load_config(None, [*ON, "reward_model.overlong_buffer.len=4", "reward_model.overlong_buffer.enable=true"])
    assert cfg.reward.reward_kwargs.overlong_buffer_cfg.len == 4


@pytest.mark.parametrize(
    ("overrides", "keys"),
    [
        ([*ON, "reward_model.overlong_buffer.len=3"], [f"{BUF}.len=4", "reward_model.overlong_buffer.len=3"]),
        (
            [
                f"{BUF}.enable=true",
                "reward_model.reward_kwargs.overlong_buffer_cfg.len=2",
                "reward_model.overlong_buffer.len=3",
            ],
            ["reward_model.reward_kwargs.overlong_buffer_cfg.len=2", "reward_model.overlong_buffer.len=3"],
        ),
        (
            [*ON, "reward.reward_kwargs.max_resp_len=8", "reward_model.reward_kwargs.max_resp_len=6"],
            ["reward.reward_kwargs.max_resp_len=8", "reward_model.reward_kwargs.max_resp_len=6"],
        ),
        (
            [*ON, f"{BUF}.penalty_factor=0.5", "reward_model.overlong_buffer.penalty_factor=2.0"],
            [f"{BUF}.penalty_factor=0.5", "reward_model.overlong_buffer.penalty_factor=2.0"],
        ),
    ],
)
def test_two_spellings_with_different_values_is_an_error_naming_both(overrides: list[str], keys: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    for key in keys:
        assert key in str(info.value)


def test_enable_needs_a_positive_len() -> None:
    with pytest.raises(ConfigError, match=rf"{BUF}.len must be > 0 when {BUF}.enable is true \(got 0\)"):
        load_config(None, [f"{BUF}.enable=true"])
    with pytest.raises(ConfigError, match=r"reward_model.overlong_buffer.len|must be > 0"):
        load_config(None, ["reward_model.overlong_buffer.enable=true"])
    load_config(None, [f"{BUF}.len=0"])  # off: no zone needed


def test_max_resp_len_must_hold_the_buffer() -> None:
    with pytest.raises(ConfigError, match=rf"reward.reward_kwargs.max_resp_len \(3\) must be >= {BUF}.len \(4\)"):
        load_config(None, [*ON, "reward.reward_kwargs.max_resp_len=3"])
    with pytest.raises(ConfigError, match=r"null = data.max_response_length = 8\) must be >= .*len \(9\)"):
        load_config(None, [f"{BUF}.enable=true", f"{BUF}.len=9"])
    load_config(None, [f"{BUF}.enable=true", f"{BUF}.len=8"])  # the whole response as the zone is allowed


def test_bad_types_and_ranges_name_the_key() -> None:
    with pytest.raises(ConfigError, match=f"{BUF}.len"):
        load_config(None, [f"{BUF}.len=-1"])
    with pytest.raises(ConfigError, match=f"{BUF}.penalty_factor"):
        load_config(None, [f"{BUF}.penalty_factor=-0.5"])
    with pytest.raises(ConfigError, match="unknown config key `reward.reward_kwargs.overlong_buffer`"):
        load_config(None, ["reward.reward_kwargs.overlong_buffer.len=4"])


def test_mask_truncated_responses_is_a_key_of_the_actor() -> None:
    assert load_config(None, []).actor_rollout_ref.actor.mask_truncated_responses is False
    cfg = load_config(None, ["actor_rollout_ref.actor.mask_truncated_responses=true"])
    assert cfg.actor_rollout_ref.actor.mask_truncated_responses is True
