"""tools/tune.py on a saved synthetic profile: prints the assumptions, writes the tables and the plot."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from async_rl.tuning.profile import Profile, SettingTrial

TOOL = Path(__file__).resolve().parents[2] / "tools" / "tune.py"


def _tool():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("tune_tool", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tune_tool"] = module
    spec.loader.exec_module(module)
    return module


def test_cli_writes_table_csv_and_png(
    tuner_profile: Profile, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tuner_profile.save(tmp_path / "profile.json")
    out = tmp_path / "out"
    code = _tool().main(
        ["--profile", str(tmp_path / "profile.json"), "--gpus", "4", "8", "--steps", "10", "--out", str(out)]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "scaling assumptions" in printed and "efficiency per doubling" in printed
    assert "4 GPUs:" in printed and "8 GPUs:" in printed
    table = (out / "recommendations.md").read_text()
    assert "| gpus | learner_gpus |" in table and "bottleneck" in table
    assert "no learner setting was timed in this profile" in printed and "no learner setting was timed" in table
    assert len((out / "recommendations.csv").read_text().splitlines()) == 3  # header + one row per GPU count
    assert (out / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_needs_a_config_or_a_profile() -> None:
    with pytest.raises(SystemExit):
        _tool().parse_args(["--gpus", "8"])


def test_cli_prints_and_writes_the_measured_settings(
    tuner_profile: Profile, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"
    trial = SettingTrial(key, ("fp32", "bf16"), ("param_dtype=fp32", "param_dtype=bf16"), ((2.0, 2.1), (0.8, 0.9)), 640)
    Profile(**{**tuner_profile.__dict__, "settings": (trial,)}).save(tmp_path / "profile.json")
    out = tmp_path / "out"
    assert (
        _tool().main(["--profile", str(tmp_path / "profile.json"), "--gpus", "4", "--steps", "10", "--out", str(out)])
        == 0
    )
    line = (
        f"set {key}=bf16 (measured 0.85 s vs 2.05 s per learner step: param_dtype=bf16 vs param_dtype=fp32, 640"
        " tokens, medians of 2 and 2 steps)"
    )
    assert f"  {line}\n" in capsys.readouterr().out
    assert f"- {line}\n" in (out / "recommendations.md").read_text()
