"""Gold against proxy: the curve that shows reward-model over-optimisation when it starts.

A run that trains on a learned reward model's score with a rule it never trains on (``reward.reward_model.rule_weight:
0``; the rule, here the gold scorer, still scored and logged as the ``rule`` component) logs both in every validation
round: ``val/<source>/reward_model_mean`` (the proxy: the model's normalised score) and ``val/<source>/rule_mean``
(the gold). :func:`gold_proxy_rows` pairs each round with the KL to the initial policy at that point
(``learner/actor/kl_loss``, the KL loss's estimator averaged over a step's tokens, the reference being the initial
model; one step's value is noisy, so a round gets the mean over the training steps since the previous round; 0 before
the first step), and :func:`plot_gold_proxy` draws gold and proxy against the step and against the KL, as Gao et al.
do (there each point is labelled with its step). Over-optimisation is where the proxy keeps rising and the gold turns
down.

    python -m async_rl.runtime.plot_gold RUN_DIR [--out PNG]

reads ``RUN_DIR/metrics.jsonl``, prints the rows as a table and writes the PNG (default ``RUN_DIR/gold_vs_proxy.png``).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from async_rl import metric_catalog as mc
from async_rl.rewards.model_client import MODEL_COMPONENT, RULE_COMPONENT
from async_rl.runtime.metrics import read_metrics
from async_rl.runtime.plot import by_step, finite_number, validation_records

__all__ = ["format_rows", "gold_proxy_rows", "main", "plot_gold_proxy"]


def _source_value(record: dict[str, Any], component: str) -> float | None:
    """The record's ``val/<source>/<component>_mean``, averaged over its sources (one source in the recipes)."""
    values = []
    for key, value in record.items():
        parsed = mc.val_source_component_mean_key.parse(key)
        number = finite_number(value)
        if parsed is not None and parsed[1] == component and number is not None:
            values.append(number)
    return sum(values) / len(values) if values else None


def gold_proxy_rows(records: Iterable[dict[str, Any]], *, extra: Sequence[str] = ()) -> list[dict[str, float]]:
    """One row per validation round that logged both the gold and the proxy: ``step``, ``gold``, ``proxy``, ``kl``
    (the mean KL loss of the training steps since the previous round; 0 at step 0, None when the run logged none),
    and each component named in ``extra`` (e.g. ``correct``, ``words``)."""
    records = list(records)
    kl_at = {
        int(r["step"]): v for r in by_step(records) if (v := finite_number(r.get(mc.LEARNER_ACTOR_KL_LOSS))) is not None
    }
    rows = []
    previous = 0
    for record in validation_records(records):
        gold, proxy = _source_value(record, RULE_COMPONENT), _source_value(record, MODEL_COMPONENT)
        if gold is None or proxy is None:
            continue
        step = int(record["step"])
        window = [kl_at[s] for s in range(previous + 1, step + 1) if s in kl_at]
        kl = 0.0 if step == 0 else sum(window) / len(window) if window else None
        previous = step
        row: dict[str, Any] = {"step": step, "gold": gold, "proxy": proxy, "kl": kl}
        for name in extra:
            row[name] = _source_value(record, name)
        rows.append(row)
    return rows


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table of the rows."""
    if not rows:
        return "no validation round logged both the gold ('rule') and the proxy ('reward_model') component"
    names = list(rows[0])
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for row in rows:
        cells = [
            "-" if row[n] is None else f"{row[n]:.4f}" if isinstance(row[n], float) else str(row[n]) for n in names
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_gold_proxy(rows: Sequence[dict[str, Any]], out_png: Path, title: str = "") -> Path:
    """Gold and proxy against the step (left) and against the KL to the initial policy (right)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    steps = [r["step"] for r in rows]
    for ax, xs, xlabel in (
        (left, steps, "training step (policy version validated)"),
        (right, [r["kl"] for r in rows], "KL to the initial policy (learner/actor/kl_loss, mean since last round)"),
    ):
        keep = [i for i, x in enumerate(xs) if x is not None]
        by_kl = ax is right
        if by_kl:  # the KL need not grow with every step: points labelled with their step, joined in KL order
            keep.sort(key=lambda i: xs[i])
        gold_ax = ax
        proxy_ax = ax.twinx()
        gold_ax.plot([xs[i] for i in keep], [rows[i]["gold"] for i in keep], "o-", color="tab:green", label="gold")
        proxy_ax.plot([xs[i] for i in keep], [rows[i]["proxy"] for i in keep], "s--", color="tab:purple", label="proxy")
        if by_kl:
            for i in keep:
                gold_ax.annotate(
                    str(rows[i]["step"]),
                    (xs[i], rows[i]["gold"]),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize=8,
                )
        gold_ax.set_xlabel(xlabel)
        gold_ax.set_ylabel("gold: held-out mean (rule)", color="tab:green")
        proxy_ax.set_ylabel("proxy: reward model, normalised", color="tab:purple")
        gold_ax.grid(alpha=0.3)
        if not keep:
            gold_ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=gold_ax.transAxes)
    fig.suptitle(title or "gold vs proxy on held-out prompts")
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(str(out_png), dpi=110)
    return out_png


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Gold against proxy from a run's metrics.jsonl.")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", type=Path, default=None, help="PNG path (default RUN_DIR/gold_vs_proxy.png)")
    p.add_argument("--extra", nargs="*", default=["correct", "words"], help="more validation components to tabulate")
    args = p.parse_args(argv)
    rows = gold_proxy_rows(read_metrics(args.run_dir / "metrics.jsonl"), extra=args.extra)
    print(format_rows(rows))
    if not rows:
        return 1
    out = plot_gold_proxy(rows, args.out or args.run_dir / "gold_vs_proxy.png", title=str(args.run_dir))
    print(f"plot: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
