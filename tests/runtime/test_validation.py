"""Validation on the learner side: the schedule (verl's semantics), the val metrics by hand, the Validator's order
(rounds logged at their version's step, a publish of another version waits, a timeout logs partial results), and
loading/capping the validation prompts and their sampling from the config."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pytest

from async_rl.config import load_config
from async_rl.metric_catalog import unknown_keys
from async_rl.runtime import resources
from async_rl.runtime.validation import Validator, any_round, validation_metrics
from async_rl.transport import GroupSampling, PromptRecord, make_completion
from async_rl.transport.evaluation import EvalResult, EvalRound


def _result(rewards: list[list[float]], lengths: list[int] | None = None, num_prompts: int | None = None) -> EvalResult:
    completions = {
        i: [make_completion([1] * (lengths or [2] * len(rewards))[i], [-0.1] * (lengths or [2] * len(rewards))[i],
                            version_min=4, reward=r) for r in group]
        for i, group in enumerate(rewards)
    }  # fmt: skip
    return EvalResult(7, 4, num_prompts or len(rewards), completions, 10.0, 12.5, 13.0, {})


def test_metrics_by_hand_with_two_sources_and_n_2() -> None:
    # prompt 0 (arith): [1, 0]; prompt 1 (arith): [1, 1]; prompt 2 (gsm8k): [0, 0]; lengths 2, 4, 6 tokens
    m = validation_metrics(_result([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]], [2, 4, 6]), ["arith", "arith", "gsm8k"])
    assert m["val/version"] == 4.0 and m["val/wall_s"] == 2.5  # 12.5 - 10
    assert m["val/num_samples"] == 6.0 and m["val/num_prompts"] == 3.0 and m["val/prompts_missing"] == 0.0
    assert m["val/reward_mean"] == pytest.approx(0.5)  # 3 of 6 samples
    assert m["val/response_length_mean"] == pytest.approx(4.0)  # (2 + 2 + 4 + 4 + 6 + 6) / 6
    assert m["val/arith/reward_mean"] == pytest.approx(0.75) and m["val/gsm8k/reward_mean"] == 0.0
    assert unknown_keys(m, "val") == []  # every key is in the metric catalog
    assert m["val/mean@2"] == pytest.approx(0.5)  # (0.5 + 1 + 0) / 3
    assert m["val/best@2"] == pytest.approx(2 / 3)  # (1 + 1 + 0) / 3
    assert m["val-core/arith/reward/mean@2"] == pytest.approx(0.75) and m["val-core/gsm8k/reward/mean@2"] == 0.0
    assert m["val-core/arith/reward/best@2/mean"] == 1.0 and m["val-core/gsm8k/reward/best@2/mean"] == 0.0


def test_reward_components_are_averaged_per_source() -> None:
    # overlong shaping: the reward is shaped, `acc` keeps the unshaped score (the accuracy to watch)
    shaped = [
        make_completion([1, 2], [-0.1, -0.1], version_min=4, reward=0.5, reward_components={"acc": 1.0}),
        make_completion([1], [-0.1], version_min=4, reward=-0.25, reward_components={"acc": 0.0}),
    ]
    plain = [make_completion([3], [-0.2], version_min=4, reward=1.0, reward_components={"acc": 1.0})]
    result = EvalResult(7, 4, 2, {0: shaped, 1: plain}, 10.0, 12.5, 13.0, {})
    m = validation_metrics(result, ["arith", "gsm8k"])
    assert m["val/arith/acc_mean"] == 0.5 and m["val/gsm8k/acc_mean"] == 1.0
    assert m["val/arith/reward_mean"] == pytest.approx(0.125)  # (0.5 - 0.25) / 2
    assert unknown_keys(m, "val") == []


def test_metrics_greedy_and_partial() -> None:
    m = validation_metrics(_result([[1.0], [0.0]], num_prompts=5), ["arith"] * 5)
    assert m["val/reward_mean"] == 0.5 and m["val-core/arith/reward/mean@1"] == 0.5
    assert m["val/prompts_missing"] == 3.0 and m["val/num_prompts"] == 2.0
    assert not any("@" in k and k.startswith("val/") for k in m)  # mean@n / best@n only for n > 1
    empty = validation_metrics(_result([], num_prompts=2), ["arith"] * 2)
    assert math.isnan(empty["val/reward_mean"]) and empty["val/prompts_missing"] == 2.0


def _scheduled(overrides: list[str]) -> Validator:
    """A rank-0 Validator built from a config's own sections (nothing to validate: only its schedule is read)."""
    cfg = load_config(None, overrides)
    return Validator(
        _Rank0(), _FakeCoordinator(), cfg.trainer, enabled=any_round(cfg.data, cfg.trainer),
        records=[PromptRecord(np.array([0], dtype=np.int32))], sources=["arith"],
        sampling=GroupSampling.defaults(n=1), timeout_s=1.0, actors_hold=True, log=None,
    )  # fmt: skip


