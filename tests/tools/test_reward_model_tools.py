"""The reward-model tools: the toy-pair writer, and the training script as the entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_tool_writes_the_toy_pairs_the_loader_reads(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import make_toy_preferences
    finally:
        sys.path.remove(str(REPO / "tools"))
    from async_rl.config.reward_model_train import RewardDataConfig
    from async_rl.data.preferences import load_pairs

    assert make_toy_preferences.main(["--out", str(tmp_path), "--chat"]) == 0
    train = load_pairs(str(tmp_path / "train.jsonl"), RewardDataConfig(), split="train")
    held_out = load_pairs(str(tmp_path / "val.jsonl"), RewardDataConfig(), split="eval")
    assert (len(train), len(held_out)) == (490, 100) and isinstance(train[0].prompt, list)


def test_the_training_script_is_the_entry_point() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "tools" / "train_reward_model.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "loss.center_rewards_coefficient" in out and "data.micro_batch_size_per_gpu" in out
