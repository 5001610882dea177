"""Every metric the system reports, in one place: its key, how its value is reduced, and what it means.

A key is either exact (``learner/actor/pg_loss``) or a family with ``{placeholders}`` for a part that varies
(``rollout/finish/{reason}``, ``transport/staleness/{lag}``); a placeholder stands for one path segment, never a
``/``, except a data source's or a reward component's name (``{source}``, ``{component}``), which may hold one. Each
metric belongs to one or more *records*: the ``step`` and ``val`` lines of ``<run dir>/metrics.jsonl`` (written by the
learner's rank 0, ``runtime/metrics.py``), the JSON line an actor prints when it exits (``actor``), or the actor's
rollout-client counters (``client``).

The metrics tables of docs/metrics.md are this catalog printed (``python -m async_rl.metric_catalog --update-doc
docs/metrics.md`` writes them between their marker comments; ``--markdown step`` prints one), a test keeps the two
equal, and the end-to-end tests fail on any logged key the catalog does not name; ``--check RUN/metrics.jsonl`` does
the same for a run.

Every key is written here and nowhere else: an exact key is a module constant (``LEARNER_ACTOR_PG_LOSS``), a family a
`Family` builder (``rollout_finish_reason_key("stop")``), and the learner files the metrics its algorithms name with
:func:`learner_key`, :func:`learner_actor_key` and :func:`learner_rollout_corr_key`. Producers and readers (plot,
console, tools) import them, so a key that is renamed or misspelt fails on import instead of silently plotting
nothing; a test forbids key literals of the namespaces anywhere else.

Staleness is also defined here, once (:func:`staleness`, :func:`lag_histogram`, :func:`histogram_mean`), for the
three places that report it: the step's rollouts, the learner's batch and the coordinator's running totals.

Torch-free and dependency-free: the config and the tools import it without starting anything.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from async_rl.staleness import staleness

__all__ = [
    "METRICS",
    "RECORDS",
    "RECORD_FIELDS",
    "REDUCTIONS",
    "Family",
    "Metric",
    "find",
    "histogram_mean",
    "lag_histogram",
    "learner_actor_key",
    "learner_distillation_key",
    "learner_key",
    "learner_rollout_corr_key",
    "markdown",
    "metric_key",
    "doc_blocks",
    "record_kind",
    "staleness",
    "unknown_keys",
    "update_doc",
]

# How a metric's value is made from its parts. MetricAccumulator (learner/metrics.py) implements the first five.
REDUCTIONS: dict[str, str] = {
    "mean": "mean over the step's micro-batches on all ranks (a value computed once for the batch is its own mean)",
    "token_mean": "mean over all tokens of the step's micro-batches on all ranks (token-weighted)",
    "update_mean": "mean over the step's optimizer updates (skipped non-finite updates left out)",
    "max": "largest over the step's micro-batches on all ranks",
    "min": "smallest over the step's micro-batches on all ranks",
    "batch": "computed once from the whole batch of the step (every sample or group it trained)",
    "step": "one value of the step: a count, a duration, a version, a setting",
    "last": "the value at the end of the step",
    "gauge": "the current value when the record is written",
    "cumulative": "total since the process that counts it started (the learner, its coordinator, an actor)",
    "rate": "per second, over the interval since the previous record",
    "round": "over every sample of one validation round",
}

# Where a metric appears (see the module docstring).
RECORDS: dict[str, str] = {
    "step": "a training step's line in metrics.jsonl",
    "val": "a validation round's line in metrics.jsonl (it carries val/version), at the step of the version evaluated",
    "actor": "the JSON line an actor prints when it exits (its totals)",
    "client": "RolloutClient.metrics(), the actor's side of the rollout plane (read by tests; no sink logs it yet)",
    "rm": "a reward-model training step's line in metrics.jsonl (the rm/eval/ keys on the steps that evaluate)",
    "sft": "a supervised fine-tuning step's line in metrics.jsonl (the sft/val/ keys on the steps that validate)",
    "rs": "a rejection-sampling job's line in metrics.jsonl, one per batch of data.train_batch_size prompt groups",
}

# Fields of a metrics.jsonl line that are not metrics.
RECORD_FIELDS = ("step",)

_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
# Placeholders for names that come from the data or a user's reward function, not from this code: they may hold a
# ``/`` (verl's data source ``openai/gsm8k``), so they stand for one or more segments.
_FREE_TEXT = frozenset({"source", "component"})


@dataclass(frozen=True)
class Metric:
    """One key (or key family) with its reduction (a `REDUCTIONS` name), its one-line meaning and its records."""

    key: str
    reduction: str
    meaning: str
    records: tuple[str, ...] = ("step",)

    @property
    def is_family(self) -> bool:
        return _PLACEHOLDER.search(self.key) is not None

    def pattern(self) -> re.Pattern[str]:
        """The regex of the keys this entry names (see `_pattern`)."""
        return _pattern(self.key)


def _pattern(template: str) -> re.Pattern[str]:
    """The regex of a template's keys: a placeholder is a group of one or more characters other than ``/`` (a
    free-text one, ``source`` or ``component``, of any characters)."""
    parts = _PLACEHOLDER.split(template)  # literal, name, literal, name, ...
    return re.compile(
        "".join(re.escape(p) if i % 2 == 0 else ("(.+)" if p in _FREE_TEXT else "([^/]+)") for i, p in enumerate(parts))
    )


@dataclass(frozen=True)
class Family:
    """The builder of a key family's keys: ``rollout_finish_reason_key("stop")`` is ``rollout/finish/stop``.

    Called with one value per placeholder, in the template's order; each must be one path segment (not empty, no
    ``/``; a free-text ``source`` or ``component`` may hold a ``/``), else ValueError."""

    template: str

    @property
    def placeholders(self) -> tuple[str, ...]:
        return tuple(_PLACEHOLDER.findall(self.template))

    def __call__(self, *values: object) -> str:
        names = self.placeholders
        if len(values) != len(names):
            raise TypeError(f"{self.template} takes {len(names)} value(s) ({', '.join(names)}), got {len(values)}")
        parts = {name: str(value) for name, value in zip(names, values, strict=True)}
        for name, text in parts.items():
            if not text or ("/" in text and name not in _FREE_TEXT):
                raise ValueError(f"{name}={text!r} is not one path segment of {self.template}")
        return self.template.format_map(parts)

    @cached_property
    def _regex(self) -> re.Pattern[str]:
        return _pattern(self.template)

    def parse(self, key: str) -> tuple[str, ...] | None:
        """The placeholders' values of ``key`` (in the template's order), or None when ``key`` is not of this family:
        ``val_source_reward_mean_key.parse("val/arith/reward_mean")`` is ``("arith",)``."""
        match = self._regex.fullmatch(key)
        return None if match is None else match.groups()

    def matches(self, key: str) -> bool:
        return self.parse(key) is not None


# The catalog in the order of docs/metrics.md; _m and _f add to it, and return what producers and readers use.
_ENTRIES: list[Metric] = []


def _m(key: str, reduction: str, meaning: str, *records: str) -> str:
    """Catalogue an exact key; returns the key (a module constant named after it)."""
    assert not _PLACEHOLDER.search(key), key
    _ENTRIES.append(Metric(key, reduction, meaning, records or ("step",)))
    return key


def _f(template: str, reduction: str, meaning: str, *records: str) -> Family:
    """Catalogue a key family; returns its builder (a module attribute named after it, ending in ``_key``)."""
    assert _PLACEHOLDER.search(template), template
    _ENTRIES.append(Metric(template, reduction, meaning, records or ("step",)))
    return Family(template)


# ---------------------------------------------------------------------------------------------------- the keys
# Every key of the system is defined here, once. An exact key is a constant named after it: upper case, each run of
# characters other than letters and digits an underscore (``learner/actor/pg_loss``: LEARNER_ACTOR_PG_LOSS). A family
# is a `Family` named the same way in lower case with ``_key`` appended, its placeholders' names included
# (``rollout/finish/{reason}``: rollout_finish_reason_key). Producers and readers import these; a test forbids
# namespace literals anywhere else (tests/test_metric_keys_defined_once.py).

# ---- the rollouts trained this step (runtime/rollout_metrics.py)
ROLLOUT_REWARD_MEAN = _m("rollout/reward_mean", "batch", "mean reward of the completions trained this step")
rollout_reward_component_key = _f(
    "rollout/reward/{component}", "batch", "mean of one named reward component over the same completions"
)
ROLLOUT_RESPONSE_LENGTH_MEAN = _m("rollout/response_length_mean", "batch", "mean completion length, in tokens")
ROLLOUT_GENERATED_TOKENS = _m("rollout/generated_tokens", "batch", "completion tokens trained this step")
ROLLOUT_GROUP_GENERATE_S_MEAN = _m(
    "rollout/group_generate_s_mean", "batch", "mean seconds an actor spent generating one group"
)
rollout_finish_reason_key = _f(
    "rollout/finish/{reason}", "batch", "share of completions that ended for this reason (`stop`, `length`, ...)"
)
ROLLOUT_EOS_FRACTION = _m(
    "rollout/eos_fraction", "batch", "share of completions whose last token is the tokenizer's EOS"
)
ROLLOUT_STALENESS_MEAN = _m(
    "rollout/staleness_mean", "batch", "mean staleness of the step's groups: versions behind the weights trained"
)
ROLLOUT_STALENESS_MAX = _m("rollout/staleness_max", "batch", "largest staleness of the step's groups")
rollout_staleness_hist_lag_key = _f(
    "rollout/staleness_hist/{lag}", "batch", "share of the step's groups with this staleness"
)
ROLLOUT_VERSION_SPAN_MEAN = _m(
    "rollout/version_span_mean", "batch", "mean versions a completion spanned (weights updated while it ran)"
)
ROLLOUT_VERSION_SPAN_MAX = _m("rollout/version_span_max", "batch", "largest version span of a completion")
ROLLOUT_NUM_TURNS_MEAN = _m("rollout/num_turns_mean", "batch", "multi-turn: mean model turns per episode")
ROLLOUT_NUM_TURNS_MAX = _m("rollout/num_turns_max", "batch", "multi-turn: most model turns in one episode")
ROLLOUT_TURN_LENGTH_MEAN = _m(
    "rollout/turn_length_mean", "batch", "multi-turn: mean tokens the model sampled in one turn"
)
ROLLOUT_SAMPLED_TOKENS_MEAN = _m(
    "rollout/sampled_tokens_mean", "batch", "multi-turn: mean sampled (trained) tokens per episode"
)
ROLLOUT_TOOL_CALLS_MEAN = _m("rollout/tool_calls_mean", "batch", "multi-turn: mean tool calls per episode")
ROLLOUT_TOOL_ERRORS = _m(
    "rollout/tool_errors", "batch", "multi-turn: tool calls that failed (unparseable, unknown tool, error, timeout)"
)
ROLLOUT_TEMPLATE_MISMATCHES = _m(
    "rollout/template_mismatches", "batch", "multi-turn: episodes whose text differs from the whole-chat rendering"
)
ROLLOUT_RETOKENIZATION_DRIFT = _m(
    "rollout/retokenization_drift",
    "batch",
    "multi-turn: episodes whose sampled tokens differ from re-encoding their text (trained as sampled)",
)
# ---- the learner's update (learner/step.py, update.py, critic.py)
LEARNER_ACTOR_PG_LOSS = _m("learner/actor/pg_loss", "update_mean", "policy-gradient loss of a mini-batch")
LEARNER_ACTOR_KL_LOSS = _m(
    "learner/actor/kl_loss", "update_mean", "KL loss against the reference policy (with `use_kl_loss`)"
)
LEARNER_ACTOR_LOSS = _m(
    "learner/actor/loss", "update_mean", "total loss of a mini-batch (policy gradient, entropy bonus, KL loss)"
)
LEARNER_ACTOR_GRAD_NORM = _m("learner/actor/grad_norm", "update_mean", "gradient norm before clipping")
LEARNER_ACTOR_LR = _m("learner/actor/lr", "last", "learning rate")
LEARNER_ACTOR_ENTROPY = _m("learner/actor/entropy", "token_mean", "entropy of the policy on the trained tokens")
LEARNER_ACTOR_PG_CLIPFRAC = _m(
    "learner/actor/pg_clipfrac",
    "mean",
    "share of tokens where the ratio clip was active (GMPO: with a positive advantage)",
)
LEARNER_ACTOR_PG_CLIPFRAC_LOWER = _m(
    "learner/actor/pg_clipfrac_lower",
    "mean",
    "share held by the dual clip (GMPO: clipped with a negative advantage; else 0)",
)
LEARNER_ACTOR_PPO_KL = _m("learner/actor/ppo_kl", "mean", "approximate KL between the proximal and the current policy")
LEARNER_ACTOR_STEP_KL = _m(
    "learner/actor/step_kl",
    "token_mean",
    "the step's real size: KL(policy before || policy after the step's optimizer updates), k3 estimate on the loss"
    " tokens of the sequences the update computed (with `actor.step_kl_freq`; the clip sees only one mini-batch's"
    " move)",
)
LEARNER_ACTOR_STEP_ABS_LOG_RATIO = _m(
    "learner/actor/step_abs_log_ratio",
    "token_mean",
    "mean |log pi_after - log pi_before| over the same tokens as learner/actor/step_kl",
)
LEARNER_ACTOR_PROXIMAL_PASS_SKIPPED = _m(
    "learner/actor/proximal_pass_skipped", "step", "1 when the proximal log-probs came from the update's forward"
)
LEARNER_ACTOR_SKIPPED_UPDATES = _m(
    "learner/actor/skipped_updates", "step", "optimizer updates skipped for a non-finite loss or gradient"
)
LEARNER_ACTOR_SKIPPED_TOTAL = _m(
    "learner/actor/skipped_total", "cumulative", "skipped optimizer updates since the run started"
)
LEARNER_CRITIC_LOSS = _m("learner/critic/loss", "update_mean", "value loss of a mini-batch (`adv_estimator: gae`)")
LEARNER_CRITIC_GRAD_NORM = _m("learner/critic/grad_norm", "update_mean", "critic gradient norm before clipping")
LEARNER_CRITIC_LR = _m("learner/critic/lr", "last", "critic learning rate")
LEARNER_CRITIC_VF_CLIPFRAC = _m(
    "learner/critic/vf_clipfrac", "mean", "share of value predictions clipped by `cliprange_value`"
)
LEARNER_CRITIC_VPRED_MEAN = _m("learner/critic/vpred_mean", "token_mean", "mean value prediction on the trained tokens")
LEARNER_CRITIC_SKIPPED_UPDATES = _m(
    "learner/critic/skipped_updates", "step", "critic updates skipped for a non-finite loss or gradient"
)
LEARNER_REWARD_KL_PENALTY = _m(
    "learner/reward_kl_penalty", "batch", "KL to the reference subtracted from the reward (`use_kl_in_reward`)"
)
LEARNER_REWARD_KL_PENALTY_COEFF = _m(
    "learner/reward_kl_penalty_coeff", "step", "the coefficient of that penalty this step"
)
# on-policy distillation (algorithms/distillation.py), per micro-batch; reverse_kl over the whole batch
LEARNER_DISTILLATION_REVERSE_KL = _m(
    "learner/distillation/reverse_kl",
    "batch",
    "mean of log pi_behaviour - log pi_teacher over the sampled tokens: k1 estimate of KL(student || teacher)",
)
LEARNER_DISTILLATION_LOSS = _m("learner/distillation/loss", "mean", "the distillation term of the actor's loss")
LEARNER_DISTILLATION_ABS_ESTIMATE = _m(
    "learner/distillation/abs_estimate", "mean", "mean |per-token estimate| of KL(student || teacher) (loss_mode)"
)
LEARNER_DISTILLATION_ESTIMATE_MAX = _m("learner/distillation/estimate_max", "max", "largest per-token estimate")
LEARNER_DISTILLATION_ESTIMATE_MIN = _m("learner/distillation/estimate_min", "min", "smallest per-token estimate")
LEARNER_DISTILLATION_PG_CLIPFRAC = _m(
    "learner/distillation/pg_clipfrac", "mean", "share of tokens clipped in the distillation term (policy gradient)"
)
LEARNER_DISTILLATION_PPO_KL = _m(
    "learner/distillation/ppo_kl", "mean", "the distillation term's ppo_kl (as learner/actor/ppo_kl)"
)
# rollout correction (algorithms/rollout_correction.py): whole batch, or per micro-batch without a proximal pass
LEARNER_ROLLOUT_CORR_ROLLOUT_IS_MEAN = _m(
    "learner/rollout_corr/rollout_is_mean", "mean", "mean importance weight pi_old / pi_rollout"
)
LEARNER_ROLLOUT_CORR_ROLLOUT_IS_MAX = _m("learner/rollout_corr/rollout_is_max", "max", "largest importance weight")
LEARNER_ROLLOUT_CORR_ROLLOUT_IS_MIN = _m("learner/rollout_corr/rollout_is_min", "min", "smallest importance weight")
LEARNER_ROLLOUT_CORR_ROLLOUT_IS_EFF_SAMPLE_SIZE = _m(
    "learner/rollout_corr/rollout_is_eff_sample_size", "mean", "effective sample size of the weights, in (0, 1]"
)
LEARNER_ROLLOUT_CORR_ROLLOUT_IS_RATIO_FRACTION_HIGH = _m(
    "learner/rollout_corr/rollout_is_ratio_fraction_high", "mean", "share of ratios above the upper threshold"
)
LEARNER_ROLLOUT_CORR_ROLLOUT_IS_RATIO_FRACTION_LOW = _m(
    "learner/rollout_corr/rollout_is_ratio_fraction_low", "mean", "share of ratios below the lower threshold"
)
LEARNER_ROLLOUT_CORR_ROLLOUT_IS_OOB_RATIO = _m(
    "learner/rollout_corr/rollout_is_oob_ratio", "mean", "share of tokens zeroed outside the bounds (IcePop)"
)
LEARNER_ROLLOUT_CORR_ROLLOUT_IS_BATCH_NORM_FACTOR = _m(
    "learner/rollout_corr/rollout_is_batch_norm_factor", "mean", "the mean the weights were divided by"
)
LEARNER_ROLLOUT_CORR_ROLLOUT_RS_MASKED_FRACTION = _m(
    "learner/rollout_corr/rollout_rs_masked_fraction", "mean", "share of tokens removed by rejection sampling"
)
LEARNER_ROLLOUT_CORR_ROLLOUT_RS_SEQ_MASKED_FRACTION = _m(
    "learner/rollout_corr/rollout_rs_seq_masked_fraction", "mean", "share of sequences with a rejected token"
)
learner_rollout_corr_rollout_rs_option_masked_fraction_key = _f(
    "learner/rollout_corr/rollout_rs_{option}_masked_fraction", "mean", "the same, for one rejection option"
)
learner_rollout_corr_rollout_rs_option_seq_masked_fraction_key = _f(
    "learner/rollout_corr/rollout_rs_{option}_seq_masked_fraction", "mean", "the same per sequence, one option"
)
# the step's batch
LEARNER_BATCH_SIZE = _m("learner/batch/size", "batch", "completions trained this step")
LEARNER_BATCH_REWARD_MEAN = _m(
    "learner/batch/reward_mean", "batch", "mean reward (sum of token-level scores) of the trained completions"
)
LEARNER_BATCH_RESPONSE_LENGTH_MEAN = _m(
    "learner/batch/response_length_mean", "batch", "mean response length, in tokens"
)
LEARNER_BATCH_SAMPLED_LENGTH_MEAN = _m(
    "learner/batch/sampled_length_mean",
    "batch",
    "mean number of response tokens the model sampled (multi-turn: without the observation tokens)",
)
LEARNER_BATCH_ADVANTAGES_MEAN = _m(
    "learner/batch/advantages_mean", "batch", "mean advantage over the tokens in the loss"
)
LEARNER_BATCH_ADVANTAGES_MAX = _m(
    "learner/batch/advantages_max", "batch", "largest advantage over the tokens in the loss"
)
LEARNER_BATCH_ADVANTAGES_MIN = _m(
    "learner/batch/advantages_min", "batch", "smallest advantage over the tokens in the loss"
)
LEARNER_BATCH_INFORMATIVE_GROUPS = _m(
    "learner/batch/informative_groups", "batch", "groups whose rewards differ (the others get zero advantage)"
)
LEARNER_BATCH_ZERO_ADVANTAGE_SHARE = _m(
    "learner/batch/zero_advantage_share",
    "batch",
    "share of the step's groups whose rewards are all equal (no group-relative signal): 1 - informative / groups",
)
LEARNER_BATCH_SKIPPED_SEQUENCES = _m(
    "learner/batch/skipped_sequences",
    "batch",
    "sequences with all-zero advantages that the actor update left out of its forward and backward (their loss and"
    " gradient are zero: `actor.skip_zero_advantage`)",
)
LEARNER_BATCH_TRUNCATED_MASKED = _m(
    "learner/batch/truncated_masked",
    "batch",
    "truncated responses (finish reason `length`) left out of the loss (`mask_truncated_responses`)",
)
LEARNER_BATCH_INVALID_GROUPS = _m(
    "learner/batch/invalid_groups",
    "batch",
    "groups dropped for a token id outside the vocabulary (normally 0: the coordinator refuses them)",
)
LEARNER_BATCH_PADDING_WASTE = _m(
    "learner/batch/padding_waste", "batch", "share of the computed token slots that were padding"
)
LEARNER_BATCH_TOKENS_COMPUTED = _m(
    "learner/batch/tokens_computed",
    "batch",
    "token slots the actor updates computed, padding included, over all ranks (with shared prompts each group's"
    " prompt counts once per micro-batch)",
)
LEARNER_BATCH_TOKEN_IMBALANCE = _m(
    "learner/batch/token_imbalance",
    "batch",
    "busiest rank's tokens over the mean rank's, minus 1 (mean over mini-batches)",
)
LEARNER_STALENESS_MEAN = _m(
    "learner/staleness/mean", "batch", "mean staleness of the trained completions: versions behind"
)
LEARNER_STALENESS_MAX = _m("learner/staleness/max", "batch", "largest staleness of a trained completion")
LEARNER_OFFPOLICY_ESS = _m(
    "learner/offpolicy/ess",
    "batch",
    "effective sample size of pi_proximal / pi_behaviour (learner vs actor policy) over the tokens",
)
LEARNER_OFFPOLICY_ABS_LOG_RATIO_MEAN = _m(
    "learner/offpolicy/abs_log_ratio_mean", "batch", "mean absolute log ratio of the proximal to the behaviour"
)
LEARNER_PERF_STEP_TIME_S = _m(
    "learner/perf/step_time_s", "step", "seconds of the learner step (log-prob passes and updates)"
)
LEARNER_PERF_UPDATE_TIME_S = _m("learner/perf/update_time_s", "step", "seconds of its optimizer updates")
LEARNER_PERF_TOKENS_PER_S = _m(
    "learner/perf/tokens_per_s", "step", "batch tokens (prompt and response) per second of the step"
)
LEARNER_PERF_UPDATE_TOKENS_PER_S = _m(
    "learner/perf/update_tokens_per_s", "step", "tokens computed by the updates per second of the updates"
)
LEARNER_VERSION = _m("learner/version", "step", "policy version after the step")
LEARNER_IDLE_FRACTION = _m(
    "learner/idle_fraction",
    "step",
    "share of the step spent waiting: for rollouts, and for a validation round to finish before publishing",
)
LEARNER_VALIDATION_WAIT_S = _m(
    "learner/validation_wait_s",
    "step",
    "seconds the step waited before publishing for the open validation round (of an older version) to finish;"
    " 0 unless the actors serve LoRA adapters (full weights are held back by the actors during a round instead)",
)
LEARNER_PEAK_MEMORY_MIB = _m(
    "learner/peak_memory_mib",
    "gauge",
    "the largest learner rank's peak memory so far (MiB): CUDA's peak allocation on a GPU, peak resident set on CPU",
)
# ---- the actor fleet, from the counters actors report about once a second (runtime/metrics.py ActorActivity)
ACTOR_GEN_TOKENS_PER_S = _m(
    "actor/gen_tokens_per_s",
    "rate",
    "the actor fleet's generation rate, tokens per second (from the counters actors report every second)",
)
ACTOR_IDLE_FRACTION = _m("actor/idle_fraction", "rate", "share of actor time with nothing to generate (same counters)")
# ---- weight sync (weight_sync/publisher.py), on the steps that publish
SYNC_SECONDS = _m("sync/seconds", "step", "seconds to publish the step's weights")
SYNC_BYTES = _m("sync/bytes", "step", "bytes of weights broadcast")
SYNC_WIRE_BITS = _m(
    "sync/wire_bits",
    "step",
    "bits per floating weight on the wire: 16 when every actor serves bf16/fp16 and the master is fp32, else as stored",
)
SYNC_BANDWIDTH_MBPS = _m("sync/bandwidth_MBps", "step", "broadcast bandwidth, MiB per second")
SYNC_ACTORS = _m("sync/actors", "step", "actors the weights went to")
SYNC_EPOCH = _m("sync/epoch", "step", "weight-sync epoch (a new one each time the group is re-formed)")
SYNC_JOIN_SECONDS = _m(
    "sync/join_seconds", "step", "seconds to settle a new epoch's membership (steps that re-form the group)"
)
SYNC_LEFT_OUT = _m(
    "sync/left_out", "cumulative", "invited actors not ready within `join_timeout_s` (or presumed dead first)"
)
SYNC_FAILURES = _m("sync/failures", "cumulative", "failed group formations and transfers")
# ---- the rollout plane (transport/coordinator.py, transport/metrics.py)
TRANSPORT_QUEUE_DEPTH = _m("transport/queue_depth", "gauge", "groups received and waiting for the learner")
TRANSPORT_LEASED = _m("transport/leased", "gauge", "prompts leased to actors")
TRANSPORT_TAKEN = _m("transport/taken", "gauge", "groups handed to the learner, not yet trained")
TRANSPORT_REGRANT_QUEUE = _m("transport/regrant_queue", "gauge", "prompts waiting to be granted again")
TRANSPORT_IN_FLIGHT = _m("transport/in_flight", "gauge", "prompts granted and not yet trained or dropped")
TRANSPORT_INFLIGHT_CAP = _m("transport/inflight_cap", "gauge", "admission cap on prompts in flight")
TRANSPORT_ACTORS_ALIVE = _m("transport/actors_alive", "gauge", "actors heard from within `peer_timeout_s`")
TRANSPORT_ACTORS_QUARANTINED = _m(
    "transport/actors_quarantined", "gauge", "actors quarantined after `max_invalid_groups` invalid groups"
)
TRANSPORT_POLICY_VERSION = _m("transport/policy_version", "gauge", "the coordinator's published policy version")
TRANSPORT_TRAINED_TOTAL = _m(
    "transport/trained_total", "gauge", "prompts trained (the ledger's count, restored on resume)"
)
TRANSPORT_DROPPED_TOTAL = _m(
    "transport/dropped_total", "gauge", "prompts dropped and not granted again (the ledger's count)"
)
TRANSPORT_DATA_EPOCH = _m("transport/data_epoch", "gauge", "pass over the data the cursor is in")
TRANSPORT_DATA_POSITION = _m(
    "transport/data_position", "gauge", "prompts of that pass handed out so far (the data cursor)"
)
TRANSPORT_GRANTS_PER_S = _m("transport/grants_per_s", "rate", "prompts granted per second")
TRANSPORT_GROUPS_PER_S = _m("transport/groups_per_s", "rate", "rollout groups accepted per second")
TRANSPORT_BYTES_PER_S = _m("transport/bytes_per_s", "rate", "bytes of accepted rollout groups per second")
TRANSPORT_GRANTS_TOTAL = _m("transport/grants_total", "cumulative", "prompts granted")
TRANSPORT_GROUPS_RECEIVED_TOTAL = _m("transport/groups_received_total", "cumulative", "rollout groups accepted")
TRANSPORT_BYTES_RECEIVED_TOTAL = _m("transport/bytes_received_total", "cumulative", "bytes of accepted rollout groups")
TRANSPORT_TRAINED = _m("transport/trained", "cumulative", "groups marked trained by the learner")
TRANSPORT_LEASE_EXPIRIES = _m(
    "transport/lease_expiries", "cumulative", "leases expired (actor dead or too slow); their prompts re-granted"
)
TRANSPORT_DUPLICATES = _m(
    "transport/duplicates", "cumulative", "deliveries dropped as a duplicate (a re-sent or re-granted prompt)"
)
TRANSPORT_LATE_ACCEPTED = _m("transport/late_accepted", "cumulative", "deliveries accepted after their lease expired")
TRANSPORT_UNKNOWN_GROUPS = _m(
    "transport/unknown_groups", "cumulative", "deliveries for a prompt the coordinator never leased"
)
TRANSPORT_CREDIT_WAITS = _m(
    "transport/credit_waits", "cumulative", "work requests with credit that admission could not grant to yet"
)
TRANSPORT_ACTORS_PRESUMED_DEAD = _m(
    "transport/actors_presumed_dead", "cumulative", "actors silent for `peer_timeout_s`"
)
TRANSPORT_REJECTED_ACTORS = _m(
    "transport/rejected_actors", "cumulative", "hellos refused: the actor registry was full of live actors"
)
TRANSPORT_DROPS_STALE = _m(
    "transport/drops/stale", "cumulative", "groups over the staleness bound, dropped or re-granted (`stale_policy`)"
)
TRANSPORT_DROPS_QUARANTINED = _m(
    "transport/drops/quarantined", "cumulative", "groups refused because their actor is quarantined"
)
TRANSPORT_DROPS_OVERSIZE = _m(
    "transport/drops/oversize", "cumulative", "grants not sent because the message would exceed the size cap"
)
transport_drops_invalid_reason_key = _f(
    "transport/drops/invalid_{reason}",
    "cumulative",
    "groups refused by validation, their prompts granted again, by reason: malformed, wrong_completion_count, "
    "bad_version, empty_response, response_too_long, token_out_of_vocab, bad_logprobs, bad_loss_mask, bad_turns, "
    "missing_filter_metric, bad_teacher_logprobs",
)
TRANSPORT_DROPS_TOTAL = _m("transport/drops_total", "cumulative", "all of transport/drops/*")
transport_decode_errors_reason_key = _f(
    "transport/decode_errors/{reason}", "cumulative", "messages that failed to decode, by reason"
)
TRANSPORT_DECODE_ERRORS_TOTAL = _m("transport/decode_errors_total", "cumulative", "all of transport/decode_errors/*")
transport_send_failures_reason_key = _f(
    "transport/send_failures/{reason}", "cumulative", "messages the coordinator could not send, by reason"
)
transport_staleness_lag_key = _f(
    "transport/staleness/{lag}", "cumulative", "trained groups with this staleness (0..max_staleness)"
)
TRANSPORT_STALENESS_MEAN = _m(
    "transport/staleness_mean", "cumulative", "mean staleness over every group trained since the start"
)
transport_version_span_span_key = _f(
    "transport/version_span/{span}", "cumulative", "accepted groups spanning this many versions (`8+` for more)"
)
TRANSPORT_ACTORS_GENERATED_TOKENS_TOTAL = _m(
    "transport/actors/generated_tokens_total",
    "cumulative",
    "tokens generated, summed over all actors (restarts included)",
)
TRANSPORT_ACTORS_IDLE_S_TOTAL = _m(
    "transport/actors/idle_s_total", "cumulative", "actor-seconds with nothing to generate, over all actors"
)
TRANSPORT_ACTORS_UPTIME_S_TOTAL = _m(
    "transport/actors/uptime_s_total", "cumulative", "actor-seconds since each actor started, over all actors"
)
TRANSPORT_ACTORS_SERVED_CHECKS_TOTAL = _m(
    "transport/actors/served_checks_total",
    "cumulative",
    "LoRA runs: updates whose served adapter an actor checked against the learner's probe, over all actors",
)
TRANSPORT_ACTORS_SERVED_CHECK_FAILURES_TOTAL = _m(
    "transport/actors/served_check_failures_total",
    "cumulative",
    "... of which the served adapter did not compute what the learner's does (that actor stops generating)",
)
TRANSPORT_ACTORS_LEND_SWITCHES_TOTAL = _m(
    "transport/actors/lend_switches_total",
    "cumulative",
    "times an actor's engine changed its thread count to take or give back the learner's cores (lend_learner_cores)",
)
TRANSPORT_ACTORS_REWARD_MODEL_REQUESTS_TOTAL = _m(
    "transport/actors/reward_model_requests_total", "cumulative", "groups scored by the learned reward model"
)
TRANSPORT_ACTORS_REWARD_MODEL_TIMEOUTS_TOTAL = _m(
    "transport/actors/reward_model_timeouts_total", "cumulative", "reward-server requests past their deadline"
)
TRANSPORT_ACTORS_REWARD_MODEL_DEFERRED_TOTAL = _m(
    "transport/actors/reward_model_deferred_total",
    "cumulative",
    "group scorings that found no reward server answering and waited to try again",
)
TRANSPORT_ACTORS_REWARD_MODEL_GIVEN_UP_TOTAL = _m(
    "transport/actors/reward_model_given_up_total",
    "cumulative",
    "groups given up for want of a reward-model answer (granted again after their lease)",
)
TRANSPORT_ACTORS_REWARD_MODEL_REFUSED_TOTAL = _m(
    "transport/actors/reward_model_refused_total", "cumulative", "groups refused for an untrusted reward-model answer"
)
TRANSPORT_ACTORS_REWARD_MODEL_SECONDS_TOTAL = _m(
    "transport/actors/reward_model_seconds_total", "cumulative", "seconds the actors waited on reward-model answers"
)
TRANSPORT_ACTORS_LOADED_VERSION_MIN = _m(
    "transport/actors/loaded_version_min",
    "gauge",
    "oldest policy version (a LoRA run: adapter version) a live actor has loaded, by its last report",
)
TRANSPORT_ACTORS_LOADED_VERSION_MAX = _m(
    "transport/actors/loaded_version_max", "gauge", "newest policy version a live actor has loaded"
)
TRANSPORT_FILTER_FILTERED_GROUPS = _m(
    "transport/filter/filtered_groups", "step", "DAPO dynamic sampling: groups filtered for the step just trained"
)
TRANSPORT_FILTER_FILTERED_FRACTION = _m(
    "transport/filter/filtered_fraction", "step", "their share of that step's groups"
)
TRANSPORT_FILTER_GRANTS_PER_TRAINED_GROUP = _m(
    "transport/filter/grants_per_trained_group",
    "cumulative",
    "grants settled per trained group: 1 unfiltered, 1 / (1 - f) with a filtered share f",
)
TRANSPORT_FILTER_FILTERED_TOTAL = _m("transport/filter/filtered_total", "cumulative", "prompts filtered")
TRANSPORT_EVAL_ROUNDS = _m("transport/eval/rounds", "cumulative", "validation rounds started")
TRANSPORT_EVAL_GRANTS = _m("transport/eval/grants", "cumulative", "validation prompts granted")
TRANSPORT_EVAL_LEASE_EXPIRIES = _m(
    "transport/eval/lease_expiries", "cumulative", "validation leases expired; their prompts granted again"
)
TRANSPORT_EVAL_DUPLICATES = _m(
    "transport/eval/duplicates", "cumulative", "validation deliveries dropped as a duplicate"
)
TRANSPORT_EVAL_WRONG_VERSION = _m(
    "transport/eval/wrong_version", "cumulative", "validation deliveries under another version (granted again)"
)
TRANSPORT_EVAL_LATE = _m("transport/eval/late", "cumulative", "validation deliveries for a round already closed")
TRANSPORT_EVAL_UNKNOWN = _m(
    "transport/eval/unknown", "cumulative", "validation deliveries for an unknown round or prompt"
)
TRANSPORT_EVAL_OPEN_PROMPTS = _m(
    "transport/eval/open_prompts", "gauge", "prompts of the open validation round not yet delivered"
)
# ---- validation rounds (runtime/validation.py)
VAL_VERSION = _m("val/version", "round", "the policy version evaluated", "val")
VAL_WALL_S = _m("val/wall_s", "round", "seconds from the round's start to its last result", "val")
VAL_NUM_SAMPLES = _m("val/num_samples", "round", "completions scored", "val")
VAL_NUM_PROMPTS = _m("val/num_prompts", "round", "prompts with results", "val")
VAL_PROMPTS_MISSING = _m("val/prompts_missing", "round", "prompts not back when the round closed (timed out)", "val")
VAL_REWARD_MEAN = _m("val/reward_mean", "round", "mean reward over every sample", "val")
VAL_RESPONSE_LENGTH_MEAN = _m("val/response_length_mean", "round", "mean response length, in tokens", "val")
val_mean_n_key = _f(
    "val/mean@{n}", "round", "with `val_kwargs.n` > 1: mean over prompts of the per-prompt mean reward", "val"
)
val_best_n_key = _f(
    "val/best@{n}", "round", "with `val_kwargs.n` > 1: mean over prompts of the per-prompt best reward", "val"
)
val_source_reward_mean_key = _f(
    "val/{source}/reward_mean", "round", "mean reward per data source (`arith` for `builtin:arith`)", "val"
)
val_source_component_mean_key = _f(
    "val/{source}/{component}_mean", "round", "mean reward component per data source (`acc_mean`: accuracy)", "val"
)
val_core_source_reward_mean_n_key = _f(
    "val-core/{source}/reward/mean@{n}", "round", "verl's name for the per-source mean@n", "val"
)
val_core_source_reward_best_n_mean_key = _f(
    "val-core/{source}/reward/best@{n}/mean", "round", "verl's name for the per-source best@n (exact here)", "val"
)
TIME_WALL_S = _m(
    "time/wall_s", "gauge", "seconds since the learner's training loop started", "step", "val", "rm", "sft", "rs"
)
# ---- reward-model training (learner/reward_model.py, runtime/reward_model_trainer.py)
RM_EPOCH = _m("rm/epoch", "step", "the pass over the training pairs this step belongs to (0-based)", "rm")
RM_TRAIN_LOSS = _m("rm/train/loss", "batch", "Bradley-Terry loss of the step's pairs (margins and centring in)", "rm")
RM_TRAIN_ACCURACY = _m(
    "rm/train/accuracy",
    "batch",
    "share of the step's pairs scored chosen > rejected (ties half), before the update",
    "rm",
)
RM_TRAIN_MARGIN_MEAN = _m("rm/train/margin_mean", "batch", "mean r_chosen - r_rejected of the step's pairs", "rm")
RM_TRAIN_REWARD_MEAN = _m("rm/train/reward_mean", "batch", "mean score of the step's sequences (both sides)", "rm")
RM_TRAIN_REWARD_STD = _m("rm/train/reward_std", "batch", "standard deviation of the same scores", "rm")
RM_TRAIN_GRAD_NORM = _m("rm/train/grad_norm", "step", "gradient norm before clipping", "rm")
RM_TRAIN_LR = _m("rm/train/lr", "step", "learning rate of the step's update", "rm")
RM_TRAIN_SKIPPED_STEPS = _m(
    "rm/train/skipped_steps", "step", "1 when the update was skipped for a non-finite loss or gradient", "rm"
)
RM_PERF_STEP_S = _m("rm/perf/step_s", "step", "seconds of the step (forward, backward, optimizer)", "rm")
RM_PERF_TOKENS_PER_S = _m("rm/perf/tokens_per_s", "step", "tokens of the step's sequences (all ranks) per second", "rm")
RM_PERF_PEAK_MEMORY_MIB = _m(
    "rm/perf/peak_memory_mib",
    "gauge",
    "the largest rank's peak memory so far (MiB): CUDA's peak allocation on a GPU, peak resident set on CPU",
    "rm",
)
RM_EVAL_LOSS = _m("rm/eval/loss", "round", "Bradley-Terry loss over the held-out pairs", "rm")
RM_EVAL_ACCURACY = _m("rm/eval/accuracy", "round", "held-out pairwise accuracy (chosen scored higher; ties half)", "rm")
RM_EVAL_MARGIN_MEAN = _m("rm/eval/margin_mean", "round", "mean r_chosen - r_rejected over the held-out pairs", "rm")
RM_EVAL_REWARD_MEAN = _m("rm/eval/reward_mean", "round", "mean score of the held-out sequences (both sides)", "rm")
RM_EVAL_REWARD_STD = _m("rm/eval/reward_std", "round", "standard deviation of the same scores", "rm")
RM_EVAL_WALL_S = _m("rm/eval/wall_s", "round", "seconds the evaluation took", "rm")
# ---- supervised fine-tuning (learner/sft.py, runtime/sft_trainer.py)
SFT_EPOCH = _m("sft/epoch", "step", "the pass over the training rows this step belongs to (0-based)", "sft")
SFT_TRAIN_LOSS = _m(
    "sft/train/loss",
    "batch",
    "negative log-likelihood per demonstrated token of the step's rows (before the update); label-smoothed when"
    " `trainer.label_smoothing_factor` > 0",
    "sft",
)
SFT_TRAIN_TRAINED_TOKENS = _m("sft/train/trained_tokens", "batch", "demonstrated (loss-mask) tokens of the step", "sft")
SFT_TRAIN_GRAD_NORM = _m("sft/train/grad_norm", "step", "gradient norm before clipping", "sft")
SFT_TRAIN_LR = _m("sft/train/lr", "step", "learning rate of the step's update", "sft")
SFT_TRAIN_SKIPPED_STEPS = _m(
    "sft/train/skipped_steps", "step", "1 when the update was skipped for a non-finite loss or gradient", "sft"
)
SFT_PERF_STEP_S = _m("sft/perf/step_s", "step", "seconds of the step (forward, backward, optimizer)", "sft")
SFT_PERF_TOKENS_PER_S = _m("sft/perf/tokens_per_s", "step", "tokens of the step's rows (all ranks) per second", "sft")
SFT_PERF_PEAK_MEMORY_MIB = _m(
    "sft/perf/peak_memory_mib",
    "gauge",
    "the largest rank's peak memory so far (MiB): CUDA's peak allocation on a GPU, peak resident set on CPU",
    "sft",
)
SFT_VAL_LOSS = _m("sft/val/loss", "round", "negative log-likelihood per demonstrated token of the held-out rows", "sft")
SFT_VAL_PERPLEXITY = _m("sft/val/perplexity", "round", "exp of sft/val/loss", "sft")
SFT_VAL_TOKENS = _m("sft/val/tokens", "round", "demonstrated tokens of the held-out rows", "sft")
SFT_VAL_WALL_S = _m("sft/val/wall_s", "round", "seconds the validation took", "sft")
# ---- rejection sampling (runtime/rejection_sampling.py)
RS_GROUPS = _m("rs/groups", "batch", "prompt groups delivered in the batch", "rs")
RS_SAMPLES = _m("rs/samples", "batch", "samples scored in the batch", "rs")
RS_KEPT = _m("rs/kept", "batch", "samples of the batch kept (score >= threshold, at most best_k per prompt)", "rs")
RS_KEPT_TOTAL = _m("rs/kept_total", "cumulative", "rows written to the output so far", "rs")
RS_KEPT_FRACTION_TOTAL = _m("rs/kept_fraction_total", "cumulative", "rows written / samples scored so far", "rs")
RS_EMPTY_TOTAL = _m(
    "rs/empty_total", "cumulative", "samples kept by score but left out for an empty response, so far", "rs"
)
RS_SCORE_MEAN = _m("rs/score_mean", "batch", "mean score of the batch's samples", "rs")
RS_WRITE_S = _m("rs/write_s", "batch", "seconds to select, decode and write the batch's rows", "rs")
# ---- an actor's totals at exit (actor/loop.py, actor/emulated.py, rewards/worker.py)
ACTOR_GROUPS_SENT = _m("actor/groups_sent", "cumulative", "training groups delivered", "actor")
ACTOR_GROUPS_ABORTED = _m(
    "actor/groups_aborted", "cumulative", "groups whose generation was aborted (not delivered)", "actor"
)
ACTOR_EVAL_GROUPS_SENT = _m("actor/eval_groups_sent", "cumulative", "validation groups delivered", "actor")
ACTOR_EVAL_GRANTS_DROPPED = _m(
    "actor/eval_grants_dropped",
    "cumulative",
    "validation grants pinned to a version older than the loaded one",
    "actor",
)
ACTOR_UPDATE_FAILURES = _m("actor/update_failures", "cumulative", "weight updates that failed", "actor")
ACTOR_UPDATES_HELD = _m(
    "actor/updates_held",
    "cumulative",
    "versions received during a validation round on the loaded one and loaded after it",
    "actor",
)
ACTOR_SERVED_CHECKS = _m(
    "actor/served_checks", "cumulative", "LoRA updates whose served adapter was checked on the probe", "actor"
)
ACTOR_SERVED_CHECK_FAILURES = _m(
    "actor/served_check_failures",
    "cumulative",
    "checked updates whose served model did not compute the learner's log-probs (the actor then stops)",
    "actor",
)
ACTOR_SERVED_CHECK_DIFF = _m(
    "actor/served_check_diff", "last", "the last check's mean |log-prob difference| on the probe", "actor"
)
ACTOR_IDLE_SECONDS = _m("actor/idle_seconds", "cumulative", "seconds with nothing to generate", "actor")
ACTOR_REWARD_MODEL_REQUESTS = _m(
    "actor/reward_model/requests", "cumulative", "groups the reward model scored (usable answers)", "actor"
)
ACTOR_REWARD_MODEL_TIMEOUTS = _m(
    "actor/reward_model/timeouts", "cumulative", "reward-server requests that missed their deadline", "actor"
)
ACTOR_REWARD_MODEL_DEFERRED = _m(
    "actor/reward_model/deferred",
    "cumulative",
    "times a group's scoring found no reward server answering and was tried again after a back-off",
    "actor",
)
ACTOR_REWARD_MODEL_GIVEN_UP = _m(
    "actor/reward_model/given_up",
    "cumulative",
    "groups given up for want of a reward-model answer (their prompts are granted again)",
    "actor",
)
ACTOR_REWARD_MODEL_REFUSED = _m(
    "actor/reward_model/refused",
    "cumulative",
    "groups refused for an untrusted reward-model answer (error, non-finite score, another request's answer)",
    "actor",
)
ACTOR_REWARD_MODEL_SECONDS = _m(
    "actor/reward_model/seconds", "cumulative", "wall-clock seconds of answered reward-model requests", "actor"
)
ACTOR_GENERATED_TOKENS = _m("actor/generated_tokens", "cumulative", "tokens generated", "actor")
ACTOR_TEACHER_REQUESTS = _m(
    "actor/teacher/requests", "cumulative", "completions the teacher engine scored (distillation)", "actor"
)
ACTOR_TEACHER_TOKENS = _m(
    "actor/teacher/tokens", "cumulative", "tokens the teacher engine prefilled (prompt and completion)", "actor"
)
ACTOR_TEACHER_SECONDS = _m(
    "actor/teacher/seconds", "cumulative", "wall-clock seconds groups waited for the teacher's scores", "actor"
)
ACTOR_POLICY_VERSION = _m("actor/policy_version", "last", "policy version loaded at exit", "actor")
ACTOR_EPISODES = _m("actor/episodes", "cumulative", "multi-turn episodes played", "actor")
ACTOR_TEMPLATE_MISMATCHES = _m(
    "actor/template_mismatches", "cumulative", "episodes that failed the multi-turn template check", "actor"
)
ACTOR_RETOKENIZATION_DRIFT = _m(
    "actor/retokenization_drift",
    "cumulative",
    "episodes whose sampled tokens differ from re-encoding their text (kept as sampled)",
    "actor",
)
actor_env_counter_key = _f(
    "actor/env_{counter}",
    "cumulative",
    "the environment worker's counters (calls, errors, timeouts, restarts, episode_timeouts, episodes_lost)",
    "actor",
)
REWARD_CALLS = _m("reward/calls", "cumulative", "reward worker calls", "actor")
REWARD_ERRORS = _m("reward/errors", "cumulative", "reward worker calls that raised (scored 0)", "actor")
REWARD_TIMEOUTS = _m("reward/timeouts", "cumulative", "reward worker calls that timed out (scored 0)", "actor")
REWARD_WORKER_RESTARTS = _m("reward/worker_restarts", "cumulative", "reward worker processes restarted", "actor")
ACTOR_EMULATED_TOKENS_PER_S = _m(
    "actor/emulated/tokens_per_s", "step", "the emulated engine's configured rate", "actor"
)
ACTOR_EMULATED_PAUSED_S = _m(
    "actor/emulated/paused_s", "cumulative", "seconds the emulated engine was paused for weight updates", "actor"
)
ACTOR_EMULATED_UPDATES = _m(
    "actor/emulated/updates", "cumulative", "weight updates the emulated engine received", "actor"
)
ACTOR_EMULATED_PROCESS_CPU_S = _m(
    "actor/emulated/process_cpu_s", "cumulative", "CPU seconds of the emulated actor's process", "actor"
)
# ---- the actor's rollout client (transport/client.py)
transport_client_counter_key = _f(
    "transport/client/{counter}",
    "cumulative",
    "counters: groups_sent, groups_resent, send_blocked, oversize, control_deferred, stray_acks, rejoins, reconnects",
    "client",
)
transport_client_acks_status_key = _f(
    "transport/client/acks/{status}", "cumulative", "acks received, by status (accepted, stale, ...)", "client"
)
transport_client_decode_errors_reason_key = _f(
    "transport/client/decode_errors/{reason}", "cumulative", "coordinator messages that failed to decode", "client"
)
TRANSPORT_CLIENT_UNACKED = _m("transport/client/unacked", "gauge", "groups sent and not yet acknowledged", "client")
TRANSPORT_CLIENT_BACKLOG = _m(
    "transport/client/backlog", "gauge", "groups queued for the socket, not yet sent (back-pressure)", "client"
)
TRANSPORT_CLIENT_PENDING_GRANTS = _m(
    "transport/client/pending_grants", "gauge", "grants received and not yet started", "client"
)

METRICS: tuple[Metric, ...] = tuple(_ENTRIES)


# Metrics the algorithms name themselves (algorithms/: the objective's policy metrics, rollout correction's, the
# KL-in-reward penalty's): the learner files them under its namespace with these. Each name is one segment.
def _under(prefix: str, name: str) -> str:
    if not name or "/" in name:
        raise ValueError(f"metric name {name!r} is not one path segment (under {prefix})")
    return prefix + name


def learner_key(name: str) -> str:
    """``learner/<name>``: ``reward_kl_penalty`` and ``reward_kl_penalty_coeff`` of algorithms/kl.py."""
    return _under("learner/", name)


def learner_actor_key(name: str) -> str:
    """``learner/actor/<name>``: the policy metrics an objective reports (``pg_clipfrac``, ``ppo_kl``, ...)."""
    return _under("learner/actor/", name)


def learner_distillation_key(name: str) -> str:
    """``learner/distillation/<name>``: the distillation term's metrics (``loss``, ``abs_estimate``, ...)."""
    return _under("learner/distillation/", name)


