"""Gold against proxy from a run's records: each validation round with the KL of its step, a table and a PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from async_rl import metric_catalog as mc
from async_rl.runtime.plot_gold import format_rows, gold_proxy_rows, main

VAL = mc.VAL_VERSION


def _records() -> list[dict]:
    train = [{"step": s, mc.LEARNER_ACTOR_KL_LOSS: 0.01 * s} for s in (1, 2, 3, 4)]
    val = [
        {
            "step": 0,
            VAL: 0,
            "val/arith/rule_mean": 0.10,
            "val/arith/reward_model_mean": -0.5,
            "val/arith/words_mean": 9.0,
        },
        {
            "step": 2,
            VAL: 2,
            "val/arith/rule_mean": 0.40,
            "val/arith/reward_model_mean": 0.5,
            "val/arith/words_mean": 5.0,
        },
        {
            "step": 4,
            VAL: 4,
            "val/arith/rule_mean": 0.30,
            "val/arith/reward_model_mean": 1.5,
            "val/arith/words_mean": 2.0,
        },
        {"step": 3, VAL: 3, "val/arith/reward_mean": 0.2},  # a round without the two components: left out
    ]
    return [train[0], val[0], train[1], val[1], train[2], val[3], train[3], val[2]]


def test_rows_pair_each_round_with_the_mean_kl_since_the_last_round() -> None:
    rows = gold_proxy_rows(_records(), extra=["words", "correct"])
    assert rows == [
        {"step": 0, "gold": 0.10, "proxy": -0.5, "kl": 0.0, "words": 9.0, "correct": None},
        {"step": 2, "gold": 0.40, "proxy": 0.5, "kl": pytest.approx(0.015), "words": 5.0, "correct": None},
        {"step": 4, "gold": 0.30, "proxy": 1.5, "kl": pytest.approx(0.035), "words": 2.0, "correct": None},
    ]
    table = format_rows(rows).splitlines()
    assert table[0] == "| step | gold | proxy | kl | words | correct |"
    assert table[4] == "| 4 | 0.3000 | 1.5000 | 0.0350 | 2.0000 | - |"
    assert "no validation round" in format_rows([])


def test_the_command_writes_the_plot(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records()))
    assert main([str(tmp_path)]) == 0
    png = tmp_path / "gold_vs_proxy.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "| 2 | 0.4000 | 0.5000 | 0.0150 |" in capsys.readouterr().out
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, mc.LEARNER_ACTOR_KL_LOSS: 0.1}) + "\n")
    assert main([str(tmp_path)]) == 1
