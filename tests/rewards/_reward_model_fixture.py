"""A small exported reward model (a transformers sequence-classification Qwen2 with one label, random weights) and
its ``reward_stats.json``, as the reward-model trainer writes them; built in code, nothing downloaded."""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 64
PAD = 0
STATS = {"mean": 0.25, "std": 2.0}


def export_reward_model(directory: Path, *, num_labels: int = 1, stats: dict[str, float] | None = None) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        num_labels=num_labels,
        pad_token_id=PAD,
    )
    model = Qwen2ForSequenceClassification(config)
    with torch.no_grad():  # a score head large enough that sequences get clearly different scores
        model.score.weight.normal_(0.0, 1.0)
    model.save_pretrained(str(directory))
    (directory / "reward_stats.json").write_text(json.dumps(STATS if stats is None else stats))
    return directory
