"""Collation of rollout groups into the learner's padded layout."""

from __future__ import annotations

import pytest
import torch

from async_rl.learner.batching import Response, Row, SampledGroup, collate_groups, collate_rows, mask_out_of_vocab


def two_groups() -> list[SampledGroup]:
    return [
        SampledGroup(
            group_id="a",
            prompt_ids=[5, 6, 7],
            responses=[
                Response(token_ids=[8, 9], logprobs=[-1.0, -2.0], reward=1.0, version=3),
                Response(token_ids=[10], logprobs=[-0.5], reward=0.0, version=4),
            ],
        ),
        SampledGroup(
            group_id="b",
            prompt_ids=[11],
            responses=[Response(token_ids=[12, 13, 14], logprobs=[-1.0, -1.0, -1.0], reward=0.5, version=5)],
        ),
    ]


def test_collate_layout_by_hand() -> None:
    batch = collate_groups(two_groups(), pad_token_id=0, max_prompt_length=None, max_response_length=None)
    # P = longest prompt = 3 (left-padded), T = longest response = 3 (right-padded)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0], [5, 6, 7, 10, 0, 0], [0, 0, 11, 12, 13, 14]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]]
    # positions count real tokens from 0 (cumsum - 1, clamped at 0 on the left padding)
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 4], [0, 1, 2, 3, 3, 3], [0, 0, 0, 1, 2, 3]]
    assert batch["responses"].tolist() == [[8, 9, 0], [10, 0, 0], [12, 13, 14]]
    assert batch["response_mask"].tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1]]
    assert batch["rollout_log_probs"].tolist() == [[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0], [-1.0, -1.0, -1.0]]
    # the reward sits on the last valid response token
    assert batch["token_level_scores"].tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.5]]
    assert batch["index"].tolist() == [0, 0, 1]
    assert batch["versions"].tolist() == [3, 4, 5]
    assert batch["prompt_lengths"].tolist() == [3, 3, 1]
    assert batch["response_lengths"].tolist() == [2, 1, 3]
    assert batch.prompt_width == 3 and len(batch) == 3


def test_collate_fixed_widths_and_select() -> None:
    batch = collate_groups(two_groups(), max_prompt_length=4, max_response_length=5)
    assert batch["input_ids"].shape == (3, 9)
    assert batch["responses"].shape == (3, 5)
    sub = batch.select([2, 0])
    assert sub["index"].tolist() == [1, 0]
    assert sub["input_ids"][0].tolist() == [0, 0, 0, 11, 12, 13, 14, 0, 0]


@pytest.mark.parametrize(
    ("groups", "kwargs", "match"),
    [
        ([], {}, "groups"),
        ([SampledGroup("x", [], [Response([1], [0.0], 1.0)])], {}, "prompt_ids"),
        ([SampledGroup("x", [1], [])], {}, "no responses"),
        ([SampledGroup("x", [1], [Response([], [], 1.0)])], {}, "empty response"),
        ([SampledGroup("x", [1], [Response([1, 2], [0.0], 1.0)])], {}, "logprobs"),
        ([SampledGroup("x", [1, 2], [Response([1], [0.0], 1.0)])], {"max_prompt_length": 1}, "max_prompt_length"),
        ([SampledGroup("x", [1], [Response([1, 2], [0.0, 0.0], 1.0)])], {"max_response_length": 1}, "max_response"),
    ],
)
def test_collate_rejects_bad_input(groups: list[SampledGroup], kwargs: dict[str, int], match: str) -> None:
    widths: dict[str, int | None] = {"max_prompt_length": None, "max_response_length": None, **kwargs}
    with pytest.raises(ValueError, match=match):
        collate_groups(groups, **widths)  # type: ignore[arg-type]


