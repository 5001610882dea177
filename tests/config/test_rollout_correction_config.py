"""verl 0.9.1's ``algorithm.rollout_correction`` keys, this project's alias names, and the rules between config keys.

Compared with verl 0.9.1 (``verl/trainer/config/algorithm.py`` RolloutCorrectionConfig and
``verl/trainer/ppo/rollout_corr_helper.py`` ``_parse_rollout_is_threshold`` / ``_parse_rollout_rs_thresholds``):
the key names, a plain number meaning truncation and ``"lower_upper"`` meaning IcePop bounds, the eleven rejection
options, one threshold broadcast to every option or one per option, k1 thresholds as ratio bounds (a single
number ``u`` meaning ``1/u .. u``), k2/k3 taking one upper bound, and ``loss_type`` in {ppo_clip, reinforce}.
"""

from __future__ import annotations

import pytest

from async_rl.algorithms.objective import ObjectiveSpec
from async_rl.config import ConfigError, load_config
from async_rl.config.correction import (
    RS_OPTIONS,
    parse_is_threshold,
    parse_rs_options,
    parse_rs_spec,
    parse_rs_thresholds,
)
from async_rl.config.schema import Config
from async_rl.learner.objective_spec import objective_spec

RC = "algorithm.rollout_correction"


def rc_of(*overrides: str):
    return load_config(None, list(overrides)).algorithm.rollout_correction


def spec_of(cfg: Config) -> ObjectiveSpec:
    return objective_spec(cfg.actor_rollout_ref.actor, cfg.algorithm.rollout_correction, cfg.distillation)


