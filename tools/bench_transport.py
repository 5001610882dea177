"""Throughput of the rollout plane beside raw pyzmq, same machine, same run, same bytes.

    python tools/bench_transport.py [--groups N] [--n 8] [--tokens 1024]

A realistic group is n completions of `tokens` tokens (int32 ids + float32 log-probs). Two measurements:
  plane: an actor process (RolloutClient) asks for work, answers every grant with a group; the coordinator thread
         validates, dedups and buffers it and acks; the learner (main thread) takes groups with get_groups and
         marks them trained. Timed at the learner, from the first group taken to the last.
  raw:   a process sends the same encoded group bytes N times DEALER -> ROUTER; the receiver only counts them.
         Timed from the first message received to the last.
Both child processes are started with subprocess (no multiprocessing, which would pickle). Prints one line with
both rates and the ratio plane/raw (target >= 0.5).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np
import zmq

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from async_rl import metric_catalog as mc  # noqa: E402
from async_rl.config import default_config  # noqa: E402
from async_rl.transport import (  # noqa: E402 - after the sys.path tweak so the script runs from a checkout
    Coordinator,
    GroupSampling,
    PromptRecord,
    RolloutClient,
    make_completion,
)
from async_rl.transport.codec import WireCodec  # noqa: E402
from async_rl.transport.protocol import Completion, PromptGrant, RolloutGroup  # noqa: E402

GROUPS_PER_STEP = 64
INFLIGHT = 4 * GROUPS_PER_STEP  # admission cap: leased + buffered groups (the plane's max_inflight_groups)


def _completions(n: int, tokens: int) -> list[Completion]:
    rng = np.random.default_rng(0)
    return [
        make_completion(
            rng.integers(0, 150_000, size=tokens, dtype=np.int32),
            rng.uniform(-10.0, 0.0, size=tokens).astype(np.float32),
            version_min=0,
            reward=1.0,
        )
        for _ in range(n)
    ]


def _spawn(role: str, address: str, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, __file__, "--role", role, "--address", address]
    cmd += ["--groups", str(args.groups), "--n", str(args.n), "--tokens", str(args.tokens)]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.Popen(cmd, env=env)


def run_raw_sender(args: argparse.Namespace) -> None:
    group = RolloutGroup(prompt_id=0, lease_id=1, actor_id="bench", completions=_completions(args.n, args.tokens))
    buf = WireCodec().encode(group)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, default_config().async_training.transport.socket_hwm)
    sock.connect(args.address)
    for _ in range(args.groups):
        sock.send(buf, copy=False)
    sock.close(linger=-1)  # flush everything before exiting
    ctx.term()


def run_plane_actor(args: argparse.Namespace) -> None:
    comps = _completions(args.n, args.tokens)
    client = RolloutClient(args.address, "bench-actor", default_config().async_training.transport, ack_timeout_s=30.0)
    client.hello()
    work: deque[PromptGrant] = deque()
    sent = 0
    while sent < args.groups and not client.shutdown_requested:
        if len(work) < GROUPS_PER_STEP:
            work.extend(client.request_work(INFLIGHT - len(work), 0, timeout_s=0.0 if work else 0.01))
        while work:
            grant = work.popleft()
            group = RolloutGroup(
                prompt_id=grant.prompt_id, lease_id=grant.lease_id, actor_id="bench-actor", completions=comps
            )
            client.send_group(group)
            sent += 1
        client.poll()
    client.wait_acked(30.0)
    client.close()


def bench_raw(args: argparse.Namespace) -> float:
    """Seconds per message, receiver side."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.RCVHWM, default_config().async_training.transport.socket_hwm)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    proc = _spawn("raw-sender", f"tcp://127.0.0.1:{port}", args)
    try:
        t0 = 0.0
        for i in range(args.groups):
            sock.recv_multipart(copy=False)
            if i == 0:
                t0 = time.perf_counter()
        elapsed = time.perf_counter() - t0
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close(linger=0)
        ctx.term()
    return elapsed / max(1, args.groups - 1)


def bench_plane(args: argparse.Namespace) -> tuple[float, int]:
    """(seconds per group at the learner, bytes per group on the wire)."""
    records = [PromptRecord(np.arange(16, dtype=np.int32)) for _ in range(args.groups)]
    plane = default_config().async_training
    plane.max_staleness = 1
    plane.transport.max_inflight_groups = INFLIGHT
    coord = Coordinator(
        records,
        plane,
        groups_per_step=GROUPS_PER_STEP,
        sampling=GroupSampling.defaults(n=args.n, max_tokens=args.tokens),
        seed=0,
        max_epochs=1,
        trust_claimed_versions=True,  # no weight sync in this benchmark: the clients claim their versions
    )
    proc = _spawn("plane-actor", coord.address, args)
    try:
        done = 0
        t0 = 0.0
        while done < args.groups:
            groups = coord.get_groups(min(GROUPS_PER_STEP, args.groups - done), timeout_s=60.0)
            if done == 0:
                t0 = time.perf_counter()
                first = len(groups)
            coord.mark_trained([g.prompt_id for g in groups])
            done += len(groups)
        elapsed = time.perf_counter() - t0
        metrics = coord.metrics()
    finally:
        coord.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    group_bytes = int(metrics[mc.TRANSPORT_BYTES_RECEIVED_TOTAL] / max(1, metrics[mc.TRANSPORT_GROUPS_RECEIVED_TOTAL]))
    return elapsed / max(1, args.groups - first), group_bytes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--groups", type=int, default=10000, help="groups per measurement")
    p.add_argument("--n", type=int, default=8, help="completions per group")
    p.add_argument("--tokens", type=int, default=1024, help="tokens per completion")
    p.add_argument("--repeats", type=int, default=3, help="alternating raw/plane rounds; medians are reported")
    p.add_argument("--role", choices=["main", "raw-sender", "plane-actor"], default="main", help=argparse.SUPPRESS)
    p.add_argument("--address", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.groups < 2 * GROUPS_PER_STEP:
        p.error(f"--groups must be >= {2 * GROUPS_PER_STEP}")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.role == "raw-sender":
        run_raw_sender(args)
        return 0
    if args.role == "plane-actor":
        run_plane_actor(args)
        return 0
    raw_runs, plane_runs = [], []
    group_bytes = 0
    for _ in range(args.repeats):  # alternate, so that load from other processes hits both alike
        raw_runs.append(bench_raw(args))
        plane_s, group_bytes = bench_plane(args)
        plane_runs.append(plane_s)
    raw_s, plane_s = statistics.median(raw_runs), statistics.median(plane_runs)
    mb = group_bytes / 1e6
    print(
        f"bench_transport: {args.groups} groups x {args.n} completions x {args.tokens} tokens "
        f"({group_bytes / 1024:.1f} KiB/group), median of {args.repeats} | plane {1 / plane_s:,.0f} groups/s "
        f"{mb / plane_s:,.1f} MB/s | raw pyzmq {1 / raw_s:,.0f} groups/s {mb / raw_s:,.1f} MB/s "
        f"| ratio {raw_s / plane_s:.2f} (target >= 0.5)"
    )
    from async_rl.tuning.bench import BenchLine, emit

    detail = f"{1 / plane_s:,.0f} vs {1 / raw_s:,.0f} groups/s of {group_bytes / 1024:.1f} KiB"
    emit("transport", [BenchLine("rollout_plane_vs_raw_pyzmq", raw_s / plane_s, 0.5, detail)])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
