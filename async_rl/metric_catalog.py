"""Every metric the system reports, in one place: its key, how its value is reduced, and what it means.

A key is either exact (``learner/actor/pg_loss``) or a family with ``{placeholders}`` for a part that varies
(``rollout/finish/{reason}``, ``transport/staleness/{lag}``); a placeholder stands for one path segment, never a
``/``. Each metric belongs to one or more *records*: the ``step`` and ``val`` lines of ``<run dir>/metrics.jsonl``
(written by the learner's rank 0, ``runtime/metrics.py``), the JSON line an actor prints when it exits (``actor``), or
the actor's rollout-client counters (``client``).

The metrics tables of docs/metrics.md are this catalog printed (``python -m async_rl.metric_catalog --update-doc
docs/metrics.md`` writes them between their marker comments; ``--markdown step`` prints one), a test keeps the two
equal,
and the end-to-end tests fail on any logged key the catalog does not name; ``--check RUN/metrics.jsonl`` does the
same for a run. Readers of the records (plot, console, tools) take their keys through
:func:`metric_key`, so a key that is renamed or misspelt fails on import instead of silently plotting nothing.

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
from pathlib import Path

from async_rl.staleness import staleness

__all__ = [
    "METRICS",
    "RECORDS",
    "RECORD_FIELDS",
    "REDUCTIONS",
    "Metric",
    "find",
    "histogram_mean",
    "lag_histogram",
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
}

# Fields of a metrics.jsonl line that are not metrics.
RECORD_FIELDS = ("step",)

_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


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
        """The regex of the keys this entry names (a placeholder is one or more characters other than ``/``)."""
        parts = _PLACEHOLDER.split(self.key)  # literal, name, literal, name, ...
        return re.compile("".join(re.escape(p) if i % 2 == 0 else "[^/]+" for i, p in enumerate(parts)))


def _m(key: str, reduction: str, meaning: str, *records: str) -> Metric:
    return Metric(key, reduction, meaning, records or ("step",))


METRICS: tuple[Metric, ...] = (
    # ---- the rollouts trained this step (runtime/rollout_metrics.py)
    _m("rollout/reward_mean", "batch", "mean reward of the completions trained this step"),
    _m("rollout/reward/{component}", "batch", "mean of one named reward component over the same completions"),
    _m("rollout/response_length_mean", "batch", "mean completion length, in tokens"),
    _m("rollout/generated_tokens", "batch", "completion tokens trained this step"),
    _m("rollout/group_generate_s_mean", "batch", "mean seconds an actor spent generating one group"),
    _m("rollout/finish/{reason}", "batch", "share of completions that ended for this reason (`stop`, `length`, ...)"),
    _m("rollout/eos_fraction", "batch", "share of completions whose last token is the tokenizer's EOS"),
    _m("rollout/staleness_mean", "batch", "mean staleness of the step's groups: versions behind the weights trained"),
    _m("rollout/staleness_max", "batch", "largest staleness of the step's groups"),
    _m("rollout/staleness_hist/{lag}", "batch", "share of the step's groups with this staleness"),
    _m("rollout/version_span_mean", "batch", "mean versions a completion spanned (weights updated while it ran)"),
    _m("rollout/version_span_max", "batch", "largest version span of a completion"),
    _m("rollout/num_turns_mean", "batch", "multi-turn: mean model turns per episode"),
    _m("rollout/num_turns_max", "batch", "multi-turn: most model turns in one episode"),
    _m("rollout/turn_length_mean", "batch", "multi-turn: mean tokens the model sampled in one turn"),
    _m("rollout/sampled_tokens_mean", "batch", "multi-turn: mean sampled (trained) tokens per episode"),
    _m("rollout/tool_calls_mean", "batch", "multi-turn: mean tool calls per episode"),
    _m(
        "rollout/tool_errors", "batch", "multi-turn: tool calls that failed (unparseable, unknown tool, error, timeout)"
    ),
    _m("rollout/template_mismatches", "batch", "multi-turn: episodes whose text differs from the whole-chat rendering"),
    _m(
        "rollout/retokenization_drift",
        "batch",
        "multi-turn: episodes whose sampled tokens differ from re-encoding their text (trained as sampled)",
    ),
    # ---- the learner's update (learner/step.py, update.py, critic.py)
    _m("learner/actor/pg_loss", "update_mean", "policy-gradient loss of a mini-batch"),
    _m("learner/actor/kl_loss", "update_mean", "KL loss against the reference policy (with `use_kl_loss`)"),
    _m("learner/actor/loss", "update_mean", "total loss of a mini-batch (policy gradient, entropy bonus, KL loss)"),
    _m("learner/actor/grad_norm", "update_mean", "gradient norm before clipping"),
    _m("learner/actor/lr", "last", "learning rate"),
    _m("learner/actor/entropy", "token_mean", "entropy of the policy on the trained tokens"),
    _m(
        "learner/actor/pg_clipfrac",
        "mean",
        "share of tokens where the ratio clip was active (GMPO: with a positive advantage)",
    ),
    _m(
        "learner/actor/pg_clipfrac_lower",
        "mean",
        "share held by the dual clip (GMPO: clipped with a negative advantage; else 0)",
    ),
    _m("learner/actor/ppo_kl", "mean", "approximate KL between the proximal and the current policy"),
    _m("learner/actor/proximal_pass_skipped", "step", "1 when the proximal log-probs came from the update's forward"),
    _m("learner/actor/skipped_updates", "step", "optimizer updates skipped for a non-finite loss or gradient"),
    _m("learner/actor/skipped_total", "cumulative", "skipped optimizer updates since the run started"),
    _m("learner/critic/loss", "update_mean", "value loss of a mini-batch (`adv_estimator: gae`)"),
    _m("learner/critic/grad_norm", "update_mean", "critic gradient norm before clipping"),
    _m("learner/critic/lr", "last", "critic learning rate"),
    _m("learner/critic/vf_clipfrac", "mean", "share of value predictions clipped by `cliprange_value`"),
    _m("learner/critic/vpred_mean", "token_mean", "mean value prediction on the trained tokens"),
    _m("learner/critic/skipped_updates", "step", "critic updates skipped for a non-finite loss or gradient"),
    _m("learner/reward_kl_penalty", "batch", "KL to the reference subtracted from the reward (`use_kl_in_reward`)"),
    _m("learner/reward_kl_penalty_coeff", "step", "the coefficient of that penalty this step"),
    # rollout correction (algorithms/rollout_correction.py): whole batch, or per micro-batch without a proximal pass
    _m("learner/rollout_corr/rollout_is_mean", "mean", "mean importance weight pi_old / pi_rollout"),
    _m("learner/rollout_corr/rollout_is_max", "max", "largest importance weight"),
    _m("learner/rollout_corr/rollout_is_min", "min", "smallest importance weight"),
    _m("learner/rollout_corr/rollout_is_eff_sample_size", "mean", "effective sample size of the weights, in (0, 1]"),
    _m("learner/rollout_corr/rollout_is_ratio_fraction_high", "mean", "share of ratios above the upper threshold"),
    _m("learner/rollout_corr/rollout_is_ratio_fraction_low", "mean", "share of ratios below the lower threshold"),
    _m("learner/rollout_corr/rollout_is_oob_ratio", "mean", "share of tokens zeroed outside the bounds (IcePop)"),
    _m("learner/rollout_corr/rollout_is_batch_norm_factor", "mean", "the mean the weights were divided by"),
    _m("learner/rollout_corr/rollout_rs_masked_fraction", "mean", "share of tokens removed by rejection sampling"),
    _m("learner/rollout_corr/rollout_rs_seq_masked_fraction", "mean", "share of sequences with a rejected token"),
    _m("learner/rollout_corr/rollout_rs_{option}_masked_fraction", "mean", "the same, for one rejection option"),
    _m("learner/rollout_corr/rollout_rs_{option}_seq_masked_fraction", "mean", "the same per sequence, one option"),
    # the step's batch
    _m("learner/batch/size", "batch", "completions trained this step"),
    _m("learner/batch/reward_mean", "batch", "mean reward (sum of token-level scores) of the trained completions"),
    _m("learner/batch/response_length_mean", "batch", "mean response length, in tokens"),
    _m(
        "learner/batch/sampled_length_mean",
        "batch",
        "mean number of response tokens the model sampled (multi-turn: without the observation tokens)",
    ),
    _m("learner/batch/advantages_mean", "batch", "mean advantage over the tokens in the loss"),
    _m("learner/batch/advantages_max", "batch", "largest advantage over the tokens in the loss"),
    _m("learner/batch/advantages_min", "batch", "smallest advantage over the tokens in the loss"),
    _m("learner/batch/informative_groups", "batch", "groups whose rewards differ (the others get zero advantage)"),
    _m(
        "learner/batch/truncated_masked",
        "batch",
        "truncated responses (finish reason `length`) left out of the loss (`mask_truncated_responses`)",
    ),
    _m(
        "learner/batch/invalid_groups",
        "batch",
        "groups dropped for a token id outside the vocabulary (normally 0: the coordinator refuses them)",
    ),
    _m("learner/batch/padding_waste", "batch", "share of the computed token slots that were padding"),
    _m(
        "learner/batch/tokens_computed",
        "batch",
        "token slots the actor updates computed, padding included, over all ranks (with shared prompts each group's"
        " prompt counts once per micro-batch)",
    ),
    _m(
        "learner/batch/token_imbalance",
        "batch",
        "busiest rank's tokens over the mean rank's, minus 1 (mean over mini-batches)",
    ),
    _m("learner/staleness/mean", "batch", "mean staleness of the trained completions: versions behind"),
    _m("learner/staleness/max", "batch", "largest staleness of a trained completion"),
    _m(
        "learner/offpolicy/ess",
        "batch",
        "effective sample size of pi_proximal / pi_behaviour (learner vs actor policy) over the tokens",
    ),
    _m("learner/offpolicy/abs_log_ratio_mean", "batch", "mean absolute log ratio of the proximal to the behaviour"),
    _m("learner/perf/step_time_s", "step", "seconds of the learner step (log-prob passes and updates)"),
    _m("learner/perf/update_time_s", "step", "seconds of its optimizer updates"),
    _m("learner/perf/tokens_per_s", "step", "batch tokens (prompt and response) per second of the step"),
    _m("learner/perf/update_tokens_per_s", "step", "tokens computed by the updates per second of the updates"),
    _m("learner/version", "step", "policy version after the step"),
    _m("learner/idle_fraction", "step", "share of the step spent waiting for rollouts"),
    _m(
        "learner/peak_memory_mib",
        "gauge",
        "learner rank 0's peak memory so far (MiB): CUDA's peak allocation on a GPU, peak resident set on CPU",
    ),
    # ---- the actor fleet, from the counters actors report about once a second (runtime/metrics.py ActorActivity)
    _m(
        "actor/gen_tokens_per_s",
        "rate",
        "the actor fleet's generation rate, tokens per second (from the counters actors report every second)",
    ),
    _m("actor/idle_fraction", "rate", "share of actor time with nothing to generate (same counters)"),
    # ---- weight sync (weight_sync/publisher.py), on the steps that publish
    _m("sync/seconds", "step", "seconds to publish the step's weights"),
    _m("sync/bytes", "step", "bytes of weights broadcast"),
    _m("sync/bandwidth_MBps", "step", "broadcast bandwidth, MiB per second"),
    _m("sync/actors", "step", "actors the weights went to"),
    _m("sync/epoch", "step", "weight-sync epoch (a new one each time the group is re-formed)"),
    _m("sync/join_seconds", "step", "seconds to settle a new epoch's membership (steps that re-form the group)"),
    _m("sync/left_out", "cumulative", "invited actors not ready within `join_timeout_s`"),
    _m("sync/failures", "cumulative", "failed group formations and transfers"),
    # ---- the rollout plane (transport/coordinator.py, transport/metrics.py)
    _m("transport/queue_depth", "gauge", "groups received and waiting for the learner"),
    _m("transport/leased", "gauge", "prompts leased to actors"),
    _m("transport/taken", "gauge", "groups handed to the learner, not yet trained"),
    _m("transport/regrant_queue", "gauge", "prompts waiting to be granted again"),
    _m("transport/in_flight", "gauge", "prompts granted and not yet trained or dropped"),
    _m("transport/inflight_cap", "gauge", "admission cap on prompts in flight"),
    _m("transport/actors_alive", "gauge", "actors heard from within `peer_timeout_s`"),
    _m("transport/actors_quarantined", "gauge", "actors quarantined after `max_invalid_groups` invalid groups"),
    _m("transport/policy_version", "gauge", "the coordinator's published policy version"),
    _m("transport/trained_total", "gauge", "prompts trained (the ledger's count, restored on resume)"),
    _m("transport/dropped_total", "gauge", "prompts dropped and not granted again (the ledger's count)"),
    _m("transport/data_epoch", "gauge", "pass over the data the cursor is in"),
    _m("transport/data_position", "gauge", "prompts of that pass handed out so far (the data cursor)"),
    _m("transport/grants_per_s", "rate", "prompts granted per second"),
    _m("transport/groups_per_s", "rate", "rollout groups accepted per second"),
    _m("transport/bytes_per_s", "rate", "bytes of accepted rollout groups per second"),
    _m("transport/grants_total", "cumulative", "prompts granted"),
    _m("transport/groups_received_total", "cumulative", "rollout groups accepted"),
    _m("transport/bytes_received_total", "cumulative", "bytes of accepted rollout groups"),
    _m("transport/trained", "cumulative", "groups marked trained by the learner"),
    _m("transport/lease_expiries", "cumulative", "leases expired (actor dead or too slow); their prompts re-granted"),
    _m("transport/duplicates", "cumulative", "deliveries dropped as a duplicate (a re-sent or re-granted prompt)"),
    _m("transport/late_accepted", "cumulative", "deliveries accepted after their lease expired"),
    _m("transport/unknown_groups", "cumulative", "deliveries for a prompt the coordinator never leased"),
    _m("transport/credit_waits", "cumulative", "work requests with credit that admission could not grant to yet"),
    _m("transport/actors_presumed_dead", "cumulative", "actors silent for `peer_timeout_s`"),
    _m("transport/rejected_actors", "cumulative", "hellos refused: the actor registry was full of live actors"),
    _m(
        "transport/drops/stale", "cumulative", "groups over the staleness bound, dropped or re-granted (`stale_policy`)"
    ),
    _m("transport/drops/quarantined", "cumulative", "groups refused because their actor is quarantined"),
    _m("transport/drops/oversize", "cumulative", "grants not sent because the message would exceed the size cap"),
    _m(
        "transport/drops/invalid_{reason}",
        "cumulative",
        "groups refused by validation, their prompts granted again, by reason: malformed, wrong_completion_count, "
        "bad_version, empty_response, response_too_long, token_out_of_vocab, bad_logprobs, bad_loss_mask, bad_turns, "
        "missing_filter_metric",
    ),
    _m("transport/drops_total", "cumulative", "all of transport/drops/*"),
    _m("transport/decode_errors/{reason}", "cumulative", "messages that failed to decode, by reason"),
    _m("transport/decode_errors_total", "cumulative", "all of transport/decode_errors/*"),
    _m("transport/send_failures/{reason}", "cumulative", "messages the coordinator could not send, by reason"),
    _m("transport/staleness/{lag}", "cumulative", "trained groups with this staleness (0..max_staleness)"),
    _m("transport/staleness_mean", "cumulative", "mean staleness over every group trained since the start"),
    _m("transport/version_span/{span}", "cumulative", "accepted groups spanning this many versions (`8+` for more)"),
    _m(
        "transport/actors/generated_tokens_total",
        "cumulative",
        "tokens generated, summed over all actors (restarts included)",
    ),
    _m("transport/actors/idle_s_total", "cumulative", "actor-seconds with nothing to generate, over all actors"),
    _m("transport/actors/uptime_s_total", "cumulative", "actor-seconds since each actor started, over all actors"),
    _m(
        "transport/actors/served_checks_total",
        "cumulative",
        "LoRA runs: updates whose served adapter an actor checked against the learner's probe, over all actors",
    ),
    _m(
        "transport/actors/served_check_failures_total",
        "cumulative",
        "... of which the served adapter did not compute what the learner's does (that actor stops generating)",
    ),
    _m(
        "transport/actors/loaded_version_min",
        "gauge",
        "oldest policy version (a LoRA run: adapter version) a live actor has loaded, by its last report",
    ),
    _m("transport/actors/loaded_version_max", "gauge", "newest policy version a live actor has loaded"),
    _m("transport/filter/filtered_groups", "step", "DAPO dynamic sampling: groups filtered for the step just trained"),
    _m("transport/filter/filtered_fraction", "step", "their share of that step's groups"),
    _m(
        "transport/filter/grants_per_trained_group",
        "cumulative",
        "grants settled per trained group: 1 unfiltered, 1 / (1 - f) with a filtered share f",
    ),
    _m("transport/filter/filtered_total", "cumulative", "prompts filtered"),
    _m("transport/eval/rounds", "cumulative", "validation rounds started"),
    _m("transport/eval/grants", "cumulative", "validation prompts granted"),
    _m("transport/eval/lease_expiries", "cumulative", "validation leases expired; their prompts granted again"),
    _m("transport/eval/duplicates", "cumulative", "validation deliveries dropped as a duplicate"),
    _m("transport/eval/wrong_version", "cumulative", "validation deliveries under another version (granted again)"),
    _m("transport/eval/late", "cumulative", "validation deliveries for a round already closed"),
    _m("transport/eval/unknown", "cumulative", "validation deliveries for an unknown round or prompt"),
    _m("transport/eval/open_prompts", "gauge", "prompts of the open validation round not yet delivered"),
    # ---- validation rounds (runtime/validation.py)
    _m("val/version", "round", "the policy version evaluated", "val"),
    _m("val/wall_s", "round", "seconds from the round's start to its last result", "val"),
    _m("val/num_samples", "round", "completions scored", "val"),
    _m("val/num_prompts", "round", "prompts with results", "val"),
    _m("val/prompts_missing", "round", "prompts not back when the round closed (timed out)", "val"),
    _m("val/reward_mean", "round", "mean reward over every sample", "val"),
    _m("val/response_length_mean", "round", "mean response length, in tokens", "val"),
    _m("val/mean@{n}", "round", "with `val_kwargs.n` > 1: mean over prompts of the per-prompt mean reward", "val"),
    _m("val/best@{n}", "round", "with `val_kwargs.n` > 1: mean over prompts of the per-prompt best reward", "val"),
    _m("val/{source}/reward_mean", "round", "mean reward per data source (`arith` for `builtin:arith`)", "val"),
    _m("val/{source}/{component}_mean", "round", "mean reward component per data source (`acc_mean`: accuracy)", "val"),
    _m("val-core/{source}/reward/mean@{n}", "round", "verl's name for the per-source mean@n", "val"),
    _m("val-core/{source}/reward/best@{n}/mean", "round", "verl's name for the per-source best@n (exact here)", "val"),
    _m("time/wall_s", "gauge", "seconds since the learner's training loop started", "step", "val"),
    # ---- an actor's totals at exit (actor/loop.py, actor/emulated.py, rewards/worker.py)
    _m("actor/groups_sent", "cumulative", "training groups delivered", "actor"),
    _m("actor/groups_aborted", "cumulative", "groups whose generation was aborted (not delivered)", "actor"),
    _m("actor/eval_groups_sent", "cumulative", "validation groups delivered", "actor"),
    _m(
        "actor/eval_grants_dropped",
        "cumulative",
        "validation grants pinned to a version older than the loaded one",
        "actor",
    ),
    _m("actor/update_failures", "cumulative", "weight updates that failed", "actor"),
    _m("actor/served_checks", "cumulative", "LoRA updates whose served adapter was checked on the probe", "actor"),
    _m(
        "actor/served_check_failures",
        "cumulative",
        "checked updates whose served model did not compute the learner's log-probs (the actor then stops)",
        "actor",
    ),
    _m("actor/served_check_diff", "last", "the last check's mean |log-prob difference| on the probe", "actor"),
    _m("actor/idle_seconds", "cumulative", "seconds with nothing to generate", "actor"),
    _m("actor/generated_tokens", "cumulative", "tokens generated", "actor"),
    _m("actor/policy_version", "last", "policy version loaded at exit", "actor"),
    _m("actor/episodes", "cumulative", "multi-turn episodes played", "actor"),
    _m("actor/template_mismatches", "cumulative", "episodes that failed the multi-turn template check", "actor"),
    _m(
        "actor/retokenization_drift",
        "cumulative",
        "episodes whose sampled tokens differ from re-encoding their text (kept as sampled)",
        "actor",
    ),
    _m(
        "actor/env_{counter}",
        "cumulative",
        "the environment worker's counters (calls, errors, timeouts, restarts, episode_timeouts, episodes_lost)",
        "actor",
    ),
    _m("reward/calls", "cumulative", "reward worker calls", "actor"),
    _m("reward/errors", "cumulative", "reward worker calls that raised (scored 0)", "actor"),
    _m("reward/timeouts", "cumulative", "reward worker calls that timed out (scored 0)", "actor"),
    _m("reward/worker_restarts", "cumulative", "reward worker processes restarted", "actor"),
    _m("actor/emulated/tokens_per_s", "step", "the emulated engine's configured rate", "actor"),
    _m("actor/emulated/paused_s", "cumulative", "seconds the emulated engine was paused for weight updates", "actor"),
    _m("actor/emulated/updates", "cumulative", "weight updates the emulated engine received", "actor"),
    _m("actor/emulated/process_cpu_s", "cumulative", "CPU seconds of the emulated actor's process", "actor"),
    # ---- the actor's rollout client (transport/client.py)
    _m(
        "transport/client/{counter}",
        "cumulative",
        "counters: groups_sent, groups_resent, send_blocked, oversize, control_deferred, stray_acks, rejoins, "
        "reconnects",
        "client",
    ),
    _m("transport/client/acks/{status}", "cumulative", "acks received, by status (accepted, stale, ...)", "client"),
    _m("transport/client/decode_errors/{reason}", "cumulative", "coordinator messages that failed to decode", "client"),
    _m("transport/client/unacked", "gauge", "groups sent and not yet acknowledged", "client"),
    _m("transport/client/backlog", "gauge", "groups queued for the socket, not yet sent (back-pressure)", "client"),
    _m("transport/client/pending_grants", "gauge", "grants received and not yet started", "client"),
)

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
    """``key`` itself, after checking that the catalog names it exactly; KeyError otherwise (for readers' constants)."""
    if key not in _EXACT:
        raise KeyError(f"{key!r} is not a metric of async_rl.metric_catalog")
    return key


def unknown_keys(keys: Iterable[str], record: str | None = None) -> list[str]:
    """The keys (sorted, de-duplicated) that no catalog entry of ``record`` names; record fields are allowed."""
    return sorted({k for k in keys if k not in RECORD_FIELDS and find(k, record) is None})


def record_kind(record: Mapping[str, object]) -> str:
    """``val`` for a validation round's metrics.jsonl line, ``step`` for a training step's."""
    return "val" if "val/version" in record else "step"


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
