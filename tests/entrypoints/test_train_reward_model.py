"""The reward-model entry point under torchrun: 2 gloo ranks (FSDP2) train exactly as one process does.

Both runs go through the real command line (``-m async_rl.entrypoints.train_reward_model``), on the tiny model in
fp32, and their metrics.jsonl lines and exported weights are compared. A torchrun launch costs ~10 s here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
ARGS = [
    "--config",
    str(REPO / "configs" / "reward_model" / "tiny_toy.yaml"),
    "data.train_batch_size=8",
    "data.micro_batch_size_per_gpu=2",  # 2 micro-batches per rank with 2 ranks, 4 in one process
    "trainer.total_training_steps=4",
    "trainer.test_freq=2",
    "trainer.logger=[jsonl]",
    "model.mixed_precision.param_dtype=fp32",
    "loss.center_rewards_coefficient=0.01",
]


def _run(cmd: list[str], out: Path, threads: str) -> list[dict]:
    env = dict(os.environ, OMP_NUM_THREADS=threads, PYTHONWARNINGS="ignore", PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [*cmd, *ARGS, f"trainer.default_local_dir={out}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        log, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail(f"{cmd} timed out:\n{log[-4000:]}")
    assert proc.returncode == 0, log[-6000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_two_ranks_train_as_one_process(tmp_path: Path) -> None:
    entry = ["-m", "async_rl.entrypoints.train_reward_model"]
    two = _run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *entry],
        tmp_path / "two",
        "1",
    )
    one = _run([sys.executable, *entry], tmp_path / "one", "1")
    assert [r["step"] for r in two] == [r["step"] for r in one] == [1, 2, 3, 4]
    for a, b in zip(two, one, strict=True):
        for key in ("rm/train/loss", "rm/train/accuracy", "rm/train/margin_mean", "rm/train/grad_norm"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), (a["step"], key)
    assert [("rm/eval/accuracy" in r) for r in two] == [False, True, False, True]  # test_freq 2, and the last step
    assert two[-1]["rm/eval/loss"] == pytest.approx(one[-1]["rm/eval/loss"], abs=1e-5)
    # the loss moved: 4 Adam steps at lr 5e-4 changed the model
    assert abs(two[-1]["rm/train/loss"] - two[0]["rm/train/loss"]) > 1e-3
    w2, w1 = (
        load_file(str(tmp_path / "two" / "hf" / "model.safetensors")),
        load_file(str(tmp_path / "one" / "hf" / "model.safetensors")),
    )
    assert sorted(w2) == sorted(w1) and "score.weight" in w2
    assert max(float((w2[k] - w1[k]).abs().max()) for k in w2) < 1e-5


def test_dry_run_checks_the_data_and_a_bad_key_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from async_rl.entrypoints.train_reward_model import main

    assert main(["--dry-run", f"trainer.default_local_dir={tmp_path}", "data.max_length=5"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["train"]["pairs"] == 490 and plan["eval"]["pairs"] == 100 and plan["train"]["longest"] == 5
    assert plan["train"]["truncated"] > 0  # "a+b=" plus a two-digit sum is 6 characters: cut from the left
    (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": "1+1=", "chosen": "2"}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: record has no field 'rejected'"):
        main(["--dry-run", f"trainer.default_local_dir={tmp_path}", f"data.train_files={tmp_path / 'bad.jsonl'}"])
    with pytest.raises(SystemExit) as info:
        main(["data.max_lenght=5"])
    assert info.value.code == 2
    assert "did you mean `data.max_length`?" in capsys.readouterr().err


def test_a_run_stopped_by_sigterm_exits_143(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from async_rl.entrypoints.train_reward_model import main
    from async_rl.runtime import reward_model_trainer

    def stopped(cfg: object) -> dict[str, object]:
        return {"stopped": True, "steps": 3, "checkpoint": None}

    monkeypatch.setattr(reward_model_trainer, "run_reward_model_training", stopped)
    assert main([f"trainer.default_local_dir={tmp_path}"]) == 128 + signal.SIGTERM
