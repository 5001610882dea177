"""End-of-run plot and summary from ``metrics.jsonl``: did reward go up, how fast was it, how stale was the data.

``plot_run`` draws one PNG: reward vs step and vs wall-clock time (mean plus any per-component reward keys),
generation and learner throughput, staleness and effective sample size of the off-policy weights, weight-sync time,
the rollout queue, idle fractions, response length, and validation reward (overall and per data source) vs step and
vs wall-clock time; for multi-turn runs also turns, tool calls, tool errors and the template check per step.
Validation rounds are records of their own (they carry ``val/version``, at the step of the version they evaluated);
``by_step`` leaves them out and ``validation_records`` returns them. Keys a run did not log are skipped; a panel with
nothing to show says "no data". ``summarize_run`` gives the numbers the demo prints (first-10% vs last-10% mean
reward, steps, wall time, mean throughput). Each curve reads one key of the metric catalog
(runtime/metric_catalog.py), taken through ``metric_key`` so that a renamed key fails on import.

Drawing uses ``matplotlib.figure.Figure`` with the Agg canvas directly, never pyplot, so importing or calling this
does not change the process-wide matplotlib backend and needs no display.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from async_rl import metric_catalog as mc
from async_rl.runtime.metrics import VAL_VERSION_KEY, WALL_KEY, read_metrics

logger = logging.getLogger(__name__)

__all__ = [
    "by_step",
    "finite_number",
    "format_summary",
    "plot_run",
    "rolling_mean",
    "summarize_run",
    "validation_records",
]

REWARD_KEY = mc.LEARNER_BATCH_REWARD_MEAN
REWARD_KEYS = (REWARD_KEY,)  # the keys a reward curve is read from, first found wins (tuning/sweep_report.py)
GEN_RATE_KEY = mc.ACTOR_GEN_TOKENS_PER_S
LEARNER_RATE_KEY = mc.LEARNER_PERF_TOKENS_PER_S
STALENESS_KEY = mc.LEARNER_STALENESS_MEAN
STALENESS_MAX_KEY = mc.LEARNER_STALENESS_MAX
ESS_KEY = mc.LEARNER_OFFPOLICY_ESS
SYNC_KEY = mc.SYNC_SECONDS
VAL_REWARD_KEY = mc.VAL_REWARD_MEAN
TURNS_KEY = mc.ROLLOUT_NUM_TURNS_MEAN
MAX_COMPONENTS = 8

Series = tuple[list[float], list[float]]


def finite_number(value: Any) -> float | None:
    """``value`` as a float when it is a finite int/float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def by_step(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One training record per step, ordered by step; a step logged twice (a resumed run re-doing it) keeps its last
    record. Validation records are left out (see `validation_records`)."""
    latest: dict[int, dict[str, Any]] = {}
    for record in records:
        step = record.get("step")
        if isinstance(step, int) and not isinstance(step, bool) and VAL_VERSION_KEY not in record:
            latest[step] = record
    return [latest[s] for s in sorted(latest)]


def validation_records(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The validation rounds' records, one per step (the last one of a step logged twice), ordered by step."""
    latest: dict[int, dict[str, Any]] = {}
    for record in records:
        step = record.get("step")
        if isinstance(step, int) and not isinstance(step, bool) and VAL_VERSION_KEY in record:
            latest[step] = record
    return [latest[s] for s in sorted(latest)]


def _series(records: Sequence[dict[str, Any]], key: str, x_key: str = "step") -> Series:
    xs: list[float] = []
    ys: list[float] = []
    for record in records:
        x, y = finite_number(record.get(x_key)), finite_number(record.get(key))
        if x is not None and y is not None:
            xs.append(x)
            ys.append(y)
    return xs, ys


def _component_keys(records: Sequence[dict[str, Any]]) -> list[str]:
    found = {
        k
        for r in records
        for k in r
        if mc.rollout_reward_component_key.matches(k) and finite_number(r.get(k)) is not None
    }
    keys = sorted(found)
    if len(keys) > MAX_COMPONENTS:
        logger.info("plot: %d reward components, drawing the first %d", len(keys), MAX_COMPONENTS)
    return keys[:MAX_COMPONENTS]


def rolling_mean(ys: Sequence[float], window: int) -> list[float]:
    """Mean of the last ``window`` values at each point (fewer at the start)."""
    out: list[float] = []
    total = 0.0
    for i, y in enumerate(ys):
        total += y
        if i >= window:
            total -= ys[i - window]
        out.append(total / min(i + 1, window))
    return out


def _no_data(ax: Any, title: str) -> None:
    ax.set_title(title)
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, fontsize=14, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def _reward_panel(
    ax: Any, records: Sequence[dict[str, Any]], x_key: str, title: str, x_label: str, x_scale: float = 1.0
) -> None:
    main_series = _series(records, REWARD_KEY, x_key)
    components = [(k.split("/")[-1], _series(records, k, x_key)) for k in _component_keys(records)]
    components = [(label, s) for label, s in components if s[0]]
    if not main_series[0] and not components:
        _no_data(ax, title)
        return
    if main_series[0]:
        xs, ys = [x / x_scale for x in main_series[0]], main_series[1]
        window = max(1, len(ys) // 20)
        if window > 1:  # raw values faint, rolling mean bold
            ax.plot(xs, ys, color="tab:blue", alpha=0.3, linewidth=1)
            label = f"{REWARD_KEY} (mean of {window})"
            ax.plot(xs, rolling_mean(ys, window), color="tab:blue", linewidth=2, label=label)
        else:
            ax.plot(xs, ys, color="tab:blue", linewidth=2, label=REWARD_KEY)
    for label, (xs, ys) in components:
        ax.plot([x / x_scale for x in xs], ys, linewidth=1, label=label)
    ax.set_title(title)
    ax.set_xlabel(x_label)
    ax.set_ylabel("reward")
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)


def _lines_panel(ax: Any, title: str, ylabel: str, series: Sequence[tuple[str, Series]]) -> None:
    drawn = [(label, s) for label, s in series if s[0]]
    if not drawn:
        _no_data(ax, title)
        return
    for label, (xs, ys) in drawn:
        ax.plot(xs, ys, linewidth=1.2, label=label)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)


