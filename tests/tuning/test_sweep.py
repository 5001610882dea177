"""Staleness sweep: the plan (runs and overrides, one seed or several), resume, and the tables and plots from
synthetic metrics files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from async_rl import metric_catalog as mc
from async_rl.tuning.sweep import RunOutcome, SweepRun, completed_steps, parse_args, plan_sweep, run_sweep
from async_rl.tuning.sweep_report import (
    cell_band,
    hold_tolerance,
    mean_ci95,
    summarize_cells,
    summarize_run,
    t_quantile_975,
    verdict,
    write_report,
)


def _plan(tmp_path: Path, **kwargs) -> list[SweepRun]:
    args = {
        "staleness": [0, 2],
        "corrections": [True, False],
        "steps": 10,
        "out": tmp_path,
        "seeds": [7],
        "data_seed": 9,
        "seed_in_name": False,
    }
    args.update(kwargs)
    return plan_sweep(**args)


def test_plan_lists_every_pair_with_its_overrides(tmp_path):
    runs = _plan(tmp_path, base_overrides=["actor_rollout_ref.actor.optim.lr=1e-4"], warm_model=tmp_path / "warm")
    assert [(r.staleness, r.correction) for r in runs] == [(0, True), (0, False), (2, True), (2, False)]
    assert [r.name for r in runs] == ["k0-corr-on", "k0-corr-off", "k2-corr-on", "k2-corr-off"]
    assert [r.name for r in runs] == [r.cell for r in runs] and {r.seed for r in runs} == {7}
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


def test_plan_with_seeds_runs_every_cell_once_per_seed_seed_by_seed(tmp_path):
    runs = _plan(tmp_path, corrections=[True], seeds=[1, 2], seed_in_name=True)
    assert [r.name for r in runs] == ["k0-corr-on-seed1", "k2-corr-on-seed1", "k0-corr-on-seed2", "k2-corr-on-seed2"]
    assert [r.cell for r in runs] == ["k0-corr-on", "k2-corr-on", "k0-corr-on", "k2-corr-on"]
    run = runs[2]
    assert run.seed == 2 and run.run_dir == tmp_path / "runs" / "k0-corr-on-seed2"
    # each run has its own trainer.seed; every run the same data.seed (same prompts, same order)
    assert run.overrides[:2] == ("trainer.seed=2", "data.seed=9")
    assert f"trainer.default_local_dir={run.run_dir}" in run.overrides
    assert [o for r in runs for o in r.overrides if o.startswith("trainer.seed=")] == [
        "trainer.seed=1",
        "trainer.seed=1",
        "trainer.seed=2",
        "trainer.seed=2",
    ]
    # one seed given with --seeds is still named by it, so a later sweep with more seeds reuses that run
    (single,) = _plan(tmp_path, staleness=[0], corrections=[True], seeds=[1], seed_in_name=True)
    assert single.run_dir == runs[0].run_dir


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
        ({"seeds": []}, "--seeds"),
        ({"seeds": [3, 3], "seed_in_name": True}, "--seeds"),
        ({"seeds": [1, 2]}, "named by seed"),
        ({"seeds": [1, 2], "seed_in_name": True, "base_overrides": ["trainer.seed=5"]}, "--seeds sets trainer.seed"),
    ],
)
def test_plan_rejects_bad_input(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _plan(tmp_path, **kwargs)


def test_overrides_may_follow_list_options():
    args, overrides = parse_args(["--staleness", "0", "4", "trainer.seed=3", "--quick", "data.seed=2"])
    assert args.staleness == [0, 4] and args.quick
    assert overrides == ["trainer.seed=3", "data.seed=2"] and args.seeds is None
    args, overrides = parse_args(["--seeds", "1", "2", "3", "data.seed=2"])
    assert args.seeds == [1, 2, 3] and overrides == ["data.seed=2"]


def _write_metrics(
    run: SweepRun,
    steps: int,
    *,
    reward0: float,
    wall0: float = 10.0,
    dt: float = 2.0,
    val: dict[int, float] | None = None,
    staleness_max: float | None = None,
) -> None:
    """``steps`` records: reward rising by 0.01 a step, ``dt`` s a step, 1000 trained tokens a step; a validation
    record after each step in ``val`` (step -> validation reward); with ``staleness_max``, a largest staleness of K at
    every step but step 5, where it is ``staleness_max``."""
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
        if staleness_max is not None:
            record[mc.LEARNER_STALENESS_MAX] = staleness_max if step == 5 else float(run.staleness)
        lines.append(json.dumps(record))
        if val is not None and step in val:
            lines.append(json.dumps({"step": step, "val/version": float(step), "val/reward_mean": val[step]}))
    run.metrics_path.write_text("\n".join(lines) + "\n")


def test_table_values_from_synthetic_runs(tmp_path):
    runs = _plan(tmp_path, steps=20)
    for i, run in enumerate(runs):
        _write_metrics(run, 20, reward0=0.1 * i)
    outcomes = [RunOutcome("done", 60.0 + i, 0, run.log_path) for i, run in enumerate(runs)]
    outcomes[3] = RunOutcome("failed", 5.0, 1, runs[3].log_path)
    paths = write_report(runs, outcomes, tmp_path)
    assert {p.name for p in paths} >= {"sweep.csv", "sweep.md", "reward_vs_step.png", "reward_vs_wall.png"}
    assert {p.name for p in paths} >= {"sweep_cells.csv", "sweep_cells.md"}
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
    assert row["seed"] == "7" and row["val_reward_last"] == ""  # these runs logged no validation round
    md = (tmp_path / "sweep.md").read_text().splitlines()
    assert len(md) == 2 + len(runs)
    assert md[4].startswith("| 2 | on | 7 | done | 20 | 62 | 0.205 | 0.385 | 0.390 | n/a | n/a | 0.500 | 500 | 0.900 |")


def test_run_without_metrics_still_gets_a_row(tmp_path):
    run = _plan(tmp_path, staleness=[4], corrections=[True])[0]
    row = summarize_run(run, RunOutcome("failed", 3.0, 1, run.log_path))
    assert row["status"] == "failed" and row["steps"] == 0
    assert row["reward_last10"] is None and row["steps_per_s"] is None and row["dropped_groups"] is None
    write_report([run], [None], tmp_path)  # plots say "no data" instead of failing
    assert "| 4 | on | 7 | not run | 0 | n/a |" in (tmp_path / "sweep.md").read_text()
    assert "| 4 | on | 0 of 1 | n/a | n/a |" in (tmp_path / "sweep_cells.md").read_text()


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


def test_cells_average_their_finished_seeds_and_read_the_last_validation_round(tmp_path):
    runs = _plan(tmp_path, steps=20, corrections=[True], seeds=[1, 2, 3], seed_in_name=True)
    assert [r.name for r in runs][:2] == ["k0-corr-on-seed1", "k2-corr-on-seed1"]
    rewards = {"k0-corr-on": (0.1, 0.3, 0.5), "k2-corr-on": (0.2, 0.4, 0.0)}
    outcomes = []
    for run in runs:
        reward0 = rewards[run.cell][run.seed - 1]
        # validation rounds at steps 10 and 20; the last one counts
        _write_metrics(run, 20, reward0=reward0, dt=1.0 + run.seed, val={10: 0.9, 20: reward0 + 0.05})
        failed = run.cell == "k2-corr-on" and run.seed == 3
        outcomes.append(RunOutcome("failed" if failed else "done", 100.0 * run.seed, 1 if failed else 0, run.log_path))
    write_report(runs, outcomes, tmp_path)

    rows = [summarize_run(run, outcome) for run, outcome in zip(runs, outcomes, strict=True)]
    assert [(r["seed"], r["val_step_last"]) for r in rows[:2]] == [(1, 20), (1, 20)]
    assert [r["val_reward_last"] for r in rows[:2]] == [pytest.approx(0.15), pytest.approx(0.25)]
    k0, k2 = summarize_cells(runs, rows)
    assert (k0["K"], k0["correction"], k0["runs"], k0["done"]) == (0, "on", 3, 3)
    # last 10% of 20 steps = steps 19 and 20: reward0 + 0.185 on average
    assert k0["reward_last10_mean"] == pytest.approx(0.3 + 0.185)
    assert (k0["reward_last10_min"], k0["reward_last10_max"]) == (pytest.approx(0.285), pytest.approx(0.685))
    assert k0["val_reward_last_mean"] == pytest.approx(0.35)
    assert (k0["wall_clock_s_min"], k0["wall_clock_s_mean"], k0["wall_clock_s_max"]) == (100.0, 200.0, 300.0)
    # the failed seed counts as a run, not in the statistics
    assert (k2["runs"], k2["done"]) == (3, 2)
    assert k2["val_reward_last_mean"] == pytest.approx(0.35)
    assert (k2["val_reward_last_min"], k2["val_reward_last_max"]) == (pytest.approx(0.25), pytest.approx(0.45))

    cells = list(csv.DictReader((tmp_path / "sweep_cells.csv").open()))
    assert [(c["K"], c["correction"], c["runs"], c["done"]) for c in cells] == [
        ("0", "on", "3", "3"),
        ("2", "on", "3", "2"),
    ]
    assert float(cells[1]["reward_final_mean"]) == pytest.approx((0.39 + 0.59) / 2)
    md = (tmp_path / "sweep_cells.md").read_text().splitlines()
    assert md[0].startswith("| K | correction | runs done | wall-clock s, mean (range) |")
    assert md[2].startswith(
        "| 0 | on | 3 of 3 | 200 (100-300) | 0.485 (0.285-0.685) | 0.490 (0.290-0.690) | 0.350 (0.150-0.550) |"
    )
    assert md[3].startswith("| 2 | on | 2 of 3 | 150 (100-200) | 0.485 (0.385-0.585) |")
    # the per-run table names each run's seed
    per_run = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert [(r["K"], r["seed"], r["status"]) for r in per_run][-2:] == [("0", "3", "done"), ("2", "3", "failed")]


def test_report_only_reads_back_the_runs_of_every_seed(tmp_path):
    from async_rl.tuning.sweep import main

    runs = _plan(tmp_path, steps=20, staleness=[1], seeds=[4, 5], seed_in_name=True)
    for run in runs:
        _write_metrics(run, 20, reward0=0.1 * run.seed)
        (run.run_dir / "sweep_run.json").write_text(
            json.dumps({"status": "done", "seconds": 50.0 + run.seed, "returncode": 0, "log": str(run.log_path)})
        )
    argv = ["--report-only", "--out", str(tmp_path), "--staleness", "1", "--seeds", "4", "5", "--steps", "20"]
    assert main(argv) == 0
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert [(r["correction"], r["seed"], r["wall_clock_s"]) for r in rows] == [
        ("on", "4", "54.0"),
        ("off", "4", "54.0"),
        ("on", "5", "55.0"),
        ("off", "5", "55.0"),
    ]
    cells = list(csv.DictReader((tmp_path / "sweep_cells.csv").open()))
    assert [(c["correction"], c["done"], c["wall_clock_s_mean"]) for c in cells] == [
        ("on", "2", "54.5"),
        ("off", "2", "54.5"),
    ]


def test_mean_ci95_is_students_t_over_the_values():
    assert (t_quantile_975(1), t_quantile_975(2), t_quantile_975(30), t_quantile_975(31)) == (
        12.7062,
        4.3027,
        2.0423,
        1.96,
    )
    # mean 0.85, sample std 0.05: 4.3027 x 0.05 / sqrt(3)
    mean, half = mean_ci95([0.80, 0.85, 0.90])
    assert mean == pytest.approx(0.85) and half == pytest.approx(0.1242, abs=1e-4)
    assert mean_ci95([0.7]) == (pytest.approx(0.7), None)  # one seed: no interval
    assert mean_ci95([]) == (None, None)
    with pytest.raises(ValueError):
        t_quantile_975(0)


def test_verdict_tolerance_depends_on_k():
    assert (hold_tolerance(0), hold_tolerance(8), hold_tolerance(9), hold_tolerance(16)) == (0.05, 0.05, 0.10, 0.10)
    assert verdict(2, -0.03) == "holds" and verdict(2, 0.02) == "holds"
    assert verdict(2, -0.06) == "falls"
    assert verdict(8, 0.80 - 0.85) == "holds"  # exactly the tolerance, up to float rounding
    assert verdict(16, -0.08) == "holds" and verdict(16, -0.11) == "falls"
    assert verdict(0, None) == "baseline" and verdict(0, -0.2) == "baseline"
    assert verdict(4, None) == "no baseline"


def test_cell_band_means_every_step_and_bands_where_two_runs_have_a_value():
    steps, means, halves = cell_band([[(10, 0.5), (20, 0.8)], [(10, 0.7), (20, 0.9)], [(20, 1.0), (30, 0.4)]])
    assert steps == [10, 20, 30]
    assert means == [pytest.approx(0.6), pytest.approx(0.9), pytest.approx(0.4)]
    # step 10: std 0.1414 of 2 values, 12.7062 x 0.1414 / sqrt(2); step 20: std 0.1 of 3, 4.3027 x 0.1 / sqrt(3)
    assert halves[0] == pytest.approx(1.27062) and halves[1] == pytest.approx(0.248417, abs=1e-6)
    assert halves[2] is None
    assert cell_band([]) == ([], [], [])


def test_cells_judge_the_final_validation_reward_against_k0(tmp_path):
    runs = _plan(tmp_path, steps=20, staleness=[0, 2, 8, 16], seeds=[1, 2, 3], seed_in_name=True)
    # last validation reward by cell and seed; correction off has no finished K = 0 run
    finals = {
        "k0-corr-on": (0.80, 0.85, 0.90),  # mean 0.85
        "k2-corr-on": (0.79, 0.82, 0.85),  # mean 0.82: 0.03 below, tolerance 0.05
        "k8-corr-on": (0.74, 0.79, 0.84),  # mean 0.79: 0.06 below, tolerance 0.05
        "k16-corr-on": (0.72, 0.77, 0.82),  # mean 0.77: 0.08 below, tolerance 0.10
        "k0-corr-off": (0.9, 0.9, 0.9),
        "k2-corr-off": (0.60, 0.1, 0.1),
        "k8-corr-off": (0.5, 0.5, 0.5),
        "k16-corr-off": (0.40, 0.50, 0.60),
    }
    failed = {"k0-corr-off": (1, 2, 3), "k2-corr-off": (2, 3), "k8-corr-off": (1, 2, 3)}
    outcomes = []
    for run in runs:
        final = finals[run.cell][run.seed - 1]
        _write_metrics(run, 20, reward0=0.1, val={10: final - 0.1, 20: final}, staleness_max=run.staleness + run.seed)
        status = "failed" if run.seed in failed.get(run.cell, ()) else "done"
        outcomes.append(RunOutcome(status, 60.0, 0 if status == "done" else 1, run.log_path))
    paths = write_report(runs, outcomes, tmp_path)

    rows = [summarize_run(run, outcome) for run, outcome in zip(runs, outcomes, strict=True)]
    assert [(r["K"], r["seed"], r["staleness_max"]) for r in rows[:2]] == [(0, 1, 1.0), (0, 1, 1.0)]
    cells = {f"k{c['K']}-corr-{c['correction']}": c for c in summarize_cells(runs, rows)}
    k0 = cells["k0-corr-on"]
    assert k0["val_reward_last_mean"] == pytest.approx(0.85)
    assert k0["val_reward_last_ci95"] == pytest.approx(0.1242, abs=1e-4)
    assert (k0["val_reward_last_vs_k0"], k0["verdict"]) == (None, "baseline")
    judged = {name: (cells[name]["val_reward_last_vs_k0"], cells[name]["verdict"]) for name in cells}
    assert judged["k2-corr-on"] == (pytest.approx(-0.03), "holds")
    assert judged["k8-corr-on"] == (pytest.approx(-0.06), "falls")
    assert judged["k16-corr-on"] == (pytest.approx(-0.08), "holds")
    assert judged["k0-corr-off"] == (None, "baseline")  # no finished run, still the baseline row
    assert judged["k2-corr-off"] == (None, "no baseline") and judged["k16-corr-off"] == (None, "no baseline")
    assert judged["k8-corr-off"] == (None, None)  # nothing finished to judge
    # one finished seed: its value, no interval
    k2_off = cells["k2-corr-off"]
    assert (k2_off["done"], k2_off["val_reward_last_mean"], k2_off["val_reward_last_ci95"]) == (1, 0.6, None)
    # staleness reached: the largest run maximum (K + seed) over the finished seeds, and the mean of the run means (K)
    assert (cells["k16-corr-on"]["staleness_max_max"], cells["k16-corr-on"]["staleness_mean_mean"]) == (19.0, 16.0)
    assert (k2_off["staleness_max_max"], k2_off["staleness_mean_mean"]) == (3.0, 2.0)  # seed 1 only
    assert cells["k8-corr-off"]["staleness_max_max"] is None

    table = {f"k{c['K']}-corr-{c['correction']}": c for c in csv.DictReader((tmp_path / "sweep_cells.csv").open())}
    assert table["k8-corr-on"]["verdict"] == "falls"
    assert float(table["k8-corr-on"]["val_reward_last_vs_k0"]) == pytest.approx(-0.06)
    assert float(table["k0-corr-on"]["val_reward_last_ci95"]) == pytest.approx(0.1242, abs=1e-4)
    assert table["k2-corr-off"]["val_reward_last_ci95"] == "" and table["k8-corr-off"]["verdict"] == ""
    assert table["k16-corr-on"]["staleness_max_max"] == "19.0"
    md = (tmp_path / "sweep_cells.md").read_text().splitlines()
    assert md[0].endswith(
        "| last validation reward, mean ± 95% CI | max staleness, highest | last validation reward vs K=0 | verdict |"
    )
    assert md[2].startswith("| 0 | on | 3 of 3 |") and md[2].endswith("| 0.850 ± 0.124 | 3 | n/a | baseline |")
    assert md[3].startswith("| 0 | off | 0 of 3 |") and md[3].endswith("| n/a | n/a | n/a | baseline |")
    assert md[4].endswith("| 0.820 ± 0.075 | 5 | -0.030 | holds |")  # 4.3027 x 0.03 / sqrt(3) = 0.0745
    assert md[5].endswith("| 0.600 | 3 | n/a | no baseline |")
    assert md[6].endswith("| -0.060 | falls |") and md[8].endswith("| -0.080 | holds |")

    (bands,) = [p for p in paths if p.name == "sweep_val_bands.png"]
    assert bands == tmp_path / "sweep_val_bands.png" and bands.stat().st_size > 10_000
