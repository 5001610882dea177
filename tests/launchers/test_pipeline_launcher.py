"""launchers/pipeline.py: each stage's command from its kind, config and inputs; a finished stage skipped on a rerun;
a failing stage stops the pipeline with its exit code; and end to end, SFT then RL from the SFT'd model on the tiny
model (real torchrun, vLLM, ZeroMQ and weight sync), rerun as a no-op."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from async_rl.config.errors import ConfigError
from async_rl.config.pipeline import load_pipeline_config

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "launchers" / "pipeline.py"
sys.path.insert(0, str(REPO / "launchers"))

import pipeline  # noqa: E402


def _write(path: Path, run_dir: Path, stages: list[dict]) -> Path:
    path.write_text(json.dumps({"run_dir": str(run_dir), "stages": stages}))  # JSON is YAML
    return path


SFT = {"name": "sft", "kind": "sft", "config": "configs/sft/tiny_arith.yaml", "nproc_per_node": 2}
RM = {"name": "rm", "kind": "rm", "config": "configs/reward_model/tiny_toy.yaml", "overrides": ["optim.lr=1e-3"]}
RL = {
    "name": "rl",
    "kind": "rl",
    "config": "configs/smoke_grpo.yaml",
    "inputs": {"actor_rollout_ref.model.path": "sft", "reward.reward_model.path": "rm"},
    "actors": 1,
}


def test_each_stage_runs_its_entry_point_with_the_models_of_earlier_stages(tmp_path: Path) -> None:
    cfg, _ = load_pipeline_config([str(_write(tmp_path / "p.yaml", tmp_path / "run", [SFT, RM, RL]))], [])
    exports: dict[str, Path] = {}
    commands = []
    for stage in cfg.stages:
        commands.append(pipeline.stage_command(cfg, stage, exports))
        exports[stage.name] = tmp_path / "run" / stage.name / pipeline.EXPORT[stage.kind]
    sft, rm, rl = commands
    assert sft[1:] == [
        "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "async_rl.entrypoints.sft",
        "--config", "configs/sft/tiny_arith.yaml", f"trainer.default_local_dir={tmp_path / 'run' / 'sft'}",
    ]  # fmt: skip
    assert rm[1:] == [
        "-m",
        "async_rl.entrypoints.train_reward_model",
        "--config",
        "configs/reward_model/tiny_toy.yaml",
        "optim.lr=1e-3",
        f"trainer.default_local_dir={tmp_path / 'run' / 'rm'}",
    ]  # fmt: skip  (one rank: no torchrun)
    assert rl[1:] == [
        str(REPO / "launchers" / "local.py"), "--config", "configs/smoke_grpo.yaml", "--run-dir",
        str(tmp_path / "run" / "rl"), "--nproc-per-node", "1", "--actors", "1",
        f"actor_rollout_ref.model.path={tmp_path / 'run' / 'sft' / 'hf'}",
        f"reward.reward_model.path={tmp_path / 'run' / 'rm' / 'hf'}",
        f"trainer.default_local_dir={tmp_path / 'run' / 'rl'}",
    ]  # fmt: skip


def test_an_opd_stage_runs_the_rl_launcher_with_distillation_from_an_earlier_stages_model(tmp_path: Path) -> None:
    opd = {
        "name": "opd",
        "kind": "opd",
        "config": "configs/smollm2_arith_opd.yaml",
        "inputs": {"distillation.teacher_model.model_path": "rl"},
        "nproc_per_node": 2,
    }
    grpo = {"name": "rl", "kind": "rl", "config": "configs/smollm2_arith_grpo.yaml"}
    cfg, _ = load_pipeline_config([str(_write(tmp_path / "p.yaml", tmp_path / "run", [grpo, opd]))], [])
    teacher = tmp_path / "run" / "rl" / pipeline.EXPORT["rl"]
    command = pipeline.stage_command(cfg, cfg.stages[1], {"rl": teacher})
    assert command[1:] == [
        str(REPO / "launchers" / "local.py"), "--config", "configs/smollm2_arith_opd.yaml", "--run-dir",
        str(tmp_path / "run" / "opd"), "--nproc-per-node", "2",
        f"distillation.teacher_model.model_path={teacher}", f"trainer.default_local_dir={tmp_path / 'run' / 'opd'}",
        "distillation.enabled=true",
    ]  # fmt: skip
    assert pipeline.EXPORT["opd"] == "final_hf"


def test_a_generate_stage_runs_the_rl_launcher_as_one_rejection_sampling_process(tmp_path: Path) -> None:
    gen = {"name": "rs", "kind": "generate", "config": "configs/smollm2_arith_grpo.yaml", "inputs": {}}
    sft = {**SFT, "inputs": {"data.train_files": "rs"}}
    cfg, _ = load_pipeline_config([str(_write(tmp_path / "p.yaml", tmp_path / "run", [gen, sft]))], [])
    rs_dir = tmp_path / "run" / "rs"
    command = pipeline.stage_command(cfg, cfg.stages[0], {})
    assert command[1:8] == [
        str(REPO / "launchers" / "local.py"), "--config", "configs/smollm2_arith_grpo.yaml", "--run-dir", str(rs_dir),
        "--nproc-per-node", "1",
    ]  # fmt: skip
    assert command[8:] == [
        f"trainer.default_local_dir={rs_dir}",
        "rejection_sampling.enable=true",
        f"rejection_sampling.output={rs_dir / 'rejection_sampling.jsonl'}",
        "trainer.n_gpus_per_node=1",  # the recipe says 2: a generation job is one process
    ]
    exports = {"rs": rs_dir / pipeline.EXPORT["generate"]}
    assert f"data.train_files={exports['rs']}" in pipeline.stage_command(cfg, cfg.stages[1], exports)
    from async_rl.config import load_config

    cfg_rs = load_config([str(REPO / "configs" / "smollm2_arith_grpo.yaml")], command[8:])  # the stage's config loads
    assert cfg_rs.rejection_sampling.enable and cfg_rs.trainer.n_gpus_per_node == 1
    # the stage's own config asking for parquet keeps its format (in the stage's run directory), and hands it on
    parquet = {**gen, "overrides": ["rejection_sampling.output=/elsewhere/rows.parquet"]}
    cfg, _ = load_pipeline_config([str(_write(tmp_path / "p.yaml", tmp_path / "run", [parquet, sft]))], [])
    assert pipeline.export_path(cfg, cfg.stages[0]) == rs_dir / "rejection_sampling.parquet"
    command = pipeline.stage_command(cfg, cfg.stages[0], {})
    assert command[-2] == f"rejection_sampling.output={rs_dir / 'rejection_sampling.parquet'}"  # after the stage's own
    assert pipeline.export_path(cfg, cfg.stages[1]) == tmp_path / "run" / "sft" / "hf"


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ([RL, SFT], r"stages\[0\] \('rl'\): inputs.actor_rollout_ref.model.path names 'sft', which is not an earlier"),
        ([SFT, SFT], r"stages\[1\] \('sft'\): the name is used by an earlier stage"),
        ([{**SFT, "actors": 2}], r"actors is set but a 'sft' stage runs no actors"),
        ([{**SFT, "kind": "generate"}], r"a 'generate' stage runs one learner process; nproc_per_node must be 1"),
        ([], "a pipeline needs at least one stage"),
    ],
)
def test_a_bad_pipeline_is_refused_naming_the_stage(tmp_path: Path, stages: list[dict], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_pipeline_config([str(_write(tmp_path / "p.yaml", tmp_path / "run", stages))], [])


def test_a_finished_stage_is_skipped_and_a_failing_one_stops_the_pipeline(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "sft").mkdir(parents=True)
    (run / "sft" / pipeline.DONE_FILE).write_text(json.dumps({"export": str(run / "sft" / "hf")}))
    broken = {**SFT, "name": "again", "nproc_per_node": 1, "overrides": ["data.max_lenght=5"]}  # a typo: exit 2
    after = {**SFT, "name": "never", "nproc_per_node": 1}
    path = _write(tmp_path / "p.yaml", run, [SFT, broken, after])
    done = subprocess.run(
        [sys.executable, str(LAUNCHER), "--config", str(path)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "stage 1/3 sft: finished before" in done.stderr
    assert "stage again failed with exit code 2" in done.stderr and "did you mean `data.max_length`?" in done.stderr
    assert "stage 3/3" not in done.stderr and not (run / "again" / pipeline.DONE_FILE).exists()


@pytest.mark.slow
def test_sft_then_rl_from_the_sft_model_then_distillation_of_it_end_to_end(tmp_path: Path) -> None:
    """SFT, GRPO from the SFT model, then on-policy distillation of the GRPO model into the base model (an 'opd'
    stage, its teacher on the learner)."""
    run = tmp_path / "run"
    sft = {**SFT, "nproc_per_node": 1, "overrides": ["trainer.total_training_steps=20", "trainer.logger=[jsonl]"]}
    rl = {
        "name": "rl",
        "kind": "rl",
        "config": "configs/smoke_grpo.yaml",
        "inputs": {"actor_rollout_ref.model.path": "sft"},
        "overrides": ["trainer.total_training_steps=2", "data.train_batch_size=4"],
        "actors": 1,
    }
    opd = {
        "name": "opd",
        "kind": "opd",
        "config": "configs/smoke_grpo.yaml",
        "inputs": {"distillation.teacher_model.model_path": "rl"},
        "overrides": [
            "trainer.total_training_steps=2",
            "data.train_batch_size=4",
            "distillation.distillation_loss.loss_mode=k1",
            "distillation.distillation_loss.use_task_rewards=false",
        ],
        "actors": 1,
    }
    path = _write(tmp_path / "p.yaml", run, [sft, rl, opd])
    cmd = [sys.executable, str(LAUNCHER), "--config", str(path)]
    first = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-4000:]
    sft_lines = [json.loads(x) for x in (run / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in sft_lines] == list(range(1, 21))
    rl_lines = [json.loads(x) for x in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rl_lines if "val/version" not in r] == [1, 2]
    learner_log = (run / "rl" / "logs" / "learner.log").read_text()
    actor_log = (run / "rl" / "logs" / "actor-0.log").read_text()
    assert f"policy {run / 'sft' / 'hf'};" in learner_log  # the RL stage's policy is the SFT stage's export ...
    assert f"Starting to load model {run / 'sft' / 'hf'}" in actor_log  # ... on the learner and in vLLM
    opd_lines = [json.loads(x) for x in (run / "opd" / "metrics.jsonl").read_text().splitlines()]
    opd_steps = [r for r in opd_lines if "val/version" not in r]
    assert [r["step"] for r in opd_steps] == [1, 2]
    # the SFT-and-GRPO teacher is far from the untrained student: the signal is there, finite, and trained on
    assert all(
        r["learner/distillation/reverse_kl"] > 0.1 and r["learner/distillation/abs_estimate"] > 0.1 for r in opd_steps
    )
    assert all(r["learner/actor/pg_loss"] == 0.0 for r in opd_steps)  # the teacher's signal alone
    opd_learner = (run / "opd" / "logs" / "learner.log").read_text()
    assert "teacher: " in opd_learner and "FSDP2 units" in opd_learner  # built on the learner ...
    assert "teacher engine up" not in (run / "opd" / "logs" / "actor-0.log").read_text()  # ... not on the actor
    for name in ("sft", "rl", "opd"):
        record = json.loads((run / name / pipeline.DONE_FILE).read_text())
        assert Path(record["export"], "config.json").is_file() and record["seconds"] > 0
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0
    assert "stage 1/3 sft: finished before" in again.stderr and "stage 2/3 rl: finished before" in again.stderr
    assert "stage 3/3 opd: finished before" in again.stderr


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "pipelines").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_pipeline_loads_with_stage_configs_that_validate(path: Path) -> None:
    from async_rl.config import load_config
    from async_rl.config.reward_model_train import load_reward_model_config
    from async_rl.config.sft import load_sft_config

    cfg, _ = load_pipeline_config([str(path)], [])
    loaders = {
        "sft": load_sft_config,
        "rm": load_reward_model_config,
        "rl": lambda p, o: (load_config(p, o), []),
        "opd": lambda p, o: (load_config(p, [*o, "distillation.enabled=true"]), []),
        "generate": lambda p, o: (
            load_config(p, [*o, "rejection_sampling.enable=true", "trainer.n_gpus_per_node=1"]),
            [],
        ),
    }
    for stage in cfg.stages:
        inputs = [f"{key}=builtin:tiny-arith" for key in stage.inputs]  # any model path parses
        loaders[stage.kind]([str(REPO / stage.config)], [*stage.overrides, *inputs])
