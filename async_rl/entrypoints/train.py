"""Learner entry point: run under torchrun; rank 0 also runs the coordinator that actors connect to.

Single machine (2 learner ranks; start actors with ``async_rl.entrypoints.actor`` or use ``launchers/local.py``)::

    torchrun --standalone --nproc_per_node 2 -m async_rl.entrypoints.train --config configs/demo_grpo.yaml

Multi-node (every learner node)::

    torchrun --nnodes 2 --node_rank $RANK --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint $HOST:29400 \\
        -m async_rl.entrypoints.train --config configs/qwen2.5-0.5b_gsm8k_grpo.yaml trainer.nnodes=2

``--dry-run`` validates the config and the wiring built from it (no model load, no generation) and prints it.

Each rank exits when torchrun (its parent) dies (:mod:`async_rl.runtime.parent_watch`). On SIGTERM it stops at the next
step boundary, checkpoints if checkpointing is configured, and exits 143 (128 + SIGTERM).
"""

from __future__ import annotations

import logging
import os

from async_rl.config import parse_cli
from async_rl.entrypoints._exit import exit_without_finalization, report


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg, flags = parse_cli(argv)
    if flags.dry_run:
        from async_rl.runtime.dry_run import print_dry_run

        return print_dry_run(cfg)
    if flags.print_config:
        return 0
    from async_rl.runtime.allocator import reexec_with_allocator

    if argv is None:  # a real start (not a call from Python): re-run with tcmalloc preloaded when it should be
        announce = os.environ.get("RANK", "0") == "0"
        reexec_with_allocator(cfg.async_training.cpu_allocator, ["-m", "async_rl.entrypoints.train"], announce=announce)
    from async_rl.runtime.parent_watch import watch_parent

    # Past its stop deadline the rank exits by itself; this only backs that up should the SIGTERM be lost.
    watch_parent(grace_s=cfg.async_training.timeouts.stop_s + 5.0)
    from async_rl.runtime.learner_main import run_learner

    return report(run_learner(cfg))


if __name__ == "__main__":
    exit_without_finalization(main())
