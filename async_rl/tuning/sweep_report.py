"""The staleness sweep's table and plots, read back from each run's ``metrics.jsonl``.

One row per run (``sweep.csv`` and ``sweep.md``): K, correction, seed, status, steps logged, the job's wall-clock,
reward over the first and last 10% of steps and at the last step, the last validation round's reward and its step,
steady-state throughput, and the off-policy picture: mean effective sample size of the importance weights, mean and
largest staleness, mean version span (policy updates a completion saw while it was generated) and the groups the
coordinator dropped as too stale.

One row per (K, correction) cell (``sweep_cells.csv`` and ``sweep_cells.md``): how many of its runs finished, and the
mean, lowest and highest of the main columns over them (its seeds, with ``--seeds``). A run that failed or did not
finish counts in ``runs`` only. Over the same finished runs, a cell also gets:

- ``val_reward_last_ci95``: the half-width of a 95% confidence interval of ``val_reward_last_mean`` (the mean of each
  run's last held-out validation reward), from Student's t: t(0.975, n - 1) x sample standard deviation / sqrt(n), n =
  the runs that logged a validation round; none for n = 1. The t quantiles are tabulated for n - 1 = 1..30; above
  that the normal quantile 1.96 is used (a few per cent narrower than t there).
- ``staleness_max_max``: the largest staleness any of its runs trained on (the staleness a cell really reached, next
  to ``staleness_mean_mean``, the mean over runs of each run's mean staleness).
- ``val_reward_last_vs_k0``: ``val_reward_last_mean`` minus that of the K = 0 cell with the same correction setting,
  and a ``verdict``: ``holds`` when that difference is at least -tolerance, ``falls`` when it is lower, where the
  tolerance is the project's target (:data:`HOLD_TOLERANCE` for K <= :data:`HOLD_TOLERANCE_MAX_K`,
  :data:`HOLD_TOLERANCE_LARGE_K` above); ``baseline`` for the K = 0 cells; ``no baseline`` when the K = 0 cell of
  that correction setting has no finished run with a validation round; none for a cell without one itself.

Throughput is measured between the first and the last logged step (``time/wall_s``), so actor start-up does not count:
``steps_per_s`` = steps / seconds, ``tokens_per_s`` = trained tokens (prompt + response, from the learner's per-step
``tokens_per_s x step_time_s``) / seconds. The job's own wall-clock, start-up included, is the ``wall_clock_s`` column.

Plots (one PNG each, one line per run, colour = K, solid = correction on, dashed = off): reward against step and
against wall-clock (rolling mean), throughput (bars), ESS, staleness, version span and dropped groups against step;
and ``sweep_val_bands.png``, the held-out validation reward against step with one line per cell instead: the mean over
its finished runs at each validation step, shaded with the same 95% t interval where at least two runs have a value
at that step.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from async_rl import metric_catalog as mc
from async_rl.runtime.metrics import WALL_KEY, read_metrics
from async_rl.runtime.plot import REWARD_KEYS, VAL_REWARD_KEY, validation_records
from async_rl.runtime.plot import by_step as _by_step
from async_rl.runtime.plot import finite_number as _num
from async_rl.runtime.plot import rolling_mean as _rolling_mean
from async_rl.tuning.sweep import RunOutcome, SweepRun

__all__ = [
    "CELL_METRICS",
    "COLUMNS",
    "HOLD_TOLERANCE",
    "HOLD_TOLERANCE_LARGE_K",
    "HOLD_TOLERANCE_MAX_K",
    "cell_band",
    "hold_tolerance",
    "mean_ci95",
    "plot_sweep",
    "summarize_cells",
    "summarize_run",
    "t_quantile_975",
    "verdict",
    "write_cell_table",
    "write_report",
    "write_table",
]

ESS_KEY = mc.LEARNER_OFFPOLICY_ESS
STALENESS_KEYS = (mc.LEARNER_STALENESS_MEAN, mc.ROLLOUT_STALENESS_MEAN)
STALENESS_MAX_KEYS = (mc.LEARNER_STALENESS_MAX, mc.ROLLOUT_STALENESS_MAX)
SPAN_KEY = mc.ROLLOUT_VERSION_SPAN_MEAN
DROP_KEYS = (mc.TRANSPORT_DROPS_TOTAL, mc.TRANSPORT_DROPS_STALE, mc.TRANSPORT_DROPPED_TOTAL)
STEP_TIME_KEY = mc.LEARNER_PERF_STEP_TIME_S
TOKEN_RATE_KEY = mc.LEARNER_PERF_TOKENS_PER_S

# The project's targets for asynchronous training: a cell's mean final held-out reward may fall at most this far below
# the K = 0 cell of the same correction setting, for K <= HOLD_TOLERANCE_MAX_K and for larger K.
HOLD_TOLERANCE = 0.05
HOLD_TOLERANCE_LARGE_K = 0.10
HOLD_TOLERANCE_MAX_K = 8
_ROUNDING = 1e-9  # a difference that lands on -tolerance up to float rounding holds

# Student's t quantile t(0.975, df) for df = 1..30 (index df - 1); the normal quantile above.
_T_975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip
_Z_975 = 1.96

# (column, markdown header, format) in table order.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("K", "K", "{}"),
    ("correction", "correction", "{}"),
    ("seed", "seed", "{}"),
    ("status", "status", "{}"),
    ("steps", "steps", "{}"),
    ("wall_clock_s", "wall-clock s", "{:.0f}"),
    ("reward_first10", "reward first 10%", "{:.3f}"),
    ("reward_last10", "reward last 10%", "{:.3f}"),
    ("reward_final", "final reward", "{:.3f}"),
    ("val_reward_last", "last validation reward", "{:.3f}"),
    ("val_step_last", "at step", "{}"),
    ("steps_per_s", "steps/s", "{:.3f}"),
    ("tokens_per_s", "trained tok/s", "{:.0f}"),
    ("ess_mean", "mean ESS", "{:.3f}"),
    ("staleness_mean", "mean staleness", "{:.2f}"),
    ("staleness_max", "max staleness", "{:.0f}"),
    ("version_span_mean", "mean version span", "{:.3f}"),
    ("dropped_groups", "dropped groups", "{:.0f}"),
    ("log", "log", "{}"),
)


# (column of COLUMNS, format) averaged per cell in sweep_cells.*, in table order.
CELL_METRICS: tuple[tuple[str, str], ...] = (
    ("wall_clock_s", "{:.0f}"),
    ("reward_last10", "{:.3f}"),
    ("reward_final", "{:.3f}"),
    ("val_reward_last", "{:.3f}"),
    ("tokens_per_s", "{:.0f}"),
    ("ess_mean", "{:.3f}"),
    ("staleness_mean", "{:.2f}"),
)

# Cell columns after those of CELL_METRICS: (column, markdown header) in table order.
CELL_EXTRA_COLUMNS: tuple[tuple[str, str], ...] = (
    ("val_reward_last_ci95", "last validation reward, mean ± 95% CI"),
    ("staleness_max_max", "max staleness, highest"),
    ("val_reward_last_vs_k0", "last validation reward vs K=0"),
    ("verdict", "verdict"),
)


def _values(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[float]:
    """The per-step values of the first of ``keys`` any row logged (empty when none did)."""
    for key in keys:
        values = [v for r in rows if (v := _num(r.get(key))) is not None]
        if values:
            return values
    return []


def _series(
    rows: Sequence[dict[str, Any]], keys: Sequence[str], x_key: str = "step"
) -> tuple[list[float], list[float]]:
    for key in keys:
        pairs = [(x, y) for r in rows if (x := _num(r.get(x_key))) is not None and (y := _num(r.get(key))) is not None]
        if pairs:
            return [p[0] for p in pairs], [p[1] for p in pairs]
    return [], []


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def t_quantile_975(df: int) -> float:
    """Student's t quantile t(0.975, ``df``): tabulated for df = 1..30, the normal quantile 1.96 above."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return _T_975[df - 1] if df <= len(_T_975) else _Z_975


