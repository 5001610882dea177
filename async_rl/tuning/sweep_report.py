"""The staleness sweep's table and plots, read back from each run's ``metrics.jsonl``.

One row per run (``sweep.csv`` and ``sweep.md``): K, correction, seed, status, steps logged, the job's wall-clock,
reward over the first and last 10% of steps and at the last step, the last validation round's reward and its step,
steady-state throughput, and the off-policy picture: mean effective sample size of the importance weights, mean
staleness, mean version span (policy updates a completion saw while it was generated) and the groups the coordinator
dropped as too stale.

One row per (K, correction) cell (``sweep_cells.csv`` and ``sweep_cells.md``): how many of its runs finished, and the
mean, lowest and highest of the main columns over them (its seeds, with ``--seeds``). A run that failed or did not
finish counts in ``runs`` only.

Throughput is measured between the first and the last logged step (``time/wall_s``), so actor start-up does not count:
``steps_per_s`` = steps / seconds, ``tokens_per_s`` = trained tokens (prompt + response, from the learner's per-step
``tokens_per_s x step_time_s``) / seconds. The job's own wall-clock, start-up included, is the ``wall_clock_s`` column.

Plots (one PNG each, one line per run, colour = K, solid = correction on, dashed = off): reward against step and
against wall-clock (rolling mean), throughput (bars), ESS, staleness, version span and dropped groups against step.
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
    "plot_sweep",
    "summarize_cells",
    "summarize_run",
    "write_cell_table",
    "write_report",
    "write_table",
]

ESS_KEY = mc.LEARNER_OFFPOLICY_ESS
STALENESS_KEYS = (mc.LEARNER_STALENESS_MEAN, mc.ROLLOUT_STALENESS_MEAN)
SPAN_KEY = mc.ROLLOUT_VERSION_SPAN_MEAN
DROP_KEYS = (mc.TRANSPORT_DROPS_TOTAL, mc.TRANSPORT_DROPS_STALE, mc.TRANSPORT_DROPPED_TOTAL)
STEP_TIME_KEY = mc.LEARNER_PERF_STEP_TIME_S
TOKEN_RATE_KEY = mc.LEARNER_PERF_TOKENS_PER_S

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
        "version_span_mean": _mean(_values(rows, (SPAN_KEY,))),
        "dropped_groups": drops[-1] if drops else None,  # the coordinator's counter is cumulative
        "log": str(outcome.log if outcome is not None else run.log_path),
    }


def summarize_cells(runs: Sequence[SweepRun], rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (K, correction) cell, in the order the cells first appear: ``runs`` (planned), ``done`` (finished
    every step) and, over the finished runs, ``<metric>_mean`` / ``_min`` / ``_max`` of each of :data:`CELL_METRICS`
    (None where no finished run logged it)."""
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
        summary.append(cell)
    return summary


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
        return texts

    md_headers = ["K", "correction", "runs done", *(f"{headers[key]}, mean (range)" for key, _ in CELL_METRICS)]
    return _write(cells, names, md_headers, formatted, out / "sweep_cells")


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
    if drawn:
        ax.legend(fontsize=8, loc="best", ncol=2)
        ax.grid(alpha=0.3)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, fontsize=14, color="gray")
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


def plot_sweep(runs: Sequence[SweepRun], rows: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    """Write the sweep's PNGs into ``out`` and return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    data = [(run, _by_step(read_metrics(run.metrics_path)) if run.metrics_path.is_file() else []) for run in runs]
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
    ]


def write_report(runs: Sequence[SweepRun], outcomes: Sequence[RunOutcome | None], out: Path) -> list[Path]:
    """Table and plots of a sweep; returns every file written."""
    rows = [summarize_run(run, outcome) for run, outcome in zip(runs, outcomes, strict=True)]
    cells = summarize_cells(runs, rows)
    return [*write_table(rows, out), *write_cell_table(cells, out), *plot_sweep(runs, rows, out)]
