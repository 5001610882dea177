"""DAPO dynamic sampling ("filter groups", verl's ``algorithm.filter_groups``) done on the rollout plane.

A GRPO group whose metric is the same for all n completions has zero advantage everywhere: it costs a training slot
and teaches nothing. With ``algorithm.filter_groups.enable``, the coordinator drops such TRAINING groups as they
arrive and grants other prompts in their place, so each step still trains ``groups_per_step``
(= ``data.train_batch_size``) informative groups.

The metric: ``"reward"`` is each completion's scalar reward (``Completion.reward``); any other name is a reward
component, ``Completion.reward_components[name]``. A group is constant when every completion's value is EXACTLY equal
to the first one's (no float tolerance; verl's ``std == 0`` test can keep a constant group when the mean rounds). A
group of one completion is never constant (config validation refuses ``enable`` with ``rollout.n == 1``). Eval
groups (transport.evaluation) are never filtered.

A missing component is a defect of that group, judged like any other by transport.validation: the group is refused
as ``invalid`` (``transport/drops/invalid_missing_filter_metric``), its prompt granted again, and the sender takes a
strike towards quarantine (``max_invalid_groups``). The first such group is logged with the components it did carry,
so a misspelt metric is visible at once.

Where a filtered group goes (transport.ledger): the group passed validation and the staleness bound, so the actor is
acked ``accepted``; its prompt becomes DONE as ``filtered`` (``Ledger.filter``): settled for good, never trained,
never granted again, not handed to the learner, counted in ``filtered_total``. The ledger's accounting identity
becomes ``trained_total + filtered_total + dropped_total + leased + received + taken + regrant == data cursor``;
the learner's audit log (``trained_groups.jsonl``) lists trained prompts only, so a filtered prompt is in neither it
nor any later step. Its lease and its in-flight slot are released on arrival, so admission (the flat cap and the
staleness look-ahead, which count leased + buffered groups) grants a replacement at once: re-granted prompts first,
then new data from the cursor. Epochs: prompt ids run on across epochs, so a filtered prompt id is consumed for ITS
epoch; the same record comes back, under a new id, in the next epoch (and may be informative by then). A run whose
length is derived from the data therefore runs out of prompts sooner, and ends with the learner's "data exhausted"
warning.

Steps and the generation budget: a filtered group is counted towards the step the buffer is filling when it arrives
(``received // groups_per_step`` steps after the one the learner takes next), and that count is the step's
``filtered_groups`` when the learner takes it. With ``max_num_gen_batches = M > 0``, a step that has used
``M x groups_per_step`` prompts (filtered ones plus the informative ones buffered for it) while still short of
``groups_per_step`` informative groups would need more than M generation batches: the coordinator stops granting
training work and every later ``get_groups`` raises `FilterBudgetExceeded` in the learner, as verl raises "too many
generated batches". Once the data is exhausted no budget is checked (the step is short because the data ended; the
learner drops it). The unit is a prompt whose group came back, not a grant: the async plane grants ahead of the step
(up to the in-flight cap), so counting grants would trip at start-up with no filtering at all.

Metrics (``transport/filter/...``, always reported, zero when filtering is off):

    filtered_groups           groups filtered for the step most recently handed to the learner
    filtered_fraction         filtered_groups / (filtered_groups + groups trained in that step); 0 when both are 0
    grants_per_trained_group  CUMULATIVE: training leases issued whose outcome is known (all but those still out and
                              those of groups buffered, not yet trained) per trained group; 1.0 when every grant was
                              trained, 1 / (1 - f) with a filtered fraction f, more with lease expiries, invalid or
                              stale groups. 0 before the first trained group. Restored with the ledger on resume.
    filtered_total            CUMULATIVE filtered prompts (the ledger's), restored on resume

Resume: ``Ledger.state_dict`` keeps ``filtered_total`` and the DONE ids (a filtered prompt is never granted again);
`GroupFilter.state_dict` keeps the per-step counts, so the budget and ``filtered_groups`` of the step in progress
carry over. Pure logic: no sockets, threads or clocks.
"""

from __future__ import annotations

from typing import Any

from async_rl import metric_catalog as mc
from async_rl.config.algorithm import FilterGroupsConfig
from async_rl.transport.protocol import RolloutGroup

STATE_FORMAT = 1
REWARD_METRIC = "reward"  # the metric naming a completion's scalar reward; any other name is a reward component


class FilterBudgetExceeded(RuntimeError):
    """A training step used its whole generation budget (``max_num_gen_batches``) without filling."""


def metric_values(group: RolloutGroup, metric: str) -> list[float]:
    """The metric of each completion (a validated group: a component metric is present in every completion)."""
    if metric == REWARD_METRIC:
        return [float(c.reward) for c in group.completions]
    return [float((c.reward_components or {})[metric]) for c in group.completions]


def is_constant(values: list[float]) -> bool:
    """Zero variance: at least two values, all exactly equal (NaN is never equal, so never constant)."""
    return len(values) >= 2 and all(v == values[0] for v in values)