def mean_ci95(values: Sequence[float]) -> tuple[float | None, float | None]:
    """(mean, half-width of its 95% Student's t confidence interval) of ``values``; the half-width is None for fewer
    than two values, both are None for none."""
    n = len(values)
    mean = _mean(values)
    if mean is None or n < 2:
        return mean, None
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t_quantile_975(n - 1) * std / math.sqrt(n)


def hold_tolerance(staleness: int) -> float:
    """How far a cell's mean final held-out reward may fall below its K = 0 cell's and still hold, at ``staleness``."""
    return HOLD_TOLERANCE if staleness <= HOLD_TOLERANCE_MAX_K else HOLD_TOLERANCE_LARGE_K


def verdict(staleness: int, difference: float | None) -> str:
    """``baseline`` at K = 0; else ``holds`` / ``falls`` by ``difference`` (cell minus K = 0) against
    :func:`hold_tolerance`, and ``no baseline`` when there is no difference to judge."""
    if staleness == 0:
        return "baseline"
    if difference is None:
        return "no baseline"
    return "holds" if difference >= -hold_tolerance(staleness) - _ROUNDING else "falls"


def cell_band(
    series: Sequence[Sequence[tuple[float, float]]],
) -> tuple[list[float], list[float], list[float | None]]:
    """(steps, mean, 95% half-width) over the runs' (step, value) ``series``: at every step any run has a value, the
    mean of the values there and the half-width of :func:`mean_ci95` (None where fewer than two runs have one)."""
    at_step: dict[float, list[float]] = {}
    for pairs in series:
        for step, value in pairs:
            at_step.setdefault(step, []).append(value)
    steps = sorted(at_step)
    stats = [mean_ci95(at_step[step]) for step in steps]
    return steps, [m for m, _ in stats if m is not None], [h for _, h in stats]


