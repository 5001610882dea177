"""The guessing game: replies, reward decay per turn, invalid turns, shaping, the solved flag, and the problem maker."""

from __future__ import annotations

import pytest

from async_rl.envs.guessing import GuessingEnv, demonstration, last_integer, make_guessing_problems

ALPHABET = set("0123456789+-*/=()., ?:!\nabcdefghijklmnopqrstuvwxyz")


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_higher_lower_then_correct_with_decayed_reward() -> None:
    env = GuessingEnv()
    env.reset("guess", "37", {"hi": 100})
    first = env.step("i guess 50")
    assert (first.observations, first.reward, first.done) == (user("lower"), 0.0, False)
    assert first.info == {"tool_calls": 0.0, "tool_errors": 0.0, "solved": 0.0}
    assert env.step("25").observations == user("higher")
    assert env.step("maybe 12 or 40?").observations == user("lower")  # the last integer is the guess
    final = env.step("37")
    assert final.done is True and final.observations == []
    assert final.reward == pytest.approx(0.7)  # turn 4: 1.0 - 0.1 * 3
    assert final.info["solved"] == 1.0


def test_first_turn_correct_earns_one_and_the_reward_is_floored() -> None:
    env = GuessingEnv()
    env.reset("guess", "5", {})
    assert env.step("5").reward == 1.0
    assert [env.reward_for_turn(t) for t in (1, 2, 10, 11, 50)] == pytest.approx([1.0, 0.9, 0.1, 0.1, 0.1])
    steep = GuessingEnv(decay=0.5, min_reward=0.0)
    assert [steep.reward_for_turn(t) for t in (1, 2, 3, 4)] == [1.0, 0.5, 0.0, 0.0]


def test_a_turn_without_a_number_is_an_error_and_still_a_turn() -> None:
    env = GuessingEnv()
    env.reset("guess", "8", {"hi": 10})
    result = env.step("hmm, let me think")
    assert result.observations == user("no number found. reply with one number from 1 to 10.")
    assert (result.reward, result.done, result.info["tool_errors"]) == (0.0, False, 1.0)
    assert env.step("8").reward == pytest.approx(0.9)  # the invalid turn counted
    assert env.final_reward("anything") == 0.0  # what the driver gets at its turn limit


def test_reset_validates_the_secret_and_reads_hi_from_extra() -> None:
    env = GuessingEnv(hi=10)
    with pytest.raises(ValueError, match=r"outside \[1, 10\]"):
        env.reset("guess", "11", {})
    env.reset("guess", "150", {"hi": 200})
    assert env.hi == 200 and env.step("200").observations == user("lower")
    assert last_integer("-3 then 12") == 12 and last_integer("none") is None and last_integer("9" * 5000) is None


def test_problems_are_deterministic_disjoint_and_in_the_small_alphabet() -> None:
    train = make_guessing_problems(300, seed=1, hi=100)
    assert train == make_guessing_problems(300, seed=1, hi=100)
    held_out = make_guessing_problems(50, seed=1, split="eval", hi=100)
    train_secrets = {int(r["ground_truth"]) for r in train}
    eval_secrets = {int(r["ground_truth"]) for r in held_out}
    assert train_secrets.isdisjoint(eval_secrets) and len(train_secrets) > 50 and eval_secrets
    for record in train + held_out:
        assert 1 <= int(record["ground_truth"]) <= 100
        assert record["extra"] == {"data_source": "guessing", "hi": 100}
        assert [m["role"] for m in record["prompt"]] == ["system", "user"]
        assert "from 1 to 100" in record["prompt"][1]["content"]
        for message in record["prompt"]:
            assert set(message["content"]) <= ALPHABET, message
    env = GuessingEnv()
    env.reset(train[0]["prompt"], train[0]["ground_truth"], train[0]["extra"])
    replies = [env.step(str(g)).observations for g in (0, 101, "")]
    assert all(set(m["content"]) <= ALPHABET for obs in replies for m in obs)
    with pytest.raises(ValueError, match="split"):
        make_guessing_problems(1, split="test", seed=0)


def test_format_reward_is_the_share_of_bare_number_turns() -> None:
    env = GuessingEnv(hi=20, format_reward=0.2)
    env.reset("p", "7", {})
    assert env.step("i guess 10").observations == [{"role": "user", "content": "lower"}]
    assert env.step(" 5.").observations == [{"role": "user", "content": "higher"}]
    # solved on turn 3, two of three turns just a number: 0.8 + 0.2 * 2/3
    assert env.step("7").reward == pytest.approx(0.8 + 0.2 * 2 / 3)
    env.reset("p", "7", {})
    env.step("3")
    assert env.final_reward("3") == pytest.approx(0.2)  # ended by the driver: only the format part
    assert GuessingEnv(hi=20).final_reward("3") == 0.0


