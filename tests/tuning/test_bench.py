"""The BENCH_RESULT line: emit/parse round trip, targets, and malformed input; the paired-ratio summary."""

from __future__ import annotations

import math

import pytest

from async_rl.tuning.bench import PREFIX, BenchLine, emit, format_line, paired_ratios, parse


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


def test_paired_ratios_by_hand() -> None:
    # log ratios ln(0.8), ln(1.0), ln(1.25) = -0.2231, 0, +0.2231: mean 0 -> geometric mean 1 (symmetric on the log
    # scale, where the arithmetic mean 1.0167 is not); sd 0.2231, t(2 df) 4.303: half-width 4.303 * 0.2231 / sqrt(3)
    s = paired_ratios([1.25, 0.8, 1.0])
    assert s.n == 3 and s.geomean == pytest.approx(1.0)
    half = 4.303 * math.log(1.25) / math.sqrt(3)
    assert s.ci_low == pytest.approx(math.exp(-half)) and s.ci_high == pytest.approx(math.exp(half))
    assert (s.median, s.low, s.high) == (1.0, 0.8, 1.25)
    assert "1.000 (95% CI 0.574-1.741)" in s.describe()
    even = paired_ratios([0.9, 0.9, 1.1, 1.2])
    assert even.median == pytest.approx(1.0) and even.geomean == pytest.approx((0.9 * 0.9 * 1.1 * 1.2) ** 0.25)
    one = paired_ratios([0.93])
    assert one.geomean == one.ci_low == one.ci_high == pytest.approx(0.93)
    # many equal rounds: no spread, the interval collapses; more rounds of the same spread narrow it (t -> 1.96)
    assert paired_ratios([0.95] * 40).ci_high == pytest.approx(0.95)
    few, many = paired_ratios([0.9, 1.1] * 3), paired_ratios([0.9, 1.1] * 30)
    assert many.ci_high - many.ci_low < (few.ci_high - few.ci_low) / 3


@pytest.mark.parametrize("bad", [[], [0.0], [1.0, -0.5], [math.nan], [math.inf]])
def test_paired_ratios_reject_non_ratios(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="positive finite"):
        paired_ratios(bad)