def _throughput(rows: Sequence[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(steps/s, trained tokens/s) between the first and the last step that logged a wall time."""
    timed = [r for r in rows if _num(r.get(WALL_KEY)) is not None]
    if len(timed) < 2:
        return None, None
    seconds = float(timed[-1][WALL_KEY]) - float(timed[0][WALL_KEY])
    if seconds <= 0:
        return None, None
    steps_per_s = (timed[-1]["step"] - timed[0]["step"]) / seconds
    tokens = [
        rate * step_s
        for r in timed[1:]
        if (rate := _num(r.get(TOKEN_RATE_KEY))) is not None and (step_s := _num(r.get(STEP_TIME_KEY))) is not None
    ]
    return steps_per_s, (sum(tokens) / seconds if len(tokens) == len(timed) - 1 else None)


def summarize_run(run: SweepRun, outcome: RunOutcome | None) -> dict[str, Any]:
    """The table row of one run (``None`` for what it did not log; a run without metrics still gets its status)."""
    records = read_metrics(run.metrics_path) if run.metrics_path.is_file() else []
    rows = _by_step(records)
    validated = [r for r in validation_records(records) if _num(r.get(VAL_REWARD_KEY)) is not None]
    rewards = _values(rows, REWARD_KEYS)
    window = max(1, math.ceil(0.1 * len(rewards)))
    steps_per_s, tokens_per_s = _throughput(rows)
    walls = _values(rows, (WALL_KEY,))
    drops = _values(rows, DROP_KEYS)
    stale_max = _values(rows, STALENESS_MAX_KEYS)
    wall_clock = outcome.seconds if outcome is not None and outcome.seconds is not None else None
    return {
        "K": run.staleness,
        "correction": "on" if run.correction else "off",
        "seed": run.seed,
        "status": outcome.status if outcome is not None else "not run",
        "steps": rows[-1]["step"] if rows else 0,
        "wall_clock_s": wall_clock if wall_clock is not None else (max(walls) if walls else None),
        "reward_first10": _mean(rewards[:window]),
        "reward_last10": _mean(rewards[-window:]),
        "reward_final": rewards[-1] if rewards else None,
        "val_reward_last": validated[-1][VAL_REWARD_KEY] if validated else None,
        "val_step_last": validated[-1]["step"] if validated else None,
        "steps_per_s": steps_per_s,
        "tokens_per_s": tokens_per_s,
        "ess_mean": _mean(_values(rows, (ESS_KEY,))),
        "staleness_mean": _mean(_values(rows, STALENESS_KEYS)),
        "staleness_max": max(stale_max) if stale_max else None,
        "version_span_mean": _mean(_values(rows, (SPAN_KEY,))),
        "dropped_groups": drops[-1] if drops else None,  # the coordinator's counter is cumulative
        "log": str(outcome.log if outcome is not None else run.log_path),
    }


def summarize_cells(runs: Sequence[SweepRun], rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (K, correction) cell, in the order the cells first appear: ``runs`` (planned), ``done`` (finished
    every step) and, over the finished runs, ``<metric>_mean`` / ``_min`` / ``_max`` of each of :data:`CELL_METRICS`
    (None where no finished run logged it), ``val_reward_last_ci95``, ``staleness_max_max``, and the comparison with
    the K = 0 cell of :func:`_judge`."""
    cells: dict[str, list[tuple[SweepRun, dict[str, Any]]]] = {}
    for run, row in zip(runs, rows, strict=True):
        cells.setdefault(run.cell, []).append((run, row))
    summary: list[dict[str, Any]] = []
    for members in cells.values():
        first = members[0][0]
        done = [row for _, row in members if row["status"] == "done"]
        cell: dict[str, Any] = {
            "K": first.staleness,
            "correction": "on" if first.correction else "off",
            "runs": len(members),
            "done": len(done),
        }
        for key, _ in CELL_METRICS:
            values = [v for row in done if (v := _num(row.get(key))) is not None]
            cell[f"{key}_mean"] = _mean(values)
            cell[f"{key}_min"] = min(values) if values else None
            cell[f"{key}_max"] = max(values) if values else None
        finals = [v for row in done if (v := _num(row.get("val_reward_last"))) is not None]
        cell["val_reward_last_ci95"] = mean_ci95(finals)[1]
        stale_max = [v for row in done if (v := _num(row.get("staleness_max"))) is not None]
        cell["staleness_max_max"] = max(stale_max) if stale_max else None
        summary.append(cell)
    return _judge(summary)


def _judge(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ``val_reward_last_vs_k0`` (a cell's ``val_reward_last_mean`` minus that of the K = 0 cell with the same
    correction setting; None at K = 0 and where either mean is missing) and ``verdict`` (:func:`verdict`; None for a
    cell with K > 0 and no mean of its own) to each cell."""
    baselines = {c["correction"]: c["val_reward_last_mean"] for c in cells if c["K"] == 0}
    for cell in cells:
        mean, baseline = cell["val_reward_last_mean"], baselines.get(cell["correction"])
        difference = mean - baseline if cell["K"] != 0 and mean is not None and baseline is not None else None
        cell["val_reward_last_vs_k0"] = difference
        cell["verdict"] = verdict(cell["K"], difference) if cell["K"] == 0 or mean is not None else None
    return cells


def _write(
    rows: Sequence[dict[str, Any]], names: Sequence[str], headers: Sequence[str], cells: Any, stem: Path
) -> tuple[Path, Path]:
    """``<stem>.csv`` (raw values of ``names``, empty = not logged) and ``<stem>.md`` (``headers``, then ``cells(row)``
    for each row)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    csv_path = stem.with_suffix(".csv")
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(names))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in names})
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cells(row)) + " |" for row in rows]
    md_path = stem.with_suffix(".md")
    md_path.write_text("\n".join(lines) + "\n")
    return csv_path, md_path