def learner_rollout_corr_key(name: str) -> str:
    """``learner/rollout_corr/<name>``: rollout correction's metrics (``rollout_is_mean``, ``rollout_rs_...``)."""
    return _under("learner/rollout_corr/", name)


_EXACT: dict[str, Metric] = {m.key: m for m in METRICS if not m.is_family}
# Most specific first (the longest fixed text): rollout_rs_{option}_seq_masked_fraction before
# rollout_rs_{option}_masked_fraction, which would take option "token_k1_seq" otherwise.
_FAMILIES: tuple[tuple[re.Pattern[str], Metric], ...] = tuple(
    (m.pattern(), m)
    for m in sorted((m for m in METRICS if m.is_family), key=lambda m: -len(_PLACEHOLDER.sub("", m.key)))
)


def find(key: str, record: str | None = None) -> Metric | None:
    """The catalog entry naming ``key``, in ``record`` when given, else None: an exact entry before any family, and
    of the families the most specific (longest fixed text) first."""
    exact = _EXACT.get(key)
    if exact is not None and (record is None or record in exact.records):
        return exact
    for pattern, metric in _FAMILIES:
        if (record is None or record in metric.records) and pattern.fullmatch(key):
            return metric
    return None


def metric_key(key: str) -> str:
    """``key`` itself, after checking that the catalog names it exactly; KeyError otherwise (for a key given from
    outside the code, such as a command line's; the code imports the constants)."""
    if key not in _EXACT:
        raise KeyError(f"{key!r} is not a metric of async_rl.metric_catalog")
    return key


