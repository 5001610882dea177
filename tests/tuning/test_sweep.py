"""Staleness sweep: the plan (runs and overrides), resume, and the table and plots from synthetic metrics files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from async_rl.tuning.sweep import RunOutcome, SweepRun, completed_steps, parse_args, plan_sweep, run_sweep
from async_rl.tuning.sweep_report import summarize_run, write_report


def _plan(tmp_path: Path, **kwargs) -> list[SweepRun]:
    args = {
        "staleness": [0, 2],
        "corrections": [True, False],
        "steps": 10,
        "out": tmp_path,
        "seeds": (7, 9),
    }
    args.update(kwargs)
    return plan_sweep(**args)


def test_plan_lists_every_pair_with_its_overrides(tmp_path):
    runs = _plan(tmp_path, base_overrides=["actor_rollout_ref.actor.optim.lr=1e-4"], warm_model=tmp_path / "warm")
    assert [(r.staleness, r.correction) for r in runs] == [(0, True), (0, False), (2, True), (2, False)]
    assert [r.name for r in runs] == ["k0-corr-on", "k0-corr-off", "k2-corr-on", "k2-corr-off"]
    run = runs[3]
    assert run.run_dir == tmp_path / "runs" / "k2-corr-off"
    assert run.overrides == (
        "actor_rollout_ref.actor.optim.lr=1e-4",  # the user's overrides come first, the sweep's win
        "trainer.seed=7",
        "data.seed=9",
        "async_training.max_staleness=2",
        "algorithm.rollout_correction.enable=false",
        "trainer.total_training_steps=10",
        f"trainer.default_local_dir={tmp_path / 'runs' / 'k2-corr-off'}",
        "trainer.resume_mode=disable",
        f"actor_rollout_ref.model.path={tmp_path / 'warm'}",
    )
    assert "algorithm.rollout_correction.enable=true" in runs[0].overrides
    # every run shares the seeds and the warm model; no critic path unless asked
    assert all("trainer.seed=7" in r.overrides and "data.seed=9" in r.overrides for r in runs)
    assert not any(o.startswith("critic.") for r in runs for o in r.overrides)
    with_critic = _plan(tmp_path, warm_model=tmp_path / "warm", critic=True)
    assert f"critic.model.path={tmp_path / 'warm'}" in with_critic[0].overrides


def test_plan_without_warm_model_keeps_the_config_model(tmp_path):
    runs = _plan(tmp_path, staleness=[1], corrections=[False])
    assert len(runs) == 1
    assert not any(o.startswith("actor_rollout_ref.model.path") for o in runs[0].overrides)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"steps": 0}, "--steps"),
        ({"staleness": [1, 1]}, "--staleness"),
        ({"staleness": [-1]}, "--staleness"),
        ({"staleness": []}, "--staleness"),
        ({"corrections": [True, True]}, "--correction"),
        ({"base_overrides": ["async_training.max_staleness=3"]}, "async_training.max_staleness"),
        ({"base_overrides": ["trainer.total_training_steps=5"]}, "trainer.total_training_steps"),
    ],
)
def test_plan_rejects_bad_input(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _plan(tmp_path, **kwargs)


def test_overrides_may_follow_list_options():
    args, overrides = parse_args(["--staleness", "0", "4", "trainer.seed=3", "--quick", "data.seed=2"])
    assert args.staleness == [0, 4] and args.quick
    assert overrides == ["trainer.seed=3", "data.seed=2"]


def _write_metrics(run: SweepRun, steps: int, *, reward0: float, wall0: float = 10.0, dt: float = 2.0) -> None:
    """``steps`` records: reward rising by 0.01 a step, ``dt`` s a step, 1000 trained tokens a step."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(1, steps + 1):
        record = {
            "step": step,
            "time/wall_s": wall0 + dt * (step - 1),
            "learner/batch/reward_mean": reward0 + 0.01 * (step - 1),
            "learner/perf/tokens_per_s": 2000.0,
            "learner/perf/step_time_s": 0.5,  # 2000 x 0.5 = 1000 tokens a step
            "learner/offpolicy/ess": 1.0 if step % 2 else 0.8,
            "learner/staleness/mean": float(run.staleness),
            "rollout/version_span_mean": 0.25,
            "transport/drops_total": 3 * step,
        }
        lines.append(json.dumps(record))
    run.metrics_path.write_text("\n".join(lines) + "\n")


