"""The reward-model config tree: its defaults, the shared YAML/CLI machinery, errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from async_rl.config import ConfigError
from async_rl.config.cli import format_config, help_text, parse_tree_cli
from async_rl.config.reward_model_train import (
    RewardModelTrainConfig,
    load_reward_model_config,
    validate_reward_model_config,
)

REPO = Path(__file__).resolve().parents[2]


def _parse(argv: list[str]) -> RewardModelTrainConfig:
    return parse_tree_cli(RewardModelTrainConfig, validate_reward_model_config, argv, exit_on_error=False)[0]


def test_defaults() -> None:
    cfg, warnings = load_reward_model_config(None, [])
    assert warnings == []
    assert (cfg.data.train_files, cfg.data.train_batch_size, cfg.data.micro_batch_size_per_gpu) == (
        "builtin:arith-prefs",
        32,
        8,
    )
    assert (cfg.data.max_length, cfg.data.truncation, cfg.model.path) == (512, "left", "builtin:tiny-arith")
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.clip_grad) == (1e-5, 0.0, 1.0)
    assert cfg.loss.center_rewards_coefficient == 0.0 and cfg.trainer.logger == ["console", "jsonl"]
    # a partly given optim section keeps the reward model's defaults, not the generic OptimConfig's (lr 1e-6)
    assert _parse(["optim.weight_decay=0.1"]).optim.lr == 1e-5


def test_yaml_defaults_include_and_cli_overrides(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("data:\n  max_length: 64\noptim:\n  lr: 3.0e-5\n")
    (tmp_path / "run.yaml").write_text("defaults: [base.yaml]\ntrainer:\n  total_training_steps: 7\n")
    cfg = _parse(["--config", str(tmp_path / "run.yaml"), "optim.lr=1e-4", "loss.center_rewards_coefficient=0.01"])
    assert (cfg.data.max_length, cfg.optim.lr, cfg.trainer.total_training_steps) == (64, 1e-4, 7)
    assert cfg.loss.center_rewards_coefficient == 0.01
    assert cfg.optim.total_training_steps == 7  # the schedule's horizon follows the run length
    again = _parse(["--config", str(tmp_path / "run.yaml")])
    (tmp_path / "dump.yaml").write_text(format_config(again))
    assert _parse(["--config", str(tmp_path / "dump.yaml")]) == again
    for preset in ("tiny_toy.yaml", "smollm2_toy.yaml"):
        assert load_reward_model_config(str(REPO / "configs" / "reward_model" / preset), [])[1] == []


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "data.max_lenght=3",
            "unknown config key `data.max_lenght` (not in section `data`); did you mean `data.max_length`?",
        ),
        ("optim.lr=fast", "config key `optim.lr`: expected float >= 0, got str 'fast'"),
        ("data.truncation=middle", "config key `data.truncation`: invalid value 'middle'"),
        ("model.path=builtin:gpt5", "model.path='builtin:gpt5' names no builtin model"),
        (
            "data.micro_batch_size_per_gpu=64",
            "data.micro_batch_size_per_gpu (64) must be <= data.train_batch_size (32)",
        ),
        ("data.chosen_key=prompt", "data.prompt_key, data.chosen_key and data.rejected_key must differ"),
        ("optim.betas=[0.9,1.0]", "optim.betas must each be in [0, 1)"),
        ("trainer.resume_mode=resume_path", "trainer.resume_mode='resume_path' needs trainer.resume_from_path"),
        ("trainer.save_freq=-2", "config key `trainer.save_freq`: expected int >= -1"),
    ],
)
def test_a_bad_key_or_value_names_it(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _parse([override])
    assert message in str(info.value)


def test_help_lists_the_reward_model_keys_and_a_warning() -> None:
    text = help_text(RewardModelTrainConfig)
    assert "loss.center_rewards_coefficient: float >= 0 = 0.0" in text and "actor_rollout_ref" not in text
    assert load_reward_model_config(None, ["data.val_files=null"])[1] == [
        "trainer.test_freq is set but data.val_files is null: nothing is evaluated"
    ]