class GroupFilter:
    """Decides which training groups are filtered and keeps the per-step counts and the generation budget."""

    def __init__(self, settings: FilterGroupsConfig, groups_per_step: int, n: int) -> None:
        """``settings``: the ``algorithm.filter_groups`` section (validated with the config)."""
        if isinstance(groups_per_step, bool) or not isinstance(groups_per_step, int) or groups_per_step < 1:
            raise ValueError(f"groups_per_step must be an int >= 1, got {groups_per_step!r}")
        if settings.enable and settings.metric is None:
            raise ValueError("algorithm.filter_groups.enable=true needs algorithm.filter_groups.metric")
        self.settings = settings
        # the generation budget in batches of one step's groups; 0 means unlimited
        self.limit_batches = max(0, settings.max_num_gen_batches) if settings.enable else 0
        self.groups_per_step = groups_per_step
        self.n = n
        self.active = settings.enable and n >= 2  # one completion has no variance to judge: never filtered
        # pending[j]: groups filtered for the j-th step the learner will take from now (0: the next one)
        self.pending: list[int] = []
        self.last_filtered = 0  # counts of the step most recently taken
        self.last_taken = 0

    @property
    def metric(self) -> str | None:
        return self.settings.metric if self.active else None

    @property
    def required_component(self) -> str | None:
        """The reward component every training group must carry (None: nothing is required)."""
        metric = self.metric
        return None if metric is None or metric == REWARD_METRIC else metric

    def should_filter(self, group: RolloutGroup) -> bool:
        metric = self.metric
        return metric is not None and is_constant(metric_values(group, metric))

    def on_filtered(self, buffered: int) -> None:
        """One group filtered while ``buffered`` informative groups wait in the coordinator's buffer."""
        j = buffered // self.groups_per_step
        while len(self.pending) <= j:
            self.pending.append(0)
        self.pending[j] += 1

    def on_take(self, taken: int) -> None:
        """The learner took ``taken`` groups: that step's counts become the reported ones."""
        self.last_filtered = self.pending.pop(0) if self.pending else 0
        self.last_taken = taken

    def budget_error(self, buffered: int) -> str | None:
        """Why the step being filled can no longer fill within ``max_num_gen_batches`` (None: it still can)."""
        limit = self.limit_batches
        if not self.active or limit <= 0:
            return None
        b = self.groups_per_step
        j = buffered // b
        informative = buffered - j * b  # < b: this step is not full yet
        filtered = self.pending[j] if j < len(self.pending) else 0
        used = filtered + informative
        if used < limit * b:
            return None
        key = f"algorithm.filter_groups.max_num_gen_batches={self.settings.max_num_gen_batches}"
        return (
            f"too many generated batches: {key} allows {limit} x data.train_batch_size={b} = {limit * b} prompts per"
            f" training step, and {used} have come back for this step, {filtered} of them filtered (metric"
            f" {self.settings.metric!r} equal across all n={self.n} completions), with only {informative} of the {b}"
            " informative groups the step needs; the data may be too hard or too easy for the policy: raise"
            " max_num_gen_batches, or set it to 0 for no limit"
        )

    def metrics(self, trained_total: int, grants_settled: int, filtered_total: int) -> dict[str, float | int]:
        f, t = self.last_filtered, self.last_taken
        return {
            mc.TRANSPORT_FILTER_FILTERED_GROUPS: f,
            mc.TRANSPORT_FILTER_FILTERED_FRACTION: f / (f + t) if f + t else 0.0,
            mc.TRANSPORT_FILTER_GRANTS_PER_TRAINED_GROUP: grants_settled / trained_total if trained_total else 0.0,
            mc.TRANSPORT_FILTER_FILTERED_TOTAL: filtered_total,
        }

    # ---- persistence ---------------------------------------------------------------------------------------------
    def state_dict(self, taken_outstanding: bool) -> dict[str, Any]:
        """``taken_outstanding``: groups were taken but not trained; the ledger saves them as buffered, the resumed
        learner takes that step again, so its filtered count goes back to the front of the queue."""
        pending = ([self.last_filtered] if taken_outstanding else []) + list(self.pending)
        return {"format": STATE_FORMAT, "pending": pending, "last": [self.last_filtered, self.last_taken]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"filter state must be a dict with format={STATE_FORMAT}")
        pending, last = _ints(state.get("pending")), _ints(state.get("last"))
        if pending is None or last is None or len(last) != 2:
            raise ValueError(f"filter state needs 'pending' (a list of ints >= 0) and 'last' (two), got {state!r}")
        self.pending = pending
        self.last_filtered, self.last_taken = last


def _ints(values: object) -> list[int] | None:
    """``values`` as a list of ints >= 0, or None when it is not one."""
    if not isinstance(values, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in values
    ):
        return None
    return [int(x) for x in values]


__all__ = ["FilterBudgetExceeded", "GroupFilter", "is_constant", "metric_values"]
