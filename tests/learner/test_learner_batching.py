"""Collation of rollout groups into the learner's padded layout."""

from __future__ import annotations

import msgspec
import pytest
import torch

from async_rl.learner.batching import (
    LOCAL_ACTOR,
    RolloutBatch,
    Row,
    collate_groups,
    collate_rows,
    local_group,
    mask_out_of_vocab,
)
from async_rl.transport.protocol import RolloutGroup, make_completion, pack_array

PROMPTS = {0: [5, 6, 7], 1: [11]}  # group "a" and group "b"


def two_groups() -> list[RolloutGroup]:
    return [
        local_group(
            0,
            [
                make_completion([8, 9], [-1.0, -2.0], version_min=3, reward=1.0),
                make_completion([10], [-0.5], version_min=4, reward=0.0),
            ],
        ),
        local_group(1, [make_completion([12, 13, 14], [-1.0, -1.0, -1.0], version_min=5, reward=0.5)]),
    ]


def collate(
    groups: list[RolloutGroup],
    prompts: dict[int, list[int]],
    *,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
) -> RolloutBatch:
    """Pad id 0; widths None: the longest prompt and response."""
    return collate_groups(
        groups,
        prompts,
        pad_token_id=0,
        max_prompt_length=max_prompt_length,
        max_response_length=max_response_length,
    )


def test_a_local_group_is_an_actors_delivery() -> None:
    group = two_groups()[1]
    assert (group.prompt_id, group.lease_id, group.actor_id, group.eval_round) == (1, 1, LOCAL_ACTOR, -1)
    assert [c.finish_reason for c in group.completions] == ["stop"] and group.version == 5


def test_collate_layout_by_hand() -> None:
    batch = collate(two_groups(), PROMPTS)
    # P = longest prompt = 3 (left-padded), T = longest response = 3 (right-padded)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9, 0], [5, 6, 7, 10, 0, 0], [0, 0, 11, 12, 13, 14]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]]
    # positions count real tokens from 0 (cumsum - 1, clamped at 0 on the left padding)
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 4], [0, 1, 2, 3, 3, 3], [0, 0, 0, 1, 2, 3]]
    assert batch.responses.tolist() == [[8, 9, 0], [10, 0, 0], [12, 13, 14]]
    assert batch.response_mask.tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1]]
    assert batch.rollout_log_probs.tolist() == [[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0], [-1.0, -1.0, -1.0]]
    # the reward sits on the last valid response token
    assert batch.token_level_scores.tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.5]]
    assert batch.index.tolist() == [0, 0, 1]
    assert batch.versions.tolist() == [3, 4, 5]
    assert batch.prompt_lengths.tolist() == [3, 3, 1]
    assert batch.response_lengths.tolist() == [2, 1, 3]
    assert batch.prompt_width == 3 and len(batch) == 3


def test_collate_fixed_widths_and_select() -> None:
    batch = collate(two_groups(), PROMPTS, max_prompt_length=4, max_response_length=5)
    assert batch.input_ids.shape == (3, 9)
    assert batch.responses.shape == (3, 5)
    sub = batch.select([2, 0])
    assert sub.index.tolist() == [1, 0]
    assert sub.input_ids[0].tolist() == [0, 0, 0, 11, 12, 13, 14, 0, 0]


def _one(tokens: list[int], logprobs: list[float]) -> list[RolloutGroup]:
    """One group (prompt id 7) of one completion; ``logprobs`` may disagree with ``tokens`` (a broken delivery)."""
    completion = make_completion(tokens, [0.0] * len(tokens), version_min=0, reward=1.0)
    return [local_group(7, [msgspec.structs.replace(completion, logprobs=pack_array(logprobs, "<f4"))])]


