"""Tests for the metrics sinks: JSON-lines round trip, backend selection, optional packages, console volume."""

from __future__ import annotations

import io
import json
import logging
import math
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from async_rl.runtime.metrics import ConsoleSink, MetricsLogger, format_line, read_metrics

METRICS_LOGGER = "async_rl.runtime.metrics"
KEY = "learner/actor/loss"  # any key of the metric catalog: others are warned about


def _strict_loads(line: str) -> Any:
    """json.loads that rejects the non-standard NaN/Infinity tokens Python would otherwise accept."""

    def reject(token: str) -> None:
        raise AssertionError(f"non-standard JSON token {token}")

    return json.loads(line, parse_constant=reject)


def _make(tmp_path: Path, backends: list[str], total_steps: int = 10, **kw: Any) -> MetricsLogger:
    return MetricsLogger(tmp_path, backends, project="p", experiment="e", total_steps=total_steps, **kw)


def test_jsonl_round_trip_with_non_finite_values(tmp_path: Path) -> None:
    with _make(tmp_path, ["jsonl"]) as ml:
        ml.log(1, {"a": 1.5, "b": float("nan"), "c": float("inf"), "d": -float("inf"), "n": 3, "time/wall_s": 2.0})
        ml.log(2, {"a": -0.25, "time/wall_s": 4.0})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    for line in lines:
        _strict_loads(line)
    assert read_metrics(tmp_path / "metrics.jsonl") == [
        {"step": 1, "a": 1.5, "b": None, "c": None, "d": None, "n": 3, "time/wall_s": 2.0},
        {"step": 2, "a": -0.25, "time/wall_s": 4.0},
    ]


def test_jsonl_line_is_on_disk_before_close(tmp_path: Path) -> None:
    ml = _make(tmp_path, ["jsonl"])
    ml.log(7, {KEY: 1.0})
    # Not closed: a crash now must still leave the line readable.
    assert read_metrics(tmp_path / "metrics.jsonl")[0][KEY] == 1.0
    ml.close()


def test_jsonl_appends_across_loggers(tmp_path: Path) -> None:
    with _make(tmp_path, ["jsonl"]) as ml:
        ml.log(1, {KEY: 1.0})
    with _make(tmp_path, ["jsonl"]) as ml:  # a resumed run appends
        ml.log(2, {KEY: 2.0})
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


def test_read_metrics_skips_truncated_last_line_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x": 2.0}\n{"step": 3, "x"')
    with caplog.at_level(logging.WARNING, logger=METRICS_LOGGER):
        assert [r["step"] for r in read_metrics(path)] == [1, 2]
    assert "truncated" in caplog.text
    path.write_text('{"step": 1}\n{"step": 2,\n{"step": 3}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_metrics(path)


def test_time_wall_is_added_only_when_missing(tmp_path: Path) -> None:
    with _make(tmp_path, ["jsonl"]) as ml:
        ml.log(1, {KEY: 1.0})
        ml.log(2, {KEY: 1.0, "time/wall_s": 123.0})
    first, second = read_metrics(tmp_path / "metrics.jsonl")
    assert isinstance(first["time/wall_s"], float) and 0.0 <= first["time/wall_s"] < 60.0
    assert second["time/wall_s"] == 123.0


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=12).filter(lambda k: k not in ("step", "time/wall_s")),
        st.floats(allow_nan=True, allow_infinity=True),
        max_size=6,
    )
)
def test_jsonl_round_trip_property(metrics: dict[str, float]) -> None:
    with tempfile.TemporaryDirectory() as d:
        with _make(Path(d), ["jsonl"]) as ml:
            ml.log(3, {**metrics, "time/wall_s": 1.0})
        raw = (Path(d) / "metrics.jsonl").read_text()
        _strict_loads(raw)
        (record,) = read_metrics(Path(d) / "metrics.jsonl")
    assert record.pop("step") == 3
    assert record.pop("time/wall_s") == 1.0
    assert record == {k: (v if math.isfinite(v) else None) for k, v in metrics.items()}


