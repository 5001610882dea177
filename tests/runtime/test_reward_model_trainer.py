"""Reward-model training in one process on the tiny model: it learns the toy preferences, and its export is a plain
transformers sequence-classification model that scores exactly as the trainer did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from async_rl import metric_catalog as mc
from async_rl.config.reward_model_train import load_reward_model_config
from async_rl.learner.dist import local_context
from async_rl.learner.reward_model import pad_right
from async_rl.runtime.metrics import read_metrics
from async_rl.runtime.reward_model_trainer import REWARD_STATS_FILE, RewardModelTrainer, format_rm_line

REPO = Path(__file__).resolve().parents[2]


def test_tiny_reward_model_learns_the_toy_preferences_and_exports(tmp_path: Path) -> None:
    cfg, _ = load_reward_model_config(
        [str(REPO / "configs" / "reward_model" / "tiny_toy.yaml")],
        [f"trainer.default_local_dir={tmp_path}", "model.mixed_precision.param_dtype=fp32", "trainer.test_freq=300"],
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 threads on 2 shared cores ran 20x slower while other work was running
    try:
        trainer = RewardModelTrainer(cfg, local_context(torch.device("cpu")))
        assert trainer.total_steps == 40 * (len(trainer.train_pairs) // 32) and len(trainer.val_pairs) == 100
        summary = trainer.train()
    finally:
        torch.set_num_threads(threads)

    records = read_metrics(tmp_path / "metrics.jsonl")
    assert len(records) == trainer.total_steps
    assert all(mc.unknown_keys(r, mc.record_kind(r)) == [] and mc.record_kind(r) == "rm" for r in records)
    evals = [r for r in records if mc.RM_EVAL_ACCURACY in r]
    assert [r["step"] for r in evals] == [300, trainer.total_steps]
    first, last = records[0], records[-1]
    assert first[mc.RM_TRAIN_ACCURACY] < 0.8 and first[mc.RM_TRAIN_LOSS] > 0.5  # untrained: about chance
    assert last[mc.RM_EVAL_ACCURACY] >= 0.95, last  # held-out pairs (measured 0.99)
    assert last[mc.RM_EVAL_MARGIN_MEAN] > 2.0 and last[mc.RM_EVAL_LOSS] < 0.2
    assert last[mc.RM_TRAIN_GRAD_NORM] > 0 and last[mc.RM_PERF_PEAK_MEMORY_MIB] > 0 and last[mc.RM_TRAIN_LR] == 5e-4
    assert "acc" in format_rm_line(1, 2, last) and "eval acc" in format_rm_line(1, 2, last)

    # the export loads with plain transformers and rescores the held-out pairs as the trainer does
    from transformers import AutoModelForSequenceClassification

    export = Path(summary["export"])
    hf = AutoModelForSequenceClassification.from_pretrained(str(export), dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen2ForSequenceClassification" and hf.config.num_labels == 1
    assert hf.config.pad_token_id == trainer.tokenizer.pad_token_id
    pairs = trainer.val_pairs
    seqs = pairs.chosen + pairs.rejected
    ids, mask = pad_right(seqs, hf.config.pad_token_id)
    with torch.no_grad():
        rescored = hf(input_ids=ids, attention_mask=mask).logits[:, 0].double()
    mine = trainer.model.score_pairs(pairs.chosen, pairs.rejected)
    assert float((rescored - torch.cat([mine.chosen, mine.rejected])).abs().max()) < 1e-5
    stats = json.loads((export / REWARD_STATS_FILE).read_text())
    assert stats["num_pairs"] == 100 and stats["split"] == "eval"
    assert stats["turn_end_ids"] == []  # plain-text pairs: a response's score is read at its own last token
    assert stats["mean"] == pytest.approx(float(rescored.mean()), abs=1e-5)
    assert stats["std"] == pytest.approx(float(rescored.std(unbiased=False)), abs=1e-5) and stats["std"] > 0.5