@pytest.mark.parametrize(
    ("groups", "prompt", "kwargs", "match"),
    [
        ([], [1], {}, "groups"),
        (_one([1], [0.0]), [], {}, "prompt_ids"),
        ([local_group(7, [])], [1], {}, "no completions"),
        (_one([], []), [1], {}, "empty response"),
        (_one([1, 2], [0.0]), [1], {}, "logprobs"),
        (_one([1], [0.0]), [1, 2], {"max_prompt_length": 1}, "max_prompt_length"),
        (_one([1, 2], [0.0, 0.0]), [1], {"max_response_length": 1}, "max_response"),
    ],
)
def test_collate_rejects_bad_input(
    groups: list[RolloutGroup], prompt: list[int], kwargs: dict[str, int], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        collate(groups, {7: prompt}, **kwargs)


def test_a_group_with_an_out_of_vocab_id_is_made_inert_in_place() -> None:
    groups = two_groups()
    groups[1] = local_group(1, [make_completion([12, 1_000_000, -1], [-1.0] * 3, version_min=5, reward=0.5)])
    batch = collate(groups, PROMPTS)
    assert mask_out_of_vocab(batch, vocab_size=20, pad_token_id=0) == [1]  # group "b", dense id 1
    # row 2 (group b): ids 1_000_000 and -1 became the pad id 0, and it adds no loss token, no reward
    assert batch.responses[2].tolist() == [12, 0, 0]
    assert batch.input_ids[2].tolist() == [0, 0, 11, 12, 0, 0]
    assert batch.loss_mask[2].tolist() == [0, 0, 0]
    assert batch.token_level_scores[2].tolist() == [0.0, 0.0, 0.0]
    # the tokens still exist for the forward passes (packed layouts count them from response_mask)
    assert batch.response_mask[2].tolist() == [1, 1, 1]
    # group a (rows 0 and 1) is untouched
    assert batch.loss_mask[:2].tolist() == [[1, 1, 0], [1, 0, 0]]
    assert batch.token_level_scores[0].tolist() == [0.0, 1.0, 0.0]
    assert len(batch) == 3  # the batch keeps its rows: it must still split into whole mini-batches


def test_a_batch_within_the_vocabulary_is_left_alone() -> None:
    batch = collate(two_groups(), PROMPTS)
    before = {k: v.clone() for k, v in batch.tensors().items()}
    assert mask_out_of_vocab(batch, vocab_size=15, pad_token_id=0) == []  # the largest id is 14
    assert all(torch.equal(before[k], v) for k, v in batch.tensors().items())
    assert mask_out_of_vocab(batch, vocab_size=14, pad_token_id=0) == [1]  # 14 itself is one past a vocab of 14
    with pytest.raises(ValueError, match="pad_token_id=20"):
        mask_out_of_vocab(batch, vocab_size=20, pad_token_id=20)


def test_a_two_turn_row_trains_only_on_its_sampled_tokens() -> None:
    # [a1 a2 | o1 o2 o3 | a3 a4]: the model sampled a*, the environment wrote o* (behaviour log-prob 0 there)
    episode = Row(
        0,
        [5, 6],
        [21, 22, 31, 32, 33, 23, 24],
        [-0.5, -0.25, 0, 0, 0, -1.0, -2.0],
        1.0,
        3,
        False,
        [1, 1, 0, 0, 0, 1, 1],
    )
    single = Row(0, [5, 6], [41, 42], [-1.0, -1.0], 0.0, 3, False)  # built as before: no mask, every token sampled
    batch = collate_rows([episode, single], pad_token_id=0, max_prompt_length=None, max_response_length=None)
    assert batch.loss_mask.tolist() == [[1, 1, 0, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0, 0]]
    assert batch.response_mask.tolist() == [[1, 1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0, 0]]  # every token exists
    assert batch.attention_mask[0].tolist() == [1] * 9  # the observation tokens are attended to
    assert batch.loss_mask.dtype == batch.response_mask.dtype == torch.int64
    assert batch.token_level_scores[0].tolist() == [0.0] * 6 + [1.0]  # the reward on the last (sampled) token
    assert batch.rollout_log_probs[0].tolist() == [-0.5, -0.25, 0.0, 0.0, 0.0, -1.0, -2.0]
    assert batch.response_lengths.tolist() == [7, 2]
    assert batch.select([1, 0]).loss_mask[1].tolist() == [1, 1, 0, 0, 0, 1, 1]
    # a group's completion carries the same mask
    completion = make_completion(
        list(episode.token_ids), list(episode.logprobs), version_min=3, reward=1.0, loss_mask=[1, 1, 0, 0, 0, 1, 1]
    )
    same = collate([local_group(0, [completion])], {0: [5, 6]})
    assert same.loss_mask.tolist() == [[1, 1, 0, 0, 0, 1, 1]]
    with pytest.raises(ValueError, match="loss_mask has 2 entries for 7 tokens"):
        collate_rows([episode._replace(loss_mask=[1, 1])], max_prompt_length=None, max_response_length=None)


def test_masking_a_multi_turn_batch_keeps_the_observation_tokens_out() -> None:
    lps = [-0.5] * 2 + [0.0] * 2 + [-0.5]
    episode = make_completion([21, 22, 31, 32, 23], lps, version_min=0, reward=1.0, loss_mask=[1, 1, 0, 0, 1])
    groups = [
        local_group(0, [episode, make_completion([24, 25, 26], [-0.5] * 3, version_min=0, reward=0.0)]),
        local_group(
            1, [make_completion([99, 31, 23], [-0.5, 0.0, -0.5], version_min=0, reward=1.0, loss_mask=[1, 0, 1])]
        ),
    ]
    batch = collate(groups, {0: [5], 1: [5]})
    assert mask_out_of_vocab(batch, vocab_size=50, pad_token_id=0) == [1]  # id 99: group b is made inert
    assert batch.loss_mask.tolist() == [[1, 1, 0, 0, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0]]


def test_teacher_log_probs_are_collated_beside_the_behaviour_ones() -> None:
    groups = [
        local_group(
            0,
            [
                make_completion([8, 9], [-1.0, -2.0], version_min=3, teacher_logprobs=[-0.5, -0.25]),
                make_completion([10], [-0.5], version_min=4, teacher_logprobs=[-3.0]),
            ],
        )
    ]
    batch = collate(groups, PROMPTS, max_response_length=3)
    assert batch.teacher_log_probs is not None
    torch.testing.assert_close(batch.teacher_log_probs, torch.tensor([[-0.5, -0.25, 0.0], [-3.0, 0.0, 0.0]]))
    assert batch.select([1]).teacher_log_probs.tolist() == [[-3.0, 0.0, 0.0]]  # type: ignore[union-attr]
    assert collate(two_groups(), PROMPTS).teacher_log_probs is None  # no teacher: no field


def test_teacher_log_probs_on_some_rows_only_are_refused() -> None:
    rows = [
        Row(0, [5], [8, 9], [-1.0, -2.0], 1.0, 0, False, None, [-0.5, -0.5]),
        Row(1, [5], [8], [-1.0], 1.0, 0, False, None, None),
    ]
    with pytest.raises(ValueError, match="teacher log-probs on some rows"):
        collate_rows(rows, group_ids=["a", "b"], max_prompt_length=None, max_response_length=None)
    short = [Row(0, [5], [8, 9], [-1.0, -2.0], 1.0, 0, False, None, [-0.5])]
    with pytest.raises(ValueError, match="teacher_logprobs has 1 entries for 2 tokens"):
        collate_rows(short, group_ids=["a"], max_prompt_length=None, max_response_length=None)
