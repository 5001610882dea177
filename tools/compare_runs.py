"""Compare runs side by side against wall clock: one PNG and a table of the chosen metrics.

    python tools/compare_runs.py grpo=outputs/grpo dapo=outputs/dapo --out docs/compare.png \\
        --train learner/batch/informative_groups --val val/arith_chat/acc_mean,val/arith_chat/reward_mean

Each run is ``label=run_dir`` (its ``metrics.jsonl``). ``--train`` keys are read from the per-step records,
``--val`` keys from the validation records (a comma list: the first key a run logged is used, so one entry can name
the accuracy of runs whose rewards differ, e.g. ``acc_mean`` under overlong shaping and ``reward_mean`` without).
The table prints, per run, each value with the wall clock (minutes from the learner's start) it was logged at.
Every key must be one the metric catalog names (``python -m async_rl.metric_catalog --markdown step``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from async_rl.metric_catalog import find
from async_rl.runtime.metrics import WALL_KEY, read_metrics
from async_rl.runtime.plot import REWARD_KEY, by_step, finite_number, validation_records


def _pick(records: Sequence[dict[str, Any]], keys: Sequence[str]) -> str | None:
    return next((k for k in keys if any(finite_number(r.get(k)) is not None for r in records)), None)


def _points(records: Sequence[dict[str, Any]], key: str) -> list[tuple[float, float, int]]:
    out = []
    for r in records:
        t, y = finite_number(r.get(WALL_KEY)), finite_number(r.get(key))
        if t is not None and y is not None:
            out.append((t / 60.0, y, int(r.get("step", 0))))
    return out


def compare(runs: dict[str, Path], train: Sequence[Sequence[str]], val: Sequence[Sequence[str]], out: Path) -> str:
    """Draw the comparison into ``out`` and return the table."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [("train", keys) for keys in train] + [("val", keys) for keys in val]
    fig = Figure(figsize=(6 * max(len(panels), 1), 4.2))
    FigureCanvasAgg(fig)
    lines: list[str] = []
    for i, (kind, keys) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for label, run_dir in runs.items():
            records = read_metrics(run_dir / "metrics.jsonl")
            rows = by_step(records) if kind == "train" else validation_records(records)
            key = _pick(rows, keys)
            if key is None:
                lines.append(f"{label:>8} {kind} {','.join(keys)}: not logged")
                continue
            pts = _points(rows, key)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{label}: {key}")
            cells = " ".join(f"{p[1]:.3f}@{p[0]:.1f}m(s{p[2]})" for p in pts)
            lines.append(f"{label:>8} {key}: {cells}")
        ax.set_xlabel("wall clock (minutes)")
        ax.set_title(f"{kind}: {keys[0]}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="label=run_dir")
    parser.add_argument("--out", type=Path, default=Path("compare.png"))
    parser.add_argument("--train", action="append", default=[], help="comma list of per-step keys (one panel)")
    parser.add_argument("--val", action="append", default=[], help="comma list of validation keys (one panel)")
    args = parser.parse_args(argv)
    runs: dict[str, Path] = {}
    for spec in args.runs:
        label, sep, path = spec.partition("=")
        if not sep or not (Path(path) / "metrics.jsonl").exists():
            parser.error(f"{spec!r}: expected label=run_dir with a metrics.jsonl in run_dir")
        runs[label] = Path(path)
    train = [k.split(",") for k in args.train] or [[REWARD_KEY]]
    val = [k.split(",") for k in args.val]
    for record, panels in (("step", train), ("val", val)):
        unknown = [k for keys in panels for k in keys if find(k, record) is None]
        if unknown:
            parser.error(f"not {record} metrics of async_rl/metric_catalog.py: {', '.join(unknown)}")
    print(compare(runs, train, val, args.out))
    print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