def unknown_keys(keys: Iterable[str], record: str | None = None) -> list[str]:
    """The keys (sorted, de-duplicated) that no catalog entry of ``record`` names; record fields are allowed."""
    return sorted({k for k in keys if k not in RECORD_FIELDS and find(k, record) is None})


def record_kind(record: Mapping[str, object]) -> str:
    """``val`` for a validation round's metrics.jsonl line, ``rm`` for a reward-model training step's, ``sft`` for a
    supervised fine-tuning step's, ``rs`` for a rejection-sampling batch's, ``step`` for an RL training step's."""
    if VAL_VERSION in record:
        return "val"
    for job in ("rm", "sft", "rs"):
        if any(k.startswith(f"{job}/") for k in record):
            return job
    return "step"


# ---------------------------------------------------------------------------------------------------- staleness
def lag_histogram(trained_version: int, sampled_versions: Iterable[int]) -> Counter[int]:
    """``{staleness: count}`` of samples generated at ``sampled_versions`` and trained at ``trained_version``."""
    return Counter(staleness(trained_version, v) for v in sampled_versions)


def histogram_mean(hist: Mapping[int, int]) -> float:
    """Mean of a ``{value: count}`` histogram; 0.0 when it is empty."""
    total = sum(hist.values())
    return sum(k * n for k, n in hist.items()) / total if total else 0.0


