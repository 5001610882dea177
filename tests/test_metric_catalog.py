"""The metric catalog: well formed, docs/metrics.md's tables are it printed, the producers use its keys, staleness."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from async_rl import metric_catalog as mc
from async_rl.staleness import staleness

METRICS_DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
NAMESPACES = (
    "rollout/",
    "learner/",
    "actor/",
    "sync/",
    "transport/",
    "val/",
    "val-core/",
    "time/",
    "reward/",
    "rm/",
    "sft/",
    "rs/",
)


def test_entries_are_well_formed_and_unique() -> None:
    keys = [m.key for m in mc.METRICS]
    assert len(keys) == len(set(keys)), [k for k, n in Counter(keys).items() if n > 1]
    for m in mc.METRICS:
        assert m.reduction in mc.REDUCTIONS, m
        assert m.records and set(m.records) <= set(mc.RECORDS), m
        assert m.key.startswith(NAMESPACES), m.key
        assert m.meaning and "\n" not in m.meaning and not m.meaning.endswith("."), m
        assert mc.find(m.key, m.records[0]) is m, f"{m.key} is shadowed by another entry"
    used = {m.reduction for m in mc.METRICS}
    assert used == set(mc.REDUCTIONS), f"reductions no metric uses: {set(mc.REDUCTIONS) - used}"


def test_find_prefers_exact_keys_and_families_match_one_segment() -> None:
    assert mc.find("rollout/finish/length").key == "rollout/finish/{reason}"  # type: ignore[union-attr]
    overall = "learner/rollout_corr/rollout_rs_seq_masked_fraction"
    assert mc.find(overall).key == overall  # type: ignore[union-attr]  # not option "seq" of the per-option family
    per_option = mc.find("learner/rollout_corr/rollout_rs_token_k1_seq_masked_fraction")
    assert per_option is not None and per_option.key == "learner/rollout_corr/rollout_rs_{option}_seq_masked_fraction"
    assert mc.find("val/arith/reward_mean", "val").key == "val/{source}/reward_mean"  # type: ignore[union-attr]
    assert mc.find("val/arith/acc_mean", "val").key == "val/{source}/{component}_mean"  # type: ignore[union-attr]
    assert mc.find("transport/version_span/8+").key == "transport/version_span/{span}"  # type: ignore[union-attr]
    assert mc.find("rollout/finish/a/b") is None  # a placeholder never spans a "/"
    assert mc.find("val/reward_mean", "step") is None and mc.find("learner/version", "val") is None
    assert mc.find("time/wall_s", "val") is not None and mc.find("time/wall_s", "step") is not None
    assert mc.unknown_keys(["step", "learner/version", "reward/mean", "actor/tokens_per_s"], "step") == [
        "actor/tokens_per_s",
        "reward/mean",
    ]


def test_metric_key_accepts_only_exact_catalog_keys() -> None:
    assert mc.metric_key("sync/bytes") == "sync/bytes"
    for bad in ("reward/mean", "rollout/finish/{reason}", "rollout/finish/stop"):
        with pytest.raises(KeyError, match=re.escape(repr(bad))):
            mc.metric_key(bad)


def _name(key: str) -> str:
    """The rule the catalog names its keys by: upper case, each run of other characters than letters and digits an
    underscore (a placeholder by its name)."""
    return re.sub(r"[^A-Za-z0-9]+", "_", re.sub(r"\{([a-z_]+)\}", r"\1", key)).strip("_").upper()


def test_every_key_is_one_named_constant_and_every_family_one_builder() -> None:
    constants = {name: value for name, value in vars(mc).items() if name.isupper() and isinstance(value, str)}
    builders = {name: value for name, value in vars(mc).items() if isinstance(value, mc.Family)}
    exact = [m.key for m in mc.METRICS if not m.is_family]
    families = [m.key for m in mc.METRICS if m.is_family]
    assert sorted(constants.values()) == sorted(exact)
    assert sorted(b.template for b in builders.values()) == sorted(families)
    assert [(n, k) for n, k in constants.items() if n != _name(k)] == []
    assert [(n, b.template) for n, b in builders.items() if n != _name(b.template).lower() + "_key"] == []
    # a builder's key (any value per placeholder) is named by its own entry, and parsed back to the values
    for builder in builders.values():
        values = tuple(f"v{i}" for i in range(len(builder.placeholders)))
        key = builder(*values)
        assert mc.find(key).key == builder.template, key  # type: ignore[union-attr]
        assert builder.parse(key) == values and builder.matches(key)


def test_builders_fill_one_segment_per_placeholder() -> None:
    assert mc.rollout_finish_reason_key("stop") == "rollout/finish/stop"
    assert mc.transport_staleness_lag_key(3) == "transport/staleness/3"
    assert mc.val_core_source_reward_best_n_mean_key("arith", 4) == "val-core/arith/reward/best@4/mean"
    assert mc.val_source_component_mean_key("arith", "acc") == "val/arith/acc_mean"
    for bad in ("a/b", ""):
        with pytest.raises(ValueError, match="not one path segment"):
            mc.rollout_finish_reason_key(bad)
    with pytest.raises(TypeError, match="takes 2 value"):
        mc.val_source_component_mean_key("arith")
    # a data source's or a reward component's name may hold a "/" (verl's openai/gsm8k), and the catalog names it
    key = mc.val_source_reward_mean_key("openai/gsm8k")
    assert key == "val/openai/gsm8k/reward_mean" and mc.find(key, "val").key == "val/{source}/reward_mean"  # type: ignore[union-attr]
    assert mc.val_source_reward_mean_key.parse(key) == ("openai/gsm8k",)
    assert mc.val_source_reward_mean_key.parse("val/reward_mean") is None
    assert mc.find(mc.rollout_reward_component_key("format/strict")) is not None


def test_the_learner_files_algorithm_metrics_under_catalogued_prefixes() -> None:
    for builder in (mc.learner_key, mc.learner_actor_key, mc.learner_rollout_corr_key):
        prefix = builder("x").removesuffix("x")
        assert any(m.key.startswith(prefix) for m in mc.METRICS), prefix
        with pytest.raises(ValueError, match="not one path segment"):
            builder("a/b")
    assert mc.learner_actor_key("pg_clipfrac") == mc.LEARNER_ACTOR_PG_CLIPFRAC
    assert mc.learner_rollout_corr_key("rollout_is_mean") == mc.LEARNER_ROLLOUT_CORR_ROLLOUT_IS_MEAN
    assert mc.learner_key("reward_kl_penalty") == mc.LEARNER_REWARD_KL_PENALTY


def test_the_doc_tables_are_the_catalog_printed() -> None:
    blocks = mc.doc_blocks(METRICS_DOC.read_text(encoding="utf-8"))
    assert sorted(blocks) == sorted(["reductions", *mc.RECORDS]), "one generated table per record, and reductions"
    for name, table in blocks.items():
        assert table == mc.markdown(name), (
            f"docs/metrics.md's {name!r} metrics table is out of date: python -m async_rl.metric_catalog "
            "--update-doc docs/metrics.md"
        )


def test_update_doc_rewrites_only_the_generated_blocks() -> None:
    text = "intro\n<!-- metric-catalog: reductions -->\nstale\n<!-- /metric-catalog -->\noutro\n"
    assert mc.update_doc(text) == (
        f"intro\n<!-- metric-catalog: reductions -->\n{mc.markdown('reductions')}\n<!-- /metric-catalog -->\noutro\n"
    )
    assert mc.doc_blocks(mc.update_doc(text)) == {"reductions": mc.markdown("reductions")}
    table = mc.markdown("step").splitlines()
    assert table[:2] == ["| key | reduction | meaning |", "|---|---|---|"]
    assert "| `sync/bytes` | step | bytes of weights broadcast |" in table
    with pytest.raises(ValueError, match="nope"):
        mc.markdown("nope")


def test_check_cli_lists_the_keys_no_entry_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 1, "learner/version": 1.0, "reward/mean": 0.5, "time/wall_s": 1.0},
        {"step": 1, "val/version": 1.0, "val/arith/reward_mean": 0.5, "learner/version": 1.0},
    ]
    run.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert mc.main(["--check", str(run)]) == 1
    assert capsys.readouterr().out.splitlines() == [f"{run}:1: reward/mean", f"{run}:2: learner/version"]
    run.write_text(json.dumps({"step": 2, "sync/bytes": 8.0}) + "\n")
    assert mc.main(["--check", str(run)]) == 0
    assert mc.main(["--markdown", "val"]) == 0 and capsys.readouterr().out == mc.markdown("val") + "\n"


# ---------------------------------------------------------------------------------------------------- producers
def test_every_key_the_coordinator_reports_is_catalogued() -> None:
    from async_rl.config import default_config
    from async_rl.transport import Coordinator, PromptRecord
    from async_rl.transport.metrics import ACTOR_REPORT_TOTALS, COUNTERS, DECLARED_DROPS, TransportMetrics

    records = [PromptRecord(np.arange(i, i + 4, dtype=np.int32), {"ground_truth": str(i)}) for i in range(4)]
    cfg = default_config()
    coord = Coordinator(records, cfg.async_training, groups_per_step=cfg.data.train_batch_size, seed=0, autostart=False)
    try:
        keys = set(coord.metrics())
    finally:
        coord.close()
    # counters the snapshot reports only once they were counted, and per-reason families
    tm = TransportMetrics(max_staleness=2)
    for name in ("rejected_actors", "lease_expiries"):
        tm.count(name)
    tm.drops[mc.TRANSPORT_DROPS_STALE] += 1
    tm.drops[mc.TRANSPORT_DROPS_OVERSIZE] += 1
    keys |= set(tm.snapshot({}, {"frames": 1}, {"unroutable": 2}))
    assert mc.unknown_keys(keys, "step") == []
    assert {*COUNTERS.values(), *DECLARED_DROPS, *ACTOR_REPORT_TOTALS.values()} <= keys
    assert "transport/drops/invalid_malformed" in keys and "transport/eval/rounds" in keys
    with pytest.raises(KeyError, match="not a coordinator counter"):
        tm.count("no_such_counter")


def test_each_invalid_reason_is_named_in_the_catalog() -> None:
    from async_rl.transport.validation import INVALID_REASONS

    entry = mc.find("transport/drops/invalid_malformed")
    assert entry is not None and entry.key == "transport/drops/invalid_{reason}"
    assert [r for r in INVALID_REASONS if r not in entry.meaning] == []


def test_the_readers_constants_are_catalogued() -> None:
    import async_rl.tuning.sweep_report as sweep_report

    read = [
        sweep_report.ESS_KEY,
        *sweep_report.STALENESS_KEYS,
        sweep_report.SPAN_KEY,
        *sweep_report.DROP_KEYS,
        sweep_report.STEP_TIME_KEY,
        sweep_report.TOKEN_RATE_KEY,
        *sweep_report.REWARD_KEYS,
    ]
    assert mc.unknown_keys(read, "step") == []


# ---------------------------------------------------------------------------------------------------- staleness
def test_staleness_is_versions_behind_counted_from_the_oldest() -> None:
    assert staleness(5, 5) == 0 and staleness(5, 3) == 2
    # four samples trained at version 7, generated under 7, 6, 6 and 4
    hist = mc.lag_histogram(7, [7, 6, 6, 4])
    assert hist == Counter({0: 1, 1: 2, 3: 1})
    assert mc.histogram_mean(hist) == pytest.approx((0 + 1 + 1 + 3) / 4)  # 1.25
    assert mc.histogram_mean(Counter()) == 0.0
