"""tools/tune.py on a saved synthetic profile: prints the assumptions, writes the tables and the plot."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from async_rl.tuning.profile import Profile

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
    assert len((out / "recommendations.csv").read_text().splitlines()) == 3  # header + one row per GPU count
    assert (out / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_needs_a_config_or_a_profile() -> None:
    with pytest.raises(SystemExit):
        _tool().parse_args(["--gpus", "8"])