def test_table_values_from_synthetic_runs(tmp_path):
    runs = _plan(tmp_path, steps=20)
    for i, run in enumerate(runs):
        _write_metrics(run, 20, reward0=0.1 * i)
    outcomes = [RunOutcome("done", 60.0 + i, 0, run.log_path) for i, run in enumerate(runs)]
    outcomes[3] = RunOutcome("failed", 5.0, 1, runs[3].log_path)
    paths = write_report(runs, outcomes, tmp_path)
    assert {p.name for p in paths} >= {"sweep.csv", "sweep.md", "reward_vs_step.png", "reward_vs_wall.png"}
    assert {p.name for p in paths} >= {"throughput.png", "ess.png", "version_span.png", "drops.png"}
    assert all(p.stat().st_size > 0 for p in paths)

    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert [(r["K"], r["correction"], r["status"]) for r in rows] == [
        ("0", "on", "done"),
        ("0", "off", "done"),
        ("2", "on", "done"),
        ("2", "off", "failed"),
    ]
    row = rows[2]  # reward0 = 0.2
    assert int(row["steps"]) == 20
    assert float(row["wall_clock_s"]) == 62.0
    # 10% of 20 steps = 2 steps: first (0.20 + 0.21) / 2, last (0.38 + 0.39) / 2, final 0.39
    assert float(row["reward_first10"]) == pytest.approx(0.205)
    assert float(row["reward_last10"]) == pytest.approx(0.385)
    assert float(row["reward_final"]) == pytest.approx(0.39)
    # 19 steps in 38 s between the first and last step; 19 x 1000 tokens in 38 s
    assert float(row["steps_per_s"]) == pytest.approx(0.5)
    assert float(row["tokens_per_s"]) == pytest.approx(500.0)
    assert float(row["ess_mean"]) == pytest.approx(0.9)
    assert float(row["staleness_mean"]) == pytest.approx(2.0)
    assert float(row["version_span_mean"]) == pytest.approx(0.25)
    assert float(row["dropped_groups"]) == 60.0  # cumulative counter: its last value
    assert rows[3]["log"] == str(runs[3].log_path)
    md = (tmp_path / "sweep.md").read_text().splitlines()
    assert len(md) == 2 + len(runs)
    assert md[4].startswith("| 2 | on | done | 20 | 62 | 0.205 | 0.385 | 0.390 | 0.500 | 500 | 0.900 | 2.00 |")


def test_run_without_metrics_still_gets_a_row(tmp_path):
    run = _plan(tmp_path, staleness=[4], corrections=[True])[0]
    row = summarize_run(run, RunOutcome("failed", 3.0, 1, run.log_path))
    assert row["status"] == "failed" and row["steps"] == 0
    assert row["reward_last10"] is None and row["steps_per_s"] is None and row["dropped_groups"] is None
    write_report([run], [None], tmp_path)  # plots say "no data" instead of failing
    assert "| 4 | on | not run | 0 | n/a |" in (tmp_path / "sweep.md").read_text()


def test_resume_skips_complete_runs_and_repeats_incomplete_ones(tmp_path):
    runs = _plan(tmp_path, steps=5)
    _write_metrics(runs[0], 5, reward0=0.0)  # complete from an earlier sweep
    (runs[0].run_dir / "sweep_run.json").write_text(
        json.dumps({"status": "done", "seconds": 42.0, "returncode": 0, "log": str(runs[0].log_path)})
    )
    _write_metrics(runs[1], 3, reward0=0.0)  # interrupted at step 3
    assert completed_steps(runs[0].metrics_path) == 5 and completed_steps(runs[1].metrics_path) == 3
    executed: list[str] = []

    def fake_execute(run: SweepRun) -> RunOutcome:
        executed.append(run.name)
        if run.staleness == 2 and not run.correction:
            return RunOutcome("failed", 1.0, 1, run.log_path)
        _write_metrics(run, run.steps, reward0=0.5)
        return RunOutcome("done", 10.0, 0, run.log_path)

    printed: list[str] = []
    outcomes = run_sweep(runs, fake_execute, print_fn=printed.append)
    assert executed == ["k0-corr-off", "k2-corr-on", "k2-corr-off"]
    assert [o.status for o in outcomes] == ["done", "done", "done", "failed"]
    assert outcomes[0].seconds == 42.0  # the earlier sweep's wall-clock is kept
    assert any("run 1/4 k0-corr-on: already complete" in line for line in printed)
    assert any("run 3/4" in line and "ETA" in line for line in printed)
    recorded = json.loads((runs[3].run_dir / "sweep_run.json").read_text())
    assert recorded["status"] == "failed" and recorded["log"] == str(runs[3].log_path)

    # a second sweep over the same directory repeats only the failed run
    executed.clear()
    run_sweep(runs, fake_execute, print_fn=printed.append)
    assert executed == ["k2-corr-off"]


def test_report_only_rewrites_the_table_of_an_existing_sweep(tmp_path):
    from async_rl.tuning.sweep import main

    runs = _plan(tmp_path, steps=20)
    for run in runs:
        _write_metrics(run, 20, reward0=0.3)
        (run.run_dir / "sweep_run.json").write_text(
            json.dumps({"status": "done", "seconds": 80.0, "returncode": 0, "log": str(run.log_path)})
        )
    argv = ["--report-only", "--out", str(tmp_path), "--staleness", "0", "2", "--steps", "20"]
    assert main(argv) == 0
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert [(r["K"], r["correction"], r["status"], r["wall_clock_s"]) for r in rows] == [
        ("0", "on", "done", "80.0"),
        ("0", "off", "done", "80.0"),
        ("2", "on", "done", "80.0"),
        ("2", "off", "done", "80.0"),
    ]
    assert not (tmp_path / "warm_model").exists()  # nothing was built or run
