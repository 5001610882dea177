"""Run a whole async_rl job on this machine: the torchrun learner group plus N vLLM actor processes.

    python launchers/local.py --config configs/demo_grpo.yaml [--nproc-per-node 2] [--actors 1] [key=value ...]

A run is several process trees that only make sense together, so this is a small supervisor rather than
``cmd1 & cmd2 &``:

* every part (the learner group, each actor) runs in its own session / process group, so one signal reaches torchrun
  *and* its worker ranks, or an actor *and* vLLM's helper processes;
* every part logs to its own file (``<run dir>/logs/{learner,actor-i}.log``); the learner is also echoed here;
* an actor that fails (exits non-zero or is killed) is logged with its exit code and log, and the job goes on
  (``async_training.launcher``): it is restarted after ``restart_backoff_s`` (doubling) up to ``max_actor_restarts``
  times if ``restart_actors``, else the other actors carry on (``actor_failure: continue``; the coordinator grants its
  leases again). When the learner fails, or the last actor fails with no restart left (or ``actor_failure: stop``),
  every other part is stopped (SIGTERM to its process group, SIGKILL after ``--grace-s``) and the launcher exits
  non-zero naming the part, its exit code and its log;
* Ctrl-C / SIGTERM are forwarded to every part (a second one kills at once);
* when the learner exits 0 (it has told the actors to shut down) the actors get ``--actor-exit-s`` to leave by
  themselves, then are stopped; the reward server is stopped as soon as the actors are gone.

``--emulate-tokens-per-s R [--emulate-response-len L]`` starts emulated actors instead of vLLM ones (a fixed
R tokens/s each, real rollout client and weight sync; see ``async_rl.actor.emulated``), as ``tools/bench_pipeline.py``
does.

Free ports for the coordinator and the weight-sync store are picked here and passed to every process as overrides
(unless the config or command line already fixes them). Stdlib only, plus the package's config loader when importable,
which validates the config and supplies num_actors / n_gpus_per_node / device / tensor-parallel size. On a CUDA
machine the learner gets the first ``nproc`` GPUs and each actor the next ``tensor_model_parallel_size`` ones.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parents[1]
PORT_KEY = "async_training.transport.port"
WS_PORT_KEY = "async_training.weight_sync.master_port"
NUM_ACTORS_KEY = "async_training.num_actors"
NPROC_KEY = "trainer.n_gpus_per_node"
REWARD_PORT_KEY = "reward.reward_model.port"
_WILDCARD_HOSTS = ("0.0.0.0", "*", "::", "[::]", "")

logger = logging.getLogger(__name__)


class LaunchError(RuntimeError):
    """A part could not be started."""


@dataclass(frozen=True)
class ActorPolicy:
    """What to do when an actor fails: ``async_training.launcher`` (see its key docs)."""

    actor_failure: str  # "continue" | "stop"
    max_restarts: int  # restarts per actor (0 = none)
    backoff_s: float  # delay before an actor's first restart, doubled for each further one
    essential_restarts: int = 0  # restarts of a part the job needs (the reward server); then the job stops

    def restart_delay(self, restarts_so_far: int) -> float:
        return self.backoff_s * 2**restarts_so_far


# Without the package's config loader the policy cannot be read: any failure ends the job.
STOP_ON_FAILURE = ActorPolicy(actor_failure="stop", max_restarts=0, backoff_s=0.0)


@dataclass(frozen=True)
class Part:
    """One supervised process tree: its command, its log file and extra environment variables."""

    name: str
    argv: tuple[str, ...]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    echo: bool = False  # also copy its output to the terminal
    essential: bool = False  # the job cannot go on without it (the reward server): restarted, never tolerated

    def describe(self) -> str:
        """The command as a shell line (environment assignments first)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.argv)


