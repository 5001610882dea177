"""reward.reward_model: a config names a directory an earlier stage may still have to export; a job needs it there."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from async_rl.config import load_config
from async_rl.config.validate import check_reward_model_dir
from async_rl.runtime.dry_run import dry_run_report

REPO = Path(__file__).resolve().parents[2]


def test_a_missing_directory_loads_and_is_refused_when_a_job_starts(tmp_path: Path) -> None:
    later = tmp_path / "rm" / "hf"
    cfg = load_config(None, ["reward.reward_model.enable=true", f"reward.reward_model.model_path={later}"])
    report = dry_run_report(cfg)["reward_model"]
    assert report["path"] == str(later) and report["status"].startswith("no model there yet")
    with pytest.raises(ValueError, match=r"reward.reward_model.model_path='.*/rm/hf' is not a model directory"):
        check_reward_model_dir(cfg)
    later.mkdir(parents=True)
    (later / "config.json").write_text("{}")
    check_reward_model_dir(cfg)
    assert dry_run_report(cfg)["reward_model"]["status"] == "a model directory"
    check_reward_model_dir(load_config(None, []))  # off: nothing to check
    assert dry_run_report(load_config(None, []))["reward_model"] is None


def test_the_launcher_refuses_to_start_without_the_model(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "launchers"))
    try:
        from local import read_settings
    finally:
        sys.path.remove(str(REPO / "launchers"))
    on = ["reward.reward_model.enable=true", f"reward.reward_model.model_path={tmp_path / 'nothing'}"]
    with pytest.raises(ValueError, match="is not a model directory"):
        read_settings([], on)


def test_the_gold_recipe_loads_before_its_reward_model_exists() -> None:
    cfg = load_config(str(REPO / "configs" / "smollm2_arith_rm_gold.yaml"))
    rm = cfg.reward.reward_model
    assert rm.enable and rm.rule_weight == 0.0 and rm.weight == 1.0
    assert cfg.reward.function == "async_rl.rewards.arith:compute_chat_gold"
    assert cfg.actor_rollout_ref.actor.use_kl_loss
