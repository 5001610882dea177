"""Built-in rewards, the module:function loader, and the time-limited reward worker."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from async_rl.rewards import RewardWorker, arith, gsm8k, load_reward_fn, math_equiv, normalize_reward

FIXTURES = Path(__file__).parent / "fixtures" / "bad_rewards.py"


def test_gsm8k_strict_and_flexible():
    assert gsm8k.extract_answer("so 3*4=12 #### 1,234.") == "1234"
    assert gsm8k.extract_answer("the answer is 72", "strict") is None
    assert gsm8k.extract_answer("the answer is 72", "flexible") == "72"
    assert gsm8k.extract_answer("#### 12.0") == "12"
    assert gsm8k.compute_score("work... #### 72", "Natalia sold 48/2 = 24 ... #### 72") == {"score": 1.0, "format": 1.0}
    assert gsm8k.compute_score("#### 71", "72") == {"score": 0.0, "format": 1.0}
    assert gsm8k.compute_score("no marker 72", "72") == {"score": 0.0, "format": 0.0}
    with pytest.raises(ValueError, match="method"):
        gsm8k.extract_answer("x", "fuzzy")


def test_math_verify_equivalence():
    assert math_equiv.compute_score("The answer is $\\frac{1}{2}$", "0.5") == 1.0
    assert math_equiv.compute_score("so we get \\boxed{3}", "3") == 1.0
    assert math_equiv.compute_score("so we get \\boxed{4}", "3") == 0.0


def test_arith_reward_exact_and_digits():
    assert arith.compute_score("82", "82") == {"score": 1.0, "digits": 1.0}
    # "83" vs "82": tens digit right, units wrong -> 1 of 2 digits
    assert arith.compute_score("83 junk", "82") == {"score": 0.0, "digits": 0.5}
    # "182" vs "82" right-aligned: " 82" vs "182" -> both target digits match, but not exact
    assert arith.compute_score("182", "82") == {"score": 0.0, "digits": 1.0}
    assert arith.compute_score("", "82") == {"score": 0.0, "digits": 0.0}


def test_normalize_reward_rejects_bad_values():
    assert normalize_reward(True).score == 1.0
    result = normalize_reward({"score": 0.25, "fmt": 1})
    assert (result.score, result.components) == (0.25, {"fmt": 1.0})
    for bad, pattern in [("x", "expected a number"), ({"fmt": 1}, "'score'"), (float("nan"), "not finite")]:
        with pytest.raises(ValueError, match=pattern):
            normalize_reward(bad)


def test_loader_errors_name_the_problem():
    with pytest.raises(ValueError, match="module:function"):
        load_reward_fn("async_rl.rewards.gsm8k")
    with pytest.raises(ValueError, match="no attribute 'nope'"):
        load_reward_fn("async_rl.rewards.gsm8k:nope")
    with pytest.raises(ValueError, match="cannot import"):
        load_reward_fn("no_such_pkg_xyz:f")
    fn = load_reward_fn("async_rl.rewards.arith:compute_score")
    assert fn("1+1=", "2", "2", {})["score"] == 1.0


def test_worker_scores_and_survives_misbehaving_functions():
    spec = f"{FIXTURES}:prints_then_scores"
    with RewardWorker(spec, timeout_s=20) as worker:
        result = worker.score("p", "c", "g")
        assert (result.score, result.components, result.error) == (0.5, {"bonus": 2.0}, None)
        assert worker.errors == 0

    with RewardWorker(f"{FIXTURES}:raises", timeout_s=20) as worker:
        result = worker.score("p", "c", "g")
        assert result.score == 0.0 and "RuntimeError: boom" in (result.error or "")
        assert worker.errors == 1
        pid = worker._proc.pid if worker._proc else None
        worker.score("p", "c", "g")  # same child survives a raising function
        assert worker._proc is not None and worker._proc.pid == pid and worker.errors == 2

    with RewardWorker(f"{FIXTURES}:returns_string", timeout_s=20) as worker:
        assert worker.score("p", "c", "g").score == 0.0 and worker.errors == 1


def test_worker_timeout_kills_child_and_recovers():
    with RewardWorker(f"{FIXTURES}:sleeps", timeout_s=3.0) as worker:
        worker.score("p", "c", "g", {"sleep": 0})  # warm-up: child started and imported
        old_pid = worker._proc.pid if worker._proc else -1
        start = time.monotonic()
        result = worker.score("p", "c", "g", {"sleep": 60})
        elapsed = time.monotonic() - start
        assert result.score == 0.0 and result.error == "timeout"
        assert worker.timeouts == 1 and elapsed < 10
        with pytest.raises(ProcessLookupError):
            os.kill(old_pid, 0)  # the hung child was killed
        assert worker.score("p", "c", "g", {"sleep": 0}).score == 1.0  # a fresh child serves the next call
        assert worker.restarts == 1


def test_worker_timeout_kills_what_the_function_started(tmp_path):
    """The child runs in a process group of its own, killed as a whole: a helper process the reward function started
    does not outlive the timeout (the environment worker kills the same way: frames.kill_child)."""
    pid_file = tmp_path / "helper.pid"
    with RewardWorker(f"{FIXTURES}:spawns_then_hangs", timeout_s=3.0) as worker:
        result = worker.score("p", "c", "g", {"pid_file": str(pid_file)})
        assert result.error == "timeout"
        helper = int(pid_file.read_text())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # SIGKILLed; reaped by init once its parent is gone
            try:
                os.kill(helper, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        with pytest.raises(ProcessLookupError):
            os.kill(helper, 0)


def test_worker_verl_style_signature():
    with RewardWorker(f"{FIXTURES}:verl_style", timeout_s=20, verl_style=True) as worker:
        assert worker.score("prompt", "42", "42", {"data_source": "gsm8k"}).score == 1.0
        assert worker.score("prompt", "41", "42", {"data_source": "gsm8k"}).score == 0.0


def test_chat_arithmetic_score_takes_the_last_integer() -> None:
    from async_rl.rewards.arith import compute_chat_score

    assert compute_chat_score("71", "71") == {"score": 1.0, "bare": 1.0}
    assert compute_chat_score("23 + 48 = 71", "71") == {"score": 1.0, "bare": 0.0}
    assert compute_chat_score("23 + 48 = 100", "71") == {"score": 0.0, "bare": 0.0}
    assert compute_chat_score("To solve this, we need to combine 23 and", "71")["score"] == 0.0
    assert compute_chat_score("1,071.", "1071") == {"score": 1.0, "bare": 1.0}
    assert compute_chat_score("", "0")["score"] == 0.0


def test_the_gold_score_is_correct_times_concise() -> None:
    from async_rl.rewards.arith import compute_chat_gold

    assert compute_chat_gold("71", "71") == {"score": 1.0, "correct": 1.0, "words": 1.0}
    assert compute_chat_gold("The answer is 71.", "71")["score"] == 1.0
    assert compute_chat_gold("23 + 48 = 71", "71")["score"] == 0.8  # 5 words
    long = "To solve this we add the ones then carry the one into the tens and so the result is 71"
    assert compute_chat_gold(long, "71") == {"score": 0.2, "correct": 1.0, "words": 20.0}
    assert compute_chat_gold("72", "71") == {"score": 0.0, "correct": 0.0, "words": 1.0}
    assert compute_chat_gold("", "0")["score"] == 0.0
