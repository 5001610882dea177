"""launchers/local.py: command construction, --dry-run, and failure/signal handling with tiny stand-in children.

The stand-ins replace torchrun and vLLM through the launcher's hidden --learner-cmd/--actor-cmd options; each one reads
its behaviour from plan.json, writes its pid (and its grandchild's) to files, appends a line to ``<role>.starts`` each
time it starts, and records a SIGTERM it received, so the tests can check by PID that every process tree is gone
afterwards, that signals were forwarded, not just SIGKILLed, and how often an actor was restarted.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "launchers" / "local.py"

CHILD = r"""
import json, os, signal, subprocess, sys, time
from pathlib import Path

role, run = sys.argv[1], Path(sys.argv[2])
plan = json.loads((run / "plan.json").read_text())[role]
(run / f"{role}.pid").write_text(str(os.getpid()))
with open(run / f"{role}.starts", "a") as f:
    f.write("start\n")


def on_term(signum, frame):
    (run / f"{role}.term").write_text("TERM")
    if plan.get("exit_like_torchrun"):
        # The main thread exits first and another thread ends the process 0.5 s later: meanwhile the leader shows as
        # a zombie but cannot be reaped yet, as a multi-threaded torchrun does while it exits.
        import ctypes, threading
        threading.Thread(target=lambda: (time.sleep(0.5), os._exit(0))).start()
        ctypes.CDLL(None).syscall(plan["exit_like_torchrun"], 0)  # SYS_exit: this thread only
    if not plan.get("ignore_term"):
        sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
if plan.get("grandchild"):
    g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(run)])
    (run / f"{role}.grandchild.pid").write_text(str(g.pid))
def lines(name):
    return len((run / name).read_text().splitlines()) if (run / name).exists() else 0


deadline = time.monotonic() + 20
while any(not (run / f).exists() for f in plan.get("wait_for", [])) and time.monotonic() < deadline:
    time.sleep(0.02)
while any(lines(f) < n for f, n in plan.get("wait_lines", {}).items()) and time.monotonic() < deadline:
    time.sleep(0.02)
time.sleep(plan.get("sleep_s", 0))
print(f"{role} says {plan.get('say', 'hi')}", flush=True)
if plan["mode"] == "exit":
    sys.exit(plan["code"])
while True:
    time.sleep(0.1)
