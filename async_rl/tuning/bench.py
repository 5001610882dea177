"""The one machine-readable line every benchmark in ``tools/`` prints last, and its parser for ``tools/bench_all.py``.

A benchmark measures something side by side with a reference in the same run and reports ratios::

    BENCH_RESULT {"name": "actor", "results": [{"metric": "actor_vs_raw_vllm", "ratio": 0.97, "target": 0.9,
                  "detail": "6672 / 6851 tok/s"}]}

``target`` is the minimum the ratio should reach, or null when the benchmark only informs.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

PREFIX = "BENCH_RESULT "

__all__ = ["PREFIX", "BenchLine", "emit", "format_line", "parse"]


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
