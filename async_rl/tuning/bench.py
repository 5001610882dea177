"""The one machine-readable line every benchmark in ``tools/`` prints last, and its parser for ``tools/bench_all.py``.

A benchmark measures something side by side with a reference in the same run and reports ratios::

    BENCH_RESULT {"name": "actor", "results": [{"metric": "actor_vs_raw_vllm", "ratio": 0.97, "target": 0.9,
                  "detail": "6672 / 6851 tok/s"}]}

``target`` is the minimum the ratio should reach, or null when the benchmark only informs.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any

PREFIX = "BENCH_RESULT "

__all__ = ["PREFIX", "BenchLine", "PairedRatios", "emit", "format_line", "paired_ratios", "parse"]

# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom; beyond that the normal 1.96 is within 2%.
# fmt: off
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
# fmt: on


@dataclass(frozen=True)
class PairedRatios:
    """Per-round ratios of two paths timed back to back, summarised on the log scale (a ratio and its inverse are
    equally far from 1): the geometric mean and its 95% confidence interval, and the raw spread."""

    n: int
    geomean: float
    ci_low: float  # 95% confidence interval of the geometric mean (Student's t on the log ratios)
    ci_high: float
    median: float
    low: float  # the smallest and largest single ratio
    high: float

    def describe(self) -> str:
        return (
            f"geometric mean of {self.n} paired rounds {self.geomean:.3f} "
            f"(95% CI {self.ci_low:.3f}-{self.ci_high:.3f}); "
            f"median {self.median:.3f}, rounds {self.low:.2f}-{self.high:.2f}"
        )


def paired_ratios(ratios: list[float]) -> PairedRatios:
    """Summarise per-round paired ratios (each > 0). One round gives an interval of zero width (no spread known)."""
    if not ratios or any(not (r > 0 and math.isfinite(r)) for r in ratios):
        raise ValueError(f"paired ratios must be positive finite numbers, got {ratios!r}")
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    mean = statistics.fmean(logs)
    half = 0.0
    if n > 1:
        half = (_T95[n - 2] if n - 1 <= len(_T95) else 1.96) * statistics.stdev(logs) / math.sqrt(n)
    return PairedRatios(
        n=n,
        geomean=math.exp(mean),
        ci_low=math.exp(mean - half),
        ci_high=math.exp(mean + half),
        median=statistics.median(ratios),
        low=min(ratios),
        high=max(ratios),
    )


@dataclass(frozen=True)
class BenchLine:
    """One measured ratio of one benchmark."""

    metric: str
    ratio: float
    target: float | None = None
    detail: str = ""

    @property
    def met(self) -> bool | None:
        """True/False against the target; None when there is no target or the ratio is not a number."""
        if self.target is None or not math.isfinite(self.ratio):
            return None
        return self.ratio >= self.target


def emit(name: str, lines: list[BenchLine]) -> str:
    """Print (and return) the result line for benchmark ``name``."""
    text = PREFIX + json.dumps({"name": name, "results": [asdict(line) for line in lines]})
    print(text, flush=True)
    return text


def parse(output: str) -> tuple[str, list[BenchLine]] | None:
    """The last result line in a benchmark's ``output``; None when it printed none (it failed or is not one)."""
    for raw in reversed(output.splitlines()):
        if not raw.startswith(PREFIX):
            continue
        payload: Any = json.loads(raw[len(PREFIX) :])
        if not isinstance(payload, dict) or not isinstance(payload.get("results"), list):
            raise ValueError(f"malformed {PREFIX.strip()} line: {raw[:200]}")
        lines = [
            BenchLine(
                metric=str(r["metric"]),
                ratio=float(r["ratio"]),
                target=None if r.get("target") is None else float(r["target"]),
                detail=str(r.get("detail", "")),
            )
            for r in payload["results"]
        ]
        return str(payload.get("name", "?")), lines
    return None


def format_line(line: BenchLine) -> str:
    """``metric  ratio 0.97  (target >= 0.90: met)  detail`` for the summary table."""
    if line.target is None:
        verdict = "(no target)"
    else:
        verdict = f"(target >= {line.target:.2f}: {'met' if line.met else 'NOT met'})"
    return f"{line.metric:28s} ratio {line.ratio:7.2f}  {verdict:28s} {line.detail}"
