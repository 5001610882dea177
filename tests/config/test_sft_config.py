"""The SFT config tree: the shipped presets load without warnings, and a bad value names its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from async_rl.config import ConfigError
from async_rl.config.sft import load_sft_config

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("preset", sorted(p.name for p in (REPO / "configs" / "sft").glob("*.yaml")))
def test_the_shipped_presets_load_without_warnings(preset: str) -> None:
    cfg, warnings = load_sft_config(str(REPO / "configs" / "sft" / preset), [])
    assert warnings == []
    assert 0.0 <= cfg.trainer.label_smoothing_factor < 1.0


def test_the_demo_warm_start_preset_is_the_measured_recipe() -> None:
    cfg, _ = load_sft_config(str(REPO / "configs" / "sft" / "demo_warmstart.yaml"), [])
    assert (cfg.trainer.label_smoothing_factor, cfg.optim.lr, cfg.optim.lr_warmup_steps) == (0.3, 1e-3, 50)
    assert (cfg.data.train_batch_size, cfg.trainer.total_training_steps, cfg.data.seed) == (128, 1000, 0)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.label_smoothing_factor=1.0", "trainer.label_smoothing_factor must be below 1, got 1.0"),
        ("trainer.label_smoothing_factor=-0.1", "config key `trainer.label_smoothing_factor`: expected float >= 0"),
        ("data.response_key=prompt", "data.prompt_key and data.response_key must differ"),
    ],
)
def test_a_bad_value_names_its_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_sft_config(None, [override])
    assert message in str(info.value)
