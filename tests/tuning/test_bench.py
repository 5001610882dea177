"""The BENCH_RESULT line: emit/parse round trip, targets, and malformed input."""

from __future__ import annotations

import math

import pytest

from async_rl.tuning.bench import PREFIX, BenchLine, emit, format_line, parse


def test_emit_then_parse_round_trips(capsys: pytest.CaptureFixture[str]) -> None:
    lines = [BenchLine("a_vs_b", 0.93, 0.9, "930 / 1000 tok/s"), BenchLine("packing", 1.22)]
    text = emit("demo", lines)
    assert capsys.readouterr().out == text + "\n"
    output = "warming up\n" + PREFIX + '{"name": "old", "results": []}\nround 1: ...\n' + text + "\ntrailing log line\n"
    assert parse(output) == ("demo", lines)  # the LAST result line wins, surrounding log lines are ignored
    assert parse("no result here\n") is None


def test_target_verdicts() -> None:
    assert BenchLine("x", 0.95, 0.9).met is True
    assert BenchLine("x", 0.85, 0.9).met is False
    assert BenchLine("x", 1.5).met is None  # no target: informative only
    assert BenchLine("x", math.nan, 0.9).met is None
    assert "NOT met" in format_line(BenchLine("x", 0.19, 0.8, "d")) and "0.19" in format_line(BenchLine("x", 0.19))


def test_malformed_result_line_is_an_error() -> None:
    with pytest.raises(ValueError, match="malformed"):
        parse(PREFIX + '{"name": "x"}\n')
