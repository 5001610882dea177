"""tools/bench_all.py: runs each benchmark in its own process and collects their BENCH_RESULT lines.

The real benchmarks take minutes each; here stand-in scripts exercise the runner's contract: a result is collected,
a crash and a timeout are reported with their log, the others still run, and the exit status says so.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_all_under_test", REPO / "tools" / "bench_all.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_bench_all_collects_results_failures_and_timeouts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tool = _load_tool()
    scripts = tmp_path / "tools"
    scripts.mkdir()
    (scripts / "good.py").write_text(
        "import sys\n"
        "from async_rl.tuning.bench import BenchLine, emit\n"
        "print('measuring', sys.argv[1:])\n"
        "emit('good', [BenchLine('fast_vs_ref', float(sys.argv[1]), 0.9, 'side by side')])\n"
    )
    (scripts / "crash.py").write_text("raise SystemExit('boom')\n")
    (scripts / "hang.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setattr(tool, "REPO", tmp_path)
    monkeypatch.setattr(
        tool,
        "BENCHMARKS",
        {
            "good": ("good.py", ["0.95"], ["0.5"], 60.0),
            "crash": ("crash.py", [], [], 60.0),
            "hang": ("hang.py", [], [], 1.0),
        },
    )
    out = tmp_path / "out"
    assert tool.main(["--quick", "--out", str(out)]) == 1  # two of three produced no result
    printed = capsys.readouterr().out
    assert "fast_vs_ref" in printed and "0.50" in printed and "NOT met" in printed  # --quick arguments were used
    report = json.loads((out / "results.json").read_text())
    assert report["good"]["status"] == "ok"
    assert report["good"]["results"] == [
        {"metric": "fast_vs_ref", "ratio": 0.5, "target": 0.9, "detail": "side by side", "met": False}
    ]
    assert report["crash"]["status"] == "failed" and "boom" in (out / "crash.log").read_text()
    assert report["hang"]["status"] == "timeout"
    assert tool.main(["--only", "good", "--out", str(out)]) == 0  # full arguments: 0.95 meets 0.9
    assert json.loads((out / "results.json").read_text())["good"]["results"][0]["met"] is True