def test_schedule_follows_verl() -> None:
    every3 = _scheduled(["trainer.test_freq=3", "trainer.val_before_train=true"])
    assert [v for v in range(1, 10) if every3.due(v)] == [3, 6, 9] and every3.at_start() and every3.at_end()
    never = _scheduled(["trainer.test_freq=-1", "trainer.val_before_train=false"])  # verl: no final validation either
    assert not any(never.due(v) for v in range(1, 10)) and not never.at_start() and not never.at_end()
    assert not never.enabled and every3.enabled
    start_only = _scheduled(["trainer.test_freq=-1", "trainer.val_before_train=true"])
    assert start_only.enabled and start_only.at_start() and not start_only.at_end() and not start_only.due(4)
    off = _scheduled(["trainer.test_freq=1", "data.val_files=null"])  # nothing to validate on
    assert not off.enabled and not off.at_start() and not off.due(1) and not off.at_end()
    five = _scheduled(["trainer.test_freq=5", "trainer.val_before_train=false"])
    assert five.trainer.test_freq == 5 and not five.at_start() and five.due(10) and not five.due(4)


class _Rank0:
    rank = 0

    def __init__(self) -> None:
        self.broadcasts: list[bytes | None] = []

    def broadcast_bytes(self, data: bytes | None, src: int = 0) -> bytes:
        self.broadcasts.append(data)
        assert data is not None
        return data


class _FakeCoordinator:
    """start_eval / wait_eval / finish_eval over a real EvalRound, answered by the test (no sockets)."""

    def __init__(self) -> None:
        self.round: EvalRound | None = None
        self.started: list[int] = []

    def start_eval(self, version: int, records: Any, sampling: Any) -> int:
        assert self.round is None
        self.round = EvalRound(len(self.started), version, records, sampling, now=0.0)
        self.started.append(version)
        return self.round.round_id

    def answer(self, indices: list[int], reward: float) -> None:
        assert self.round is not None
        for lease in self.round.grant("a", len(indices), deadline=1e9):
            comp = make_completion([1], [-0.1], version_min=self.round.version, reward=reward)
            assert self.round.deliver(lease.index, lease.lease_id, [comp], now=1.0) == "accepted"

    def wait_eval(self, round_id: int, timeout_s: float | None) -> bool:
        assert self.round is not None and self.round.round_id == round_id
        return self.round.complete

    def finish_eval(self, round_id: int) -> EvalResult:
        assert self.round is not None and self.round.round_id == round_id
        rnd, self.round = self.round, None
        return rnd.close(now=2.0)


def _validator(
    timeout_s: float = 5.0, actors_hold: bool = False
) -> tuple[Validator, _FakeCoordinator, _Rank0, list[tuple[int, dict]]]:
    """A rank-0 Validator on a fake coordinator; ``actors_hold`` False: the LoRA case (publishes wait for rounds)."""
    ctx, coord = _Rank0(), _FakeCoordinator()
    logged: list[tuple[int, dict]] = []
    records = [PromptRecord(np.array([i], dtype=np.int32)) for i in range(2)]
    val = Validator(
        ctx, coord, load_config(None, ["trainer.test_freq=2"]).trainer, enabled=True, records=records,
        sources=["arith", "arith"],
        sampling=GroupSampling.defaults(n=1, temperature=0.0), timeout_s=timeout_s, actors_hold=actors_hold,
        log=lambda s, m: logged.append((s, m)), poll_s=0.01,
    )  # fmt: skip
    return val, coord, ctx, logged


