"""MetricAccumulator: values stay on the device until the step's reduce, with the results of summing Python floats.

The reference below is the accumulator as it was before (one ``float()`` per contribution, a host sync each); the
new one must give bit-identical results on the contributions of real learner steps, and the catalog must name every
key those steps report, with the reduction the accumulator applied.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import pytest
import torch
from _learner_testlib import START, scripted_groups, settings, tiny_critic, tiny_policy

import async_rl.learner.step as step_mod
from async_rl.learner import Learner, local_context
from async_rl.learner.dist import DistContext
from async_rl.learner.metrics import MetricAccumulator
from async_rl.metric_catalog import find, unknown_keys


class ReferenceAccumulator:
    """The former implementation: a Python float per contribution."""

    def __init__(self) -> None:
        self._sum: dict[str, float] = defaultdict(float)
        self._den: dict[str, float] = defaultdict(float)
        self._max: dict[str, float] = {}
        self._min: dict[str, float] = {}
        self._totals: set[str] = set()

    def mean(self, key: str, value: Any) -> None:
        self._sum[key] += float(value)
        self._den[key] += 1.0

    def ratio(self, key: str, numerator: Any, denominator: Any) -> None:
        self._sum[key] += float(numerator)
        self._den[key] += float(denominator)

    def total(self, key: str, value: Any) -> None:
        self._sum[key] += float(value)
        self._den[key] += 0.0
        self._totals.add(key)

    def max(self, key: str, value: Any) -> None:
        self._max[key] = max(self._max.get(key, float("-inf")), float(value))

    def min(self, key: str, value: Any) -> None:
        self._min[key] = min(self._min.get(key, float("inf")), float(value))

    def reduce(self, ctx: DistContext) -> dict[str, float]:
        out: dict[str, float] = {}
        for k in sorted(self._sum):
            s, d = self._sum[k], self._den[k]
            out[k] = s if k in self._totals else (s / d if d else float("nan"))
        out.update(self._max)
        out.update(self._min)
        return out


class Recording(MetricAccumulator):
    """A MetricAccumulator that also remembers every call, to replay into the reference."""

    made: list[Recording] = []

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str, tuple[Any, ...]]] = []
        Recording.made.append(self)

    def mean(self, key: str, value: Any) -> None:
        self.calls.append(("mean", key, (value,)))
        super().mean(key, value)

    def ratio(self, key: str, numerator: Any, denominator: Any) -> None:
        self.calls.append(("ratio", key, (numerator, denominator)))
        super().ratio(key, numerator, denominator)

    def total(self, key: str, value: Any) -> None:
        self.calls.append(("total", key, (value,)))
        super().total(key, value)

    def max(self, key: str, value: Any) -> None:
        self.calls.append(("max", key, (value,)))
        super().max(key, value)

    def min(self, key: str, value: Any) -> None:
        self.calls.append(("min", key, (value,)))
        super().min(key, value)


def _same(a: dict[str, float], b: dict[str, float]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert (math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k], (k, a[k], b[k])  # bit for bit


def test_hand_checked_reductions() -> None:
    acc = MetricAccumulator()
    for v in (torch.tensor(1.0), 2.0, torch.tensor(6.0)):
        acc.mean("m", v)  # (1 + 2 + 6) / 3 = 3
    acc.ratio("r", torch.tensor(3.0), torch.tensor(2.0))
    acc.ratio("r", 5.0, 6.0)  # (3 + 5) / (2 + 6) = 1
    acc.total("t", torch.tensor(0.5))
    acc.total("t", 2)  # 2.5
    for v in (torch.tensor(-1.0), 4.0, torch.tensor(3.0)):
        acc.max("hi", v)  # 4
        acc.min("lo", v)  # -1
    assert acc.reduce(local_context(torch.device("cpu"))) == {"m": 3.0, "r": 1.0, "t": 2.5, "hi": 4.0, "lo": -1.0}
    assert MetricAccumulator().reduce(local_context(torch.device("cpu"))) == {}


def test_same_results_as_python_floats_on_awkward_values() -> None:
    # float32 values whose float64 sums round differently by order, ints, NaN and infinities, 0-d and 1-element
    g = torch.Generator().manual_seed(3)
    values: list[Any] = [*(torch.randn((), generator=g) * 10 ** float(e) for e in range(-8, 9)), 7, 0.1, 1e16, -1e16]
    values += [torch.tensor([0.3]), torch.tensor(float("inf")), torch.tensor(float("nan")), -0.0, float("-inf")]
    new, ref = MetricAccumulator(), ReferenceAccumulator()
    for i, v in enumerate(values):
        for acc in (new, ref):
            acc.mean("mean", v)
            acc.ratio("ratio", v, torch.tensor(float(i % 3)))
            acc.total("total", v)
            acc.max("max", v)
            acc.min("min", v)
            if i < 17:  # finite only
                acc.mean("finite", v)
                acc.max("finite_max", v)
    ctx = local_context(torch.device("cpu"))
    _same(new.reduce(ctx), ref.reduce(ctx))


def test_no_host_sync_before_reduce(monkeypatch: pytest.MonkeyPatch) -> None:
    def sync(*_args: Any, **_kw: Any) -> Any:
        raise AssertionError("a host read of a device value before reduce")

    acc = MetricAccumulator()
    values = [torch.tensor(x) for x in (0.25, -2.0, 5.0)]
    with monkeypatch.context() as m:
        for name in ("__float__", "item", "tolist", "__bool__", "__index__", "__int__"):
            m.setattr(torch.Tensor, name, sync)
        for v in values:
            acc.mean("m", v)
            acc.ratio("r", v, v.abs())
            acc.total("t", v)
            acc.max("hi", v)
            acc.min("lo", v)
    out = acc.reduce(local_context(torch.device("cpu")))
    assert out == {"m": 3.25 / 3, "r": 3.25 / 7.25, "t": 3.25, "hi": 5.0, "lo": -2.0}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_values_stay_on_the_device_and_reduce_identically() -> None:
    device = torch.device("cuda")
    new, ref = MetricAccumulator(), ReferenceAccumulator()
    g = torch.Generator().manual_seed(5)
    for _ in range(64):
        v = (torch.randn((), generator=g) * 3).to(device)
        for acc in (new, ref):
            acc.mean("m", v)
            acc.ratio("r", v, v.abs() + 1)
            acc.max("hi", v)
            acc.min("lo", v)
            acc.total("t", 1.5)
    assert all(t.device.type == "cuda" for t in (new._sum["m"], new._max["hi"]))  # type: ignore[union-attr]
    ctx = local_context(device)
    _same(new.reduce(ctx), ref.reduce(ctx))


# (name, settings overrides, critic): one step per case
REAL_STEPS = [
    # one mini-batch, so the proximal pass is skipped and the IS weights (and their max/min) come per micro-batch
    ("reuse_proximal", {"ppo_mini_batch_size": 4, "rollout_is": "token", "use_kl_loss": True}, False),
    # PPO with a critic, two mini-batches, decoupled rollout correction and rejection sampling on the whole batch
    (
        "critic",
        {
            "adv_estimator": "gae",
            "critic": dict(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2),
            "rollout_rs": "token_k1",
            "rollout_rs_threshold": 2.0,
        },
        True,
    ),
]


@pytest.mark.parametrize(("name", "overrides", "with_critic"), REAL_STEPS, ids=[c[0] for c in REAL_STEPS])
def test_a_real_step_reduces_as_before_and_reports_catalogued_keys(
    name: str, overrides: dict[str, Any], with_critic: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(step_mod, "MetricAccumulator", Recording)
    Recording.made.clear()
    kw = {"critic": tiny_critic} if with_critic else {}
    learner = Learner(settings(**overrides), START, local_context(), tiny_policy, **kw)
    metrics = learner.train_step(*scripted_groups(4, 4, seed=11))
    (acc,) = Recording.made
    assert len(acc.calls) > 20  # micro-batches x metrics: a real workload
    ref = ReferenceAccumulator()
    for kind, key, args in acc.calls:
        getattr(ref, kind)(key, *args)
    _same(acc.reduce(learner.ctx), ref.reduce(learner.ctx))

    # the step's keys are all in the catalog, with the reduction the accumulator applied
    assert unknown_keys(metrics, "step") == []
    expected = {"ratio": {"token_mean"}, "max": {"max"}, "min": {"min"}, "mean": {"mean", "update_mean", "last"}}
    for kind, key, _ in acc.calls:
        entry = find(key, "step")
        if kind == "total":
            assert entry is None, key  # sums the step turns into other metrics (pg_loss, padding_waste, offpolicy/ess)
            continue
        assert entry is not None and entry.reduction in expected[kind], (name, kind, key, entry)