def write_table(rows: Sequence[dict[str, Any]], out: Path) -> tuple[Path, Path]:
    """``sweep.csv`` (raw values, empty cell = not logged) and ``sweep.md`` (rounded, ``n/a``) in ``out``."""

    def cells(row: dict[str, Any]) -> list[str]:
        return ["n/a" if row.get(k) is None else fmt.format(row[k]) for k, _, fmt in COLUMNS]

    return _write(rows, [c[0] for c in COLUMNS], [c[1] for c in COLUMNS], cells, out / "sweep")


def write_cell_table(cells: Sequence[dict[str, Any]], out: Path) -> tuple[Path, Path]:
    """``sweep_cells.csv`` (raw means and ranges) and ``sweep_cells.md`` ("mean (min-max)", just the mean when they
    agree) in ``out``."""
    headers = {c[0]: c[1] for c in COLUMNS}
    names = ["K", "correction", "runs", "done"]
    names += [f"{key}_{stat}" for key, _ in CELL_METRICS for stat in ("mean", "min", "max")]
    names += [key for key, _ in CELL_EXTRA_COLUMNS]

    def formatted(cell: dict[str, Any]) -> list[str]:
        texts = [str(cell["K"]), cell["correction"], f"{cell['done']} of {cell['runs']}"]
        for key, fmt in CELL_METRICS:
            mean, low, high = (cell[f"{key}_{stat}"] for stat in ("mean", "min", "max"))
            if mean is None:
                texts.append("n/a")
            elif fmt.format(low) == fmt.format(high):
                texts.append(fmt.format(mean))
            else:
                texts.append(f"{fmt.format(mean)} ({fmt.format(low)}-{fmt.format(high)})")
        return texts + _extra_texts(cell)

    md_headers = ["K", "correction", "runs done", *(f"{headers[key]}, mean (range)" for key, _ in CELL_METRICS)]
    md_headers += [header for _, header in CELL_EXTRA_COLUMNS]
    return _write(cells, names, md_headers, formatted, out / "sweep_cells")