def test_a_round_is_logged_at_its_versions_step_as_soon_as_it_is_complete() -> None:
    val, coord, ctx, logged = _validator()
    val.start(4)
    assert val.before_publish(4) == 0.0  # re-publishing the pinned version (a late actor) does not wait
    val.poll()
    assert logged == [] and ctx.broadcasts == []
    coord.answer([0, 1], reward=1.0)
    val.poll()  # rank 0 sees it complete: logged now, at step 4
    assert [(s, m["val/reward_mean"], m["val/version"]) for s, m in logged] == [(4, 1.0, 4.0)]
    val.before_publish(5)  # every rank still passes the collective: rank 0 says "done" at once
    assert ctx.broadcasts == [b"D"] and val.open_version is None and val.last_version == 4
    assert val.before_publish(6) == 0.0  # nothing open: no collective at all
    assert ctx.broadcasts == [b"D"]


def test_a_publish_of_another_version_waits_and_a_timeout_logs_partial_results(
    caplog: pytest.LogCaptureFixture,
) -> None:
    val, coord, ctx, logged = _validator(timeout_s=0.05)
    val.start(2)
    coord.answer([0], reward=0.0)  # one of the two prompts done
    with caplog.at_level(logging.WARNING, logger="async_rl.runtime.validation"):
        waited = val.before_publish(3)
    assert "did not finish within" in caplog.text
    assert 0.05 <= waited < 5.0  # the seconds the publish waited (the step's learner/validation_wait_s): the timeout
    assert len(logged) == 1 and logged[0][0] == 2
    assert logged[0][1]["val/prompts_missing"] == 1.0 and logged[0][1]["val/num_samples"] == 1.0
    assert ctx.broadcasts[-1] == b"D" and set(ctx.broadcasts) <= {b"W", b"D"}
    assert coord.round is None and val.open_version is None  # closed: late results will be dropped
    val.start(4)  # the next round starts fresh
    assert coord.started == [2, 4]


def test_publishes_do_not_wait_for_a_round_when_the_actors_hold_newer_versions_back() -> None:
    val, coord, ctx, logged = _validator(timeout_s=5.0, actors_hold=True)
    val.start(4)
    coord.answer([0], reward=1.0)  # one of the two prompts done
    assert val.before_publish(5) == 0.0 and val.before_publish(6) == 0.0  # at once: no collective, nothing closed
    assert ctx.broadcasts == [] and val.open_version == 4 and logged == []
    coord.answer([1], reward=0.0)
    val.poll()  # the round completes on the actors' held-back weights and is logged at its own step
    assert [(s, m["val/reward_mean"]) for s, m in logged] == [(4, 0.5)]
    val.start(8)  # the next round: the closed one's collective passes at once
    assert ctx.broadcasts == [b"D"] and coord.started == [4, 8] and val.open_version == 8


def test_starting_a_round_while_one_is_open_waits_for_it_first() -> None:
    val, coord, _, logged = _validator()
    val.start(2)
    coord.answer([0, 1], reward=1.0)
    val.start(4)
    assert [s for s, _ in logged] == [2] and coord.started == [2, 4] and val.open_version == 4


class _CharTokenizer:
    """A stand-in tokenizer: one id per character (a batch of texts gives a list per text)."""

    def __call__(self, text: str | list[str], add_special_tokens: bool = False) -> dict[str, Any]:
        if isinstance(text, list):
            return {"input_ids": [[ord(ch) for ch in t] for t in text]}
        return {"input_ids": [ord(ch) for ch in text]}

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


def test_val_records_from_the_builtin_task_capped_like_verl() -> None:
    cfg = load_config(None, ["data.val_files=builtin:arith", "data.val_max_samples=8", "data.seed=3"])
    records, sources = resources.val_records(cfg, _CharTokenizer())
    assert len(records) == 8 and sources == ["arith"] * 8
    everything = resources.load_raw_records("builtin:arith", "prompt", "eval", 3)
    picked = np.random.default_rng(3).choice(len(everything), 8, replace=False)  # verl's draw with data.seed
    assert [r.extras["prompt"] for r in records] == [everything[i]["prompt"] for i in picked]
    assert [r.extras["ground_truth"] for r in records] == [everything[i]["ground_truth"] for i in picked]
    assert records[0].token_ids.tolist() == [ord(c) for c in everything[picked[0]]["prompt"]]
    first, _ = resources.val_records(
        load_config(None, ["data.val_max_samples=4", "data.shuffle=false"]), _CharTokenizer()
    )
    assert [r.extras["prompt"] for r in first] == [r["prompt"] for r in resources.load_raw_records(
        "builtin:arith", "prompt", "eval", 1)[:4]]  # fmt: skip
    assert len(resources.val_records(load_config(None, []), _CharTokenizer())[0]) == resources.ARITH_EVAL_SIZE
    assert resources.val_records(load_config(None, ["data.val_files=null"]), _CharTokenizer()) == ([], [])


