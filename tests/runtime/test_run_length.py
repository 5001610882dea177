"""The run length: verl's ``len(train set) // train_batch_size * total_epochs`` unless total_training_steps is set,
and the optimizer schedule gets the derived horizon."""

from __future__ import annotations

from pathlib import Path

import pytest

from async_rl.config import load_config
from async_rl.learner.settings import LearnerSettings
from async_rl.runtime.dry_run import dry_run_report
from async_rl.runtime.run_length import RunLength, derive_run_length

ROOT = Path(__file__).resolve().parents[2]
GRPO = str(ROOT / "configs" / "qwen2.5-0.5b_gsm8k_grpo.yaml")
PPO = str(ROOT / "configs" / "qwen2.5-0.5b_gsm8k_ppo.yaml")


def test_derived_from_epochs_drops_each_epochs_incomplete_batch() -> None:
    cfg = load_config([GRPO], ["data.train_batch_size=1024"])
    assert cfg.trainer.total_epochs == 15 and cfg.trainer.total_training_steps is None
    length = derive_run_length(cfg, 7473)
    assert length.steps == 105  # 7473 // 1024 = 7 full batches an epoch, x 15 epochs
    assert "total_training_steps = 7473 // 1024 * 15 = 105" in length.how
    assert length.warning is None
    assert derive_run_length(cfg, 1024).steps == 15  # exactly one batch an epoch


def test_total_training_steps_overrides_epochs_and_warns_when_the_data_cannot_fill_it() -> None:
    enough = derive_run_length(load_config([GRPO], ["trainer.total_training_steps=50"]), 7473)
    assert (enough.steps, enough.warning) == (50, None)  # 15 x 7473 // 256 = 437 full batches >= 50
    short = derive_run_length(load_config([GRPO], ["trainer.total_training_steps=500"]), 7473)
    assert short.steps == 500
    assert short.warning is not None and "437 full batches" in short.warning and "runs out" in short.warning
    unbounded = load_config([GRPO], ["trainer.total_training_steps=500", "trainer.total_epochs=null"])
    how = "total_training_steps = 500 (trainer.total_training_steps)"
    assert derive_run_length(unbounded, 10) == RunLength(500, how)  # no data bound, nothing to warn about


def test_fewer_prompts_than_one_batch_is_an_error_naming_the_key() -> None:
    cfg = load_config([GRPO])
    with pytest.raises(ValueError, match=r"data.train_batch_size=256 is larger than the 100 training prompts"):
        derive_run_length(cfg, 100)
    with pytest.raises(ValueError, match="no training prompts"):
        derive_run_length(cfg, 0)


@pytest.mark.parametrize("path", [GRPO, PPO], ids=["grpo", "ppo"])
def test_optimizer_schedules_get_the_derived_horizon(path: str) -> None:
    overrides = [
        "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1",
        "critic.optim.lr_warmup_steps_ratio=0.2",
    ]
    cfg = load_config([path], overrides if path == PPO else overrides[:2])
    steps = derive_run_length(cfg, 7473).steps
    assert steps == 7473 // 256 * 15 == 435
    s = LearnerSettings.from_config(cfg, total_training_steps=steps)
    assert (s.optim.total_training_steps, s.optim.lr_warmup_steps) == (435, 43)  # int(0.1 x 435)
    if path == PPO:
        assert s.critic is not None
        assert (s.critic.optim.total_training_steps, s.critic.optim.lr_warmup_steps) == (435, 87)
    # Without the derived value a cosine schedule has no horizon: the learner must pass it.
    with pytest.raises(ValueError, match="total_training_steps must be > 0 for the cosine schedule"):
        LearnerSettings.from_config(cfg, total_training_steps=None)
    # A set trainer.total_training_steps still wins over the derived value's absence.
    fixed = load_config([path], [*overrides[:2], "trainer.total_training_steps=40"])
    assert LearnerSettings.from_config(fixed, total_training_steps=None).optim.total_training_steps == 40


def test_dry_run_says_when_the_data_is_not_here() -> None:
    report = dry_run_report(load_config([GRPO], ["data.train_files=/nonexistent/train.jsonl"]))
    run = report["run_length"]
    assert run["total_training_steps"] is None
    assert "len(train set) // data.train_batch_size * trainer.total_epochs" in run["how"]
    assert "not on this machine" in run["note"] and "/nonexistent/train.jsonl" in run["note"]
    set_steps = dry_run_report(load_config([GRPO], ["trainer.total_training_steps=7"]))["run_length"]
    assert (set_steps["total_training_steps"], set_steps["how"]) == (7, "trainer.total_training_steps")


def test_dry_run_derives_from_builtin_data() -> None:
    cfg = load_config(
        [str(ROOT / "configs" / "demo_grpo.yaml")],
        ["trainer.total_training_steps=null", "trainer.total_epochs=2", "data.train_batch_size=2560"],
    )
    run = dry_run_report(cfg)["run_length"]
    assert run["train_prompts"] == 20000  # builtin:arith's train split; every prompt fits
    assert run["total_training_steps"] == 20000 // 2560 * 2 == 14