def test_a_verl_command_line_ports_with_the_same_meaning() -> None:
    cfg = load_config(
        None,
        [
            f"{RC}.rollout_is=sequence",
            f"{RC}.rollout_is_threshold=0.5_5.0",
            f"{RC}.rollout_is_batch_normalize=true",
            f"{RC}.rollout_rs=seq_mean_k1,token_k3",
            f"{RC}.rollout_rs_threshold=0.99_1.001,0.01",
        ],
    )
    s = spec_of(cfg)
    assert (s.rollout_is, s.is_upper, s.is_lower) == ("sequence", 5.0, 0.5)
    assert s.is_batch_normalize and s.bypass_loss_type is None
    assert s.rs_bounds == {"seq_mean_k1": (0.99, 1.001), "token_k3": (None, 0.01)}
    plain = spec_of(load_config(None, [f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=3"]))
    assert (plain.rollout_is, plain.is_upper, plain.is_lower) == ("token", 3.0, None)
    off = spec_of(load_config(None, [f"{RC}.rollout_is=null"]))
    assert off.rollout_is is None
    bypass = spec_of(load_config(None, [f"{RC}.bypass_mode=true", f"{RC}.loss_type=reinforce"]))
    assert bypass.bypass_loss_type == "reinforce"


def test_the_async_default_is_token_truncation_at_two() -> None:
    rc = rc_of()
    assert (rc.rollout_is, rc.rollout_is_threshold, rc.rollout_rs, rc.bypass_mode) == ("token", 2.0, None, False)


def test_alias_names_fold_into_verl_keys() -> None:
    rc = rc_of(f"{RC}.is_mode=mask", f"{RC}.is_threshold=4")
    assert (rc.rollout_is, rc.rollout_is_threshold) == ("token", "0.25_4")
    assert (rc.is_mode, rc.is_threshold, rc.is_threshold_lower, rc.enable, rc.is_level) == (None,) * 5
    assert rc_of(f"{RC}.is_mode=mask", f"{RC}.is_threshold_lower=0.3").rollout_is_threshold == "0.3_2"
    assert rc_of(f"{RC}.enable=false").rollout_is is None
    assert rc_of(f"{RC}.enable=true", f"{RC}.is_level=geometric").rollout_is == "geometric"
    assert rc_of(f"{RC}.is_threshold=3").rollout_is_threshold == 3.0
    # a numeric string is a number (truncation), not an IcePop pair
    assert rc_of(f"{RC}.rollout_is_threshold='2.5'").rollout_is_threshold == 2.5


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ([f"{RC}.rollout_is=sequence", f"{RC}.is_level=token"], f"{RC}.is_level ('token') conflicts"),
        ([f"{RC}.rollout_is_threshold=3", f"{RC}.is_threshold=5"], f"which conflicts with {RC}.rollout_is_threshold"),
        ([f"{RC}.enable=false", f"{RC}.is_level=token"], f"{RC}.enable=false"),
        (
            [f"{RC}.rollout_rs=seq_mean_k9", f"{RC}.rollout_rs_threshold=2"],
            "rollout_rs='seq_mean_k9' / rollout_rs_threshold=2.0: options entry 'seq_mean_k9' is not one of",
        ),
        ([f"{RC}.rollout_rs=token_k1"], "thresholds must be given"),
        ([f"{RC}.rollout_rs_threshold=2"], f"{RC}.rollout_rs is null"),
        ([f"{RC}.rollout_rs=token_k2", f"{RC}.rollout_rs_threshold=0.1_0.2"], "token_k2 takes a single upper bound"),
        ([f"{RC}.rollout_rs=token_k1", f"{RC}.rollout_rs_threshold=1.2_0.8"], "token_k1 must satisfy lower <= upper"),
        (
            [f"{RC}.rollout_rs=token_k1,seq_max_k3", f"{RC}.rollout_rs_threshold=1,2,3"],
            "thresholds has 3 entries; give one shared by all options or exactly 2",
        ),
        ([f"{RC}.rollout_is_threshold=abc"], "rollout_is_threshold='abc': threshold 'abc' is not a number"),
        ([f"{RC}.rollout_is_threshold=3.0_1.0"], "lower bound must satisfy 0 < lower <= upper"),
        ([f"{RC}.loss_type=reinforce"], f"only with {RC}.bypass_mode=true"),
        ([f"{RC}.is_threshold=0.5"], f"{RC}.is_threshold must be >= 1"),
    ],
)
def test_bad_values_are_errors_that_name_the_key(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        load_config(None, overrides)
    assert needle in str(info.value)


def test_threshold_parsers_match_verl_semantics() -> None:
    assert parse_is_threshold(2.0) == (2.0, None)
    assert parse_is_threshold("0.5_5") == (5.0, 0.5)
    with pytest.raises(ValueError, match="not a bool"):
        parse_is_threshold(True)
    assert parse_rs_spec("token_k1", 2.0) == {"token_k1": (0.5, 2.0)}  # k1: one number u -> 1/u .. u
    got = parse_rs_spec("seq_mean_k1, seq_max_k2,seq_mean_k1", "0.99_1.001,0.5")  # duplicates collapse
    assert got == {"seq_mean_k1": (0.99, 1.001), "seq_max_k2": (None, 0.5)}
    assert parse_rs_spec("token_k3,seq_sum_k2", 0.1) == {"token_k3": (None, 0.1), "seq_sum_k2": (None, 0.1)}
    with pytest.raises(ValueError, match="not a number"):
        parse_is_threshold("0.5_5_6")  # Python's float() would read "5_6" as 56 (verl does)
    assert len(RS_OPTIONS) == 11 and "seq_max_k1" not in RS_OPTIONS


def test_sync_every_n_steps_beyond_the_staleness_bound_is_rejected() -> None:
    load_config(None, ["async_training.max_staleness=1", "async_training.sync_every_n_steps=2"])  # 2 <= K + 1
    with pytest.raises(ConfigError) as info:
        load_config(None, ["async_training.max_staleness=1", "async_training.sync_every_n_steps=3"])
    assert "async_training.sync_every_n_steps (3) must be <= async_training.max_staleness + 1 (2)" in str(info.value)


def test_greedy_training_rollouts_are_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["actor_rollout_ref.rollout.temperature=0"])
    assert "actor_rollout_ref.rollout.temperature must be > 0" in str(info.value)
    load_config(None, ["actor_rollout_ref.rollout.val_kwargs.temperature=0"])  # greedy validation stays fine


# ---------------------------------------------------------------------------------------------- threshold parsing


def test_parse_is_threshold() -> None:
    assert parse_is_threshold(2.0) == (2.0, None)
    assert parse_is_threshold(3) == (3.0, None)
    assert parse_is_threshold("2.0") == (2.0, None)
    assert parse_is_threshold(" 0.5_5.0 ") == (5.0, 0.5)
    assert parse_is_threshold("2_2") == (2.0, 2.0)
    assert parse_is_threshold("0.5") == (0.5, None)  # verl accepts a cap below 1


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (True, "bool"),
        (None, "number or a string"),
        ([2.0], "number or a string"),
        ("", "empty"),
        ("abc", "not a number"),
        ("0.5_x", "not a number"),
        ("0.5_5_6", "not a number"),
        (0, "upper bound must be > 0"),
        (-1.0, "upper bound must be > 0"),
        ("nan", "upper bound must be > 0"),
        ("0_2", "0 < lower <= upper"),
        ("-1_2", "0 < lower <= upper"),
        ("3_2", "0 < lower <= upper"),
        ("1_0", "upper bound must be > 0"),
    ],
)
def test_parse_is_threshold_errors(spec: object, match: str) -> None:
    with pytest.raises(ValueError, match=f"threshold.*{match}|{match}"):
        parse_is_threshold(spec)  # type: ignore[arg-type]


