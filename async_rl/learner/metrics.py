"""Accumulate per-micro-batch metrics on each rank and reduce them across ranks once per step.

Every metric is one of: ``mean`` (averaged over all contributions on all ranks), ``sum`` (summed), ``max``/``min``,
or a ``ratio`` (numerator and denominator summed separately, e.g. token-weighted entropy). Reducing everything in
three all-reduces at the end of a step keeps collectives off the micro-batch loop. All ranks must add the same keys
(they do: keys depend only on the settings, and every rank runs the same number of micro-steps).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from async_rl.learner.dist import DistContext

__all__ = ["MetricAccumulator"]


class MetricAccumulator:
    """Collects metric contributions; :meth:`reduce` returns ``{prefix + key: float}`` identical on all ranks."""

    def __init__(self) -> None:
        self._sum: dict[str, float] = defaultdict(float)
        self._den: dict[str, float] = defaultdict(float)
        self._max: dict[str, float] = {}
        self._min: dict[str, float] = {}
        self._totals: set[str] = set()

    def mean(self, key: str, value: float | torch.Tensor) -> None:
        self._sum[key] += float(value)
        self._den[key] += 1.0

    def ratio(self, key: str, numerator: float | torch.Tensor, denominator: float | torch.Tensor) -> None:
        self._sum[key] += float(numerator)
        self._den[key] += float(denominator)

    def total(self, key: str, value: float | torch.Tensor) -> None:
        self._sum[key] += float(value)
        self._den[key] += 0.0
        self._totals.add(key)

    def max(self, key: str, value: float | torch.Tensor) -> None:
        self._max[key] = max(self._max.get(key, float("-inf")), float(value))

    def min(self, key: str, value: float | torch.Tensor) -> None:
        self._min[key] = min(self._min.get(key, float("inf")), float(value))

    def reduce(self, ctx: DistContext, prefix: str = "") -> dict[str, float]:
        out: dict[str, float] = {}
        keys = sorted(self._sum)
        if keys:
            t = torch.tensor([[self._sum[k], self._den[k]] for k in keys], dtype=torch.float64)
            t = ctx.all_reduce(t, "sum")
            for k, (s, d) in zip(keys, t.tolist(), strict=True):
                # a mean counts 1 per contribution, so it is a ratio too; totals ignore the denominator
                out[prefix + k] = s if k in self._totals else (s / d if d else float("nan"))
        for store, op in ((self._max, "max"), (self._min, "min")):
            ks = sorted(store)
            if ks:
                t = ctx.all_reduce(torch.tensor([store[k] for k in ks], dtype=torch.float64), op)
                out.update({prefix + k: v for k, v in zip(ks, t.tolist(), strict=True)})
        return out