@dataclass(frozen=True)
class JobSettings:
    """What the config tells the launcher (see :func:`read_settings`)."""

    num_actors: int
    nproc_per_node: int
    device: str
    tp_size: int
    host: str
    port: int
    ws_port: int
    actor_policy: ActorPolicy
    learner_stop_s: float | None  # async_training.timeouts.stop_s: the learner's SIGTERM-to-exit deadline
    reward_server: bool = False  # reward.reward_model is on with placement 'server'
    reward_port: int = 0  # reward.reward_model.port (0 = pick one)


# ---------------------------------------------------------------------------------------------------------------------
# Building the commands


def _override_value(overrides: Sequence[str], key: str) -> str | None:
    """The last ``key=value`` given for ``key`` (Hydra's ``+``/``++`` prefixes accepted), or None."""
    found = None
    for item in overrides:
        name, sep, value = item.partition("=")
        if sep and name.lstrip("+") == key:
            found = value
    return found


def read_settings(config_paths: Sequence[str], overrides: Sequence[str]) -> JobSettings:
    """Load and validate the config with the package's loader; fall back to defaults plus overrides without it."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    try:
        from async_rl.config.errors import ConfigError
        from async_rl.config.loader import load_config_with_warnings
        from async_rl.config.validate import check_reward_model_dir
    except ImportError as exc:
        logger.warning("async_rl's config loader is not importable (%s); the config is not validated here", exc)
        for path in config_paths:
            if not Path(path).expanduser().is_file():
                raise ValueError(f"--config {path!r}: no such file") from None
        ints = {key: _override_value(overrides, key) for key in (NUM_ACTORS_KEY, PORT_KEY, WS_PORT_KEY)}
        try:
            return JobSettings(  # the config's defaults, with the overrides read here
                num_actors=int(ints[NUM_ACTORS_KEY] or 1),
                nproc_per_node=1,
                device="auto",
                tp_size=1,
                host="127.0.0.1",
                port=int(ints[PORT_KEY] or 0),
                ws_port=int(ints[WS_PORT_KEY] or 0),
                actor_policy=STOP_ON_FAILURE,
                learner_stop_s=None,
            )
        except ValueError as bad:
            raise ValueError(f"override must be an integer: {bad}") from None
    try:
        cfg, _warnings = load_config_with_warnings(list(config_paths), list(overrides))
    except ConfigError as exc:
        raise ValueError(f"config error: {exc}") from None
    check_reward_model_dir(cfg)
    at = cfg.async_training
    lc = at.launcher
    rm = cfg.reward.reward_model
    return JobSettings(
        num_actors=at.num_actors,
        nproc_per_node=cfg.trainer.n_gpus_per_node,
        device=cfg.trainer.device,
        tp_size=cfg.actor_rollout_ref.rollout.tensor_model_parallel_size,
        host=at.transport.host,
        port=at.transport.port,
        ws_port=at.weight_sync.master_port,
        actor_policy=ActorPolicy(
            actor_failure=lc.actor_failure,
            max_restarts=lc.max_actor_restarts if lc.restart_actors else 0,
            backoff_s=lc.restart_backoff_s,
            essential_restarts=lc.max_reward_server_restarts,
        ),
        learner_stop_s=at.timeouts.stop_s,
        reward_server=rm.enable and rm.placement == "server",
        reward_port=rm.port,
    )


def pick_free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on this machine right now (all held open together so they differ)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def visible_gpus() -> list[str]:
    """GPU ids usable here: CUDA_VISIBLE_DEVICES when set, else what ``nvidia-smi -L`` lists, else none."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip()]
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(ln for ln in out.splitlines() if ln.startswith("GPU "))]


def torchrun_command() -> list[str]:
    """torchrun next to this interpreter, else on PATH, else ``python -m torch.distributed.run``."""
    beside = Path(sys.executable).parent / "torchrun"
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("torchrun")
    return [found] if found else [sys.executable, "-m", "torch.distributed.run"]