"""


def _load_local() -> ModuleType:
    spec = importlib.util.spec_from_file_location("launch_local_under_test", LOCAL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


local = _load_local()


def _alive(pid: int) -> bool:
    """Dead means no such pid, or a zombie (an orphaned grandchild waits for init to reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def _start(
    tmp_path: Path,
    plan: Mapping[str, Any],
    actors: int,
    launched: list[subprocess.Popen[str]],
    overrides: tuple[str, ...] = (),
) -> subprocess.Popen[str]:
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    cmd = [sys.executable, str(LOCAL), "--actors", str(actors), "--run-dir", str(tmp_path), "--grace-s", "1"]
    cmd += [
        "--actor-exit-s",
        "0.3",
        "--learner-cmd",
        shlex.join([sys.executable, str(child), "learner", str(tmp_path)]),
    ]
    cmd += ["--actor-cmd", shlex.join([sys.executable, str(child), "actor-{i}", str(tmp_path)]), *overrides]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    launched.append(proc)
    return proc


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Launchers started by a test. At teardown (a failed test) kill any still running, and any stand-in left alive:
    only pids our stand-ins wrote whose command line still names this test's directory (no pid-reuse accidents)."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for pid in _pids(tmp_path).values():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if str(tmp_path).encode() in cmdline:
            os.kill(pid, signal.SIGKILL)


def _pids(tmp_path: Path) -> dict[str, int]:
    return {p.name.removesuffix(".pid"): int(p.read_text()) for p in tmp_path.glob("*.pid")}


def _wait_files(paths: list[Path], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() and p.read_text() for p in paths):
        assert time.monotonic() < deadline, f"children never wrote {paths}"
        time.sleep(0.02)


STOP = "async_training.launcher.actor_failure=stop"
RESTART = "async_training.launcher.restart_actors=true"


def test_failing_part_stops_everything_and_is_named(tmp_path: Path, launched: list[subprocess.Popen[str]]) -> None:
    plan = {
        "learner": {"mode": "sleep"},
        "actor-0": {"mode": "exit", "code": 3, "say": "boom", "wait_for": ["learner.pid", "actor-1.grandchild.pid"]},
        "actor-1": {"mode": "sleep", "grandchild": True},
    }
    proc = _start(tmp_path, plan, actors=2, launched=launched, overrides=(STOP,))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err  # the failing part's own exit status
    log = tmp_path / "logs" / "actor-0.log"
    assert f"actor-0 failed with exit code 3; log: {log}; actor_failure is 'stop': stopping every other part" in err
    assert log.read_text() == "actor-0 says boom\n"
    pids = _pids(tmp_path)
    assert set(pids) == {"learner", "actor-0", "actor-1", "actor-1.grandchild"}
    for name, pid in pids.items():
        if "grandchild" in name:
            assert not _alive(pid), name
        else:
            with pytest.raises(ProcessLookupError):  # reaped by the launcher
                os.kill(pid, 0)
    # the sleepers were asked politely (SIGTERM to their process group) before any SIGKILL
    assert (tmp_path / "learner.term").exists() and (tmp_path / "actor-1.term").exists()


def test_sigterm_to_launcher_is_forwarded_then_escalated(tmp_path: Path, launched: list[subprocess.Popen[str]]) -> None:
    plan = {
        "learner": {"mode": "sleep"},
        "actor-0": {"mode": "sleep"},
        "actor-1": {"mode": "sleep", "ignore_term": True},
    }
    proc = _start(tmp_path, plan, actors=2, launched=launched)
    _wait_files([tmp_path / f"{n}.pid" for n in plan])
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err  # 143
    assert "received SIGTERM" in err
    assert "actor-1 did not stop within 1.0 s; killing it" in err
    for name in plan:
        assert (tmp_path / f"{name}.term").exists(), f"{name} never saw the forwarded SIGTERM"
    for pid in _pids(tmp_path).values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


SYS_EXIT = {"x86_64": 60, "aarch64": 93}.get(os.uname().machine)


@pytest.mark.skipif(not sys.platform.startswith("linux") or SYS_EXIT is None, reason="raw exit syscall, Linux")
def test_a_part_that_is_still_exiting_is_waited_for_not_reported_hung(
    tmp_path: Path, launched: list[subprocess.Popen[str]]
) -> None:
    plan = {"learner": {"mode": "sleep", "exit_like_torchrun": SYS_EXIT}, "actor-0": {"mode": "sleep"}}
    proc = _start(tmp_path, plan, actors=1, launched=launched)
    _wait_files([tmp_path / f"{n}.pid" for n in plan])
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "did not stop" not in err  # it stopped within 0.5 s of a 1 s grace; nothing was killed


def test_learner_success_stops_actors_and_exits_zero(tmp_path: Path, launched: list[subprocess.Popen[str]]) -> None:
    plan = {
        "learner": {"mode": "exit", "code": 0, "say": "done", "wait_for": ["actor-0.pid"]},
        "actor-0": {"mode": "sleep"},
    }
    proc = _start(tmp_path, plan, actors=1, launched=launched)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "learner says done" in out  # the learner is echoed to the terminal ...
    assert (tmp_path / "logs" / "learner.log").read_text() == "learner says done\n"  # ... and logged
    assert (tmp_path / "actor-0.term").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(_pids(tmp_path)["actor-0"], 0)


def test_a_failed_actor_is_named_and_the_job_goes_on(tmp_path: Path, launched: list[subprocess.Popen[str]]) -> None:
    plan = {  # the learner finishes well after actor-0 has failed; actor-1 keeps working
        "learner": {"mode": "exit", "code": 0, "wait_for": ["actor-0.pid", "actor-1.pid"], "sleep_s": 1.0},
        "actor-0": {"mode": "exit", "code": 3, "say": "boom"},
        "actor-1": {"mode": "sleep"},
    }
    proc = _start(tmp_path, plan, actors=2, launched=launched)  # default: actor_failure continue, no restarts
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    log = tmp_path / "logs" / "actor-0.log"
    assert f"actor-0 failed with exit code 3; log: {log}; continuing with 1 other actor(s): actor-1" in err
    assert "stopping every other part" not in err
    assert (tmp_path / "actor-0.starts").read_text() == "start\n"  # not restarted
    assert (tmp_path / "actor-1.term").exists()  # stopped only once the learner had finished
    assert not (tmp_path / "learner.term").exists()


def test_a_failed_actor_is_restarted_with_backoff_until_its_restarts_run_out(
    tmp_path: Path, launched: list[subprocess.Popen[str]]
) -> None:
    plan = {
        "learner": {"mode": "exit", "code": 0, "wait_lines": {"actor-0.starts": 3}, "sleep_s": 1.0},
        "actor-0": {"mode": "exit", "code": 3, "say": "boom"},  # fails every time it is started
        "actor-1": {"mode": "sleep"},
    }
    backoff = ("async_training.launcher.max_actor_restarts=2", "async_training.launcher.restart_backoff_s=0.2")
    proc = _start(tmp_path, plan, actors=2, launched=launched, overrides=(RESTART, *backoff))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    log = tmp_path / "logs" / "actor-0.log"
    # backoff 0.2 s, then doubled; after the second restart the third failure leaves actor-1 to carry on
    assert f"actor-0 failed with exit code 3; log: {log}; restarting it in 0.2 s (restart 1 of 2)" in err
    assert (
        f"actor-0 failed with exit code 3 after 1 restarts; log: {log}; restarting it in 0.4 s (restart 2 of 2)" in err
    )
    assert "restarted actor-0 (restart 1 of 2)" in err and "restarted actor-0 (restart 2 of 2)" in err
    assert f"actor-0 failed with exit code 3 after 2 restarts; log: {log}; continuing with 1 other actor(s)" in err
    assert (tmp_path / "actor-0.starts").read_text() == "start\n" * 3
    text = log.read_text()  # one log per actor: each restart appends under a header
    assert text.count("actor-0 says boom") == 3
    assert "----- launch: restart 1 of actor-0 -----" in text and "----- launch: restart 2 of actor-0 -----" in text
    assert (tmp_path / "actor-1.starts").read_text() == "start\n"


@pytest.mark.parametrize("failing", ["learner", "actor-0"])
def test_the_learner_or_the_last_actor_failing_stops_the_job(
    failing: str, tmp_path: Path, launched: list[subprocess.Popen[str]]
) -> None:
    plan: dict[str, Any] = {"learner": {"mode": "sleep"}, "actor-0": {"mode": "sleep"}}
    plan[failing] = {"mode": "exit", "code": 5, "wait_for": ["learner.pid", "actor-0.pid"]}
    proc = _start(tmp_path, plan, actors=1, launched=launched)  # actor_failure continue, but nothing to continue with
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 5, err
    log = tmp_path / "logs" / f"{failing}.log"
    reason = "" if failing == "learner" else " no other actor is left:"
    assert f"{failing} failed with exit code 5; log: {log};{reason} stopping every other part" in err
    other = "actor-0" if failing == "learner" else "learner"
    assert (tmp_path / f"{other}.term").exists()
    for pid in _pids(tmp_path).values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_the_actor_policy_and_stop_deadline_come_from_the_config(caplog: pytest.LogCaptureFixture) -> None:
    settings = local.read_settings([], [])
    assert settings.actor_policy == local.ActorPolicy(
        actor_failure="continue", max_restarts=0, backoff_s=5.0, essential_restarts=3
    )
    assert settings.learner_stop_s == 10.0
    settings = local.read_settings(
        ["configs/smoke_grpo.yaml"], [RESTART, STOP, "async_training.launcher.max_actor_restarts=4"]
    )
    assert settings.actor_policy == local.ActorPolicy(
        actor_failure="stop", max_restarts=4, backoff_s=5.0, essential_restarts=3
    )
    assert [settings.actor_policy.restart_delay(n) for n in range(3)] == [5.0, 10.0, 20.0]
    assert local.main(["--dry-run", "--grace-s", "5"]) == 0
    assert "--grace-s 5.0 is not above async_training.timeouts.stop_s 10.0" in caplog.text
    assert [local.default_grace_s(s) for s in (None, 2.0, 10.0, 90.0)] == [15.0, 15.0, 15.0, 95.0]
    caplog.clear()
    assert local.main(["--dry-run", "--config", "configs/smollm2_arith_grpo.yaml"]) == 0
    assert "is not above" not in caplog.text  # the default grace follows the recipe's stop_s 90
    assert local.main(["--dry-run", "async_training.launcher.actor_failure=maybe"]) == 2
    assert "async_training.launcher.actor_failure" in caplog.text


def test_unstartable_part_is_reported(tmp_path: Path) -> None:
    parts = [local.Part("learner", (str(tmp_path / "missing-binary"),), tmp_path / "learner.log")]
    assert local.run_parts(parts, grace_s=0.5) == 1


def test_run_parts_rejects_bad_arguments(tmp_path: Path) -> None:
    part = local.Part("x", ("true",), tmp_path / "x.log")
    with pytest.raises(ValueError, match="parts"):
        local.run_parts([])
    with pytest.raises(ValueError, match="unique"):
        local.run_parts([part, part])
    with pytest.raises(ValueError, match="grace_s"):
        local.run_parts([part], grace_s=-1)


def _commands(out: str) -> dict[str, list[str]]:
    lines = out.strip().splitlines()
    assert len(lines) % 2 == 0
    return {lines[i].split()[1]: shlex.split(lines[i + 1]) for i in range(0, len(lines), 2)}


def _value(argv: list[str], key: str) -> str:
    return [a.split("=", 1)[1] for a in argv if a.startswith(key + "=")][-1]


def test_dry_run_prints_torchrun_and_actor_commands(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["--dry-run", "--config", "configs/demo_grpo.yaml", "--nproc-per-node", "2", "--actors", "2"]
    assert local.main([*argv, "--log-dir", str(tmp_path), "trainer.total_training_steps=3"]) == 0
    cmds = _commands(capsys.readouterr().out)
    assert list(cmds) == ["learner", "actor-0", "actor-1"]
    learner = cmds["learner"]
    assert Path(learner[0]).name == "torchrun" or learner[1:3] == ["-m", "torch.distributed.run"]
    text = shlex.join(learner)
    assert "--standalone --nproc_per_node 2 -m async_rl.entrypoints.train --config configs/demo_grpo.yaml" in text
    port, ws_port = _value(learner, local.PORT_KEY), _value(learner, local.WS_PORT_KEY)
    assert int(port) > 0 and int(ws_port) > 0 and port != ws_port
    binds = []
    for i in (0, 1):
        actor = cmds[f"actor-{i}"]
        while "=" in actor[0]:  # the part's environment comes first (each CPU actor's own cores)
            binds.append(actor.pop(0))
        assert actor[1:3] == ["-m", "async_rl.entrypoints.actor"]
        assert actor[actor.index("--coordinator") + 1] == f"tcp://127.0.0.1:{port}"
        assert actor[actor.index("--actor-id") + 1] == f"actor-{i}"
        assert _value(actor, local.WS_PORT_KEY) == ws_port and _value(actor, local.NUM_ACTORS_KEY) == "2"
        assert "trainer.total_training_steps=3" in actor
    if local.CPU_BIND_ENV not in os.environ and len(os.sched_getaffinity(0)) >= 2:
        assert len(binds) == len(set(binds)) == 2 and all(b.startswith(f"{local.CPU_BIND_ENV}=") for b in binds)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # a dry run writes nothing


def test_dry_run_keeps_ports_fixed_by_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    assert local.main(["--dry-run", f"{local.PORT_KEY}=23456", f"{local.WS_PORT_KEY}=23457"]) == 0
    cmds = _commands(capsys.readouterr().out)
    assert "--coordinator tcp://127.0.0.1:23456" in shlex.join(cmds["actor-0"])
    assert _value(cmds["learner"], local.WS_PORT_KEY) == "23457"


def test_the_config_is_checked_with_the_learner_ranks_the_flag_sets(caplog: pytest.LogCaptureFixture) -> None:
    # the recipe's 16 x 8 sequences over its 2 ranks are 64 a rank: a micro-batch of 128 fits one rank only
    micro = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=128"
    one_rank = ["--config", "configs/smollm2_arith_grpo.yaml", micro]
    assert local.main(["--dry-run", *one_rank]) == 2
    assert "learner ranks (2)" in caplog.text
    assert local.main(["--dry-run", "--nproc-per-node", "1", *one_rank]) == 0


def test_invalid_config_exits_2_naming_the_key(caplog: pytest.LogCaptureFixture) -> None:
    assert local.main(["--dry-run", "async_training.num_actors=0"]) == 2
    assert "async_training.num_actors" in caplog.text


def test_gpu_pinning_gives_learner_first_gpus_then_actors_tp_slices() -> None:
    args = local.parse_args(["--nproc-per-node", "4", "--actors", "2"])
    gpus = [str(g) for g in range(8)]
    settings = local.JobSettings(
        num_actors=2, nproc_per_node=4, device="cuda", tp_size=2, host="127.0.0.1", port=0, ws_port=0,
        actor_policy=local.STOP_ON_FAILURE, learner_stop_s=None,
    )  # fmt: skip
    parts = local.build_parts(args, settings, gpus)
    # learner ranks take GPUs 0-3; actor-0 the next tp=2 (4,5), actor-1 the two after (6,7)
    assert [p.env.get("CUDA_VISIBLE_DEVICES") for p in parts] == ["0,1,2,3", "4,5", "6,7"]
    # 4 + 3 x 2 = 10 GPUs needed, 8 visible: nothing pinned
    crowded = local.build_parts(local.parse_args(["--nproc-per-node", "4", "--actors", "3"]), settings, gpus)
    assert all(p.env == {} for p in crowded)
    assert all(p.env == {} for p in local.build_parts(args, dataclasses.replace(settings, device="cpu"), gpus))


def test_local_cpu_actors_each_get_their_own_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(local.CPU_BIND_ENV, raising=False)
    settings = local.JobSettings(
        num_actors=2, nproc_per_node=2, device="cpu", tp_size=1, host="127.0.0.1", port=0, ws_port=0,
        actor_policy=local.STOP_ON_FAILURE, learner_stop_s=None,
    )  # fmt: skip
    binds = [{local.CPU_BIND_ENV: "0"}, {local.CPU_BIND_ENV: "1"}]
    assert local._cpu_binds(settings, 2, [0, 1]) == binds  # vLLM's auto would put both on core 0
    assert local._cpu_binds(settings, 2, list(range(8))) == [
        {local.CPU_BIND_ENV: "0,1,2,3"},
        {local.CPU_BIND_ENV: "4,5,6,7"},
    ]
    assert local._cpu_binds(settings, 3, [0, 1]) == [*binds, {local.CPU_BIND_ENV: "0"}]  # more actors than cores
    assert local._cpu_binds(settings, 1, [0, 1]) == [{}]  # one actor: vLLM's own binding
    assert local._cpu_binds(dataclasses.replace(settings, tp_size=2), 2, [0, 1]) == [{}, {}]
    assert local._cpu_binds(dataclasses.replace(settings, device="cuda"), 2, [0, 1]) == [{}, {}]
    parts = local.build_parts(local.parse_args(["--actors", "2"]), settings, [])
    assert parts[0].env == {} and [p.env.get(local.CPU_BIND_ENV) for p in parts[1:]] != [None, None]
    monkeypatch.setenv(local.CPU_BIND_ENV, "0")  # the user's own binding is left alone
    assert local._cpu_binds(settings, 2, [0, 1]) == [{}, {}]


def test_help_works_and_hides_test_options() -> None:
    res = subprocess.run([sys.executable, str(LOCAL), "--help"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0
    assert "--nproc-per-node" in res.stdout and "--dry-run" in res.stdout
    assert "--learner-cmd" not in res.stdout


def test_bad_cli_values_are_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        local.parse_args(["--actors", "0"])
    assert exc.value.code == 2
    assert "--actors must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        local.parse_args(["not-an-override"])


def test_a_reward_server_part_shares_the_actors_port_and_learner_rank_0s_gpu() -> None:
    args = local.parse_args(["--nproc-per-node", "4", "--actors", "2"])
    settings = local.JobSettings(
        num_actors=2, nproc_per_node=4, device="cuda", tp_size=2, host="127.0.0.1", port=0, ws_port=0,
        actor_policy=local.STOP_ON_FAILURE, learner_stop_s=None, reward_server=True,
    )  # fmt: skip
    parts = local.build_parts(args, settings, [str(i) for i in range(8)])
    assert [p.name for p in parts] == ["learner", "reward-server", "actor-0", "actor-1"]
    server = parts[1]
    assert server.essential and not any(p.essential for p in parts if p is not server)
    assert server.env == {"CUDA_VISIBLE_DEVICES": "0"}  # beside learner rank 0, not on an actor's GPUs
    assert "async_rl.entrypoints.reward_server" in server.argv
    ports = {p.name: [a for a in p.argv if a.startswith("reward.reward_model.port=")] for p in parts}
    (wired,) = ports["reward-server"]
    assert int(wired.split("=")[1]) > 0 and ports["actor-0"] == ports["actor-1"] == [wired]
    without = local.build_parts(args, dataclasses.replace(settings, reward_server=False), [str(i) for i in range(8)])
    assert [p.name for p in without] == ["learner", "actor-0", "actor-1"]
    assert not any(a.startswith("reward.reward_model.port=") for p in without for a in p.argv)


def test_a_service_part_is_stopped_once_the_actors_are_gone_not_after_their_exit_time(tmp_path: Path) -> None:
    """The reward server never leaves by itself: once the learner is done and the actors have left, it is stopped at
    once (it used to be given the actors' whole exit time too, 10 s at the end of every such job)."""
    plan = {
        "learner": {"mode": "exit", "code": 0, "wait_for": ["actor-0.pid", "reward-server.pid"]},
        "actor-0": {"mode": "exit", "code": 0, "wait_for": ["learner.starts"], "sleep_s": 0.3},
        "reward-server": {"mode": "sleep"},
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "child.py").write_text(CHILD)

    def part(role: str, essential: bool = False) -> Any:
        argv = (sys.executable, str(tmp_path / "child.py"), role, str(tmp_path))
        return local.Part(role, argv, tmp_path / f"{role}.log", essential=essential)

    started = time.monotonic()
    code = local.run_parts(
        [part("learner"), part("actor-0"), part("reward-server", essential=True)], grace_s=5.0, actor_exit_s=30.0
    )
    assert code == 0
    assert time.monotonic() - started < 15.0  # well inside the 30 s the actors could have had
    assert (tmp_path / "reward-server.term").exists()  # stopped by SIGTERM, not killed
    assert not _alive(_pids(tmp_path)["reward-server"])
