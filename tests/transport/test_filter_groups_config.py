"""The config keys of group filtering, ``algorithm.filter_groups.*`` (verl 0.9.1's names and defaults): verl's DAPO
command line ports, the cross-key rules name the keys, the verl-only key is an accepted no-op, and the section maps
read by the rollout plane's group filter as they are."""

from __future__ import annotations

import pytest

from async_rl.config import ConfigError, load_config_with_warnings
from async_rl.config.introspect import iter_schema
from async_rl.transport.filtering import GroupFilter

GRPO = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4"]
# verl's DAPO recipe sets exactly these three
DAPO = [
    "algorithm.filter_groups.enable=True",
    "algorithm.filter_groups.metric=acc",
    "algorithm.filter_groups.max_num_gen_batches=10",
]


def test_defaults_are_verls() -> None:
    cfg, warnings = load_config_with_warnings(None, [])
    fg = cfg.algorithm.filter_groups
    assert (fg.enable, fg.metric, fg.max_num_gen_batches, fg.max_inflight_gen_batches) == (False, None, 0, 1)
    assert not [w for w in warnings if "filter_groups" in w]
    docs = {d.key: d for d in iter_schema()}
    for key in ("enable", "metric", "max_num_gen_batches"):
        assert docs[f"algorithm.filter_groups.{key}"].description and not docs[f"algorithm.filter_groups.{key}"].noop
    assert docs["algorithm.filter_groups.max_inflight_gen_batches"].noop


# ... together with the overlong shaping of its reward manager, which records the unshaped score as `acc`
OVERLONG = [
    "reward.reward_kwargs.overlong_buffer_cfg.enable=True",
    "reward.reward_kwargs.overlong_buffer_cfg.len=4",
]


def test_verls_dapo_keys_port_and_map_onto_the_plane_config() -> None:
    cfg, warnings = load_config_with_warnings(None, GRPO + DAPO + OVERLONG)
    fg = cfg.algorithm.filter_groups
    assert (fg.enable, fg.metric, fg.max_num_gen_batches) == (True, "acc", 10)
    assert not [w for w in warnings if "filter_groups" in w]
    # without the shaping nothing records `acc`: every group would be refused, so start-up says so
    _, bare = load_config_with_warnings(None, GRPO + DAPO)
    assert [w for w in bare if "algorithm.filter_groups.metric='acc' must be a component" in w]
    assert GroupFilter(cfg.algorithm.filter_groups, 4, n=2).limit_batches == 10


def test_enable_with_one_completion_per_prompt_is_an_error_naming_the_keys() -> None:
    with pytest.raises(ConfigError) as info:
        load_config_with_warnings(None, ["actor_rollout_ref.rollout.n=1", *DAPO])
    text = str(info.value)
    assert "algorithm.filter_groups.enable=true needs actor_rollout_ref.rollout.n >= 2 (got 1)" in text


def test_enable_needs_a_metric_and_a_metric_must_fit_the_wire() -> None:
    with pytest.raises(ConfigError, match="algorithm.filter_groups.enable=true needs algorithm.filter_groups.metric"):
        load_config_with_warnings(None, [*GRPO, "algorithm.filter_groups.enable=true"])
    with pytest.raises(ConfigError, match="algorithm.filter_groups.metric must be 'reward' or a reward component name"):
        load_config_with_warnings(None, [*GRPO, *DAPO, f"algorithm.filter_groups.metric={'m' * 129}"])


def test_max_inflight_gen_batches_is_an_accepted_no_op_that_warns_when_set() -> None:
    cfg, warnings = load_config_with_warnings(
        None, [*GRPO, *DAPO, "algorithm.filter_groups.max_inflight_gen_batches=4"]
    )
    assert cfg.algorithm.filter_groups.max_inflight_gen_batches == 4
    (noop,) = [w for w in warnings if "no effect" in w]
    assert "algorithm.filter_groups.max_inflight_gen_batches" in noop


def test_filter_keys_set_while_disabled_warn_that_they_are_ignored() -> None:
    _, warnings = load_config_with_warnings(None, ["algorithm.filter_groups.metric=acc"])
    assert "algorithm.filter_groups.metric is ignored with algorithm.filter_groups.enable=false" in warnings


def test_no_limit_spellings() -> None:
    for value in (0, -1):
        cfg, _ = load_config_with_warnings(None, [*GRPO, *DAPO, f"algorithm.filter_groups.max_num_gen_batches={value}"])
        assert GroupFilter(cfg.algorithm.filter_groups, 4, n=2).limit_batches == 0
