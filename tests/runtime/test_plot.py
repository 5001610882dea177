"""Tests for the end-of-run plot (valid PNG with full and sparse metrics) and the run summary numbers."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest

import async_rl.runtime.plot as plot_mod
from async_rl.metric_catalog import record_kind, unknown_keys
from async_rl.runtime.plot import by_step, format_summary, plot_run, summarize_run, validation_records

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _full_record(step: int) -> dict[str, Any]:
    return {
        "step": step,
        "time/wall_s": 2.5 * step,
        "learner/batch/reward_mean": 1.0 - math.exp(-step / 30),
        "rollout/reward/format": 0.5 + 0.1 * math.sin(step / 5),
        "rollout/reward/correct": 0.3 + step / 400,
        "learner/perf/tokens_per_s": 2000.0 + 50 * math.cos(step),
        "actor/gen_tokens_per_s": 600.0 + 10 * math.sin(step),
        "learner/staleness/mean": 0.5 + 0.3 * math.sin(step),
        "learner/staleness/max": 2.0,
        "learner/offpolicy/ess": 0.9 + 0.05 * math.cos(step / 3),
        "sync/seconds": 0.4,
        "transport/queue_depth": float(step % 7),
        "transport/drops/stale": float(step // 10),
        "learner/idle_fraction": 0.1,
        "actor/idle_fraction": 0.3,
        "learner/batch/response_length_mean": 6.0,
        "learner/actor/entropy": 0.8 - step / 200,
        "learner/actor/grad_norm": 1.5,
        "learner/actor/step_kl": 0.01 + 0.005 * math.sin(step),
        "learner/batch/zero_advantage_share": 0.25,
        "learner/actor/pg_loss": None,  # a NaN written as null
    }


def _val_record(version: int) -> dict[str, Any]:
    return {
        "step": version,
        "time/wall_s": 2.5 * version + 1.0,
        "val/version": float(version),
        "val/reward_mean": 0.2 + version / 200,
        "val/arith/reward_mean": 0.2 + version / 200,
        "val/gsm8k/reward_mean": 0.1 + version / 300,
        "val/num_samples": 8.0,
    }


def test_plot_run_full_metrics_writes_png(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = [_full_record(s) for s in range(1, 121)]
    for v in range(0, 121, 20):  # validation rounds: their own records, at the step of the version they evaluated
        records.insert(v, _val_record(v))
    src = _write(tmp_path / "metrics.jsonl", records)
    empty_panels: list[str] = []
    real_no_data = plot_mod._no_data
    monkeypatch.setattr(plot_mod, "_no_data", lambda ax, title: (empty_panels.append(title), real_no_data(ax, title)))
    out = plot_run(src, tmp_path / "plots" / "run.png")
    assert out == tmp_path / "plots" / "run.png"
    assert _png_size(out) == (1400, 2300)  # figsize 14 x 23 inches at 100 dpi
    assert out.stat().st_size > 10_000
    assert empty_panels == []  # every panel, the two validation panels included, has data


def test_validation_records_are_kept_apart_from_training_steps() -> None:
    records = [_full_record(1), _val_record(0), _full_record(2), _val_record(2), _full_record(3)]
    assert [r["step"] for r in by_step(records)] == [1, 2, 3]
    assert by_step(records)[1] == _full_record(2)  # the step-2 validation record did not replace the training one
    assert [r["step"] for r in validation_records(records)] == [0, 2]
    assert summarize_run(records)["steps"] == 3


def test_plot_run_with_most_keys_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = [{"step": s, "learner/batch/reward_mean": s / 10} for s in range(1, 11)]
    src = _write(tmp_path / "metrics.jsonl", records)
    empty_panels: list[str] = []
    real_no_data = plot_mod._no_data
    monkeypatch.setattr(plot_mod, "_no_data", lambda ax, title: (empty_panels.append(title), real_no_data(ax, title)))
    out = plot_run(src, tmp_path / "run.png")
    assert out.read_bytes()[:8] == PNG_MAGIC and out.stat().st_size > 10_000
    # Only reward vs step has data; no time/wall_s, so the wall-clock panel is empty too.
    assert sorted(empty_panels) == sorted(
        [
            "reward vs wall-clock time",
            "throughput",
            "staleness and off-policy ESS",
            "weight sync",
            "rollout transport",
            "idle fractions (waiting for work)",
            "response length",
            "policy entropy and gradient norm",
            "step size (actor.step_kl_freq) and signal",
            "validation reward vs step (policy version)",
            "validation reward vs wall-clock time",
        ]
    )


def test_plot_run_with_no_records(tmp_path: Path) -> None:
    src = tmp_path / "metrics.jsonl"
    src.write_text("")
    out = plot_run(src, tmp_path / "run.png")
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_summarize_run_hand_checked() -> None:
    records = [{"step": 5, "learner/batch/reward_mean": 999.0}]  # superseded by the re-run of step 5 below
    for i in range(1, 21):
        records.append(
            {
                "step": i,
                "time/wall_s": 3.0 * i,
                "learner/batch/reward_mean": 0.5 * i,
                "learner/perf/tokens_per_s": 100.0 if i % 2 else 200.0,
                "actor/gen_tokens_per_s": 300.0 if i % 4 else 400.0,
                "learner/staleness/mean": 1.0 if i <= 10 else 0.0,
            }
        )
    s = summarize_run(records)
    assert s["steps"] == 20 and s["last_step"] == 20
    assert s["wall_time_s"] == 60.0  # 3 s * step 20
    assert s["reward_key"] == "learner/batch/reward_mean"
    assert s["reward_window"] == 2  # ceil(10% of 20)
    assert s["reward_first_mean"] == pytest.approx(0.75)  # (0.5 + 1.0) / 2
    assert s["reward_last_mean"] == pytest.approx(9.75)  # (9.5 + 10.0) / 2
    assert s["reward_delta"] == pytest.approx(9.0)  # 9.75 - 0.75
    assert s["learner_tokens_per_s_mean"] == pytest.approx(150.0)  # ten 100s and ten 200s
    assert s["gen_tokens_per_s_mean"] == pytest.approx(325.0)  # fifteen 300s and five 400s
    assert s["staleness_mean"] == pytest.approx(0.5)  # ten 1.0s and ten 0.0s


def test_summarize_run_small_and_missing() -> None:
    # 5 rewards: window ceil(0.5) = 1 -> first 2.0, last 4.0 (nulls are ignored)
    rows = [{"step": i, "learner/batch/reward_mean": r} for i, r in enumerate([2.0, None, 3.0, 5.0, 4.0, 3.5], start=1)]
    s = summarize_run(rows)
    assert (s["reward_window"], s["reward_first_mean"], s["reward_last_mean"]) == (1, 2.0, 3.5)
    assert s["reward_delta"] == pytest.approx(1.5)  # 3.5 - 2.0
    assert s["wall_time_s"] is None and s["gen_tokens_per_s_mean"] is None

    empty = summarize_run([])
    assert empty["steps"] == 0 and empty["reward_delta"] is None
    text = format_summary(empty)
    assert "n/a" in text and len(text.splitlines()) == 3


def test_every_record_of_the_plot_tests_uses_catalog_keys() -> None:
    records = [_full_record(1), _val_record(0)]
    assert [unknown_keys(r, record_kind(r)) for r in records] == [[], []]


def test_format_summary_shows_the_numbers() -> None:
    summary = {
        "steps": 20,
        "last_step": 20,
        "wall_time_s": 60.0,
        "reward_window": 2,
        "reward_first_mean": 0.75,
        "reward_last_mean": 9.75,
        "reward_delta": 9.0,
        "gen_tokens_per_s_mean": None,
        "learner_tokens_per_s_mean": 150.0,
        "staleness_mean": 0.5,
    }
    text = format_summary(summary)
    assert "0.7500 -> last 2 steps 9.7500 (delta +9.0000)" in text
    assert "learner 150.0 tok/s" in text and "generation n/a" in text


def test_multi_turn_runs_get_the_episode_panels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    episode = {
        "rollout/num_turns_mean": 2.5,
        "rollout/tool_calls_mean": 1.2,
        "rollout/tool_errors": 3.0,
        "rollout/template_mismatches": 0.0,
        "rollout/retokenization_drift": 2.0,
        "learner/batch/sampled_length_mean": 4.0,
    }
    records = [{**_full_record(s), **episode} for s in range(1, 21)]
    src = _write(tmp_path / "metrics.jsonl", records)
    titles: list[str] = []
    real_lines = plot_mod._lines_panel
    monkeypatch.setattr(
        plot_mod, "_lines_panel", lambda ax, title, *a: (titles.append(title), real_lines(ax, title, *a))
    )
    out = plot_run(src, tmp_path / "run.png")
    assert _png_size(out) == (1400, 2700)  # one more row
    assert "episodes: turns and tool calls" in titles and "episodes: errors and template checks" in titles
    assert not unknown_keys(records[0], record_kind(records[0]))


def test_the_validation_panel_draws_reward_components() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [
        {
            "step": v,
            "val/reward_mean": 0.3 + v / 100,
            "val/guessing/reward_mean": 0.3 + v / 100,
            "val/guessing/solved_mean": 0.25 + v / 50,
        }
        for v in (0, 5, 10)
    ]
    fig, ax = plt.subplots()
    plot_mod._validation_panel(ax, records, "step", "validation", "step")
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    plt.close(fig)
    # One source: its reward is the overall one (not drawn twice); its solved rate is drawn beside it.
    assert lines == {"val/reward_mean": [0.3, 0.35, 0.4], "val/guessing/solved_mean": [0.25, 0.35, 0.45]}