def test_val_records_keep_the_data_source_of_each_row(tmp_path: Any) -> None:
    path = tmp_path / "val.jsonl"
    path.write_text(
        '{"prompt": "1+1=", "ground_truth": "2", "data_source": "openai/gsm8k"}\n'
        '{"prompt": "2+2=", "ground_truth": "4"}\n'
    )
    cfg = load_config(None, [f"data.val_files={path}"])
    records, sources = resources.val_records(cfg, _CharTokenizer())
    assert sources == ["openai/gsm8k", "unknown"] and [r.extras["ground_truth"] for r in records] == ["2", "4"]


def test_val_sampling_is_greedy_unless_do_sample() -> None:
    greedy = GroupSampling.for_validation(load_config(None, ["actor_rollout_ref.rollout.val_kwargs.n=4"]), seed=1)
    assert greedy == GroupSampling(n=1, temperature=0.0, top_p=1.0, top_k=-1, max_tokens=8, seed=None)
    sampled = GroupSampling.for_validation(
        load_config(
            None,
            [
                "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
                "actor_rollout_ref.rollout.val_kwargs.n=4",
                "actor_rollout_ref.rollout.val_kwargs.temperature=0.7",
                "actor_rollout_ref.rollout.val_kwargs.top_p=0.9",
                "actor_rollout_ref.rollout.val_kwargs.top_k=20",
                "data.max_response_length=12",
            ],
        ),
        seed=5,
    )
    assert sampled == GroupSampling(n=4, temperature=0.7, top_p=0.9, top_k=20, max_tokens=12, seed=5)


def test_build_validator_loads_prompts_only_when_a_round_will_run(tmp_path: Any) -> None:
    from async_rl.runtime.validation import build_validator

    ctx = _Rank0()
    off = build_validator(load_config(None, ["trainer.val_before_train=false"]), ctx, None, _CharTokenizer(), None)
    assert not off.enabled and ctx.broadcasts == []  # test_freq -1, no round before training: nothing loaded
    on = build_validator(load_config(None, ["data.val_max_samples=3"]), ctx, _FakeCoordinator(), _CharTokenizer(), None)
    assert on.at_start() and len(on.records) == 3 and ctx.broadcasts == [b""]
    assert on.actors_hold  # full weights: the actors hold newer versions back during a round
    missing = load_config(None, [f"data.val_files={tmp_path / 'nope.jsonl'}"])
    with pytest.raises(ValueError, match="not found"):  # rank 0 broadcasts the error so every rank raises it
        build_validator(missing, ctx, _FakeCoordinator(), _CharTokenizer(), None)
    assert ctx.broadcasts[-1].startswith(b"data file not found")


@pytest.mark.parametrize(
    ("overrides", "hold"),
    [
        ([], True),
        (["actor_rollout_ref.model.lora_rank=8"], False),  # adapters are loaded as they come: publishes wait
        (["async_training.actor.lend_learner_cores=true"], False),  # the learner's wait lends its cores to the round
    ],
)
def test_the_actors_hold_versions_back_for_full_weights_on_cores_of_their_own(overrides: list[str], hold: bool) -> None:
    from async_rl.runtime.validation import actors_hold

    assert actors_hold(load_config(None, overrides)) is hold


def test_train_records_capped_like_verl() -> None:
    cfg = load_config(None, ["data.train_files=builtin:arith", "data.train_max_samples=16", "data.seed=5"])
    records = resources.prompt_records(cfg, _CharTokenizer())
    everything = resources.load_raw_records("builtin:arith", "prompt", "train", 5)
    picked = np.random.default_rng(5).choice(len(everything), 16, replace=False)  # verl's draw with data.seed
    assert [r.extras["prompt"] for r in records] == [everything[i]["prompt"] for i in picked]
    first = resources.prompt_records(
        load_config(None, ["data.train_max_samples=3", "data.shuffle=false"]), _CharTokenizer()
    )
    assert [r.extras["prompt"] for r in first] == [r["prompt"] for r in resources.load_raw_records(
        "builtin:arith", "prompt", "train", 1)[:3]]  # fmt: skip
    assert len(resources.prompt_records(load_config(None, []), _CharTokenizer())) == resources.ARITH_TRAIN_SIZE
