"""Accumulate per-micro-batch metrics on each rank and reduce them across ranks once per step.

Every metric is one of: ``mean`` (averaged over all contributions on all ranks), ``sum`` (summed), ``max``/``min``,
or a ``ratio`` (numerator and denominator summed separately, e.g. token-weighted entropy); the metric catalog
(runtime/metric_catalog.py) names them ``mean``, ``token_mean``, ``max`` and ``min``. Reducing everything in three
all-reduces at the end of a step keeps collectives off the micro-batch loop. All ranks must add the same keys (they
do: keys depend only on the settings, and every rank runs the same number of micro-steps).

A tensor contribution stays on its device: it is added to a float64 running value there, and the host reads the
values once, in :meth:`reduce`, so the micro-batch loop never waits for the device. The running values are added in
contribution order, in float64, exactly as Python floats would be, so the results are those of summing ``float(v)``.
"""

from __future__ import annotations

import torch

from async_rl.learner.dist import DistContext

__all__ = ["MetricAccumulator"]

Value = float | torch.Tensor


def _add(acc: Value, value: Value) -> Value:
    """``acc + value`` in float64; a tensor stays on its device (a Python float rides along as a kernel argument)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.float64) + acc
    return acc + float(value)


def _pick(acc: Value, value: Value, largest: bool) -> Value:
    """Python's ``max(acc, value)`` / ``min(acc, value)``: ``value`` replaces ``acc`` only when strictly beyond it."""
    if isinstance(value, torch.Tensor):
        value = value.detach().to(torch.float64)
        if isinstance(acc, torch.Tensor):
            value = value.to(acc.device)
        return torch.where(value > acc if largest else value < acc, value, acc)
    value = float(value)
    if isinstance(acc, torch.Tensor):
        return torch.where(acc < value if largest else acc > value, value, acc)
    return value if (value > acc if largest else value < acc) else acc


def _stack(values: list[Value], device: torch.device) -> torch.Tensor:
    """One float64 tensor on ``device`` from Python floats and device scalars (no host round trip for the latter)."""
    return torch.stack([torch.as_tensor(v, dtype=torch.float64).to(device).reshape(()) for v in values])


class MetricAccumulator:
    """Collects metric contributions; :meth:`reduce` returns ``{key: float}`` identical on all ranks."""

    def __init__(self) -> None:
        self._sum: dict[str, Value] = {}
        self._den: dict[str, Value] = {}
        self._max: dict[str, Value] = {}
        self._min: dict[str, Value] = {}
        self._totals: set[str] = set()

    def _accumulate(self, key: str, numerator: Value, denominator: Value) -> None:
        self._sum[key] = _add(self._sum.get(key, 0.0), numerator)
        self._den[key] = _add(self._den.get(key, 0.0), denominator)

    def mean(self, key: str, value: Value) -> None:
        self._accumulate(key, value, 1.0)

    def ratio(self, key: str, numerator: Value, denominator: Value) -> None:
        self._accumulate(key, numerator, denominator)

    def total(self, key: str, value: Value) -> None:
        self._accumulate(key, value, 0.0)
        self._totals.add(key)

    def max(self, key: str, value: Value) -> None:
        self._max[key] = _pick(self._max.get(key, float("-inf")), value, largest=True)

    def min(self, key: str, value: Value) -> None:
        self._min[key] = _pick(self._min.get(key, float("inf")), value, largest=False)

    def reduce(self, ctx: DistContext) -> dict[str, float]:
        """All-reduce every metric over the ranks (one collective per kind) and read them on the host once."""
        out: dict[str, float] = {}
        keys = sorted(self._sum)
        if keys:
            values = [v for k in keys for v in (self._sum[k], self._den[k])]
            t = ctx.all_reduce(_stack(values, ctx.device).reshape(len(keys), 2), "sum")
            for k, (s, d) in zip(keys, t.tolist(), strict=True):
                # a mean counts 1 per contribution, so it is a ratio too; totals ignore the denominator
                out[k] = s if k in self._totals else (s / d if d else float("nan"))
        for store, op in ((self._max, "max"), (self._min, "min")):
            ks = sorted(store)
            if ks:
                t = ctx.all_reduce(_stack([store[k] for k in ks], ctx.device), op)
                out.update(zip(ks, t.tolist(), strict=True))
        return out