def test_unknown_backend_is_rejected_with_allowed_values(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'mlflow'.*allowed: console, jsonl, tensorboard, wandb"):
        _make(tmp_path, ["jsonl", "mlflow"])
    with pytest.raises(ValueError, match="list"):
        _make(tmp_path, "jsonl")  # type: ignore[arg-type]


def test_bad_metric_value_and_step_are_value_errors(tmp_path: Path) -> None:
    with _make(tmp_path, ["jsonl"]) as ml:
        with pytest.raises(ValueError, match="'learner/x'"):
            ml.log(1, {"learner/x": "high"})  # type: ignore[dict-item]
        with pytest.raises(ValueError, match="step"):
            ml.log(-1, {KEY: 1.0})
    with pytest.raises(RuntimeError, match="after close"):
        ml.log(2, {KEY: 1.0})
    ml.close()  # idempotent


def test_missing_wandb_warns_and_run_continues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with caplog.at_level(logging.WARNING, logger=METRICS_LOGGER):
        with _make(tmp_path, ["wandb", "jsonl"]) as ml:
            ml.log(1, {KEY: 1.0})
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "'wandb'" in warnings[0].getMessage()
    assert ml.active_backends == ["jsonl"]
    assert read_metrics(tmp_path / "metrics.jsonl")[0][KEY] == 1.0


class _FakeRun:
    def __init__(self, fail: bool = False) -> None:
        self.logged: list[tuple[dict[str, float], int]] = []
        self.finished = False
        self.fail = fail

    def log(self, data: dict[str, float], step: int) -> None:
        if self.fail:
            raise ConnectionError("wandb server unreachable")
        self.logged.append((data, step))

    def finish(self) -> None:
        self.finished = True


def _fake_wandb(run: _FakeRun, init_calls: list[dict[str, Any]]) -> types.ModuleType:
    module = types.ModuleType("wandb")

    def init(**kwargs: Any) -> _FakeRun:
        init_calls.append(kwargs)
        return run

    module.init = init  # type: ignore[attr-defined]
    return module


def test_wandb_backend_with_package_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run, calls = _FakeRun(), []
    monkeypatch.setitem(sys.modules, "wandb", _fake_wandb(run, calls))
    with MetricsLogger(tmp_path, ["wandb"], project="proj", experiment="exp", total_steps=5, config={"lr": 1e-6}) as ml:
        ml.log(4, {"learner/actor/pg_loss": 0.5, "time/wall_s": 9.0})
    assert calls == [{"project": "proj", "name": "exp", "config": {"lr": 1e-6}, "dir": str(tmp_path)}]
    assert run.logged == [({"learner/actor/pg_loss": 0.5, "time/wall_s": 9.0}, 4)]
    assert run.finished


def test_failing_optional_backend_is_disabled_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", _fake_wandb(_FakeRun(fail=True), []))
    with caplog.at_level(logging.ERROR, logger=METRICS_LOGGER):
        with _make(tmp_path, ["wandb", "jsonl"]) as ml:
            ml.log(1, {KEY: 1.0})
            ml.log(2, {KEY: 2.0})
            assert ml.active_backends == ["jsonl"]
    assert sum("disabling" in r.getMessage() for r in caplog.records) == 1  # reported once, at step 1
    assert [r[KEY] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1.0, 2.0]


def test_tensorboard_writes_readable_event_file(tmp_path: Path) -> None:
    with _make(tmp_path, ["tensorboard"]) as ml:
        for step in (1, 2, 3):
            ml.log(step, {"learner/batch/reward_mean": 0.5 * step, "time/wall_s": float(step)})
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    scalars = acc.Scalars("learner/batch/reward_mean")
    # 0.5 * step for steps 1..3
    assert [(s.step, s.value) for s in scalars] == [(1, 0.5), (2, 1.0), (3, 1.5)]


def test_tensorboard_import_failure_warns_and_continues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with caplog.at_level(logging.WARNING, logger=METRICS_LOGGER):
        with _make(tmp_path, ["tensorboard", "jsonl"]) as ml:
            ml.log(1, {KEY: 1.0})
    assert ml.active_backends == ["jsonl"]
    assert "tensorboard backend disabled" in caplog.text
    assert not (tmp_path / "tensorboard").exists()


def _step_metrics(step: int) -> dict[str, float]:
    return {
        "learner/batch/reward_mean": step / 100,
        "learner/perf/tokens_per_s": 1000.0,
        "learner/staleness/mean": 0.5,
        "sync/seconds": 0.25,
    }


def test_console_non_tty_logs_about_every_tenth_of_the_run(caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()  # isatty() is False, like a CI log
    sink = ConsoleSink(100, stream=stream)
    with caplog.at_level(logging.INFO, logger=METRICS_LOGGER):
        for step in range(1, 101):
            sink.log(step, _step_metrics(step))
    sink.close()
    lines = [r.getMessage() for r in caplog.records]
    # interval ceil(100 / 10) = 10: the first step, then steps 10, 20, ..., 100 -> 1 + 10 = 11 lines
    assert [int(line.split()[1].split("/")[0]) for line in lines] == [1, *range(10, 101, 10)]
    assert stream.getvalue() == ""  # no progress bar when not a terminal
    assert "reward 0.500" in lines[5]  # step 50: 50 / 100


def test_console_logs_every_validation_round_on_its_own_line(caplog: pytest.LogCaptureFixture) -> None:
    sink = ConsoleSink(100, stream=io.StringIO())
    val = {"val/version": 3.0, "val/reward_mean": 0.875, "val/arith/reward_mean": 0.875, "val/num_samples": 8.0,
           "val/wall_s": 3.25}  # fmt: skip
    with caplog.at_level(logging.INFO, logger=METRICS_LOGGER):
        sink.log(1, _step_metrics(1))
        sink.log(3, val)  # logged although step 3 is not due for a progress line
        sink.log(4, _step_metrics(4))  # not due: steps 1, 10, 20, ... are
    sink.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[1] == "validation at step 3: reward 0.875 | arith 0.875 | 8 samples | 3.2s"


def test_console_tty_draws_a_bar_and_logs_sparsely(caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    sink = ConsoleSink(20, stream=stream, is_tty=True, log_every=5)
    with caplog.at_level(logging.INFO, logger=METRICS_LOGGER):
        for step in range(1, 21):
            sink.log(step, _step_metrics(step))
    sink.close()
    out = stream.getvalue()
    assert "20/20" in out and "reward=0.200" in out  # last step: 20 / 100
    # first step, then 5, 10, 15, 20 -> 5 lines
    assert len(caplog.records) == 5


def test_console_via_logger_and_bad_totals(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=METRICS_LOGGER):
        with _make(tmp_path, ["console"], total_steps=3, console_stream=io.StringIO()) as ml:
            for step in (1, 2, 3):
                ml.log(step, _step_metrics(step))
    # interval ceil(3 / 10) = 1: every step is logged
    assert len(caplog.records) == 3
    with pytest.raises(ValueError, match="total_steps"):
        ConsoleSink(0, stream=io.StringIO())
    with pytest.raises(ValueError, match="log_every"):
        ConsoleSink(10, stream=io.StringIO(), log_every=0)


def test_format_line_keeps_zero_values_and_skips_missing_keys() -> None:
    line = format_line(5, 20, {"learner/batch/reward_mean": 0.0, "sync/seconds": 1.234, "x": float("nan")})
    # 5 / 20 = 25%
    assert line == "step 5/20 (25%) | reward 0.000 | sync 1.23s"


def test_actor_activity_rates_over_windows_where_reports_moved() -> None:
    from async_rl.runtime.metrics import ActorActivity

    activity = ActorActivity()
    assert activity({"learner/x": 1.0}) == {}  # no actor totals logged (e.g. a coordinator without actors)

    def totals(tokens: float, idle: float, uptime: float, alive: int = 2) -> dict[str, float]:
        return {
            "transport/actors/generated_tokens_total": tokens,
            "transport/actors/idle_s_total": idle,
            "transport/actors/uptime_s_total": uptime,
            "transport/actors_alive": alive,
        }

    # 2 actors, 4 actor-seconds, 1 of them idle, 800 tokens: idle 0.25; 200 tok per actor-second x 2 actors = 400/s
    assert activity(totals(800, 1, 4)) == pytest.approx({"actor/idle_fraction": 0.25, "actor/gen_tokens_per_s": 400})
    assert activity(totals(800, 1, 4)) == {}  # no new report since the last step: nothing to say
    # the window since the last change: +2 actor-seconds, +2 idle, +0 tokens
    assert activity(totals(800, 3, 6)) == pytest.approx({"actor/idle_fraction": 1.0, "actor/gen_tokens_per_s": 0.0})


def test_a_key_missing_from_the_catalog_is_warned_about_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=METRICS_LOGGER):
        with _make(tmp_path, ["jsonl"]) as ml:
            ml.log(1, {KEY: 1.0, "learner/not_a_metric": 2.0, "rollout/finish/stop": 0.5})
            ml.log(2, {KEY: 1.0, "learner/not_a_metric": 2.0, "rollout/finish/abort": 0.5})
            ml.log(0, {"val/version": 0.0, "val/arith/reward_mean": 0.5, "rollout/reward_mean": 0.5})
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # once per key; a validation record may only hold val/ keys (and time/wall_s)
    assert len(warned) == 2
    assert "'learner/not_a_metric'" in warned[0] and "'rollout/reward_mean'" in warned[1]
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["learner/not_a_metric"] == 2.0  # still logged