def _staleness_panel(ax: Any, records: Sequence[dict[str, Any]]) -> None:
    title = "staleness and off-policy ESS"
    stale = [
        ("staleness mean", _series(records, STALENESS_KEY)),
        ("staleness max", _series(records, STALENESS_MAX_KEY)),
    ]
    ess = _series(records, ESS_KEY)
    if not any(s[0] for _, s in stale):
        _lines_panel(ax, title, "ESS fraction", [("ESS", ess)])  # "no data" when ESS is missing too
        return
    _lines_panel(ax, title, "policy versions behind", stale)
    if ess[0]:
        twin = ax.twinx()
        twin.plot(ess[0], ess[1], color="tab:green", linewidth=1.2, linestyle="--", label="ESS (right)")
        twin.set_ylim(0.0, 1.05)
        twin.set_ylabel("ESS fraction")
        twin.legend(fontsize=7, loc="lower right")


def _validation_panel(
    ax: Any, records: Sequence[dict[str, Any]], x_key: str, title: str, x_label: str, x_scale: float = 1.0
) -> None:
    """Validation reward (overall, and per data source when there are several) against ``x_key``, with the reward
    components validation reports (``val/<source>/<name>_mean``: e.g. ``acc``, the guessing game's ``solved``)."""
    per_source = {k for r in records for k in r if mc.val_source_component_mean_key.matches(k)}
    sources = sorted(k for k in per_source if mc.val_source_reward_mean_key.matches(k))
    components = sorted(per_source - set(sources))
    series = [(VAL_REWARD_KEY, _series(records, VAL_REWARD_KEY, x_key))]
    if len(sources) > 1:
        series += [(k, _series(records, k, x_key)) for k in sources[:MAX_COMPONENTS]]
    series += [(k, _series(records, k, x_key)) for k in components[:MAX_COMPONENTS]]
    drawn = [(label, s) for label, s in series if s[0]]
    if not drawn:
        _no_data(ax, title)
        return
    for i, (label, (xs, ys)) in enumerate(drawn):
        ax.plot([x / x_scale for x in xs], ys, marker="o", linewidth=2 if i == 0 else 1, label=label)
    ax.set_title(title)
    ax.set_xlabel(x_label)
    ax.set_ylabel("validation reward")
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)


