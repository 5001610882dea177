"""Reward-model checkpoints in one process on the tiny model (fp32, one thread): a run stopped by SIGTERM after step
3 and resumed trains steps 4..6 exactly as an uninterrupted run (losses, final weights), across an epoch boundary
(20 pairs, 8 a step: 2 steps an epoch, the resume lands mid-epoch); a leftover ``.tmp`` checkpoint is ignored;
``trainer.resume_mode=disable`` starts fresh; a resume over other training data is refused."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
import torch
from safetensors.torch import load_file

from async_rl import metric_catalog as mc
from async_rl.config.reward_model_train import load_reward_model_config
from async_rl.learner.checkpoint import COMMITTED, list_checkpoints
from async_rl.learner.dist import local_context
from async_rl.runtime.graceful_stop import GracefulStop
from async_rl.runtime.metrics import read_metrics
from async_rl.runtime.reward_model_trainer import RewardModelTrainer
from async_rl.runtime.supervised import CHECKPOINT_DIR, EXPORT_DIR

REPO = Path(__file__).resolve().parents[2]
STEPS = 6


@pytest.fixture(autouse=True)
def _one_thread() -> object:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as test_reward_model_trainer.py: 2 threads on 2 shared cores ran far slower
    yield
    torch.set_num_threads(threads)


def _trainer(out: Path, pairs: Path, *overrides: str, stop: GracefulStop | None = None) -> RewardModelTrainer:
    cfg, _ = load_reward_model_config(
        [str(REPO / "configs" / "reward_model" / "tiny_toy.yaml")],
        [
            f"trainer.default_local_dir={out}",
            "model.mixed_precision.param_dtype=fp32",
            f"data.train_files={pairs}",
            f"data.val_files={pairs}",
            "data.train_batch_size=8",
            "data.micro_batch_size_per_gpu=4",
            f"trainer.total_training_steps={STEPS}",
            "trainer.test_freq=0",
            "trainer.logger=[jsonl]",
            *overrides,
        ],
    )
    return RewardModelTrainer(cfg, local_context(torch.device("cpu")), stop)


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r[mc.RM_TRAIN_LOSS] for r in read_metrics(out / "metrics.jsonl")}


def test_a_stopped_run_resumes_exactly_and_skips_incomplete_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pairs = tmp_path / "pairs.jsonl"
    sums = [(a, b) for a in range(5) for b in range(4)]
    rows = [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)} for a, b in sums]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))

    whole = _trainer(tmp_path / "whole", pairs)
    assert whole.steps_per_epoch == 2 and whole.start_step == 0
    whole.train()
    expected = _losses(tmp_path / "whole")
    assert sorted(expected) == list(range(1, STEPS + 1))
    assert not (tmp_path / "whole" / CHECKPOINT_DIR).exists()  # save_freq defaults to -1: none

    # save every 2 steps; SIGTERM arrives during step 3: the run checkpoints step 3 before step 4 and stops
    run = tmp_path / "run"
    stop = GracefulStop(deadline_s=600.0)
    try:
        first = _trainer(run, pairs, "trainer.save_freq=2", stop=stop)
        train_step = first.step

        def signal_during_step_3(step: int, order: list[int]) -> dict[str, float]:
            if step == 2:
                stop.request()
            return train_step(step, order)

        monkeypatch.setattr(first, "step", signal_during_step_3)
        summary = first.train()
    finally:
        stop.close()
    ckpts = run / CHECKPOINT_DIR
    assert summary == {"stopped": True, "steps": 3, "checkpoint": str(ckpts / "step_3")}
    assert [s for s, _ in list_checkpoints(ckpts)] == [2, 3] and not (run / EXPORT_DIR).exists()
    meta = msgspec.msgpack.decode((ckpts / "step_3" / "meta.msgpack").read_bytes())
    assert meta["version"] == 3 and meta["extra"]["epoch"] == 1 and meta["extra"]["index"] == 8  # epoch 1's 2nd batch
    # a crash while writing step 5 left this behind: not committed, so never resumed from (it holds no state)
    (ckpts / "step_5.tmp" / "dcp").mkdir(parents=True)

    resumed = _trainer(run, pairs, "trainer.save_freq=2")  # resume_mode=auto
    assert resumed.start_step == 3
    resumed.train()
    assert _losses(run) == expected  # bit-identical (one thread, fp32: the same ops in the same order)
    assert [s for s, _ in list_checkpoints(ckpts)] == [2, 3, 4, 6] and not (ckpts / "step_5.tmp").exists()
    assert (ckpts / "step_6" / COMMITTED).is_file()
    w_whole = load_file(str(tmp_path / "whole" / EXPORT_DIR / "model.safetensors"))
    w_resumed = load_file(str(run / EXPORT_DIR / "model.safetensors"))
    assert sorted(w_whole) == sorted(w_resumed)
    assert all(torch.equal(w_whole[k], w_resumed[k]) for k in w_whole)

    # resume_mode=disable ignores the checkpoints: step 1 is the fresh model's again
    fresh = _trainer(run, pairs, "trainer.resume_mode=disable", "trainer.total_training_steps=1")
    assert fresh.start_step == 0
    fresh.train()
    assert read_metrics(run / "metrics.jsonl")[-1][mc.RM_TRAIN_LOSS] == expected[1]

    # resume_path picks a given checkpoint; other training data (another batch size) is refused, naming the key
    with pytest.raises(ValueError, match=r"data\.train_batch_size: 8 then, 4 now"):
        _trainer(
            run,
            pairs,
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={ckpts / 'step_2'}",
            "data.train_batch_size=4",
        )