def _gpu_envs(settings: JobSettings, nproc: int, actors: int, gpus: list[str]) -> list[dict[str, str]]:
    """CUDA_VISIBLE_DEVICES for the learner then each actor (empty dicts when not pinning)."""
    if settings.device != "cuda" or not gpus:
        return [{} for _ in range(actors + 1)]
    need = nproc + actors * settings.tp_size
    if need > len(gpus):
        logger.warning(
            "%d learner ranks + %d actors x %d GPUs need %d GPUs but %d are visible; not pinning GPUs (they share)",
            nproc,
            actors,
            settings.tp_size,
            need,
            len(gpus),
        )
        return [{} for _ in range(actors + 1)]
    envs = [{"CUDA_VISIBLE_DEVICES": ",".join(gpus[:nproc])}]
    for i in range(actors):
        start = nproc + i * settings.tp_size
        envs.append({"CUDA_VISIBLE_DEVICES": ",".join(gpus[start : start + settings.tp_size])})
    return envs


CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def _cpu_binds(settings: JobSettings, actors: int, cpus: list[int]) -> list[dict[str, str]]:
    """Each local CPU actor's vLLM worker threads on a slice of its own of ``cpus`` (empty dicts when not pinning).

    vLLM's own ``auto`` binds every engine's worker to the same cores (all but the last), so several actors on one
    host would share those cores and leave the last to the rest: two actors on 2 cores both ran on core 0. Left alone
    with one actor, tensor parallelism (whose binding lists one slice per rank), on CUDA, or when the user set the
    binding."""
    if settings.device != "cpu" or actors < 2 or settings.tp_size != 1 or CPU_BIND_ENV in os.environ:
        return [{} for _ in range(actors)]
    width = max(1, len(cpus) // actors)
    return [{CPU_BIND_ENV: ",".join(str(c) for c in cpus[(i * width) % len(cpus) :][:width])} for i in range(actors)]


def build_parts(args: argparse.Namespace, settings: JobSettings, gpus: list[str]) -> list[Part]:
    """The learner part and one part per actor, with ports picked and every override passed through."""
    nproc = args.nproc_per_node or settings.nproc_per_node
    actors = args.actors or settings.num_actors
    fresh = iter(pick_free_ports(3))
    port = settings.port or next(fresh)
    ws_port = settings.ws_port or next(fresh)
    reward_port = settings.reward_port or next(fresh)
    connect = "127.0.0.1" if settings.host in _WILDCARD_HOSTS else settings.host
    configs = [a for path in args.config for a in ("--config", path)]
    wiring = [
        f"{PORT_KEY}={port}",
        f"{WS_PORT_KEY}={ws_port}",
        f"{NUM_ACTORS_KEY}={actors}",
        "trainer.nnodes=1",
        f"{NPROC_KEY}={nproc}",
    ]
    if settings.reward_server:
        wiring.append(f"{REWARD_PORT_KEY}={reward_port}")
    log_dir = Path(args.log_dir) if args.log_dir else Path(args.run_dir) / "logs"
    envs = _gpu_envs(settings, nproc, actors, gpus)
    binds = _cpu_binds(settings, actors, sorted(os.sched_getaffinity(0)))
    envs = [envs[0]] + [{**env, **bind} for env, bind in zip(envs[1:], binds, strict=True)]
    if args.learner_cmd:
        learner = shlex.split(args.learner_cmd)
    else:
        learner = [*torchrun_command(), "--standalone", "--nproc_per_node", str(nproc)]
        learner += ["-m", "async_rl.entrypoints.train", *configs, *args.overrides, *wiring]
    parts = [Part("learner", tuple(learner), log_dir / "learner.log", envs[0], echo=True)]
    if settings.reward_server:  # no GPU of its own: with pinned GPUs it shares learner rank 0's, else it sees them all
        argv = [sys.executable, "-m", "async_rl.entrypoints.reward_server", *configs, *args.overrides, *wiring]
        pinned = envs[0].get("CUDA_VISIBLE_DEVICES")
        env = {"CUDA_VISIBLE_DEVICES": pinned.split(",")[0]} if pinned else {}
        parts.append(Part("reward-server", tuple(argv), log_dir / "reward-server.log", env, essential=True))
    emulate: list[str] = []
    if args.emulate_tokens_per_s is not None:
        emulate = ["--emulate-tokens-per-s", str(args.emulate_tokens_per_s)]
        if args.emulate_response_len is not None:
            emulate += ["--emulate-response-len", str(args.emulate_response_len)]
    for i in range(actors):
        name = f"actor-{i}"
        if args.actor_cmd:
            argv = shlex.split(args.actor_cmd.replace("{i}", str(i)))
        else:
            argv = [sys.executable, "-m", "async_rl.entrypoints.actor", *configs]
            argv += ["--coordinator", f"tcp://{connect}:{port}", "--actor-id", name, *args.overrides, *wiring]
            argv += emulate
        parts.append(Part(name, tuple(argv), log_dir / f"{name}.log", envs[i + 1]))
    return parts


# ---------------------------------------------------------------------------------------------------------------------
# Supervising them


def live_groups(pgids: Sequence[int]) -> set[int]:
    """Those of ``pgids`` that still have a member that is not a zombie (zombies cannot be signalled away).

    One pass over /proc; without /proc (not Linux), a group counts as live while signal 0 reaches it.
    """
    wanted, found = set(pgids), set()
    proc = Path("/proc")
    if not proc.is_dir():
        for pgid in wanted:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass
            found.add(pgid)
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) in wanted:
            found.add(int(fields[2]))
    return found


