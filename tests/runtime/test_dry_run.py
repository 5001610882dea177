"""Every shipped config passes the dry-run of both entry points (config + wiring, no model load, no generation)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from async_rl.config import load_config
from async_rl.runtime.dry_run import dry_run_report

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def test_configs_are_shipped():
    names = {p.name for p in CONFIGS}
    assert {"demo_grpo.yaml", "demo_ppo.yaml", "qwen2.5-0.5b_gsm8k_grpo.yaml", "qwen2.5-0.5b_gsm8k_ppo.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_dry_run_report_for_every_config(path):
    cfg = load_config([str(path)])
    report = dry_run_report(cfg)
    assert report["sequences_per_step"] == cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n
    assert report["coordinator"].startswith("tcp://127.0.0.1:")
    assert (report["critic"] is not None) == (cfg.algorithm.adv_estimator == "gae")
    if "qwen" in path.name:
        assert report["policy"]["path"] == "Qwen/Qwen2.5-0.5B-Instruct"
        assert report["reward"] == "async_rl.rewards.gsm8k:compute_score"
    assert (report["distillation"] is not None) == cfg.distillation.enabled
    if path.name == "smollm2_arith_opd.yaml":
        assert report["distillation"]["teacher"]["path"] == "outputs/smollm2/final_hf"
        assert (report["distillation"]["loss_mode"], report["distillation"]["with_task_rewards"]) == ("k1", False)


ENTRYPOINTS = ["async_rl.entrypoints.train", "async_rl.entrypoints.actor"]


@pytest.mark.parametrize("module", ENTRYPOINTS)
def test_entrypoint_dry_run_for_every_config(module, capsys):
    """Each entry point's ``main`` with ``--dry-run`` on every shipped config prints the report as JSON and returns 0.
    In this process: a subprocess per config costs seconds of imports each (the next test runs one)."""
    main = importlib.import_module(module).main
    for path in CONFIGS:
        assert main(["--config", str(path), "--dry-run"]) == 0, path.name
        report = json.loads(capsys.readouterr().out)
        assert report["adv_estimator"] == load_config([str(path)]).algorithm.adv_estimator, path.name


@pytest.mark.parametrize("module", ENTRYPOINTS)
def test_entrypoint_dry_run_subprocess(module):
    """``python -m`` each entry point, as the launchers run it, on one config."""
    path = ROOT / "configs" / "qwen2.5-0.5b_gsm8k_ppo.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", module, "--config", str(path), "--dry-run"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, f"{module} --dry-run {path.name} failed:\n{proc.stderr[-2000:]}"
    report = json.loads(proc.stdout)
    assert report["adv_estimator"] == "gae" and report["policy"]["path"] == "Qwen/Qwen2.5-0.5B-Instruct"


def test_dry_run_rejects_bad_key_naming_it():
    proc = subprocess.run(
        [sys.executable, "-m", "async_rl.entrypoints.train", "--dry-run", "algorithm.adv_estimator=grpoo"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "algorithm.adv_estimator" in proc.stderr and "grpo" in proc.stderr


def test_dry_run_builds_the_actors_engine_arguments_when_engine_kwargs_are_set():
    """verl's ``engine_kwargs.vllm`` are checked as the actor will pass them to vLLM, before any process starts."""
    pytest.importorskip("vllm")
    path = str(ROOT / "configs" / "smollm2_arith_grpo.yaml")
    key = "actor_rollout_ref.rollout.engine_kwargs.vllm"
    report = dry_run_report(load_config([path], [f"{key}.block_size=64"]))
    assert report["engine"]["engine_kwargs"] == {"vllm": {"block_size": 64}}
    assert dry_run_report(load_config([path]))["engine"]["engine_kwargs"] == {}
    with pytest.raises(ValueError, match=r"engine_kwargs\.vllm\.no_such_arg: not an argument of vLLM's engine"):
        dry_run_report(load_config([path], [f"{key}.no_such_arg=1"]))
    with pytest.raises(ValueError, match=r"engine_kwargs\.vllm\.max_num_seqs: set by the actor"):
        dry_run_report(load_config([path], [f"{key}.max_num_seqs=4"]))