def test_feedback_reward_is_the_share_of_guesses_inside_the_open_interval() -> None:
    env = GuessingEnv(hi=20, feedback_reward=0.3)
    env.reset("p", "13", {})
    assert env.step("10").observations == user("higher")  # in [1, 20]: counts; open interval now [11, 20]
    assert env.step("10").observations == user("higher")  # a repeat ignores the reply: does not count
    assert env.step("25").observations == user("lower")  # outside [11, 20]: does not count; still [11, 20]
    assert env.step("15").observations == user("lower")  # counts; open interval now [11, 14]
    assert env.step("hmm").info == {"tool_calls": 0.0, "tool_errors": 1.0, "solved": 0.0}  # no guess: no count
    assert env.step("16").observations == user("lower")  # above 14: does not count
    assert (env.low, env.high) == (11, 14)
    final = env.step("13")  # counts; solved on turn 7
    assert final.done and final.info["solved"] == 1.0
    assert final.reward == pytest.approx(0.4 + 0.3 * 3 / 7)
    env.reset("p", "2", {})
    env.step("1")
    env.step("3")
    assert env.final_reward("3") == pytest.approx(0.3)  # ended by the driver: both guesses respected the replies
    with pytest.raises(ValueError, match="feedback_reward"):
        GuessingEnv(feedback_reward=-0.1)


def test_shaping_parts_add_up() -> None:
    env = GuessingEnv(hi=20, format_reward=0.2, feedback_reward=0.3)
    env.reset("p", "7", {})
    env.step("i say 10")  # inside, not bare
    env.step("12")  # bare, outside [1, 9]
    assert env.final_reward("12") == pytest.approx((0.2 * 1 + 0.3 * 1) / 2)


@pytest.mark.parametrize("hi", [1, 2, 7, 20, 100])
def test_the_demonstration_is_a_binary_search_game_the_env_accepts(hi: int) -> None:
    game = demonstration(hi)
    assert game[0] == {
        "role": "user",
        "content": f"i am thinking of a number from 1 to {hi}. guess it. after each "
        "guess i will say higher or lower. reply with one number.",
    }
    assert [m["role"] for m in game[1:]] == ["assistant", "user"] * (len(game[1:]) // 2) + ["assistant"]
    secret = int(game[-1]["content"])
    assert secret == max(1, round(hi * 2 / 3))
    env = GuessingEnv(hi=hi, feedback_reward=1.0)
    env.reset("p", str(secret), {})
    results = [env.step(m["content"]) for m in game[1::2]]
    assert [r.observations for r in results[:-1]] == [user(m["content"]) for m in game[2::2]]
    assert results[-1].done and results[-1].info["solved"] == 1.0
    assert env.consistent == env.turns  # every guess respected the replies
    assert len(results) <= hi.bit_length()  # binary search
    assert demonstration(20) == demonstration(20, secret=13)


def test_problems_with_the_demonstration_game() -> None:
    train = make_guessing_problems(200, seed=3, hi=20, demonstration_game=True)
    held_out = make_guessing_problems(200, seed=3, split="eval", hi=20, demonstration_game=True)
    assert train == make_guessing_problems(200, seed=3, hi=20, demonstration_game=True)
    assert [r["ground_truth"] for r in train] != [r["ground_truth"] for r in held_out]  # their own streams
    for records in (train, held_out):  # both splits draw from all of [1, 20]
        assert {int(r["ground_truth"]) for r in records} == set(range(1, 21))
    plain_question = make_guessing_problems(1, hi=20, seed=0)[0]["prompt"][1]["content"]
    demo_secrets = set()
    for record in train:
        prompt = record["prompt"]
        assert prompt[0] == {"role": "system", "content": "you are playing a number guessing game."}
        assert prompt[-1] == {"role": "user", "content": "right. new game. " + plain_question}
        demo_secret = int(prompt[-2]["content"])  # the demonstration's winning guess
        assert prompt[1:-1] == demonstration(20, demo_secret)
        demo_secrets.add(demo_secret)
        assert all(set(m["content"]) <= ALPHABET for m in prompt)
    assert len(demo_secrets) == 20  # the demonstration varies, so copying it does not pay