def _extra_texts(cell: dict[str, Any]) -> list[str]:
    """The markdown texts of :data:`CELL_EXTRA_COLUMNS` ("mean ± half-width", just the mean without an interval)."""
    mean, half = cell["val_reward_last_mean"], cell["val_reward_last_ci95"]
    stale_max, difference = cell["staleness_max_max"], cell["val_reward_last_vs_k0"]
    return [
        "n/a" if mean is None else f"{mean:.3f}" + ("" if half is None else f" ± {half:.3f}"),
        "n/a" if stale_max is None else f"{stale_max:.0f}",
        "n/a" if difference is None else f"{difference:+.3f}",
        cell["verdict"] or "n/a",
    ]


def _style(run: SweepRun, ks: Sequence[int]) -> dict[str, Any]:
    from matplotlib import colormaps

    position = sorted(ks).index(run.staleness) / max(1, len(ks) - 1)
    return {
        "color": colormaps["viridis"](0.9 * position),
        "linestyle": "-" if run.correction else "--",
        "label": run.name,
    }


def _new_figure(width: float = 9.0, height: float = 5.5) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def _legend_or_no_data(ax: Any, drawn: int) -> None:
    """A plot's legend and grid when it drew a line, else "no data" across it."""
    if drawn:
        ax.legend(fontsize=8, loc="best", ncol=2)
        ax.grid(alpha=0.3)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, fontsize=14, color="gray")


