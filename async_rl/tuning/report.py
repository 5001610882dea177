"""Write the tuner's recommendations: a markdown table, a CSV and a PNG of predicted throughput against GPUs."""

from __future__ import annotations

import csv
from pathlib import Path

from async_rl.tuning.recommend import Recommendation


def markdown_table(recs: list[Recommendation]) -> str:
    rows = [r.row() for r in recs]
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(row[k]) for k in keys) + " |" for row in rows]
    return "\n".join(lines)


def write_csv(recs: list[Recommendation], path: Path) -> None:
    rows = [r.row() for r in recs]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)


def plot(recs: list[Recommendation], path: Path) -> None:
    """Predicted trained tokens/s of the best deployment per GPU count, with linear scaling from the smallest."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = sorted(recs, key=lambda r: r.candidate.gpus)
    gpus = [r.candidate.gpus for r in recs]
    rate = [r.result.trained_tokens_per_s for r in recs]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(gpus, rate, "o-", label="predicted (best deployment)")
    if recs:
        ax.plot(gpus, [rate[0] * g / gpus[0] for g in gpus], "--", color="grey", label="linear from the smallest")
    for r in recs:
        c = r.candidate
        ax.annotate(
            f"{c.learner_gpus}L:{c.actors}A K={c.max_staleness}",
            (c.gpus, r.result.trained_tokens_per_s),
            fontsize=7,
            textcoords="offset points",
            xytext=(4, -10),
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("trained tokens/s")
    ax.set_title("async_rl throughput tuner: predicted throughput")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
