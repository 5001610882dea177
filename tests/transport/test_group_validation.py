"""The coordinator's group validator, one reason at a time with concrete values, and the quarantine count."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest

from async_rl.transport.protocol import (
    Completion,
    GroupSampling,
    RolloutGroup,
    TurnSpan,
    WireArray,
    make_completion,
    pack_array,
)
from async_rl.transport.validation import INVALID_REASONS, Quarantine, check_group

GRANT = GroupSampling.defaults(n=2, max_tokens=4)
VOCAB = 100


def comp(
    tokens: list[int] | None = None, logprobs: list[float] | None = None, vmin: int = 1, vmax: int = 2
) -> Completion:
    tokens = [3, 99, 0] if tokens is None else tokens
    logprobs = [-0.5] * len(tokens) if logprobs is None else logprobs
    return make_completion(tokens, logprobs, version_min=vmin, version_max=vmax)


def group(*completions: Completion) -> RolloutGroup:
    return RolloutGroup(prompt_id=7, lease_id=1, actor_id="a", completions=list(completions or (comp(), comp())))


def check(g: RolloutGroup, min_version: int | None = 1, vocab_size: int | None = VOCAB) -> str | None:
    return check_group(
        g, GRANT, policy_version=2, min_version=min_version, vocab_size=vocab_size, max_response_length=GRANT.max_tokens
    )


def test_a_group_that_fits_its_grant_is_valid() -> None:
    # ids 0 and 99 are the vocabulary's ends; 4 tokens = max_tokens; versions 1..2 within min_version 1, policy 2
    assert check(group(comp([0, 1, 2, 99]), comp([5]))) is None
    assert check(group(comp(logprobs=[0.0, -1e-5, 5e-5]), comp())) is None  # log(1) with float error


@pytest.mark.parametrize("count", [1, 3])
def test_the_completion_count_must_be_the_grants_n(count: int) -> None:
    assert check(group(*[comp() for _ in range(count)])) == "wrong_completion_count"


@pytest.mark.parametrize("bad_id", [100, 1_000_000, -1])
def test_every_token_id_must_be_in_the_vocabulary(bad_id: int) -> None:
    assert check(group(comp(), comp([5, bad_id]))) == "token_out_of_vocab"


def test_without_a_vocab_size_only_negative_ids_are_refused() -> None:
    assert check(group(comp(), comp([5, 1_000_000])), vocab_size=None) is None
    assert check(group(comp(), comp([5, -3])), vocab_size=None) == "token_out_of_vocab"


def test_an_unsigned_id_past_int32_is_out_of_vocab() -> None:
    big = make_completion(np.array([5, 2**32 - 1], dtype=np.uint32), [-1.0, -1.0], version_min=1, token_dtype="<u4")
    assert check(group(comp(), big)) == "token_out_of_vocab"


def test_responses_must_be_non_empty_and_at_most_max_tokens() -> None:
    assert check(group(comp([]), comp())) == "empty_response"  # the learner cannot train an empty response
    assert check(group(comp(), comp([1, 2, 3, 4, 5]))) == "response_too_long"  # 5 > max_tokens 4


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0.01, 3.0])
def test_log_probs_must_be_finite_and_at_most_zero(value: float) -> None:
    assert check(group(comp(), comp([1, 2], [-0.5, value]))) == "bad_logprobs"


def test_there_is_one_log_prob_per_token() -> None:
    ok = comp([1, 2])
    short = msgspec.structs.replace(ok, logprobs=comp([1]).logprobs)  # 1 log-prob for 2 tokens
    assert check(group(comp(), short)) == "bad_logprobs"


@pytest.mark.parametrize(
    ("vmin", "vmax", "why"),
    [
        (2, 1, "version_min > version_max"),
        (1, 3, "newer than the published policy 2"),
        (0, 2, "older than the grant's min_version 1"),
    ],
)
def test_versions_must_be_ordered_and_within_the_grant(vmin: int, vmax: int, why: str) -> None:
    bad = msgspec.structs.replace(comp(), version_min=vmin, version_max=vmax)  # make_completion refuses vmin > vmax
    assert check(group(comp(), bad)) == "bad_version", why


def test_min_version_is_only_checked_when_known() -> None:
    assert check(group(comp(), comp(vmin=0, vmax=2)), min_version=None) is None  # e.g. a late delivery


@pytest.mark.parametrize(
    "array",
    [
        WireArray(data=memoryview(b"\x00" * 7), dtype="<i4", length=2),  # 7 bytes for 2 x 4
        WireArray(data=memoryview(b"\x00" * 8), dtype="<f4", length=2),  # a float dtype for token ids
        WireArray(data=memoryview(b"\x00" * 8), dtype="|b1", length=8),  # not a wire dtype at all
        WireArray(data=[1, 2], dtype="<i4", length=2),  # type: ignore[arg-type]  # not a buffer
    ],
)
def test_a_malformed_token_array_is_a_reason_not_an_exception(array: WireArray) -> None:
    bad = msgspec.structs.replace(comp([1, 2]), token_ids=array)
    assert check(group(comp(), bad)) == "malformed"


def test_a_malformed_logprob_array_is_a_reason_not_an_exception() -> None:
    bad = msgspec.structs.replace(comp([1, 2]), logprobs=WireArray(data=memoryview(b"\x00" * 8), dtype="<i4", length=2))
    assert check(group(comp(), bad)) == "malformed"


def test_every_reason_is_reachable_and_a_metric_name() -> None:
    seen = {
        check(group(comp())),
        check(group(comp(), comp([1, 200]))),
        check(group(comp(), comp([]))),
        check(group(comp(), comp([1, 2, 3, 4, 5]))),
        check(group(comp(), comp([1], [1.0]))),
        check(group(comp(), comp(vmin=0))),
        check(group(comp(), msgspec.structs.replace(comp(), token_ids=WireArray(memoryview(b"x"), "<i4", 1)))),
        check_group(group(), GRANT, policy_version=2, required_component="acc", max_response_length=GRANT.max_tokens),
        check_episode(episode(mask=[1, 1, 0, 0, 0, 1, 0], turns=None)),
        check_episode(episode(turns=[])),
        check_group(group(), GRANT, policy_version=2, max_response_length=GRANT.max_tokens, teacher_required=True),
    }
    assert seen == set(INVALID_REASONS)
    assert all(r.isidentifier() and r == r.lower() for r in INVALID_REASONS)


def test_group_filtering_on_a_component_needs_it_in_every_completion() -> None:
    with_acc = make_completion([3, 4], [-0.5, -0.5], version_min=1, reward_components={"acc": 1.0, "format": 0.0})
    other = make_completion([3, 4], [-0.5, -0.5], version_min=1, reward_components={"format": 1.0})

    def needs(g: RolloutGroup, name: str | None) -> str | None:
        return check_group(
            g,
            GRANT,
            policy_version=2,
            min_version=1,
            vocab_size=VOCAB,
            required_component=name,
            max_response_length=GRANT.max_tokens,
        )

    assert needs(group(with_acc, with_acc), "acc") is None
    assert needs(group(with_acc, other), "acc") == "missing_filter_metric"  # one completion lacks it
    assert needs(group(with_acc, comp()), "acc") == "missing_filter_metric"  # reward_components None
    assert needs(group(with_acc, other), None) is None  # nothing required without filtering on a component
    # a structural defect is reported first: the group is refused for what makes it untrainable at all
    assert needs(group(with_acc, comp([1, 200])), "acc") == "token_out_of_vocab"


def test_quarantine_after_max_invalid_groups_once() -> None:
    q = Quarantine(max_invalid=3)
    assert [q.record("bad") for _ in range(2)] == [False, False]
    assert q.record("other") is False
    assert "bad" not in q and len(q) == 0
    assert q.record("bad") is True  # the third one
    assert "bad" in q and "other" not in q and len(q) == 1
    assert q.record("bad") is False  # reported once
    assert q.invalid == {"bad": 3, "other": 1}


@pytest.mark.parametrize("value", [0, -1, True, 2.0])
def test_quarantine_threshold_must_be_a_positive_int(value: object) -> None:
    with pytest.raises(ValueError, match="max_invalid"):
        Quarantine(value)  # type: ignore[arg-type]


def test_the_newest_version_is_only_checked_when_given() -> None:
    assert (
        check_group(
            group(comp(), comp(vmin=1, vmax=9)), GRANT, policy_version=None, max_response_length=GRANT.max_tokens
        )
        is None
    )  # an eval round's


# ---- multi-turn: [a1 a2 | o1 o2 o3 | a3 a4], two model turns around 3 observation tokens
MASK = [1, 1, 0, 0, 0, 1, 1]
TURNS = [TurnSpan(0, 2, 1, 1, "tool_call"), TurnSpan(5, 2, 1, 2, "stop")]


def episode(
    mask: list[int] | None = MASK,
    turns: list[TurnSpan] | None = TURNS,
    vmin: int = 1,
    vmax: int = 2,
    tokens: list[int] | None = None,
) -> Completion:
    n = len(mask) if mask is not None else 4
    tokens = [3 + i for i in range(n)] if tokens is None else tokens
    logprobs = [-0.5 if m else 0.0 for m in mask] if mask is not None else [-0.5] * n
    return make_completion(tokens, logprobs, version_min=vmin, version_max=vmax, loss_mask=mask, turns=turns)


def check_episode(c: Completion, max_response_length: int = 8) -> str | None:
    # an episode of 7 tokens: over the grant's max_tokens 4 per turn, within the total of 8
    return check_group(
        group(comp(), c),
        GRANT,
        policy_version=2,
        min_version=1,
        vocab_size=VOCAB,
        max_response_length=max_response_length,
    )


def test_a_two_turn_episode_is_valid() -> None:
    assert check_episode(episode()) is None
    assert check_episode(episode(turns=None)) is None  # the mask alone
    assert check_episode(episode(mask=None, turns=[TurnSpan(0, 4, 1, 2, "stop")])) is None  # turns, all sampled
    assert check_group(group(episode(), episode()), GRANT, policy_version=2, max_response_length=7) is None


def test_an_episode_is_bounded_by_the_total_response_length_and_each_turn_by_max_tokens() -> None:
    assert check_episode(episode(), max_response_length=4) == "response_too_long"  # 7 > 4
    assert check_episode(episode(turns=None), max_response_length=4) == "response_too_long"
    assert check_episode(episode(), max_response_length=6) == "response_too_long"  # 7 > 6
    assert check_episode(episode(), max_response_length=7) is None
    # a single-turn completion keeps the grant's bound whatever the total limit
    assert check_episode(comp([1, 2, 3, 4, 5]), max_response_length=8) == "response_too_long"
    long_turn = episode(
        mask=[1, 1, 1, 1, 1, 0, 1], turns=[TurnSpan(0, 5, 1, 1, "tool_call"), TurnSpan(6, 1, 2, 2, "stop")]
    )
    assert check_episode(long_turn) == "response_too_long"  # one turn of 5 sampled tokens > max_tokens 4


@pytest.mark.parametrize(
    ("mask", "why"),
    [
        ([1, 1, 0, 1], "4 entries for 7 tokens"),
        ([1, 1, 2, 0, 0, 1, 1], "a value outside {0, 1}"),
        ([0, 0, 0, 0, 0, 0, 0], "no sampled token"),
        ([1, 1, 0, 0, 0, 1, 0], "the last token (it holds the reward) is not sampled"),
    ],
)
def test_a_bad_loss_mask_is_refused(mask: list[int], why: str) -> None:
    bad = msgspec.structs.replace(episode(turns=None), loss_mask=pack_array(mask, "|u1"))
    assert check_episode(bad) == "bad_loss_mask", why


def test_a_loss_mask_that_is_not_a_byte_array_is_malformed() -> None:
    bad = msgspec.structs.replace(episode(), loss_mask=pack_array(MASK, "<i4"))
    assert check_episode(bad) == "malformed"
    bad = msgspec.structs.replace(episode(), loss_mask=WireArray(data=memoryview(b"\x01" * 6), dtype="|u1", length=7))
    assert check_episode(bad) == "malformed"


def _turn(start: int, length: int, vmin: int = 1, vmax: int = 1) -> TurnSpan:
    return TurnSpan(start, length, vmin, vmax, "stop")


@pytest.mark.parametrize(
    ("turns", "why"),
    [
        ([], "no turn at all"),
        ([_turn(0, 2), _turn(5, 3, 1, 2)], "past the last token (5 + 3 > 7)"),
        ([_turn(0, 2), _turn(1, 1), _turn(5, 2, 1, 2)], "overlapping"),
        ([_turn(5, 2, 1, 2), _turn(0, 2)], "out of order"),
        ([_turn(0, 2), _turn(3, 0), _turn(5, 2, 1, 2)], "an empty turn"),
        ([_turn(0, 2), _turn(5, 1, 1, 2)], "token 6 sampled but in no turn"),
        ([_turn(0, 3), _turn(5, 2, 1, 2)], "a turn over an observation token"),
        ([_turn(0, 2), _turn(5, 2)], "versions 1..1, the completion says 1..2"),
        ([_turn(0, 2, 2, 2), _turn(5, 2, 2, 2)], "versions 2..2, the completion says 1..2"),
        ([_turn(0, 2, 2, 1), _turn(5, 2, 1, 2)], "a turn's version_min > version_max"),
    ],
)
def test_turns_that_disagree_with_the_tokens_or_the_mask_are_refused(turns: list[TurnSpan], why: str) -> None:
    assert check_episode(episode(turns=turns)) == "bad_turns", why


def test_turns_without_a_mask_must_cover_every_token() -> None:
    assert check_episode(episode(mask=None, turns=[_turn(0, 2, 1, 2), _turn(3, 1, 1, 2)])) == "bad_turns"  # token 2


def _taught(teacher: list[float] | None, tokens: list[int] | None = None) -> Completion:
    tokens = [3, 99, 0] if tokens is None else tokens
    c = make_completion(tokens, [-0.5] * len(tokens), version_min=1, version_max=2)
    return c if teacher is None else msgspec.structs.replace(c, teacher_logprobs=pack_array(teacher, "<f4"))


def check_taught(g: RolloutGroup, required: bool) -> str | None:
    return check_group(
        g, GRANT, policy_version=2, min_version=1, vocab_size=VOCAB, max_response_length=4, teacher_required=required
    )


def test_teacher_log_probs_one_finite_non_positive_per_token() -> None:
    good = _taught([-1.0, -0.25, 0.0])
    assert check_taught(group(good, good), required=True) is None
    assert check_taught(group(good, good), required=False) is None  # sent unasked: checked all the same, and fine
    for bad in ([-1.0, -0.25], [-1.0, math.nan, -1.0], [-1.0, -math.inf, -1.0], [-1.0, 0.5, -1.0]):
        assert check_taught(group(good, _taught(bad)), required=True) == "bad_teacher_logprobs"
        assert check_taught(group(good, _taught(bad)), required=False) == "bad_teacher_logprobs"
    wrong_dtype = msgspec.structs.replace(good, teacher_logprobs=pack_array([1, 2, 3], "<i4"))
    assert check_taught(group(good, wrong_dtype), required=True) == "bad_teacher_logprobs"


def test_a_distillation_run_refuses_a_completion_without_teacher_log_probs() -> None:
    good = _taught([-1.0, -0.25, -2.0])
    assert check_taught(group(good, _taught(None)), required=True) == "bad_teacher_logprobs"
    assert check_taught(group(_taught(None), _taught(None)), required=False) is None
