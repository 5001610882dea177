"""--validate's report: the measured rate from a run's metrics and the prediction error of each case."""

from __future__ import annotations

import json
from pathlib import Path

from async_rl import metric_catalog as mc
from async_rl.tuning.simulator import SimResult
from async_rl.tuning.validate import Case, Outcome, format_outcomes, measured_rate, read_rows


def _sim(steps_per_s: float, learner_idle: float = 0.0) -> SimResult:
    return SimResult(steps_per_s, 0.0, 0.0, learner_idle, 0.0, 0.0, 0.0, 0.0, 10.0)


def test_measured_rate_skips_the_warm_up_steps() -> None:
    # steps 1-10 at 0.5 s each after a 20 s start: (10 - 5) steps in 2.5 s = 2 steps/s; idle averaged over 6-10
    rows = [{"step": s, mc.TIME_WALL_S: 20.0 + 0.5 * s, mc.LEARNER_IDLE_FRACTION: 0.1 * (s > 5)} for s in range(1, 11)]
    rate, idle = measured_rate(rows, warmup=5)
    assert rate == 2.0 and abs(idle - 0.1) < 1e-12


def test_validation_rows_are_not_training_steps(tmp_path: Path) -> None:
    # as the demo logs them: a validation row at step 0 and another after the last step, under the same step
    train = [{"step": s, mc.TIME_WALL_S: 10.0 + s, mc.LEARNER_PERF_STEP_TIME_S: 0.5} for s in (1, 2)]
    val = [{"step": s, mc.TIME_WALL_S: 30.0 + s, "val/wall_s": 4.0} for s in (0, 2)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [val[0], *train, val[1]]) + "\n")
    assert read_rows(path) == train  # the last row of step 2 (validation, 20 s later) would have slowed its rate


def test_format_outcomes_reports_each_error_and_the_worst() -> None:
    outcomes = [
        Outcome(Case("B64_n4_K2", 64, 4, 2, 64), 1.25, 0.05, _sim(1.4, 0.02), _sim(1.2)),  # +12.0%, pipeline -4.0%
        Outcome(Case("B32_n4_K0_c32", 32, 4, 0, 32), 2.0, 0.4, _sim(1.7, 0.45), _sim(2.1)),  # -15.0%, +5.0%
    ]
    lines = format_outcomes(outcomes).splitlines()
    assert lines[2] == "| B64_n4_K2 | 64 | 4 | 2 | 64 | 1.250 | 1.400 | +12.0% | 0.05 / 0.02 | -4.0% |"
    assert lines[3] == "| B32_n4_K0_c32 | 32 | 4 | 0 | 32 | 2.000 | 1.700 | -15.0% | 0.40 / 0.45 | +5.0% |"
    assert "worst |error| 15.0% (target 15%)" in lines
