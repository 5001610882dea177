"""Chaos: one real vLLM actor trains the tiny model while four faulty actors do their worst, one fault each.

(a) a client says hello and goes silent; (b) an actor sends untrainable groups (a token id past the vocabulary, one
completion too few) until it is quarantined; (c) an actor is SIGKILLed inside a weight update; (d) an actor is
SIGSTOPped for 20 s and resumed. The run must finish every step, train no prompt twice and lose none (the ledger
identity), show each fault in the metrics under its own name, and keep training while each fault lasts: the test
prints the longest gap between two steps during each fault.

Faulty actors live in tests/e2e/chaos_actor.py; (d) is a plain emulated actor (``--emulate-tokens-per-s``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _e2e_helpers import ROOT, free_port, read_jsonl

CHAOS = Path(__file__).with_name("chaos_actor.py")
K = 1
BATCH = 8
STEPS = 30
STOP_S = 20.0


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as f:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


class _StepClock:
    """When each step's metrics line appeared (polled), to measure the gaps between steps during each fault."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: dict[int, float] = {}

    def poll(self) -> int:
        now = time.monotonic()
        for m in read_jsonl(self.path):
            self.seen.setdefault(int(m["step"]), now)
        return len(self.seen)

    def longest_gap(self, start: float, end: float) -> float:
        """The longest time without a new step that overlaps ``[start, end]``."""
        times = sorted(self.seen.values())
        gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b >= start and a <= end]
        before = [t for t in times if t <= start]
        after = [t for t in times if t >= end]
        if before and after and not any(start < t < end for t in times):  # a gap that spans the whole window
            gaps.append(min(after) - max(before))
        return max(gaps, default=float("nan"))


