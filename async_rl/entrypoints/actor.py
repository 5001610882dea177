"""Actor entry point: one vLLM engine that connects to the learner's coordinator and generates until told to stop.

::

    python -m async_rl.entrypoints.actor --config configs/demo_grpo.yaml \\
        --coordinator tcp://127.0.0.1:5555 --actor-id actor-0 [dotted.key=value ...]

``--emulate-tokens-per-s R [--emulate-response-len L]`` runs an emulated actor instead (no vLLM: generation is a
fixed R tokens/s server, see ``async_rl.actor.emulated``), for pipeline benchmarks.

The coordinator address is rank 0's ``async_training.transport.host:port``; a non-loopback address needs the CURVE
key settings (``async_training.transport.curve_*``). ``--dry-run`` validates the config and the wiring.

The actor exits when its parent (the launcher, a node script) dies, and vLLM's engine and worker processes when the
actor does (:mod:`async_rl.runtime.parent_watch`).
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sys

from async_rl.config import parse_cli


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--coordinator", default=None, help="tcp://HOST:PORT of the learner's coordinator")
    parser.add_argument("--actor-id", default=None, help="unique actor name (default: HOSTNAME-PID)")
    parser.add_argument(
        "--emulate-tokens-per-s",
        type=float,
        default=None,
        help="no vLLM: emulate generation at this many tokens/s (async_rl.actor.emulated; for benchmarks)",
    )
    parser.add_argument(
        "--emulate-response-len", type=int, default=None, help="emulated tokens per completion [max_tokens]"
    )
    known, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    cfg, flags = parse_cli(rest)
    if flags.dry_run:
        from async_rl.runtime.dry_run import print_dry_run

        return print_dry_run(cfg)
    if flags.print_config:
        return 0
    t = cfg.async_training.transport
    coordinator = known.coordinator or f"tcp://{t.host}:{t.port}"
    if not coordinator.startswith("tcp://") or coordinator.endswith(":0"):
        parser.error(f"--coordinator must be tcp://HOST:PORT (got {coordinator!r}); port 0 cannot be dialled")
    rate, length = known.emulate_tokens_per_s, known.emulate_response_len
    if rate is not None and not rate > 0:
        parser.error(f"--emulate-tokens-per-s must be > 0, got {rate}")
    if length is not None and (rate is None or length < 1):
        parser.error(f"--emulate-response-len needs --emulate-tokens-per-s and must be >= 1, got {length}")
    import os

    from async_rl.runtime.allocator import reexec_with_allocator

    if argv is None:  # a real start (not a call from Python): re-run with tcmalloc preloaded when it should be
        reexec_with_allocator(cfg.async_training.cpu_allocator, ["-m", "async_rl.entrypoints.actor"], announce=True)

    from async_rl.runtime.parent_watch import watch_parent

    watch_parent(forked_children=True)  # vLLM's engine and workers, when forked (when spawned: see the end of the file)
    actor_id = known.actor_id or f"{socket.gethostname()}-{os.getpid()}"
    from async_rl.runtime.actor_main import run_actor, run_emulated_actor

    def report(summary: dict[str, object]) -> None:  # the exit summary, printed before the engines shut down
        print(json.dumps(summary, default=str), flush=True)

    if rate is not None:
        run_emulated_actor(
            cfg, coordinator=coordinator, actor_id=actor_id, tokens_per_s=rate, response_len=length, report=report
        )
    else:
        run_actor(cfg, coordinator=coordinator, actor_id=actor_id, report=report)
    return 0


if __name__ == "__mp_main__":
    # A helper process that vLLM spawned from this actor (its engine, its workers; the "spawn" start method re-imports
    # the parent's main module) leaves when the process that started it dies, instead of running on as an orphan.
    from async_rl.runtime.parent_watch import watch_parent

    watch_parent(grace_s=2.0)

if __name__ == "__main__":
    sys.exit(main())