def _wall_scale(records: Sequence[dict[str, Any]]) -> tuple[float, str]:
    longest = max((t for r in records if (t := finite_number(r.get(WALL_KEY))) is not None), default=0.0)
    if longest > 3 * 3600:
        return 3600.0, "hours"
    if longest > 300:
        return 60.0, "minutes"
    return 1.0, "seconds"


def _episode_panels(axes: Any, records: Sequence[dict[str, Any]]) -> None:
    """Multi-turn runs: turns and tool calls per episode; errors and template checks per step."""
    _lines_panel(
        axes[0],
        "episodes: turns and tool calls",
        "per episode",
        [
            ("model turns", _series(records, TURNS_KEY)),
            ("tool calls", _series(records, mc.ROLLOUT_TOOL_CALLS_MEAN)),
        ],
    )
    _lines_panel(
        axes[1],
        "episodes: errors and template checks",
        "episodes (tool calls) per step",
        [
            ("failed tool calls", _series(records, mc.ROLLOUT_TOOL_ERRORS)),
            ("template mismatches", _series(records, mc.ROLLOUT_TEMPLATE_MISMATCHES)),
            ("re-tokenization drift", _series(records, mc.ROLLOUT_RETOKENIZATION_DRIFT)),
        ],
    )


def _policy_panels(axes: Any, records: Sequence[dict[str, Any]]) -> None:
    """What a collapse shows first: the policy's entropy, and how far each step moved it."""
    _lines_panel(
        axes[0],
        "policy entropy and gradient norm",
        "nats per token / norm",
        [
            ("entropy on the trained tokens", _series(records, mc.LEARNER_ACTOR_ENTROPY)),
            ("gradient norm (before clipping)", _series(records, mc.LEARNER_ACTOR_GRAD_NORM)),
        ],
    )
    _lines_panel(
        axes[1],
        "step size (actor.step_kl_freq) and signal",
        "nats per token / share",
        [
            ("KL(before || after the step)", _series(records, mc.LEARNER_ACTOR_STEP_KL)),
            ("mean |log-ratio| after / before the step", _series(records, mc.LEARNER_ACTOR_STEP_ABS_LOG_RATIO)),
            ("share of zero-advantage groups", _series(records, mc.LEARNER_BATCH_ZERO_ADVANTAGE_SHARE)),
        ],
    )


