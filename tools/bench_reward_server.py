"""Benchmark the reward server against the same reward model called in the actor's own process.

Usage: ``python tools/bench_reward_server.py --model DIR [--groups 16] [--n 8] [--prompt-len 46] [--response-len 12]
[--clients 1] [--rounds 4] [--threads 1] [--dtype auto]`` (``DIR``: a reward model the reward-model trainer
exported, e.g. ``<run dir>/hf`` of
``python tools/train_reward_model.py --config configs/reward_model/smollm2_toy.yaml``)

Each round scores the same ``--groups`` groups of ``--n`` completions (random token ids: a ``--prompt-len``-token
prompt, ``--response-len``-token completions) two ways, in alternating order:

* **inline**: this process calls the scorer once per group (``group_scores``: the prompt computed once), as an actor
  with ``placement: inline`` does;
* **server**: a reward-server process (``python -m async_rl.entrypoints.reward_server``, started once) is sent the
  groups by ``--clients`` threads, each with its own client and its share of the groups, one request per group in
  flight per client, as that many actors would; the server batches what arrives together.

Both sides use ``--threads`` torch threads and ``--dtype``. It prints scored groups/s of each side per round, the
geometric mean of the per-round ratios server/inline with its 95% interval, and the largest score difference between
the two
(``reward_server_vs_inline``; above 1 the server is faster).
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from async_rl.config import load_config  # noqa: E402
from async_rl.rewards.model_client import RewardModelClient, RewardModelUnavailable  # noqa: E402
from async_rl.rewards.model_score import RewardModelScorer  # noqa: E402
from async_rl.tuning.bench import BenchLine, emit, paired_ratios  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
Group = tuple[list[int], list[list[int]]]
MAX_LENGTH = 4096  # no truncation on either side


def make_groups(args: argparse.Namespace, vocab: int) -> list[Group]:
    rng = random.Random(0)
    out = []
    for _ in range(args.groups):
        prompt = [rng.randrange(1, vocab) for _ in range(args.prompt_len)]
        out.append((prompt, [[rng.randrange(1, vocab) for _ in range(args.response_len)] for _ in range(args.n)]))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(args: argparse.Namespace, port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "async_rl.entrypoints.reward_server", "reward.reward_model.enable=true"]
    cmd += [f"reward.reward_model.model_path={args.model}", f"reward.reward_model.port={port}"]
    cmd += [f"reward.reward_model.max_batch_sequences={args.max_batch}", f"reward.reward_model.max_length={MAX_LENGTH}"]
    cmd += [f"reward.reward_model.dtype={args.dtype}", f"reward.reward_model.cpu_threads={args.threads}"]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_server_round(clients: list[RewardModelClient], groups: list[Group]) -> tuple[float, list[list[float]]]:
    results: list[list[float]] = [[] for _ in groups]
    shares = [list(range(i, len(groups), len(clients))) for i in range(len(clients))]

    def work(client: RewardModelClient, share: list[int]) -> None:
        for g in share:
            results[g] = client.score(*groups[g])

    threads = [threading.Thread(target=work, args=(c, s)) for c, s in zip(clients, shares, strict=True)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, results


def run_inline_round(scorer: RewardModelScorer, groups: list[Group]) -> tuple[float, list[list[float]]]:
    t0 = time.perf_counter()
    results = [scorer.group_scores(prompt, responses) for prompt, responses in groups]
    return time.perf_counter() - t0, results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="reward-model directory (the trainer's export)")
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=46)
    p.add_argument("--response-len", type=int, default=12)
    p.add_argument("--clients", type=int, default=1, help="concurrent clients (actors) sending to the server")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch threads on each side")
    p.add_argument("--max-batch", type=int, default=64, help="reward.reward_model.max_batch_sequences")
    p.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"), help="reward.reward_model.dtype")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    scorer = RewardModelScorer(
        args.model,
        max_batch=args.max_batch,
        max_length=MAX_LENGTH,
        normalize=True,
        dtype=args.dtype,
        cpu_threads=args.threads,
    )
    groups = make_groups(args, scorer.vocab_size)
    port = free_port()
    server = start_server(args, port)
    transport = load_config(None, []).async_training.transport
    clients = [
        RewardModelClient(
            f"tcp://127.0.0.1:{port}", transport, timeout_s=120.0, retries=0, max_batch_sequences=args.max_batch
        )
        for _ in range(args.clients)
    ]
    try:
        deadline = time.monotonic() + 180
        while True:  # the server's start-up (imports, model load)
            try:
                clients[0].score(*groups[0])
                break
            except RewardModelUnavailable:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
        run_inline_round(scorer, groups[:2])  # warm-up
        times: dict[str, list[float]] = {"inline": [], "server": []}
        diff = 0.0
        for r in range(args.rounds):
            order = ("inline", "server") if r % 2 == 0 else ("server", "inline")
            got = {}
            for side in order:
                elapsed, got[side] = (
                    run_inline_round(scorer, groups) if side == "inline" else run_server_round(clients, groups)
                )
                times[side].append(elapsed)
            pairs = zip(got["inline"], got["server"], strict=True)
            diff = max(diff, max(abs(a - b) for x, y in pairs for a, b in zip(x, y, strict=True)))
            print(
                f"round {r}: inline {args.groups / times['inline'][-1]:.2f} groups/s, server"
                f" {args.groups / times['server'][-1]:.2f} groups/s",
                flush=True,
            )
    finally:
        for c in clients:
            c.close()
        server.terminate()
        server.wait(timeout=30)
    summary = paired_ratios([i / s for i, s in zip(times["inline"], times["server"], strict=True)])
    what = (
        f"{args.groups} groups x {args.n} ({args.prompt_len}+{args.response_len} tokens), {args.clients} client(s),"
        f" {args.threads} thread(s)"
    )
    print(f"== reward server vs inline ({what}) ==")
    print(f"server/inline groups/s: {summary.describe()}; largest score difference {diff:.2e}")
    detail = f"{what}: {summary.describe()}; max |score diff| {diff:.1e}"
    emit("reward_server", [BenchLine("reward_server_vs_inline", summary.geomean, None, detail)])


if __name__ == "__main__":
    main()
