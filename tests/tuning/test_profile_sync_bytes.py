"""What the tuner counts as one weight update's bytes: the model, or in a LoRA run only the adapter."""

from __future__ import annotations

from pathlib import Path

from async_rl.config import load_config
from async_rl.models.tiny import build_tiny_model
from async_rl.tuning.profile import sync_bytes


def test_a_lora_run_syncs_the_adapters_bytes_only(tmp_path: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "tiny", seed=0)
    full = sync_bytes(load_config(None, []), model_dir)
    assert full == (model_dir / "model.safetensors").stat().st_size
    lora = sync_bytes(load_config(None, ["actor_rollout_ref.model.lora_rank=8"]), model_dir)
    # rank 8 on the 7 projections of 2 layers (hidden 128): the 131,072 bytes the LoRA e2e run broadcast per update
    assert lora == 131_072 and lora < full / 4
