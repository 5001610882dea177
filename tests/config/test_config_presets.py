"""Every preset in configs/ loads and validates, and a resolved config survives a YAML round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from async_rl.config import Config, format_config, load_config, load_config_with_warnings

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PRESETS = sorted(CONFIGS.glob("*.yaml"))


def test_the_four_presets_exist() -> None:
    names = {p.name for p in PRESETS}
    assert {
        "demo_grpo.yaml",
        "demo_ppo.yaml",
        "qwen2.5-0.5b_gsm8k_grpo.yaml",
        "qwen2.5-0.5b_gsm8k_ppo.yaml",
    } <= names


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_preset_loads_without_warnings(path: Path) -> None:
    cfg, warnings = load_config_with_warnings(str(path))
    assert isinstance(cfg, Config)
    assert warnings == []


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_resolved_preset_round_trips_through_yaml(path: Path, tmp_path: Path) -> None:
    cfg = load_config(str(path))
    dumped = tmp_path / "resolved.yaml"
    dumped.write_text(format_config(cfg))
    assert load_config(str(dumped)) == cfg


def test_demo_grpo_values() -> None:
    cfg = load_config(str(CONFIGS / "demo_grpo.yaml"))
    assert cfg.actor_rollout_ref.model.path == "builtin:tiny-arith"
    assert cfg.algorithm.adv_estimator == "grpo"
    assert 4 <= cfg.actor_rollout_ref.rollout.n <= 8
    assert cfg.async_training.max_staleness == 2
    assert cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes == 2
    assert cfg.async_training.num_actors == 1
    assert cfg.async_training.weight_sync.backend == "gloo"
    assert cfg.trainer.device == "cpu"


def test_demo_ppo_inherits_demo_grpo_through_defaults() -> None:
    cfg = load_config(str(CONFIGS / "demo_ppo.yaml"))
    assert cfg.algorithm.adv_estimator == "gae"
    assert cfg.critic.model.path == "builtin:tiny-arith"
    # Inherited from demo_grpo.yaml through `defaults:`.
    assert cfg.async_training.max_staleness == 2
    assert cfg.data.train_batch_size == 64
    # Critic keys left null inherit the actor's: mini-batch 64 prompts (from demo_grpo.yaml).
    assert cfg.critic.ppo_mini_batch_size == 64


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_qwen_presets(algo: str) -> None:
    cfg = load_config(str(CONFIGS / f"qwen2.5-0.5b_gsm8k_{algo}.yaml"))
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert cfg.data.train_files == "~/data/gsm8k/train.jsonl"
    assert cfg.reward.function == "async_rl.rewards.gsm8k:compute_score"
    assert cfg.trainer.device == "cuda"
    assert cfg.algorithm.adv_estimator == ("grpo" if algo == "grpo" else "gae")
    lines = (CONFIGS / f"qwen2.5-0.5b_gsm8k_{algo}.yaml").read_text().splitlines()
    header = "\n".join(lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))])
    assert "torchrun" in header  # the launch command is in the header comment
    assert f"--config configs/qwen2.5-0.5b_gsm8k_{algo}.yaml" in header


def test_empty_yaml_is_the_default_tree(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    assert load_config(str(empty)) == load_config(None)
    assert load_config(None).actor_rollout_ref.model.path == "builtin:tiny-arith"