def plot_run(metrics_jsonl: Path, out_png: Path) -> Path:
    """Draw the run's curves from ``metrics_jsonl`` into ``out_png`` (parents created) and return ``out_png``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    raw = read_metrics(metrics_jsonl)
    records = by_step(raw)
    val = validation_records(raw)
    episodes = any(TURNS_KEY in r for r in records)  # a multi-turn run: one more row
    fig = Figure(figsize=(14, 27 if episodes else 23), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(7 if episodes else 6, 2)

    _reward_panel(axes[0][0], records, "step", "reward vs step", "step")
    scale, unit = _wall_scale(records)
    _reward_panel(axes[0][1], records, WALL_KEY, "reward vs wall-clock time", f"wall-clock time ({unit})", scale)

    throughput = [("generation", _series(records, GEN_RATE_KEY)), ("learner", _series(records, LEARNER_RATE_KEY))]
    _lines_panel(axes[1][0], "throughput", "tokens / s", throughput)
    _staleness_panel(axes[1][1], records)
    _lines_panel(
        axes[2][0],
        "weight sync",
        "seconds",
        [("sync time", _series(records, SYNC_KEY))],
    )
    _lines_panel(
        axes[2][1],
        "rollout transport",
        "groups",
        [
            ("queue depth", _series(records, mc.TRANSPORT_QUEUE_DEPTH)),
            ("dropped as stale (cumulative)", _series(records, mc.TRANSPORT_DROPS_STALE)),
        ],
    )
    _lines_panel(
        axes[3][0],
        "idle fractions (waiting for work)",
        "fraction of time",
        [
            ("learner (waiting for groups or a validation round)", _series(records, mc.LEARNER_IDLE_FRACTION)),
            ("actors (nothing to generate)", _series(records, mc.ACTOR_IDLE_FRACTION)),
        ],
    )
    _lines_panel(
        axes[3][1],
        "response length",
        "tokens",
        [
            ("mean response length", _series(records, mc.LEARNER_BATCH_RESPONSE_LENGTH_MEAN)),
            ("of which sampled (trained)", _series(records, mc.LEARNER_BATCH_SAMPLED_LENGTH_MEAN)),
        ],
    )
    _validation_panel(axes[4][0], val, "step", "validation reward vs step (policy version)", "step")
    val_scale, val_unit = _wall_scale(val)
    _validation_panel(
        axes[4][1], val, WALL_KEY, "validation reward vs wall-clock time", f"wall-clock time ({val_unit})", val_scale
    )
    _policy_panels(axes[5], records)
    if episodes:
        _episode_panels(axes[6], records)
    last = records[-1]["step"] if records else 0
    fig.suptitle(f"{Path(metrics_jsonl).parent.name or 'run'}: {len(records)} steps logged (last step {last})")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, format="png")
    logger.info("plot: wrote %s", out_png)
    return out_png


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize_run(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Headline numbers of a run (``None`` where the run did not log the key).

    ``reward_first_mean`` / ``reward_last_mean`` average the first / last ``ceil(10%)`` of the steps that logged a
    reward (at least one step each); ``reward_delta`` is last minus first. ``wall_time_s`` is the largest
    ``time/wall_s`` logged. A step logged twice counts once (its last record).
    """
    rows = by_step(records)
    rewards = _series(rows, REWARD_KEY)[1]
    window = max(1, math.ceil(0.1 * len(rewards))) if rewards else 0
    first = _mean(rewards[:window])
    last = _mean(rewards[-window:]) if rewards else None
    walls = [t for r in rows if (t := finite_number(r.get(WALL_KEY))) is not None]
    return {
        "steps": len(rows),
        "last_step": rows[-1]["step"] if rows else None,
        "wall_time_s": max(walls) if walls else None,
        "reward_key": REWARD_KEY if rewards else None,
        "reward_window": window,
        "reward_first_mean": first,
        "reward_last_mean": last,
        "reward_delta": last - first if first is not None and last is not None else None,
        "learner_tokens_per_s_mean": _mean(_series(rows, LEARNER_RATE_KEY)[1]),
        "gen_tokens_per_s_mean": _mean(_series(rows, GEN_RATE_KEY)[1]),
        "staleness_mean": _mean(_series(rows, STALENESS_KEY)[1]),
    }


def format_summary(summary: dict[str, Any]) -> str:
    """A few human-readable lines of :func:`summarize_run` output, for the demo to print."""

    def f(value: Any, fmt: str) -> str:
        return "n/a" if value is None else fmt.format(value)

    window = summary.get("reward_window") or 0
    return "\n".join(
        [
            f"steps logged: {summary.get('steps', 0)} (last step {f(summary.get('last_step'), '{}')}), "
            f"wall time {f(summary.get('wall_time_s'), '{:.1f}')} s",
            f"reward: first {window} steps {f(summary.get('reward_first_mean'), '{:.4f}')} -> last {window} steps "
            f"{f(summary.get('reward_last_mean'), '{:.4f}')} (delta {f(summary.get('reward_delta'), '{:+.4f}')})",
            f"throughput: generation {f(summary.get('gen_tokens_per_s_mean'), '{:.1f}')} tok/s, "
            f"learner {f(summary.get('learner_tokens_per_s_mean'), '{:.1f}')} tok/s; "
            f"mean staleness {f(summary.get('staleness_mean'), '{:.2f}')}",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m async_rl.runtime.plot RUN_DIR [OUT.png]``: draw a run's plot and print its summary."""
    import argparse

    parser = argparse.ArgumentParser(description="Plot a run from its metrics.jsonl and print a summary.")
    parser.add_argument("run_dir", type=Path, help="run directory (holds metrics.jsonl)")
    parser.add_argument("out", type=Path, nargs="?", help="output PNG [RUN_DIR/reward.png]")
    args = parser.parse_args(argv)
    metrics = args.run_dir / "metrics.jsonl"
    if not metrics.exists():
        parser.error(f"{metrics} does not exist")
    out = plot_run(metrics, args.out or args.run_dir / "reward.png")
    print(format_summary(summarize_run(read_metrics(metrics))))
    for rec in validation_records(read_metrics(metrics)):
        print(f"validation at step {rec['step']}: reward {rec.get(VAL_REWARD_KEY, float('nan')):.3f}")
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