def test_parse_rs_options_and_thresholds() -> None:
    assert len(RS_OPTIONS) == 11
    assert parse_rs_options(" token_k1, seq_mean_k3 ,token_k1") == ("token_k1", "seq_mean_k3")
    # one threshold shared: k1 single float -> lower = 1 / upper; others upper only
    assert parse_rs_thresholds(("token_k1", "seq_max_k2"), 2.0) == {"token_k1": (0.5, 2.0), "seq_max_k2": (None, 2.0)}
    assert parse_rs_thresholds(("seq_sum_k1", "token_k3"), "0.8_3.0, 0.1") == {
        "seq_sum_k1": (0.8, 3.0),
        "token_k3": (None, 0.1),
    }
    with pytest.raises(ValueError, match="options entry.*seq_max_k1"):
        parse_rs_options("seq_max_k1")
    with pytest.raises(ValueError, match="options"):
        parse_rs_options(" , ")
    with pytest.raises(ValueError, match="options"):
        parse_rs_options(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="thresholds has 2 entries.*exactly 3"):
        parse_rs_thresholds(("token_k1", "token_k2", "token_k3"), "1.5,2.0")
    with pytest.raises(ValueError, match="token_k2.*single upper bound"):
        parse_rs_thresholds(("token_k2",), "0.1_0.2")
    with pytest.raises(ValueError, match="token_k1.*lower <= upper"):
        parse_rs_thresholds(("token_k1",), "2_1")
    with pytest.raises(ValueError, match="token_k1.*positive"):
        parse_rs_thresholds(("token_k1",), "0_1")
    with pytest.raises(ValueError, match="token_k1.*> 0"):
        parse_rs_thresholds(("token_k1",), 0.0)
    with pytest.raises(ValueError, match="seq_sum_k3.*> 0"):
        parse_rs_thresholds(("seq_sum_k3",), "-1")
    with pytest.raises(ValueError, match="thresholds must be a number"):
        parse_rs_thresholds(("token_k2",), True)
    with pytest.raises(ValueError, match="thresholds must contain"):
        parse_rs_thresholds(("token_k2",), " , ")
    with pytest.raises(ValueError, match="not a number"):
        parse_rs_thresholds(("token_k2",), "abc")
    with pytest.raises(ValueError, match="not a number"):  # verl would read this as lower .5, upper 56
        parse_rs_thresholds(("token_k1",), "0.5_5_6")