@dataclass
class _Running:
    part: Part
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    pump: threading.Thread | None = None
    seen_exit: bool = False


class _Signals:
    """SIGINT/SIGTERM handlers that only record the signal; the supervisor loop acts on it."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.received.append(signum)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _pump(proc: subprocess.Popen[bytes], log: IO[bytes], sink: IO[bytes]) -> None:
    stream = proc.stdout
    assert isinstance(stream, io.BufferedReader)
    for chunk in iter(lambda: stream.read1(65536), b""):
        log.write(chunk)
        log.flush()
        try:
            sink.write(chunk)
            sink.flush()
        except (OSError, ValueError):
            pass  # terminal gone: keep logging


def _start(part: Part, sink: IO[bytes], restart: int = 0) -> _Running:
    part.log_path.parent.mkdir(parents=True, exist_ok=True)
    log = part.log_path.open("ab" if restart else "wb")  # a restarted part appends to its log
    if restart:
        log.write(f"\n----- launch: restart {restart} of {part.name} -----\n".encode())
        log.flush()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **part.env}
    try:
        proc = subprocess.Popen(
            part.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if part.echo else log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        log.close()
        raise LaunchError(f"could not start {part.name} ({shlex.join(part.argv)}): {exc}") from exc
    running = _Running(part, proc, log)
    if part.echo:
        running.pump = threading.Thread(target=_pump, args=(proc, log, sink), name=f"pump-{part.name}", daemon=True)
        running.pump.start()
    logger.info("started %s (pid %d); log: %s", part.name, proc.pid, part.log_path)
    return running


def _signal_group(r: _Running, sig: int) -> None:
    """Signal the part's whole process group; also the leader itself, should it have left its group.

    Never twice: torchrun takes a second SIGTERM that arrives while it is stopping its ranks as a new one (it signals
    them again and unwinds out of its wait for them).
    """
    try:
        os.killpg(r.proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    if r.proc.poll() is None:
        try:
            if os.getpgid(r.proc.pid) != r.proc.pid:  # it left its group, which the signal above went to
                r.proc.send_signal(sig)
        except ProcessLookupError:
            pass


MIN_GRACE_S = 15.0
GRACE_MARGIN_S = 5.0


def default_grace_s(learner_stop_s: float | None) -> float:
    """The launcher's SIGTERM-to-SIGKILL grace when ``--grace-s`` is not given: long enough for a learner stopped by a
    signal to use its whole ``async_training.timeouts.stop_s`` (finish the step, write its checkpoint) and exit."""
    if learner_stop_s is None:
        return MIN_GRACE_S
    return max(MIN_GRACE_S, learner_stop_s + GRACE_MARGIN_S)


def _stop_all(running: list[_Running], sig: int, grace_s: float, signals: _Signals) -> None:
    """Send ``sig`` to every part's process group, wait up to ``grace_s``, then SIGKILL whatever is left."""
    already = len(signals.received)
    for r in running:
        _signal_group(r, sig)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and len(signals.received) == already:
        # Both: a multi-threaded leader (torchrun) shows as a zombie while its other threads exit, before it can be
        # reaped; stopping the wait on the group alone then "killed" a learner that had stopped (measured).
        if all(r.proc.poll() is not None for r in running) and not live_groups([r.proc.pid for r in running]):
            break
        time.sleep(0.05)
    live = live_groups([r.proc.pid for r in running])
    for r in running:
        if r.proc.poll() is None or r.proc.pid in live:
            logger.warning("%s did not stop within %.1f s; killing it", r.part.name, grace_s)
            _signal_group(r, signal.SIGKILL)
    for r in running:
        try:
            r.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            logger.error("%s (pid %d) survived SIGKILL", r.part.name, r.proc.pid)


