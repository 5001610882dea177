"""A throwaway Slurm cluster on this machine, for the Slurm launcher's end-to-end test.

It runs munged, slurmctld and three slurmd (node1..node3, all on loopback) with a generated configuration in a
temporary directory, and stops them by PID afterwards. Slurm never puts two components of a heterogeneous job on one
node, so this machine poses as three nodes (``slurmd -N nodeK``, one port each). Two partitions over the same nodes
make preemption real: ``low`` (the default; its jobs are requeued when preempted, after a grace time) and ``high``.
Heterogeneous jobs are started by the backfill scheduler only, so it runs every second (its default: 30 s).

Debian's ``slurm-wlm`` and ``munge`` are installed when missing and this process may (root, ``apt-get``); where Slurm
cannot be installed or started, :func:`unavailable` / :class:`SlurmUnavailable` say why, for the test to skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
PACKAGES = ("slurm-wlm", "munge")
NODES = ("node1", "node2", "node3")
GRACE_S = 30  # the low partition's preemption grace and KillWait: SIGTERM first, SIGKILL this much later


class SlurmUnavailable(RuntimeError):
    """Slurm could not be installed or started here."""


def _missing() -> list[str]:
    return [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]


def unavailable(install_timeout_s: float = 300.0) -> str | None:
    """None when Slurm's daemons are here (installing Debian's packages if missing and allowed), else why not."""
    if not _missing():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"Slurm is not installed ({', '.join(_missing())} missing) and apt-get cannot be run as root here"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
    for attempt in (install, ["apt-get", "update"], install):  # package lists may be missing on a fresh machine
        try:
            res = subprocess.run(attempt, env=env, capture_output=True, text=True, timeout=install_timeout_s)
        except subprocess.TimeoutExpired:
            return f"{' '.join(attempt)} did not finish within {install_timeout_s:.0f} s"
        if res.returncode == 0 and attempt is install and not _missing():
            return None
    tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
    return f"could not install {' '.join(PACKAGES)} with apt-get: {' | '.join(tail)}"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SlurmCluster:
    """munged + slurmctld + 3 slurmd under ``root``; :meth:`env` is what a client (sbatch, squeue) needs."""

    def __init__(self, root: Path, daemon_env: Mapping[str, str]) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.daemon_env = dict(daemon_env)
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        return {**base, "SLURM_CONF": str(self.conf)}

    # ------------------------------------------------------------------ start / stop
    def start(self, timeout_s: float = 60.0) -> None:
        self.root.chmod(0o700)  # munged refuses a socket directory others can write to
        for d in ("state", "spool", "log"):
            (self.root / d).mkdir(exist_ok=True)
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        sock = self.root / "munge.sock"
        self._spawn(
            "munged",
            "munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
            f"--pid-file={self.root / 'munged.pid'}", f"--log-file={self.root / 'log' / 'munged.log'}",
            f"--seed-file={self.root / 'munged.seed'}",
        )  # fmt: skip
        self._wait(lambda: sock.exists(), timeout_s, "munged's socket")
        ctld_port, *node_ports = _free_ports(1 + len(NODES))
        self.conf.write_text(self._config(socket.gethostname(), sock, ctld_port, node_ports))
        self._spawn("slurmctld", "slurmctld", "-D", "-f", str(self.conf))
        for node in NODES:
            self._spawn(f"slurmd-{node}", "slurmd", "-D", "-N", node, "-f", str(self.conf))
        self._wait(lambda: self._idle_nodes() == len(NODES), timeout_s, f"{len(NODES)} idle nodes in sinfo")

    def stop(self) -> None:
        """Cancel every job, then stop the daemons by PID (SIGTERM, SIGKILL 10 s later)."""
        if self.procs and self.conf.exists():
            self.run("scancel", "--user", str(os.getuid()), check=False)
            deadline = time.monotonic() + 2 * GRACE_S
            while time.monotonic() < deadline and self.run("squeue", "-h", check=False).stdout.strip():
                time.sleep(0.5)
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.procs.clear()

    # ------------------------------------------------------------------ clients
    def run(
        self, *argv: str, env: Mapping[str, str] | None = None, check: bool = True, timeout_s: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster, in ``env`` (default: the daemons' environment)."""
        full = self.env(self.daemon_env if env is None else env)
        res = subprocess.run(argv, env=full, capture_output=True, text=True, timeout=timeout_s, check=False)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
        return res

    def job(self, job_id: int) -> dict[str, str]:
        """The job's fields (``scontrol show job -o``; a heterogeneous job: its first component)."""
        line = self.run("scontrol", "show", "job", "-o", str(job_id)).stdout.splitlines()[0]
        return dict(tok.split("=", 1) for tok in line.split() if "=" in tok)

    def wait_job(self, job_id: int, done: set[str], timeout_s: float) -> dict[str, str]:
        """Wait until the job's state is one of ``done``; its fields then."""
        deadline = time.monotonic() + timeout_s
        while (fields := self.job(job_id))["JobState"] not in done:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {fields['JobState']} after {timeout_s:.0f} s: {fields}")
            time.sleep(0.5)
        return fields

    def wait_idle(self, timeout_s: float) -> None:
        """Wait until every node is idle again (the previous allocations released)."""
        self._wait(lambda: self._idle_nodes() == len(NODES), timeout_s, f"{len(NODES)} idle nodes")

    # ------------------------------------------------------------------ internals
    def _spawn(self, name: str, *argv: str) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 - the daemon holds it open
        try:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.daemon_env)
        except OSError as exc:
            raise SlurmUnavailable(f"could not start {name}: {exc}") from exc
        finally:
            log.close()
        self.procs.append((name, proc))

    def _wait(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [name for name, p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = {n: (self.root / "log" / f"{n}.out").read_text(errors="replace")[-500:] for n, _ in self.procs}
                why = f"{', '.join(dead)} exited" if dead else f"no {what} within {timeout_s:.0f} s"
                raise SlurmUnavailable(f"local Slurm did not start: {why}; daemon output: {logs}")
            time.sleep(0.2)

    def _idle_nodes(self) -> int:
        res = self.run("sinfo", "-h", "-p", "low", "-o", "%t %D", check=False, timeout_s=10)
        return sum(int(n) for state, n in (ln.split() for ln in res.stdout.splitlines()) if state == "idle")

    def _config(self, host: str, munge_socket: Path, ctld_port: int, node_ports: list[int]) -> str:
        r = self.root
        nodes = "\n".join(
            f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs=2 State=UNKNOWN"
            for n, p in zip(NODES, node_ports, strict=True)
        )
        names = ",".join(NODES)
        return f"""\
ClusterName=asyncrltest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=bf_interval=1
MpiDefault=none
ReturnToService=2
KillWait={GRACE_S}
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
{nodes}
PartitionName=low Nodes={names} Default=YES State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime={GRACE_S}
PartitionName=high Nodes={names} State=UP PriorityTier=2 PreemptMode=OFF
"""