def test_a_group_with_an_out_of_vocab_id_is_made_inert_in_place() -> None:
    groups = two_groups()
    bad = groups[1].responses[0]
    groups[1] = SampledGroup("b", [11], [Response([12, 1_000_000, -1], bad.logprobs, bad.reward, bad.version)])
    batch = collate_groups(groups, pad_token_id=0, max_prompt_length=None, max_response_length=None)
    assert mask_out_of_vocab(batch, vocab_size=20, pad_token_id=0) == [1]  # group "b", dense id 1
    # row 2 (group b): ids 1_000_000 and -1 became the pad id 0, and it adds no loss token, no reward
    assert batch["responses"][2].tolist() == [12, 0, 0]
    assert batch["input_ids"][2].tolist() == [0, 0, 11, 12, 0, 0]
    assert batch["loss_mask"][2].tolist() == [0, 0, 0]
    assert batch["token_level_scores"][2].tolist() == [0.0, 0.0, 0.0]
    # the tokens still exist for the forward passes (packed layouts count them from response_mask)
    assert batch["response_mask"][2].tolist() == [1, 1, 1]
    # group a (rows 0 and 1) is untouched
    assert batch["loss_mask"][:2].tolist() == [[1, 1, 0], [1, 0, 0]]
    assert batch["token_level_scores"][0].tolist() == [0.0, 1.0, 0.0]
    assert len(batch) == 3  # the batch keeps its rows: it must still split into whole mini-batches


def test_a_batch_within_the_vocabulary_is_left_alone() -> None:
    batch = collate_groups(two_groups(), pad_token_id=0, max_prompt_length=None, max_response_length=None)
    before = {k: v.clone() for k, v in batch.tensors.items()}
    assert mask_out_of_vocab(batch, vocab_size=15, pad_token_id=0) == []  # the largest id is 14
    assert all(torch.equal(before[k], batch[k]) for k in before)
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
    assert batch["loss_mask"].tolist() == [[1, 1, 0, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0, 0]]
    assert batch["response_mask"].tolist() == [[1, 1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0, 0]]  # every token exists
    assert batch["attention_mask"][0].tolist() == [1] * 9  # the observation tokens are attended to
    assert batch["loss_mask"].dtype == batch["response_mask"].dtype == torch.int64
    assert batch["token_level_scores"][0].tolist() == [0.0] * 6 + [1.0]  # the reward on the last (sampled) token
    assert batch["rollout_log_probs"][0].tolist() == [-0.5, -0.25, 0.0, 0.0, 0.0, -1.0, -2.0]
    assert batch["response_lengths"].tolist() == [7, 2]
    assert batch.select([1, 0])["loss_mask"][1].tolist() == [1, 1, 0, 0, 0, 1, 1]
    # the in-process path carries the same mask
    same = collate_groups(
        [
            SampledGroup(
                0,
                [5, 6],
                [Response(list(episode.token_ids), list(episode.logprobs), 1.0, 3, loss_mask=[1, 1, 0, 0, 0, 1, 1])],
            )
        ],
        max_prompt_length=None,
        max_response_length=None,
    )
    assert same["loss_mask"].tolist() == [[1, 1, 0, 0, 0, 1, 1]]
    with pytest.raises(ValueError, match="loss_mask has 2 entries for 7 tokens"):
        collate_rows([episode._replace(loss_mask=[1, 1])], max_prompt_length=None, max_response_length=None)


def test_masking_a_multi_turn_batch_keeps_the_observation_tokens_out() -> None:
    episode = Response([21, 22, 31, 32, 23], [-0.5] * 2 + [0.0] * 2 + [-0.5], 1.0, loss_mask=[1, 1, 0, 0, 1])
    groups = [
        SampledGroup("a", [5], [episode, Response([24, 25, 26], [-0.5] * 3, 0.0)]),
        SampledGroup("b", [5], [Response([99, 31, 23], [-0.5, 0.0, -0.5], 1.0, loss_mask=[1, 0, 1])]),
    ]
    batch = collate_groups(groups, pad_token_id=0, max_prompt_length=None, max_response_length=None)
    assert mask_out_of_vocab(batch, vocab_size=50, pad_token_id=0) == [1]  # id 99: group b is made inert
    assert batch["loss_mask"].tolist() == [[1, 1, 0, 0, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0]]