def exit_status(code: int) -> int:
    """A process return code as a shell exit status (killed by signal N -> 128 + N)."""
    return 128 - code if code < 0 else code


@dataclass
class _Supervisor:
    """Watches the running parts: restarts or tolerates a failed actor (``policy``), ends the job when it is over.

    ``running[0]`` is the primary (the learner): its exit 0 ends the run; its failure stops everything.
    """

    running: list[_Running]
    grace_s: float
    actor_exit_s: float
    signals: _Signals
    policy: ActorPolicy
    sink: IO[bytes]
    restarts: dict[str, int] = field(default_factory=dict)  # part name -> restarts so far
    due: dict[str, float] = field(default_factory=dict)  # part name -> monotonic time of its pending restart

    @property
    def primary(self) -> _Running:
        return self.running[0]

    def run(self) -> int:
        while True:
            if self.signals.received:
                sig = self.signals.received[0]
                logger.warning("received %s; stopping every part", signal.Signals(sig).name)
                self._stop_all(sig)
                return 128 + sig
            for r in self.running:
                code = r.proc.poll()
                if code is None or r.seen_exit:
                    continue
                r.seen_exit = True
                if code == 0:
                    logger.info("%s exited 0", r.part.name)
                elif not self._tolerate(r, code):
                    self._stop_all(signal.SIGTERM)
                    return exit_status(code) or 1
            if self.primary.seen_exit:
                return self._finish()
            self._restart_due()
            time.sleep(0.05)

    def _tolerate(self, r: _Running, code: int) -> bool:
        """A failed part: schedule an actor's restart or carry on without it; False when the job must stop."""
        name, done = r.part.name, self.restarts.get(r.part.name, 0)
        failed = (
            f"{name} failed with exit code {code}{f' after {done} restarts' if done else ''}; log: {r.part.log_path}"
        )
        if r is self.primary:
            logger.error("%s; stopping every other part", failed)
            return False
        limit = self._limit(r.part)
        _signal_group(
            r, signal.SIGKILL
        )  # what is left of its tree (vLLM's engine process) holds memory a restart needs
        if done < limit:
            delay = self.policy.restart_delay(done)
            self.restarts[name] = done + 1
            self.due[name] = time.monotonic() + delay
            logger.warning("%s; restarting it in %.1f s (restart %d of %d)", failed, delay, done + 1, limit)
            return True
        if r.part.essential:
            logger.error("%s; the job cannot go on without it: stopping every other part", failed)
            return False
        left = [
            o.part.name for o in self._actors() if o is not r and (o.proc.poll() is None or o.part.name in self.due)
        ]
        if self.policy.actor_failure == "continue" and left:
            logger.warning("%s; continuing with %d other actor(s): %s", failed, len(left), ", ".join(left))
            return True
        reason = "no other actor is left" if self.policy.actor_failure == "continue" else "actor_failure is 'stop'"
        logger.error("%s; %s: stopping every other part", failed, reason)
        return False

    def _limit(self, part: Part) -> int:
        return self.policy.essential_restarts if part.essential else self.policy.max_restarts

    def _actors(self) -> list[_Running]:
        return [r for r in self.running if r is not self.primary and not r.part.essential]

    def _restart_due(self) -> None:
        now = time.monotonic()
        for i, r in enumerate(self.running):
            name = r.part.name
            if name in self.due and now >= self.due[name]:
                del self.due[name]
                r.log.close()
                self.running[i] = _start(r.part, self.sink, restart=self.restarts[name])
                logger.warning("restarted %s (restart %d of %d)", name, self.restarts[name], self._limit(r.part))

    def _finish(self) -> int:
        """The primary exited 0: the actors get ``actor_exit_s`` to leave by themselves, then every part still
        running is stopped (a service such as the reward server, which never leaves by itself, as soon as the actors
        it serves are gone)."""
        name = self.primary.part.name
        self.due.clear()  # no restart once the learner is done
        logger.info("%s finished; giving the actors %.1f s to exit", name, self.actor_exit_s)
        deadline = time.monotonic() + self.actor_exit_s
        while time.monotonic() < deadline and not self.signals.received:
            if all(r.proc.poll() is not None for r in self._actors()):
                break
            time.sleep(0.05)
        for r in self.running:
            code = r.proc.poll()
            if code not in (None, 0) and not r.seen_exit:
                logger.warning("%s exited with code %d after %s finished", r.part.name, code, name)
        self._stop_all(signal.SIGTERM)
        return 0

    def _stop_all(self, sig: int) -> None:
        _stop_all(self.running, sig, self.grace_s, self.signals)


