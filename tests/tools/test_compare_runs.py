"""tools/compare_runs.py: per-run values against wall clock, the first logged key of a comma list, and a PNG."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compare_runs_under_test", REPO / "tools" / "compare_runs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _write(run: Path, records: list[dict]) -> Path:
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_compare_tables_each_run_against_wall_clock(tmp_path: Path) -> None:
    tool = _load_tool()
    grpo = _write(
        tmp_path / "grpo",
        [
            {"step": 0, "time/wall_s": 60.0, "val/version": 0, "val/arith/reward_mean": 0.2},
            {"step": 1, "time/wall_s": 120.0, "learner/batch/informative_groups": 9},
            {"step": 2, "time/wall_s": 240.0, "learner/batch/informative_groups": 11},
            {"step": 2, "time/wall_s": 300.0, "val/version": 2, "val/arith/reward_mean": 0.5},
        ],
    )
    dapo = _write(
        tmp_path / "dapo",
        [
            {"step": 1, "time/wall_s": 180.0, "learner/batch/informative_groups": 16},
            {"step": 1, "time/wall_s": 190.0, "val/version": 1, "val/arith/acc_mean": 0.4, "val/arith/reward_mean": 0},
        ],
    )
    out = tmp_path / "cmp.png"
    val = [["val/arith/acc_mean", "val/arith/reward_mean"]]
    table = tool.compare({"grpo": grpo, "dapo": dapo}, [["learner/batch/informative_groups"]], val, out)
    lines = table.splitlines()
    assert lines[0] == "    grpo learner/batch/informative_groups: 9.000@2.0m(s1) 11.000@4.0m(s2)"
    assert lines[1] == "    dapo learner/batch/informative_groups: 16.000@3.0m(s1)"
    assert lines[2] == "    grpo val/arith/reward_mean: 0.200@1.0m(s0) 0.500@5.0m(s2)"  # no acc: the next key
    assert lines[3] == "    dapo val/arith/acc_mean: 0.400@3.2m(s1)"  # acc first
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_key_the_catalog_does_not_name_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tool = _load_tool()
    run = _write(tmp_path / "run", [{"step": 1, "time/wall_s": 1.0, "learner/batch/reward_mean": 0.5}])
    # a key nothing emits, and a training key asked for from the validation records
    for flag, key in (("--train", "reward/mean"), ("--val", "learner/batch/reward_mean")):
        with pytest.raises(SystemExit) as exc:
            tool.main([f"r={run}", flag, key, "--out", str(tmp_path / "c.png")])
        assert exc.value.code == 2 and key in capsys.readouterr().err
