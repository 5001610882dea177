"""The multi-node shell launchers and the SLURM heterogeneous-job script.

SLURM and GPUs are not available here, so: every script must parse (`bash -n`); the node scripts' DRY_RUN output is
checked argument by argument; actor_node.sh's supervision runs for real with a stand-in `python`; and the sbatch file
runs end to end in DRY_RUN mode with a stand-in `srun` that executes its command once on this machine, which checks
that the learner and the actors are wired to the same coordinator, ports, actor count and CURVE keys.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCHERS = REPO / "launchers"
TS = "async_training.transport"

FAKE_ACTOR = r"""
import json, os, signal, sys, time
from pathlib import Path
from typing import Any

run = Path(os.environ["FAKE_RUN"])
if "async_rl.entrypoints.reward_server" in sys.argv:
    name = "reward-server"
    with open(run / "reward-server.runs", "a") as runs:
        runs.write(" ".join(sys.argv[1:]) + "\n")
else:
    name = sys.argv[sys.argv.index("--actor-id") + 1]
plan = json.loads((run / "plan.json").read_text())[name]
(run / f"{name}.pid").write_text(str(os.getpid()))


def on_term(signum, frame):
    (run / f"{name}.term").write_text("TERM")
    sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
deadline = time.monotonic() + 20
while any(not (run / f).exists() for f in plan.get("wait_for", [])) and time.monotonic() < deadline:
    time.sleep(0.02)
print(f"{name} running", flush=True)
if plan["mode"] == "exit":
    sys.exit(plan["code"])
while True:
    time.sleep(0.1)