def run_parts(
    parts: Sequence[Part],
    *,
    grace_s: float = 15.0,
    actor_exit_s: float = 10.0,
    sink: IO[bytes] | None = None,
    actor_policy: ActorPolicy = STOP_ON_FAILURE,
) -> int:
    """Start every part, supervise them, and return the launcher's exit status (0 when the first part succeeds).

    The first part is the primary (the learner): its exit 0 ends the run, its failure stops all and returns its exit
    status. A failed actor is restarted or tolerated as ``actor_policy`` says, else it stops all likewise. A
    SIGINT/SIGTERM to this process is forwarded and returns 128 + signal.
    """
    if not parts:
        raise ValueError("parts must name at least one process")
    names = [p.name for p in parts]
    if len(set(names)) != len(names):
        raise ValueError(f"part names must be unique, got {names}")
    if grace_s < 0 or actor_exit_s < 0:
        raise ValueError(f"grace_s ({grace_s}) and actor_exit_s ({actor_exit_s}) must be >= 0")
    out = sink if sink is not None else sys.stdout.buffer
    signals = _Signals()
    running: list[_Running] = []
    try:
        for part in parts:
            if signals.received:
                break
            running.append(_start(part, out))
        return _Supervisor(running, grace_s, actor_exit_s, signals, actor_policy, out).run()
    except LaunchError as exc:
        logger.error("%s; stopping every part", exc)
        _stop_all(running, signal.SIGTERM, grace_s, signals)
        return 1
    finally:
        _stop_all([r for r in running if r.proc.poll() is None], signal.SIGKILL, 0.0, signals)
        for r in running:
            if r.pump is not None:
                r.pump.join(timeout=5)
            r.log.close()
        signals.restore()


