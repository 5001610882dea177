"""tools/bench_pipeline.py: throughput from metrics.jsonl (hand values), and the launch path it relies on (the
launcher and the actor entry point pass the emulation flags to actors only, and reject bad values)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_pipeline_under_test", REPO / "tools" / "bench_pipeline.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class body runs
    spec.loader.exec_module(module)
    return module


bench = _load()


def test_throughput_skips_warmup_steps() -> None:
    # Steps end at 5.0 (warm-up: includes the actor's start), 6.0, 6.5, 7.0: after step 1, 3 steps x 8 groups in 2 s.
    records = [{"step": s, "time/wall_s": w} for s, w in [(1, 5.0), (2, 6.0), (3, 6.5), (4, 7.0)]]
    assert bench.throughput(records, batch=8, warmup=1) == pytest.approx(12.0)
    assert bench.throughput(records, batch=8, warmup=2) == pytest.approx(2 * 8 / 1.0)
    with pytest.raises(ValueError, match="warm-up"):
        bench.throughput(records, batch=8, warmup=4)


def test_actor_summary_reads_the_last_json_line(tmp_path: Path) -> None:
    log = tmp_path / "actor-0.log"
    log.write_text('INFO start\n{"actor/groups_sent": 1}\nINFO more\n{"actor/emulated/paused_s": 0.5}\nbye\n')
    assert bench.actor_summary(log) == {"actor/emulated/paused_s": 0.5}
    assert bench.actor_summary(tmp_path / "missing.log") == {}


def test_launcher_passes_emulation_flags_to_actors_only(tmp_path: Path) -> None:
    shape = bench.Shape(batch=16, n=2, response_len=8)
    cmd = bench.launch_command(tmp_path, shape, tokens_per_s=640.0, staleness=2, steps=5)
    out = subprocess.run([*cmd, "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if not line.startswith("#")]
    learner, actor = lines
    assert "--emulate-tokens-per-s" not in learner
    assert actor.split("--emulate-tokens-per-s ")[1].split()[:3] == ["640.0", "--emulate-response-len", "8"]
    for line in (learner, actor):
        assert "async_training.max_staleness=2" in line and "data.train_batch_size=16" in line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--emulate-tokens-per-s", "0"], "must be > 0"),
        (["--emulate-response-len", "4"], "needs --emulate-tokens-per-s"),
    ],
)
def test_bad_emulation_flags_are_refused(argv: list[str], message: str) -> None:
    launcher = [sys.executable, str(REPO / "launchers" / "local.py"), "--dry-run", *argv]
    config = ["--config", str(REPO / "configs" / "demo_grpo.yaml")]
    out = subprocess.run([*launcher, *config], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and message in out.stderr
    actor = [sys.executable, "-m", "async_rl.entrypoints.actor", *config, "--coordinator", "tcp://127.0.0.1:1", *argv]
    out = subprocess.run(actor, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and message in out.stderr