"""

FAKE_SRUN = """#!/usr/bin/env bash
# stand-in srun: one task on this machine; a node script's output goes to $SRUN_OUT/het<group>.out
group=x
while [[ "$1" == -* ]]; do
  [[ "$1" == --het-group=* ]] && group=${1#--het-group=}
  shift
done
if [[ "$1" == bash ]]; then
  exec "$@" >>"$SRUN_OUT/het$group.out"
fi
exec "$@"
"""


def _env(**extra: str) -> dict[str, str]:
    """A clean environment (no SLURM_* or CUDA_* from the caller) plus ``extra``."""
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return {**base, **extra}


def _run(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    cmd = ["bash", str(LAUNCHERS / script), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=REPO)


def _value(argv: list[str], key: str) -> str:
    return [a.split("=", 1)[1] for a in argv if a.startswith(key + "=")][-1]


def test_every_script_parses() -> None:
    scripts = sorted([*LAUNCHERS.glob("*.sh"), *LAUNCHERS.glob("*.sbatch")])
    assert {p.name for p in scripts} >= {"learner_node.sh", "actor_node.sh", "slurm_hetjob.sbatch"}
    for script in scripts:
        res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, f"{script.name}: {res.stderr}"


def test_sbatch_is_a_hetjob_using_both_node_scripts() -> None:
    text = (LAUNCHERS / "slurm_hetjob.sbatch").read_text()
    assert "#SBATCH hetjob" in text
    srun_lines = [ln for ln in text.replace("\\\n", " ").splitlines() if ln.startswith("srun ")]
    assert any("--het-group=0" in ln and "launchers/learner_node.sh" in ln for ln in srun_lines)
    assert any("--het-group=1" in ln and "launchers/actor_node.sh" in ln for ln in srun_lines)


def test_learner_node_dry_run_multi_node_with_curve(tmp_path: Path) -> None:
    env = _env(
        DRY_RUN="1", NNODES="2", NODE_RANK="1", MASTER_ADDR="10.0.0.5", NPROC_PER_NODE="4", NUM_ACTORS="8",
        CURVE_DIR="/keys", CONFIGS="a.yaml b.yaml", TORCHRUN="python -m torch.distributed.run", RDZV_ID="job7",
    )  # fmt: skip
    res = _run("learner_node.sh", env, "trainer.experiment_name=x")
    assert res.returncode == 0, res.stderr
    argv = shlex.split(res.stdout)
    head = "python -m torch.distributed.run --nnodes 2 --node_rank 1 --nproc_per_node 4 --rdzv_backend c10d"
    head += " --rdzv_endpoint 10.0.0.5:29400 --rdzv_id job7 -m async_rl.entrypoints.train"
    head += " --config a.yaml --config b.yaml trainer.experiment_name=x"
    assert shlex.join(argv).startswith(head)
    # off loopback: bind every interface on rank 0, and all five CURVE keys point into CURVE_DIR's layout
    assert _value(argv, f"{TS}.host") == "0.0.0.0" and _value(argv, f"{TS}.port") == "29410"
    assert _value(argv, "async_training.weight_sync.master_addr") == "10.0.0.5"
    assert _value(argv, "async_training.weight_sync.master_port") == "29420"
    assert _value(argv, "async_training.num_actors") == "8"
    assert _value(argv, "trainer.nnodes") == "2" and _value(argv, "trainer.n_gpus_per_node") == "4"
    assert _value(argv, f"{TS}.curve_server_secret_key") == "/keys/server.key_secret"
    assert _value(argv, f"{TS}.curve_server_public_key") == "/keys/server.key"
    assert _value(argv, f"{TS}.curve_client_keys_dir") == "/keys/authorized"
    assert _value(argv, f"{TS}.curve_client_secret_key").startswith("/keys/clients/")
    assert _value(argv, f"{TS}.curve_client_public_key").startswith("/keys/authorized/")


def test_learner_node_single_node_loopback_needs_no_keys() -> None:
    res = _run("learner_node.sh", _env(DRY_RUN="1", NPROC_PER_NODE="2"))
    assert res.returncode == 0, res.stderr
    argv = shlex.split(res.stdout)
    assert (
        argv[0] == "torchrun"
        and "--rdzv_endpoint" in argv
        and argv[argv.index("--rdzv_endpoint") + 1] == ("127.0.0.1:29400")
    )
    assert _value(argv, f"{TS}.host") == "127.0.0.1"
    assert not any("curve" in a for a in argv)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MASTER_ADDR": "10.0.0.5"}, "python -m async_rl.transport.keys DIR"),  # off loopback without keys
        ({"NNODES": "2"}, "MASTER_ADDR=127.0.0.1 is loopback"),
        ({"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "h", "CURVE_DIR": "/k"}, "NODE_RANK (2) must be < NNODES"),
        ({"NPROC_PER_NODE": "two"}, "NPROC_PER_NODE must be a non-negative integer"),
        ({"RDZV_BACKEND": "etcd"}, "RDZV_BACKEND must be c10d or static"),
    ],
)
def test_learner_node_rejects_bad_settings(env: dict[str, str], message: str) -> None:
    res = _run("learner_node.sh", _env(**{"DRY_RUN": "1", "NPROC_PER_NODE": "1", **env}))
    assert res.returncode == 2
    assert message in res.stderr


def test_learner_node_refuses_missing_key_files(tmp_path: Path) -> None:
    res = _run("learner_node.sh", _env(NPROC_PER_NODE="1", MASTER_ADDR="10.0.0.5", CURVE_DIR=str(tmp_path)))
    assert res.returncode == 2
    assert f"CURVE key file {tmp_path}/server.key is missing" in res.stderr


def _actor_lines(stdout: str) -> list[list[str]]:
    return [shlex.split(line) for line in stdout.strip().splitlines()]


def test_actor_node_dry_run_one_actor_per_gpu_slice_with_global_ids() -> None:
    env = _env(
        DRY_RUN="1", CUDA_VISIBLE_DEVICES="4,5,6,7", GPUS_PER_ACTOR="2", NODE_INDEX="1", COORD_ADDR="10.0.0.5",
        CURVE_DIR="/keys", CONFIGS="a.yaml", NUM_ACTORS="4", REWARD_SERVER="0",
    )  # fmt: skip
    res = _run("actor_node.sh", env, "trainer.experiment_name=x")
    assert res.returncode == 0, res.stderr
    lines = _actor_lines(res.stdout)
    # 4 GPUs / 2 per actor = 2 actors; node 1 x 2 actors per node -> ids start at actor-2
    assert [ln[1] for ln in lines] == ["CUDA_VISIBLE_DEVICES=4,5", "CUDA_VISIBLE_DEVICES=6,7"]
    for argv, name in zip(lines, ["actor-2", "actor-3"], strict=True):
        assert argv[2:8] == ["python", "-m", "async_rl.entrypoints.actor", "--config", "a.yaml", "--coordinator"]
        assert argv[argv.index("--coordinator") + 1] == "tcp://10.0.0.5:29410"
        assert argv[argv.index("--actor-id") + 1] == name
        assert "trainer.experiment_name=x" in argv and _value(argv, "async_training.num_actors") == "4"
        assert _value(argv, "async_training.weight_sync.master_addr") == "10.0.0.5"
        assert _value(argv, f"{TS}.curve_client_secret_key") == f"/keys/clients/{name}.key_secret"
        assert _value(argv, f"{TS}.curve_client_public_key") == f"/keys/authorized/{name}.key"
        assert _value(argv, f"{TS}.curve_server_public_key") == "/keys/server.key"


def test_actor_node_without_gpus_runs_one_cpu_actor() -> None:
    res = _run("actor_node.sh", _env(DRY_RUN="1", CUDA_VISIBLE_DEVICES="", COORD_ADDR="127.0.0.1", REWARD_SERVER="0"))
    assert res.returncode == 0, res.stderr
    (argv,) = _actor_lines(res.stdout)
    assert argv[:4] == ["env", "python", "-m", "async_rl.entrypoints.actor"]
    assert argv[argv.index("--actor-id") + 1] == "actor-0"
    assert not any("curve" in a for a in argv)


def test_several_cpu_actors_on_a_node_each_get_their_own_cores() -> None:
    """vLLM's own `auto` binding would put every actor's worker threads on the same cores (the local launcher's
    test_local_cpu_actors_each_get_their_own_cores); the node script slices the CPUs it may use, as that one does."""
    cpus = sorted(os.sched_getaffinity(0))
    base = dict(DRY_RUN="1", CUDA_VISIBLE_DEVICES="", COORD_ADDR="127.0.0.1", REWARD_SERVER="0")
    res = _run("actor_node.sh", _env(**base, ACTORS_PER_NODE="2"))
    assert res.returncode == 0, res.stderr
    width = max(1, len(cpus) // 2)
    expected = [cpus[(i * width) % len(cpus) :][:width] for i in range(2)]
    binds = [argv[1] for argv in _actor_lines(res.stdout)]
    assert binds == [f"VLLM_CPU_OMP_THREADS_BIND={','.join(map(str, c))}" for c in expected]
    if len(cpus) >= 2:  # on this 2-core machine: core 0 and core 1
        assert set(expected[0]).isdisjoint(expected[1])
    # one actor, the user's own binding, or tensor parallelism: vLLM's binding is left alone
    for extra in (
        {},
        {"ACTORS_PER_NODE": "2", "VLLM_CPU_OMP_THREADS_BIND": "0"},
        {"ACTORS_PER_NODE": "2", "GPUS_PER_ACTOR": "2"},
    ):
        res = _run("actor_node.sh", _env(**base, **extra))
        assert res.returncode == 0, res.stderr
        assert all(argv[1] == "python" for argv in _actor_lines(res.stdout)), res.stdout


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"COORD_ADDR": "10.0.0.5"}, "python -m async_rl.transport.keys DIR"),
        ({"COORD_ADDR": "127.0.0.1", "CUDA_VISIBLE_DEVICES": "0", "GPUS_PER_ACTOR": "2"}, "ACTORS_PER_NODE must be"),
        ({"COORD_ADDR": "127.0.0.1", "CUDA_VISIBLE_DEVICES": "0", "ACTORS_PER_NODE": "2"}, "needs more than the 1"),
        ({}, "COORD_ADDR must name"),
    ],
)
def test_actor_node_rejects_bad_settings(env: dict[str, str], message: str) -> None:
    res = _run("actor_node.sh", _env(DRY_RUN="1", **env))
    assert res.returncode == 2
    assert message in res.stderr


@pytest.fixture
def fake_python(tmp_path: Path) -> Iterator[Path]:
    """An executable standing in for `python -m async_rl.entrypoints.actor`; kills leftovers of a failed test."""
    exe = tmp_path / "fake-python"
    exe.write_text(f"#!{sys.executable}\n{FAKE_ACTOR}")
    exe.chmod(0o755)
    yield exe
    for pidfile in tmp_path.glob("*.pid"):
        pid = int(pidfile.read_text())
        try:
            if str(exe).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _start_actor_node(tmp_path: Path, exe: Path, plan: Mapping[str, Any], **extra: str) -> subprocess.Popen[str]:
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = _env(
        PYTHON=str(exe), FAKE_RUN=str(tmp_path), COORD_ADDR="127.0.0.1", CUDA_VISIBLE_DEVICES="",
        ACTORS_PER_NODE=str(len([n for n in plan if n.startswith("actor-")])), LOG_DIR=str(tmp_path / "logs"),
        STOP_GRACE_S="5", REWARD_SERVER="1" if "reward-server" in plan else "0", **extra,
    )  # fmt: skip
    cmd = ["bash", str(LAUNCHERS / "actor_node.sh")]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def _assert_all_gone(tmp_path: Path, names: list[str]) -> None:
    for name in names:
        pid = int((tmp_path / f"{name}.pid").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_actor_node_failure_stops_the_other_actors(tmp_path: Path, fake_python: Path) -> None:
    plan = {
        "actor-0": {"mode": "sleep"},
        "actor-1": {"mode": "exit", "code": 3, "wait_for": ["actor-0.pid", "actor-2.pid"]},
        "actor-2": {"mode": "sleep"},
    }
    proc = _start_actor_node(tmp_path, fake_python, plan)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 3, err
    assert f"actor-1 failed with exit code 3; log: {tmp_path}/logs/actor-1.log" in err
    assert (tmp_path / "logs" / "actor-1.log").read_text() == "actor-1 running\n"
    assert (tmp_path / "actor-0.term").exists() and (tmp_path / "actor-2.term").exists()
    _assert_all_gone(tmp_path, list(plan))


def test_actor_node_exits_0_when_every_actor_is_shut_down(tmp_path: Path, fake_python: Path) -> None:
    plan = {"actor-0": {"mode": "exit", "code": 0}, "actor-1": {"mode": "exit", "code": 0}}
    proc = _start_actor_node(tmp_path, fake_python, plan)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "actor-0 exited 0" in err and "actor-1 exited 0" in err


def test_actor_node_forwards_sigterm(tmp_path: Path, fake_python: Path) -> None:
    plan = {"actor-0": {"mode": "sleep"}, "actor-1": {"mode": "sleep"}}
    proc = _start_actor_node(tmp_path, fake_python, plan)
    try:
        deadline = time.monotonic() + 15
        while not all((tmp_path / f"{n}.pid").exists() for n in plan):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.2)  # let the script reach its supervision loop (traps installed)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert all((tmp_path / f"{n}.term").exists() for n in plan)
    _assert_all_gone(tmp_path, list(plan))


def test_actor_node_dry_run_runs_a_reward_server_its_actors_dial_on_loopback() -> None:
    env = _env(
        DRY_RUN="1", CUDA_VISIBLE_DEVICES="4,5", NODE_INDEX="1", COORD_ADDR="10.0.0.5", CURVE_DIR="/keys",
        REWARD_SERVER="1", REWARD_PORT="29555",
    )  # fmt: skip
    res = _run("actor_node.sh", env, "reward.reward_model.enable=true")
    assert res.returncode == 0, res.stderr
    server, *actors = _actor_lines(res.stdout)
    assert server[:5] == ["env", "CUDA_VISIBLE_DEVICES=4", "python", "-m", "async_rl.entrypoints.reward_server"]
    assert "reward.reward_model.enable=true" in server
    assert _value(server, f"{TS}.host") == "127.0.0.1" and _value(server, "reward.reward_model.port") == "29555"
    assert _value(server, f"{TS}.curve_server_secret_key") == "/keys/server.key_secret"
    assert _value(server, f"{TS}.curve_client_keys_dir") == "/keys/authorized"
    assert len(actors) == 2
    for argv in actors:
        assert _value(argv, "reward.reward_model.server_host") == "127.0.0.1"
        assert _value(argv, "reward.reward_model.port") == "29555"
        assert _value(argv, f"{TS}.host") == "10.0.0.5"  # the plane still goes to the coordinator


def test_actor_node_asks_the_config_whether_it_needs_a_reward_server(tmp_path: Path) -> None:
    base = dict(DRY_RUN="1", CUDA_VISIBLE_DEVICES="", COORD_ADDR="127.0.0.1", PYTHON=sys.executable)
    res = _run("actor_node.sh", _env(**base))  # the default config: rules only
    assert res.returncode == 0, res.stderr
    (argv,) = _actor_lines(res.stdout)
    assert "async_rl.entrypoints.actor" in argv and not any("reward_model" in a for a in argv)
    (tmp_path / "config.json").write_text("{}")
    on = ["reward.reward_model.enable=true", f"reward.reward_model.model_path={tmp_path}"]
    res = _run("actor_node.sh", _env(**base), *on)
    assert res.returncode == 0, res.stderr
    server, actor = _actor_lines(res.stdout)
    assert "async_rl.entrypoints.reward_server" in server and "async_rl.entrypoints.actor" in actor
    res = _run("actor_node.sh", _env(**base), *on, "reward.reward_model.placement=inline")
    assert res.returncode == 0 and len(_actor_lines(res.stdout)) == 1, res.stderr
    res = _run("actor_node.sh", _env(**{**base, "PYTHON": "false"}))
    assert res.returncode == 2 and "set PYTHON to the job's interpreter, or REWARD_SERVER=0 or 1" in res.stderr


def test_actor_node_restarts_its_reward_server_then_fails(tmp_path: Path, fake_python: Path) -> None:
    plan = {"reward-server": {"mode": "exit", "code": 7}, "actor-0": {"mode": "sleep"}}
    proc = _start_actor_node(
        tmp_path, fake_python, plan, REWARD_SERVER_RESTARTS="2", REWARD_SERVER_BACKOFF_S="0.1", REWARD_PORT="29556"
    )
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    runs = (tmp_path / "reward-server.runs").read_text().splitlines()
    assert len(runs) == 3  # the first start and 2 restarts
    assert f"{TS}.host=127.0.0.1" in runs[0] and "reward.reward_model.port=29556" in runs[0]
    assert "the reward server exited 7; restart 1/2 in 0.1s" in err and "restart 2/2 in 0.2s" in err
    assert "after 2 restart(s), the most allowed" in err and "stopping the actors" in err
    assert (tmp_path / "actor-0.term").exists()
    assert (tmp_path / "logs" / "reward-server-node0.log").read_text().count("reward-server running") == 3
    _assert_all_gone(tmp_path, ["actor-0"])


def test_sbatch_dry_run_wires_learner_and_actors_together(tmp_path: Path) -> None:
    bin_dir, out_dir = tmp_path / "bin", tmp_path / "srun"
    bin_dir.mkdir()
    out_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    env = _env(
        DRY_RUN="1", SRUN_OUT=str(out_dir), SLURM_JOB_ID="42", SLURM_SUBMIT_DIR=str(REPO), PYTHON=sys.executable,
        SLURM_JOB_NUM_NODES_HET_GROUP_0="1", SLURM_JOB_NUM_NODES_HET_GROUP_1="1", RUN_DIR=str(tmp_path / "run"),
        SLURM_GPUS_PER_NODE_HET_GROUP_0="h100:4", SLURM_GPUS_PER_NODE_HET_GROUP_1="8", GPUS_PER_ACTOR="2",
        CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7",
    )  # fmt: skip
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    res = subprocess.run(
        ["bash", str(LAUNCHERS / "slurm_hetjob.sbatch"), "trainer.experiment_name=e"],
        env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    curve = tmp_path / "run" / "curve"
    # keys are only announced in a dry run: 1 actor node x 8 GPUs / 2 per actor = 4 client key pairs
    assert f"-m async_rl.transport.keys {curve} --clients 4" in res.stdout
    learner = shlex.split((out_dir / "het0.out").read_text())
    actors = _actor_lines((out_dir / "het1.out").read_text())
    host = learner[learner.index("--rdzv_endpoint") + 1].rsplit(":", 1)[0]
    assert learner[learner.index("--nproc_per_node") + 1] == "4"  # "h100:4" -> 4
    assert learner[learner.index("--rdzv_id") + 1] == "42"
    assert "trainer.experiment_name=e" in learner
    assert _value(learner, f"{TS}.curve_server_secret_key") == f"{curve}/server.key_secret"
    assert [a[a.index("--actor-id") + 1] for a in actors] == ["actor-0", "actor-1", "actor-2", "actor-3"]
    for argv in actors:
        assert argv[argv.index("--coordinator") + 1] == f"tcp://{host}:{_value(learner, f'{TS}.port')}"
        assert _value(argv, "async_training.weight_sync.master_port") == _value(
            learner, "async_training.weight_sync.master_port"
        )
        assert _value(argv, "async_training.num_actors") == _value(learner, "async_training.num_actors") == "4"
        assert _value(argv, f"{TS}.curve_server_public_key") == f"{curve}/server.key"
        assert "trainer.experiment_name=e" in argv


def _sbatch_dry_run(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    bin_dir, out_dir = tmp_path / "bin", tmp_path / "srun"
    bin_dir.mkdir(exist_ok=True)
    out_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    env = _env(
        DRY_RUN="1", SRUN_OUT=str(out_dir), SLURM_JOB_ID="42", SLURM_SUBMIT_DIR=str(REPO), PYTHON=sys.executable,
        SLURM_JOB_NUM_NODES_HET_GROUP_0="2", SLURM_JOB_NUM_NODES_HET_GROUP_1="1", RUN_DIR=str(tmp_path / "run"),
        **extra,
    )  # fmt: skip
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    cmd = ["bash", str(LAUNCHERS / "slurm_hetjob.sbatch")]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)


@pytest.mark.parametrize(
    ("given", "missing"),
    [({"ACTORS_PER_NODE": "1"}, "NPROC_PER_NODE"), ({"NPROC_PER_NODE": "2"}, "ACTORS_PER_NODE")],
)
def test_sbatch_without_gpus_names_the_variable_to_set(tmp_path: Path, given: dict[str, str], missing: str) -> None:
    res = _sbatch_dry_run(tmp_path, MASTER_ADDR="10.0.0.5", **given)  # a CPU-only partition: no GPUs per node
    assert res.returncode == 2
    assert f"slurm_hetjob.sbatch: {missing}=0:" in res.stderr
    assert "sbatch --gpus-per-node=0" in res.stderr and f"set {missing}" in res.stderr
    assert not (tmp_path / "srun" / "het0.out").exists()  # nothing started


def test_sbatch_cpu_only_with_explicit_counts_and_addresses(tmp_path: Path) -> None:
    res = _sbatch_dry_run(
        tmp_path, NPROC_PER_NODE="2", ACTORS_PER_NODE="3", MASTER_ADDR="10.0.0.5", COORD_ADDR="10.0.0.6",
        CUDA_VISIBLE_DEVICES="", ACTOR_FLAGS="--emulate-tokens-per-s 256",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    learner = shlex.split((tmp_path / "srun" / "het0.out").read_text())
    actors = _actor_lines((tmp_path / "srun" / "het1.out").read_text())
    assert learner[learner.index("--rdzv_endpoint") + 1] == "10.0.0.5:29400"
    assert learner[learner.index("--nproc_per_node") + 1] == "2" and learner[learner.index("--nnodes") + 1] == "2"
    assert _value(learner, "async_training.weight_sync.master_addr") == "10.0.0.6"
    assert _value(learner, "trainer.default_local_dir") == f"{tmp_path / 'run'}/out"
    assert len(actors) == 3 and all(a[a.index("--coordinator") + 1] == "tcp://10.0.0.6:29410" for a in actors)
    assert _value(learner, "async_training.num_actors") == "3"
    assert all(a[a.index("async_rl.entrypoints.actor") + 1 :][:2] == ["--emulate-tokens-per-s", "256"] for a in actors)