# ---------------------------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    p = argparse.ArgumentParser(
        prog="python launchers/local.py",
        description="Start the learner group (torchrun) and the vLLM actors on this machine and supervise them.",
        epilog="Every dotted.key=value override goes to the learner and to every actor.",
    )
    p.add_argument("--config", action="append", default=[], metavar="FILE", help="config file (repeatable, merged)")
    p.add_argument("--nproc-per-node", type=int, default=None, help="learner ranks [trainer.n_gpus_per_node]")
    p.add_argument("--actors", type=int, default=None, help="actor processes [async_training.num_actors]")
    p.add_argument("--run-dir", default=f"runs/local-{stamp}", help="run directory for logs [runs/local-<time>]")
    p.add_argument("--log-dir", default=None, help="log directory [<run dir>/logs]")
    p.add_argument(
        "--grace-s",
        type=float,
        default=None,
        help=f"seconds between SIGTERM and SIGKILL [the larger of {MIN_GRACE_S:g} and the learner's"
        f" async_training.timeouts.stop_s + {GRACE_MARGIN_S:g}]",
    )
    p.add_argument("--actor-exit-s", type=float, default=10.0, help="seconds actors get after the learner is done")
    p.add_argument("--dry-run", action="store_true", help="print the commands it would run and exit")
    p.add_argument(
        "--emulate-tokens-per-s",
        type=float,
        default=None,
        metavar="R",
        help="start emulated actors (no vLLM) generating R tokens/s each (benchmarks; async_rl.actor.emulated)",
    )
    p.add_argument("--emulate-response-len", type=int, default=None, metavar="L", help="emulated tokens per completion")
    p.add_argument("--learner-cmd", default=None, help=argparse.SUPPRESS)  # tests: replace the learner command
    p.add_argument("--actor-cmd", default=None, help=argparse.SUPPRESS)  # tests: actor command, {i} = index
    p.add_argument("overrides", nargs="*", metavar="dotted.key=value", help="config overrides")
    args = p.parse_intermixed_args(argv)
    for name in ("nproc_per_node", "actors"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.emulate_tokens_per_s is not None and not args.emulate_tokens_per_s > 0:
        p.error(f"--emulate-tokens-per-s must be > 0, got {args.emulate_tokens_per_s}")
    if args.emulate_response_len is not None and (args.emulate_tokens_per_s is None or args.emulate_response_len < 1):
        p.error("--emulate-response-len needs --emulate-tokens-per-s and must be >= 1")
    for name in ("grace_s", "actor_exit_s"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        p.error(f"overrides must look like dotted.key=value, got {bad}")
    return args


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """The config keys ``--nproc-per-node`` and ``--actors`` stand for, so that the config is checked with them (a
    micro-batch that fits one learner rank, not the config's two, is valid with ``--nproc-per-node 1``); the parts
    get them in their wiring (:func:`build_parts`)."""
    flags = []
    if args.nproc_per_node is not None:
        flags.append(f"{NPROC_KEY}={args.nproc_per_node}")
    if args.actors is not None:
        flags.append(f"{NUM_ACTORS_KEY}={args.actors}")
    return flags


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="launch: %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    try:
        settings = read_settings(args.config, [*args.overrides, *flag_overrides(args)])
    except ValueError as exc:
        logger.error("%s", exc)
        return 2
    if args.grace_s is None:
        args.grace_s = default_grace_s(settings.learner_stop_s)
    elif settings.learner_stop_s is not None and args.grace_s <= settings.learner_stop_s:
        logger.warning(
            "--grace-s %.1f is not above async_training.timeouts.stop_s %.1f: a learner stopped by a signal may be "
            "killed before it has written its stop checkpoint",
            args.grace_s,
            settings.learner_stop_s,
        )
    parts = build_parts(args, settings, visible_gpus())
    if args.dry_run:
        for part in parts:
            print(f"# {part.name} (log: {part.log_path})")
            print(part.describe())
        return 0
    policy = settings.actor_policy
    return run_parts(parts, grace_s=args.grace_s, actor_exit_s=args.actor_exit_s, actor_policy=policy)


if __name__ == "__main__":
    raise SystemExit(main())