# ---------------------------------------------------------------------------------------------------- markdown
def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(record: str) -> str:
    """The docs table of ``record``'s metrics (``reductions`` for the table of reductions), catalog order."""
    if record == "reductions":
        rows = [f"| `{name}` | {_cell(text)} |" for name, text in REDUCTIONS.items()]
        return "\n".join(["| reduction | how the value is made |", "|---|---|", *rows])
    if record not in RECORDS:
        raise ValueError(f"unknown record {record!r}; expected one of: reductions, {', '.join(RECORDS)}")
    rows = [f"| `{m.key}` | {m.reduction} | {_cell(m.meaning)} |" for m in METRICS if record in m.records]
    return "\n".join(["| key | reduction | meaning |", "|---|---|---|", *rows])


# A generated table in docs/metrics.md sits between these two lines (NAME: ``reductions`` or a record).
DOC_BLOCK = re.compile(r"<!-- metric-catalog: (\w+) -->\n(.*?)<!-- /metric-catalog -->", re.DOTALL)


def doc_blocks(text: str) -> dict[str, str]:
    """``{name: table}`` of the generated blocks in a page's ``text`` (the table without its last newline)."""
    return {m.group(1): m.group(2).removesuffix("\n") for m in DOC_BLOCK.finditer(text)}


