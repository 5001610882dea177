"""The SFT entry point under torchrun: 2 gloo ranks (FSDP2) train exactly as one process does.

Both runs go through the real command line (``-m async_rl.entrypoints.sft``), on the tiny model in fp32, with
rows of different lengths packed without padding, and their metrics.jsonl lines and exported weights are compared.
A torchrun launch costs ~10 s here.
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


def _args(demos: Path) -> list[str]:
    return [
        "--config",
        str(REPO / "configs" / "sft" / "tiny_arith.yaml"),
        f"data.train_files={demos}",
        "data.val_files=builtin:arith-sft",
        "data.train_batch_size=8",
        "data.micro_batch_size_per_gpu=2",  # 2 micro-batches per rank with 2 ranks, 4 in one process
        "trainer.total_training_steps=4",
        "trainer.test_freq=2",
        "trainer.logger=[jsonl]",
        "model.mixed_precision.param_dtype=fp32",
    ]


def _run(cmd: list[str], demos: Path, out: Path) -> list[dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [*cmd, *_args(demos), f"trainer.default_local_dir={out}"],
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
    demos = tmp_path / "demos.jsonl"  # one- to three-digit sums: rows of 5 to 12 tokens
    rows = [{"prompt": f"{a}+{b}=", "response": str(a + b)} for a, b in [(7, 5), (123, 456), (40, 2), (999, 1)] * 8]
    demos.write_text("".join(json.dumps(r) + "\n" for r in rows))
    entry = ["-m", "async_rl.entrypoints.sft"]
    two = _run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *entry],
        demos,
        tmp_path / "two",
    )
    one = _run([sys.executable, *entry], demos, tmp_path / "one")
    assert [r["step"] for r in two] == [r["step"] for r in one] == [1, 2, 3, 4]
    for a, b in zip(two, one, strict=True):
        for key in ("sft/train/loss", "sft/train/grad_norm", "sft/train/trained_tokens"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), (a["step"], key)
    assert [("sft/val/loss" in r) for r in two] == [False, True, False, True]  # test_freq 2, and the last step
    assert two[-1]["sft/val/loss"] == pytest.approx(one[-1]["sft/val/loss"], rel=1e-5)
    assert two[-1]["sft/val/tokens"] == one[-1]["sft/val/tokens"] > 0
    assert two[-1]["sft/train/loss"] < two[0]["sft/train/loss"] - 1e-3  # 4 steps moved the model
    w2, w1 = (
        load_file(str(tmp_path / "two" / "hf" / "model.safetensors")),
        load_file(str(tmp_path / "one" / "hf" / "model.safetensors")),
    )
    assert sorted(w2) == sorted(w1) and "model.embed_tokens.weight" in w2
    assert max(float((w2[k] - w1[k]).abs().max()) for k in w2) < 1e-5


def test_dry_run_checks_the_data_and_a_bad_key_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from async_rl.entrypoints.sft import main

    assert main(["--dry-run", f"trainer.default_local_dir={tmp_path}"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["train"]["rows"] == 20000 and plan["validation"]["rows"] == 200
    assert plan["train"]["chat_rendered"] == 0 and plan["train"]["longest"] <= 10  # "ab+cd=" + up to 3 digits + EOS
    (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": "1+1="}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: record has no field 'response'"):
        main(["--dry-run", f"trainer.default_local_dir={tmp_path}", f"data.train_files={tmp_path / 'bad.jsonl'}"])
    with pytest.raises(SystemExit) as info:
        main(["data.max_lenght=5"])
    assert info.value.code == 2
    assert "did you mean `data.max_length`?" in capsys.readouterr().err


def test_a_run_stopped_by_sigterm_exits_143(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from async_rl.entrypoints.sft import main
    from async_rl.runtime import sft_trainer

    monkeypatch.setattr(sft_trainer, "run_sft", lambda cfg: {"stopped": True, "steps": 3, "checkpoint": None})
    assert main([f"trainer.default_local_dir={tmp_path}"]) == 128 + signal.SIGTERM