def _line_plot(
    data: Sequence[tuple[SweepRun, list[dict[str, Any]]]],
    keys: Sequence[str],
    path: Path,
    *,
    title: str,
    ylabel: str,
    x_key: str = "step",
    smooth: bool = False,
) -> Path:
    fig = _new_figure()
    ax = fig.subplots()
    ks = sorted({run.staleness for run, _ in data})
    scale, unit = 1.0, "step"
    if x_key == WALL_KEY:
        longest = max((v for _, rows in data for v in _values(rows, (WALL_KEY,))), default=0.0)
        scale, unit = (60.0, "wall-clock (minutes)") if longest > 300 else (1.0, "wall-clock (seconds)")
    drawn = 0
    labelled: set[str] = set()  # a cell's seeds share its colour and line style, and its legend entry
    for run, rows in data:
        xs, ys = _series(rows, keys, x_key)
        if not xs:
            continue
        if smooth:
            ys = _rolling_mean(ys, max(1, len(ys) // 20))
        style = _style(run, ks)
        style["label"] = "_nolegend_" if run.cell in labelled else run.cell
        labelled.add(run.cell)
        ax.plot([x / scale for x in xs], ys, linewidth=1.5, **style)
        drawn += 1
    ax.set_title(title + (" (rolling mean over 5% of steps)" if smooth else ""))
    ax.set_xlabel(unit)
    ax.set_ylabel(ylabel)
    _legend_or_no_data(ax, drawn)
    return _save(fig, path)


def _throughput_plot(runs: Sequence[SweepRun], rows: Sequence[dict[str, Any]], path: Path) -> Path:
    fig = _new_figure(11.0, 4.5)
    axes = fig.subplots(1, 2)
    ks = sorted({run.staleness for run in runs})
    for ax, key, label in ((axes[0], "steps_per_s", "steps / s"), (axes[1], "tokens_per_s", "trained tokens / s")):
        for i, (run, row) in enumerate(zip(runs, rows, strict=True)):
            style = _style(run, ks)
            ax.bar(i, row[key] or 0.0, color=style["color"], hatch="" if run.correction else "//", edgecolor="black")
        ax.set_xticks(range(len(runs)), [run.name for run in runs], rotation=45, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.set_title(f"throughput: {label} (hatched = correction off)")
        ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def _val_band_plot(
    runs: Sequence[SweepRun], rows: Sequence[dict[str, Any]], records: Sequence[list[dict[str, Any]]], path: Path
) -> Path:
    """Held-out validation reward against step, one line per cell: the mean over its finished runs, shaded with the 95%
    band of :func:`cell_band`."""
    fig = _new_figure()
    ax = fig.subplots()
    ks = sorted({run.staleness for run in runs})
    cells: dict[str, list[tuple[SweepRun, list[tuple[float, float]]]]] = {}
    for run, row, run_records in zip(runs, rows, records, strict=True):
        validated = _series(validation_records(run_records), (VAL_REWARD_KEY,))
        cells.setdefault(run.cell, [])
        if row["status"] == "done" and validated[0]:
            cells[run.cell].append((run, list(zip(*validated, strict=True))))
    drawn = 0
    for cell, members in cells.items():
        if not members:
            continue
        steps, means, halves = cell_band([pairs for _, pairs in members])
        style = {**_style(members[0][0], ks), "label": f"{cell} ({len(members)} runs)"}
        ax.plot(steps, means, marker="o", markersize=3, linewidth=1.5, **style)
        banded = [(s, m, h) for s, m, h in zip(steps, means, halves, strict=True) if h is not None]
        if banded:
            ax.fill_between(
                [s for s, _, _ in banded],
                [m - h for _, m, h in banded],
                [m + h for _, m, h in banded],
                color=style["color"],
                alpha=0.15,
                linewidth=0,
            )
        drawn += 1
    ax.set_title("held-out validation reward: mean over finished runs, 95% t band (>= 2 runs)")
    ax.set_xlabel("step")
    ax.set_ylabel("validation reward")
    _legend_or_no_data(ax, drawn)
    return _save(fig, path)


def plot_sweep(runs: Sequence[SweepRun], rows: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    """Write the sweep's PNGs into ``out`` and return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    records = [read_metrics(run.metrics_path) if run.metrics_path.is_file() else [] for run in runs]
    data = [(run, _by_step(run_records)) for run, run_records in zip(runs, records, strict=True)]
    return [
        _line_plot(data, REWARD_KEYS, out / "reward_vs_step.png", title="reward vs step", ylabel="reward", smooth=True),
        _line_plot(
            data,
            REWARD_KEYS,
            out / "reward_vs_wall.png",
            title="reward vs wall-clock",
            ylabel="reward",
            x_key=WALL_KEY,
            smooth=True,
        ),
        _throughput_plot(runs, rows, out / "throughput.png"),
        _line_plot(data, (ESS_KEY,), out / "ess.png", title="effective sample size of the IS weights", ylabel="ESS"),
        _line_plot(data, STALENESS_KEYS, out / "staleness.png", title="mean staleness", ylabel="versions behind"),
        _line_plot(
            data, (SPAN_KEY,), out / "version_span.png", title="mean version span per completion", ylabel="versions"
        ),
        _line_plot(
            data, DROP_KEYS, out / "drops.png", title="groups dropped by the coordinator (cumulative)", ylabel="groups"
        ),
        _val_band_plot(runs, rows, records, out / "sweep_val_bands.png"),
    ]


def write_report(runs: Sequence[SweepRun], outcomes: Sequence[RunOutcome | None], out: Path) -> list[Path]:
    """Table and plots of a sweep; returns every file written."""
    rows = [summarize_run(run, outcome) for run, outcome in zip(runs, outcomes, strict=True)]
    cells = summarize_cells(runs, rows)
    return [*write_table(rows, out), *write_cell_table(cells, out), *plot_sweep(runs, rows, out)]