def update_doc(text: str) -> str:
    """``text`` with every generated block replaced by the catalog's current table."""
    return DOC_BLOCK.sub(
        lambda m: f"<!-- metric-catalog: {m.group(1)} -->\n{markdown(m.group(1))}\n<!-- /metric-catalog -->", text
    )


def _check_file(path: Path) -> list[str]:
    """``path:line: key`` for each key of a metrics.jsonl file that the catalog does not name."""
    problems = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            record = json.loads(line)
            problems += [f"{path}:{lineno}: {k}" for k in unknown_keys(record, record_kind(record))]
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """``--markdown NAME`` prints a docs table, ``--update-doc docs/metrics.md`` rewrites its generated tables, and
    ``--check FILE...`` lists the keys of metrics.jsonl files that the catalog does not name (exit status 1)."""
    parser = argparse.ArgumentParser(description="The metric catalog: docs tables, and a check of a run's keys.")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", metavar="NAME", choices=["reductions", *RECORDS], help="print one table")
    group.add_argument("--update-doc", metavar="DOC", type=Path, help="rewrite the generated tables")
    group.add_argument("--check", metavar="FILE", type=Path, nargs="+", help="metrics.jsonl files to check")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(args.markdown))
        return 0
    if args.update_doc:
        text = args.update_doc.read_text(encoding="utf-8")
        args.update_doc.write_text(update_doc(text), encoding="utf-8")
        return 0
    problems = [p for path in args.check for p in _check_file(path)]
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
