"""Dotted overrides and YAML merging: lists, null, floats, Hydra prefixes, includes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from async_rl.config import ConfigError, build_raw, load_config, parse_override


def test_override_value_kinds() -> None:
    assert parse_override("trainer.logger=['console','wandb']") == ("trainer.logger", ["console", "wandb"])
    assert parse_override("trainer.logger=[console,wandb]") == ("trainer.logger", ["console", "wandb"])
    assert parse_override("x.y=null") == ("x.y", None)
    assert parse_override("x.y=1e-6") == ("x.y", 1e-6)  # YAML 1.1 would give the string '1e-6'
    assert parse_override("x.y=3") == ("x.y", 3)
    assert parse_override("x.y=True") == ("x.y", True)
    assert parse_override("x.y='error'") == ("x.y", "error")
    assert parse_override("x.y=a.b:c") == ("x.y", "a.b:c")
    assert parse_override("x.y=~/data/train.parquet") == ("x.y", "~/data/train.parquet")
    assert parse_override("x.y=2024-01-01") == ("x.y", "2024-01-01")  # no implicit dates
    assert parse_override("x.y=") == ("x.y", "")
    assert parse_override("x.y=a=b") == ("x.y", "a=b")  # split on the first '=' only


def test_hydra_prefixes_are_stripped() -> None:
    assert parse_override("+trainer.seed=5")[0] == "trainer.seed"
    assert parse_override("++trainer.seed=5")[0] == "trainer.seed"
    cfg = load_config(None, ["+trainer.seed=5", "++data.seed=7"])
    assert (cfg.trainer.seed, cfg.data.seed) == (5, 7)


@pytest.mark.parametrize("bad", ["no_equals_sign", "~trainer.seed=1", "a..b=1", "1abc=2"])
def test_malformed_overrides(bad: str) -> None:
    with pytest.raises(ConfigError, match="override"):
        parse_override(bad)


def test_overrides_land_on_typed_fields() -> None:
    cfg = load_config(
        None,
        [
            "trainer.logger=['console','wandb']",
            "actor_rollout_ref.actor.optim.lr=1e-5",
            "actor_rollout_ref.actor.optim.betas=[0.9,0.95]",
            "trainer.default_local_dir=null",
            "trainer.experiment_name=42",  # number given for a string key becomes the string "42"
            "data.train_files=[a.parquet,b.parquet]",
        ],
    )
    assert cfg.trainer.logger == ["console", "wandb"]
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-5
    assert cfg.actor_rollout_ref.actor.optim.betas == (0.9, 0.95)
    assert cfg.trainer.experiment_name == "42"
    assert cfg.data.train_files == ["a.parquet", "b.parquet"]
    # null checkpoint dir resolves to checkpoints/<project>/<experiment> = checkpoints/async_rl/42
    assert cfg.trainer.default_local_dir == "checkpoints/async_rl/42"


def test_bare_string_for_list_key_becomes_a_list() -> None:
    assert load_config(None, ["trainer.logger=console"]).trainer.logger == ["console"]


def test_later_files_and_overrides_win(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    b = tmp_path / "b.yaml"
    a.write_text("data:\n  train_batch_size: 32\n  seed: 3\ntrainer:\n  logger: [console, jsonl]\n")
    b.write_text("data:\n  train_batch_size: 64\ntrainer:\n  logger: [tensorboard]\n")
    raw = build_raw([str(a), str(b)], ["data.seed=9"])
    # Mappings merge key by key; lists are replaced, not concatenated.
    assert raw == {"data": {"train_batch_size": 64, "seed": 9}, "trainer": {"logger": ["tensorboard"]}}


def test_defaults_includes_and_self_position(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("data:\n  train_batch_size: 32\n  seed: 3\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "child.yaml").write_text("defaults: [../base.yaml]\ndata:\n  seed: 4\n")
    assert build_raw(str(tmp_path / "sub" / "child.yaml")) == {"data": {"train_batch_size": 32, "seed": 4}}
    # With `_self_` first, the included file is merged on top of this file's own keys.
    (tmp_path / "self_first.yaml").write_text("defaults: [_self_, base.yaml]\ndata:\n  seed: 4\n")
    assert build_raw(str(tmp_path / "self_first.yaml")) == {"data": {"train_batch_size": 32, "seed": 3}}


def test_include_cycle_is_reported(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("defaults: [b.yaml]\n")
    (tmp_path / "b.yaml").write_text("defaults: [a.yaml]\n")
    with pytest.raises(ConfigError, match="cycle"):
        build_raw(str(tmp_path / "a.yaml"))


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        build_raw(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        build_raw(str(bad))
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        build_raw(str(listy))


def test_override_into_a_value_is_rejected() -> None:
    with pytest.raises(ConfigError, match="data.train_batch_size"):
        build_raw(None, ["data.train_batch_size=8", "data.train_batch_size.x=1"])


def test_empty_section_is_allowed(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("data:\n  # train_batch_size: 8\ntrainer:\n")
    assert load_config(str(f)) == load_config(None)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_any_float_override_round_trips(x: float) -> None:
    # repr() gives forms like '1e-06', '0.1', '-3.0' or '1.5e+300': all must parse back to the same float.
    key, value = parse_override(f"a.b={x!r}")
    assert key == "a.b"
    assert isinstance(value, float)
    assert value == x
    assert math.copysign(1.0, value) == math.copysign(1.0, x)  # even -0.0 keeps its sign


def test_a_partly_given_section_keeps_the_defaults_of_its_place() -> None:
    """critic.optim's default lr is 1e-5 (OptimConfig's class default is 1e-6): setting another critic.optim key
    must not reset it to the class default, and an explicit lr still wins."""
    _load = load_config
    assert _load(None, []).critic.optim.lr == 1e-5
    cfg = _load(None, ["critic.optim.weight_decay=0.1"])
    assert (cfg.critic.optim.lr, cfg.critic.optim.weight_decay) == (1e-5, 0.1)
    assert _load(None, ["critic.optim.lr=3e-4"]).critic.optim.lr == 3e-4
    assert _load(None, ["actor_rollout_ref.actor.optim.weight_decay=0.1"]).actor_rollout_ref.actor.optim.lr == 1e-6