@pytest.mark.slow
def test_one_faulty_actor_at_a_time_never_stops_training(tmp_path, assert_nothing_lost):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    port, ws_port = free_port(), free_port()
    config = str(ROOT / "configs" / "smoke_grpo.yaml")
    overrides = [
        f"trainer.default_local_dir={run_dir}",
        f"trainer.total_training_steps={STEPS}",
        f"data.train_batch_size={BATCH}",
        f"async_training.max_staleness={K}",
        "async_training.stale_policy=regrant",
        f"async_training.transport.port={port}",
        f"async_training.weight_sync.master_port={ws_port}",
        "async_training.transport.heartbeat_interval_s=0.5",
        "async_training.transport.peer_timeout_s=3.0",
        "async_training.transport.lease_timeout_s=60.0",
        "async_training.transport.max_invalid_groups=3",
        "async_training.weight_sync.timeout_s=10",
        "async_training.weight_sync.join_timeout_s=3",
        "async_training.weight_sync.bucket_size_mb=0.25",  # several buckets: (c) dies between two of them
        "trainer.logger=['jsonl']",
    ]
    coordinator = f"tcp://127.0.0.1:{port}"
    learner_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    learner_cmd += ["-m", "async_rl.entrypoints.train", "--config", config, *overrides]
    actor_cmd = [sys.executable, "-m", "async_rl.entrypoints.actor", "--config", config, *overrides]
    actor_cmd += ["--coordinator", coordinator]

    go = tmp_path / "go"

    def chaos(mode: str, name: str) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, str(CHAOS), mode, config, coordinator, name, *overrides]
        with (tmp_path / f"{name}.log").open("wb") as f:
            env = {**os.environ, "CHAOS_GO": str(go)}
            return subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env=env)

    clock = _StepClock(run_dir / "metrics.jsonl")
    windows: dict[str, tuple[float, float]] = {}
    procs: list[subprocess.Popen[bytes]] = []

    def wait_for(what: str, cond, timeout_s: float = 300.0) -> float:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        while not cond():
            clock.poll()
            # the learner may have ended since cond() was evaluated: that is a failure only if cond() still fails
            assert learner.poll() is None or cond(), (tmp_path / "learner.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.1)
        return time.monotonic()

    try:
        learner = _start(learner_cmd, tmp_path / "learner.log")
        procs.append(learner)
        procs.append(_start([*actor_cmd, "--actor-id", "real"], tmp_path / "real.log"))
        silent, bad, dies = chaos("silent", "silent"), chaos("bad", "bad"), chaos("dies-in-update", "dies")
        procs += [silent, bad, dies]
        real_ready = lambda: "now on policy version" in (tmp_path / "real.log").read_text()  # noqa: E731
        wait_for("the real actor's first weights", real_ready, timeout_s=600.0)
        go.touch()  # the faulty actors start now
        frozen = _start([*actor_cmd, "--actor-id", "frozen", "--emulate-tokens-per-s", "500"], tmp_path / "frozen.log")
        procs.append(frozen)  # a healthy (emulated) actor until (d)
        started = time.monotonic()
        silent_at = wait_for("the silent client's hello", lambda: "hello sent" in (tmp_path / "silent.log").read_text())

        def metric(key: str) -> float:
            lines = read_jsonl(run_dir / "metrics.jsonl")
            return float(lines[-1].get(key, 0)) if lines else 0.0

        # (a) and (b) start together; (a) ends when the coordinator presumes the silent client dead
        t = wait_for("the silent client to be presumed dead", lambda: metric("transport/actors_presumed_dead") >= 1)
        windows["(a) hello, then silent"] = (silent_at, t)
        t = wait_for("the bad actor's quarantine", lambda: metric("transport/actors_quarantined") >= 1)
        windows["(b) untrainable groups"] = (started, t)
        # (c) dies in its second weight update; the fault lasts until the learner's group has re-formed without it
        wait_for("the actor killed in an update", lambda: dies.poll() is not None)
        killed = time.monotonic()
        wait_for("the failed update to be counted", lambda: metric("sync/failures") + metric("sync/left_out") >= 1)
        steps_then = clock.poll()
        t = wait_for("two more steps", lambda: clock.poll() >= min(steps_then + 2, STEPS))
        windows["(c) SIGKILL inside a weight update"] = (killed, t)
        # (d) freeze one actor for STOP_S while the others go on
        wait_for("the frozen actor's weights", lambda: "now on policy version" in (tmp_path / "frozen.log").read_text())
        stopped = time.monotonic()
        _signal_group(frozen, signal.SIGSTOP)
        while time.monotonic() - stopped < STOP_S and learner.poll() is None:
            clock.poll()
            time.sleep(0.1)
        _signal_group(frozen, signal.SIGCONT)
        windows[f"(d) SIGSTOP for {STOP_S:.0f} s"] = (stopped, time.monotonic())
        updates_before = (tmp_path / "frozen.log").read_text().count("now on policy version")
        steps_left = STEPS - clock.poll()
        wait_for("the learner to finish", lambda: learner.poll() is not None, timeout_s=600.0)
        clock.poll()
        assert learner.returncode == 0, (tmp_path / "learner.log").read_text()[-3000:]
    finally:
        for proc in procs:
            _signal_group(proc, signal.SIGCONT)
            _signal_group(proc, signal.SIGKILL)

    metrics = read_jsonl(run_dir / "metrics.jsonl")
    last = metrics[-1]
    print("\nlongest gap between steps during each fault:")
    for name, (start, end) in windows.items():
        print(f"  {name:<40} {clock.longest_gap(start, end):6.1f} s  (fault lasted {end - start:5.1f} s)")
    steady = sorted(b - a for a, b in zip(sorted(clock.seen.values()), sorted(clock.seen.values())[1:], strict=False))
    print(f"  median gap between steps over the run: {steady[len(steady) // 2]:.2f} s")

    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert all(m["rollout/staleness_max"] <= K for m in metrics)
    ids = [i for rec in read_jsonl(run_dir / "trained_groups.jsonl") for i in rec["prompt_ids"]]
    assert len(ids) == len(set(ids)) == STEPS * BATCH  # nothing trained twice
    assert_nothing_lost(metrics)  # nothing lost: every granted prompt is accounted for at every step
    assert last["transport/dropped_total"] == 0
    # each fault under its own name
    assert (
        last["transport/drops/invalid_token_out_of_vocab"] >= 2
        and last["transport/drops/invalid_wrong_completion_count"] >= 1
    )
    assert last["transport/actors_quarantined"] == 1
    assert last["sync/failures"] + last["sync/left_out"] >= 1  # the update the killed actor was in
    assert last["transport/actors_presumed_dead"] >= 3  # silent, killed, frozen
    learner_log = (tmp_path / "learner.log").read_text()
    assert "silent was not ready" not in learner_log  # never announced itself, so never waited for
    # the frozen actor came back: announced itself again and received weights after it was resumed
    if steps_left >= 5:  # enough of the run was left for it to rejoin
        assert (tmp_path / "frozen.log").read_text().count("now on policy version") > updates_before
    # while (d) lasted, the others kept training: no gap as long as the freeze
    assert clock.longest_gap(*windows[f"(d) SIGSTOP for {STOP_S:.0f} s"]) < STOP_S
